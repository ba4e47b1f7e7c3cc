//! Region correction on `/v1/assign` and the `regional-rehome-control` route (docs/reference/http.md,
//!): D-61..D-64 and the strict-schema rules, on SQLite and (when configured) Postgres.

mod support;

use orca_relay::store::testing::backends;
use serde_json::{json, Value};
use support::director::*;

const US: &str = "us-central1";
const ASIA: &str = "asia-east2";

/// `/v1/assign`, retried while the lane's per-host interval (1 ms here) rejects it: requests for
/// one host may arrive faster than that.
async fn assign(d: &Dir, h: &Host, body: Value) -> Resp {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    loop {
        let r = d.assign(h, body.clone()).await;
        if r.status != 503 || std::time::Instant::now() > deadline {
            return r;
        }
        tokio::time::sleep(std::time::Duration::from_millis(3)).await;
    }
}

async fn two_regions(d: &Dir) {
    d.fast_lanes();
    d.register("A", US, false).await;
    d.register("C", ASIA, false).await;
    d.hb("A", US, true, &uuid(), 1, false).await;
    d.hb("C", ASIA, true, &uuid(), 1, false).await;
}

async fn window(d: &Dir, h: &Host) -> Value {
    let r = assign(
        d,
        h,
        json!({"regionCorrection":{"v":1,"action":"issue-window"}}),
    )
    .await;
    assert_eq!(
        r.status,
        200,
        "{:?} {:?}",
        r.body,
        lines_with(&["rejected"])
    );
    r.body["regionCorrection"]["window"].clone()
}

fn conclusive(w: &Value, us: i64, asia: i64) -> Value {
    json!({"regionCorrection":{"v":1,"action":"report","generation":w["generation"],
        "assignmentEpoch":w["assignmentEpoch"],"policyVersion":1,"outcome":"conclusive",
        "measurements":{US:us, ASIA:asia}}})
}

async fn report(d: &Dir, h: &Host, body: Value) -> String {
    let r = assign(d, h, body).await;
    assert_eq!(
        r.status,
        200,
        "{:?} {:?}",
        r.body,
        logs().iter().rev().take(5).collect::<Vec<_>>()
    );
    r.body["regionCorrection"]["reportStatus"]
        .as_str()
        .unwrap()
        .to_string()
}

/// D-61: `issue-window` → generation 1 with the grant's epoch, the incumbent region, policy 1 and
/// a 24 h expiry; again → generation 2.
#[tokio::test]
async fn d61_issue_window_generations() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        two_regions(&d).await;
        let h = d.host("u61").await;
        let before = now();
        let r = d
            .assign(
                &h,
                json!({"regionCorrection":{"v":1,"action":"issue-window"}}),
            )
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let w = &r.body["regionCorrection"]["window"];
        assert_eq!(r.body["regionCorrection"]["v"], 1);
        assert_eq!(w["generation"], 1);
        assert_eq!(w["assignmentEpoch"], r.body["assignmentEpoch"]);
        assert_eq!(w["incumbentRegion"], US);
        assert_eq!(w["policyVersion"], 1);
        let exp = w["expiresAt"].as_i64().unwrap();
        assert!(exp >= before + 86_400_000 && exp <= now() + 86_400_000);
        let w2 = window(&d, &h).await;
        assert_eq!(w2["generation"], 2);
        let wa = d.whereabouts(&h).await;
        assert_eq!(wa["regionDecision"]["generation"], 2);
        assert_eq!(wa["regionDecision"]["outcome"], "pending");
        let bucket = wa["regionDecision"]["cohortBucket"].as_i64().unwrap();
        assert_eq!(
            bucket,
            orca_relay::rehome::rules::cohort_bucket(&h.user, &h.id)
        );
        d.shutdown().await;
    }
}

/// D-62: a conclusive 125/100 report → `accepted`, `whereabouts` prefers asia; the same report
/// again → `duplicate` (the first report is immutable).
#[tokio::test]
async fn d62_report_accepted_then_duplicate() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        two_regions(&d).await;
        let h = d.host("u62").await;
        let w = window(&d, &h).await;
        assert_eq!(report(&d, &h, conclusive(&w, 125, 100)).await, "accepted");
        let wa = d.whereabouts(&h).await;
        assert_eq!(wa["regionDecision"]["preferredRegion"], ASIA);
        assert_eq!(wa["regionDecision"]["outcome"], "conclusive");
        assert!(wa["regionDecision"]["observedAt"].as_i64().is_some());
        assert_eq!(report(&d, &h, conclusive(&w, 125, 100)).await, "duplicate");
        // An inconclusive one after it changes nothing either.
        let inc = json!({"regionCorrection":{"v":1,"action":"report","generation":w["generation"],
            "assignmentEpoch":w["assignmentEpoch"],"policyVersion":1,"outcome":"inconclusive","reason":"probe-timeout"}});
        assert_eq!(report(&d, &h, inc).await, "duplicate");
        assert_eq!(
            d.whereabouts(&h).await["regionDecision"]["preferredRegion"],
            ASIA
        );
        d.shutdown().await;
    }
}

/// D-63: 200/170 → accepted without a preference; inconclusive → accepted; an older generation →
/// stale; `policyVersion` 2 → stale; a report after the host moved → basis-changed.
#[tokio::test]
async fn d63_report_statuses() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        two_regions(&d).await;
        let h = d.host("u63").await;
        let w = window(&d, &h).await;
        assert_eq!(report(&d, &h, conclusive(&w, 200, 170)).await, "accepted");
        assert_eq!(
            d.whereabouts(&h).await["regionDecision"]["preferredRegion"],
            Value::Null
        );
        let w = window(&d, &h).await;
        let inc = json!({"regionCorrection":{"v":1,"action":"report","generation":w["generation"],
            "assignmentEpoch":w["assignmentEpoch"],"policyVersion":1,"outcome":"inconclusive","reason":"probe-timeout"}});
        assert_eq!(report(&d, &h, inc).await, "accepted");
        assert_eq!(
            d.whereabouts(&h).await["regionDecision"]["outcome"],
            "inconclusive"
        );
        let old = window(&d, &h).await;
        let w = window(&d, &h).await;
        assert_eq!(report(&d, &h, conclusive(&old, 125, 100)).await, "stale");
        let mut p2 = conclusive(&w, 125, 100);
        p2["regionCorrection"]["policyVersion"] = json!(2);
        assert_eq!(report(&d, &h, p2).await, "stale");
        // Expired window.
        d.db.execute(
            "UPDATE relay_region_decisions SET expires_at = $1",
            &[(now() - 1).into()],
        )
        .await
        .unwrap();
        assert_eq!(report(&d, &h, conclusive(&w, 125, 100)).await, "expired");
        // The host moves (its home dies; uncapped → forced move): basis-changed.
        let w = window(&d, &h).await;
        d.register("B", US, false).await;
        d.hb("B", US, true, &uuid(), 1, false).await;
        d.hb("A", US, false, &uuid(), 2, false).await;
        let moved = assign(&d, &h, json!({})).await;
        assert_eq!(moved.status, 200, "{:?}", moved.body);
        assert_ne!(moved.body["assignmentEpoch"], w["assignmentEpoch"]);
        assert_eq!(
            report(&d, &h, conclusive(&w, 125, 100)).await,
            "basis-changed"
        );
        // A report for a host without a row is 409.
        let stranger = d.host("nobody").await;
        let r = assign(&d, &stranger, conclusive(&w, 125, 100)).await;
        assert_eq!((r.status, r.error()), (409, "assignment_not_found"));
        d.shutdown().await;
    }
}

/// D-64: `inspect` → the defaults; `apply` with `expectedGeneration` 5 → 409; `enabled:true` with
/// the disable confirmation → 400; a valid apply → generation 1; outcomes count without identities.
#[tokio::test]
async fn d64_control_inspect_apply() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        let r = d
            .admin("regional-rehome-control", json!({"v":1,"action":"inspect"}))
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        let c = &r.body["control"];
        assert_eq!(c["generation"], 0);
        assert_eq!(c["enabled"], false);
        assert_eq!(c["ratePerMinute"], 10);
        assert_eq!(c["cohortPercent"], 0);
        assert_eq!(c["hostCooldownMs"], 604_800_000i64);
        assert_eq!(c["preferenceMaxAgeMs"], 86_400_000);
        assert_eq!(c["disabledReason"], Value::Null);
        assert_eq!(r.body["outcomes"]["attempts"]["committed"], 0);
        let apply = |g: i64, enabled: bool, confirmation: &str| {
            json!({"v":1,"action":"apply","expectedGeneration":g,"enabled":enabled,"ratePerMinute":10,
                "cohortPercent":100,"hostCooldownMs":60000,"preferenceMaxAgeMs":60000,"confirmation":confirmation})
        };
        let r = d
            .admin(
                "regional-rehome-control",
                apply(5, true, "ENABLE_REGIONAL_REHOMING"),
            )
            .await;
        assert_eq!(
            (r.status, r.error()),
            (409, "regional_rehome_generation_mismatch")
        );
        let r = d
            .admin(
                "regional-rehome-control",
                apply(0, true, "DISABLE_REGIONAL_REHOMING"),
            )
            .await;
        assert_eq!((r.status, r.error()), (400, "invalid_request"));
        let r = d
            .admin(
                "regional-rehome-control",
                apply(0, true, "ENABLE_REGIONAL_REHOMING"),
            )
            .await;
        assert_eq!(r.status, 200, "{:?}", r.body);
        assert_eq!(r.body["control"]["generation"], 1);
        assert_eq!(r.body["control"]["enabled"], true);
        assert_eq!(r.body["control"]["cohortPercent"], 100);
        let r = d
            .admin(
                "regional-rehome-control",
                apply(1, false, "DISABLE_REGIONAL_REHOMING"),
            )
            .await;
        assert_eq!(r.body["control"]["generation"], 2);
        // Admin token required.
        let r = d
            .post(
                "/v1/admin/regional-rehome-control",
                None,
                &json!({"v":1,"action":"inspect"}),
            )
            .await;
        assert_eq!((r.status, r.error()), (401, "invalid_token"));
        d.shutdown().await;
    }
}

/// Every strict-schema rule of the control route and of `regionCorrection` answers 400
/// `invalid_request`: arrays, `null` for optional fields, unknown keys, out-of-range values.
#[tokio::test]
async fn region_routes_reject_bad_input() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        two_regions(&d).await;
        let ok = json!({"v":1,"action":"apply","expectedGeneration":0,"enabled":true,"ratePerMinute":10,
            "cohortPercent":100,"hostCooldownMs":60000,"preferenceMaxAgeMs":60000,"confirmation":"ENABLE_REGIONAL_REHOMING"});
        let mut bad = vec![
            json!([]),
            json!(null),
            json!({"action":"inspect"}),
            json!({"v":1,"action":"inspect","x":1}),
            json!({"v":1,"action":"other"}),
        ];
        for (k, v) in [
            ("notBefore", json!(null)),
            ("ratePerMinute", json!(0)),
            ("ratePerMinute", json!(121)),
            ("cohortPercent", json!(101)),
            ("hostCooldownMs", json!(59_999)),
            ("preferenceMaxAgeMs", json!(2_592_000_001i64)),
            ("enabled", json!("true")),
            ("expectedGeneration", json!(-1)),
            ("extra", json!(1)),
        ] {
            let mut b = ok.clone();
            b[k] = v;
            bad.push(b);
        }
        for b in bad {
            let r = d.admin("regional-rehome-control", b.clone()).await;
            assert_eq!((r.status, r.error()), (400, "invalid_request"), "{b}");
        }
        let h = d.host("ubad").await;
        let rcs = [
            json!(null),
            json!([]),
            json!({"v":1,"action":"issue-window","extra":1}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"conclusive","measurements":{US:100}}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"conclusive","measurements":{US:100,"eu-west1":50}}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"conclusive","measurements":{US:100,ASIA:null}}),
            json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,"policyVersion":1,
                "outcome":"inconclusive","reason":null}),
        ];
        for rc in rcs {
            let r = assign(&d, &h, json!({"regionCorrection": rc.clone()})).await;
            assert_eq!((r.status, r.error()), (400, "invalid_request"), "{rc}");
        }
        d.shutdown().await;
    }
}
