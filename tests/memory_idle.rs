//! Memory regression: 2,000 idle pairs (250 hosts × 8 phones, with their controls) on the real
//! binary, plain and over its own TLS listener, must cost under a bound of server RSS per
//! WebSocket (growth after the warm-up, `support::idle::measure`), so a later change cannot
//! silently undo idle parking (`cell::splice`) or the small splice and control tasks. Release
//! measurements are in docs/benchmarks.md (release at 9,000 pairs: 1.30 KiB plain, 1.79 over TLS).

mod support;

use support::idle;

/// KiB of server RSS per idle WebSocket, debug build (measured 1.46 with splice and control
/// parking and the small splice and control tasks; 2.89 when an idle control kept its ~10 KiB
/// handshake task and a splice task was 1.5 KiB; a return of tungstenite's per-socket buffers
/// to every idle socket adds ~2.3 KiB and fails it).
const BOUND_KIB: f64 = 2.0;

/// KiB of server RSS per idle WebSocket over the relay's own TLS listener, debug build (measured
/// 1.95 with TLS 1.3 connections on our own record layer after the handshake, 1.46 plain in the
/// same run; 3.72 with the larger tasks; 6.71 when rustls' unbuffered connection stayed alive for
/// the whole connection, which fails it, as does a return of rustls' buffered connection and its
/// 4 KiB receive buffer).
const TLS_BOUND_KIB: f64 = 2.5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_pairs_stay_under_the_bound() {
    run(false, BOUND_KIB).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_tls_pairs_stay_under_the_bound() {
    run(true, TLS_BOUND_KIB).await;
}

async fn run(tls: bool, bound: f64) {
    let limit = idle::raise_nofile();
    assert!(
        limit >= 10_000,
        "open-file limit {limit} too low for 2,000 pairs"
    );
    let server = idle::spawn(env!("CARGO_BIN_EXE_orca-relay"), &[], tls);
    let (m, conns) = idle::measure(&server, 2_000, 8).await;
    eprintln!(
        "memory_idle (tls {tls}): {} pairs, {} sockets, RSS {} → {} KiB, {:.2} KiB per socket, setup {:.1} s",
        m.pairs,
        m.sockets,
        m.before_kib,
        m.after_kib,
        m.kib_per_socket(),
        m.setup_secs
    );
    assert_eq!(m.pairs, 2_000);
    assert!(
        m.kib_per_socket() < bound,
        "{:.2} KiB per idle socket (tls {tls}, bound {bound})",
        m.kib_per_socket()
    );
    drop(conns);
}
