//! `orca-relay`: serve, migrate, admin and host-token commands (operations.md §5).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{Parser, Subcommand};
use orca_relay::cli;
use orca_relay::config::{Config, ServeArgs};

/// jemalloc, with its background threads purging freed pages (enabled first thing in `main`):
/// under churn glibc's malloc kept the peaks' freed memory resident, ~11 % over the idle baseline
/// after a 10-minute soak; jemalloc's decay returns it within seconds of the load stopping.
#[cfg(unix)]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

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
    /// Server origin for `admin` and `host-token` (also accepted after the subcommand).
    #[arg(long, env = "ORCA_RELAY_URL", default_value = orca_relay::cli::DEFAULT_URL)]
    url: String,
}

#[derive(Subcommand)]
enum Command {
    /// Run the configured roles (the default command).
    #[command(after_help = orca_relay::tls::SHAPES_HELP)]
    Serve(ServeArgs),
    /// Apply pending schema migrations to ORCA_RELAY_DATABASE_URL and exit.
    Migrate(ServeArgs),
    /// Call the operator routes of a running server and print the answer.
    #[command(after_help = cli::ADMIN_ENV_HELP)]
    Admin {
        #[command(flatten)]
        target: cli::Target,
        #[command(subcommand)]
        command: cli::AdminCommand,
    },
    /// Mint a self-hosted host token against a running server (development aid).
    #[command(after_help = cli::HOST_TOKEN_ENV_HELP)]
    HostToken {
        #[command(flatten)]
        target: cli::Target,
        /// The host's X25519 public key, canonical padded base64.
        #[arg(long)]
        key: String,
        /// Token subject (default `self-hosted`).
        #[arg(long)]
        user_id: Option<String>,
    },
}

fn main() -> ExitCode {
    orca_relay::logging::init();
    #[cfg(unix)]
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        log::warn!("[orca-relay] allocator background purging unavailable: {e}");
    }
    let cli = Cli::parse();
    match cli.command {
        None => serve(&cli.serve),
        Some(Command::Serve(args)) => serve(&args),
        Some(Command::Migrate(args)) => migrate(&args),
        Some(Command::Admin { target, command }) => {
            let target = target.or(Some(cli.url), Some(cli.serve.data_dir.into()));
            report(runtime().block_on(cli::admin(&target, &command)))
        }
        Some(Command::HostToken {
            target,
            key,
            user_id,
        }) => {
            let target = target.or(Some(cli.url), Some(cli.serve.data_dir.into()));
            report(runtime().block_on(cli::host_token(&target, &key, user_id.as_deref())))
        }
    }
}

fn report(r: Result<(), String>) -> ExitCode {
    match r {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
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
        orca_relay::store::observe(orca_relay::logging::store_event);
        match orca_relay::store::migrate::apply(&db, orca_relay::clock::now_ms()).await {
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
