//! Where each setting's value comes from: default < file < environment < flag.
//!
//! clap already ranks flag over variable over default. The file slots in beneath the variables by
//! becoming the arguments' defaults ([`with_file_defaults`]); `ArgMatches::value_source` then tells
//! which layer won. Secrets may also come from a file named by `<VAR>_FILE` (or `<key>_file` in the
//! configuration file), at the layer of the variable (or the file).

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::path::PathBuf;

use clap::parser::ValueSource;
use clap::{ArgMatches, Command};

use super::file::FileValues;
use super::settings::{Setting, SETTINGS};
use super::{ConfigError, ServeArgs};

/// The layer a value came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Source {
    Default,
    File,
    Env,
    Flag,
}

impl Source {
    pub fn name(self) -> &'static str {
        match self {
            Source::Default => "default",
            Source::File => "file",
            Source::Env => "env",
            Source::Flag => "flag",
        }
    }
}

/// A setting's winning layer, and the `*_FILE` variable or `*_file` key it was read through.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Origin {
    pub source: Source,
    pub via: Option<String>,
}

/// `serve`'s arguments after layering, with each setting's origin.
#[derive(Debug, Clone)]
pub struct Layered {
    pub args: ServeArgs,
    /// The configuration file read, if any.
    pub file: Option<PathBuf>,
    /// Each setting's effective text (`None` = unset), by name; a set secret is `<set>`.
    pub values: BTreeMap<&'static str, Option<String>>,
    pub origins: BTreeMap<&'static str, Origin>,
}

/// The configuration file named by `--config` / `ORCA_RELAY_CONFIG` in these matches.
pub fn config_path(m: &ArgMatches) -> Option<PathBuf> {
    m.try_get_one::<String>("config")
        .ok()
        .flatten()
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(PathBuf::from)
}

/// `cmd` (and every subcommand) with the file's values as the defaults of the matching settings.
pub fn with_file_defaults(mut cmd: Command, file: &FileValues) -> Command {
    let subs: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for name in subs {
        cmd = cmd.mut_subcommand(name, |s| with_file_defaults(s, file));
    }
    let ids: Vec<String> = cmd
        .get_arguments()
        .map(|a| a.get_id().to_string())
        .collect();
    for id in ids {
        if let Some(v) = file.get(&id) {
            let v = v.to_string();
            cmd = cmd.mut_arg(id, |a| a.default_value(v));
        }
    }
    cmd
}

/// Names each setting's layer and applies the secrets' `*_FILE` variants (from `env`, the process
/// environment in production). Every problem is returned, one line each.
pub fn resolve(
    mut args: ServeArgs,
    m: &ArgMatches,
    file: Option<&FileValues>,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Layered, Vec<ConfigError>> {
    let mut values = BTreeMap::new();
    let mut origins = BTreeMap::new();
    let mut problems = Vec::new();
    for s in SETTINGS {
        let source = match m.value_source(s.name) {
            Some(ValueSource::CommandLine) => Source::Flag,
            Some(ValueSource::EnvVariable) => Source::Env,
            Some(ValueSource::DefaultValue) if file.is_some_and(|f| f.get(s.name).is_some()) => {
                Source::File
            }
            _ => Source::Default,
        };
        let mut origin = Origin { source, via: None };
        if s.secret {
            match secret_from_file(s, source, file, env) {
                Ok(Some((value, o))) => {
                    *secret_slot(&mut args, s.name) = Some(value);
                    origin = o;
                }
                Ok(None) => {}
                Err(e) => problems.push(e),
            }
            // Only whether it is set: the value itself stays in `args`.
            let set = secret_slot(&mut args, s.name)
                .as_ref()
                .is_some_and(|v| !v.trim().is_empty());
            values.insert(s.name, set.then(|| "<set>".to_string()));
        } else {
            values.insert(
                s.name,
                m.try_get_one::<String>(s.name).ok().flatten().cloned(),
            );
        }
        origins.insert(s.name, origin);
    }
    if !problems.is_empty() {
        return Err(problems);
    }
    Ok(Layered {
        args,
        file: file.map(|f| f.path.clone()),
        values,
        origins,
    })
}

fn is_blank(v: &Option<OsString>) -> bool {
    v.as_ref()
        .is_none_or(|v| v.to_string_lossy().trim().is_empty())
}

/// A secret read from `<VAR>_FILE` or `<key>_file` when that layer wins.
fn secret_from_file(
    s: &Setting,
    source: Source,
    file: Option<&FileValues>,
    env: &dyn Fn(&str) -> Option<OsString>,
) -> Result<Option<(String, Origin)>, ConfigError> {
    let env_file_var = s.env_file().unwrap_or_default();
    let env_file = env(&env_file_var);
    let env_file_set = !is_blank(&env_file);
    if env_file_set && !is_blank(&env(s.env)) {
        return Err(ConfigError(format!(
            "set {} or {env_file_var}, not both",
            s.env
        )));
    }
    if source == Source::Flag {
        return Ok(None);
    }
    if env_file_set {
        let path = PathBuf::from(env_file.unwrap_or_default());
        let value = read_secret(&env_file_var, &path)?;
        return Ok(Some((
            value,
            Origin {
                source: Source::Env,
                via: Some(env_file_var),
            },
        )));
    }
    if source != Source::Default {
        return Ok(None);
    }
    let key = s.key_file().unwrap_or_default();
    let Some((f, path)) = file.and_then(|f| f.get(&key).map(|p| (f, p))) else {
        return Ok(None);
    };
    if path.trim().is_empty() {
        return Ok(None);
    }
    let label = format!("{}: `{key}`", f.path.display());
    let value = read_secret(&label, &PathBuf::from(path.trim()))?;
    Ok(Some((
        value,
        Origin {
            source: Source::File,
            via: Some(key),
        },
    )))
}

/// The secret held by the file at `path`, without one trailing line ending.
pub fn read_secret(label: &str, path: &std::path::Path) -> Result<String, ConfigError> {
    let bytes = std::fs::read(path)
        .map_err(|e| ConfigError(format!("{label}: cannot read {}: {e}", path.display())))?;
    let mut text = String::from_utf8(bytes)
        .map_err(|_| ConfigError(format!("{label}: {} is not UTF-8 text", path.display())))?;
    if text.ends_with('\n') {
        text.pop();
        if text.ends_with('\r') {
            text.pop();
        }
    }
    Ok(text)
}

/// The field of a secret setting.
fn secret_slot<'a>(a: &'a mut ServeArgs, name: &str) -> &'a mut Option<String> {
    match name {
        "assignment_signing_key" => &mut a.assignment_signing_key,
        "self_hosted_key" => &mut a.self_hosted_key,
        "admin_token" => &mut a.admin_token,
        "metrics_token" => &mut a.metrics_token,
        "cluster_key" => &mut a.cluster_key,
        "push_apns_key" => &mut a.push_apns_key,
        other => unreachable!("{other} is not a secret setting"),
    }
}

/// Parses `argv` (without the program name) as `serve` would: the configuration file named by
/// `--config`/`ORCA_RELAY_CONFIG`, then the environment and flags. For tests and embedding.
pub fn parse_serve<I, T>(argv: I) -> Result<Layered, Vec<ConfigError>>
where
    I: IntoIterator<Item = T>,
    T: Into<OsString> + Clone,
{
    use clap::{CommandFactory, FromArgMatches, Parser};
    #[derive(Parser)]
    #[command(name = "orca-relay")]
    struct Flags {
        #[command(flatten)]
        args: ServeArgs,
    }
    let argv: Vec<OsString> = std::iter::once(OsString::from("orca-relay"))
        .chain(argv.into_iter().map(Into::into))
        .collect();
    let clap_err = |e: clap::Error| vec![ConfigError(e.to_string().trim().to_string())];
    let first = Flags::command()
        .try_get_matches_from(argv.clone())
        .map_err(clap_err)?;
    let file = match config_path(&first) {
        Some(p) => Some(super::file::load(&p)?),
        None => None,
    };
    let m = match &file {
        Some(f) => with_file_defaults(Flags::command(), f)
            .try_get_matches_from(argv)
            .map_err(clap_err)?,
        None => first,
    };
    let flags = Flags::from_arg_matches(&m).map_err(clap_err)?;
    resolve(flags.args, &m, file.as_ref(), &|k| std::env::var_os(k))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn read_secret_strips_one_line_ending() {
        let dir = crate::store::testing::temp_dir("orca-relay-secret-file");
        for (content, want) in [
            ("abc\n", "abc"),
            ("abc\r\n", "abc"),
            ("abc\n\n", "abc\n"),
            ("abc", "abc"),
        ] {
            let p = dir.join("s");
            std::fs::write(&p, content).unwrap();
            assert_eq!(read_secret("X_FILE", &p).unwrap(), want);
        }
        let missing = dir.join("missing");
        let e = read_secret("X_FILE", &missing).unwrap_err().0;
        assert!(e.starts_with("X_FILE: cannot read "), "{e}");
        assert!(e.contains(&missing.display().to_string()), "{e}");
    }
}
