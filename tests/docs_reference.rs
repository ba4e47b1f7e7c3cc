//! The generated reference pages (`docs/reference/close-codes.md`, `errors.md`, `limits.md`)
//! match the code's tables. `ORCA_RELAY_BLESS=1` rewrites the files instead of failing.

use std::path::PathBuf;

use orca_relay::contract::reference;

fn check(page: &str, generated: String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("docs/reference")
        .join(page);
    if std::env::var("ORCA_RELAY_BLESS").is_ok_and(|v| v == "1") {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, &generated).unwrap();
        return;
    }
    let on_disk = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        on_disk == generated,
        "docs/reference/{page} is out of date: run ORCA_RELAY_BLESS=1 cargo test --test docs_reference"
    );
}

/// The names of the `pub const` items of one source file.
fn consts(src: &str) -> Vec<String> {
    src.lines()
        .filter_map(|l| l.trim_start().strip_prefix("pub const "))
        .filter_map(|rest| rest.split(':').next())
        .map(|n| n.trim().to_string())
        .collect()
}

fn source(path: &str) -> String {
    std::fs::read_to_string(PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(path)).unwrap()
}

#[test]
fn close_codes_page_is_current() {
    check("close-codes.md", reference::close_codes_page());
}

#[test]
fn errors_page_is_current() {
    check("errors.md", reference::errors_page());
}

#[test]
fn limits_page_is_current() {
    check("limits.md", reference::limits_page());
}

#[test]
fn every_limit_is_documented() {
    let listed: Vec<&str> = reference::limits_table()
        .into_iter()
        .flat_map(|(_, rows)| rows.into_iter().map(|l| l.name))
        .collect();
    for name in consts(&source("src/contract/limits.rs")) {
        assert!(
            listed.contains(&name.as_str()),
            "limits::{name} is missing from the limits page (src/contract/reference.rs)"
        );
    }
}

#[test]
fn every_close_code_and_reason_is_documented() {
    let src = source("src/contract/close.rs");
    let (codes, reasons) = src.split_once("pub mod reason").unwrap();
    let code_names: Vec<&str> = reference::CLOSE_CODES.iter().map(|c| c.name).collect();
    for name in consts(codes) {
        assert!(
            code_names.contains(&name.as_str()),
            "close::{name} is missing from the close-codes page"
        );
    }
    let page = reference::close_codes_page();
    let n = consts(reasons).len();
    assert_eq!(
        n,
        reference::CLOSE_REASONS.len(),
        "every close::reason constant needs a row in reference::CLOSE_REASONS"
    );
    for r in reference::CLOSE_REASONS {
        assert!(page.contains(&format!("`{}`", r.text)));
    }
}

#[test]
fn every_error_code_is_documented() {
    let documented: Vec<&str> = reference::SHARED_ERRORS
        .iter()
        .chain(reference::ROUTE_ERRORS)
        .map(|e| e.code)
        .collect();
    assert_eq!(
        consts(&source("src/contract/errors.rs")).len(),
        reference::SHARED_ERRORS.len(),
        "every contract::errors constant needs a row in reference::SHARED_ERRORS"
    );
    // Every literal code handed to `h::error`/`error_retry`, or refused by a store or
    // heartbeat rule, in the route modules.
    let files = [
        "src/director/routes.rs",
        "src/director/admin.rs",
        "src/director/region.rs",
        "src/director/heartbeat.rs",
        "src/director/migrate.rs",
        "src/director/placement.rs",
        "src/store/cells.rs",
        "src/push/routes.rs",
        "src/cell/idle_rehome.rs",
        "src/cell/drain.rs",
    ];
    let markers = [
        "StatusCode::BAD_REQUEST,",
        "StatusCode::UNAUTHORIZED,",
        "StatusCode::FORBIDDEN,",
        "StatusCode::NOT_FOUND,",
        "StatusCode::CONFLICT,",
        "StatusCode::TOO_MANY_REQUESTS,",
        "StatusCode::INTERNAL_SERVER_ERROR,",
        "StatusCode::SERVICE_UNAVAILABLE,",
        "Refused(\"",
    ];
    let mut missing = Vec::new();
    for f in files {
        let src = source(f);
        // `placement.rs` maps its refusals to codes in a `match` (`=> "code"`).
        let extra: &[&str] = if f.ends_with("placement.rs") {
            &["=> \""]
        } else {
            &[]
        };
        for m in markers.iter().chain(extra) {
            for (i, _) in src.match_indices(m) {
                let rest = &src[i + m.len()..];
                let rest = rest.trim_start();
                let rest = if m.ends_with('"') {
                    rest
                } else if let Some(r) = rest.strip_prefix('"') {
                    r
                } else {
                    continue;
                };
                let code: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                let looks_like_code = code.contains('_') && rest[code.len()..].starts_with('"');
                if looks_like_code && !documented.contains(&code.as_str()) {
                    missing.push(format!("{f}: {code}"));
                }
            }
        }
    }
    missing.sort();
    missing.dedup();
    assert!(
        missing.is_empty(),
        "error codes missing from reference::ROUTE_ERRORS: {missing:?}"
    );
}
