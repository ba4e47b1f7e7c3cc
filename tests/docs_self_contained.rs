//! The repository stands alone: no tracked file points at the specification outside it, and every
//! relative link in README.md and docs/ resolves to a file or directory in the repository.

use std::path::{Path, PathBuf};
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Tracked files (`git ls-files`), or every file under the root but `target/` and `.git/` when git
/// is not available.
fn tracked() -> Vec<PathBuf> {
    let out = Command::new("git")
        .arg("ls-files")
        .current_dir(root())
        .output();
    if let Ok(o) = out {
        if o.status.success() {
            return String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter(|l| !l.is_empty())
                .map(PathBuf::from)
                .collect();
        }
    }
    let mut files = Vec::new();
    let mut stack = vec![PathBuf::new()];
    while let Some(rel) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(root().join(&rel)) else {
            continue;
        };
        for e in entries.flatten() {
            let name = e.file_name();
            if name == "target" || name == ".git" {
                continue;
            }
            let p = rel.join(&name);
            if e.path().is_dir() {
                stack.push(p);
            } else {
                files.push(p);
            }
        }
    }
    files
}

/// The patterns that point outside the repository, built at run time so this file does not
/// match itself.
fn forbidden() -> Vec<String> {
    let mut v = vec![
        format!("{}/{}", "shared", "spec"),
        format!("{}/{}", "..", "shared"),
    ];
    for f in ["README", "protocol", "director", "push", "operations"] {
        v.push(format!("{f}.md {}", '§'));
        v.push(format!("{f}.md{}", '§'));
    }
    v.push(format!("README {}", '§'));
    v
}

#[test]
fn no_file_points_at_the_outside_spec() {
    let patterns = forbidden();
    let mut hits = Vec::new();
    for f in tracked() {
        // Fixtures and binary files are not text; skip what does not read as UTF-8.
        let Ok(text) = std::fs::read_to_string(root().join(&f)) else {
            continue;
        };
        for (n, line) in text.lines().enumerate() {
            if let Some(p) = patterns.iter().find(|p| line.contains(p.as_str())) {
                hits.push(format!("{}:{}: `{p}`", f.display(), n + 1));
            }
        }
    }
    assert!(
        hits.is_empty(),
        "{} lines point outside the repository (cite docs/ pages instead):\n{}",
        hits.len(),
        hits.join("\n")
    );
}

/// Relative link targets of a Markdown text (`[text](target)`), without their `#fragment`.
fn links(text: &str) -> Vec<String> {
    let mut out = Vec::new();
    let mut in_code = false;
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            in_code = !in_code;
            continue;
        }
        if in_code {
            continue;
        }
        let mut rest = line;
        while let Some(i) = rest.find("](") {
            let after = &rest[i + 2..];
            let Some(end) = after.find(')') else {
                break;
            };
            let target = after[..end].trim();
            let target = target.split_whitespace().next().unwrap_or("");
            let external = target.contains("://")
                || target.starts_with("mailto:")
                || target.starts_with('#')
                || target.is_empty();
            if !external {
                let path = target.split('#').next().unwrap_or("");
                out.push(path.to_string());
            }
            rest = &after[end..];
        }
    }
    out
}

/// Pages other parts of the project add (configuration, metrics, upgrade, backup, deploy files).
/// A link to one of these is checked once the target exists; until then it is reported, not
/// failed. Empty this list once they are all in the repository.
const PENDING: &[&str] = &[];

fn normalize(p: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in p.components() {
        match c {
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

#[test]
fn every_relative_link_resolves() {
    let pages: Vec<PathBuf> = tracked()
        .into_iter()
        .filter(|f| {
            f == Path::new("README.md")
                || f == Path::new("CONTRIBUTING.md")
                || (f.starts_with("docs") && f.extension().is_some_and(|e| e == "md"))
        })
        .collect();
    assert!(
        pages.iter().any(|p| p.starts_with("docs")),
        "no docs/ pages"
    );
    let mut broken = Vec::new();
    let mut pending = Vec::new();
    for page in &pages {
        let text = std::fs::read_to_string(root().join(page)).unwrap();
        let dir = page.parent().unwrap_or(Path::new(""));
        for link in links(&text) {
            let target = normalize(&dir.join(&link));
            if root().join(&target).exists() {
                continue;
            }
            let t = target.to_string_lossy().trim_end_matches('/').to_string();
            if PENDING
                .iter()
                .any(|p| t == *p || t.starts_with(&format!("{p}/")))
            {
                pending.push(format!("{}: {link}", page.display()));
            } else {
                broken.push(format!("{}: {link}", page.display()));
            }
        }
    }
    if !pending.is_empty() {
        eprintln!(
            "note: links to pages not in the repository yet (PENDING):\n{}",
            pending.join("\n")
        );
    }
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn link_extraction() {
    let t =
        "see [a](docs/a.md#x) and [b](https://e.org) [c](#here)\n```\n[d](no.md)\n```\n[e](../f/)";
    assert_eq!(links(t), vec!["docs/a.md", "../f/"]);
}
