//! `orca-relay`: serve, migrate, admin and host-token commands (operations.md §5).

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use orca_relay::config::{Config, ServeArgs};

#[derive(Parser)]
#[command(
    name = "orca-relay",
    version,
    about = "Relay cell, director and push gateway for Orca"
)]
struct Cli {
    #[command(subcommand)]
    command: Option<Command>,
    #[command(flatten)]
    serve: ServeArgs,
}

#[derive(Subcommand)]
enum Command {
    /// Run the configured roles (the default command).
    Serve(ServeArgs),
    /// Apply pending schema migrations to ORCA_RELAY_DATABASE_URL and exit.
    Migrate(ServeArgs),
}

fn main() -> ExitCode {
    orca_relay::logging::init();
    let cli = Cli::parse();
    match cli.command {
        None => serve(&cli.serve),
        Some(Command::Serve(args)) => serve(&args),
        Some(Command::Migrate(args)) => migrate(&args),
    }
}

fn load(args: &ServeArgs) -> Result<Config, ExitCode> {
    Config::from_args(args).map_err(|e| {
        eprintln!("{e}");
        ExitCode::from(2)
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn serve(args: &ServeArgs) -> ExitCode {
    // Configuration (and the secrets file) is read before the runtime starts: no blocking file I/O
    // on a tokio worker.
    let config = match load(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let status = runtime().block_on(orca_relay::server::run(config));
    ExitCode::from(status as u8)
}

fn migrate(args: &ServeArgs) -> ExitCode {
    let config = match load(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    runtime().block_on(async move {
        let db = match orca_relay::store::Db::connect(&config.database_url, 2).await {
            Ok(db) => db,
            Err(e) => {
                eprintln!("ORCA_RELAY_DATABASE_URL: cannot open the database: {e}");
                return ExitCode::from(1);
            }
        };
        match orca_relay::store::migrate::apply(&db).await {
            Ok(v) => {
                println!("[orca-relay] migrations applied: {v:?}");
                ExitCode::SUCCESS
            }
            Err(e) => {
                eprintln!("ORCA_RELAY_DATABASE_URL: migration failed: {e}");
                ExitCode::from(1)
            }
        }
    })
}
