//! Operator commands that call a running server (README.md): `admin …` and `host-token`.
//!
//! Tokens come from the environment or, on a single-node install, from `<data dir>/secrets.json`;
//! they are sent as bearers and never printed.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

pub mod backup;
pub mod config_cmd;
pub mod fields;
pub mod health;
pub mod net;
pub mod roll;

/// The server origin when neither `--url` nor `ORCA_RELAY_URL` names one.
pub const DEFAULT_URL: &str = "http://127.0.0.1:8080";

/// Where the server is and how to authenticate. Both flags are global: they may come before or
/// after the subcommand (`orca-relay admin --url U status` = `orca-relay admin status --url U`);
/// given before `admin`/`host-token` they are the top-level flags, merged in by [`Target::or`].
#[derive(Args, Debug, Clone, Default)]
pub struct Target {
    /// Server origin [env: ORCA_RELAY_URL] [default: http://127.0.0.1:8080].
    #[arg(long = "url", id = "target_url", value_name = "URL", global = true)]
    pub url: Option<String>,
    /// Single-node data directory holding secrets.json, read when ORCA_RELAY_ADMIN_TOKEN (or
    /// ORCA_RELAY_SELF_HOSTED_KEY) is unset [env: ORCA_RELAY_DATA_DIR] [default: ./data].
    #[arg(
        long = "data-dir",
        id = "target_data_dir",
        value_name = "DATA_DIR",
        global = true
    )]
    pub data_dir: Option<PathBuf>,
}

impl Target {
    /// Fills what this command line left unset from the top-level flags (which carry the
    /// environment variables, so a flag anywhere beats the variable).
    pub fn or(mut self, url: Option<String>, data_dir: Option<PathBuf>) -> Target {
        self.url = self.url.or(url);
        self.data_dir = self.data_dir.or(data_dir);
        self
    }
    fn base(&self) -> String {
        self.url
            .as_deref()
            .unwrap_or(DEFAULT_URL)
            .trim_end_matches('/')
            .to_owned()
    }
    fn dir(&self) -> PathBuf {
        self.data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from("./data"))
    }
}

/// The `--help` footer of commands that call a server: the variables read outside clap.
pub const ADMIN_ENV_HELP: &str = "Environment:\n  ORCA_RELAY_ADMIN_TOKEN  admin bearer (never printed) [default: the admin token of <data dir>/secrets.json]\n  ORCA_RELAY_URL          server origin (--url) [default: http://127.0.0.1:8080]\n  ORCA_RELAY_DATA_DIR     single-node data directory (--data-dir) [default: ./data]";
pub const HOST_TOKEN_ENV_HELP: &str = "Environment:\n  ORCA_RELAY_SELF_HOSTED_KEY  bearer of POST /v1/host-token (never printed) [default: the key of <data dir>/secrets.json]\n  ORCA_RELAY_URL              server origin (--url) [default: http://127.0.0.1:8080]\n  ORCA_RELAY_DATA_DIR         single-node data directory (--data-dir) [default: ./data]";

#[derive(Subcommand, Debug, Clone)]
pub enum AdminCommand {
    /// POST /v1/admin/runtime-status.
    #[command(after_help = ADMIN_ENV_HELP)]
    Status,
    /// POST /v1/admin/drain.
    #[command(after_help = ADMIN_ENV_HELP)]
    Drain {
        /// Grace before still-attached hosts are closed, 0..3600000 ms.
        #[arg(long, default_value = "0")]
        grace_ms: u64,
        /// Window across which hosts are told, 0..300000 ms [default: absent = 0, all at once].
        #[arg(long)]
        pace_window_ms: Option<u64>,
    },
    /// POST /v1/admin/cell-state.
    #[command(after_help = ADMIN_ENV_HELP)]
    CellState {
        /// The cell to change.
        #[arg(long)]
        cell_id: String,
        /// general, migration-only or existing-only.
        #[arg(long)]
        state: String,
        /// Set (true) or clear (false) the roll-isolation stamp [default: absent, stamp rule].
        #[arg(long)]
        roll_isolated: Option<bool>,
    },
    /// POST /v1/admin/cell-fence.
    #[command(after_help = ADMIN_ENV_HELP)]
    Fence {
        /// The cell to fence.
        #[arg(long)]
        cell_id: String,
        /// The incarnation the fence attests (the stale runtime's).
        #[arg(long)]
        cell_incarnation: String,
    },
    /// POST /v1/admin/evacuate-cell.
    #[command(after_help = ADMIN_ENV_HELP)]
    Evacuate {
        /// The cell to empty.
        #[arg(long)]
        source_cell_id: String,
        /// Where hosts go [default: placement chooses].
        #[arg(long)]
        target_cell_id: Option<String>,
        /// Migrations to start in this call, 1..100.
        #[arg(long, default_value = "100")]
        limit: u32,
    },
    /// GET /v1/admin/overview.
    #[command(after_help = ADMIN_ENV_HELP)]
    Overview,
    /// Rolling restart of a cell (docs/deploy/cluster.md): isolate with the roll stamp, paced drain,
    /// restart, wait for a new live incarnation, restore general.
    #[command(after_help = ADMIN_ENV_HELP)]
    Roll(roll::RollArgs),
}

/// The admin token: `ORCA_RELAY_ADMIN_TOKEN`, else the single-node secrets file.
fn admin_token(t: &Target) -> Result<String, String> {
    if let Ok(v) = std::env::var("ORCA_RELAY_ADMIN_TOKEN") {
        if !v.trim().is_empty() {
            return Ok(v);
        }
    }
    crate::config::read_secrets_file(&t.dir())
        .map(|(admin, _)| admin)
        .ok_or_else(|| {
            "ORCA_RELAY_ADMIN_TOKEN is required (no single-node secrets file found)".into()
        })
}

fn self_hosted_key(t: &Target) -> Result<String, String> {
    if let Ok(v) = std::env::var("ORCA_RELAY_SELF_HOSTED_KEY") {
        if !v.trim().is_empty() {
            return Ok(v);
        }
    }
    crate::config::read_secrets_file(&t.dir())
        .map(|(_, key)| key)
        .ok_or_else(|| {
            "ORCA_RELAY_SELF_HOSTED_KEY is required (no single-node secrets file found)".into()
        })
}

async fn call(
    method: reqwest::Method,
    url: String,
    bearer: &str,
    body: Option<Value>,
) -> Result<Value, String> {
    call_detailed(method, url, bearer, body)
        .await
        .map_err(|e| e.message)
}

/// A failed admin call, with the one fact `admin roll` needs: whether the connection was refused
/// (nothing listens: the process is not running), as opposed to any answer, timeout or other
/// failure (the process may well be running).
#[derive(Debug, Clone)]
struct CallError {
    refused: bool,
    message: String,
}

impl From<String> for CallError {
    fn from(message: String) -> Self {
        CallError {
            refused: false,
            message,
        }
    }
}

/// True when an `io::Error` of kind `ConnectionRefused` is somewhere in the error's source chain.
fn connection_refused(e: &(dyn std::error::Error + 'static)) -> bool {
    let mut cur = Some(e);
    while let Some(err) = cur {
        if let Some(io) = err.downcast_ref::<std::io::Error>() {
            if io.kind() == std::io::ErrorKind::ConnectionRefused {
                return true;
            }
        }
        cur = err.source();
    }
    false
}

async fn call_detailed(
    method: reqwest::Method,
    url: String,
    bearer: &str,
    body: Option<Value>,
) -> Result<Value, CallError> {
    // An https server with a private CA: the same extra CA file the cluster uses.
    let extra = tokio::task::spawn_blocking(|| {
        crate::tls::parse_extra_ca(&crate::tls::TlsArgs {
            tls_extra_ca: std::env::var("ORCA_RELAY_TLS_EXTRA_CA").ok(),
            ..Default::default()
        })
    })
    .await
    .map_err(|e| e.to_string())?
    .map_err(|e| e.to_string())?;
    let client = crate::tls::client::cluster_client(&extra, std::time::Duration::from_secs(15))?;
    let mut req = client.request(method, &url).bearer_auth(bearer);
    if let Some(b) = body {
        req = req.json(&b);
    }
    let resp = req.send().await.map_err(|e| CallError {
        refused: connection_refused(&e),
        message: net::unreachable(&url, &e),
    })?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| net::unreachable(&url, &e))?;
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if status.is_success() {
        Ok(value)
    } else {
        Err(net::refusal(&url, status, &value).into())
    }
}

/// Runs an admin command; prints the answer; `Err` = non-zero exit.
pub async fn admin(t: &Target, cmd: &AdminCommand) -> Result<(), String> {
    fields::check_admin(cmd)?;
    let token = admin_token(t)?;
    let base = t.base();
    let base = base.as_str();
    let post = |path: &str, body: Value| {
        call(
            reqwest::Method::POST,
            format!("{base}{path}"),
            &token,
            Some(body),
        )
    };
    let answer = match cmd {
        AdminCommand::Status => post("/v1/admin/runtime-status", json!({"v": 1})).await?,
        AdminCommand::Drain {
            grace_ms,
            pace_window_ms,
        } => {
            let mut body = json!({"v": 1, "graceMs": grace_ms});
            if let Some(p) = pace_window_ms {
                body["paceWindowMs"] = json!(p);
            }
            post("/v1/admin/drain", body).await?
        }
        AdminCommand::CellState {
            cell_id,
            state,
            roll_isolated,
        } => {
            let mut body = json!({"v": 1, "cellId": cell_id, "state": state});
            if let Some(r) = roll_isolated {
                body["rollIsolated"] = json!(r);
            }
            post("/v1/admin/cell-state", body).await?
        }
        AdminCommand::Fence {
            cell_id,
            cell_incarnation,
        } => {
            post(
                "/v1/admin/cell-fence",
                json!({"v": 1, "cellId": cell_id, "cellIncarnation": cell_incarnation}),
            )
            .await?
        }
        AdminCommand::Evacuate {
            source_cell_id,
            target_cell_id,
            limit,
        } => {
            let mut body = json!({"v": 1, "sourceCellId": source_cell_id, "limit": limit});
            if let Some(t) = target_cell_id {
                body["targetCellId"] = json!(t);
            }
            post("/v1/admin/evacuate-cell", body).await?
        }
        AdminCommand::Roll(args) => return roll::roll(t, args).await,
        AdminCommand::Overview => {
            call(
                reqwest::Method::GET,
                format!("{base}/v1/admin/overview"),
                &token,
                None,
            )
            .await?
        }
    };
    println!(
        "{}",
        serde_json::to_string_pretty(&answer).unwrap_or_default()
    );
    Ok(())
}

/// `orca-relay host-token --key <base64 public key>`: mints a self-hosted host token.
pub async fn host_token(t: &Target, key_b64: &str, user_id: Option<&str>) -> Result<(), String> {
    let key = crate::crypto::b64::decode_key32(key_b64)
        .ok_or("--key must be a canonical base64 X25519 public key (44 characters)")?;
    let mut body = json!({
        "relayHostId": crate::crypto::ident::relay_host_id(&key),
        "hostPublicKeyB64": key_b64,
    });
    if let Some(u) = user_id {
        if !crate::contract::validate::is_opaque_id(u) {
            return Err(format!("--user-id must be 1..128 characters, got {u:?}"));
        }
        body["userId"] = json!(u);
    }
    let bearer = self_hosted_key(t)?;
    let base = t.base();
    let answer = call(
        reqwest::Method::POST,
        format!("{base}/v1/host-token"),
        &bearer,
        Some(body),
    )
    .await?;
    println!("{}", serde_json::to_string(&answer).unwrap_or_default());
    Ok(())
}
