//! The one in-process server starter: command-line flags parsed exactly as `orca-relay serve`
//! parses them (`ServeArgs::parse_flags`), then `server::start` on the calling runtime,
//! listening on the ephemeral port the flags name (`127.0.0.1:0`).

use orca_relay::config::{Config, ServeArgs};
use orca_relay::server::{self, Running};

/// The configuration `argv` (program name first, then `serve` flags) yields; panics on a flag
/// or configuration error.
pub fn config<S: AsRef<str>>(argv: &[S]) -> Config {
    let flags = ServeArgs::parse_flags(argv.iter().skip(1).map(|s| s.as_ref().to_string()))
        .expect("flags parse");
    Config::from_args(&flags).expect("config")
}

/// Starts a server from `argv` (see [`config`]).
pub async fn start<S: AsRef<str>>(argv: &[S]) -> Running {
    server::start(config(argv)).await.expect("server starts")
}
