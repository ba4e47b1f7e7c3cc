//! The relay binary a bench starts: `ORCA_RELAY_BIN`, else `orca-relay` beside the example's own
//! target directory (`target/<profile>/examples/<bench>` → `target/<profile>/orca-relay`).

use std::path::PathBuf;

pub fn relay_bin() -> PathBuf {
    if let Ok(p) = std::env::var("ORCA_RELAY_BIN") {
        return p.into();
    }
    let exe = std::env::current_exe().expect("current exe");
    let p = exe
        .parent()
        .and_then(|d| d.parent())
        .map(|d| d.join("orca-relay"))
        .expect("target dir");
    assert!(
        p.exists(),
        "{} not found: run `cargo build` first or set ORCA_RELAY_BIN",
        p.display()
    );
    p
}
