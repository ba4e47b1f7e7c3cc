//! Secret values: their rules, and the generated secrets file of the single-node shape.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::{err, ConfigError};

pub(super) fn check_signing_key(var: &str, v: &str) -> Result<(), ConfigError> {
    if v.len() < 32 {
        return err(format!("{var} must be at least 32 bytes"));
    }
    Ok(())
}

pub(super) fn check_self_hosted_key(v: &str) -> Result<(), ConfigError> {
    let ok = (32..=256).contains(&v.len())
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-');
    if !ok {
        return err("ORCA_RELAY_SELF_HOSTED_KEY must be 32..256 characters of [A-Za-z0-9_-]");
    }
    Ok(())
}

pub(super) fn check_admin_token(v: &str) -> Result<(), ConfigError> {
    let ok = (32..=256).contains(&v.len()) && v.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if !ok {
        return err(
            "ORCA_RELAY_ADMIN_TOKEN must be 32..256 visible ASCII characters without spaces",
        );
    }
    Ok(())
}

/// `ORCA_RELAY_METRICS_TOKEN`: the read-only bearer of `/metrics`, shaped like the admin token.
pub(super) fn check_metrics_token(v: &str) -> Result<(), ConfigError> {
    let ok = (32..=256).contains(&v.len()) && v.bytes().all(|b| (0x21..=0x7e).contains(&b));
    if !ok {
        return err(
            "ORCA_RELAY_METRICS_TOKEN must be 32..256 visible ASCII characters without spaces",
        );
    }
    Ok(())
}

/// The generated-secrets file of the single-node shape (docs/configuration.md).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(super) struct SecretsFile {
    pub(super) v: u32,
    pub(super) assignment_signing_key: String,
    pub(super) self_hosted_key: String,
    pub(super) admin_token: String,
    pub(super) cluster_key: String,
}

/// Random URL-safe text of `bytes` random bytes (43 chars for 32 bytes).
fn random_secret(bytes: usize) -> String {
    use base64::Engine;
    let mut buf = vec![0u8; bytes];
    rand::RngCore::fill_bytes(&mut rand::rngs::OsRng, &mut buf);
    base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(buf)
}

/// Loads `<data dir>/secrets.json` when it exists; never creates anything.
pub(super) fn load_secrets(dir: &Path) -> Result<Option<(SecretsFile, PathBuf)>, ConfigError> {
    let path = dir.join("secrets.json");
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(&path).or_else(|e| {
        err(format!(
            "ORCA_RELAY_DATA_DIR: cannot read {}: {e}",
            path.display()
        ))
    })?;
    let file: SecretsFile = serde_json::from_str(&text).or_else(|_| {
        err(format!(
            "ORCA_RELAY_DATA_DIR: {} is not a valid secrets file",
            path.display()
        ))
    })?;
    if file.v != 1 {
        return err(format!(
            "ORCA_RELAY_DATA_DIR: {} has an unknown version",
            path.display()
        ));
    }
    Ok(Some((file, path)))
}

/// Loads `<data dir>/secrets.json`, or creates it (mode 0600) with fresh values.
pub(super) fn load_or_create_secrets(dir: &Path) -> Result<(SecretsFile, PathBuf), ConfigError> {
    if let Some(found) = load_secrets(dir)? {
        return Ok(found);
    }
    let path = dir.join("secrets.json");
    std::fs::create_dir_all(dir).or_else(|e| {
        err(format!(
            "ORCA_RELAY_DATA_DIR: cannot create {}: {e}",
            dir.display()
        ))
    })?;
    let file = SecretsFile {
        v: 1,
        assignment_signing_key: random_secret(48),
        self_hosted_key: random_secret(32),
        admin_token: random_secret(32),
        cluster_key: random_secret(48),
    };
    let text = serde_json::to_string(&file).expect("serialize secrets");
    write_private(&path, text.as_bytes()).or_else(|e| {
        err(format!(
            "ORCA_RELAY_DATA_DIR: cannot write {}: {e}",
            path.display()
        ))
    })?;
    Ok((file, path))
}

#[cfg(unix)]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(not(unix))]
fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    std::fs::write(path, bytes)
}

/// Reads the single-node secrets file without creating it (for the admin CLI).
pub fn read_secrets_file(data_dir: &Path) -> Option<(String, String)> {
    let text = std::fs::read_to_string(data_dir.join("secrets.json")).ok()?;
    let f: SecretsFile = serde_json::from_str(&text).ok()?;
    Some((f.admin_token, f.self_hosted_key))
}
