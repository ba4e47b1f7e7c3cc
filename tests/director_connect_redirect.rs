//! P-49: a director-only process serves `/v1/connect/<relayHostId>` as the invite redirect
//! (docs/reference/websocket.md), on SQLite and Postgres.

mod support;

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use orca_relay::store::assignments::HostKey;
use orca_relay::store::credentials;
use orca_relay::store::testing::backends;
use serde_json::{json, Value};
use support::director::*;
use tokio_tungstenite::tungstenite::Message;

type Ws =
    tokio_tungstenite::WebSocketStream<tokio_tungstenite::MaybeTlsStream<tokio::net::TcpStream>>;

async fn dial(d: &Dir, path: &str) -> Result<Ws, u16> {
    let url = format!("{}{}", d.base.replacen("http://", "ws://", 1), path);
    match tokio_tungstenite::connect_async(url).await {
        Ok((ws, _)) => Ok(ws),
        Err(tokio_tungstenite::tungstenite::Error::Http(r)) => Err(r.status().as_u16()),
        Err(e) => panic!("dial: {e}"),
    }
}

/// Reads frames until the close: (JSON frames seen, close code, close reason).
async fn drain(ws: &mut Ws) -> (Vec<Value>, u16, String) {
    let mut frames = Vec::new();
    let read = async {
        while let Some(m) = ws.next().await {
            match m {
                Ok(Message::Text(t)) => frames.push(serde_json::from_str(t.as_str()).unwrap()),
                Ok(Message::Close(Some(f))) => {
                    return (u16::from(f.code), f.reason.as_str().to_owned())
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
        (1006, String::new())
    };
    let (code, reason) = tokio::time::timeout(Duration::from_secs(5), read)
        .await
        .expect("closed in time");
    (frames, code, reason)
}

fn auth(credential: &str) -> Message {
    Message::text(
        json!({"type":"relay-auth","v":1,"mode":"connect","credential":credential}).to_string(),
    )
}

#[tokio::test]
async fn p49_invite_redirect_on_a_director_only_process() {
    for t in backends().await {
        let d = start(&t, &[]).await;
        d.register("A", US, false).await;
        d.hb("A", US, true, &uuid(), 100, false).await;
        let h = d.host("U").await;
        let host = HostKey {
            user_id: h.user.clone(),
            relay_host_id: h.id.clone(),
        };
        let invite = credentials::create_invite(&d.db, &host, "d1", "r1", now())
            .await
            .unwrap()
            .token;

        // Control and data legs are the cell's.
        assert_eq!(dial(&d, "/v1/host/control").await.err(), Some(404));
        assert_eq!(dial(&d, "/v1/host/data/abc").await.err(), Some(404));
        // Gates 1 and 2.
        assert_eq!(
            dial(&d, &format!("/v1/connect/{}?a", h.id)).await.err(),
            Some(400)
        );
        assert_eq!(dial(&d, "/v1/connect/short").await.err(), Some(429));

        // A valid invite of a host without an assignment: placed, then moved to its cell.
        let mut ws = dial(&d, &format!("/v1/connect/{}", h.id)).await.unwrap();
        ws.send(auth(&invite)).await.unwrap();
        let (frames, code, reason) = drain(&mut ws).await;
        assert_eq!(
            frames,
            vec![json!({"type":"relay-moved","v":1,"cellUrl":cell_url("A"),"assignmentEpoch":1})],
            "{:?}",
            t.kind()
        );
        assert_eq!((code, reason.as_str()), (4503, "connect to assigned cell"));
        // The invite was only resolved, not reserved: it still works, with the same assignment.
        let mut ws = dial(&d, &format!("/v1/connect/{}", h.id)).await.unwrap();
        ws.send(auth(&invite)).await.unwrap();
        let (frames, code, _) = drain(&mut ws).await;
        assert_eq!(frames[0]["assignmentEpoch"], 1);
        assert_eq!(code, 4503);

        // A resume token is not an invite here.
        let rt = d.resume_token(&h).await;
        let mut ws = dial(&d, &format!("/v1/connect/{}", h.id)).await.unwrap();
        ws.send(auth(&rt)).await.unwrap();
        let (frames, code, reason) = drain(&mut ws).await;
        assert_eq!(
            frames,
            vec![json!({"type":"relay-hello","ok":false,"code":4401})]
        );
        assert_eq!((code, reason.as_str()), (4401, "invalid invite"));

        // Malformed relay-auth and binary first frames.
        let mut ws = dial(&d, &format!("/v1/connect/{}", h.id)).await.unwrap();
        ws.send(Message::text(r#"{"type":"relay-auth"}"#))
            .await
            .unwrap();
        let (frames, code, reason) = drain(&mut ws).await;
        assert_eq!(
            frames,
            vec![json!({"type":"relay-hello","ok":false,"code":4401})]
        );
        assert_eq!((code, reason.as_str()), (4401, "invalid relay auth"));
        let mut ws = dial(&d, &format!("/v1/connect/{}", h.id)).await.unwrap();
        ws.send(Message::binary(vec![1u8, 2, 3])).await.unwrap();
        let (frames, code, reason) = drain(&mut ws).await;
        assert!(frames.is_empty());
        assert_eq!((code, reason.as_str()), (4401, "first frame must be text"));
        d.shutdown().await;
    }
}
