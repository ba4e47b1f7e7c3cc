//! The flag-value shapes every settings parser shares (`config`'s and `tls`'s): one error type,
//! bounded integers, optional values, on/off switches. Below both, so `tls` can parse its own
//! settings without naming `config`, which holds `tls`'s settings.

/// One line naming the variable and the rule it broke.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError(pub String);

impl std::fmt::Display for ConfigError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for ConfigError {}

/// A configuration refusal with this message.
pub fn err<T>(msg: impl Into<String>) -> Result<T, ConfigError> {
    Err(ConfigError(msg.into()))
}

/// `raw` as an integer in `lo..=hi`, else "`var` must be an integer in lo..hi".
pub fn int_in(var: &str, raw: &str, lo: i64, hi: i64) -> Result<i64, ConfigError> {
    match raw.trim().parse::<i64>() {
        Ok(v) if (lo..=hi).contains(&v) => Ok(v),
        _ => err(format!("{var} must be an integer in {lo}..{hi}")),
    }
}

/// Treats empty and whitespace-only values as unset.
pub fn opt(v: &Option<String>) -> Option<String> {
    v.as_ref()
        .filter(|s| !s.trim().is_empty())
        .map(|s| s.to_string())
}

/// [`opt`], trimmed (paths and lists, where surrounding blanks are never meant).
pub fn opt_trimmed(v: &Option<String>) -> Option<String> {
    opt(v).map(|s| s.trim().to_string())
}

/// An on/off switch: empty, `0` or `false` is off; `1` or `true` is on.
pub fn switch(var: &str, raw: &str) -> Result<bool, ConfigError> {
    match raw.trim() {
        "" | "0" | "false" => Ok(false),
        "1" | "true" => Ok(true),
        _ => err(format!("{var} must be 0, 1, true or false")),
    }
}
