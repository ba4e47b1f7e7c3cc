//! Leg path decoding (docs/reference/websocket.md gate 2): which leg a path names and its percent-decoded id.

use percent_encoding::percent_decode_str;

use crate::crypto::ident::is_relay_host_id;

/// Percent-decodes a path segment. A `%` not followed by two hex digits is a bad escape (the
/// `percent-encoding` crate would pass it through verbatim), and so is a non-UTF-8 result: `None`.
pub fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let well_formed = b.iter().enumerate().all(|(i, &c)| {
        c != b'%'
            || (b.get(i + 1).is_some_and(u8::is_ascii_hexdigit)
                && b.get(i + 2).is_some_and(u8::is_ascii_hexdigit))
    });
    if !well_formed {
        return None;
    }
    percent_decode_str(s)
        .decode_utf8()
        .ok()
        .map(|c| c.into_owned())
}

/// Longest data-leg `connId` after decoding (docs/reference/websocket.md gate 2).
pub const CONN_ID_MAX_CHARS: usize = 128;

/// The leg a path names, decided before any other gate. `None` ids failed gate 2 (429).
#[derive(Debug, PartialEq, Eq)]
pub enum Named {
    Control,
    Data(Option<String>),
    Phone(Option<String>),
    /// Not a leg path (404).
    Other,
}

pub fn named(path: &str) -> Named {
    if path == "/v1/host/control" {
        Named::Control
    } else if let Some(id) = path.strip_prefix("/v1/host/data/") {
        Named::Data(percent_decode(id).filter(|d| {
            let n = d.chars().count();
            (1..=CONN_ID_MAX_CHARS).contains(&n)
        }))
    } else if let Some(id) = path.strip_prefix("/v1/connect/") {
        Named::Phone(percent_decode(id).filter(|d| is_relay_host_id(d)))
    } else {
        Named::Other
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percent_decoding() {
        assert_eq!(percent_decode("abc%2Dd").as_deref(), Some("abc-d"));
        assert_eq!(percent_decode("abc").as_deref(), Some("abc"));
        assert_eq!(percent_decode("%zz"), None);
        assert_eq!(percent_decode("%4"), None);
        assert_eq!(percent_decode("a%"), None);
        assert_eq!(percent_decode("%ff"), None, "not UTF-8");
        assert_eq!(percent_decode("%C3%A9").as_deref(), Some("é"));
    }

    #[test]
    fn names() {
        assert_eq!(named("/v1/host/control"), Named::Control);
        assert_eq!(named("/v1/host/controls"), Named::Other);
        assert_eq!(named("/v1/host/data/"), Named::Data(None));
        assert_eq!(
            named(&format!("/v1/host/data/{}", "a".repeat(129))),
            Named::Data(None)
        );
        assert!(matches!(
            named(&format!("/v1/host/data/{}", "a".repeat(128))),
            Named::Data(Some(_))
        ));
        assert_eq!(named("/v1/connect/short"), Named::Phone(None));
        assert!(matches!(
            named("/v1/connect/abcdefghijklmnop"),
            Named::Phone(Some(_))
        ));
        assert_eq!(
            named("/v1/connect/abcdefghijklmno%70"),
            Named::Phone(Some("abcdefghijklmnop".into()))
        );
        assert_eq!(named("/v1/connect"), Named::Other);
    }
}
