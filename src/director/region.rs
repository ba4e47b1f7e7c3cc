//! The director's glue of idle regional correction (docs/reference/http.md): the
//! `regionCorrection` exchange after a grant, the `regional-rehome-control` route, the HostView's
//! `regionDecision` and the periodic outcomes line. The rules and transactions are in
//! `crate::rehome`.

use std::sync::{Arc, Mutex};

use http::StatusCode;
use serde_json::{json, Value as Json};

use super::web::db_unavailable;
use super::Director;
use crate::http::{self as h, Response};
use crate::rehome::rules::{self, ControlRequest, RegionCorrection};
use crate::rehome::service::{self, ControlError, Event};
use crate::store::assignments::HostKey;
use crate::store::region;
use crate::{clock, logging};

/// Interval of the `orca_relay_region_correction_outcomes` line.
pub const OUTCOMES_EVERY: std::time::Duration = std::time::Duration::from_secs(300);

/// Window of the worker's in-memory `deferred` count shown by the overview (docs/reference/http.md).
pub const DEFERRED_WINDOW_MS: i64 = 86_400_000;
/// Bucket width of that count: 24 h in 1 440 one-minute buckets, so the memory is bounded however
/// many answers arrive.
const BUCKET_MS: i64 = 60_000;
const BUCKETS: usize = (DEFERRED_WINDOW_MS / BUCKET_MS) as usize;

/// The `deferred` answers this process's idle-rehome worker received in the trailing 24 h
/// (docs/reference/http.md `regionalRehome.deferred`: in memory, per process, lost on restart). The
/// worker calls [`DeferredTally::record`] for every `deferred` answer of a cell; the overview reads
/// [`DeferredTally::since`]. Counted per minute: an answer leaves the count between 24 h and
/// 24 h + 1 min after it arrived.
#[derive(Default)]
pub struct DeferredTally {
    /// `(minute, count)` in arrival order, at most [`BUCKETS`] + 1 entries.
    buckets: Mutex<std::collections::VecDeque<(i64, u64)>>,
}

impl DeferredTally {
    /// One `deferred` answer at `now` (ms).
    pub fn record(&self, now: i64) {
        let minute = now.div_euclid(BUCKET_MS);
        let mut b = crate::sync::lock(&self.buckets);
        match b.back_mut() {
            Some((m, n)) if *m == minute => *n += 1,
            _ => b.push_back((minute, 1)),
        }
        while b.len() > BUCKETS + 1 {
            b.pop_front();
        }
    }

    /// The answers of the trailing window ending at `now`.
    pub fn since(&self, now: i64) -> u64 {
        let oldest = (now - DEFERRED_WINDOW_MS).div_euclid(BUCKET_MS);
        crate::sync::lock(&self.buckets)
            .iter()
            .filter(|(m, _)| *m >= oldest)
            .map(|(_, n)| n)
            .sum()
    }
}

/// Logs the events a rehome service returned (after its commit).
pub fn log_events(events: Vec<Event>) {
    for (name, fields) in events {
        logging::event(name, fields);
    }
}

impl Director {
    /// The exchange of after a grant at `epoch` on a home in `home_region`. A failed
    /// `issue-window` is swallowed (`Ok(None)` and the unavailable line); a failed `report` fails the
    /// request.
    pub(crate) async fn region_correction(
        &self,
        host: &HostKey,
        rc: Option<RegionCorrection>,
        epoch: i64,
        home_region: Option<String>,
        now: i64,
    ) -> Result<Option<Json>, Response> {
        let db = &self.ctx.db;
        match rc {
            None => Ok(None),
            Some(RegionCorrection::IssueWindow) => {
                let window = match home_region {
                    Some(r) => service::issue_window(db, host, epoch, &r, now).await.ok(),
                    None => None,
                };
                match window {
                    Some(w) => Ok(Some(json!({"v":1,"window":w}))),
                    None => {
                        logging::event("orca_relay_region_window_unavailable", json!({}));
                        Ok(None)
                    }
                }
            }
            Some(RegionCorrection::Report(r)) => {
                match service::report(db, host, &r, &self.ctx.config.regions, now).await {
                    Ok((status, events)) => {
                        log_events(events);
                        Ok(Some(json!({"v":1,"reportStatus":status.as_str()})))
                    }
                    Err(e) => Err({
                        log::warn!("[orca-relay] region report failed: {e}");
                        h::error_retry(
                            StatusCode::SERVICE_UNAVAILABLE,
                            "assignments_temporarily_unavailable",
                            self.placement_lane.cfg.retry_after_s,
                        )
                    }),
                }
            }
        }
    }

    /// `POST /v1/admin/regional-rehome-control` (admin token already checked).
    pub(crate) async fn rehome_control_route(&self, b: &[u8]) -> Response {
        // The one strict decoder: a duplicate key is "not JSON" (400), like every other body.
        let Ok(v) = crate::contract::strict::parse_value(b) else {
            return h::bad_request();
        };
        let Some(req) = rules::parse_control_request(&v) else {
            return h::bad_request();
        };
        let db = &self.ctx.db;
        let now = clock::now_ms();
        let control = match req {
            ControlRequest::Inspect => match region::read_control(db).await {
                Ok(c) => c,
                Err(_) => return db_unavailable(),
            },
            ControlRequest::Apply(a) => match service::apply_control(db, &a, now).await {
                Ok(c) => {
                    log::info!(
                        "{}",
                        logging::event_line(
                            "orca_relay_regional_rehome_control_applied",
                            json!({"generation": c.generation, "enabled": c.enabled,
                                "cohortPercent": c.cohort_percent, "ratePerMinute": c.rate_per_minute}),
                        )
                    );
                    c
                }
                Err(ControlError::GenerationMismatch) => {
                    return h::error(StatusCode::CONFLICT, "regional_rehome_generation_mismatch")
                }
                Err(ControlError::Db(_)) => return db_unavailable(),
            },
        };
        match service::outcomes(db, now).await {
            Ok(o) => h::json(
                StatusCode::OK,
                &json!({"v":1,"control":rules::control_json(&control),"outcomes":o}),
            ),
            Err(_) => db_unavailable(),
        }
    }

    /// Every 5 min: the trailing-24 h outcomes line, until shutdown (on the process's one task
    /// tracker, so shutdown waits for it).
    pub fn start_outcomes_log(self: &Arc<Self>) {
        let me = self.clone();
        self.ctx.spawn("region-outcomes-log", async move {
            let mut tick = tokio::time::interval(OUTCOMES_EVERY);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
            tick.tick().await;
            loop {
                tokio::select! {
                    _ = me.stop.cancelled() => return,
                    _ = tick.tick() => {}
                }
                if let Ok(o) = service::outcomes(&me.ctx.db, clock::now_ms()).await {
                    logging::event("orca_relay_region_correction_outcomes", o);
                }
            }
        });
    }
}

/// The HostView's `regionDecision`, `null` without a decision.
pub async fn region_decision_json(
    db: &crate::store::Db,
    host: &HostKey,
) -> Result<Json, crate::store::DbError> {
    Ok(match region::read_decision(db, host).await? {
        None => Json::Null,
        Some(d) => json!({
            "generation": d.generation,
            "assignmentEpoch": d.assignment_epoch,
            "incumbentRegion": d.incumbent_region,
            "outcome": d.outcome,
            "preferredRegion": d.preferred_region,
            "cohortBucket": d.cohort_bucket,
            "expiresAt": d.expires_at,
            "observedAt": d.observed_at,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The tally counts the trailing 24 h only and stays bounded under any arrival pattern.
    #[test]
    fn deferred_tally_window_and_bound() {
        let t = DeferredTally::default();
        let day = DEFERRED_WINDOW_MS;
        t.record(0);
        t.record(10);
        t.record(BUCKET_MS);
        assert_eq!(t.since(BUCKET_MS), 3);
        assert_eq!(t.since(day + BUCKET_MS - 1), 3, "still inside the window");
        assert_eq!(t.since(day + 2 * BUCKET_MS - 1), 1, "the first minute left");
        assert_eq!(t.since(day + 3 * BUCKET_MS), 0);
        let t = DeferredTally::default();
        for i in 0..(3 * BUCKETS as i64) {
            t.record(i * BUCKET_MS);
        }
        assert!(crate::sync::lock(&t.buckets).len() <= BUCKETS + 1);
        let now = 3 * BUCKETS as i64 * BUCKET_MS;
        assert_eq!(t.since(now), BUCKETS as u64);
    }
}
