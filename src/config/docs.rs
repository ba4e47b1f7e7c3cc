//! `docs/configuration.md` and `deploy/orca-relay.toml`, generated from the settings table.

use super::settings::{Kind, SettingDefault, SETTINGS};

fn default_text(d: SettingDefault) -> String {
    match d {
        SettingDefault::Value(v) => format!("`{v}`"),
        SettingDefault::Derived(t) => t.to_string(),
        SettingDefault::Unset => "unset".to_string(),
    }
}

fn cell(text: &str) -> String {
    text.replace('|', "\\|")
}

const HEADER: &str = r#"# Configuration

<!-- Generated from the settings table (src/config/settings.rs); do not edit by hand.
     Regenerate with: ORCA_RELAY_BLESS=1 cargo test --test docs_configuration -->

Every setting of `orca-relay serve` can be given four ways. From lowest to highest precedence:

1. its **default**,
2. a key in the optional **configuration file** (`--config PATH` or `ORCA_RELAY_CONFIG`),
3. its **environment variable**,
4. its **command-line flag**.

An empty or whitespace-only value counts as unset. An invalid value stops start-up with one line
that names the variable and the rule it broke (and the file key, when the value came from the file).

## Configuration file

TOML, one flat `key = value` per setting; the key is the setting's name below (the variable
without its `ORCA_RELAY_`/`ORCA_PUSH_` prefix, in lower case, with `push_` kept for the push
gateway). Integers are TOML integers, switches are `true`/`false`, lists are a string with commas
or an array of strings, everything else is a string. An unknown key, a value of the wrong type, or
a table or array where one value is expected stops start-up, one line per problem naming the key
(with a suggestion for a misspelled key). `deploy/orca-relay.toml` lists every key.

```toml
role = "all"
listen = "0.0.0.0:8080"
public_url = "https://relay.example.com"
database_url = "postgres://orca@db.internal/orca"
regions = ["us-central1", "asia-east2"]
metrics_tls = false
admin_token_file = "/run/secrets/orca-admin-token"
```

## Secrets from files

Each secret (marked below) can instead be read from a file: the variable `<VARIABLE>_FILE`
(e.g. `ORCA_RELAY_ADMIN_TOKEN_FILE=/run/secrets/admin`) or the file key `<key>_file`
(e.g. `admin_token_file = "/run/secrets/admin"`). The file's content is the value, with one
trailing line ending removed. `<VARIABLE>_FILE` sits at the environment's precedence and
`<key>_file` at the file's. Setting both a secret and its `_FILE` form in the same place, or naming
a file that cannot be read, stops start-up with one line naming the variable (or key) and the path.

## Unknown variables

At start-up every `ORCA_RELAY_*` or `ORCA_PUSH_*` environment variable that the relay does not
read draws one warning line, with the closest known name:
`unknown environment variable ORCA_RELAY_LISTN ignored (did you mean ORCA_RELAY_LISTEN?)`.

## Checking and printing

- `orca-relay config check` validates exactly what `serve` would (file, environment and flags,
  including certificate and credential files) without creating the data directory or secrets file.
  It prints each problem and exits with status 2, or prints `configuration OK` and a summary.
- `orca-relay config print` prints every effective setting and where it came from (`default`,
  `file`, `env`, `flag`); secrets are shown only as `<set>` or `<unset>`.
- `orca-relay migrate` reads only the database settings (`database_url`, `data_dir`).

Both accept the same flags as `serve`.

## Settings

"#;

/// The Markdown of `docs/configuration.md`.
pub fn configuration_markdown() -> String {
    let mut out = String::from(HEADER);
    out.push_str(
        "| Setting | Variable | Flag | File key | Type | Default | Allowed | Roles | Secret |\n",
    );
    out.push_str("|---|---|---|---|---|---|---|---|---|\n");
    for s in SETTINGS {
        out.push_str(&format!(
            "| {} | `{}` | `{}` | `{}` | {} | {} | {} | {} | {} |\n",
            cell(s.help),
            s.env,
            s.flag(),
            s.name,
            s.kind.describe(),
            cell(&default_text(s.default)),
            cell(s.range),
            s.roles,
            if s.secret { "yes" } else { "no" },
        ));
    }
    out.push_str(
        "\nSecrets also accept `<Variable>_FILE` and `<file key>_file` (see above). Roles: the \
         roles whose behaviour the setting changes; other roles ignore it.\n",
    );
    out
}

/// The text of `deploy/orca-relay.toml`: every key, commented out, with its help and default.
pub fn example_toml() -> String {
    let mut out = String::from(
        "# orca-relay configuration file: orca-relay serve --config /etc/orca-relay.toml\n\
         # (or ORCA_RELAY_CONFIG). Environment variables and flags override these values.\n\
         # Generated from the settings table; docs/configuration.md describes every key.\n",
    );
    for s in SETTINGS {
        out.push_str(&format!(
            "\n# {} ({}; {}; {})\n",
            s.help, s.env, s.range, s.roles
        ));
        let value = match s.default {
            SettingDefault::Value(v) => toml_value(s.kind, v),
            _ => match s.kind {
                Kind::Int => "0".to_string(),
                Kind::Bool => "false".to_string(),
                _ => "\"\"".to_string(),
            },
        };
        if let SettingDefault::Derived(d) = s.default {
            out.push_str(&format!("# default: {d}\n"));
        }
        out.push_str(&format!("#{} = {value}\n", s.name));
        if let Some(k) = s.key_file() {
            out.push_str(&format!("#{k} = \"/run/secrets/{}\"\n", s.name));
        }
    }
    out
}

fn toml_value(kind: Kind, v: &str) -> String {
    match kind {
        Kind::Int => v.to_string(),
        Kind::Bool => (v == "1" || v == "true").to_string(),
        _ => format!("{v:?}"),
    }
}
