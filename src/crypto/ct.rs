//! Constant-time comparison for secrets (docs/reference/http.md: "Secrets are compared in constant time").

use subtle::ConstantTimeEq;

/// Constant-time equality of two byte strings; only the lengths (not secret) may leak through timing.
pub fn ct_eq(a: &[u8], b: &[u8]) -> bool {
    a.ct_eq(b).into()
}

/// [`ct_eq`] over the UTF-8 bytes of two strings.
pub fn ct_eq_str(a: &str, b: &str) -> bool {
    ct_eq(a.as_bytes(), b.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn compares() {
        assert!(ct_eq(b"secret", b"secret"));
        assert!(!ct_eq(b"secret", b"secreT"));
        assert!(!ct_eq(b"secret", b"secret!"));
        assert!(ct_eq(b"", b""));
        assert!(ct_eq_str("tok", "tok"));
        assert!(!ct_eq_str("tok", "tak"));
    }
}
