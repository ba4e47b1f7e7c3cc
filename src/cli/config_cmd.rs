//! `orca-relay config check` and `orca-relay config print`: the configuration `serve` would use,
//! validated or listed with where each value came from. Neither creates anything.

use clap::Subcommand;

use crate::config::layers::{Layered, Source};
use crate::config::settings::{self, SETTINGS};
use crate::config::{env_scan, Config, ConfigError, ServeArgs};

#[derive(Subcommand, Debug, Clone)]
pub enum ConfigCommand {
    /// Validate the configuration exactly as `serve` would; exit 2 on any problem.
    Check(ServeArgs),
    /// Print every effective setting and its source (default, file, env, flag); secrets hidden.
    Print(ServeArgs),
}

/// Runs `command`; the exit status.
pub fn run(command: &ConfigCommand, layered: Result<Layered, Vec<ConfigError>>) -> u8 {
    for w in env_scan::process_warnings() {
        eprintln!("warning: {w}");
    }
    let layered = match layered {
        Ok(l) => l,
        Err(problems) => {
            for p in problems {
                println!("error: {p}");
            }
            return 2;
        }
    };
    match command {
        ConfigCommand::Check(_) => check(&layered),
        ConfigCommand::Print(_) => {
            print!("{}", render(&layered));
            0
        }
    }
}

fn check(layered: &Layered) -> u8 {
    let config = match Config::check_args(&layered.args) {
        Ok(c) => c,
        Err(e) => {
            println!("error: {}", explain(&e, layered));
            return 2;
        }
    };
    println!("configuration OK");
    println!("  roles: {}", config.roles.names().join(","));
    println!("  listen: {}", config.listen);
    println!("  public url: {}", config.public_url);
    println!("  database: {}", config.database_kind());
    if let Some(f) = &layered.file {
        println!("  file: {}", f.display());
    }
    let s = &config.secrets;
    let missing = s.assignment_signing_key.is_none()
        || s.cluster_key.is_none()
        || s.admin_token.is_none()
        || s.self_hosted_key.is_none();
    if config.secrets_file.is_some() {
        println!(
            "  secrets: missing ones from {}",
            config.data_dir.join("secrets.json").display()
        );
    } else if missing && config.roles == crate::config::Roles::ALL {
        println!(
            "  secrets: missing ones generated on first start into {}",
            config.data_dir.join("secrets.json").display()
        );
    }
    0
}

/// A database URL's password (`scheme://user:PASSWORD@host`, or a `password=` parameter) as
/// `<hidden>`: `config print` output gets pasted into tickets.
fn hide_password(v: &str) -> String {
    let mut out = v.to_string();
    if let Some(scheme_end) = out.find("://") {
        let rest = scheme_end + 3;
        let authority_end = out[rest..].find(['/', '?']).map_or(out.len(), |i| rest + i);
        if let Some(at) = out[rest..authority_end].rfind('@') {
            let userinfo = &out[rest..rest + at];
            if let Some(colon) = userinfo.find(':') {
                out.replace_range(rest + colon + 1..rest + at, "<hidden>");
            }
        }
    }
    if let Some(i) = out.find("password=") {
        let start = i + "password=".len();
        let end = out[start..]
            .find(['&', ' '])
            .map_or(out.len(), |j| start + j);
        out.replace_range(start..end, "<hidden>");
    }
    out
}

/// `config print`: one line per setting, `name = value  # source`.
pub fn render(layered: &Layered) -> String {
    let mut out = String::new();
    if let Some(f) = &layered.file {
        out.push_str(&format!("# file: {}\n", f.display()));
    }
    for s in SETTINGS {
        let value = layered.values.get(s.name).cloned().flatten();
        let shown = match (&value, s.secret) {
            (Some(v), true) if !v.trim().is_empty() => "<set>".to_string(),
            (_, true) => "<unset>".to_string(),
            (Some(v), false) => format!("{:?}", hide_password(v)),
            (None, false) => "<unset>".to_string(),
        };
        let origin = &layered.origins[s.name];
        let source = match (&origin.via, origin.source) {
            (Some(via), src) => format!("{} ({via})", src.name()),
            (None, Source::Env) => format!("env ({})", s.env),
            (None, Source::Flag) => format!("flag ({})", s.flag()),
            (None, src) => src.name().to_string(),
        };
        out.push_str(&format!("{} = {shown}  # {source}\n", s.name));
    }
    out
}

/// `e`, plus where the offending value came from when that was the configuration file.
pub fn explain(e: &ConfigError, layered: &Layered) -> String {
    let var = e.0.split([' ', ':', '=']).next().unwrap_or("");
    let from_file = settings::find_env(var).filter(|s| {
        layered
            .origins
            .get(s.name)
            .is_some_and(|o| o.source == Source::File)
    });
    match (from_file, &layered.file) {
        (Some(s), Some(f)) => format!("{e} (key `{}` in {})", s.name, f.display()),
        _ => e.0.clone(),
    }
}

#[cfg(test)]
mod password_tests {
    use super::hide_password;

    #[test]
    fn database_passwords_are_hidden() {
        assert_eq!(
            hide_password("postgres://orca:s3cret@db:5432/orca"),
            "postgres://orca:<hidden>@db:5432/orca"
        );
        assert_eq!(
            hide_password("postgres://db/orca?user=orca&password=s3cret&sslmode=require"),
            "postgres://db/orca?user=orca&password=<hidden>&sslmode=require"
        );
        assert_eq!(
            hide_password("postgres://orca@db/orca"),
            "postgres://orca@db/orca"
        );
        assert_eq!(
            hide_password("sqlite://./data/x.sqlite3"),
            "sqlite://./data/x.sqlite3"
        );
    }
}
