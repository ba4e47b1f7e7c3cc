//! Every host → cell control message after activation (docs/reference/websocket.md): the frame is split into
//! its `type` and the rest, and the rest decoded with the schema of that type, as
//! `cell::control::on_text` does; an invalid command echoes its `reqId` only when that is itself
//! valid. Also the `x-orca-host-capabilities` header of the control leg's upgrade.
//!
//! Properties: never panics; every accepted command passes its own documented checks; an echoed
//! `reqId` is an opaque id; at most 16 capabilities of 1..64 chars.
#![no_main]

use libfuzzer_sys::fuzz_target;
use orca_relay::cell::frames::{self, Check, Split};
use orca_relay::contract::validate::is_opaque_id;

/// Decodes `m` as `T` and re-checks the acceptance against `Check` (the decoder must never hand
/// out a value its own check refuses).
fn accepts<T: serde::de::DeserializeOwned + Check>(
    m: &serde_json::Map<String, serde_json::Value>,
) -> bool {
    match frames::body::<T>(m.clone()) {
        Some(t) => {
            assert!(t.check());
            true
        }
        None => false,
    }
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    // The header parser sees the same bytes as comma-separated header values, one per line.
    let caps = frames::capabilities(text.lines());
    assert!(caps.len() <= 16);
    assert!(caps
        .iter()
        .all(|c| frames::chars_in(c, 1, 64) && c.trim() == c));

    let Split::Typed(ty, m) = frames::split(text) else {
        return;
    };
    let accepted = match ty.as_str() {
        "pong" => accepts::<frames::Pong>(&m),
        "auth-refresh" => accepts::<frames::AuthRefresh>(&m),
        "invite-create" => accepts::<frames::InviteCreate>(&m),
        "device-credential-install" => match frames::body::<frames::Install>(m.clone()) {
            Some(i) => {
                assert!(i.check());
                let a = &i.authorization;
                // Exactly one authorization id, matching the mode; no `null` stands for absence.
                assert_ne!(a.basis_conn_id.is_some(), a.direct_auth_id.is_some());
                true
            }
            None => false,
        },
        "device-credential-install-status" => accepts::<frames::InstallStatus>(&m),
        "device-resume-confirm" => accepts::<frames::ResumeConfirm>(&m),
        "device-revoke" => accepts::<frames::Revoke>(&m),
        _ => true,
    };
    if !accepted {
        if let Some(id) = frames::valid_req_id(&m) {
            assert!(is_opaque_id(&id));
            assert_eq!(m.get("reqId").and_then(|v| v.as_str()), Some(id.as_str()));
        }
    }
});
