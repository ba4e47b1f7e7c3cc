//! What a provider call produced (ARCHITECTURE.md / docs/reference/http.md), and the shared `Retry-After` rule.

/// A provider outcome.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Sent,
    Dead {
        reason: String,
        status: Option<u16>,
    },
    Error {
        reason: String,
        status: Option<u16>,
        retryable: bool,
        retry_after_ms: Option<i64>,
    },
}

impl Outcome {
    pub fn error(reason: &str, status: Option<u16>, retryable: bool) -> Outcome {
        Outcome::Error {
            reason: reason.to_string(),
            status,
            retryable,
            retry_after_ms: None,
        }
    }
}

/// `Retry-After`: integer seconds or an HTTP-date → ms from `now`, floored at 0; else `None`.
pub fn parse_retry_after(value: Option<&str>, now_ms: i64) -> Option<i64> {
    let v = value?.trim();
    if let Ok(s) = v.parse::<i64>() {
        return Some(s.max(0).saturating_mul(1000));
    }
    let at = chrono::DateTime::parse_from_rfc2822(v).ok()?;
    Some((at.timestamp_millis() - now_ms).max(0))
}

/// Retry delay of ARCHITECTURE.md: `max(retryAfterMs ?? 0, min(30000, 1000 × 2^min(attempts,5)))`.
pub fn backoff_ms(attempts: i64, retry_after_ms: Option<i64>) -> i64 {
    let exp = attempts.clamp(0, 5) as u32;
    let base = (1000i64 << exp).min(30_000);
    base.max(retry_after_ms.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retry_after() {
        assert_eq!(parse_retry_after(Some("5"), 0), Some(5000));
        assert_eq!(parse_retry_after(Some("-3"), 0), Some(0));
        assert_eq!(parse_retry_after(Some("soon"), 0), None);
        assert_eq!(parse_retry_after(None, 0), None);
        let now = 784_111_777_000 - 2_000; // Sun, 06 Nov 1994 08:49:37 GMT minus 2 s
        assert_eq!(
            parse_retry_after(Some("Sun, 06 Nov 1994 08:49:37 GMT"), now),
            Some(2000)
        );
    }

    #[test]
    fn backoff() {
        let d: Vec<i64> = (1..=7).map(|a| backoff_ms(a, None)).collect();
        assert_eq!(d, vec![2000, 4000, 8000, 16000, 30000, 30000, 30000]);
        assert_eq!(backoff_ms(1, Some(5000)), 5000);
    }
}
