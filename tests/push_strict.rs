//! Strict bodies on the push gateway's registry and send routes (issue 11, docs/reference/http.md): an
//! array instead of the object, `null` for an optional field, a duplicate key, an unknown key and
//! a wrong type all answer `400 {"error":"invalid_request"}` and write nothing; `agentState`,
//! the one field whose value may be `null`, still takes it. SQLite and, when configured, Postgres.

mod support;

use reqwest::Method;
use serde_json::{json, Value};
use support::push::*;

async fn raw(s: &Server, path: &str, tok: &str, body: String) -> (u16, Value) {
    let (st, _, v) = s.call(Method::POST, path, Some(tok), Some(body)).await;
    (st, v)
}

fn invalid() -> (u16, Value) {
    (400, json!({"error":"invalid_request"}))
}

#[tokio::test]
async fn devices_body_is_a_strict_object() {
    run_all(|t| async move {
        let s = Server::start(&t.url, Opts::default()).await;
        let tok = Host::new().session(&s).await;
        let ios = ios_token();
        let bodies = [
            json!([1, "d1", "ios", ios]).to_string(),
            json!({"v":1,"deviceId":"d1","platform":"ios","token":ios,"apnsEnvironment":null})
                .to_string(),
            json!({"v":1,"deviceId":null,"platform":"ios","token":ios}).to_string(),
            json!({"v":1,"deviceId":"d1","platform":"ios","token":ios,"extra":1}).to_string(),
            json!({"v":"1","deviceId":"d1","platform":"ios","token":ios}).to_string(),
            json!({"v":1,"deviceId":7,"platform":"ios","token":ios}).to_string(),
            format!(
                r#"{{"v":1,"deviceId":"d1","deviceId":"d2","platform":"ios","token":"{ios}"}}"#
            ),
            "null".to_string(),
        ];
        for body in bodies {
            assert_eq!(
                raw(&s, "/v1/devices", &tok, body.clone()).await,
                invalid(),
                "{body}"
            );
        }
        assert!(
            s.devices(&tok).await.is_empty(),
            "a rejected body wrote a row"
        );
        s.stop().await;
    })
    .await;
}

#[tokio::test]
async fn send_body_is_a_strict_object() {
    run_all(|t| async move {
        let s = Server::start(&t.url, Opts::default()).await;
        let tok = Host::new().session(&s).await;
        let id = s.register(&tok, "d1", "ios", &ios_token()).await;
        let with = |k: &str, v: Value| {
            let mut n = alert("n-1", 1);
            n[k] = v;
            json!({"v":1,"registrationIds":[id],"notification":n}).to_string()
        };
        let n = alert("n-1", 1);
        let bodies = [
            json!([1, [id], n]).to_string(),
            json!({"v":1,"registrationIds":[id],"notification":[n]}).to_string(),
            json!({"v":1,"registrationIds":null,"notification":n}).to_string(),
            json!({"v":1,"registrationIds":[id],"notification":n,"extra":true}).to_string(),
            json!({"v":1,"registrationIds":[id, 5],"notification":n}).to_string(),
            with("notificationId", Value::Null),
            with("worktreeId", Value::Null),
            with("paneKey", Value::Null),
            with("sound", Value::Null),
            with("kind", Value::Null),
            with("expiresAt", Value::Null),
            with("sound", json!("yes")),
            with("notificationSeq", json!("1")),
            with("unknown", json!(1)),
            format!(
                r#"{{"v":1,"registrationIds":["{id}"],"registrationIds":["{id}"],"notification":{n}}}"#
            ),
        ];
        let queued = s.counter("send_queued");
        for body in bodies {
            assert_eq!(raw(&s, "/v1/send", &tok, body.clone()).await, invalid(), "{body}");
        }
        assert_eq!(s.counter("send_queued"), queued, "a rejected send queued something");
        // `agentState` is a required key whose value may be null (docs/reference/http.md).
        let (st, v) = raw(&s, "/v1/send", &tok, with("agentState", Value::Null)).await;
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["results"][0]["status"], json!("queued"));
        s.stop().await;
    })
    .await;
}
