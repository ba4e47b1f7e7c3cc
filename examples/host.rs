//! A real desktop host: X25519 key, a self-hosted host token minted with the signing key, `/v1/assign`,
//! the host proof, an invite printed for `examples/phone.rs`, then it echoes every phone message back
//! (prefixed with `echo: ` for text) until interrupted.
//!
//! ```text
//! cargo run --example host -- http://127.0.0.1:8080 <ORCA_RELAY_ASSIGNMENT_SIGNING_KEY>
//! ```

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use orca_relay::cell::testkit::{self, Hello, HostIdentity};
use tokio_tungstenite::tungstenite::Message;

#[tokio::main]
async fn main() {
    let mut argv = std::env::args().skip(1);
    let url = argv
        .next()
        .unwrap_or_else(|| "http://127.0.0.1:8080".into());
    let signing = argv
        .next()
        .or_else(|| std::env::var("ORCA_RELAY_ASSIGNMENT_SIGNING_KEY").ok())
        .expect("signing key (argument or ORCA_RELAY_ASSIGNMENT_SIGNING_KEY)");
    let host = HostIdentity::generate("self-hosted");
    let token = host.token(&signing, &url);
    let (cell_url, epoch) = testkit::assign(&url, &token, &host.relay_host_id)
        .await
        .expect("assign");
    let hello = Hello {
        epoch,
        capabilities: vec!["pending-conn-details".into()],
        ..Hello::default()
    };
    let mut control = testkit::connect_control(&cell_url, &host, &token, &url, &hello)
        .await
        .expect("control handshake");
    eprintln!(
        "host {} online at {cell_url}, generation {}",
        host.relay_host_id, control.generation
    );
    let invite = control
        .create_invite("example-1", "example-phone")
        .await
        .expect("invite");
    println!("{} {} {}", cell_url, host.relay_host_id, invite);
    loop {
        let frame = match control.recv(Duration::from_secs(3600)).await {
            Ok(f) => f,
            Err(e) => {
                eprintln!("control closed: {e:?}");
                return;
            }
        };
        if frame["type"] != "conn-open" {
            eprintln!("control: {frame}");
            continue;
        }
        let mut data = testkit::connect_data(&cell_url, &frame, control.generation, &[])
            .await
            .expect("data leg");
        eprintln!("phone attached: {}", frame["connId"]);
        tokio::spawn(async move {
            while let Some(Ok(m)) = data.next().await {
                let reply = match m {
                    Message::Text(t) => Message::text(format!("echo: {}", t.as_str())),
                    Message::Binary(b) => Message::Binary(b),
                    _ => continue,
                };
                if data.send(reply).await.is_err() {
                    break;
                }
            }
            eprintln!("phone left");
        });
    }
}
