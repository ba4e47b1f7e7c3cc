//! The director's idle-rehome worker (docs/reference/http.md): every 6 s ± 20 % (the period is
//! `ORCA_RELAY_REGION_REHOME_POLL_MS`, shorter only for tests and benchmarks) it checks the gates,
//! reads one rotating page of hosts with a conclusive preference for another region, selects the
//! candidates and dispatches each, in key order, to its source cell's `POST
//! /v1/admin/host-idle-rehome` (docs/reference/http.md), sorting every answer by the answer table.
//!
//! Why it looks like this:
//! - **Single-flight** within the process is the loop itself (the next wait starts after the poll
//!   ends). Across directors it is a lease row (`relay_region_rehome_worker_lease`, one statement
//!   takes it, renewed before each dispatch, given up after the poll): every director polls, but
//!   only one walks at a time, so two directors never dispatch the same page at once. A director
//!   that finds the lease held skips that tick silently (it did not poll, so it logs no summary).
//! - **Selection proves nothing**: every read is plain and may be stale; the source cell proves
//!   idleness and the store re-checks everything under its locks. The worker only avoids
//!   useless dispatches.
//! - **Decisions are pure** ([`rules::poll_gate`], [`rules::candidate`],
//!   [`rules::classify_answer`], [`rules::SkipList`]); this module only reads, posts and logs.
//! - **Identities never reach a log line**: the summary has counts only; the per-attempt lines
//!   carry the `attemptId` (a UUID v5 digest), cell ids and an error code.
//! - **Time** comes from `clock::now_ms` and tokio timers, so paused-time tests drive it.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::Director;
use crate::clock::now_ms;
use crate::contract::wire::Safety;
use crate::logging;
use crate::rehome::rules::{
    self, Candidate, DispatchAnswer, HostFacts, PollSummary, SafetyWindow, SkipList,
};
use crate::rehome::service;
use crate::store::assignments::HostKey;
use crate::store::region;
use crate::store::{Db, DbError};

/// How long a taken worker lease lasts without renewal: longer than one dispatch (10 s timeout).
const LEASE_TTL_MS: i64 = 30_000;
/// Largest answer body read from a cell; a longer one is malformed.
const ANSWER_MAX_BYTES: usize = 4_096;

/// Starts the worker; it stops when `stop` (or the process shutdown) is cancelled. `None` when
/// the process has no cluster key: without one no cell accepts a dispatch, so there is nothing
/// to run (logged once).
pub fn spawn(d: Arc<Director>, stop: CancellationToken) -> Option<tokio::task::JoinHandle<()>> {
    let mut w = match Worker::new(&d) {
        Ok(w) => w,
        Err(why) => {
            log::warn!("[orca-relay] regional rehome worker not started: {why}");
            return None;
        }
    };
    let every_ms = d.ctx.config.region_rehome_poll_ms;
    Some(d.ctx.clone().spawn("director-rehome-worker", async move {
        loop {
            let wait =
                Duration::from_millis(rules::poll_wait_ms(every_ms, rand::random::<f64>()) as u64);
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
            tokio::select! {
                _ = stop.cancelled() => break,
                _ = w.poll(&d) => {}
            }
        }
        // Let another director take over at once instead of after the lease expires.
        let _ = tokio::time::timeout(
            Duration::from_secs(1),
            region::release_worker_lease(&d.ctx.db, &w.holder, now_ms()),
        )
        .await;
    }))
}

/// The worker's memory between polls.
struct Worker {
    client: reqwest::Client,
    cluster_key: String,
    /// This process in the lease row.
    holder: String,
    /// The last key of the previous page (`None`: start from the first key).
    cursor: Option<HostKey>,
    skip: SkipList,
    /// The director's own safety: its store counters over the last 30 s, from start-up.
    safety: SafetyWindow,
}

/// How a walk ended.
struct Walked {
    summary: PollSummary,
    stopped_by: &'static str,
}

impl Worker {
    fn new(d: &Director) -> Result<Worker, String> {
        let cfg = &d.ctx.config;
        let cluster_key = cfg
            .secrets
            .cluster_key
            .clone()
            .ok_or("no cluster key (ORCA_RELAY_CLUSTER_KEY)")?;
        let timeout = Duration::from_millis(rules::DISPATCH_TIMEOUT_MS as u64);
        Ok(Worker {
            client: crate::tls::client::cluster_client(&cfg.extra_ca, timeout)?,
            cluster_key,
            holder: d.ctx.incarnation.clone(),
            cursor: None,
            skip: SkipList::default(),
            safety: SafetyWindow::new(d.ctx.started_at),
        })
    }

    /// The director's safety now; `None` when it cannot be computed (a value out of the schema).
    fn own_safety(&mut self, db: &Db, now: i64) -> Option<Safety> {
        let s = self.safety.record(now, crate::rehome::store_reading(db, 0));
        rules::safety_valid(&s).then_some(s)
    }

    /// One poll: lease, gates, page, walk, summary (or the poll-failed line).
    async fn poll(&mut self, d: &Director) {
        let db = &d.ctx.db;
        let now = now_ms();
        let safety = self.own_safety(db, now);
        match region::take_worker_lease(db, &self.holder, now + LEASE_TTL_MS, now).await {
            Ok(true) => {}
            Ok(false) => return,
            Err(e) => return poll_failed(&e),
        }
        let r = self.walk(d, safety, now).await;
        if let Err(e) = region::release_worker_lease(db, &self.holder, now_ms()).await {
            log::debug!("rehome worker lease release: {e}");
        }
        match r {
            Ok(w) => logging::event(
                "orca_relay_idle_rehome_dispatch_summary",
                w.summary.fields(w.stopped_by),
            ),
            Err(e) => poll_failed(&e),
        }
    }

    async fn walk(
        &mut self,
        d: &Director,
        safety: Option<Safety>,
        now: i64,
    ) -> Result<Walked, DbError> {
        let db = &d.ctx.db;
        let mut summary = PollSummary::default();
        let control = region::read_control(db).await?;
        let open = region::open_idle_migrations(db).await?;
        let cells = service::all_cell_facts(db, now).await?;
        let fleet = rules::fleet_safe(&cells, now);
        if let Some(gate) = rules::poll_gate(safety.as_ref(), &control, open, fleet, now) {
            return Ok(Walked {
                summary,
                stopped_by: gate,
            });
        }
        let page = self.next_page(db).await?;
        let candidates = candidates_of(
            db,
            &page,
            &cells,
            &control,
            d.ctx.config.region.as_str(),
            now,
        )
        .await?;
        summary.candidates = candidates.len();
        let mut stopped_by = "exhausted";
        for c in &candidates {
            let at = now_ms();
            let id = c.request.attempt_id.as_str();
            if self.skip.skipped(id, at) {
                continue;
            }
            // Keep the lease for this dispatch; a lost lease ends the walk (another director
            // took over after this one stalled).
            if !region::take_worker_lease(db, &self.holder, at + LEASE_TTL_MS, at).await? {
                break;
            }
            let Some(safety) = self.own_safety(db, at) else {
                stopped_by = "process-safety-unavailable";
                break;
            };
            summary.dispatched += 1;
            let answer = self.dispatch(c, control.cohort_percent, &safety, at).await;
            if let Some(stop) = self.on_answer(d, c, answer, &mut summary).await? {
                stopped_by = stop;
                break;
            }
        }
        Ok(Walked {
            summary,
            stopped_by,
        })
    }

    /// Counts one dispatch's answer and acts on it (the skip list, the committed event and the
    /// dispatch record, a failed dispatch's budget). `Some(reason)` ends the walk.
    async fn on_answer(
        &mut self,
        d: &Director,
        c: &Candidate,
        answer: (DispatchAnswer, &'static str),
        summary: &mut PollSummary,
    ) -> Result<Option<&'static str>, DbError> {
        let db = &d.ctx.db;
        let id = c.request.attempt_id.as_str();
        match answer {
            (DispatchAnswer::Committed, _) => {
                summary.committed += 1;
                self.skip.answered(id);
                logging::event(
                    "orca_relay_idle_rehome_committed",
                    json!({"attemptId": id, "sourceCellId": c.request.source_cell_id,
                        "targetCellId": c.request.target_cell_id}),
                );
                for (name, fields) in service::record_dispatch(db, false, now_ms()).await? {
                    logging::event(name, fields);
                }
                return Ok(Some("committed"));
            }
            (DispatchAnswer::Stop(reason), _) => {
                summary.deferred += 1;
                d.rehome_deferred.record(now_ms());
                self.skip.answered(id);
                return Ok(Some(reason));
            }
            (DispatchAnswer::Next(bucket), _) => {
                match bucket {
                    "busy" => summary.busy += 1,
                    "stale" => summary.stale += 1,
                    _ => {
                        summary.deferred += 1;
                        d.rehome_deferred.record(now_ms());
                    }
                }
                self.skip.answered(id);
            }
            (DispatchAnswer::Ambiguous, error) => {
                summary.failed += 1;
                request_failed(c, error);
            }
            (DispatchAnswer::Failed, error) => {
                summary.failed += 1;
                request_failed(c, error);
                let t = now_ms();
                self.skip.failed(id, t);
                let spent = service::record_dispatch(db, true, t).await?;
                if !spent.is_empty() {
                    // The budget is spent: the control is now disabled.
                    for (name, fields) in spent {
                        logging::event_warn(name, fields);
                    }
                    return Ok(Some("control-closed"));
                }
            }
        }
        Ok(None)
    }

    /// One page of ≤ 50 distinct hosts after the previous page's last key, wrapping at the end
    /// within the page, so every poll sees up to 50 hosts ([`service::candidate_page`]).
    async fn next_page(&mut self, db: &Db) -> Result<Vec<region::PageHost>, DbError> {
        let (page, cursor) =
            service::candidate_page(db, self.cursor.as_ref(), rules::PAGE_LIMIT).await?;
        self.cursor = cursor;
        Ok(page)
    }

    /// POSTs the request with a fresh director cluster token; the answer and an error code for
    /// the request-failed line.
    async fn dispatch(
        &self,
        c: &Candidate,
        cohort_percent: i64,
        safety: &Safety,
        now: i64,
    ) -> (DispatchAnswer, &'static str) {
        let token =
            crate::crypto::jwt::mint_cluster_token(self.cluster_key.as_bytes(), "director", now);
        let url = format!(
            "{}/v1/admin/host-idle-rehome",
            c.source_cell_url.trim_end_matches('/')
        );
        let body = rules::dispatch_body(&c.request, cohort_percent, safety);
        let resp = match self
            .client
            .post(url)
            .bearer_auth(token)
            .json(&body)
            .send()
            .await
        {
            Ok(r) => r,
            Err(e) => return (DispatchAnswer::Ambiguous, transport_error(&e)),
        };
        let status = resp.status().as_u16();
        let bytes = match read_capped(resp).await {
            Ok(Some(b)) => b,
            Ok(None) => return (DispatchAnswer::Failed, "malformed_answer"),
            Err(e) => return (DispatchAnswer::Ambiguous, transport_error(&e)),
        };
        let a = rules::classify_answer(status, &bytes);
        let error = match (a, status) {
            (DispatchAnswer::Failed, 200) => "malformed_answer",
            (DispatchAnswer::Failed, _) => status_error(status),
            _ => "",
        };
        (a, error)
    }
}

/// The body, at most [`ANSWER_MAX_BYTES`] (`None` beyond).
async fn read_capped(mut resp: reqwest::Response) -> Result<Option<Vec<u8>>, reqwest::Error> {
    let mut out = Vec::new();
    while let Some(chunk) = resp.chunk().await? {
        if out.len() + chunk.len() > ANSWER_MAX_BYTES {
            return Ok(None);
        }
        out.extend_from_slice(&chunk);
    }
    Ok(Some(out))
}

fn transport_error(e: &reqwest::Error) -> &'static str {
    if e.is_timeout() {
        "timeout"
    } else if e.is_connect() {
        "connect"
    } else {
        "transport"
    }
}

/// `http_<status>` for the statuses worth telling apart, else `http_other`.
fn status_error(status: u16) -> &'static str {
    match status {
        400 => "http_400",
        401 => "http_401",
        404 => "http_404",
        409 => "http_409",
        500 => "http_500",
        502 => "http_502",
        503 => "http_503",
        504 => "http_504",
        _ => "http_other",
    }
}

/// The page's hosts that are candidates now: the cheap prefilter on the page's facts first, then
/// the host's leases, open migration and latest attempt read for the full rule.
async fn candidates_of(
    db: &Db,
    page: &[region::PageHost],
    cells: &[rules::CellFacts],
    control: &region::Control,
    region_name: &str,
    now: i64,
) -> Result<Vec<Candidate>, DbError> {
    let mut candidates: Vec<Candidate> = Vec::new();
    for p in page {
        let mut facts = HostFacts {
            user_id: &p.host.user_id,
            relay_host_id: &p.host.relay_host_id,
            home_cell_id: &p.cell_id,
            assignment_epoch: p.assignment_epoch,
            decision: &p.decision,
            leases: &[],
            open_migration: false,
            latest_attempt_at: None,
        };
        if !rules::prefilter(&facts, cells, control, region_name, now) {
            continue;
        }
        let leases = region::read_leases(db, &p.host).await?;
        facts.leases = &leases;
        facts.open_migration = region::has_open_migration(db, &p.host).await?;
        facts.latest_attempt_at = region::latest_attempt_at(db, &p.host).await?;
        if let Some(c) = rules::candidate(&facts, cells, control, region_name, now) {
            candidates.push(c);
        }
    }
    Ok(candidates)
}

fn request_failed(c: &Candidate, error: &str) {
    logging::event_warn(
        "orca_relay_idle_rehome_request_failed",
        json!({"attemptId": c.request.attempt_id, "sourceCellId": c.request.source_cell_id,
            "error": error}),
    );
}

/// A failed poll: only the error class, never the database's message (it may quote values).
fn poll_failed(e: &DbError) {
    let error = match e {
        DbError::LockUnavailable => "lock_unavailable",
        DbError::Serialization(_) => "serialization_failure",
        DbError::UniqueViolation => "unique_violation",
        DbError::Transient(_) => "database_unavailable",
        DbError::Fatal(_) => "database_error",
    };
    logging::event_warn(
        "orca_relay_regional_rehome_poll_failed",
        json!({"error": error}),
    );
}
