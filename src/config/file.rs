//! The optional TOML configuration file (`--config PATH` / `ORCA_RELAY_CONFIG`).
//!
//! Flat `key = value` lines, one key per setting (its name in [`super::settings::SETTINGS`]), and
//! `<key>_file` for each secret. Strict: an unknown key, a value of the wrong type (an integer
//! setting given as a string, an array where one value is expected, a table) or a secret given
//! both ways stops start-up, one line per problem naming the key.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::settings::{self, Kind, SETTINGS};
use super::ConfigError;

/// A parsed file: each key's value as the text a flag would carry.
#[derive(Debug, Clone, Default)]
pub struct FileValues {
    pub path: PathBuf,
    pub values: BTreeMap<String, String>,
}

impl FileValues {
    pub fn get(&self, key: &str) -> Option<&str> {
        self.values.get(key).map(String::as_str)
    }
}

/// Reads and checks the file at `path`.
pub fn load(path: &Path) -> Result<FileValues, Vec<ConfigError>> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        vec![ConfigError(format!(
            "ORCA_RELAY_CONFIG: cannot read {}: {e}",
            path.display()
        ))]
    })?;
    let values = parse(&path.display().to_string(), &text)?;
    Ok(FileValues {
        path: path.to_path_buf(),
        values,
    })
}

/// Checks `text` (named `label` in messages) and returns each key's value as text.
pub fn parse(label: &str, text: &str) -> Result<BTreeMap<String, String>, Vec<ConfigError>> {
    let table: toml::Table = text.parse().map_err(|e: toml::de::Error| {
        let line = e
            .span()
            .map(|s| text[..s.start.min(text.len())].matches('\n').count() + 1);
        let msg = e.message().trim().replace('\n', " ");
        vec![ConfigError(match line {
            Some(n) => format!("{label}: invalid TOML at line {n}: {msg}"),
            None => format!("{label}: invalid TOML: {msg}"),
        })]
    })?;
    let mut values = BTreeMap::new();
    let mut problems = Vec::new();
    for (key, value) in &table {
        match convert(key, value) {
            Ok(text) => {
                values.insert(key.clone(), text);
            }
            Err(rule) => problems.push(ConfigError(format!("{label}: {rule}"))),
        }
    }
    for s in SETTINGS.iter().filter(|s| s.secret) {
        let file_key = s.key_file().unwrap_or_default();
        if table.contains_key(s.name) && table.contains_key(&file_key) {
            problems.push(ConfigError(format!(
                "{label}: set `{}` or `{file_key}`, not both",
                s.name
            )));
        }
    }
    if problems.is_empty() {
        Ok(values)
    } else {
        Err(problems)
    }
}

/// Every key the file accepts.
pub fn known_keys() -> Vec<String> {
    let mut keys: Vec<String> = SETTINGS.iter().map(|s| s.name.to_string()).collect();
    keys.extend(SETTINGS.iter().filter_map(|s| s.key_file()));
    keys
}

/// One value as flag text, or the rule it broke (naming the key).
fn convert(key: &str, value: &toml::Value) -> Result<String, String> {
    use toml::Value as V;
    let kind = match settings::find(key) {
        Some(s) => s.kind,
        None if is_secret_file_key(key) => Kind::Path,
        None => {
            let keys = known_keys();
            return Err(
                match settings::did_you_mean(key, keys.iter().map(String::as_str)) {
                    Some(k) => format!("unknown key `{key}` (did you mean `{k}`?)"),
                    None => format!("unknown key `{key}`"),
                },
            );
        }
    };
    match (kind, value) {
        (Kind::Int, V::Integer(i)) => Ok(i.to_string()),
        (Kind::Int, _) => Err(format!("`{key}` must be an integer")),
        (Kind::Bool, V::Boolean(b)) => Ok(b.to_string()),
        (Kind::Bool, _) => Err(format!("`{key}` must be true or false")),
        (Kind::List, V::String(s)) => Ok(s.clone()),
        (Kind::List, V::Array(items)) => {
            let mut parts = Vec::with_capacity(items.len());
            for item in items {
                match item {
                    V::String(s) if !s.trim().is_empty() && !s.contains(',') => {
                        parts.push(s.trim().to_string())
                    }
                    _ => {
                        return Err(format!(
                        "`{key}` must be a string or an array of non-empty strings without commas"
                    ))
                    }
                }
            }
            Ok(parts.join(","))
        }
        (Kind::List, _) => Err(format!("`{key}` must be a string or an array of strings")),
        (_, V::String(s)) => Ok(s.clone()),
        (_, _) => Err(format!("`{key}` must be a string")),
    }
}

fn is_secret_file_key(key: &str) -> bool {
    key.strip_suffix("_file")
        .and_then(settings::find)
        .is_some_and(|s| s.secret)
}

#[cfg(test)]
mod tests {
    use super::parse;

    fn problems(text: &str) -> Vec<String> {
        match parse("f.toml", text) {
            Ok(v) => panic!("accepted {text:?}: {v:?}"),
            Err(es) => es.into_iter().map(|e| e.0).collect(),
        }
    }

    #[test]
    fn values_become_flag_text() {
        let v = parse(
            "f.toml",
            "listen = \"0.0.0.0:80\"\ndatabase_pool_max = 20\nmetrics_tls = true\nregions = [\"eu-west1\", \"us-east1\"]\nadmin_token_file = \"/run/secrets/admin\"\n",
        )
        .expect("valid");
        assert_eq!(v["listen"], "0.0.0.0:80");
        assert_eq!(v["database_pool_max"], "20");
        assert_eq!(v["metrics_tls"], "true");
        assert_eq!(v["regions"], "eu-west1,us-east1");
        assert_eq!(v["admin_token_file"], "/run/secrets/admin");
    }

    #[test]
    fn unknown_key_names_it_and_suggests() {
        assert_eq!(
            problems("listn = \"127.0.0.1:1\""),
            ["f.toml: unknown key `listn` (did you mean `listen`?)"]
        );
        assert_eq!(problems("zzz = 1"), ["f.toml: unknown key `zzz`"]);
        // a secret's *_file key exists only for secrets
        assert_eq!(
            problems("listen_file = \"x\""),
            ["f.toml: unknown key `listen_file` (did you mean `listen`?)"]
        );
    }

    #[test]
    fn wrong_types_name_the_key() {
        for (text, want) in [
            (
                "database_pool_max = \"10\"",
                "`database_pool_max` must be an integer",
            ),
            (
                "database_pool_max = 1.5",
                "`database_pool_max` must be an integer",
            ),
            ("listen = 8080", "`listen` must be a string"),
            ("listen = [\"a\"]", "`listen` must be a string"),
            ("metrics_tls = 1", "`metrics_tls` must be true or false"),
            (
                "regions = [1]",
                "`regions` must be a string or an array of non-empty",
            ),
            (
                "regions = [\"a,b\"]",
                "`regions` must be a string or an array of non-empty",
            ),
            ("role = 3", "`role` must be a string or an array of strings"),
            ("[listen]\nx = 1", "`listen` must be a string"),
            (
                "admin_token_file = 3",
                "`admin_token_file` must be a string",
            ),
        ] {
            let p = problems(text);
            assert_eq!(p.len(), 1, "{text}: {p:?}");
            assert!(
                p[0].starts_with(&format!("f.toml: {want}")),
                "{text}: {p:?}"
            );
        }
    }

    #[test]
    fn every_problem_is_reported_once() {
        let p = problems("listn = \"x\"\ncell_capacity = \"1\"\n");
        assert_eq!(p.len(), 2, "{p:?}");
    }

    #[test]
    fn secret_and_its_file_together_are_refused() {
        assert_eq!(
            problems("admin_token = \"x\"\nadmin_token_file = \"/y\""),
            ["f.toml: set `admin_token` or `admin_token_file`, not both"]
        );
    }

    #[test]
    fn invalid_toml_is_one_line_with_the_line_number() {
        let p = problems("listen = \"a\"\nlisten = \"b\"\n");
        assert_eq!(p.len(), 1);
        assert!(p[0].starts_with("f.toml: invalid TOML at line 2:"), "{p:?}");
        assert!(!p[0].contains('\n'));
    }
}
