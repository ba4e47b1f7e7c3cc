//! The TLS 1.3 record layer (RFC 8446 §5) run by [`TlsIo`](super::stream::TlsIo) once rustls has
//! finished a TLS 1.3 handshake.
//!
//! rustls' connection keeps, for as long as the connection lives, its record layer with boxed
//! encrypter and decrypter (ring key schedules), its key schedule and what is left of the
//! handshake: about 3.2 KiB of RSS per idle connection (`idle_bench --tls`). After the handshake all a server needs is the two
//! application traffic secrets, the keys and IVs expanded from them and two sequence numbers;
//! [`Keys13`] keeps only those (under 250 bytes, inline) and builds ring's AEAD keys when data
//! flows, dropping them again when the connection is drained.
//!
//! Where the secrets come from: rustls hands out the keys, IVs and sequence numbers
//! (`dangerous_into_kernel_connection`, with `enable_secret_extraction`), but not the traffic
//! secrets a KeyUpdate needs. Those are caught as rustls computes them through the config's
//! [`KeyLog`] ([`CaptureSecrets`], which keeps them in a thread-local only until the handshake
//! driver takes them, right after the rustls call that computed them; nothing is written
//! anywhere). Keys derived from the caught secrets must equal the keys rustls extracted
//! (compared in constant time); if they do not, or nothing was caught, the rustls
//! `KernelConnection` is kept to compute KeyUpdate secrets instead.
//!
//! What is enforced (as rustls did): outer type application_data (a change_cipher_spec or any
//! plaintext record after the handshake is unexpected_message), legacy version 0x03xx, ciphertext
//! at most 2^14 + 256 bytes and plaintext at most 2^14 (record_overflow), authentication
//! (bad_record_mac), a non-zero inner content type (unexpected_message). close_notify ends the
//! stream; any other alert is an error. The only handshake message accepted is KeyUpdate, alone at
//! the end of its record (a message split over records is a decode_error); a request for an
//! update is answered before the next application data. Each refusal sends its alert.
//!
//! Limits: our own sending key is updated (a KeyUpdate we send) before it has protected the
//! suite's confidentiality limit of records (2^24 for AES-GCM, as rustls), and before the sequence
//! number nears its end (ChaCha20-Poly1305). A peer whose sequence number reaches 2^64 - 2^16 is
//! refused (it should have updated its keys long before).

use std::cell::RefCell;

use ring::aead::{self, Aad, LessSafeKey, Nonce, UnboundKey};
use ring::hkdf::{self, KeyType};
use rustls::kernel::KernelConnection;
use rustls::server::ServerConnectionData;
use rustls::{
    AlertDescription, ConnectionTrafficSecrets, ContentType, Error, ExtractedSecrets,
    HandshakeType, InvalidMessage, KeyLog, PeerMisbehaved,
};
use subtle::ConstantTimeEq;

/// Largest plaintext in a record (2^14).
pub const MAX_PLAIN: usize = 16_384;
/// Largest ciphertext in a record (2^14 + 256).
const MAX_CIPHER: usize = MAX_PLAIN + 256;
const HEADER: usize = 5;
const TAG: usize = 16;
/// Bytes a record adds to its plaintext: header, inner content type, tag.
pub const OVERHEAD: usize = HEADER + 1 + TAG;
/// The peer's sequence number at which we stop reading (rustls' soft limit).
const SEQ_SOFT_LIMIT: u64 = 0xffff_ffff_ffff_0000;
/// Records sealed under one AES-GCM key before we update it (rustls' confidentiality limit).
const AES_GCM_LIMIT: u64 = 1 << 24;
const SECRET_MAX: usize = 48;
const KEY_UPDATE: u8 = 24;

/// The three TLS 1.3 AEADs of ring's provider.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Suite {
    Aes128Gcm,
    Aes256Gcm,
    Chacha20Poly1305,
}

impl Suite {
    fn aead(self) -> &'static aead::Algorithm {
        match self {
            Suite::Aes128Gcm => &aead::AES_128_GCM,
            Suite::Aes256Gcm => &aead::AES_256_GCM,
            Suite::Chacha20Poly1305 => &aead::CHACHA20_POLY1305,
        }
    }

    /// The suite's hash as HKDF (SHA-384 only for TLS_AES_256_GCM_SHA384).
    fn hkdf(self) -> hkdf::Algorithm {
        match self {
            Suite::Aes256Gcm => hkdf::HKDF_SHA384,
            _ => hkdf::HKDF_SHA256,
        }
    }

    fn hash_len(self) -> usize {
        self.hkdf().len()
    }

    fn key_len(self) -> usize {
        self.aead().key_len()
    }

    /// Records we seal under one key before updating it.
    fn send_limit(self) -> u64 {
        match self {
            Suite::Chacha20Poly1305 => SEQ_SOFT_LIMIT,
            _ => AES_GCM_LIMIT,
        }
    }
}

/// Overwrites secret bytes before their memory is given back (`black_box` keeps the compiler
/// from dropping the writes as dead; best effort without unsafe code).
fn wipe(bytes: &mut [u8]) {
    bytes.fill(0);
    std::hint::black_box(bytes);
}

struct Len(usize);

impl hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// HKDF-Expand-Label(secret, label, "", out.len()) (RFC 8446 §7.1).
fn expand_label(alg: hkdf::Algorithm, secret: &[u8], label: &[u8], out: &mut [u8]) {
    let prk = hkdf::Prk::new_less_safe(alg, secret);
    let len = (out.len() as u16).to_be_bytes();
    let label_len = [(6 + label.len()) as u8];
    let info: [&[u8]; 5] = [&len, &label_len, b"tls13 ", label, &[0]];
    prk.expand(&info, Len(out.len()))
        .and_then(|okm| okm.fill(out))
        .expect("HKDF output within 255 hash lengths");
}

/// One direction's traffic keys.
struct Direction {
    suite: Suite,
    /// The current traffic secret (`suite.hash_len()` bytes); unused when a `KernelConnection`
    /// computes updates.
    secret: [u8; SECRET_MAX],
    key: [u8; 32],
    iv: [u8; 12],
    seq: u64,
    /// ring's key (the expanded AES key schedule and GHASH table: hundreds of bytes), built when
    /// data flows and dropped when the connection is drained.
    aead: Option<Box<LessSafeKey>>,
}

impl Drop for Direction {
    fn drop(&mut self) {
        wipe(&mut self.secret);
        wipe(&mut self.key);
        wipe(&mut self.iv);
    }
}

impl Direction {
    fn new(suite: Suite, seq: u64, key: &[u8], iv: &[u8]) -> Direction {
        let mut d = Direction {
            suite,
            secret: [0; SECRET_MAX],
            key: [0; 32],
            iv: [0; 12],
            seq,
            aead: None,
        };
        d.key[..key.len()].copy_from_slice(key);
        d.iv.copy_from_slice(iv);
        d
    }

    /// Key and IV from the traffic secret (RFC 8446 §7.3).
    fn derive(suite: Suite, secret: &[u8]) -> ([u8; 32], [u8; 12]) {
        let (mut key, mut iv) = ([0u8; 32], [0u8; 12]);
        expand_label(suite.hkdf(), secret, b"key", &mut key[..suite.key_len()]);
        expand_label(suite.hkdf(), secret, b"iv", &mut iv);
        (key, iv)
    }

    /// Moves to the next generation of the secret (RFC 8446 §7.2), or to the keys `kernel` gives.
    fn update(&mut self, next: Option<ConnectionTrafficSecrets>) -> Result<(), Error> {
        self.aead = None;
        self.seq = 0;
        if let Some(t) = next {
            let (_, key, iv) = parts(&t)?;
            self.key[..key.len()].copy_from_slice(key);
            self.iv.copy_from_slice(iv);
            return Ok(());
        }
        let n = self.suite.hash_len();
        let mut secret = [0u8; SECRET_MAX];
        expand_label(
            self.suite.hkdf(),
            &self.secret[..n],
            b"traffic upd",
            &mut secret[..n],
        );
        self.secret = secret;
        wipe(&mut secret);
        let (mut key, mut iv) = Direction::derive(self.suite, &self.secret[..n]);
        self.key = key;
        self.iv = iv;
        wipe(&mut key);
        wipe(&mut iv);
        Ok(())
    }

    fn nonce(&self) -> Nonce {
        let mut n = self.iv;
        for (b, s) in n[4..].iter_mut().zip(self.seq.to_be_bytes()) {
            *b ^= s;
        }
        Nonce::assume_unique_for_key(n)
    }

    fn aead(&mut self) -> &LessSafeKey {
        let (suite, key) = (self.suite, &self.key);
        self.aead.get_or_insert_with(|| {
            let unbound = UnboundKey::new(suite.aead(), &key[..suite.key_len()])
                .expect("key length matches the suite");
            Box::new(LessSafeKey::new(unbound))
        })
    }
}

fn parts(t: &ConnectionTrafficSecrets) -> Result<(Suite, &[u8], &[u8]), Error> {
    Ok(match t {
        ConnectionTrafficSecrets::Aes128Gcm { key, iv } => {
            (Suite::Aes128Gcm, key.as_ref(), iv.as_ref())
        }
        ConnectionTrafficSecrets::Aes256Gcm { key, iv } => {
            (Suite::Aes256Gcm, key.as_ref(), iv.as_ref())
        }
        ConnectionTrafficSecrets::Chacha20Poly1305 { key, iv } => {
            (Suite::Chacha20Poly1305, key.as_ref(), iv.as_ref())
        }
        _ => return Err(Error::General("tls: unsupported suite".into())),
    })
}

/// A traffic secret caught by [`CaptureSecrets`].
#[derive(Clone, Copy)]
struct Secret {
    bytes: [u8; SECRET_MAX],
    len: usize,
}

/// The two application traffic secrets of the handshake being driven on this thread.
#[derive(Default)]
pub struct Caught {
    client: Option<Secret>,
    server: Option<Secret>,
}

impl Drop for Caught {
    fn drop(&mut self) {
        for s in [&mut self.client, &mut self.server].into_iter().flatten() {
            wipe(&mut s.bytes);
        }
    }
}

impl Caught {
    /// Takes what rustls logged on this thread since the last take (call right after each rustls
    /// call of one handshake, so no other connection's secrets can be in between).
    pub fn take_logged(&mut self) {
        CAUGHT.with(|c| {
            let mut c = c.borrow_mut();
            if let Some(s) = c.client.take() {
                self.client = Some(s);
            }
            if let Some(s) = c.server.take() {
                self.server = Some(s);
            }
        });
    }
}

thread_local! {
    static CAUGHT: RefCell<Caught> = RefCell::new(Caught::default());
}

/// The [`KeyLog`] that catches the application traffic secrets for [`Keys13`] (module docs); it
/// writes nothing anywhere.
#[derive(Debug)]
pub struct CaptureSecrets;

impl KeyLog for CaptureSecrets {
    fn log(&self, label: &str, _client_random: &[u8], secret: &[u8]) {
        if secret.len() > SECRET_MAX {
            return;
        }
        let mut s = Secret {
            bytes: [0; SECRET_MAX],
            len: secret.len(),
        };
        s.bytes[..secret.len()].copy_from_slice(secret);
        CAUGHT.with(|c| {
            let mut c = c.borrow_mut();
            match label {
                "CLIENT_TRAFFIC_SECRET_0" => c.client = Some(s),
                "SERVER_TRAFFIC_SECRET_0" => c.server = Some(s),
                _ => {}
            }
        });
        wipe(&mut s.bytes);
    }

    fn will_log(&self, label: &str) -> bool {
        matches!(label, "CLIENT_TRAFFIC_SECRET_0" | "SERVER_TRAFFIC_SECRET_0")
    }
}

/// Lets [`TlsIo`](super::stream::TlsIo) run TLS 1.3 connections of `config` on [`Keys13`]:
/// secret extraction on and the application traffic secrets caught (module docs).
pub fn enable(config: &mut rustls::ServerConfig) {
    config.enable_secret_extraction = true;
    config.key_log = std::sync::Arc::new(CaptureSecrets);
}

/// A refusal: the error, and the alert owed to the peer (none when the peer sent one).
#[derive(Debug)]
pub struct Fatal {
    pub error: Error,
    pub alert: Option<AlertDescription>,
}

fn fatal(alert: AlertDescription, error: Error) -> Fatal {
    Fatal {
        error,
        alert: Some(alert),
    }
}

fn decode_error(m: InvalidMessage) -> Fatal {
    fatal(AlertDescription::DecodeError, Error::InvalidMessage(m))
}

fn unexpected(got: ContentType) -> Fatal {
    fatal(
        AlertDescription::UnexpectedMessage,
        Error::InappropriateMessage {
            expect_types: vec![ContentType::ApplicationData],
            got_type: got,
        },
    )
}

/// What one record held.
#[derive(Debug, PartialEq, Eq)]
pub enum Opened {
    /// Application data at `start..end` of the buffer given to [`Keys13::open`].
    Data(usize, usize),
    /// The peer's close_notify.
    CloseNotify,
    /// A KeyUpdate (applied; a requested answer is owed, see [`Keys13::answer_owed`]).
    KeyUpdate,
}

/// The traffic keys of a TLS 1.3 connection after the handshake (module docs).
pub struct Keys13 {
    rx: Direction,
    tx: Direction,
    /// Records sealed under one sending key before we update it.
    tx_limit: u64,
    /// The peer asked for a KeyUpdate: ours goes before any more application data.
    owed: bool,
    /// Computes updated secrets when ours could not be checked against rustls' keys.
    kernel: Option<Box<KernelConnection<ServerConnectionData>>>,
}

impl Keys13 {
    /// The keys of a connection rustls has finished a TLS 1.3 handshake on. `caught` are the
    /// traffic secrets logged during that handshake; `kernel` is dropped if keys derived from them
    /// are the keys rustls extracted.
    pub fn new(
        extracted: ExtractedSecrets,
        kernel: KernelConnection<ServerConnectionData>,
        caught: &Caught,
    ) -> Result<Keys13, Error> {
        let (rx_seq, rx) = &extracted.rx;
        let (tx_seq, tx) = &extracted.tx;
        let (suite, rx_key, rx_iv) = parts(rx)?;
        let (tx_suite, tx_key, tx_iv) = parts(tx)?;
        if suite != tx_suite {
            return Err(Error::General("tls: suites differ per direction".into()));
        }
        let mut keys = Keys13 {
            rx: Direction::new(suite, *rx_seq, rx_key, rx_iv),
            tx: Direction::new(suite, *tx_seq, tx_key, tx_iv),
            tx_limit: suite.send_limit(),
            owed: false,
            kernel: None,
        };
        let checked = match (caught.client, caught.server) {
            (Some(c), Some(s)) if c.len == suite.hash_len() && s.len == suite.hash_len() => {
                let same = |secret: &Secret, key: &[u8], iv: &[u8]| {
                    let (mut k, mut i) = Direction::derive(suite, &secret.bytes[..secret.len]);
                    let eq = k[..key.len()].ct_eq(key) & i[..].ct_eq(iv);
                    wipe(&mut k);
                    wipe(&mut i);
                    bool::from(eq)
                };
                // Both compared whatever the first gives (no early exit on a secret).
                let rx_ok = same(&c, rx_key, rx_iv);
                let tx_ok = same(&s, tx_key, tx_iv);
                if rx_ok && tx_ok {
                    keys.rx.secret = c.bytes;
                    keys.tx.secret = s.bytes;
                }
                rx_ok && tx_ok
            }
            _ => false,
        };
        if !checked {
            keys.kernel = Some(Box::new(kernel));
        }
        Ok(keys)
    }

    /// True once a KeyUpdate could not be checked against rustls (tests).
    #[cfg(test)]
    pub fn uses_kernel(&self) -> bool {
        self.kernel.is_some()
    }

    /// Whether ring's keys are built now (tests).
    #[cfg(test)]
    pub fn holds_aead(&self) -> bool {
        self.rx.aead.is_some() || self.tx.aead.is_some()
    }

    /// Lowers the number of records sealed before our own KeyUpdate (tests).
    #[cfg(test)]
    pub fn set_send_limit(&mut self, records: u64) {
        self.tx_limit = records;
    }

    /// Drops ring's keys (built again when data flows).
    pub fn release(&mut self) {
        self.rx.aead = None;
        self.tx.aead = None;
    }

    /// The peer asked for a KeyUpdate not yet sent.
    pub fn answer_owed(&self) -> bool {
        self.owed
    }

    /// Opens the record at the start of `buf` in place: `Ok(None)` if it is not all there yet,
    /// else its length and content.
    pub fn open(&mut self, buf: &mut [u8]) -> Result<Option<(usize, Opened)>, Fatal> {
        let Some(header) = buf.get(..HEADER) else {
            return Ok(None);
        };
        let header: [u8; HEADER] = header.try_into().expect("five bytes");
        let len = u16::from_be_bytes([header[3], header[4]]) as usize;
        if header[0] != u8::from(ContentType::ApplicationData) {
            return Err(unexpected(ContentType::from(header[0])));
        }
        if header[1] != 3 {
            return Err(decode_error(InvalidMessage::UnknownProtocolVersion));
        }
        if len > MAX_CIPHER {
            return Err(fatal(
                AlertDescription::RecordOverflow,
                Error::InvalidMessage(InvalidMessage::MessageTooLarge),
            ));
        }
        let Some(body) = buf.get_mut(HEADER..HEADER + len) else {
            return Ok(None);
        };
        if self.rx.seq >= SEQ_SOFT_LIMIT {
            return Err(fatal(
                AlertDescription::CloseNotify,
                Error::General("tls: peer's sequence number exhausted".into()),
            ));
        }
        let nonce = self.rx.nonce();
        let plain = self
            .rx
            .aead()
            .open_in_place(nonce, Aad::from(header), body)
            .map_err(|_| fatal(AlertDescription::BadRecordMac, Error::DecryptError))?;
        self.rx.seq += 1;
        // Content, content type and padding together are at most 2^14 + 1 bytes.
        if plain.len() > MAX_PLAIN + 1 {
            return Err(fatal(
                AlertDescription::RecordOverflow,
                Error::PeerSentOversizedRecord,
            ));
        }
        // The inner content type is the last non-zero byte; zeros after it are padding.
        let Some(at) = plain.iter().rposition(|&b| b != 0) else {
            return Err(fatal(
                AlertDescription::UnexpectedMessage,
                Error::PeerMisbehaved(PeerMisbehaved::IllegalTlsInnerPlaintext),
            ));
        };
        let used = HEADER + len;
        let opened = match ContentType::from(plain[at]) {
            ContentType::ApplicationData => Opened::Data(HEADER, HEADER + at),
            ContentType::Alert => {
                let [_level, desc] = plain[..at] else {
                    return Err(decode_error(InvalidMessage::TrailingData("alert")));
                };
                let desc = AlertDescription::from(desc);
                if desc == AlertDescription::CloseNotify {
                    Opened::CloseNotify
                } else {
                    return Err(Fatal {
                        error: Error::AlertReceived(desc),
                        alert: None,
                    });
                }
            }
            ContentType::Handshake => {
                self.key_update(&plain[..at])?;
                Opened::KeyUpdate
            }
            other => return Err(unexpected(other)),
        };
        Ok(Some((used, opened)))
    }

    /// Applies the KeyUpdate that must be all of `msg` (RFC 8446 §4.6.3).
    fn key_update(&mut self, msg: &[u8]) -> Result<(), Fatal> {
        let &[typ, l0, l1, l2, ref body @ ..] = msg else {
            return Err(decode_error(InvalidMessage::MessageTooShort));
        };
        let len = u32::from_be_bytes([0, l0, l1, l2]) as usize;
        if typ != KEY_UPDATE {
            return Err(fatal(
                AlertDescription::UnexpectedMessage,
                Error::InappropriateHandshakeMessage {
                    expect_types: vec![HandshakeType::KeyUpdate],
                    got_type: HandshakeType::from(typ),
                },
            ));
        }
        if len != 1 {
            return Err(decode_error(InvalidMessage::InvalidKeyUpdate));
        }
        match body {
            // A message after the update would need the new keys (or one split over records).
            [_, _, ..] => {
                return Err(fatal(
                    AlertDescription::UnexpectedMessage,
                    Error::PeerMisbehaved(PeerMisbehaved::KeyEpochWithPendingFragment),
                ))
            }
            [0] => {}
            [1] => self.owed = true,
            _ => return Err(decode_error(InvalidMessage::InvalidKeyUpdate)),
        }
        let next = match &mut self.kernel {
            Some(k) => Some(k.update_rx_secret().map_err(internal)?.1),
            None => None,
        };
        self.rx.update(next).map_err(internal)
    }

    /// Appends to `out` (initialised up to its length; what is past `*end` is overwritten) the
    /// records of `data` as application data, preceded by a KeyUpdate if one is owed or due.
    pub fn seal_data(
        &mut self,
        data: &[u8],
        out: &mut Vec<u8>,
        end: &mut usize,
    ) -> Result<(), Error> {
        let records = data.len().div_ceil(MAX_PLAIN);
        grow(out, *end + data.len() + records * OVERHEAD);
        for chunk in data.chunks(MAX_PLAIN) {
            self.send_update_if_due(out, end)?;
            self.seal(ContentType::ApplicationData, chunk, out, end)?;
        }
        Ok(())
    }

    /// Sends the KeyUpdate the peer asked for, if any, or ours if our key is worn out.
    pub fn send_update_if_due(&mut self, out: &mut Vec<u8>, end: &mut usize) -> Result<(), Error> {
        if !self.owed && self.tx.seq < self.tx_limit {
            return Ok(());
        }
        self.seal(ContentType::Handshake, &[KEY_UPDATE, 0, 0, 1, 0], out, end)?;
        self.owed = false;
        let next = match &mut self.kernel {
            Some(k) => Some(k.update_tx_secret()?.1),
            None => None,
        };
        self.tx.update(next)
    }

    /// Appends an alert: close_notify as a warning, anything else fatal.
    pub fn seal_alert(
        &mut self,
        desc: AlertDescription,
        out: &mut Vec<u8>,
        end: &mut usize,
    ) -> Result<(), Error> {
        // Alert levels: 1 warning, 2 fatal.
        let level = if desc == AlertDescription::CloseNotify {
            1
        } else {
            2
        };
        self.seal(ContentType::Alert, &[level, u8::from(desc)], out, end)
    }

    /// Appends one record of `data` (at most [`MAX_PLAIN`] bytes), sealed in place in `out`.
    fn seal(
        &mut self,
        typ: ContentType,
        data: &[u8],
        out: &mut Vec<u8>,
        end: &mut usize,
    ) -> Result<(), Error> {
        debug_assert!(data.len() <= MAX_PLAIN);
        if self.tx.seq >= SEQ_SOFT_LIMIT {
            return Err(Error::EncryptError);
        }
        let total = data.len() + OVERHEAD;
        grow(out, *end + total);
        let rec = &mut out[*end..*end + total];
        let header = {
            let l = ((data.len() + 1 + TAG) as u16).to_be_bytes();
            [u8::from(ContentType::ApplicationData), 3, 3, l[0], l[1]]
        };
        rec[..HEADER].copy_from_slice(&header);
        rec[HEADER..HEADER + data.len()].copy_from_slice(data);
        rec[HEADER + data.len()] = u8::from(typ);
        let nonce = self.tx.nonce();
        let sealed = HEADER..HEADER + data.len() + 1;
        let tag = self
            .tx
            .aead()
            .seal_in_place_separate_tag(nonce, Aad::from(header), &mut rec[sealed.clone()])
            .map_err(|_| Error::EncryptError)?;
        rec[sealed.end..].copy_from_slice(tag.as_ref());
        self.tx.seq += 1;
        *end += total;
        Ok(())
    }
}

fn internal(e: Error) -> Fatal {
    fatal(AlertDescription::InternalError, e)
}

/// Makes `out` at least `len` long (zero-filling only the growth).
fn grow(out: &mut Vec<u8>, len: usize) {
    if out.len() < len {
        out.resize(len, 0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// RFC 8448 §3 (simple 1-RTT handshake): the server's application traffic secret and the key
    /// and IV expanded from it.
    #[test]
    fn expands_labels_as_rfc_8448() {
        let hex = |s: &str| -> Vec<u8> {
            let s: String = s.split_whitespace().collect();
            (0..s.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
                .collect()
        };
        let secret = hex("a1 1a f9 f0 55 31 f8 56 ad 47 11 6b 45 a9 50 32 82 04 b4 f4 4b fb 6b 3a 4b 4f 1f 3f cb 63 16 43");
        let (key, iv) = Direction::derive(Suite::Aes128Gcm, &secret);
        assert_eq!(
            &key[..16],
            &hex("9f 02 28 3b 6c 9c 07 ef c2 6b b9 f2 ac 92 e3 56")[..]
        );
        assert_eq!(&iv[..], &hex("cf 78 2b 88 dd 83 54 9a ad f1 e9 84")[..]);
    }

    /// What a quiet connection keeps inline, against ring's key it builds only while data flows
    /// (`cargo test -- --nocapture` prints both).
    #[test]
    fn idle_keys_are_small() {
        let size = std::mem::size_of::<Keys13>();
        let aead = std::mem::size_of::<LessSafeKey>();
        eprintln!("Keys13 {size} bytes; ring's LessSafeKey {aead} bytes per direction");
        assert!(size <= 256, "{size} bytes");
    }
}
