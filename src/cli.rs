//! Operator commands that call a running server (operations.md §5): `admin …` and `host-token`.
//!
//! Tokens come from the environment or, on a single-node install, from `<data dir>/secrets.json`;
//! they are sent as bearers and never printed.

use std::path::PathBuf;

use clap::{Args, Subcommand};
use serde_json::{json, Value};

/// Where the server is and how to authenticate.
#[derive(Args, Debug, Clone)]
pub struct Target {
    /// Server origin.
    #[arg(long, env = "ORCA_RELAY_URL", default_value = "http://127.0.0.1:8080")]
    pub url: String,
    /// Single-node data directory holding secrets.json (used when the token variable is unset).
    #[arg(long, env = "ORCA_RELAY_DATA_DIR", default_value = "./data")]
    pub data_dir: PathBuf,
}

#[derive(Subcommand, Debug, Clone)]
pub enum AdminCommand {
    /// POST /v1/admin/runtime-status.
    Status,
    /// POST /v1/admin/drain.
    Drain {
        #[arg(long, default_value = "0")]
        grace_ms: u64,
        #[arg(long)]
        pace_window_ms: Option<u64>,
    },
    /// POST /v1/admin/cell-state.
    CellState {
        #[arg(long)]
        cell_id: String,
        /// general, migration-only or existing-only.
        #[arg(long)]
        state: String,
        /// Set (true) or clear (false) the roll-isolation stamp.
        #[arg(long)]
        roll_isolated: Option<bool>,
    },
    /// POST /v1/admin/cell-fence.
    Fence {
        #[arg(long)]
        cell_id: String,
        #[arg(long)]
        cell_incarnation: String,
    },
    /// POST /v1/admin/evacuate-cell.
    Evacuate {
        #[arg(long)]
        source_cell_id: String,
        #[arg(long)]
        target_cell_id: Option<String>,
        #[arg(long, default_value = "100")]
        limit: u32,
    },
    /// GET /v1/admin/overview.
    Overview,
}

/// The admin token: `ORCA_RELAY_ADMIN_TOKEN`, else the single-node secrets file.
fn admin_token(t: &Target) -> Result<String, String> {
    if let Ok(v) = std::env::var("ORCA_RELAY_ADMIN_TOKEN") {
        if !v.trim().is_empty() {
            return Ok(v);
        }
    }
    crate::config::read_secrets_file(&t.data_dir)
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
    crate::config::read_secrets_file(&t.data_dir)
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
    let resp = req.send().await.map_err(|e| format!("{url}: {e}"))?;
    let status = resp.status();
    let text = resp.text().await.map_err(|e| e.to_string())?;
    let value: Value = serde_json::from_str(&text).unwrap_or(Value::String(text));
    if status.is_success() {
        Ok(value)
    } else {
        Err(format!("{status}: {value}"))
    }
}

/// Runs an admin command; prints the answer; `Err` = non-zero exit.
pub async fn admin(t: &Target, cmd: &AdminCommand) -> Result<(), String> {
    let token = admin_token(t)?;
    let base = t.url.trim_end_matches('/');
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
        body["userId"] = json!(u);
    }
    let bearer = self_hosted_key(t)?;
    let base = t.url.trim_end_matches('/');
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
