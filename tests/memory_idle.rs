//! Memory regression: 2,000 idle pairs (250 hosts × 8 phones, with their controls) on the real
//! binary must cost under a generous bound of server RSS per WebSocket, so a later change cannot
//! silently undo idle parking (`cell::splice`). Release measurements are in the README; this debug
//! build bound is loose on purpose (release at 9,000 pairs: 2.2 KiB).

#[path = "support/idle.rs"]
mod idle;

/// KiB of server RSS per idle WebSocket, debug build (measured 3.35 with splice and control
/// parking, 4.75 before the parked splice shed its codec boxes and live state; a return of
/// tungstenite's per-socket buffers to every idle socket adds ~2.3 KiB and fails it).
const BOUND_KIB: f64 = 4.5;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_thousand_idle_pairs_stay_under_the_bound() {
    let limit = idle::raise_nofile();
    assert!(
        limit >= 10_000,
        "open-file limit {limit} too low for 2,000 pairs"
    );
    let server = idle::spawn(env!("CARGO_BIN_EXE_orca-relay"), &[]);
    let (m, conns) = idle::measure(&server, 2_000, 8).await;
    eprintln!(
        "memory_idle: {} pairs, {} sockets, RSS {} → {} KiB, {:.2} KiB per socket, setup {:.1} s",
        m.pairs,
        m.sockets,
        m.before_kib,
        m.after_kib,
        m.kib_per_socket(),
        m.setup_secs
    );
    assert_eq!(m.pairs, 2_000);
    assert!(
        m.kib_per_socket() < BOUND_KIB,
        "{:.2} KiB per idle socket (bound {BOUND_KIB})",
        m.kib_per_socket()
    );
    drop(conns);
}
