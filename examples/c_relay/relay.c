/*
 * A raw epoll WebSocket byte relay in C: the floor of the side-by-side comparison run by
 * `cargo run --release --example compare` (beside orca-relay and examples/node_relay).
 *
 * Like the Node relay it pairs the two sockets dialled to /a/<key> and /b/<key> and forwards every
 * frame, but it does the least a correct WebSocket server can: one thread, one level-triggered
 * epoll set, no message assembly, no allocation after a pair is linked. Client frames arrive
 * masked; each is rewritten on the fly into an unmasked server frame (same opcode, FIN bit and
 * length, payload unmasked as it streams through), so a frame may span any number of reads.
 * Nagle is off on every socket. A socket whose peer cannot take more stops being read until the
 * peer's pending bytes are written (at most one read's worth is ever held per socket), so memory
 * per pair is fixed. No TLS, no limits, no pings of its own: a benchmark baseline, not a server.
 *
 *   cc -O2 -o c_relay examples/c_relay/relay.c && ./c_relay 0    # prints "listening on <port>"
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#define READ_MAX (64 * 1024)
#define HANDSHAKE_MAX 4096
#define KEY_MAX 128

struct conn {
    int fd;
    int linked;             /* 0: handshake or waiting for the peer; 1: relaying */
    char side;              /* 'a' or 'b' */
    char key[KEY_MAX];
    struct conn *peer;
    struct conn *next_waiting;
    /* handshake */
    char *hs;
    size_t hs_len;
    /* frame rewriting state of the bytes this socket sends (client -> relay) */
    uint8_t hdr[14];
    size_t hdr_len;
    uint64_t remaining;     /* payload bytes of the current frame still to come */
    uint8_t mask[4];
    unsigned mask_off;
    /* bytes owed to this socket (written partially); reading the peer pauses meanwhile */
    uint8_t *pending;
    size_t pending_off, pending_len;
    int want_out;
    int paused;             /* reading this socket is paused (its peer has pending bytes) */
    int dead;               /* closed; freed after the current epoll batch */
    struct conn *next_dead;
};

static int ep;
static struct conn *waiting;
static struct conn *graveyard;
static uint8_t in_buf[READ_MAX];
static uint8_t out_buf[READ_MAX + 4096];

/* ---- SHA-1 and base64, for Sec-WebSocket-Accept only ---- */

static uint32_t rol(uint32_t x, int n) { return (x << n) | (x >> (32 - n)); }

static void sha1(const uint8_t *msg, size_t len, uint8_t out[20]) {
    uint32_t h[5] = {0x67452301, 0xEFCDAB89, 0x98BADCFE, 0x10325476, 0xC3D2E1F0};
    size_t total = ((len + 8) / 64 + 1) * 64;
    uint8_t *m = calloc(1, total);
    memcpy(m, msg, len);
    m[len] = 0x80;
    uint64_t bits = (uint64_t)len * 8;
    for (int i = 0; i < 8; i++) m[total - 1 - i] = (uint8_t)(bits >> (8 * i));
    for (size_t off = 0; off < total; off += 64) {
        uint32_t w[80];
        for (int i = 0; i < 16; i++)
            w[i] = (uint32_t)m[off + 4 * i] << 24 | (uint32_t)m[off + 4 * i + 1] << 16 |
                   (uint32_t)m[off + 4 * i + 2] << 8 | m[off + 4 * i + 3];
        for (int i = 16; i < 80; i++) w[i] = rol(w[i - 3] ^ w[i - 8] ^ w[i - 14] ^ w[i - 16], 1);
        uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4];
        for (int i = 0; i < 80; i++) {
            uint32_t f, k;
            if (i < 20) { f = (b & c) | (~b & d); k = 0x5A827999; }
            else if (i < 40) { f = b ^ c ^ d; k = 0x6ED9EBA1; }
            else if (i < 60) { f = (b & c) | (b & d) | (c & d); k = 0x8F1BBCDC; }
            else { f = b ^ c ^ d; k = 0xCA62C1D6; }
            uint32_t t = rol(a, 5) + f + e + k + w[i];
            e = d; d = c; c = rol(b, 30); b = a; a = t;
        }
        h[0] += a; h[1] += b; h[2] += c; h[3] += d; h[4] += e;
    }
    free(m);
    for (int i = 0; i < 5; i++)
        for (int j = 0; j < 4; j++) out[4 * i + j] = (uint8_t)(h[i] >> (24 - 8 * j));
}

static void base64(const uint8_t *in, size_t len, char *out) {
    static const char t[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    size_t o = 0;
    for (size_t i = 0; i < len; i += 3) {
        uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < len ? (uint32_t)in[i + 1] << 8 : 0) |
                     (i + 2 < len ? in[i + 2] : 0);
        out[o++] = t[(v >> 18) & 63];
        out[o++] = t[(v >> 12) & 63];
        out[o++] = i + 1 < len ? t[(v >> 6) & 63] : '=';
        out[o++] = i + 2 < len ? t[v & 63] : '=';
    }
    out[o] = 0;
}

/* ---- epoll bookkeeping ---- */

static void watch(struct conn *c) {
    struct epoll_event ev = {0};
    ev.data.ptr = c;
    ev.events = (c->paused ? 0 : EPOLLIN) | (c->want_out ? EPOLLOUT : 0);
    epoll_ctl(ep, EPOLL_CTL_MOD, c->fd, &ev);
}

static void unwait(struct conn *c) {
    for (struct conn **p = &waiting; *p; p = &(*p)->next_waiting)
        if (*p == c) { *p = c->next_waiting; return; }
}

/* Closes one socket; the memory is freed after the batch (its peer's events may still name it). */
static void drop_one(struct conn *c) {
    if (c->dead) return;
    if (!c->linked) unwait(c);
    epoll_ctl(ep, EPOLL_CTL_DEL, c->fd, NULL);
    close(c->fd);
    c->dead = 1;
    c->next_dead = graveyard;
    graveyard = c;
}

static void bury(void) {
    while (graveyard) {
        struct conn *c = graveyard;
        graveyard = c->next_dead;
        free(c->hs);
        free(c->pending);
        free(c);
    }
}

/* Closes a socket and its peer (the relay's teardown: one side gone, both go). */
static void drop_pair(struct conn *c) {
    struct conn *p = c->peer;
    drop_one(c);
    if (p) drop_one(p);
}

/* ---- relaying ---- */

/* Rewrites `n` client bytes of `c` into unmasked server frames in out_buf; returns the length. */
static size_t rewrite(struct conn *c, const uint8_t *in, size_t n) {
    size_t i = 0, o = 0;
    while (i < n) {
        if (c->remaining > 0) {
            size_t k = n - i;
            if (k > c->remaining) k = (size_t)c->remaining;
            for (size_t j = 0; j < k; j++) out_buf[o + j] = in[i + j] ^ c->mask[(c->mask_off + j) & 3];
            c->mask_off = (c->mask_off + (unsigned)k) & 3;
            c->remaining -= k;
            i += k;
            o += k;
            continue;
        }
        c->hdr[c->hdr_len++] = in[i++];
        if (c->hdr_len < 2) continue;
        size_t len7 = c->hdr[1] & 0x7f, masked = c->hdr[1] & 0x80;
        size_t ext = len7 == 126 ? 2 : len7 == 127 ? 8 : 0;
        size_t need = 2 + ext + (masked ? 4 : 0);
        if (c->hdr_len < need) continue;
        uint64_t len = len7;
        if (ext) {
            len = 0;
            for (size_t j = 0; j < ext; j++) len = len << 8 | c->hdr[2 + j];
        }
        out_buf[o++] = c->hdr[0];
        out_buf[o++] = (uint8_t)len7;
        memcpy(out_buf + o, c->hdr + 2, ext);
        o += ext;
        if (masked) memcpy(c->mask, c->hdr + 2 + ext, 4);
        else memset(c->mask, 0, 4);
        c->mask_off = 0;
        c->remaining = len;
        c->hdr_len = 0;
    }
    return o;
}

/* Writes `len` bytes to `to`; what the kernel does not take waits in `to->pending` and pauses
 * reading `from`. Returns -1 when `to` failed. */
static int send_to(struct conn *to, struct conn *from, const uint8_t *buf, size_t len) {
    size_t off = 0;
    while (off < len) {
        ssize_t w = write(to->fd, buf + off, len - off);
        if (w > 0) { off += (size_t)w; continue; }
        if (w < 0 && errno == EINTR) continue;
        if (w < 0 && errno == EAGAIN) break;
        return -1;
    }
    if (off == len) return 0;
    memcpy(to->pending, buf + off, len - off);
    to->pending_off = 0;
    to->pending_len = len - off;
    to->want_out = 1;
    watch(to);
    from->paused = 1;
    watch(from);
    return 0;
}

static void on_readable(struct conn *c) {
    ssize_t n = read(c->fd, in_buf, sizeof in_buf);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) { drop_pair(c); return; }
    if (n < 0) return;
    size_t o = rewrite(c, in_buf, (size_t)n);
    if (o > 0 && send_to(c->peer, c, out_buf, o) < 0) drop_pair(c);
}

static void on_writable(struct conn *c) {
    while (c->pending_len > 0) {
        ssize_t w = write(c->fd, c->pending + c->pending_off, c->pending_len);
        if (w > 0) { c->pending_off += (size_t)w; c->pending_len -= (size_t)w; continue; }
        if (w < 0 && (errno == EAGAIN || errno == EINTR)) return;
        drop_pair(c);
        return;
    }
    c->want_out = 0;
    watch(c);
    c->peer->paused = 0;
    watch(c->peer);
}

/* ---- handshake ---- */

static int header(const char *req, const char *name, char *out, size_t cap) {
    size_t nl = strlen(name);
    for (const char *l = strstr(req, "\r\n"); l; l = strstr(l, "\r\n")) {
        l += 2;
        if (strncasecmp(l, name, nl) == 0 && l[nl] == ':') {
            const char *v = l + nl + 1;
            while (*v == ' ') v++;
            const char *e = strstr(v, "\r\n");
            size_t len = e ? (size_t)(e - v) : strlen(v);
            while (len > 0 && v[len - 1] == ' ') len--;
            if (len >= cap) return -1;
            memcpy(out, v, len);
            out[len] = 0;
            return 0;
        }
    }
    return -1;
}

static void link_pair(struct conn *a, struct conn *b) {
    a->peer = b;
    b->peer = a;
    a->linked = b->linked = 1;
    a->paused = b->paused = 0;
    a->pending = malloc(sizeof out_buf);
    b->pending = malloc(sizeof out_buf);
    watch(a);
    watch(b);
}

static void on_handshake(struct conn *c) {
    ssize_t n = read(c->fd, c->hs + c->hs_len, HANDSHAKE_MAX - 1 - c->hs_len);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) { drop_one(c); return; }
    if (n < 0) return;
    c->hs_len += (size_t)n;
    c->hs[c->hs_len] = 0;
    char *end = strstr(c->hs, "\r\n\r\n");
    if (!end) {
        if (c->hs_len >= HANDSHAKE_MAX - 1) drop_one(c);
        return;
    }
    char wskey[64];
    const char *path = c->hs + 4;
    if (strncmp(c->hs, "GET /", 5) != 0 || (path[1] != 'a' && path[1] != 'b') || path[2] != '/' ||
        header(c->hs, "Sec-WebSocket-Key", wskey, sizeof wskey) < 0) {
        drop_one(c);
        return;
    }
    const char *k = path + 3, *sp = strchr(k, ' ');
    if (!sp || (size_t)(sp - k) >= KEY_MAX || end + 4 != c->hs + c->hs_len) {
        drop_one(c); /* no key, or bytes after the request before the 101 (not allowed) */
        return;
    }
    c->side = path[1];
    memcpy(c->key, k, (size_t)(sp - k));
    c->key[sp - k] = 0;
    char cat[128];
    snprintf(cat, sizeof cat, "%s258EAFA5-E914-47DA-95CA-C5AB0DC85B11", wskey);
    uint8_t digest[20];
    char accept[32];
    sha1((const uint8_t *)cat, strlen(cat), digest);
    base64(digest, 20, accept);
    char resp[256];
    int rl = snprintf(resp, sizeof resp,
                      "HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n"
                      "Connection: Upgrade\r\nSec-WebSocket-Accept: %s\r\n\r\n", accept);
    if (write(c->fd, resp, (size_t)rl) != rl) { drop_one(c); return; }
    free(c->hs);
    c->hs = NULL;
    for (struct conn *w = waiting; w; w = w->next_waiting) {
        if (w->side != c->side && strcmp(w->key, c->key) == 0) {
            unwait(w);
            link_pair(w, c);
            return;
        }
    }
    /* Wait for the peer without reading (anything sent meanwhile stays in the kernel). */
    c->next_waiting = waiting;
    waiting = c;
    c->paused = 1;
    watch(c);
}

int main(int argc, char **argv) {
    signal(SIGPIPE, SIG_IGN);
    int port = argc > 1 ? atoi(argv[1]) : 0;
    int ls = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in addr = {0};
    addr.sin_family = AF_INET;
    addr.sin_port = htons((uint16_t)port);
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (bind(ls, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(ls, 1024) < 0) {
        perror("bind/listen");
        return 1;
    }
    socklen_t al = sizeof addr;
    getsockname(ls, (struct sockaddr *)&addr, &al);
    printf("listening on %d\n", ntohs(addr.sin_port));
    fflush(stdout);
    ep = epoll_create1(0);
    struct epoll_event lev = {.events = EPOLLIN, .data.ptr = NULL};
    epoll_ctl(ep, EPOLL_CTL_ADD, ls, &lev);
    struct epoll_event evs[256];
    for (;;) {
        int n = epoll_wait(ep, evs, 256, -1);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) { perror("epoll_wait"); return 1; }
        for (int i = 0; i < n; i++) {
            struct conn *c = evs[i].data.ptr;
            if (!c) {
                int fd;
                while ((fd = accept4(ls, NULL, NULL, SOCK_NONBLOCK)) >= 0) {
                    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
                    struct conn *nc = calloc(1, sizeof *nc);
                    nc->fd = fd;
                    nc->hs = malloc(HANDSHAKE_MAX);
                    struct epoll_event ev = {.events = EPOLLIN, .data.ptr = nc};
                    epoll_ctl(ep, EPOLL_CTL_ADD, fd, &ev);
                }
                continue;
            }
            uint32_t e = evs[i].events;
            if (c->dead) continue;
            if (!c->linked) {
                if (c->hs) on_handshake(c);
                else if (e & (EPOLLHUP | EPOLLERR)) drop_one(c);
                continue;
            }
            if (e & EPOLLOUT) on_writable(c);
            if (c->dead) continue;
            if (!c->paused && (e & (EPOLLIN | EPOLLHUP | EPOLLERR))) on_readable(c);
            else if (c->paused && (e & (EPOLLHUP | EPOLLERR))) drop_pair(c);
        }
        bury();
    }
}
