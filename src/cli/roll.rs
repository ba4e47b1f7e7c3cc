//! `orca-relay admin roll`: the operator's rolling restart of one cell (or of every cell in turn),
//! as docs/deploy/cluster.md expects it:
//!
//! 1. `cell-state {state:"migration-only", rollIsolated:true}` on the director (the roll stamp):
//!    assigns move hosts away from the live isolated cell;
//! 2. a paced drain on the cell itself (`POST <cellUrl>/v1/admin/drain`, docs/operations.md), then
//!    wait until no host control is attached;
//! 3. run the restart command (`sh -c`), or wait for the operator to restart the process;
//! 4. wait until the director hears a new incarnation that is live (fresh and ready);
//! 5. restore `general` (clears the stamp).
//!
//! Every step prints one progress line; a failed or timed-out step exits non-zero with a message
//! naming the state the cell is left in. Only two facts may mean "the process is gone" and let
//! the roll restart a cell it could not drain: the cell's origin refuses the connection, or the
//! director already hears a different incarnation. Any other answer to the drain (a 401 from a
//! different token, a 404 from a URL that is not a cell, a 503, a timeout) stops the roll, and a
//! failed `runtime-status` poll is an unknown count, never zero ([`after_drain`], [`after_poll`]). The admin token is the same for the director and the
//! cell (one operator token per deployment); the cell is reached at the `cellUrl` the director
//! knows unless `--cell-admin-url` says otherwise.

use std::time::{Duration, Instant};

use clap::Args;
use serde_json::{json, Value};

use super::{admin_token, call, call_detailed, CallError, Target};

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
    /// Drain grace: hosts still attached after it are closed (docs/operations.md).
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

/// One answer of the cell, as plain data for the roll's decisions.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CellAnswer {
    /// A 2xx answer; for `runtime-status`, the `runtime.controls` count if present.
    Ok { controls: Option<u64> },
    /// The connection was refused: nothing listens at the cell's origin.
    Refused,
    /// Anything else: an error status, a timeout, a TLS or DNS failure.
    Failed(String),
}

impl CellAnswer {
    fn from_call(r: &Result<Value, CallError>) -> Self {
        match r {
            Ok(v) => CellAnswer::Ok {
                controls: v["runtime"]["controls"].as_u64(),
            },
            Err(e) if e.refused => CellAnswer::Refused,
            Err(e) => CellAnswer::Failed(e.message.clone()),
        }
    }
}

/// What the director says about the cell's incarnation while the cell's answer is in doubt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Heard {
    /// The incarnation the roll started with (or none, as then).
    Same,
    /// A different incarnation: the process was restarted under the roll's feet.
    Changed(String),
    /// The director could not be asked.
    Unknown(String),
}

impl Heard {
    fn of(old: Option<&str>, now: Result<Option<String>, String>) -> Self {
        match now {
            Ok(Some(inc)) if Some(inc.as_str()) != old => Heard::Changed(inc),
            Ok(_) => Heard::Same,
            Err(e) => Heard::Unknown(e),
        }
    }
}

/// Why the roll may go on to the restart without a confirmed drain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Gone {
    /// The cell's origin refused the connection.
    Refused,
    /// The director hears another incarnation.
    NewIncarnation(String),
}

impl std::fmt::Display for Gone {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Gone::Refused => {
                f.write_str("the cell refuses connections: the process is not running")
            }
            Gone::NewIncarnation(i) => {
                write!(f, "the director already hears a new incarnation {i}")
            }
        }
    }
}

/// The step after the drain request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DrainStep {
    /// The cell accepted the drain: wait for its hosts to leave.
    WaitForHosts,
    /// The process is gone: nothing to drain, go on to the restart.
    Gone(Gone),
    /// The cell may be running and serving hosts, undrained: stop the roll.
    Stop(String),
}

/// Decides what an answer to the drain request means. `heard` is only consulted when the answer is
/// neither a success nor a refusal.
pub fn after_drain(drain: &CellAnswer, heard: &Heard) -> DrainStep {
    match drain {
        CellAnswer::Ok { .. } => DrainStep::WaitForHosts,
        CellAnswer::Refused => DrainStep::Gone(Gone::Refused),
        CellAnswer::Failed(e) => match heard {
            Heard::Changed(i) => DrainStep::Gone(Gone::NewIncarnation(i.clone())),
            Heard::Same => DrainStep::Stop(format!(
                "drain not accepted ({e}) and the director still hears the same incarnation"
            )),
            Heard::Unknown(d) => DrainStep::Stop(format!(
                "drain not accepted ({e}) and the director could not be asked ({d})"
            )),
        },
    }
}

/// The step after one `runtime-status` poll while waiting for hosts to leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PollStep {
    /// This many host controls are still attached (0: drained).
    Attached(u64),
    /// The process is gone, so nobody is attached any more.
    Gone(Gone),
    /// The count is unknown this time (never taken as zero): poll again until the deadline.
    Unknown(String),
}

/// Decides what one `runtime-status` answer means. `heard` is only consulted when the answer is
/// neither a success nor a refusal.
pub fn after_poll(status: &CellAnswer, heard: &Heard) -> PollStep {
    match status {
        CellAnswer::Ok { controls: Some(n) } => PollStep::Attached(*n),
        CellAnswer::Ok { controls: None } => {
            PollStep::Unknown("runtime-status without a controls count".into())
        }
        CellAnswer::Refused => PollStep::Gone(Gone::Refused),
        CellAnswer::Failed(e) => match heard {
            Heard::Changed(i) => PollStep::Gone(Gone::NewIncarnation(i.clone())),
            Heard::Same | Heard::Unknown(_) => PollStep::Unknown(e.clone()),
        },
    }
}

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
    /// A call to the cell itself, with a refused connection told apart.
    async fn cell(&self, origin: &str, path: &str, body: Value) -> Result<Value, CallError> {
        call_detailed(
            reqwest::Method::POST,
            format!("{}{path}", origin.trim_end_matches('/')),
            &self.token,
            Some(body),
        )
        .await
    }
    /// The incarnation the director hears for the cell now.
    async fn heard(&self, id: &str, old: Option<&str>) -> Heard {
        let now = self.cells(Some(id)).await.map(|c| {
            c.into_iter()
                .next()
                .and_then(|c| c["runtime"]["cellIncarnation"].as_str().map(str::to_owned))
        });
        Heard::of(old, now)
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

/// Rolls one cell through the five steps above; the first failed step ends the roll.
async fn roll_one(api: &Api, a: &RollArgs, id: &str) -> Result<(), String> {
    let started = Instant::now();
    let (roll, prior) = Rolling::start(api, a, id).await?;
    roll.isolate(&prior).await?;
    roll.drain().await?;
    roll.restart().await?;
    roll.wait_new_incarnation().await?;
    roll.reopen(started).await
}

/// One cell's roll: what the steps share (the cell, its old incarnation, its admin origin, the
/// step timeout and the poll interval).
struct Rolling<'a> {
    api: &'a Api,
    a: &'a RollArgs,
    id: &'a str,
    old: Option<String>,
    origin: String,
    step: Duration,
    poll: Duration,
}

impl<'a> Rolling<'a> {
    /// Reads the cell from the director and prints where it starts; returns the roll and the
    /// cell's admission state before it.
    async fn start(api: &'a Api, a: &'a RollArgs, id: &'a str) -> Result<(Self, String), String> {
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
        let roll = Rolling {
            api,
            a,
            id,
            old,
            origin,
            step: Duration::from_secs(a.timeout),
            poll: Duration::from_secs_f64(a.poll.clamp(0.05, 60.0)),
        };
        Ok((roll, prior))
    }

    /// 1. Isolate with the roll stamp.
    async fn isolate(&self, prior: &str) -> Result<(), String> {
        let (api, id) = (self.api, self.id);
        let v = api
            .post(
                &api.base,
                "/v1/admin/cell-state",
                json!({"v": 1, "cellId": id, "state": "migration-only", "rollIsolated": true}),
            )
            .await
            .map_err(|e| fail(id, prior, format!("cell-state migration-only: {e}")))?;
        println!(
            "roll {id}: state migration-only, rollIsolatedAt {}",
            v["cell"]["rollIsolatedAt"]
        );
        Ok(())
    }

    /// 2. Paced drain, then wait for the hosts to leave ([`after_drain`] decides).
    async fn drain(&self) -> Result<(), String> {
        let (a, id, origin) = (self.a, self.id, &self.origin);
        let drain = CellAnswer::from_call(
            &self
                .api
                .cell(
                    origin,
                    "/v1/admin/drain",
                    json!({"v": 1, "graceMs": a.grace_ms, "paceWindowMs": a.pace_window_ms}),
                )
                .await,
        );
        let heard = match drain {
            CellAnswer::Failed(_) => self.api.heard(id, self.old.as_deref()).await,
            _ => Heard::Same,
        };
        match after_drain(&drain, &heard) {
            DrainStep::Stop(what) => Err(fail(
                id,
                &format!("{ISOLATED}, not drained, its process possibly still serving hosts"),
                format!("{what} at {origin}; not restarting a cell that was not drained"),
            )),
            DrainStep::Gone(why) => {
                println!("roll {id}: drain not sent: {why}");
                Ok(())
            }
            DrainStep::WaitForHosts => {
                println!(
                    "roll {id}: drain sent to {origin} (graceMs {}, paceWindowMs {})",
                    a.grace_ms, a.pace_window_ms
                );
                self.wait_for_hosts().await
            }
        }
    }

    /// Polls the cell's runtime-status until no host is attached or the process is gone
    /// ([`after_poll`] decides); prints each change of the count.
    async fn wait_for_hosts(&self) -> Result<(), String> {
        let id = self.id;
        let deadline = Instant::now() + self.step;
        let mut last: Option<PollStep> = None;
        loop {
            let status = CellAnswer::from_call(
                &self
                    .api
                    .cell(&self.origin, "/v1/admin/runtime-status", json!({"v": 1}))
                    .await,
            );
            let heard = match status {
                CellAnswer::Failed(_) => self.api.heard(id, self.old.as_deref()).await,
                _ => Heard::Same,
            };
            let now = after_poll(&status, &heard);
            if last.as_ref() != Some(&now) {
                match &now {
                    PollStep::Attached(n) => println!("roll {id}: hosts still attached: {n}"),
                    PollStep::Gone(why) => println!("roll {id}: {why}"),
                    PollStep::Unknown(e) => {
                        println!("roll {id}: hosts still attached: unknown ({e})")
                    }
                }
            }
            let count = match &now {
                PollStep::Attached(0) | PollStep::Gone(_) => return Ok(()),
                PollStep::Attached(n) => format!("{n} still attached"),
                PollStep::Unknown(e) => format!("attached count unknown: {e}"),
            };
            if Instant::now() >= deadline {
                return Err(fail(
                    id,
                    &format!("{ISOLATED}, draining"),
                    format!(
                        "timed out after {}s waiting for hosts to leave ({count})",
                        self.a.timeout
                    ),
                ));
            }
            last = Some(now);
            tokio::time::sleep(self.poll).await;
        }
    }

    /// 3. Restart: the restart command within the step timeout, or the operator.
    async fn restart(&self) -> Result<(), String> {
        let id = self.id;
        let Some(cmd) = &self.a.restart else {
            println!(
                "roll {id}: waiting for the operator to restart the process (incarnation {})",
                self.old.as_deref().unwrap_or("none")
            );
            return Ok(());
        };
        let cmd = cmd.replace("{cell}", id);
        println!("roll {id}: running restart command");
        let child = tokio::process::Command::new("sh")
            .arg("-c")
            .arg(&cmd)
            .env("ORCA_RELAY_ROLL_CELL", id)
            .kill_on_drop(true)
            .status();
        let left = format!("{ISOLATED}, drained");
        match tokio::time::timeout(self.step, child).await {
            Err(_) => Err(fail(
                id,
                &left,
                format!("restart command still running after {}s", self.a.timeout),
            )),
            Ok(Err(e)) => Err(fail(id, &left, format!("restart command did not run: {e}"))),
            Ok(Ok(s)) if !s.success() => Err(fail(
                id,
                &left,
                format!("restart command failed ({})", exit_description(s.code())),
            )),
            Ok(Ok(_)) => {
                println!("roll {id}: restart command done");
                Ok(())
            }
        }
    }

    /// 4. A new incarnation, live (fresh and ready); prints each new (incarnation, live) pair.
    async fn wait_new_incarnation(&self) -> Result<(), String> {
        let id = self.id;
        let deadline = Instant::now() + self.step;
        let mut seen: Option<(String, bool)> = None;
        loop {
            let now = self
                .api
                .cells(Some(id))
                .await
                .ok()
                .and_then(|c| c.into_iter().next());
            if let Some(c) = now {
                let inc = c["runtime"]["cellIncarnation"].as_str().map(str::to_owned);
                let live = c["live"] == true;
                if let Some(inc) = inc.filter(|i| Some(i) != self.old.as_ref()) {
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
                        return Ok(());
                    }
                }
            }
            if Instant::now() >= deadline {
                return Err(fail(
                    id,
                    ISOLATED,
                    format!(
                        "timed out after {}s waiting for a new live incarnation{}",
                        self.a.timeout,
                        seen.map_or(String::new(), |(i, _)| format!(" ({i} heard, not ready)"))
                    ),
                ));
            }
            tokio::time::sleep(self.poll).await;
        }
    }

    /// 5. Back to general (clears the stamp).
    async fn reopen(&self, started: Instant) -> Result<(), String> {
        let (api, id) = (self.api, self.id);
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
}

/// How a failed restart command ended, for the failure message.
fn exit_description(code: Option<i32>) -> String {
    code.map_or("killed by a signal".into(), |c| format!("exit {c}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_restart_names_its_exit() {
        assert_eq!(exit_description(Some(3)), "exit 3");
        assert_eq!(exit_description(None), "killed by a signal");
    }

    fn failed(e: &str) -> CellAnswer {
        CellAnswer::Failed(e.into())
    }

    #[test]
    fn an_accepted_drain_waits_for_hosts() {
        let ok = CellAnswer::Ok { controls: None };
        assert_eq!(after_drain(&ok, &Heard::Same), DrainStep::WaitForHosts);
    }

    #[test]
    fn a_refused_drain_means_the_process_is_gone() {
        assert_eq!(
            after_drain(&CellAnswer::Refused, &Heard::Same),
            DrainStep::Gone(Gone::Refused)
        );
    }

    #[test]
    fn a_drain_error_with_a_new_incarnation_means_gone() {
        assert_eq!(
            after_drain(&failed("503"), &Heard::Changed("i2".into())),
            DrainStep::Gone(Gone::NewIncarnation("i2".into()))
        );
    }

    #[test]
    fn every_other_drain_error_stops_the_roll() {
        for e in [
            "401 Unauthorized: {\"error\":\"invalid_token\"}",
            "404 Not Found",
            "503 Service Unavailable",
            "http://127.0.0.1:1/v1/admin/drain: operation timed out",
        ] {
            for heard in [Heard::Same, Heard::Unknown("director down".into())] {
                match after_drain(&failed(e), &heard) {
                    DrainStep::Stop(m) => assert!(m.contains(e), "{m}"),
                    other => panic!("{e} / {heard:?}: {other:?}"),
                }
            }
        }
    }

    #[test]
    fn a_poll_counts_the_attached_controls() {
        let ok = |n| CellAnswer::Ok { controls: Some(n) };
        assert_eq!(after_poll(&ok(3), &Heard::Same), PollStep::Attached(3));
        assert_eq!(after_poll(&ok(0), &Heard::Same), PollStep::Attached(0));
    }

    #[test]
    fn a_failed_poll_is_never_zero_attached() {
        for e in ["503 Service Unavailable", "operation timed out", "401"] {
            for heard in [Heard::Same, Heard::Unknown("director down".into())] {
                assert_eq!(
                    after_poll(&failed(e), &heard),
                    PollStep::Unknown(e.into()),
                    "{e} / {heard:?}"
                );
            }
        }
        assert!(matches!(
            after_poll(&CellAnswer::Ok { controls: None }, &Heard::Same),
            PollStep::Unknown(_)
        ));
    }

    #[test]
    fn a_poll_refused_or_under_a_new_incarnation_means_gone() {
        assert_eq!(
            after_poll(&CellAnswer::Refused, &Heard::Same),
            PollStep::Gone(Gone::Refused)
        );
        assert_eq!(
            after_poll(&failed("503"), &Heard::Changed("i2".into())),
            PollStep::Gone(Gone::NewIncarnation("i2".into()))
        );
    }

    #[test]
    fn heard_compares_with_the_incarnation_the_roll_started_with() {
        assert_eq!(Heard::of(Some("i1"), Ok(Some("i1".into()))), Heard::Same);
        assert_eq!(Heard::of(Some("i1"), Ok(None)), Heard::Same);
        assert_eq!(
            Heard::of(Some("i1"), Ok(Some("i2".into()))),
            Heard::Changed("i2".into())
        );
        assert_eq!(
            Heard::of(None, Ok(Some("i1".into()))),
            Heard::Changed("i1".into())
        );
        assert!(matches!(
            Heard::of(Some("i1"), Err("x".into())),
            Heard::Unknown(_)
        ));
    }

    #[test]
    fn a_refused_connection_is_found_in_the_source_chain() {
        use std::io;
        #[derive(Debug)]
        struct Wrap(io::Error);
        impl std::fmt::Display for Wrap {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str("connect error")
            }
        }
        impl std::error::Error for Wrap {
            fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
                Some(&self.0)
            }
        }
        let refused = Wrap(io::Error::from(io::ErrorKind::ConnectionRefused));
        let reset = Wrap(io::Error::from(io::ErrorKind::TimedOut));
        assert!(super::super::connection_refused(&refused));
        assert!(!super::super::connection_refused(&reset));
    }
}
