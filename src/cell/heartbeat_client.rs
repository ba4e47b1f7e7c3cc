//! The cell's HTTP heartbeat client (docs/reference/http.md): `POST <director>/v1/admin/cell-heartbeat`
//! with a cluster token, used when `ORCA_RELAY_DIRECTOR_URL` is set.

use std::time::Duration;

use crate::config::Config;
use crate::contract::heartbeat::{BeatFuture, HeartbeatSink};
use crate::contract::wire::{CellHeartbeat, CellRehomeStatus};

/// HTTP timeout of one beat.
pub const TIMEOUT: Duration = Duration::from_secs(10);

/// Beats over HTTP to a remote director.
pub struct HttpHeartbeat {
    url: String,
    cluster_key: Option<String>,
    client: reqwest::Client,
}

impl HttpHeartbeat {
    /// The client of `ORCA_RELAY_DIRECTOR_URL`, if configured.
    pub fn from_config(config: &Config) -> Option<HttpHeartbeat> {
        let url = config.director_url.clone()?;
        Some(HttpHeartbeat {
            url,
            cluster_key: config.secrets.cluster_key.clone(),
            // The shared cluster client: system roots + ORCA_RELAY_TLS_EXTRA_CA for https.
            client: crate::tls::client::cluster_client(&config.extra_ca, TIMEOUT).ok()?,
        })
    }

    async fn send(&self, body: &CellHeartbeat) -> Result<(), String> {
        let key = self.cluster_key.as_deref().ok_or("cluster_key_missing")?;
        let token = crate::crypto::jwt::mint_cluster_token(
            key.as_bytes(),
            &body.cell_id,
            crate::clock::now_ms(),
        );
        let resp = self
            .client
            .post(format!("{}/v1/admin/cell-heartbeat", self.url))
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

impl HeartbeatSink for HttpHeartbeat {
    fn beat<'a>(&'a self, body: &'a CellHeartbeat) -> BeatFuture<'a> {
        Box::pin(self.send(body))
    }

    fn rehome_status<'a>(&'a self, body: &'a CellRehomeStatus) -> BeatFuture<'a> {
        Box::pin(async move {
            let key = self.cluster_key.as_deref().ok_or("cluster_key_missing")?;
            let token = crate::crypto::jwt::mint_cluster_token(
                key.as_bytes(),
                &body.cell_id,
                crate::clock::now_ms(),
            );
            let resp = self
                .client
                .post(format!("{}/v1/admin/cell-rehome-status", self.url))
                .bearer_auth(token)
                .json(body)
                .send()
                .await
                .map_err(|_| "director_rehome_status_unreachable".to_string())?;
            match resp.status().as_u16() {
                // A director without the route is tolerated (docs/reference/http.md).
                200 | 404 => Ok(()),
                s => Err(format!("director_rehome_status_{s}")),
            }
        })
    }
}
