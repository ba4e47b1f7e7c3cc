//! The pure rules of idle regional correction (docs/reference/http.md): cohort buckets, the preference
//! rule, report statuses, clean/current/eligible/fleet safety, the control gates, candidate
//! validity, target choice and the attempt identity. Plain data in, answers out; `now` is always a
//! parameter, so every rule is unit-tested without a database or a clock.

use serde_json::Value as Json;
use sha2::{Digest, Sha256};

use crate::contract::wire::Safety;
use crate::store::assignments::Lease;
pub use crate::store::region::{AttemptRecord, Control, Decision};

/// The only policy version.
pub const POLICY_VERSION: i64 = 1;
/// Window lifetime: `expires_at` = issue + 24 h.
pub const WINDOW_TTL_MS: i64 = 86_400_000;
/// A cell's safety is current while younger than this.
pub const SAFETY_CURRENT_MS: i64 = 60_000;
/// The director's safety in a dispatch is stale beyond this age (docs/reference/http.md step 1).
pub const DIRECTOR_SAFETY_MAX_AGE_MS: i64 = 60_000;
/// Open idle-rehome migrations allowed at once (3.2).
pub const MAX_OPEN_IDLE_MIGRATIONS: i64 = 8;
/// Arrival deadline of an idle-rehome migration.
pub const IDLE_ARRIVAL_MS: i64 = 300_000;
/// Consecutive dispatch failures that disable the control.
pub const FAILURE_BUDGET: i64 = 3;
/// Pause after the failure budget is spent.
pub const FAILURE_PAUSE_MS: i64 = 300_000;
/// Preference rule: at least this much faster.
pub const PREFERENCE_MIN_GAIN_MS: i64 = 25;
/// `attemptId` namespace (UUID v5).
pub const ATTEMPT_NAMESPACE: uuid::Uuid = uuid::uuid!("0a1c5a9b-197b-4ea8-b6f1-f3bcaa3d712c");

/// `cohort_bucket`: the first 4 bytes (big-endian) of SHA-256 of the compact JSON pair
/// `["<userId>","<relayHostId>"]`, mod 100. serde_json's compact writer escapes exactly `"`, `\`
/// and control characters and writes every other character as raw UTF-8, which is the spec's form.
pub fn cohort_bucket(user_id: &str, relay_host_id: &str) -> i64 {
    let text = serde_json::to_string(&[user_id, relay_host_id]).unwrap_or_default();
    let d = Sha256::digest(text.as_bytes());
    (u32::from_be_bytes([d[0], d[1], d[2], d[3]]) % 100) as i64
}

/// The preference of an accepted conclusive report: the region R ≠ incumbent with the lowest RTT
/// (ties: configuration order) when RTT(I) − RTT(R) ≥ 25 ms and RTT(R) ≤ 0.8 × RTT(I).
pub fn preferred_region(
    measurements: &[(String, i64)],
    incumbent: &str,
    regions: &[String],
) -> Option<String> {
    let rtt = |r: &str| measurements.iter().find(|(k, _)| k == r).map(|(_, v)| *v);
    let inc = rtt(incumbent)?;
    let mut best: Option<(&String, i64)> = None;
    for r in regions.iter().filter(|r| r.as_str() != incumbent) {
        if let Some(v) = rtt(r) {
            if best.is_none_or(|(_, b)| v < b) {
                best = Some((r, v));
            }
        }
    }
    let (r, v) = best?;
    // RTT(R) ≤ 0.8 × RTT(I) in integers: 5·RTT(R) ≤ 4·RTT(I).
    (inc - v >= PREFERENCE_MIN_GAIN_MS && 5 * v <= 4 * inc).then(|| r.clone())
}

/// A parsed `regionCorrection` object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegionCorrection {
    IssueWindow,
    Report(Report),
}

/// A `report`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    pub generation: i64,
    pub assignment_epoch: i64,
    pub policy_version: i64,
    pub outcome: ReportOutcome,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ReportOutcome {
    /// Measurements in the order they were sent.
    Conclusive(Vec<(String, i64)>),
    Inconclusive(String),
}

/// Strict schema of `regionCorrection`: exactly the documented keys and types; `None` = 400.
pub fn parse_region_correction(v: &Json, regions: &[String]) -> Option<RegionCorrection> {
    let o = v.as_object()?;
    if o.get("v")?.as_i64()? != 1 {
        return None;
    }
    let int = |k: &str| {
        o.get(k)
            .and_then(Json::as_i64)
            .filter(|x| (0..=(1i64 << 53) - 1).contains(x))
    };
    match o.get("action")?.as_str()? {
        "issue-window" => (o.len() == 2).then_some(RegionCorrection::IssueWindow),
        "report" => {
            if o.len() != 7 {
                return None;
            }
            let generation = int("generation")?;
            let assignment_epoch = int("assignmentEpoch")?;
            let policy_version = int("policyVersion").filter(|p| *p >= 1)?;
            let outcome = match o.get("outcome")?.as_str()? {
                "conclusive" => {
                    let m = o.get("measurements")?.as_object()?;
                    if m.len() < 2 {
                        return None;
                    }
                    let mut out = Vec::with_capacity(m.len());
                    for (k, val) in m {
                        let rtt = val.as_i64().filter(|x| (0..=120_000).contains(x))?;
                        if !regions.contains(k) {
                            return None;
                        }
                        out.push((k.clone(), rtt));
                    }
                    ReportOutcome::Conclusive(out)
                }
                "inconclusive" => {
                    let r = o.get("reason")?.as_str()?;
                    if !(1..=64).contains(&r.chars().count()) {
                        return None;
                    }
                    ReportOutcome::Inconclusive(r.to_string())
                }
                _ => return None,
            };
            Some(RegionCorrection::Report(Report {
                generation,
                assignment_epoch,
                policy_version,
                outcome,
            }))
        }
        _ => None,
    }
}

/// `reportStatus`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReportStatus {
    BasisChanged,
    Stale,
    Expired,
    Duplicate,
    Accepted,
}

impl ReportStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            ReportStatus::BasisChanged => "basis-changed",
            ReportStatus::Stale => "stale",
            ReportStatus::Expired => "expired",
            ReportStatus::Duplicate => "duplicate",
            ReportStatus::Accepted => "accepted",
        }
    }
}

/// The first matching `reportStatus` for a report against the stored decision and the host's
/// current epoch and home region.
pub fn report_status(
    decision: Option<&Decision>,
    report: &Report,
    host_epoch: i64,
    home_region: &str,
    now: i64,
) -> ReportStatus {
    let Some(d) = decision else {
        return ReportStatus::BasisChanged;
    };
    let lacks_incumbent = match &report.outcome {
        ReportOutcome::Conclusive(m) => !m.iter().any(|(k, _)| *k == d.incumbent_region),
        ReportOutcome::Inconclusive(_) => false,
    };
    if report.assignment_epoch != d.assignment_epoch
        || d.assignment_epoch != host_epoch
        || d.incumbent_region != home_region
        || lacks_incumbent
    {
        return ReportStatus::BasisChanged;
    }
    if report.generation != d.generation || report.policy_version != POLICY_VERSION {
        return ReportStatus::Stale;
    }
    if d.expires_at <= now {
        return ReportStatus::Expired;
    }
    if d.outcome != "pending" {
        return ReportStatus::Duplicate;
    }
    ReportStatus::Accepted
}

// ---------------------------------------------------------------------------------------------------
// Safety

/// A safety object is clean when every counter is within its bound.
pub fn safety_clean(s: &Safety) -> bool {
    s.sql_failures <= 3
        && s.reconnects <= 20
        && s.control_activity_recovery_failures == 0
        && s.database_pool_waiting <= 2
        && s.database_pool_wait_ms_max <= 1_000
}

/// The stored safety JSON of a runtime row, if it parses.
pub fn parse_safety(json: Option<&str>) -> Option<Safety> {
    serde_json::from_str(json?).ok()
}

/// Field-wise maximum of two safety objects with the older `observedAt` (docs/reference/http.md step 7).
pub fn merge_safety(a: &Safety, b: &Safety) -> Safety {
    let opt = |x: Option<i64>, y: Option<i64>| match (x, y) {
        (Some(x), Some(y)) => Some(x.max(y)),
        (x, y) => x.or(y),
    };
    Safety {
        observed_at: a.observed_at.min(b.observed_at),
        sql_failures: a.sql_failures.max(b.sql_failures),
        reconnects: a.reconnects.max(b.reconnects),
        control_activity_recovery_failures: a
            .control_activity_recovery_failures
            .max(b.control_activity_recovery_failures),
        database_pool_waiting: a.database_pool_waiting.max(b.database_pool_waiting),
        database_pool_waiters_max: a.database_pool_waiters_max.max(b.database_pool_waiters_max),
        database_pool_wait_ms_max: a.database_pool_wait_ms_max.max(b.database_pool_wait_ms_max),
        database_pool_total: opt(a.database_pool_total, b.database_pool_total),
        database_pool_idle: opt(a.database_pool_idle, b.database_pool_idle),
        database_pool_oldest_wait_ms: opt(
            a.database_pool_oldest_wait_ms,
            b.database_pool_oldest_wait_ms,
        ),
    }
}

/// The non-negative-integer schema of a safety object (docs/reference/http.md).
pub fn safety_valid(f: &Safety) -> bool {
    let nonneg = |v: i64| (0..=(1i64 << 53) - 1).contains(&v);
    nonneg(f.observed_at)
        && nonneg(f.sql_failures)
        && nonneg(f.reconnects)
        && nonneg(f.control_activity_recovery_failures)
        && (0..=100).contains(&f.database_pool_waiting)
        && nonneg(f.database_pool_waiters_max)
        && nonneg(f.database_pool_wait_ms_max)
        && f.database_pool_total.is_none_or(nonneg)
        && f.database_pool_idle.is_none_or(nonneg)
        && f.database_pool_oldest_wait_ms.is_none_or(nonneg)
}

/// What the rehome rules read of a cell (built from the store's cell view by the caller).
#[derive(Debug, Clone, PartialEq)]
pub struct CellFacts {
    pub cell_id: String,
    pub cell_url: String,
    pub region: String,
    pub general: bool,
    pub live: bool,
    pub headroom: bool,
    pub capped: bool,
    pub capacity_requests: i64,
    pub reserved_requests: i64,
    pub observed_requests: i64,
    /// Runtime incarnation and `startedAt` (cell clock), when a runtime row exists.
    pub incarnation: Option<String>,
    pub started_at: Option<i64>,
    pub protocol: i64,
    pub safety: Option<Safety>,
    pub safety_received_at: Option<i64>,
}

/// Safety is current when received within 60 s. The stored safety always belongs to the runtime's
/// incarnation: a takeover nulls it (docs/operations.md).
pub fn safety_current(c: &CellFacts, now: i64) -> bool {
    c.safety.is_some()
        && c.incarnation.is_some()
        && c.safety_received_at
            .is_some_and(|t| t > now - SAFETY_CURRENT_MS)
}

/// `general`, live, protocol ≥ 3, safety current and clean.
pub fn rehome_eligible(c: &CellFacts, now: i64) -> bool {
    c.general
        && c.live
        && c.protocol >= 3
        && safety_current(c, now)
        && c.safety.as_ref().is_some_and(safety_clean)
}

/// Every `general` cell with protocol ≥ 1 is live with current, clean safety.
pub fn fleet_safe(cells: &[CellFacts], now: i64) -> bool {
    cells
        .iter()
        .filter(|c| c.general && c.protocol >= 1)
        .all(|c| c.live && safety_current(c, now) && c.safety.as_ref().is_some_and(safety_clean))
}

/// Window of the safety counters: the last 30 s.
pub const SAFETY_WINDOW_MS: i64 = 30_000;

/// One reading of a process's counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SafetyReading {
    /// Totals since start-up: SQL failures, reconnects, control-activity recovery failures.
    pub totals: [i64; 3],
    /// Callers waiting for a database connection right now.
    pub waiting: i64,
    /// Maxima since the previous reading: waiters, wait ms.
    pub waiters_max: i64,
    pub wait_ms_max: i64,
    /// Pool size and idle connections (Postgres), the oldest current wait.
    pub pool: Option<(i64, i64)>,
    pub oldest_wait_ms: i64,
}

/// The last 30 s of readings, counted from start-up: a fresh process has a window (its start
/// reading is all zeros).
#[derive(Debug, Clone)]
pub struct SafetyWindow {
    samples: std::collections::VecDeque<(i64, SafetyReading)>,
}

impl SafetyWindow {
    pub fn new(started_at: i64) -> SafetyWindow {
        let zero = SafetyReading {
            totals: [0; 3],
            waiting: 0,
            waiters_max: 0,
            wait_ms_max: 0,
            pool: None,
            oldest_wait_ms: 0,
        };
        SafetyWindow {
            samples: std::collections::VecDeque::from([(started_at, zero)]),
        }
    }

    /// Adds a reading taken at `now` and returns the safety object over the last 30 s: counter
    /// deltas against the newest reading at least 30 s old (or the start), maxima over the window.
    pub fn record(&mut self, now: i64, r: SafetyReading) -> Safety {
        self.samples.push_back((now, r));
        while self.samples.len() > 2 && self.samples[1].0 <= now - SAFETY_WINDOW_MS {
            self.samples.pop_front();
        }
        let base = self.samples[0].1.totals;
        let delta = |i: usize| (r.totals[i] - base[i]).max(0);
        let in_window = self
            .samples
            .iter()
            .filter(|(t, _)| *t > now - SAFETY_WINDOW_MS);
        let (waiters, wait_ms) = in_window.fold((0, 0), |(a, b), (_, s)| {
            (a.max(s.waiters_max), b.max(s.wait_ms_max))
        });
        Safety {
            observed_at: now,
            sql_failures: delta(0),
            reconnects: delta(1),
            control_activity_recovery_failures: delta(2),
            database_pool_waiting: r.waiting.min(100),
            database_pool_waiters_max: waiters.max(r.waiting),
            database_pool_wait_ms_max: wait_ms.max(r.oldest_wait_ms),
            database_pool_total: r.pool.map(|p| p.0),
            database_pool_idle: r.pool.map(|p| p.1),
            database_pool_oldest_wait_ms: Some(r.oldest_wait_ms),
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Control

/// The Control object of docs/reference/http.md.
pub fn control_json(c: &Control) -> Json {
    serde_json::json!({
        "generation": c.generation,
        "enabled": c.enabled,
        "notBefore": c.not_before,
        "ratePerMinute": c.rate_per_minute,
        "cohortPercent": c.cohort_percent,
        "hostCooldownMs": c.host_cooldown_ms,
        "preferenceMaxAgeMs": c.preference_max_age_ms,
        "nextDispatchAt": c.next_dispatch_at,
        "pausedUntil": c.paused_until,
        "consecutiveFailures": c.consecutive_failures,
        "disabledReason": c.disabled_reason,
        "updatedAt": c.updated_at,
    })
}

/// The closed gate of the control row, if any: `control-closed` (disabled or before
/// `not_before`), then `budget-closed` (paused or rate-limited).
pub fn control_gate(c: &Control, now: i64) -> Option<&'static str> {
    if !c.enabled || c.not_before > now {
        return Some("control-closed");
    }
    if c.paused_until > now || c.next_dispatch_at > now {
        return Some("budget-closed");
    }
    None
}

/// ⌈60 000 / rate⌉: the gap between two commits.
pub fn dispatch_interval_ms(rate_per_minute: i64) -> i64 {
    let r = rate_per_minute.max(1);
    (60_000 + r - 1) / r
}

/// A valid `apply`: the fields it writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Apply {
    pub expected_generation: i64,
    pub enabled: bool,
    pub rate_per_minute: i64,
    pub cohort_percent: i64,
    pub host_cooldown_ms: i64,
    pub preference_max_age_ms: i64,
    pub not_before: i64,
}

/// A parsed control request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ControlRequest {
    Inspect,
    Apply(Apply),
}

/// Strict schema of `regional-rehome-control`, including the confirmation rule; `None` = 400.
pub fn parse_control_request(v: &Json) -> Option<ControlRequest> {
    let o = v.as_object()?;
    if o.get("v")?.as_i64()? != 1 {
        return None;
    }
    let int = |k: &str, lo: i64, hi: i64| {
        o.get(k)
            .and_then(Json::as_i64)
            .filter(|x| (lo..=hi).contains(x))
    };
    match o.get("action")?.as_str()? {
        "inspect" => (o.len() == 2).then_some(ControlRequest::Inspect),
        "apply" => {
            let allowed = [
                "v",
                "action",
                "expectedGeneration",
                "enabled",
                "ratePerMinute",
                "cohortPercent",
                "hostCooldownMs",
                "preferenceMaxAgeMs",
                "notBefore",
                "confirmation",
            ];
            if o.keys().any(|k| !allowed.contains(&k.as_str())) {
                return None;
            }
            let max = (1i64 << 53) - 1;
            let enabled = o.get("enabled")?.as_bool()?;
            let confirmation = o.get("confirmation")?.as_str()?;
            let want = if enabled {
                "ENABLE_REGIONAL_REHOMING"
            } else {
                "DISABLE_REGIONAL_REHOMING"
            };
            if confirmation != want {
                return None;
            }
            let not_before = match o.get("notBefore") {
                None => 0,
                Some(x) => x.as_i64().filter(|x| (0..=max).contains(x))?,
            };
            Some(ControlRequest::Apply(Apply {
                expected_generation: int("expectedGeneration", 0, max)?,
                enabled,
                rate_per_minute: int("ratePerMinute", 1, 120)?,
                cohort_percent: int("cohortPercent", 0, 100)?,
                host_cooldown_ms: int("hostCooldownMs", 60_000, 2_592_000_000)?,
                preference_max_age_ms: int("preferenceMaxAgeMs", 60_000, 2_592_000_000)?,
                not_before,
            }))
        }
        _ => None,
    }
}

/// The row after a valid `apply` (generation already checked): fields written, generation bumped;
/// enabling clears the failure count, the pause and the disabled reason.
pub fn applied(c: &Control, a: &Apply, now: i64) -> Control {
    let mut n = c.clone();
    n.generation += 1;
    n.enabled = a.enabled;
    n.rate_per_minute = a.rate_per_minute;
    n.cohort_percent = a.cohort_percent;
    n.host_cooldown_ms = a.host_cooldown_ms;
    n.preference_max_age_ms = a.preference_max_age_ms;
    n.not_before = a.not_before;
    if a.enabled {
        n.consecutive_failures = 0;
        n.paused_until = 0;
        n.disabled_reason = None;
    }
    n.updated_at = now;
    n
}

/// An automatic disable: generation bumped, `enabled` 0, the reason recorded.
pub fn disabled(c: &Control, reason: &str, now: i64) -> Control {
    let mut n = c.clone();
    n.generation += 1;
    n.enabled = false;
    n.disabled_reason = Some(reason.to_string());
    n.updated_at = now;
    n
}

// ---------------------------------------------------------------------------------------------------
// Candidates

/// The decision is still a valid preference for a host at `host_epoch` whose home is in
/// `home_region`: conclusive, preferring another region, same epoch and incumbent, policy 1,
/// unexpired and observed within the control's maximum age.
pub fn valid_preference(
    d: &Decision,
    host_epoch: i64,
    home_region: &str,
    preference_max_age_ms: i64,
    now: i64,
) -> bool {
    d.outcome == "conclusive"
        && d.preferred_region
            .as_deref()
            .is_some_and(|p| p != d.incumbent_region)
        && d.assignment_epoch == host_epoch
        && d.incumbent_region == home_region
        && d.policy_version == POLICY_VERSION
        && d.expires_at > now
        && d.observed_at
            .is_some_and(|o| o >= now - preference_max_age_ms)
}

/// The host's only lease, when it is the idle-capable control of the home's current process:
/// `control:<home>:<g>` of that incarnation, `idle_regional_rehome` = 1, renewed since the process
/// started. Returns the generation.
pub fn idle_control_generation(leases: &[Lease], home: &CellFacts) -> Option<i64> {
    let [l] = leases else { return None };
    let (cell, g) = crate::store::assignments::parse_control_id(&l.activity_id)?;
    let inc = home.incarnation.as_deref()?;
    let started = home.started_at?;
    (cell == home.cell_id
        && l.cell_id == home.cell_id
        && l.cell_incarnation.as_deref() == Some(inc)
        && l.idle_regional_rehome
        && l.renewed_at.is_some_and(|r| r >= started))
    .then_some(g)
}

/// The least-loaded rehome-eligible cell of `region` with headroom and room for `units` + 1:
/// ranking (reserved + observed) / capacity, then `cell_id`.
pub fn choose_target<'a>(
    cells: &'a [CellFacts],
    region: &str,
    units: i64,
    now: i64,
) -> Option<&'a CellFacts> {
    cells
        .iter()
        .filter(|c| {
            c.region == region
                && rehome_eligible(c, now)
                && c.headroom
                && c.reserved_requests + units < c.capacity_requests
        })
        .min_by(|a, b| {
            let la =
                (a.reserved_requests + a.observed_requests) as i128 * b.capacity_requests as i128;
            let lb =
                (b.reserved_requests + b.observed_requests) as i128 * a.capacity_requests as i128;
            la.cmp(&lb)
                .then_with(|| a.cell_id.as_bytes().cmp(b.cell_id.as_bytes()))
        })
}

/// The exact request a director dispatches and a cell commits (docs/reference/http.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RehomeRequest {
    pub attempt_id: String,
    pub user_id: String,
    pub relay_host_id: String,
    pub source_cell_id: String,
    pub source_cell_incarnation: String,
    pub source_assignment_epoch: i64,
    pub source_generation: i64,
    pub target_cell_id: String,
}

/// UUID v5 over `["<userId>","<relayHostId>","<sourceCellId>","<sourceCellIncarnation>",<epoch>,<generation>,"<targetCellId>"]`,
/// so a redelivery keeps its identity.
pub fn attempt_id(
    user_id: &str,
    relay_host_id: &str,
    source_cell_id: &str,
    source_cell_incarnation: &str,
    source_assignment_epoch: i64,
    source_generation: i64,
    target_cell_id: &str,
) -> String {
    let name = serde_json::json!([
        user_id,
        relay_host_id,
        source_cell_id,
        source_cell_incarnation,
        source_assignment_epoch,
        source_generation,
        target_cell_id
    ])
    .to_string();
    uuid::Uuid::new_v5(&ATTEMPT_NAMESPACE, name.as_bytes()).to_string()
}

/// An attempt equals the request in every stored field and is not aborted (`committed`).
pub fn attempt_matches(a: &AttemptRecord, r: &RehomeRequest) -> bool {
    a.attempt_id == r.attempt_id
        && a.user_id == r.user_id
        && a.relay_host_id == r.relay_host_id
        && a.source_cell_id == r.source_cell_id
        && a.source_cell_incarnation == r.source_cell_incarnation
        && a.previous_epoch == r.source_assignment_epoch
        && a.source_generation == r.source_generation
        && a.target_cell_id == r.target_cell_id
        && !a.aborted
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn regions() -> Vec<String> {
        vec!["us-central1".into(), "asia-east2".into(), "eu-west1".into()]
    }

    fn m(pairs: &[(&str, i64)]) -> Vec<(String, i64)> {
        pairs.iter().map(|(k, v)| (k.to_string(), *v)).collect()
    }

    #[test]
    fn cohort_bucket_hashes_the_compact_pair() {
        // The exact text hashed is the compact JSON pair.
        let text = serde_json::to_string(&["u", "h"]).unwrap();
        assert_eq!(text, r#"["u","h"]"#);
        let d = Sha256::digest(text.as_bytes());
        let want = (u32::from_be_bytes([d[0], d[1], d[2], d[3]]) % 100) as i64;
        assert_eq!(cohort_bucket("u", "h"), want);
        // Escapes: quote, backslash and control characters; other characters raw UTF-8.
        let odd = serde_json::to_string(&["a\"b\\c\u{1}é/", "x"]).unwrap();
        assert_eq!(odd, "[\"a\\\"b\\\\c\\u0001é/\",\"x\"]");
        for n in 0..200 {
            let b = cohort_bucket(&format!("user-{n}"), "abcdefghijklmnop");
            assert!((0..100).contains(&b));
        }
    }

    #[test]
    fn preference_needs_25ms_and_80_percent() {
        let r = regions();
        let us = "us-central1";
        assert_eq!(
            preferred_region(&m(&[(us, 125), ("asia-east2", 100)]), us, &r).as_deref(),
            Some("asia-east2")
        );
        // 200 / 170: 30 ms faster but 0.85 × → none.
        assert_eq!(
            preferred_region(&m(&[(us, 200), ("asia-east2", 170)]), us, &r),
            None
        );
        // 100 / 80: exactly 0.8 × but only 20 ms → none.
        assert_eq!(
            preferred_region(&m(&[(us, 100), ("asia-east2", 80)]), us, &r),
            None
        );
        // 125 / 100 is exactly 25 ms and 0.8 ×: both bounds inclusive.
        // Ties go to configuration order.
        assert_eq!(
            preferred_region(
                &m(&[(us, 300), ("eu-west1", 100), ("asia-east2", 100)]),
                us,
                &r
            )
            .as_deref(),
            Some("asia-east2")
        );
        // The lowest RTT wins.
        assert_eq!(
            preferred_region(
                &m(&[(us, 300), ("eu-west1", 90), ("asia-east2", 100)]),
                us,
                &r
            )
            .as_deref(),
            Some("eu-west1")
        );
        // Missing incumbent → none.
        assert_eq!(
            preferred_region(&m(&[("eu-west1", 90), ("asia-east2", 100)]), us, &r),
            None
        );
    }

    #[test]
    fn region_correction_schema_is_strict() {
        let r = regions();
        let ok = json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
            "outcome":"conclusive","measurements":{"us-central1":125,"asia-east2":100}});
        assert!(matches!(
            parse_region_correction(&ok, &r),
            Some(RegionCorrection::Report(_))
        ));
        assert_eq!(
            parse_region_correction(&json!({"v":1,"action":"issue-window"}), &r),
            Some(RegionCorrection::IssueWindow)
        );
        let inc = json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
            "outcome":"inconclusive","reason":"timeout"});
        assert!(parse_region_correction(&inc, &r).is_some());
        let bad = [
            json!([]),
            json!(null),
            json!({"v":2,"action":"issue-window"}),
            json!({"v":1,"action":"issue-window","x":1}),
            json!({"v":1,"action":"nope"}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":0,
                "outcome":"conclusive","measurements":{"us-central1":125,"asia-east2":100}}),
            json!({"v":1,"action":"report","generation":1.5,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"conclusive","measurements":{"us-central1":125,"asia-east2":100}}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"conclusive","measurements":{"us-central1":125}}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"conclusive","measurements":{"us-central1":125,"mars":100}}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"conclusive","measurements":{"us-central1":125,"asia-east2":120001}}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"conclusive","measurements":{"us-central1":125,"asia-east2":null}}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"conclusive","measurements":[125,100]}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"inconclusive","reason":""}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"inconclusive","reason":null}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"inconclusive","reason":"x".repeat(65)}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"inconclusive","reason":"x","measurements":{}}),
            json!({"v":1,"action":"report","generation":-1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"inconclusive","reason":"x"}),
        ];
        for b in bad {
            assert_eq!(parse_region_correction(&b, &r), None, "{b}");
        }
    }

    fn decision() -> Decision {
        Decision {
            generation: 2,
            assignment_epoch: 3,
            incumbent_region: "us-central1".into(),
            policy_version: 1,
            cohort_bucket: 5,
            outcome: "pending".into(),
            preferred_region: None,
            expires_at: 1_000,
            observed_at: None,
        }
    }

    fn report(generation: i64, epoch: i64, policy: i64) -> Report {
        Report {
            generation,
            assignment_epoch: epoch,
            policy_version: policy,
            outcome: ReportOutcome::Conclusive(m(&[("us-central1", 125), ("asia-east2", 100)])),
        }
    }

    #[test]
    fn report_status_first_match() {
        use ReportStatus::*;
        let d = decision();
        let us = "us-central1";
        assert_eq!(
            report_status(None, &report(2, 3, 1), 3, us, 0),
            BasisChanged
        );
        assert_eq!(
            report_status(Some(&d), &report(2, 3, 1), 3, us, 0),
            Accepted
        );
        assert_eq!(
            report_status(Some(&d), &report(2, 4, 1), 3, us, 0),
            BasisChanged
        );
        assert_eq!(
            report_status(Some(&d), &report(2, 3, 1), 4, us, 0),
            BasisChanged
        );
        assert_eq!(
            report_status(Some(&d), &report(2, 3, 1), 3, "asia-east2", 0),
            BasisChanged
        );
        let mut lacks = report(2, 3, 1);
        lacks.outcome = ReportOutcome::Conclusive(m(&[("eu-west1", 1), ("asia-east2", 2)]));
        assert_eq!(report_status(Some(&d), &lacks, 3, us, 0), BasisChanged);
        assert_eq!(report_status(Some(&d), &report(1, 3, 1), 3, us, 0), Stale);
        assert_eq!(report_status(Some(&d), &report(2, 3, 2), 3, us, 0), Stale);
        assert_eq!(
            report_status(Some(&d), &report(2, 3, 1), 3, us, 1_000),
            Expired
        );
        let mut done = decision();
        done.outcome = "conclusive".into();
        assert_eq!(
            report_status(Some(&done), &report(2, 3, 1), 3, us, 0),
            Duplicate
        );
        // Basis beats stale: a moved host's old-generation report is basis-changed.
        assert_eq!(
            report_status(Some(&d), &report(1, 2, 2), 3, us, 0),
            BasisChanged
        );
    }

    fn safety() -> Safety {
        Safety {
            observed_at: 100,
            ..Safety::default()
        }
    }

    #[test]
    fn clean_bounds() {
        assert!(safety_clean(&safety()));
        let cases: [fn(&mut Safety); 5] = [
            |s| s.sql_failures = 4,
            |s| s.reconnects = 21,
            |s| s.control_activity_recovery_failures = 1,
            |s| s.database_pool_waiting = 3,
            |s| s.database_pool_wait_ms_max = 1_001,
        ];
        for f in cases {
            let mut s = safety();
            f(&mut s);
            assert!(!safety_clean(&s), "{s:?}");
        }
        let mut edge = safety();
        edge.sql_failures = 3;
        edge.reconnects = 20;
        edge.database_pool_waiting = 2;
        edge.database_pool_wait_ms_max = 1_000;
        assert!(safety_clean(&edge));
    }

    #[test]
    fn merge_is_fieldwise_max_with_older_observation() {
        let a = Safety {
            observed_at: 10,
            sql_failures: 1,
            reconnects: 9,
            database_pool_total: Some(4),
            ..Safety::default()
        };
        let b = Safety {
            observed_at: 5,
            sql_failures: 3,
            reconnects: 2,
            database_pool_idle: Some(1),
            ..Safety::default()
        };
        let m = merge_safety(&a, &b);
        assert_eq!(m.observed_at, 5);
        assert_eq!((m.sql_failures, m.reconnects), (3, 9));
        assert_eq!(
            (m.database_pool_total, m.database_pool_idle),
            (Some(4), Some(1))
        );
    }

    pub(crate) fn cell(id: &str, region: &str) -> CellFacts {
        CellFacts {
            cell_id: id.into(),
            cell_url: format!("https://{id}.test"),
            region: region.into(),
            general: true,
            live: true,
            headroom: true,
            capped: false,
            capacity_requests: 100,
            reserved_requests: 0,
            observed_requests: 0,
            incarnation: Some("inc".into()),
            started_at: Some(10),
            protocol: 3,
            safety: Some(safety()),
            safety_received_at: Some(1_000),
        }
    }

    #[test]
    fn eligibility_and_fleet_safety() {
        let now = 1_500;
        let c = cell("A", "us");
        assert!(rehome_eligible(&c, now));
        assert!(
            !rehome_eligible(&c, 1_000 + SAFETY_CURRENT_MS),
            "stale safety"
        );
        let mut p2 = c.clone();
        p2.protocol = 2;
        assert!(!rehome_eligible(&p2, now));
        let mut mo = c.clone();
        mo.general = false;
        assert!(!rehome_eligible(&mo, now));
        let mut dirty = c.clone();
        dirty.safety.as_mut().unwrap().sql_failures = 9;
        assert!(!rehome_eligible(&dirty, now));
        // Fleet: a protocol-0 cell is ignored, a dirty protocol-1 cell fails it, a non-general
        // cell is ignored.
        let mut p0 = dirty.clone();
        p0.protocol = 0;
        assert!(fleet_safe(&[c.clone(), p0], now));
        let mut p1 = dirty.clone();
        p1.protocol = 1;
        assert!(!fleet_safe(&[c.clone(), p1.clone()], now));
        p1.general = false;
        assert!(fleet_safe(&[c.clone(), p1], now));
        let mut dead = c.clone();
        dead.live = false;
        assert!(!fleet_safe(&[c, dead], now));
    }

    #[test]
    fn safety_window_counts_the_last_30s() {
        let mut w = SafetyWindow::new(0);
        let r = |f: i64, waiters: i64| SafetyReading {
            totals: [f, 0, 0],
            waiting: 0,
            waiters_max: waiters,
            wait_ms_max: 0,
            pool: None,
            oldest_wait_ms: 0,
        };
        // A fresh process counts from start-up.
        assert_eq!(w.record(1_000, r(2, 0)).sql_failures, 2);
        assert_eq!(w.record(15_000, r(5, 7)).sql_failures, 5);
        let s = w.record(31_000, r(6, 0));
        assert_eq!(s.sql_failures, 4, "against the 1 s reading");
        assert_eq!(s.database_pool_waiters_max, 7);
        let s = w.record(46_000, r(6, 0));
        assert_eq!(s.sql_failures, 1, "against the 15 s reading");
        assert_eq!(
            s.database_pool_waiters_max, 0,
            "the 15 s maximum left the window"
        );
        assert_eq!(w.record(80_000, r(6, 0)).sql_failures, 0);
    }

    #[test]
    fn control_gates_and_apply() {
        let mut c = Control::default();
        assert_eq!(control_gate(&c, 10), Some("control-closed"));
        c.enabled = true;
        assert_eq!(control_gate(&c, 10), None);
        c.not_before = 11;
        assert_eq!(control_gate(&c, 10), Some("control-closed"));
        c.not_before = 0;
        c.next_dispatch_at = 11;
        assert_eq!(control_gate(&c, 10), Some("budget-closed"));
        c.next_dispatch_at = 0;
        c.paused_until = 11;
        assert_eq!(control_gate(&c, 10), Some("budget-closed"));
        assert_eq!(dispatch_interval_ms(10), 6_000);
        assert_eq!(dispatch_interval_ms(7), 8_572);
        assert_eq!(dispatch_interval_ms(120), 500);

        let mut d = disabled(&c, "failure-budget", 5);
        d.consecutive_failures = 3;
        assert_eq!((d.generation, d.enabled), (1, false));
        assert_eq!(d.disabled_reason.as_deref(), Some("failure-budget"));
        let a = Apply {
            expected_generation: 1,
            enabled: true,
            rate_per_minute: 60,
            cohort_percent: 100,
            host_cooldown_ms: 60_000,
            preference_max_age_ms: 60_000,
            not_before: 0,
        };
        let e = applied(&d, &a, 6);
        assert_eq!(e.generation, 2);
        assert_eq!((e.consecutive_failures, e.paused_until), (0, 0));
        assert_eq!(e.disabled_reason, None);
    }

    #[test]
    fn control_schema_and_confirmation() {
        let ok = json!({"v":1,"action":"apply","expectedGeneration":0,"enabled":true,"ratePerMinute":10,
            "cohortPercent":100,"hostCooldownMs":60000,"preferenceMaxAgeMs":60000,
            "confirmation":"ENABLE_REGIONAL_REHOMING"});
        assert!(matches!(
            parse_control_request(&ok),
            Some(ControlRequest::Apply(Apply { not_before: 0, .. }))
        ));
        assert_eq!(
            parse_control_request(&json!({"v":1,"action":"inspect"})),
            Some(ControlRequest::Inspect)
        );
        let mut wrong = ok.clone();
        wrong["confirmation"] = json!("DISABLE_REGIONAL_REHOMING");
        let mut dis = ok.clone();
        dis["enabled"] = json!(false);
        let mut dis_ok = dis.clone();
        dis_ok["confirmation"] = json!("DISABLE_REGIONAL_REHOMING");
        assert!(parse_control_request(&dis_ok).is_some());
        let mut nb = ok.clone();
        nb["notBefore"] = json!(null);
        let mut extra = ok.clone();
        extra["x"] = json!(1);
        let mut rate = ok.clone();
        rate["ratePerMinute"] = json!(121);
        let mut cohort = ok.clone();
        cohort["cohortPercent"] = json!(101);
        let mut cool = ok.clone();
        cool["hostCooldownMs"] = json!(59_999);
        let mut age = ok.clone();
        age["preferenceMaxAgeMs"] = json!(2_592_000_001i64);
        let mut missing = ok.clone();
        missing.as_object_mut().unwrap().remove("ratePerMinute");
        for b in [
            wrong,
            dis,
            nb,
            extra,
            rate,
            cohort,
            cool,
            age,
            missing,
            json!([]),
            json!({"v":1,"action":"inspect","x":1}),
            json!({"v":1,"action":"inspect","expectedGeneration":null}),
        ] {
            assert_eq!(parse_control_request(&b), None, "{b}");
        }
    }

    #[test]
    fn preference_validity_and_idle_control() {
        let mut d = decision();
        d.outcome = "conclusive".into();
        d.preferred_region = Some("asia-east2".into());
        d.observed_at = Some(500);
        assert!(valid_preference(&d, 3, "us-central1", 1_000, 600));
        assert!(!valid_preference(&d, 4, "us-central1", 1_000, 600));
        assert!(!valid_preference(&d, 3, "asia-east2", 1_000, 600));
        assert!(!valid_preference(&d, 3, "us-central1", 50, 600), "too old");
        assert!(
            !valid_preference(&d, 3, "us-central1", 1_000, 1_000),
            "expired"
        );
        d.preferred_region = None;
        assert!(!valid_preference(&d, 3, "us-central1", 1_000, 600));

        let home = cell("A", "us");
        let lease = Lease {
            activity_id: "control:A:4".into(),
            kind: crate::model::LeaseKind::Control,
            cell_id: "A".into(),
            request_units: 1,
            expires_at: 0,
            control_generation: Some(4),
            cell_incarnation: Some("inc".into()),
            idle_regional_rehome: true,
            renewed_at: Some(10),
        };
        assert_eq!(
            idle_control_generation(std::slice::from_ref(&lease), &home),
            Some(4)
        );
        let mut not_idle = lease.clone();
        not_idle.idle_regional_rehome = false;
        assert_eq!(idle_control_generation(&[not_idle], &home), None);
        let mut old = lease.clone();
        old.renewed_at = Some(9);
        assert_eq!(idle_control_generation(&[old], &home), None);
        let mut other_inc = lease.clone();
        other_inc.cell_incarnation = Some("x".into());
        assert_eq!(idle_control_generation(&[other_inc], &home), None);
        let splice = Lease {
            activity_id: "splice:c1".into(),
            kind: crate::model::LeaseKind::Splice,
            ..lease.clone()
        };
        assert_eq!(
            idle_control_generation(&[lease, splice], &home),
            None,
            "busy"
        );
    }

    #[test]
    fn target_is_least_loaded_eligible_with_room() {
        let now = 1_500;
        let mut b = cell("B", "asia");
        b.reserved_requests = 50;
        let c = cell("C", "asia");
        let mut d = cell("D", "asia");
        d.headroom = false;
        let a = cell("A", "us");
        let cells = vec![a, b.clone(), c, d];
        assert_eq!(choose_target(&cells, "asia", 1, now).unwrap().cell_id, "C");
        let mut full = cells.clone();
        full[2].reserved_requests = 99;
        assert_eq!(choose_target(&full, "asia", 1, now).unwrap().cell_id, "B");
        full[1].reserved_requests = 99;
        assert!(choose_target(&full, "asia", 1, now).is_none());
    }

    #[test]
    fn attempt_id_is_stable_v5() {
        let a = attempt_id("u", "h", "A", "inc", 1, 2, "C");
        assert_eq!(a, attempt_id("u", "h", "A", "inc", 1, 2, "C"));
        assert_ne!(a, attempt_id("u", "h", "A", "inc", 1, 3, "C"));
        let u = uuid::Uuid::parse_str(&a).unwrap();
        assert_eq!(u.get_version_num(), 5);
        let name = r#"["u","h","A","inc",1,2,"C"]"#;
        assert_eq!(u, uuid::Uuid::new_v5(&ATTEMPT_NAMESPACE, name.as_bytes()));
    }
}

// ---------------------------------------------------------------------------------------------------
// The director worker: poll gates, candidates, answers, the skip list. Pure; the worker in
// `director::rehome_worker` does the reads, the dispatch and the logging.

/// Poll period: 6 s ± 20 %, the default of `ORCA_RELAY_REGION_REHOME_POLL_MS`.
pub const POLL_EVERY_MS: i64 = 6_000;
/// Hosts read per poll.
pub const PAGE_LIMIT: usize = 50;
/// Dispatch timeout.
pub const DISPATCH_TIMEOUT_MS: i64 = 10_000;
/// Failures of one `attemptId` after which it is skipped, and for how long.
pub const ATTEMPT_SKIP_AFTER: u32 = 3;
pub const ATTEMPT_SKIP_MS: i64 = 900_000;
/// Entries the skip list keeps at most (: bounded memory).
pub const SKIP_LIST_MAX: usize = 1_000;

/// The jittered wait before the next poll: `every_ms` × (0.8 + 0.4·`unit`), `unit` in [0, 1).
pub fn poll_wait_ms(every_ms: i64, unit: f64) -> i64 {
    let u = unit.clamp(0.0, 1.0);
    (every_ms as f64 * (0.8 + 0.4 * u)) as i64
}

/// The second read of a wrapping page (: "continuing after the last key of the previous poll
/// and wrapping at the end"): after the first read returned `first_len` rows after `cursor`, how
/// many rows to read from the first key up to and including `cursor`; `None` when the page is
/// already complete (a full first read, or a first read that started at the first key and so saw
/// every host).
pub fn wrap_read(has_cursor: bool, first_len: usize, limit: usize) -> Option<usize> {
    (has_cursor && first_len < limit).then(|| limit - first_len)
}

/// Joins the two reads of a wrapping page into one page of at most `limit` distinct keys (a wrap
/// row whose key the page already holds is dropped, so a host never appears twice in one page
/// even if rows changed between the reads) and the next poll's cursor: the page's last key when
/// the page is full, else `None` (the page held every host, so the next one starts from the first
/// key again).
pub fn join_page<T, K: PartialEq + Clone>(
    first: Vec<T>,
    wrap: Vec<T>,
    limit: usize,
    key: impl Fn(&T) -> &K,
) -> (Vec<T>, Option<K>) {
    let mut page = first;
    page.truncate(limit);
    for row in wrap {
        if page.len() >= limit {
            break;
        }
        if !page.iter().any(|p| key(p) == key(&row)) {
            page.push(row);
        }
    }
    let cursor = if page.len() >= limit {
        page.last().map(|p| key(p).clone())
    } else {
        None
    };
    (page, cursor)
}

/// The first closed gate of a poll, in the order, or `None` when the walk may start.
/// `director_safety` is `None` when the process's own safety could not be computed.
pub fn poll_gate(
    director_safety: Option<&Safety>,
    control: &Control,
    open_idle_migrations: i64,
    fleet_ok: bool,
    now: i64,
) -> Option<&'static str> {
    if director_safety.is_none_or(|s| !safety_valid(s)) {
        return Some("process-safety-unavailable");
    }
    if !control.enabled || control.not_before > now {
        return Some("control-closed");
    }
    if control.cohort_percent == 0 {
        return Some("cohort-zero");
    }
    if control.paused_until > now || control.next_dispatch_at > now {
        return Some("budget-closed");
    }
    if open_idle_migrations >= MAX_OPEN_IDLE_MIGRATIONS {
        return Some("concurrency-limit");
    }
    if !fleet_ok {
        return Some("fleet-safety");
    }
    None
}

/// What the worker reads of one host of the page.
#[derive(Debug, Clone)]
pub struct HostFacts<'a> {
    pub user_id: &'a str,
    pub relay_host_id: &'a str,
    /// The home cell id and the row's epoch.
    pub home_cell_id: &'a str,
    pub assignment_epoch: i64,
    pub decision: &'a Decision,
    /// The host's leases (empty for [`prefilter`], which decides without them).
    pub leases: &'a [Lease],
    pub open_migration: bool,
    /// `created_at` of the host's latest attempt.
    pub latest_attempt_at: Option<i64>,
}

/// A selected candidate: the exact request to dispatch and where to send it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Candidate {
    pub request: RehomeRequest,
    pub source_cell_url: String,
}

/// The checks of that need only the page row, the cells and the control: a valid preference
/// in cohort, a rehome-eligible home in the director's region, and some target. Lets the worker
/// skip the per-host reads of hosts that cannot be candidates.
pub fn prefilter(
    h: &HostFacts<'_>,
    cells: &[CellFacts],
    control: &Control,
    director_region: &str,
    now: i64,
) -> bool {
    home_and_target(h, cells, control, director_region, 1, now).is_some()
}

fn home_and_target<'a>(
    h: &HostFacts<'_>,
    cells: &'a [CellFacts],
    control: &Control,
    director_region: &str,
    units: i64,
    now: i64,
) -> Option<(&'a CellFacts, &'a CellFacts)> {
    let home = cells.iter().find(|c| c.cell_id == h.home_cell_id)?;
    let d = h.decision;
    let ok = home.region == director_region
        && rehome_eligible(home, now)
        && valid_preference(
            d,
            h.assignment_epoch,
            &home.region,
            control.preference_max_age_ms,
            now,
        )
        && d.cohort_bucket < control.cohort_percent;
    if !ok {
        return None;
    }
    let target = choose_target(cells, d.preferred_region.as_deref()?, units, now)?;
    Some((home, target))
}

/// The full candidate rule: [`prefilter`], exactly one lease (the idle-capable control of
/// the home's current process), no open migration, no attempt within the cooldown, and a target
/// with headroom and room for the host's units + 1. Read-only: proves nothing about idleness.
pub fn candidate(
    h: &HostFacts<'_>,
    cells: &[CellFacts],
    control: &Control,
    director_region: &str,
    now: i64,
) -> Option<Candidate> {
    let units: i64 = h.leases.iter().map(|l| l.request_units).sum();
    let (home, target) = home_and_target(h, cells, control, director_region, units, now)?;
    let generation = idle_control_generation(h.leases, home)?;
    if h.open_migration
        || h.latest_attempt_at
            .is_some_and(|t| t > now - control.host_cooldown_ms)
    {
        return None;
    }
    let incarnation = home.incarnation.clone()?;
    Some(Candidate {
        request: RehomeRequest {
            attempt_id: attempt_id(
                h.user_id,
                h.relay_host_id,
                &home.cell_id,
                &incarnation,
                h.assignment_epoch,
                generation,
                &target.cell_id,
            ),
            user_id: h.user_id.to_string(),
            relay_host_id: h.relay_host_id.to_string(),
            source_cell_id: home.cell_id.clone(),
            source_cell_incarnation: incarnation,
            source_assignment_epoch: h.assignment_epoch,
            source_generation: generation,
            target_cell_id: target.cell_id.clone(),
        },
        source_cell_url: home.cell_url.clone(),
    })
}

/// The `host-idle-rehome` body of docs/reference/http.md for a candidate.
pub fn dispatch_body(r: &RehomeRequest, cohort_percent: i64, director_safety: &Safety) -> Json {
    serde_json::json!({
        "v": 1,
        "attemptId": r.attempt_id,
        "userId": r.user_id,
        "relayHostId": r.relay_host_id,
        "sourceCellId": r.source_cell_id,
        "sourceCellIncarnation": r.source_cell_incarnation,
        "sourceAssignmentEpoch": r.source_assignment_epoch,
        "sourceGeneration": r.source_generation,
        "targetCellId": r.target_cell_id,
        "cohortPercent": cohort_percent,
        "directorSafety": director_safety,
    })
}

/// Deferral reasons that are global: the worker stops its walk.
pub const STOPPING_DEFERRALS: [&str; 6] = [
    "control-closed",
    "budget-closed",
    "concurrency-limit",
    "cohort-closed",
    "fleet-safety",
    "director-safety-stale",
];

/// Every deferral reason a cell may send (docs/reference/http.md).
const DEFERRAL_REASONS: [&str; 8] = [
    "control-closed",
    "budget-closed",
    "concurrency-limit",
    "cohort-closed",
    "fleet-safety",
    "candidate-ineligible",
    "host-unsupported",
    "director-safety-stale",
];

/// A cell's answer to a dispatch, as the answer table of sorts it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DispatchAnswer {
    Committed,
    /// `deferred` with a global reason: stop the walk.
    Stop(&'static str),
    /// `busy`, `stale`, another `deferred`, or 409 `regional_rehome_source_generation_mismatch`:
    /// try the next candidate. The tag is the summary bucket.
    Next(&'static str),
    /// Transport error or timeout: ambiguous, no failure counted.
    Ambiguous,
    /// Another status or a malformed body: one failure counted.
    Failed,
}

/// Sorts a cell's answer: `status` and the body bytes (strict: exactly `{v:1,outcome}` or
/// `{v:1,outcome:"deferred",reason}` with a known outcome and reason).
pub fn classify_answer(status: u16, body: &[u8]) -> DispatchAnswer {
    let Ok(v) = serde_json::from_slice::<Json>(body) else {
        return DispatchAnswer::Failed;
    };
    let Some(o) = v.as_object() else {
        return DispatchAnswer::Failed;
    };
    if status == 409 {
        return if o.len() == 1
            && o.get("error").and_then(Json::as_str)
                == Some("regional_rehome_source_generation_mismatch")
        {
            DispatchAnswer::Next("stale")
        } else {
            DispatchAnswer::Failed
        };
    }
    if status != 200 || o.get("v").and_then(Json::as_i64) != Some(1) {
        return DispatchAnswer::Failed;
    }
    let outcome = o.get("outcome").and_then(Json::as_str);
    let reason = o.get("reason").map(|r| r.as_str());
    match (outcome, reason, o.len()) {
        (Some("committed"), None, 2) => DispatchAnswer::Committed,
        (Some("busy"), None, 2) => DispatchAnswer::Next("busy"),
        (Some("stale"), None, 2) => DispatchAnswer::Next("stale"),
        (Some("deferred"), Some(Some(r)), 3) => match DEFERRAL_REASONS.iter().find(|k| **k == r) {
            Some(k) if STOPPING_DEFERRALS.contains(k) => DispatchAnswer::Stop(k),
            Some(_) => DispatchAnswer::Next("deferred"),
            None => DispatchAnswer::Failed,
        },
        _ => DispatchAnswer::Failed,
    }
}

/// Counted failures per `attemptId` and the attempts skipped after 3 of them, for 15 min. At most
/// [`SKIP_LIST_MAX`] entries: expired entries go first, then the oldest still counting, then the
/// oldest skip.
#[derive(Debug, Default, Clone)]
pub struct SkipList {
    /// attemptId → (failures, last failure at, skipped until).
    entries: std::collections::HashMap<String, (u32, i64, i64)>,
}

impl SkipList {
    /// True while `attempt_id` is skipped.
    pub fn skipped(&self, attempt_id: &str, now: i64) -> bool {
        self.entries
            .get(attempt_id)
            .is_some_and(|(_, _, until)| *until > now)
    }

    /// Records a counted failure; true when it starts a skip.
    pub fn failed(&mut self, attempt_id: &str, now: i64) -> bool {
        if !self.entries.contains_key(attempt_id) && self.entries.len() >= SKIP_LIST_MAX {
            self.entries
                .retain(|_, (_, last, until)| *until > now || *last > now - ATTEMPT_SKIP_MS);
            if self.entries.len() >= SKIP_LIST_MAX {
                // Counting entries go before running skips, the oldest first.
                let oldest = self
                    .entries
                    .iter()
                    .min_by_key(|(_, (_, last, until))| (*until > now, *last))
                    .map(|(k, _)| k.clone());
                if let Some(k) = oldest {
                    self.entries.remove(&k);
                }
            }
        }
        let e = self
            .entries
            .entry(attempt_id.to_string())
            .or_insert((0, now, 0));
        if e.2 > 0 && e.2 <= now {
            // A served skip starts the count again.
            *e = (0, now, 0);
        }
        e.0 += 1;
        e.1 = now;
        if e.0 >= ATTEMPT_SKIP_AFTER {
            e.2 = now + ATTEMPT_SKIP_MS;
            e.0 = 0;
            return true;
        }
        false
    }

    /// Forgets an attempt that got a definite answer.
    pub fn answered(&mut self, attempt_id: &str) {
        self.entries.remove(attempt_id);
    }

    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }
}

/// Per-poll counts of the summary line.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct PollSummary {
    pub candidates: usize,
    pub dispatched: usize,
    pub committed: usize,
    pub busy: usize,
    pub deferred: usize,
    pub stale: usize,
    /// Counted failures and ambiguous (timed-out or lost) dispatches.
    pub failed: usize,
}

impl PollSummary {
    /// The fields of `orca_relay_idle_rehome_dispatch_summary` (counts only, never a host).
    pub fn fields(&self, stopped_by: &str) -> Json {
        serde_json::json!({
            "candidates": self.candidates,
            "dispatched": self.dispatched,
            "stoppedBy": stopped_by,
            "outcomes": {
                "committed": self.committed,
                "busy": self.busy,
                "deferred": self.deferred,
                "stale": self.stale,
                "failed": self.failed,
            },
        })
    }
}

#[cfg(test)]
mod worker_tests {
    use super::tests::cell;
    use super::*;
    use serde_json::json;

    const NOW: i64 = 1_500;

    fn open_control() -> Control {
        Control {
            enabled: true,
            cohort_percent: 100,
            host_cooldown_ms: 60_000,
            ..Control::default()
        }
    }

    fn clean() -> Safety {
        Safety {
            observed_at: NOW,
            ..Safety::default()
        }
    }

    #[test]
    fn poll_gates_in_spec_order() {
        let c = open_control();
        let s = clean();
        assert_eq!(poll_gate(Some(&s), &c, 0, true, NOW), None);
        assert_eq!(
            poll_gate(None, &Control::default(), 9, false, NOW),
            Some("process-safety-unavailable")
        );
        let mut bad = s.clone();
        bad.database_pool_waiting = 101;
        assert_eq!(
            poll_gate(Some(&bad), &c, 0, true, NOW),
            Some("process-safety-unavailable")
        );
        let mut off = c.clone();
        off.enabled = false;
        off.cohort_percent = 0;
        assert_eq!(
            poll_gate(Some(&s), &off, 9, false, NOW),
            Some("control-closed")
        );
        let mut later = c.clone();
        later.not_before = NOW + 1;
        assert_eq!(
            poll_gate(Some(&s), &later, 0, true, NOW),
            Some("control-closed")
        );
        let mut zero = c.clone();
        zero.cohort_percent = 0;
        zero.paused_until = NOW + 1;
        assert_eq!(
            poll_gate(Some(&s), &zero, 9, false, NOW),
            Some("cohort-zero")
        );
        let mut paused = c.clone();
        paused.paused_until = NOW + 1;
        assert_eq!(
            poll_gate(Some(&s), &paused, 9, false, NOW),
            Some("budget-closed")
        );
        let mut rate = c.clone();
        rate.next_dispatch_at = NOW + 1;
        assert_eq!(
            poll_gate(Some(&s), &rate, 0, true, NOW),
            Some("budget-closed")
        );
        rate.next_dispatch_at = NOW;
        assert_eq!(poll_gate(Some(&s), &rate, 0, true, NOW), None, "due now");
        assert_eq!(
            poll_gate(Some(&s), &c, 8, false, NOW),
            Some("concurrency-limit")
        );
        assert_eq!(poll_gate(Some(&s), &c, 7, false, NOW), Some("fleet-safety"));
    }

    #[test]
    fn poll_wait_is_6s_plus_minus_20_percent() {
        assert_eq!(poll_wait_ms(POLL_EVERY_MS, 0.0), 4_800);
        assert_eq!(poll_wait_ms(POLL_EVERY_MS, 0.5), 6_000);
        assert!(poll_wait_ms(POLL_EVERY_MS, 0.999_999) <= 7_200);
        assert_eq!(poll_wait_ms(POLL_EVERY_MS, 7.0), 7_200, "clamped");
        // A configured period keeps the ±20 % jitter.
        assert_eq!(poll_wait_ms(500, 0.0), 400);
        assert_eq!(poll_wait_ms(500, 1.0), 600);
    }

    /// Keys 1..=n in key order.
    fn keys(from: u32, to: u32) -> Vec<u32> {
        (from..=to).collect()
    }

    /// One poll of the wrapping page over the key set `all` (sorted), as the worker composes it:
    /// the read after the cursor, the wrap read when [`wrap_read`] asks for one, [`join_page`].
    fn poll(all: &[u32], cursor: Option<u32>, limit: usize) -> (Vec<u32>, Option<u32>) {
        let first: Vec<u32> = all
            .iter()
            .copied()
            .filter(|k| cursor.is_none_or(|c| *k > c))
            .take(limit)
            .collect();
        let wrap: Vec<u32> = match wrap_read(cursor.is_some(), first.len(), limit) {
            Some(n) => all
                .iter()
                .copied()
                .filter(|k| cursor.is_some_and(|c| *k <= c))
                .take(n)
                .collect(),
            None => vec![],
        };
        join_page(first, wrap, limit, |k| k)
    }

    #[test]
    fn wrap_read_only_for_a_short_read_after_a_cursor() {
        assert_eq!(wrap_read(false, 3, 50), None, "from the first key: saw all");
        assert_eq!(wrap_read(true, 50, 50), None, "full page");
        assert_eq!(wrap_read(true, 3, 50), Some(47));
        assert_eq!(wrap_read(true, 0, 50), Some(50), "cursor at the last key");
    }

    /// 53 hosts: every poll sees 50 distinct hosts, the cursor walks on from the page's last key,
    /// and no host goes unseen for more than two polls (the short-page problem: 1..50, 51..53,
    /// 1..50, … would see 51..53 alone every other poll).
    #[test]
    fn pages_wrap_with_50_distinct_hosts_each() {
        let all = keys(1, 53);
        let (p1, c1) = poll(&all, None, 50);
        assert_eq!(p1, keys(1, 50));
        assert_eq!(c1, Some(50));
        let (p2, c2) = poll(&all, c1, 50);
        let mut want = keys(51, 53);
        want.extend(keys(1, 47));
        assert_eq!(p2, want, "the short read is filled from the first key");
        assert_eq!(c2, Some(47));
        let (p3, c3) = poll(&all, c2, 50);
        let mut want = keys(48, 53);
        want.extend(keys(1, 44));
        assert_eq!(p3, want);
        assert_eq!(c3, Some(44));
        let mut cursor = None;
        let mut last_seen = vec![0usize; 54];
        for n in 1..=200 {
            let (page, next) = poll(&all, cursor, 50);
            assert_eq!(page.len(), 50, "poll {n}");
            let mut distinct = page.clone();
            distinct.sort();
            distinct.dedup();
            assert_eq!(distinct.len(), 50, "poll {n}: a host repeated in one page");
            for k in page {
                last_seen[k as usize] = n;
            }
            for k in &all {
                assert!(
                    n - last_seen[*k as usize] < 2,
                    "host {k} unseen for 2 polls"
                );
            }
            cursor = next;
        }
    }

    #[test]
    fn fewer_hosts_than_a_page_are_all_read_each_poll() {
        let all = keys(1, 7);
        let (p, c) = poll(&all, None, 50);
        assert_eq!((p, c), (keys(1, 7), None));
        // A cursor left by an earlier, larger set: after it, then from the first key, once each.
        let (p, c) = poll(&all, Some(4), 50);
        let mut want = keys(5, 7);
        want.extend(keys(1, 4));
        assert_eq!((p, c), (want, None));
        let (p, c) = poll(&[], Some(4), 50);
        assert_eq!((p, c), (vec![], None));
    }

    #[test]
    fn join_page_never_repeats_a_key_and_caps_the_page() {
        // Rows inserted between the two reads may show up in both: kept once.
        let (p, c) = join_page(vec![5, 6], vec![1, 5, 6, 2], 50, |k: &u32| k);
        assert_eq!((p, c), (vec![5, 6, 1, 2], None));
        let (p, c) = join_page(vec![8, 9], vec![1, 2, 3], 3, |k: &u32| k);
        assert_eq!((p, c), (vec![8, 9, 1], Some(1)));
        let (p, c) = join_page(keys(1, 60), vec![], 50, |k: &u32| k);
        assert_eq!((p.len(), c), (50, Some(50)));
    }

    fn decision() -> Decision {
        Decision {
            generation: 1,
            assignment_epoch: 3,
            incumbent_region: "us".into(),
            policy_version: 1,
            cohort_bucket: 42,
            outcome: "conclusive".into(),
            preferred_region: Some("asia".into()),
            expires_at: NOW + 1_000,
            observed_at: Some(NOW - 100),
        }
    }

    fn control_lease(generation: i64) -> Lease {
        Lease {
            activity_id: format!("control:A:{generation}"),
            kind: crate::model::LeaseKind::Control,
            cell_id: "A".into(),
            request_units: 1,
            expires_at: NOW + 60_000,
            control_generation: Some(generation),
            cell_incarnation: Some("inc".into()),
            idle_regional_rehome: true,
            renewed_at: Some(10),
        }
    }

    fn cells() -> Vec<CellFacts> {
        let mut b = cell("B", "asia");
        b.reserved_requests = 10;
        vec![cell("A", "us"), b, cell("C", "asia")]
    }

    fn facts<'a>(d: &'a Decision, leases: &'a [Lease]) -> HostFacts<'a> {
        HostFacts {
            user_id: "u",
            relay_host_id: "h",
            home_cell_id: "A",
            assignment_epoch: 3,
            decision: d,
            leases,
            open_migration: false,
            latest_attempt_at: None,
        }
    }

    #[test]
    fn a_candidate_carries_the_exact_request() {
        let d = decision();
        let leases = [control_lease(7)];
        let c = candidate(&facts(&d, &leases), &cells(), &open_control(), "us", NOW)
            .expect("candidate");
        assert_eq!(c.source_cell_url, "https://A.test");
        let r = &c.request;
        assert_eq!(
            (
                r.source_cell_id.as_str(),
                r.source_cell_incarnation.as_str(),
                r.source_assignment_epoch,
                r.source_generation,
                r.target_cell_id.as_str()
            ),
            ("A", "inc", 3, 7, "C"),
            "C is less loaded than B"
        );
        assert_eq!(r.attempt_id, attempt_id("u", "h", "A", "inc", 3, 7, "C"));
        assert!(prefilter(
            &facts(&d, &[]),
            &cells(),
            &open_control(),
            "us",
            NOW
        ));
    }

    #[test]
    fn every_candidate_condition_excludes() {
        let d = decision();
        let leases = [control_lease(7)];
        let ctl = open_control();
        let cs = cells();
        let none = |f: &HostFacts<'_>, cs: &[CellFacts], ctl: &Control, region: &str| {
            candidate(f, cs, ctl, region, NOW).is_none()
        };
        // Another director region.
        assert!(none(&facts(&d, &leases), &cs, &ctl, "asia"));
        // Home not rehome-eligible (protocol 2), or unknown.
        let mut p2 = cs.clone();
        p2[0].protocol = 2;
        assert!(none(&facts(&d, &leases), &p2, &ctl, "us"));
        let mut unknown = facts(&d, &leases);
        unknown.home_cell_id = "Z";
        assert!(none(&unknown, &cs, &ctl, "us"));
        // Decision: other epoch, inconclusive, expired, too old, same region, bucket ≥ cohort.
        let mut epoch = facts(&d, &leases);
        epoch.assignment_epoch = 4;
        assert!(none(&epoch, &cs, &ctl, "us"));
        for f in [
            (|d: &mut Decision| d.outcome = "inconclusive".into()) as fn(&mut Decision),
            |d| d.expires_at = NOW,
            |d| d.observed_at = Some(NOW - 86_400_001),
            |d| d.preferred_region = Some("us".into()),
            |d| d.policy_version = 2,
        ] {
            let mut dd = decision();
            f(&mut dd);
            assert!(none(&facts(&dd, &leases), &cs, &ctl, "us"), "{dd:?}");
            assert!(!prefilter(&facts(&dd, &[]), &cs, &ctl, "us", NOW));
        }
        let mut cohort = ctl.clone();
        cohort.cohort_percent = 42;
        assert!(
            none(&facts(&d, &leases), &cs, &cohort, "us"),
            "bucket 42 ≥ 42"
        );
        cohort.cohort_percent = 43;
        assert!(!none(&facts(&d, &leases), &cs, &cohort, "us"));
        // Leases: none, two, a splice, another incarnation.
        assert!(none(&facts(&d, &[]), &cs, &ctl, "us"));
        let two = [control_lease(7), control_lease(8)];
        assert!(none(&facts(&d, &two), &cs, &ctl, "us"));
        let mut other = control_lease(7);
        other.cell_incarnation = Some("old".into());
        assert!(none(&facts(&d, &[other]), &cs, &ctl, "us"));
        // Open migration; an attempt within the cooldown (but not one just outside it).
        let mut mig = facts(&d, &leases);
        mig.open_migration = true;
        assert!(none(&mig, &cs, &ctl, "us"));
        let mut recent = facts(&d, &leases);
        recent.latest_attempt_at = Some(NOW - 59_999);
        assert!(none(&recent, &cs, &ctl, "us"));
        recent.latest_attempt_at = Some(NOW - 60_000);
        assert!(!none(&recent, &cs, &ctl, "us"));
        // No target: the preferred region's cells are full, without headroom or not eligible.
        let mut full = cs.clone();
        full[1].reserved_requests = 99;
        full[2].headroom = false;
        assert!(none(&facts(&d, &leases), &full, &ctl, "us"));
        assert!(!prefilter(&facts(&d, &[]), &full, &ctl, "us", NOW));
        let mut dirty = cs.clone();
        dirty[1].live = false;
        dirty[2].safety_received_at = Some(NOW - SAFETY_CURRENT_MS);
        assert!(none(&facts(&d, &leases), &dirty, &ctl, "us"));
    }

    #[test]
    fn the_answer_table() {
        use DispatchAnswer::*;
        let ok = |b: &str| classify_answer(200, b.as_bytes());
        assert_eq!(ok(r#"{"v":1,"outcome":"committed"}"#), Committed);
        assert_eq!(ok(r#"{"v":1,"outcome":"busy"}"#), Next("busy"));
        assert_eq!(ok(r#"{"v":1,"outcome":"stale"}"#), Next("stale"));
        for r in STOPPING_DEFERRALS {
            assert_eq!(
                ok(&format!(r#"{{"v":1,"outcome":"deferred","reason":"{r}"}}"#)),
                Stop(r)
            );
        }
        for r in ["candidate-ineligible", "host-unsupported"] {
            assert_eq!(
                ok(&format!(r#"{{"v":1,"outcome":"deferred","reason":"{r}"}}"#)),
                Next("deferred")
            );
        }
        assert_eq!(
            classify_answer(
                409,
                br#"{"error":"regional_rehome_source_generation_mismatch"}"#
            ),
            Next("stale")
        );
        // Everything else is a counted failure.
        for (status, body) in [
            (500, r#"{"error":"internal"}"#),
            (503, r#"{"error":"database_temporarily_unavailable"}"#),
            (409, r#"{"error":"other"}"#),
            (401, r#"{"error":"invalid_token"}"#),
            (200, "not json"),
            (200, "[]"),
            (200, r#"{"v":2,"outcome":"committed"}"#),
            (200, r#"{"v":1,"outcome":"moved"}"#),
            (200, r#"{"v":1,"outcome":"committed","x":1}"#),
            (200, r#"{"v":1,"outcome":"busy","reason":"x"}"#),
            (200, r#"{"v":1,"outcome":"deferred"}"#),
            (200, r#"{"v":1,"outcome":"deferred","reason":"sunspots"}"#),
            (200, r#"{"v":1,"outcome":"deferred","reason":null}"#),
            (204, ""),
        ] {
            assert_eq!(
                classify_answer(status, body.as_bytes()),
                Failed,
                "{status} {body}"
            );
        }
    }

    #[test]
    fn skip_after_three_failures_for_15_min() {
        let mut s = SkipList::default();
        assert!(!s.failed("a", 0));
        assert!(!s.failed("a", 1));
        assert!(!s.skipped("a", 2));
        assert!(s.failed("a", 2), "third failure starts the skip");
        assert!(s.skipped("a", 2 + ATTEMPT_SKIP_MS - 1));
        assert!(!s.skipped("a", 2 + ATTEMPT_SKIP_MS));
        assert!(!s.failed("a", 2 + ATTEMPT_SKIP_MS), "counting starts again");
        // A definite answer forgets the failures.
        s.failed("b", 0);
        s.failed("b", 0);
        s.answered("b");
        assert!(!s.failed("b", 0));
    }

    #[test]
    fn skip_list_is_bounded() {
        let mut s = SkipList::default();
        for i in 0..(SKIP_LIST_MAX as i64 + 500) {
            s.failed(&format!("a{i}"), i);
        }
        assert_eq!(s.len(), SKIP_LIST_MAX);
        // A skipped entry survives new failures when older unskipped ones can go.
        let mut s = SkipList::default();
        for _ in 0..3 {
            s.failed("keep", 0);
        }
        for i in 0..(SKIP_LIST_MAX as i64 * 2) {
            s.failed(&format!("x{i}"), 1 + i);
        }
        assert_eq!(s.len(), SKIP_LIST_MAX);
        assert!(s.skipped("keep", 3_000));
    }

    #[test]
    fn dispatch_body_is_the_section_13_body() {
        let r = RehomeRequest {
            attempt_id: attempt_id("u", "h", "A", "inc", 3, 7, "C"),
            user_id: "u".into(),
            relay_host_id: "h".into(),
            source_cell_id: "A".into(),
            source_cell_incarnation: "inc".into(),
            source_assignment_epoch: 3,
            source_generation: 7,
            target_cell_id: "C".into(),
        };
        let b = dispatch_body(&r, 100, &clean());
        let mut keys: Vec<&str> = b.as_object().unwrap().keys().map(|k| k.as_str()).collect();
        keys.sort();
        assert_eq!(
            keys,
            [
                "attemptId",
                "cohortPercent",
                "directorSafety",
                "relayHostId",
                "sourceAssignmentEpoch",
                "sourceCellId",
                "sourceCellIncarnation",
                "sourceGeneration",
                "targetCellId",
                "userId",
                "v"
            ]
        );
        assert_eq!(b["directorSafety"]["observedAt"], json!(NOW));
        assert!(b["directorSafety"].get("databasePoolTotal").is_none());
    }

    #[test]
    fn summary_holds_counts_only() {
        let s = PollSummary {
            candidates: 3,
            dispatched: 2,
            busy: 1,
            committed: 1,
            ..PollSummary::default()
        };
        assert_eq!(
            s.fields("committed"),
            json!({"candidates":3,"dispatched":2,"stoppedBy":"committed",
                "outcomes":{"committed":1,"busy":1,"deferred":0,"stale":0,"failed":0}})
        );
    }
}
