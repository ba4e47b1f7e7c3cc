//! Architecture invariants of `ARCHITECTURE.md`, enforced by reading the source tree.
//!
//! Each rule names the files it forbids something in. A rule may carry a list of known exceptions while a
//! redesign is under way; the test also fails when an exception is no longer needed, so the lists only shrink.

use std::fs;
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(rust_files(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
    out.sort();
    out
}

/// Source text with `//` comments removed, so prose that names a module does not count as a dependency.
fn code_of(path: &Path) -> String {
    let text = fs::read_to_string(path).unwrap();
    text.lines()
        .map(|line| match line.find("//") {
            Some(i) if !line[..i].contains('"') => &line[..i],
            _ => line,
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// `crate::<name>` used as a path (followed by `::`, `;`, `,`, `}` or whitespace), also inside `use crate::{…}`.
fn names_module(code: &str, module: &str) -> bool {
    let direct = format!("crate::{module}");
    let mut rest = code;
    while let Some(i) = rest.find(&direct) {
        let after = &rest[i + direct.len()..];
        if !after.starts_with(|c: char| c.is_alphanumeric() || c == '_') {
            return true;
        }
        rest = after;
    }
    // `use crate::{a, b::c}` groups.
    let mut rest = code;
    while let Some(i) = rest.find("crate::{") {
        let group = &rest[i + "crate::{".len()..];
        let end = group.find(';').unwrap_or(group.len());
        let group = &group[..end];
        let hit = group
            .split(|c: char| !(c.is_alphanumeric() || c == '_' || c == ':'))
            .any(|tok| tok == module || tok.starts_with(&format!("{module}::")));
        if hit {
            return true;
        }
        rest = &rest[i + 1..];
    }
    false
}

/// A string literal that starts an SQL statement.
fn holds_sql(code: &str) -> bool {
    const VERBS: [&str; 5] = ["SELECT", "UPDATE", "INSERT", "DELETE", "WITH"];
    let bytes = code.as_bytes();
    for (i, _) in code.match_indices('"') {
        let after = code[i + 1..].trim_start_matches([' ', '\n', '\t']);
        for verb in VERBS {
            if let Some(tail) = after.strip_prefix(verb) {
                if tail.starts_with([' ', '\n', '\t', '\\']) && (i == 0 || bytes[i - 1] != b'\\') {
                    return true;
                }
            }
        }
    }
    false
}

fn rel(path: &Path) -> String {
    path.strip_prefix(env!("CARGO_MANIFEST_DIR"))
        .unwrap()
        .to_string_lossy()
        .replace('\\', "/")
}

/// Checks one rule over the files below `dirs`, allowing exactly the listed exceptions.
fn rule(name: &str, dirs: &[&str], exceptions: &[&str], offends: impl Fn(&str, &str) -> bool) {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut offenders = Vec::new();
    for dir in dirs {
        for file in rust_files(&root.join(dir)) {
            let r = rel(&file);
            if offends(&r, &code_of(&file)) {
                offenders.push(r);
            }
        }
    }
    let unexpected: Vec<_> = offenders
        .iter()
        .filter(|f| !exceptions.contains(&f.as_str()))
        .collect();
    let stale: Vec<_> = exceptions
        .iter()
        .filter(|e| !offenders.iter().any(|o| o == *e))
        .collect();
    assert!(unexpected.is_empty(), "{name}: {unexpected:?}");
    assert!(
        stale.is_empty(),
        "{name}: exceptions no longer needed, delete them from the list: {stale:?}"
    );
}

#[test]
fn store_knows_no_roles_and_no_logging() {
    rule(
        "src/store names a role or logging",
        &["src/store"],
        &[],
        |_, code| {
            ["director", "cell", "push", "logging"]
                .iter()
                .any(|m| names_module(code, m))
        },
    );
}

/// `log::…` (a macro or path) or `use log…`: logging through the `log` crate.
fn logs(code: &str) -> bool {
    let bytes = code.as_bytes();
    code.match_indices("log::").any(|(i, _)| {
        i == 0
            || !(bytes[i - 1].is_ascii_alphanumeric()
                || bytes[i - 1] == b'_'
                || bytes[i - 1] == b':')
    }) || code.contains("use log")
}

/// A read of the wall clock: `clock::now_ms`, `SystemTime::now`, chrono's `Utc::now`/`Local::now`.
/// A monotonic `Instant` for a latency metric or a wait is not a time stamp and stays allowed.
fn reads_clock(code: &str) -> bool {
    ["clock::now_ms", "SystemTime::now", "Utc::now", "Local::now"]
        .iter()
        .any(|n| code.contains(n))
}

#[test]
fn store_logs_nothing() {
    rule(
        "src/store logs (report through store::observe; the caller logs)",
        &["src/store"],
        &[],
        |_, code| logs(code),
    );
}

#[test]
fn store_reads_no_clock() {
    rule(
        "src/store reads the clock (take `now` from the caller)",
        &["src/store"],
        // Test fixtures (`TestDb`), not storage: they migrate a fresh database at test time.
        &["src/store/testing.rs"],
        |_, code| reads_clock(code),
    );
}

#[test]
fn roles_hold_no_sql() {
    rule(
        "SQL outside src/store",
        &["src/director", "src/cell", "src/push"],
        &[],
        |_, code| holds_sql(code),
    );
}

#[test]
fn director_does_not_name_cell() {
    rule(
        "src/director names crate::cell",
        &["src/director"],
        &[],
        |_, code| names_module(code, "cell"),
    );
}

#[test]
fn cell_does_not_name_director() {
    rule(
        "src/cell names crate::director",
        &["src/cell"],
        &[],
        |_, code| names_module(code, "director"),
    );
}

/// Idle regional correction is shared by the director and the cell: it may use the model, the
/// contract and the store, never a role, the logging module or the HTTP layer.
#[test]
fn rehome_names_no_role() {
    rule(
        "src/rehome names a role, logging or http",
        &["src/rehome"],
        &[],
        |_, code| {
            ["director", "cell", "push", "logging", "http", "server"]
                .iter()
                .any(|m| names_module(code, m))
        },
    );
}

#[test]
fn rehome_holds_no_sql() {
    rule("SQL in src/rehome", &["src/rehome"], &[], |_, code| {
        holds_sql(code)
    });
}

#[test]
fn model_depends_on_contract_only() {
    const OURS: [&str; 13] = [
        "app",
        "cell",
        "cli",
        "clock",
        "config",
        "crypto",
        "director",
        "http",
        "logging",
        "metrics",
        "push",
        "readiness",
        "server",
    ];
    rule(
        "src/model names more than contract",
        &["src/model"],
        &[],
        |_, code| {
            OURS.iter()
                .chain(["store", "leg"].iter())
                .any(|m| names_module(code, m))
        },
    );
}

#[test]
fn director_and_push_meet_only_through_traits() {
    rule(
        "src/director names crate::push or src/push names crate::director",
        &["src/director", "src/push"],
        &[],
        |path, code| {
            (path.starts_with("src/director/") && names_module(code, "push"))
                || (path.starts_with("src/push/") && names_module(code, "director"))
        },
    );
}

/// One mutex-poisoning policy (`src/sync.rs`): std mutexes are locked through `sync::lock`.
fn unwraps_a_lock(code: &str) -> bool {
    let flat: String = code.chars().filter(|c| !c.is_whitespace()).collect();
    flat.contains(".lock().unwrap()")
        || flat.contains(".lock().expect(")
        || flat.contains(".lock().unwrap_or_else(")
}

#[test]
fn one_mutex_poisoning_policy() {
    rule(
        "std mutex locked outside crate::sync::lock",
        &["src"],
        &["src/sync.rs"],
        |_, code| unwraps_a_lock(code),
    );
}

/// `#![forbid(unsafe_code)]` in the library and the binary.
#[test]
fn no_unsafe_code() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    for entry in ["src/lib.rs", "src/main.rs"] {
        let text = fs::read_to_string(root.join(entry)).unwrap();
        assert!(text.contains("#![forbid(unsafe_code)]"), "{entry}");
    }
}

/// The director's pure rule modules: plain functions over model types, no store, no I/O.
const PURE_RULES: [&str; 3] = [
    "src/director/liveness.rs",
    "src/director/placement.rs",
    "src/cell/frame_rewrite.rs",
];

#[test]
fn pure_rules_name_only_model_and_contract() {
    const OTHERS: [&str; 15] = [
        "app",
        "cell",
        "cli",
        "clock",
        "config",
        "crypto",
        "director",
        "http",
        "logging",
        "metrics",
        "push",
        "readiness",
        "server",
        "store",
        "leg",
    ];
    rule(
        "a pure rule module names more than model and contract",
        &["src/director", "src/cell"],
        &[],
        |path, code| {
            PURE_RULES.contains(&path)
                && (OTHERS.iter().any(|m| names_module(code, m))
                    || code.contains(".await")
                    || code.contains("tokio::"))
        },
    );
}

#[test]
fn the_checks_see_what_they_look_for() {
    assert!(unwraps_a_lock("let g = m.lock()\n    .unwrap();"));
    assert!(!unwraps_a_lock("let g = m.lock().await;"));
    assert!(names_module("use crate::director::Director;", "director"));
    assert!(names_module(
        "use crate::{contract, director::x};",
        "director"
    ));
    assert!(!names_module("use crate::directory;", "director"));
    assert!(holds_sql("let q = \"SELECT a FROM b\";"));
    assert!(
        holds_sql("let q = \"\\\n  UPDATE t SET a = 1\";")
            || holds_sql("let q = \"UPDATE t SET a = 1\";")
    );
    assert!(!holds_sql("let s = \"selected\";"));
    assert!(logs("log::warn!(\"x\");"));
    assert!(logs("use log::info;"));
    assert!(!logs("let catalog = dialog::x();"));
    assert!(reads_clock("let t = crate::clock::now_ms();"));
    assert!(reads_clock("let t = std::time::SystemTime::now();"));
    assert!(!reads_clock("let t = std::time::Instant::now();"));
    assert!(!logs("let c = crate::catalog::x();"));
    assert!(!reads_clock("fn f(now: i64) {}"));
}

// ---------------------------------------------------------------------------------------------------
// No circles

/// The code of a file without its `#[cfg(test)]` modules: unit tests may reach across the crate,
/// they are not part of the library's dependency graph.
fn library_code_of(path: &Path) -> String {
    let code = code_of(path);
    match code.find("#[cfg(test)]\nmod ") {
        Some(i) => code[..i].to_string(),
        None => code,
    }
}

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// The first path segment after each `prefix` (`crate::`, `super::`, `crate::store::`), also for
/// each item of a `prefix{a, b::c}` group (`a`, `b`; nested groups are not followed).
fn first_segments(code: &str, prefix: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut rest = code;
    while let Some(i) = rest.find(prefix) {
        let before_ok = !code[..code.len() - rest.len() + i]
            .chars()
            .next_back()
            .is_some_and(is_ident);
        let after = &rest[i + prefix.len()..];
        rest = after;
        if !before_ok {
            continue;
        }
        if let Some(group) = after.strip_prefix('{') {
            let mut depth = 0usize;
            let mut item_start = true;
            let mut chars = group.char_indices().peekable();
            while let Some((j, c)) = chars.next() {
                match c {
                    '{' => depth += 1,
                    '}' if depth == 0 => break,
                    '}' => depth -= 1,
                    ',' if depth == 0 => item_start = true,
                    c if item_start && is_ident(c) => {
                        let name: String =
                            group[j..].chars().take_while(|&c| is_ident(c)).collect();
                        for _ in 1..name.chars().count() {
                            chars.next();
                        }
                        out.push(name);
                        item_start = false;
                    }
                    c if c.is_whitespace() => {}
                    _ => item_start = false,
                }
            }
        } else {
            let name: String = after.chars().take_while(|&c| is_ident(c)).collect();
            if !name.is_empty() {
                out.push(name);
            }
        }
    }
    out
}

type Graph = std::collections::BTreeMap<String, std::collections::BTreeSet<String>>;

/// A cycle of `graph` as the list of its nodes (first repeated at the end), if it has one.
fn find_cycle(graph: &Graph) -> Option<Vec<String>> {
    fn visit(
        graph: &Graph,
        node: &str,
        state: &mut std::collections::BTreeMap<String, u8>,
        stack: &mut Vec<String>,
    ) -> Option<Vec<String>> {
        state.insert(node.to_string(), 1);
        stack.push(node.to_string());
        for next in graph.get(node).into_iter().flatten() {
            match state.get(next.as_str()) {
                Some(1) => {
                    let from = stack.iter().position(|n| n == next).unwrap();
                    let mut cycle = stack[from..].to_vec();
                    cycle.push(next.clone());
                    return Some(cycle);
                }
                Some(_) => {}
                None => {
                    if let Some(c) = visit(graph, next, state, stack) {
                        return Some(c);
                    }
                }
            }
        }
        stack.pop();
        state.insert(node.to_string(), 2);
        None
    }
    let mut state = std::collections::BTreeMap::new();
    for node in graph.keys() {
        if !state.contains_key(node) {
            let mut stack = Vec::new();
            if let Some(c) = visit(graph, node, &mut state, &mut stack) {
                return Some(c);
            }
        }
    }
    None
}

fn src() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("src")
}

/// Top-level modules (`src/x.rs` or `src/x/`) and the `crate::y` each one names.
fn top_level_graph() -> Graph {
    let root = src();
    let mut modules = std::collections::BTreeSet::new();
    for entry in fs::read_dir(&root).unwrap().flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let name = name.strip_suffix(".rs").unwrap_or(&name).to_string();
        if name != "lib" && name != "main" {
            modules.insert(name);
        }
    }
    let mut graph = Graph::new();
    for module in &modules {
        let mut files = rust_files(&root.join(module));
        files.push(root.join(format!("{module}.rs")));
        let deps = graph.entry(module.clone()).or_default();
        for file in files.iter().filter(|f| f.exists()) {
            for dep in first_segments(&library_code_of(file), "crate::") {
                if modules.contains(&dep) && &dep != module {
                    deps.insert(dep);
                }
            }
        }
    }
    graph
}

/// The files of module directory `dir` (not `mod.rs`) and the siblings each one names through
/// `super::` or `crate::<module>::`.
fn file_graph(module: &str, dir: &Path) -> Graph {
    let files: Vec<PathBuf> = fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "rs") && !p.ends_with("mod.rs"))
        .collect();
    let stem = |p: &Path| p.file_stem().unwrap().to_string_lossy().into_owned();
    let siblings: std::collections::BTreeSet<String> = files.iter().map(|p| stem(p)).collect();
    let mut graph = Graph::new();
    for file in &files {
        let code = library_code_of(file);
        let me = stem(file);
        let mut names = first_segments(&code, "super::");
        names.extend(first_segments(&code, &format!("crate::{module}::")));
        let deps = graph.entry(me.clone()).or_default();
        for name in names {
            if siblings.contains(&name) && name != me {
                deps.insert(name);
            }
        }
    }
    graph
}

/// A module whose doc comment (in `mod.rs` or the parent `src/x.rs`) has a line starting
/// `//! Circle:` explains a cycle between its files and is not checked.
fn explains_a_circle(module: &str) -> bool {
    let root = src();
    [
        root.join(module).join("mod.rs"),
        root.join(format!("{module}.rs")),
    ]
    .iter()
    .filter_map(|p| fs::read_to_string(p).ok())
    .any(|text| {
        text.lines()
            .any(|l| l.trim_start().starts_with("//! Circle:"))
    })
}

#[test]
fn no_circle_between_top_level_modules() {
    let graph = top_level_graph();
    if let Some(cycle) = find_cycle(&graph) {
        panic!(
            "top-level modules name each other in a circle: {}; move the shared item down into a \
             module both can name",
            cycle.join(" -> ")
        );
    }
}

#[test]
fn no_circle_between_the_files_of_a_module() {
    let mut circles = Vec::new();
    for entry in fs::read_dir(src()).unwrap().flatten() {
        let dir = entry.path();
        if !dir.is_dir() {
            continue;
        }
        let module = entry.file_name().to_string_lossy().into_owned();
        if explains_a_circle(&module) {
            continue;
        }
        if let Some(cycle) = find_cycle(&file_graph(&module, &dir)) {
            circles.push(format!("src/{module}: {}", cycle.join(" -> ")));
        }
    }
    assert!(
        circles.is_empty(),
        "files of a module name each other in a circle (move the shared item into a small file \
         both name, or say why in a `//! Circle:` line of the module's doc comment):\n{}",
        circles.join("\n")
    );
}

#[test]
fn the_graph_checks_see_what_they_look_for() {
    assert_eq!(
        first_segments(
            "use crate::{a, b::c, d::{e, f}};\nlet x = crate::g::h();",
            "crate::"
        ),
        ["a", "b", "d", "g"]
    );
    assert_eq!(
        first_segments("use super::web::{bytes, post};", "super::"),
        ["web"]
    );
    assert!(first_segments("use mycrate::x;", "crate::").is_empty());
    let graph: Graph = [("a", "b"), ("b", "c"), ("c", "a"), ("c", "d")]
        .iter()
        .fold(Graph::new(), |mut g, (from, to)| {
            g.entry(from.to_string())
                .or_default()
                .insert(to.to_string());
            g
        });
    assert_eq!(
        find_cycle(&graph).unwrap(),
        ["a", "b", "c", "a"].map(String::from)
    );
    let mut acyclic = graph.clone();
    acyclic.get_mut("c").unwrap().remove("a");
    assert_eq!(find_cycle(&acyclic), None);
    // The real graphs are not empty, so the checks above look at something.
    assert!(top_level_graph()["server"].contains("director"));
    assert!(file_graph("director", &src().join("director"))["admin"].contains("web"));
}
