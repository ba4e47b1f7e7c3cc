//! House rule: no function outside tests is longer than `MAX_LINES` lines.
//!
//! A long function hides its steps; split it into named steps, each a function whose name says what
//! it does. Two things are not counted:
//!
//! - a flat table: a body that is one `match` whose arms each fit on one line;
//! - a function whose attributes or doc comment carry a `function-length: allow(<reason>)` line.
//!   Use it sparingly, and say why the function reads better whole.
//!
//! Lines are counted from the `fn` keyword to the closing brace, doc comments and attributes
//! excluded. Test code (`#[cfg(test)]` items and modules, `#[test]` functions) is not checked.
//! The test fails listing every long function, longest first, and prints the tree's numbers when it
//! passes. `ORCA_RELAY_FUNCTION_LENGTH_SRC=<dir>` measures another `src/` tree with the same rules.

use std::fs;
use std::path::{Path, PathBuf};

use syn::spanned::Spanned;
use syn::visit::Visit;

const MAX_LINES: usize = 80;

/// Functions still over the limit, as `path::Type::name` (paths relative to `src/`), waiting to be
/// split. Only shrinks: an entry that is no longer over the limit fails the test so it gets removed.
const REMAINING: &[&str] = &[];

const ALLOW_MARK: &str = "function-length: allow(";

struct LongFn {
    name: String,
    lines: usize,
}

fn rust_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for entry in fs::read_dir(dir).unwrap().flatten() {
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

fn is_test_only(attrs: &[syn::Attribute]) -> bool {
    attrs.iter().any(|attr| {
        let path = attr.path();
        if path.is_ident("test") || path.segments.last().is_some_and(|s| s.ident == "test") {
            return true;
        }
        if !path.is_ident("cfg") {
            return false;
        }
        let mut test = false;
        let _ = attr.parse_nested_meta(|meta| {
            test |= meta.path.is_ident("test");
            Ok(())
        });
        test
    })
}

/// A body that is one `match` (possibly the tail of the block) whose arms each sit on one line.
fn is_flat_table(block: &syn::Block) -> bool {
    let [stmt] = block.stmts.as_slice() else {
        return false;
    };
    let expr = match stmt {
        syn::Stmt::Expr(expr, _) => expr,
        _ => return false,
    };
    let expr = match expr {
        syn::Expr::Return(ret) => match &ret.expr {
            Some(inner) => inner.as_ref(),
            None => return false,
        },
        other => other,
    };
    let syn::Expr::Match(m) = expr else {
        return false;
    };
    m.arms.iter().all(|arm| {
        let span = arm.span();
        span.start().line == span.end().line
    })
}

struct Finder<'a> {
    file: &'a str,
    lines: &'a [&'a str],
    self_ty: Vec<String>,
    found: Vec<LongFn>,
    tables: usize,
    allowed: usize,
}

impl Finder<'_> {
    /// The comment and attribute lines directly above `line` (1-based) carry the allow mark.
    fn allowed_above(&self, line: usize) -> bool {
        let mut i = line.saturating_sub(1);
        while i > 0 {
            let text = self.lines[i - 1].trim();
            if text.contains(ALLOW_MARK) {
                return true;
            }
            let attr_or_comment =
                text.starts_with("//") || text.starts_with("#[") || text.starts_with("#!");
            if !attr_or_comment
                && !text.ends_with(']')
                && !text.ends_with(',')
                && !text.ends_with('(')
            {
                return false;
            }
            i -= 1;
        }
        false
    }

    fn check(
        &mut self,
        name: &syn::Ident,
        attrs: &[syn::Attribute],
        fn_line: usize,
        block: &syn::Block,
    ) {
        if is_test_only(attrs) {
            return;
        }
        let end = block.brace_token.span.close().end().line;
        let lines = end + 1 - fn_line;
        if lines <= MAX_LINES {
            return;
        }
        if is_flat_table(block) {
            self.tables += 1;
            return;
        }
        if self.allowed_above(fn_line) {
            self.allowed += 1;
            return;
        }
        let mut qualified = self.file.to_string();
        if let Some(ty) = self.self_ty.last() {
            qualified.push_str("::");
            qualified.push_str(ty);
        }
        qualified.push_str("::");
        qualified.push_str(&name.to_string());
        self.found.push(LongFn {
            name: qualified,
            lines,
        });
    }
}

fn type_name(ty: &syn::Type) -> String {
    match ty {
        syn::Type::Path(p) => p
            .path
            .segments
            .last()
            .map(|s| s.ident.to_string())
            .unwrap_or_default(),
        _ => "_".to_string(),
    }
}

impl<'ast> Visit<'ast> for Finder<'_> {
    fn visit_item_mod(&mut self, item: &'ast syn::ItemMod) {
        if !is_test_only(&item.attrs) && item.ident != "tests" {
            syn::visit::visit_item_mod(self, item);
        }
    }

    fn visit_item_impl(&mut self, item: &'ast syn::ItemImpl) {
        if is_test_only(&item.attrs) {
            return;
        }
        self.self_ty.push(type_name(&item.self_ty));
        syn::visit::visit_item_impl(self, item);
        self.self_ty.pop();
    }

    fn visit_item_trait(&mut self, item: &'ast syn::ItemTrait) {
        if is_test_only(&item.attrs) {
            return;
        }
        self.self_ty.push(item.ident.to_string());
        syn::visit::visit_item_trait(self, item);
        self.self_ty.pop();
    }

    fn visit_item_fn(&mut self, item: &'ast syn::ItemFn) {
        let line = item.sig.fn_token.span.start().line;
        self.check(&item.sig.ident, &item.attrs, line, &item.block);
        // A free function nested in a method is not a method of the impl.
        let outer = std::mem::take(&mut self.self_ty);
        if !is_test_only(&item.attrs) {
            syn::visit::visit_item_fn(self, item);
        }
        self.self_ty = outer;
    }

    fn visit_impl_item_fn(&mut self, item: &'ast syn::ImplItemFn) {
        let line = item.sig.fn_token.span.start().line;
        self.check(&item.sig.ident, &item.attrs, line, &item.block);
        if !is_test_only(&item.attrs) {
            syn::visit::visit_impl_item_fn(self, item);
        }
    }

    fn visit_trait_item_fn(&mut self, item: &'ast syn::TraitItemFn) {
        if let Some(block) = &item.default {
            let line = item.sig.fn_token.span.start().line;
            self.check(&item.sig.ident, &item.attrs, line, block);
        }
        if !is_test_only(&item.attrs) {
            syn::visit::visit_trait_item_fn(self, item);
        }
    }
}

/// Files that are test modules declared out of line (`#[cfg(test)] mod name;`).
fn test_module_files(path: &Path, file: &syn::File) -> Vec<PathBuf> {
    let dir = path.parent().unwrap();
    let stem = path.file_stem().unwrap();
    let base = if stem == "mod" || stem == "lib" || stem == "main" {
        dir.to_path_buf()
    } else {
        dir.join(stem)
    };
    file.items
        .iter()
        .filter_map(|item| match item {
            syn::Item::Mod(m)
                if m.content.is_none() && (is_test_only(&m.attrs) || m.ident == "tests") =>
            {
                Some(m.ident.to_string())
            }
            _ => None,
        })
        .flat_map(|name| {
            [
                base.join(format!("{name}.rs")),
                base.join(&name).join("mod.rs"),
            ]
        })
        .collect()
}

/// Runs the rules over one file's text: `(long functions, flat tables, allowed by comment)`.
fn measure(rel: &str, text: &str, file: &syn::File) -> (Vec<LongFn>, usize, usize) {
    let lines: Vec<&str> = text.lines().collect();
    let mut finder = Finder {
        file: rel,
        lines: &lines,
        self_ty: Vec::new(),
        found: Vec::new(),
        tables: 0,
        allowed: 0,
    };
    finder.visit_file(file);
    (finder.found, finder.tables, finder.allowed)
}

/// A function of `n` body lines (plus its signature and closing brace).
fn long_fn(name: &str, n: usize) -> String {
    let body: String = (0..n).map(|i| format!("    let _x{i} = {i};\n")).collect();
    format!("fn {name}() {{\n{body}}}\n")
}

#[test]
fn the_rules_on_a_sample() {
    let arms: String = (0..90)
        .map(|i| format!("        {i} => \"{i}\",\n"))
        .collect();
    let table = format!("fn table(n: u32) -> &'static str {{\n    match n {{\n{arms}        _ => \"\",\n    }}\n}}\n");
    let text = [
        long_fn("short", 78),
        long_fn("long", 79),
        table,
        format!(
            "/// Why.\n// function-length: allow(a sample)\n{}",
            long_fn("allowed", 90)
        ),
        format!("impl S {{\n{}}}\n", long_fn("method", 85)),
        format!("#[cfg(test)]\nmod t {{\n{}}}\n", long_fn("in_tests", 90)),
        format!("#[test]\n{}", long_fn("a_test", 90)),
    ]
    .concat();
    let file = syn::parse_file(&text).unwrap();
    let (found, tables, allowed) = measure("x.rs", &text, &file);
    let names: Vec<(&str, usize)> = found.iter().map(|f| (f.name.as_str(), f.lines)).collect();
    assert_eq!(names, vec![("x.rs::long", 81), ("x.rs::S::method", 87)]);
    assert_eq!((tables, allowed), (1, 1));
}

#[test]
fn no_function_over_the_limit() {
    // Another tree (an older checkout's `src/`) can be measured with the same rules.
    let src = std::env::var_os("ORCA_RELAY_FUNCTION_LENGTH_SRC")
        .map(PathBuf::from)
        .unwrap_or_else(|| Path::new(env!("CARGO_MANIFEST_DIR")).join("src"));
    let files = rust_files(&src);
    let mut parsed = Vec::new();
    let mut skip: Vec<PathBuf> = Vec::new();
    for path in &files {
        let text = fs::read_to_string(path).unwrap();
        let file = syn::parse_file(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        skip.extend(test_module_files(path, &file));
        parsed.push((path, text, file));
    }

    let mut found = Vec::new();
    let (mut tables, mut allowed) = (0, 0);
    for (path, text, file) in &parsed {
        if skip.contains(path) {
            continue;
        }
        let rel = path
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        let (long, t, a) = measure(&rel, text, file);
        tables += t;
        allowed += a;
        found.extend(long);
    }
    found.sort_by(|a, b| b.lines.cmp(&a.lines).then_with(|| a.name.cmp(&b.name)));

    let over_100 = found.iter().filter(|f| f.lines > 100).count();
    let longest = found.first().map_or(0, |f| f.lines);
    println!(
        "functions over {MAX_LINES} lines: {} (over 100: {over_100}, longest: {longest}); \
         flat tables not counted: {tables}; allowed by comment: {allowed}; listed in REMAINING: {}",
        found.len(),
        REMAINING.len()
    );

    let unlisted: Vec<&LongFn> = found
        .iter()
        .filter(|f| !REMAINING.contains(&f.name.as_str()))
        .collect();
    let stale: Vec<&&str> = REMAINING
        .iter()
        .filter(|name| !found.iter().any(|f| f.name == **name))
        .collect();
    let mut report = String::new();
    for f in &unlisted {
        report.push_str(&format!("  {:>4} lines  {}\n", f.lines, f.name));
    }
    for name in &stale {
        report.push_str(&format!(
            "  no longer over the limit, remove from REMAINING: {name}\n"
        ));
    }
    assert!(
        report.is_empty(),
        "functions over {MAX_LINES} lines (split them into named steps):\n{report}"
    );
}
