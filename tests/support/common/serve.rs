//! The one in-process server starter: command-line flags parsed exactly as `orca-relay serve`
//! parses them (clap over [`ServeArgs`]), then `server::start` on the calling runtime, listening
//! on the ephemeral port the flags name (`127.0.0.1:0`).

use clap::Parser;
use orca_relay::config::{Config, ServeArgs};
use orca_relay::server::{self, Running};

#[derive(Parser)]
struct Cli {
    #[command(flatten)]
    serve: ServeArgs,
}

/// The configuration `argv` (program name first, then `serve` flags) yields; panics on a flag
/// or configuration error.
pub fn config<S: AsRef<str>>(argv: &[S]) -> Config {
    let cli = Cli::try_parse_from(argv.iter().map(|s| s.as_ref())).expect("flags parse");
    Config::from_args(&cli.serve).expect("config")
}

/// Starts a server from `argv` (see [`config`]).
pub async fn start<S: AsRef<str>>(argv: &[S]) -> Running {
    server::start(config(argv)).await.expect("server starts")
}
