//! Strict input of every idle-rehome body (issue 8, "bad input"): `POST /v1/admin/host-idle-rehome`
//! (docs/reference/http.md), `POST /v1/admin/regional-rehome-control` (docs/reference/http.md) and the
//! `regionCorrection` objects of `/v1/assign` (`issue-window`, both `report` shapes).
//!
//! Each body starts from a valid template (shown to be accepted) and is mutated by a generated
//! table: every key removed (required keys), set to `null`, an array, an object and each wrong
//! scalar type, at every depth; an unknown key at every depth; a duplicate key (as raw text); a
//! non-object top level; and every documented range just outside its bounds. Every mutation must
//! answer the route's documented error: `400 {"error":"invalid_request"}` (and `413
//! request_too_large` over 4 096 B, `401 invalid_token` before the body is read). Schema checks
//! touch no database, so this runs on SQLite only.

mod support;

use orca_relay::store::testing::TestDb;
use serde_json::{json, Map, Value};
use support::node::*;

const US: &str = "us-central1";
const ASIA: &str = "asia-east2";
const UUID_A: &str = "0a1c5a9b-197b-4ea8-b6f1-f3bcaa3d712c";
const UUID_B: &str = "00000000-0000-4000-8000-00000000000c";

fn cluster(sub: &str) -> String {
    orca_relay::crypto::jwt::mint_cluster_token(
        CLUSTER.as_bytes(),
        sub,
        orca_relay::clock::now_ms(),
    )
}

async fn post_raw(url: &str, bearer: Option<&str>, body: String) -> (u16, Value) {
    let mut rb = reqwest::Client::new()
        .post(url)
        .header("content-type", "application/json")
        .body(body);
    if let Some(b) = bearer {
        rb = rb.bearer_auth(b);
    }
    let r = rb.send().await.unwrap();
    let st = r.status().as_u16();
    (st, r.json().await.unwrap_or(Value::Null))
}

/// One mutation: a description and the body text.
type Case = (String, String);

/// Values of a wrong type for a slot holding `v` (never the same JSON type; for integers also
/// fractions, which no integer field accepts).
fn wrong_types(v: &Value) -> Vec<Value> {
    let all = [
        json!(null),
        json!([]),
        json!([1]),
        json!({}),
        json!("1"),
        json!(true),
        json!(7),
        json!(1.5),
    ];
    all.into_iter()
        .filter(|w| match (v, w) {
            (Value::Number(_), Value::Number(n)) => v.is_i64() && n.is_f64(),
            (Value::String(_), Value::String(_)) => false,
            (Value::Bool(_), Value::Bool(_)) => false,
            (Value::Object(_), Value::Object(_)) => false,
            (Value::Array(_), Value::Array(_)) => false,
            _ => true,
        })
        .collect()
}

/// Sets the value at `path` (object keys) in `root`.
fn at<'a>(root: &'a mut Value, path: &[String]) -> &'a mut Value {
    path.iter().fold(root, |v, k| &mut v[k.as_str()])
}

/// The generated table over `template`. `optional` lists the paths (`a.b`) that may be absent;
/// `free_keys` the paths of objects whose keys are data (region names), where an unknown key is a
/// key that is not a configured region.
fn mutations(template: &Value, optional: &[&str], free_keys: &[&str]) -> Vec<Case> {
    let mut out: Vec<Case> = vec![
        ("top-level array".into(), "[]".into()),
        ("top-level null".into(), "null".into()),
        ("top-level string".into(), "\"x\"".into()),
        ("top-level number".into(), "1".into()),
        ("not JSON".into(), "{".into()),
        ("trailing text".into(), format!("{template} x")),
        ("empty".into(), String::new()),
    ];
    fn walk(
        root: &Value,
        path: Vec<String>,
        node: &Map<String, Value>,
        optional: &[&str],
        free_keys: &[&str],
        out: &mut Vec<Case>,
    ) {
        let here = path.join(".");
        // An unknown key at this depth.
        let mut b = root.clone();
        at(&mut b, &path)["zz-unknown"] = json!(1);
        out.push((format!("unknown key in {here:?}"), b.to_string()));
        // A duplicate key at this depth: the first key repeated with its own value.
        if let Some((k, v)) = node.iter().next() {
            let text = Value::Object(node.clone()).to_string();
            let dup = format!("{{{}:{},{}", json!(k), v, &text[1..]);
            let mut b = root.clone();
            *at(&mut b, &path) = json!("__DUP__");
            out.push((
                format!("duplicate {k:?} in {here:?}"),
                b.to_string().replace("\"__DUP__\"", &dup),
            ));
        }
        for (k, v) in node {
            let mut p = path.clone();
            p.push(k.clone());
            let name = p.join(".");
            if !optional.contains(&name.as_str()) && !free_keys.contains(&here.as_str()) {
                let mut b = root.clone();
                at(&mut b, &path).as_object_mut().unwrap().remove(k);
                out.push((format!("{name} missing"), b.to_string()));
            }
            for w in wrong_types(v) {
                let mut b = root.clone();
                *at(&mut b, &p) = w.clone();
                out.push((format!("{name} = {w}"), b.to_string()));
            }
            if let Value::Object(m) = v {
                walk(root, p, m, optional, free_keys, out);
            }
        }
    }
    if let Value::Object(m) = template {
        walk(template, Vec::new(), m, optional, free_keys, &mut out);
    }
    out
}

/// `template` with `key` (a path) set to each of `values`.
fn ranges(template: &Value, key: &str, values: &[Value]) -> Vec<Case> {
    let path: Vec<String> = key.split('.').map(String::from).collect();
    values
        .iter()
        .map(|v| {
            let mut b = template.clone();
            *at(&mut b, &path) = v.clone();
            (format!("{key} = {v}"), b.to_string())
        })
        .collect()
}

const MAX_SAFE: i64 = (1 << 53) - 1;

fn safety() -> Value {
    json!({"observedAt":orca_relay::clock::now_ms(),"sqlFailures":0,"reconnects":0,
        "controlActivityRecoveryFailures":0,"databasePoolWaiting":0,"databasePoolWaitersMax":0,
        "databasePoolWaitMsMax":0,"databasePoolTotal":4,"databasePoolIdle":4,"databasePoolOldestWaitMs":0})
}

async fn server() -> (TestDb, Server) {
    let t = TestDb::sqlite().await;
    let s = start_on(
        &t.url,
        &[
            "--regions",
            "us-central1,asia-east2",
            "--public-assignment-retry-after-seconds",
            "1",
        ],
    )
    .await;
    (t, s)
}

fn assert_all(what: &str, cases: &[Case], answers: &[(u16, Value)], want: (u16, Value)) {
    let wrong: Vec<String> = cases
        .iter()
        .zip(answers)
        .filter(|(_, a)| **a != want)
        .map(|((name, body), a)| format!("{name}: {a:?} for {body}"))
        .collect();
    assert!(
        wrong.is_empty(),
        "{what}: {} of {} cases not {want:?}:\n{}",
        wrong.len(),
        cases.len(),
        wrong.join("\n")
    );
    println!("{what}: {} rejection cases", cases.len());
}

/// `POST /v1/admin/host-idle-rehome`: the template reaches the source check (409 for a foreign
/// source cell); every schema violation is 400; no token is 401 whatever the body; over 4 096 B
/// is 413.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_idle_rehome_body_is_strict() {
    let (_t, s) = server().await;
    let url = format!("{}/v1/admin/host-idle-rehome", s.url);
    let template = json!({"v":1,"attemptId":UUID_A,"userId":"u","relayHostId":"abcdefghijklmnop",
        "sourceCellId":"elsewhere","sourceCellIncarnation":UUID_B,"sourceAssignmentEpoch":1,
        "sourceGeneration":1,"targetCellId":"C","cohortPercent":100,"directorSafety":safety()});
    let token = cluster("director");
    assert_eq!(
        post_raw(&url, Some(&token), template.to_string()).await,
        (
            409,
            json!({"error":"regional_rehome_source_generation_mismatch"})
        ),
        "the template passes the schema"
    );
    let optional = [
        "directorSafety.databasePoolTotal",
        "directorSafety.databasePoolIdle",
        "directorSafety.databasePoolOldestWaitMs",
    ];
    let mut cases = mutations(&template, &optional, &[]);
    let long = "x".repeat(129);
    for (k, vals) in [
        ("v", vec![json!(0), json!(2)]),
        ("attemptId", vec![json!("not-a-uuid"), json!("")]),
        ("userId", vec![json!(""), json!(long)]),
        ("relayHostId", vec![json!("short"), json!("")]),
        ("sourceCellId", vec![json!(""), json!(long)]),
        ("sourceCellIncarnation", vec![json!("nope")]),
        (
            "sourceAssignmentEpoch",
            vec![json!(0), json!(-1), json!(MAX_SAFE + 1)],
        ),
        (
            "sourceGeneration",
            vec![json!(0), json!(-1), json!(MAX_SAFE + 1)],
        ),
        ("targetCellId", vec![json!(""), json!(long)]),
        ("cohortPercent", vec![json!(-1), json!(101)]),
        ("directorSafety.observedAt", vec![json!(-1)]),
        ("directorSafety.sqlFailures", vec![json!(-1)]),
        ("directorSafety.reconnects", vec![json!(-1)]),
        (
            "directorSafety.controlActivityRecoveryFailures",
            vec![json!(-1)],
        ),
        (
            "directorSafety.databasePoolWaiting",
            vec![json!(-1), json!(101)],
        ),
        ("directorSafety.databasePoolWaitersMax", vec![json!(-1)]),
        ("directorSafety.databasePoolWaitMsMax", vec![json!(-1)]),
        ("directorSafety.databasePoolTotal", vec![json!(-1)]),
        ("directorSafety.databasePoolIdle", vec![json!(-1)]),
        ("directorSafety.databasePoolOldestWaitMs", vec![json!(-1)]),
    ] {
        cases.extend(ranges(&template, k, &vals));
    }
    let mut answers = Vec::new();
    for (_, body) in &cases {
        answers.push(post_raw(&url, Some(&token), body.clone()).await);
    }
    assert_all(
        "host-idle-rehome",
        &cases,
        &answers,
        (400, json!({"error":"invalid_request"})),
    );
    // Authentication comes before the body: a bad body without a director token is 401.
    for bearer in [None, Some(cluster("c1")), Some(ADMIN.to_string())] {
        assert_eq!(
            post_raw(&url, bearer.as_deref(), "[]".into()).await,
            (401, json!({"error":"invalid_token"})),
            "{bearer:?}"
        );
    }
    let mut big = template.clone();
    big["userId"] = json!("u".repeat(4_100));
    assert_eq!(
        post_raw(&url, Some(&token), big.to_string()).await,
        (413, json!({"error":"request_too_large"}))
    );
    s.running.shutdown().await;
}

/// `POST /v1/admin/regional-rehome-control`: `inspect` and `apply` templates are accepted; every
/// schema violation and every confirmation mismatch is 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn regional_rehome_control_body_is_strict() {
    let (_t, s) = server().await;
    let url = format!("{}/v1/admin/regional-rehome-control", s.url);
    let inspect = json!({"v":1,"action":"inspect"});
    let apply = json!({"v":1,"action":"apply","expectedGeneration":0,"enabled":true,
        "ratePerMinute":10,"cohortPercent":0,"hostCooldownMs":60000,"preferenceMaxAgeMs":60000,
        "notBefore":0,"confirmation":"ENABLE_REGIONAL_REHOMING"});
    let (st, b) = post_raw(&url, Some(ADMIN), inspect.to_string()).await;
    assert_eq!(st, 200, "{b}");
    let mut cases = mutations(&inspect, &[], &[]);
    cases.extend(mutations(&apply, &["notBefore"], &[]));
    for (k, vals) in [
        ("v", vec![json!(0), json!(2)]),
        ("action", vec![json!("other"), json!("INSPECT"), json!("")]),
        ("expectedGeneration", vec![json!(-1), json!(MAX_SAFE + 1)]),
        ("ratePerMinute", vec![json!(0), json!(121)]),
        ("cohortPercent", vec![json!(-1), json!(101)]),
        (
            "hostCooldownMs",
            vec![json!(59_999), json!(2_592_000_001i64)],
        ),
        (
            "preferenceMaxAgeMs",
            vec![json!(59_999), json!(2_592_000_001i64)],
        ),
        ("notBefore", vec![json!(-1), json!(MAX_SAFE + 1)]),
        (
            "confirmation",
            vec![
                json!("DISABLE_REGIONAL_REHOMING"),
                json!("enable_regional_rehoming"),
                json!(""),
            ],
        ),
    ] {
        cases.extend(ranges(&apply, k, &vals));
    }
    cases.extend(ranges(&inspect, "action", &[json!("apply")]));
    let mut off = apply.clone();
    off["enabled"] = json!(false);
    cases.extend(ranges(
        &off,
        "confirmation",
        &[json!("ENABLE_REGIONAL_REHOMING")],
    ));
    let mut answers = Vec::new();
    for (_, body) in &cases {
        answers.push(post_raw(&url, Some(ADMIN), body.clone()).await);
    }
    assert_all(
        "regional-rehome-control",
        &cases,
        &answers,
        (400, json!({"error":"invalid_request"})),
    );
    // Nothing above was applied; the valid apply is (generation 0 → 1), without `notBefore` too.
    let mut no_nb = apply.clone();
    no_nb.as_object_mut().unwrap().remove("notBefore");
    let (st, b) = post_raw(&url, Some(ADMIN), no_nb.to_string()).await;
    assert_eq!((st, &b["control"]["generation"]), (200, &json!(1)), "{b}");
    s.running.shutdown().await;
}

/// `regionCorrection` on `/v1/assign`: `issue-window` and both `report` shapes; the schema is
/// checked before the lanes and the store, so every violation is 400 at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn region_correction_bodies_are_strict() {
    let (_t, s) = server().await;
    let host = Host::assigned(&s, "strict").await;
    let url = format!("{}/v1/assign", s.url);
    let id = host.id.relay_host_id.clone();
    let wrap = |rc: &Value| json!({"v":1,"relayHostId":id,"regionCorrection":rc});
    let window = json!({"v":1,"action":"issue-window"});
    let conclusive = json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,
        "policyVersion":1,"outcome":"conclusive","measurements":{US:125, ASIA:100}});
    let inconclusive = json!({"v":1,"action":"report","generation":1,"assignmentEpoch":1,
        "policyVersion":1,"outcome":"inconclusive","reason":"timeout"});
    // The templates pass the schema (any answer but 400; a lane refusal is 503 and also passes).
    for t in [&window, &conclusive, &inconclusive] {
        let (st, b) = post_raw(&url, Some(&host.token), wrap(t).to_string()).await;
        assert_ne!(st, 400, "template {t}: {b}");
    }
    let mut cases = Vec::new();
    for t in [&window, &conclusive, &inconclusive] {
        cases.extend(
            mutations(t, &[], &["measurements"])
                .into_iter()
                .filter(|(name, _)| !name.starts_with("top-level") && name != "empty"),
        );
        cases.extend(ranges(t, "v", &[json!(0), json!(2)]));
        cases.extend(ranges(t, "action", &[json!("other"), json!("")]));
    }
    for t in [&conclusive, &inconclusive] {
        for (k, vals) in [
            ("generation", vec![json!(-1), json!(MAX_SAFE + 1)]),
            ("assignmentEpoch", vec![json!(-1), json!(MAX_SAFE + 1)]),
            ("policyVersion", vec![json!(0), json!(-1)]),
            ("outcome", vec![json!("other"), json!("")]),
        ] {
            cases.extend(ranges(t, k, &vals));
        }
    }
    for (k, vals) in [
        (
            "measurements",
            vec![json!({}), json!({US:100}), json!({US:100, "eu-west9":50})],
        ),
        (
            &*format!("measurements.{ASIA}"),
            vec![json!(-1), json!(120_001)],
        ),
    ] {
        cases.extend(ranges(&conclusive, k, &vals));
    }
    cases.extend(ranges(
        &inconclusive,
        "reason",
        &[json!(""), json!("r".repeat(65))],
    ));
    // The other shape's keys on each shape.
    let mut both = conclusive.clone();
    both["reason"] = json!("x");
    cases.push(("conclusive with reason".into(), both.to_string()));
    let mut both = inconclusive.clone();
    both["measurements"] = json!({US:1, ASIA:1});
    cases.push(("inconclusive with measurements".into(), both.to_string()));
    let mut w = window.clone();
    w["generation"] = json!(1);
    cases.push(("issue-window with generation".into(), w.to_string()));
    // Whole regionCorrection values of the wrong type.
    for v in [json!(null), json!([]), json!("issue-window"), json!(1)] {
        cases.push((format!("regionCorrection = {v}"), v.to_string()));
    }
    let mut answers = Vec::new();
    for (_, rc) in &cases {
        let body = format!(
            "{{\"v\":1,\"relayHostId\":{},\"regionCorrection\":{rc}}}",
            json!(id)
        );
        answers.push(post_raw(&url, Some(&host.token), body).await);
    }
    assert_all(
        "regionCorrection",
        &cases,
        &answers,
        (400, json!({"error":"invalid_request"})),
    );
    s.running.shutdown().await;
}
