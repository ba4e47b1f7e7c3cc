//! docs/configuration.md and deploy/orca-relay.toml are generated from the settings table.
//! `ORCA_RELAY_BLESS=1 cargo test --test docs_configuration` rewrites them.

use std::path::Path;

fn check(rel: &str, want: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join(rel);
    if std::env::var_os("ORCA_RELAY_BLESS").is_some() {
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).expect("create dir");
        }
        std::fs::write(&path, want).expect("write");
        return;
    }
    let have = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        have == want,
        "{rel} is out of date: run ORCA_RELAY_BLESS=1 cargo test --test docs_configuration"
    );
}

#[test]
fn configuration_page_is_current() {
    check(
        "docs/configuration.md",
        &orca_relay::config::docs::configuration_markdown(),
    );
}

#[test]
fn example_file_is_current() {
    check(
        "deploy/orca-relay.toml",
        &orca_relay::config::docs::example_toml(),
    );
}

/// Every commented key of the example, uncommented, is a known key of the right type.
#[test]
fn example_file_keys_are_accepted() {
    let text = orca_relay::config::docs::example_toml();
    let mut seen = std::collections::HashSet::new();
    let uncommented: String = text
        .lines()
        .filter_map(|l| l.strip_prefix('#'))
        .filter(|l| l.contains(" = ") && !l.starts_with(' '))
        // one of each secret's two forms (both together are refused)
        .filter(|l| {
            let key = l.split(" = ").next().unwrap_or("");
            seen.insert(key.trim_end_matches("_file").to_string())
        })
        .map(|l| format!("{l}\n"))
        .collect();
    orca_relay::config::file::parse("example", &uncommented).unwrap_or_else(|e| panic!("{e:?}"));
    assert!(seen.len() >= orca_relay::config::settings::SETTINGS.len());
}
