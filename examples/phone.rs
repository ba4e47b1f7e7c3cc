//! A real phone: dials the cell with an invite printed by `examples/host.rs`, waits for
//! `relay-hello`, then exchanges messages with the host.
//!
//! ```text
//! cargo run --example phone -- <cellUrl> <relayHostId> <inviteToken> [message…]
//! ```

use std::time::Duration;

use futures_util::{SinkExt, StreamExt};
use orca_relay::cell::testkit;
use tokio_tungstenite::tungstenite::Message;

#[tokio::main]
async fn main() {
    let argv: Vec<String> = std::env::args().skip(1).collect();
    let [cell_url, relay_host_id, invite, rest @ ..] = argv.as_slice() else {
        eprintln!("usage: phone <cellUrl> <relayHostId> <inviteToken> [message…]");
        std::process::exit(2);
    };
    let mut ws = testkit::connect_phone(cell_url, relay_host_id, invite, &[])
        .await
        .expect("dial");
    let hello = testkit::recv_json(&mut ws, Duration::from_secs(15))
        .await
        .expect("relay-hello");
    println!("{hello}");
    if hello["ok"] != true {
        std::process::exit(1);
    }
    let messages: Vec<String> = if rest.is_empty() {
        vec!["hello from the phone".into()]
    } else {
        rest.to_vec()
    };
    for m in &messages {
        ws.send(Message::text(m.clone())).await.expect("send");
        match ws.next().await {
            Some(Ok(Message::Text(t))) => println!("{}", t.as_str()),
            other => {
                eprintln!("unexpected: {other:?}");
                std::process::exit(1);
            }
        }
    }
    ws.send(Message::binary(vec![0u8, 0xff, 0x10]))
        .await
        .expect("send");
    if let Some(Ok(Message::Binary(b))) = ws.next().await {
        println!("binary echo {:02x?}", &b[..]);
    }
    let _ = ws.close(None).await;
}
