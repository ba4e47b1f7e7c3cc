//! `orca-relay`: serve, migrate, admin and host-token commands (README.md).

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::{ArgMatches, CommandFactory, FromArgMatches, Parser, Subcommand};
use orca_relay::cli;
use orca_relay::cli::config_cmd::ConfigCommand;
use orca_relay::config::layers::{self, Layered};
use orca_relay::config::{file, Config, ServeArgs};

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
    /// Copy the embedded SQLite database (online, while the server runs) and the secrets file
    /// into a new directory.
    Backup {
        /// The directory to write (created; must be new or empty).
        #[arg(long)]
        to: std::path::PathBuf,
        #[command(flatten)]
        serve: ServeArgs,
    },
    /// Check or print the effective configuration (file, environment, flags).
    Config {
        #[command(subcommand)]
        command: ConfigCommand,
    },
    /// Call the operator routes of a running server and print the answer.
    #[command(after_help = cli::ADMIN_ENV_HELP)]
    Admin {
        #[command(flatten)]
        target: cli::Target,
        #[command(subcommand)]
        command: cli::AdminCommand,
    },
    /// GET /ready on a server (this machine's listener by default): exit 0 only on 200.
    #[command(after_help = cli::health::HEALTH_ENV_HELP)]
    Health(cli::health::HealthArgs),
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

/// How long jemalloc keeps freed pages before returning them to the OS, ms (its default is 10 s).
/// A burst of connection set-ups frees its transient buffers in a burst; with a 10 s decay an idle
/// cell carried them for ten more seconds (about 0.25 KiB per idle WebSocket right after 19,000
/// set-ups, docs/benchmarks.md). The background threads do the purging, off the serving threads.
#[cfg(unix)]
const DIRTY_DECAY_MS: isize = 1_000;

/// Switches on jemalloc's background purge threads and sets the dirty-page decay, for the arenas
/// that exist now and as the default of those created later (one per worker thread, lazily).
#[cfg(unix)]
fn tune_allocator() {
    use tikv_jemalloc_ctl::{Access, AsName};
    let decay = b"arenas.dirty_decay_ms\0".name().write(DIRTY_DECAY_MS);
    let arenas = tikv_jemalloc_ctl::arenas::narenas::read().unwrap_or(0);
    for i in 0..arenas {
        // Arenas not created yet refuse the write; they take the default set above.
        let key = format!("arena.{i}.dirty_decay_ms\0");
        let _ = key.as_bytes().name().write(DIRTY_DECAY_MS);
    }
    if let Err(e) = decay {
        log::warn!("[orca-relay] allocator decay setting unavailable: {e}");
    }
    if let Err(e) = tikv_jemalloc_ctl::background_thread::write(true) {
        log::warn!("[orca-relay] allocator background purging unavailable: {e}");
    }
}

fn main() -> ExitCode {
    orca_relay::logging::init();
    #[cfg(unix)]
    tune_allocator();
    let argv: Vec<std::ffi::OsString> = std::env::args_os().collect();
    let first = Cli::command().get_matches_from(argv.clone());
    // The configuration file becomes the settings' defaults, beneath variables and flags.
    let config_file = match settings_matches(&first).and_then(layers::config_path) {
        None => None,
        Some(path) => match file::load(&path) {
            Ok(f) => Some(f),
            Err(problems) => return refuse(&problems),
        },
    };
    let matches = match &config_file {
        Some(f) => layers::with_file_defaults(Cli::command(), f).get_matches_from(argv),
        None => first,
    };
    let cli = Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit());
    let sub = settings_matches(&matches).unwrap_or(&matches);
    let layered = |args: ServeArgs| {
        layers::resolve(args, sub, config_file.as_ref(), &|k| std::env::var_os(k))
    };
    if !matches!(cli.command, Some(Command::Config { .. })) {
        for w in orca_relay::config::env_scan::process_warnings() {
            log::warn!("[orca-relay] {w}");
        }
    }
    match cli.command {
        None => serve(layered(cli.serve)),
        Some(Command::Serve(args)) => serve(layered(args)),
        Some(Command::Migrate(args)) => migrate(layered(args)),
        Some(Command::Config { command }) => {
            let args = match &command {
                ConfigCommand::Check(a) | ConfigCommand::Print(a) => a.clone(),
            };
            ExitCode::from(cli::config_cmd::run(&command, layered(args)))
        }
        Some(Command::Backup { to, serve }) => match layered(serve) {
            Ok(l) => backup(&l.args, &to),
            Err(p) => refuse(&p),
        },
        Some(Command::Admin { target, command }) => {
            let target = target.or(Some(cli.url), Some(cli.serve.data_dir.into()));
            report(runtime().block_on(cli::admin(&target, &command)))
        }
        Some(Command::Health(args)) => health(&args, &cli.url),
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

/// The matches holding `serve`'s settings: the subcommand's, or the top level's.
fn settings_matches(m: &ArgMatches) -> Option<&ArgMatches> {
    match m.subcommand() {
        Some(("serve" | "migrate" | "backup", s)) => Some(s),
        Some(("config", c)) => c.subcommand().map(|(_, s)| s),
        Some(_) => None,
        None => Some(m),
    }
}

fn refuse(problems: &[orca_relay::config::ConfigError]) -> ExitCode {
    for p in problems {
        eprintln!("{p}");
    }
    ExitCode::from(2)
}

fn load(
    layered: Result<Layered, Vec<orca_relay::config::ConfigError>>,
) -> Result<Config, ExitCode> {
    let layered = layered.map_err(|p| refuse(&p))?;
    Config::from_args(&layered.args).map_err(|e| {
        eprintln!("{}", cli::config_cmd::explain(&e, &layered));
        ExitCode::from(2)
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime")
}

fn serve(args: Result<Layered, Vec<orca_relay::config::ConfigError>>) -> ExitCode {
    // Configuration (and the secrets file) is read before the runtime starts: no blocking file I/O
    // on a tokio worker.
    let config = match load(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let status = runtime().block_on(orca_relay::server::run(config));
    ExitCode::from(status as u8)
}

/// Reads only the database settings: no secrets or role settings are needed to migrate.
fn migrate(layered: Result<Layered, Vec<orca_relay::config::ConfigError>>) -> ExitCode {
    let layered = match layered {
        Ok(l) => l,
        Err(p) => return refuse(&p),
    };
    let (database_url, _) = match orca_relay::config::database_settings(&layered.args) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("{}", cli::config_cmd::explain(&e, &layered));
            return ExitCode::from(2);
        }
    };
    runtime().block_on(async move {
        let db = match orca_relay::store::Db::connect(&database_url, 2).await {
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
                eprintln!("ORCA_RELAY_DATABASE_URL: {e}");
                ExitCode::from(1)
            }
        }
    })
}

fn backup(args: &ServeArgs, to: &std::path::Path) -> ExitCode {
    let data_dir = std::path::PathBuf::from(args.data_dir.trim());
    let url = match args.database_url.as_deref().map(str::trim) {
        Some(u) if !u.is_empty() => u.to_string(),
        _ => format!("sqlite://{}", data_dir.join(cli::backup::DB_FILE).display()),
    };
    match cli::backup::backup(&url, &data_dir, to, orca_relay::clock::now_ms()) {
        Ok(w) => {
            println!(
                "[orca-relay] backup written: {} ({} pages){}",
                w.database.display(),
                w.pages,
                match &w.secrets {
                    Some(p) => format!(", {}", p.display()),
                    None => String::new(),
                }
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            ExitCode::from(1)
        }
    }
}

fn health(args: &cli::health::HealthArgs, top_url: &str) -> ExitCode {
    // `--url` after `health`, else the top-level `--url` / ORCA_RELAY_URL when either names one,
    // else this machine's own listener.
    let explicit = args.url.clone().or_else(|| {
        (std::env::var_os("ORCA_RELAY_URL").is_some() || top_url != cli::DEFAULT_URL)
            .then(|| top_url.to_string())
    });
    let probe = match explicit {
        Some(u) => cli::health::explicit(&u),
        None => cli::health::local(&cli::health::Local::from_env()),
    };
    let probe = match probe {
        Ok(p) => p,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let (ok, line) = runtime().block_on(cli::health::probe(
        &probe,
        std::time::Duration::from_secs(args.timeout),
    ));
    println!("{line}");
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
