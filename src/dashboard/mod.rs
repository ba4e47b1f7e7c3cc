//! `GET /dashboard` (docs/reference/http.md): one self-contained HTML page compiled into the binary.
//!
//! No external scripts, fonts or images: the page's script is inline and allowed by its SHA-256 in
//! the Content-Security-Policy (no `unsafe-inline`), it may fetch only this origin, and it cannot be
//! framed. The admin token is asked for once and kept in the tab's `sessionStorage`.
//!
//! What the page polls every 5 s (choices where the spec is silent):
//! - `POST /v1/admin/runtime-status` first, to learn the roles (every role serves it);
//! - on a director: `GET /v1/admin/overview` (the cell rows and totals) and
//!   `POST /v1/admin/cell-status` (fence and roll-isolation details for the highlights);
//! - on a process with the cell role: its own `/metrics` for splices and frames/s.
//!
//! Without the director role there is no overview: the page says so and shows this process's
//! runtime status (its own cell, if it runs one) instead.

use std::sync::OnceLock;

use sha2::{Digest, Sha256};
use warp::filters::BoxedFilter;
use warp::Filter;

use crate::http::Response;

/// The page.
pub const PAGE: &str = include_str!("index.html");

/// The Content-Security-Policy of the page: its one inline script by hash, same-origin fetches.
pub fn content_security_policy() -> &'static str {
    static CSP: OnceLock<String> = OnceLock::new();
    CSP.get_or_init(|| {
        let script = PAGE
            .split_once("<script>")
            .and_then(|(_, rest)| rest.split_once("</script>"))
            .map(|(s, _)| s)
            .unwrap_or_default();
        let hash = crate::crypto::b64::std_encode(&Sha256::digest(script.as_bytes()));
        format!(
            "default-src 'none'; script-src 'sha256-{hash}'; style-src 'unsafe-inline'; \
             connect-src 'self'; img-src data:; base-uri 'none'; form-action 'none'; \
             frame-ancestors 'none'"
        )
    })
}

fn page() -> Response {
    let mut r = Response::new(PAGE.into());
    let h = r.headers_mut();
    let v = http::HeaderValue::from_static;
    h.insert(http::header::CONTENT_TYPE, v("text/html; charset=utf-8"));
    h.insert(http::header::CACHE_CONTROL, v("no-store"));
    h.insert(http::header::REFERRER_POLICY, v("no-referrer"));
    h.insert(http::header::X_CONTENT_TYPE_OPTIONS, v("nosniff"));
    if let Ok(csp) = http::HeaderValue::from_str(content_security_policy()) {
        h.insert(http::header::CONTENT_SECURITY_POLICY, csp);
    }
    r
}

/// `GET /dashboard`, on every role (the page itself needs no token; its data calls do).
pub fn route() -> BoxedFilter<(Response,)> {
    warp::path!("dashboard").and(warp::get()).map(page).boxed()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn self_contained_page_with_a_hashed_script() {
        assert!(PAGE.starts_with("<!doctype html>"));
        for external in [
            "src=\"http",
            "href=\"http",
            "@import",
            "url(http",
            "<script src",
        ] {
            assert!(!PAGE.contains(external), "external reference {external}");
        }
        assert_eq!(PAGE.matches("<script>").count(), 1, "one inline script");
        let csp = content_security_policy();
        let script_src = csp
            .split(';')
            .map(str::trim)
            .find(|d| d.starts_with("script-src"))
            .unwrap();
        assert!(script_src.starts_with("script-src 'sha256-") && !script_src.contains("unsafe"));
        assert!(PAGE.contains("sessionStorage") && PAGE.contains("/v1/admin/overview"));
    }
}
