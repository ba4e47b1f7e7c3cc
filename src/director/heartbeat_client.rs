//! The cell's heartbeat client (protocol.md §12): every 15 s, single-flight, to the in-process
//! director when the process runs both roles without `ORCA_RELAY_DIRECTOR_URL`, else over HTTP(S)
//! with a cluster token (the shared cluster client: system roots + `ORCA_RELAY_TLS_EXTRA_CA`).

use std::sync::Arc;
use std::time::Duration;

use crate::app::Ctx;
use crate::contract::wire::CellHeartbeat;

use super::{Director, HeartbeatRefusal};

/// Beat interval.
pub const INTERVAL: Duration = Duration::from_secs(15);
/// HTTP timeout of one beat.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Where beats go.
pub enum Target {
    Local(Arc<Director>),
    Remote {
        url: String,
        client: reqwest::Client,
    },
}

impl Target {
    /// In-process when a local director exists and no director URL is configured.
    pub fn choose(ctx: &Ctx, local: Option<Arc<Director>>) -> Option<Target> {
        match (&ctx.config.director_url, local) {
            (None, Some(d)) => Some(Target::Local(d)),
            (Some(url), _) => Some(Target::Remote {
                url: url.clone(),
                client: crate::tls::client::cluster_client(&ctx.config.extra_ca, TIMEOUT).ok()?,
            }),
            (None, None) => None,
        }
    }
}

/// Sends one beat; `Err(reason)` is what the failure log line names.
pub async fn beat_once(ctx: &Ctx, target: &Target, body: &CellHeartbeat) -> Result<(), String> {
    match target {
        Target::Local(d) => match d.heartbeat(body).await {
            Ok(()) => Ok(()),
            Err(HeartbeatRefusal::Refused(code)) => Err(format!("director_heartbeat_409 {code}")),
            Err(HeartbeatRefusal::Unavailable) => Err("director_heartbeat_503".into()),
            Err(_) => Err("director_heartbeat_400".into()),
        },
        Target::Remote { url, client } => {
            let key = ctx
                .config
                .secrets
                .cluster_key
                .as_deref()
                .ok_or("cluster_key_missing")?;
            let token = crate::crypto::jwt::mint_cluster_token(
                key.as_bytes(),
                &body.cell_id,
                crate::clock::now_ms(),
            );
            let resp = client
                .post(format!("{url}/v1/admin/cell-heartbeat"))
                .bearer_auth(token)
                .json(body)
                .send()
                .await
                .map_err(|e| {
                    if e.is_timeout() {
                        "director_heartbeat_timeout".to_string()
                    } else {
                        "director_heartbeat_unreachable".to_string()
                    }
                })?;
            let status = resp.status().as_u16();
            if status == 200 {
                Ok(())
            } else {
                Err(format!("director_heartbeat_{status}"))
            }
        }
    }
}

/// Runs the heartbeat loop until shutdown. The first beat is sent before this returns control
/// (awaiting the returned future's first step): callers that need the local cell live before
/// serving should call [`beat_once`] first, then spawn this.
pub async fn run_heartbeats(
    ctx: Ctx,
    local: Option<Arc<Director>>,
    snapshot: impl Fn() -> CellHeartbeat + Send + Sync + 'static,
) {
    let target = match Target::choose(&ctx, local) {
        Some(t) => t,
        None => return,
    };
    let mut tick = tokio::time::interval(INTERVAL);
    // Single-flight: a beat in flight makes the next tick wait, and missed ticks are skipped.
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    loop {
        tokio::select! {
            _ = ctx.shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let body = snapshot();
        if let Err(reason) = beat_once(&ctx, &target, &body).await {
            log::warn!("[orca-relay] cell heartbeat failed {reason}");
        }
    }
}
