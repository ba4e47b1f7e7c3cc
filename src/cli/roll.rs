//! `orca-relay admin roll`: the operator's rolling restart of one cell (or of every cell in turn),
//! as director.md §6.1 expects it:
//!
//! 1. `cell-state {state:"migration-only", rollIsolated:true}` on the director (the roll stamp):
//!    assigns move hosts away from the live isolated cell (§6.3);
//! 2. a paced drain on the cell itself (`POST <cellUrl>/v1/admin/drain`, protocol.md §11), then
//!    wait until no host control is attached;
//! 3. run the restart command (`sh -c`), or wait for the operator to restart the process;
//! 4. wait until the director hears a new incarnation that is live (fresh and ready);
//! 5. restore `general` (clears the stamp).
//!
//! Every step prints one progress line; a failed or timed-out step exits non-zero with a message
//! naming the state the cell is left in. The admin token is the same for the director and the
//! cell (one operator token per deployment); the cell is reached at the `cellUrl` the director
//! knows unless `--cell-admin-url` says otherwise.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use super::{admin_token, call, Target};

/// Flags of `admin roll`.
#[derive(Args, Debug, Clone)]
pub struct RollArgs {
    /// The cell to roll.
    #[arg(long, required_unless_present = "all", conflicts_with = "all")]
    pub cell: Option<String>,
    /// Roll every cell the director knows, one after another in cellId order; stops at the first
    /// failure.
    #[arg(long)]
    pub all: bool,
    /// Shell command (run with `sh -c`) that restarts the cell's process; `{cell}` is replaced by
    /// the cell id, which is also in ORCA_RELAY_ROLL_CELL. Without it the roll waits for the
    /// operator to restart the process.
    #[arg(long)]
    pub restart: Option<String>,
    /// Seconds each wait may take (hosts leaving, the restart command, the new incarnation).
    #[arg(long, default_value = "300")]
    pub timeout: u64,
    /// Drain grace: hosts still attached after it are closed (protocol.md §11).
    #[arg(long, default_value = "10000")]
    pub grace_ms: u64,
    /// Drain pace window: hosts are told one after another across it.
    #[arg(long, default_value = "5000")]
    pub pace_window_ms: u64,
    /// The cell's own origin for drain and runtime-status [default: its cellUrl at the director].
    #[arg(long, conflicts_with = "all")]
    pub cell_admin_url: Option<String>,
    /// Seconds between status polls.
    #[arg(long, default_value = "0.5")]
    pub poll: f64,
}

/// A failed roll step: the message names the state the cell was left in.
fn fail(cell: &str, left: &str, what: String) -> String {
    format!("roll {cell}: {what}; cell {cell} left {left}")
}

const ISOLATED: &str = "migration-only (roll-isolated)";

struct Api {
    base: String,
    token: String,
}

impl Api {
    async fn post(&self, origin: &str, path: &str, body: Value) -> Result<Value, String> {
        call(
            reqwest::Method::POST,
            format!("{}{path}", origin.trim_end_matches('/')),
            &self.token,
            Some(body),
        )
        .await
    }
    async fn cells(&self, cell: Option<&str>) -> Result<Vec<Value>, String> {
        let mut body = json!({"v": 1});
        if let Some(c) = cell {
            body["cellId"] = json!(c);
        }
        let v = self.post(&self.base, "/v1/admin/cell-status", body).await?;
        Ok(v["cells"].as_array().cloned().unwrap_or_default())
    }
}

/// Runs `admin roll`.
pub async fn roll(t: &Target, a: &RollArgs) -> Result<(), String> {
    let api = Api {
        base: t.base(),
        token: admin_token(t)?,
    };
    let ids: Vec<String> = if a.all {
        let mut ids: Vec<String> = api
            .cells(None)
            .await
            .map_err(|e| format!("roll: cell-status: {e}"))?
            .iter()
            .filter_map(|c| c["cellId"].as_str().map(str::to_owned))
            .collect();
        ids.sort();
        println!("roll: {} cells: {}", ids.len(), ids.join(", "));
        ids
    } else {
        vec![a.cell.clone().unwrap_or_default()]
    };
    for id in &ids {
        roll_one(&api, a, id).await?;
    }
    Ok(())
}

async fn roll_one(api: &Api, a: &RollArgs, id: &str) -> Result<(), String> {
    let started = Instant::now();
    let step = Duration::from_secs(a.timeout);
    let poll = Duration::from_secs_f64(a.poll.clamp(0.05, 60.0));
    let cell = api
        .cells(Some(id))
        .await
        .map_err(|e| format!("roll {id}: cell-status: {e}; nothing changed"))?
        .into_iter()
        .next()
        .ok_or_else(|| format!("roll {id}: unknown cell; nothing changed"))?;
    let prior = cell["admissionState"].as_str().unwrap_or("?").to_owned();
    let old = cell["runtime"]["cellIncarnation"]
        .as_str()
        .map(str::to_owned);
    let origin = a
        .cell_admin_url
        .clone()
        .or_else(|| cell["cellUrl"].as_str().map(str::to_owned))
        .unwrap_or_default();
    println!(
        "roll {id}: state {prior}, live {}, incarnation {}",
        cell["live"],
        old.as_deref().unwrap_or("none")
    );

    // 1. Isolate with the roll stamp.
    let v = api
        .post(
            &api.base,
            "/v1/admin/cell-state",
            json!({"v": 1, "cellId": id, "state": "migration-only", "rollIsolated": true}),
        )
        .await
        .map_err(|e| fail(id, &prior, format!("cell-state migration-only: {e}")))?;
    println!(
        "roll {id}: state migration-only, rollIsolatedAt {}",
        v["cell"]["rollIsolatedAt"]
    );

    // 2. Paced drain, then wait for the hosts to leave.
    match api
        .post(
            &origin,
            "/v1/admin/drain",
            json!({"v": 1, "graceMs": a.grace_ms, "paceWindowMs": a.pace_window_ms}),
        )
        .await
    {
        Ok(_) => {
            println!(
                "roll {id}: drain sent to {origin} (graceMs {}, paceWindowMs {})",
                a.grace_ms, a.pace_window_ms
            );
            let deadline = Instant::now() + step;
            let mut last = None;
            loop {
                let status = api
                    .post(&origin, "/v1/admin/runtime-status", json!({"v": 1}))
                    .await;
                let attached = match &status {
                    Ok(v) => v["runtime"]["controls"].as_u64(),
                    // The process went away on its own: nobody is attached to it any more.
                    Err(_) => Some(0),
                };
                if attached != last {
                    println!(
                        "roll {id}: hosts still attached: {}",
                        attached.map_or("?".into(), |n| n.to_string())
                    );
                    last = attached;
                }
                if attached == Some(0) {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(fail(
                        id,
                        &format!("{ISOLATED}, draining"),
                        format!(
                            "timed out after {}s waiting for hosts to leave ({} still attached)",
                            a.timeout,
                            attached.unwrap_or(0)
                        ),
                    ));
                }
                tokio::time::sleep(poll).await;
            }
        }
        Err(e) => println!("roll {id}: drain not sent ({e}); the process is not answering"),
    }

    // 3. Restart.
    match &a.restart {
        Some(cmd) => {
            let cmd = cmd.replace("{cell}", id);
            println!("roll {id}: running restart command");
            let child = tokio::process::Command::new("sh")
                .arg("-c")
                .arg(&cmd)
                .env("ORCA_RELAY_ROLL_CELL", id)
                .kill_on_drop(true)
                .status();
            let left = format!("{ISOLATED}, drained");
            match tokio::time::timeout(step, child).await {
                Err(_) => {
                    return Err(fail(
                        id,
                        &left,
                        format!("restart command still running after {}s", a.timeout),
                    ))
                }
                Ok(Err(e)) => {
                    return Err(fail(id, &left, format!("restart command did not run: {e}")))
                }
                Ok(Ok(s)) if !s.success() => {
                    return Err(fail(
                        id,
                        &left,
                        format!(
                            "restart command failed ({})",
                            s.code()
                                .map_or("killed by a signal".into(), |c| format!("exit {c}"))
                        ),
                    ))
                }
                Ok(Ok(_)) => println!("roll {id}: restart command done"),
            }
        }
        None => println!(
            "roll {id}: waiting for the operator to restart the process (incarnation {})",
            old.as_deref().unwrap_or("none")
        ),
    }

    // 4. A new incarnation, live (fresh and ready).
    let deadline = Instant::now() + step;
    let mut seen: Option<(String, bool)> = None;
    loop {
        let now = api
            .cells(Some(id))
            .await
            .ok()
            .and_then(|c| c.into_iter().next());
        if let Some(c) = now {
            let inc = c["runtime"]["cellIncarnation"].as_str().map(str::to_owned);
            let live = c["live"] == true;
            if let Some(inc) = inc.filter(|i| Some(i) != old.as_ref()) {
                if seen.as_ref() != Some(&(inc.clone(), live)) {
                    println!(
                        "roll {id}: incarnation seen {inc} ({})",
                        if live {
                            "live".to_owned()
                        } else {
                            format!("not live: {}", c["cause"].as_str().unwrap_or("?"))
                        }
                    );
                    seen = Some((inc, live));
                }
                if live {
                    break;
                }
            }
        }
        if Instant::now() >= deadline {
            return Err(fail(
                id,
                ISOLATED,
                format!(
                    "timed out after {}s waiting for a new live incarnation{}",
                    a.timeout,
                    seen.map_or(String::new(), |(i, _)| format!(" ({i} heard, not ready)"))
                ),
            ));
        }
        tokio::time::sleep(poll).await;
    }

    // 5. Back to general.
    api.post(
        &api.base,
        "/v1/admin/cell-state",
        json!({"v": 1, "cellId": id, "state": "general"}),
    )
    .await
    .map_err(|e| fail(id, ISOLATED, format!("cell-state general: {e}")))?;
    println!(
        "roll {id}: state general; rolled in {:.1}s",
        started.elapsed().as_secs_f64()
    );
    Ok(())
}
