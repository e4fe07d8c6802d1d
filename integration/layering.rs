//! Layers that point one way: every `crate::<module>` (and `super::super::`)
//! reference in `src/` must go to the same top-level module or to one in a
//! lower layer. The table below is the one source of truth for the order;
//! docs/architecture.md ("Layers") mirrors it. `src/sim` is the emulator, a
//! crate of its own, and is not part of the product's layers.
//!
//! Modules that share a layer are siblings: they may not use each other
//! either, so the table also rules out cycles inside a layer.

use std::fs;
use std::path::{Path, PathBuf};

/// Bottom first. A module may use modules of strictly lower layers (and
/// itself); anything else is an upward or sideways import.
const LAYERS: &[(&str, &[&str])] = &[
    ("leaves", &["config", "crd", "http_client"]),
    ("postgres", &["postgres"]),
    ("platform", &["platform"]),
    ("emulated", &["emulated"]),
    ("observability", &["metrics", "telemetry"]),
    ("fleet", &["fleet"]),
    ("instance backup", &["pgbackrest"]),
    ("controller", &["controller"]),
    ("fleet operations", &["backup", "dr", "ha", "rollout"]),
    ("ops", &["ops"]),
    ("api", &["api"]),
    ("manager", &["manager"]),
    ("testkit", &["testkit"]),
    ("bench", &["bench"]),
    ("cli", &["cli"]),
];

/// Crates of their own, outside the product's layers.
const OUTSIDE: &[&str] = &["sim"];

/// One reference from a file to a top-level module.
#[derive(Debug)]
struct Reference {
    line: usize,
    target: String,
}

fn layer_of(module: &str) -> Option<(usize, &'static str)> {
    LAYERS
        .iter()
        .enumerate()
        .find(|(_, (_, mods))| mods.contains(&module))
        .map(|(i, (name, _))| (i, *name))
}

/// The module path of a file: `src/a/b.rs` is `[a, b]`, `src/a/mod.rs` is `[a]`.
fn module_path(src: &Path, file: &Path) -> Vec<String> {
    let rel = file.strip_prefix(src).unwrap_or(file);
    let mut parts: Vec<String> = rel
        .iter()
        .map(|p| p.to_string_lossy().trim_end_matches(".rs").to_string())
        .collect();
    if parts.last().is_some_and(|p| p == "mod") {
        parts.pop();
    }
    parts
}

/// The text with comments and string/char literals blanked (newlines kept),
/// so doc prose and log messages that mention `crate::x` are not imports.
fn code_only(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    let blank = |c: char| if c == '\n' { '\n' } else { ' ' };
    while i < b.len() {
        let c = b[i];
        let next = b.get(i + 1).copied();
        if c == '/' && next == Some('/') {
            while i < b.len() && b[i] != '\n' {
                out.push(' ');
                i += 1;
            }
        } else if c == '/' && next == Some('*') {
            let mut depth = 0;
            while i < b.len() {
                if b[i] == '/' && b.get(i + 1) == Some(&'*') {
                    depth += 1;
                    out.push_str("  ");
                    i += 2;
                } else if b[i] == '*' && b.get(i + 1) == Some(&'/') {
                    depth -= 1;
                    out.push_str("  ");
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
        } else if c == 'r' && (next == Some('"') || next == Some('#')) && !ident_before(&b, i) {
            // raw string r"..." / r#"..."#
            let mut j = i + 1;
            let mut hashes = 0;
            while b.get(j) == Some(&'#') {
                hashes += 1;
                j += 1;
            }
            if b.get(j) != Some(&'"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            'raw: while j < b.len() {
                if b[j] == '"' && (0..hashes).all(|k| b.get(j + 1 + k) == Some(&'#')) {
                    j += 1 + hashes;
                    break 'raw;
                }
                j += 1;
            }
            for &ch in &b[i..j.min(b.len())] {
                out.push(blank(ch));
            }
            i = j;
        } else if c == '"' {
            out.push(' ');
            i += 1;
            while i < b.len() && b[i] != '"' {
                if b[i] == '\\' {
                    out.push(' ');
                    i += 1;
                }
                if i < b.len() {
                    out.push(blank(b[i]));
                    i += 1;
                }
            }
            out.push(' ');
            i += 1;
        } else if c == '\'' && is_char_literal(&b, i) {
            let end = b[i + 1..]
                .iter()
                .position(|&x| x == '\'')
                .map_or(b.len(), |p| i + 2 + p);
            for _ in i..end {
                out.push(' ');
            }
            i = end;
        } else {
            out.push(c);
            i += 1;
        }
    }
    out
}

fn ident_before(b: &[char], i: usize) -> bool {
    i > 0 && (b[i - 1].is_alphanumeric() || b[i - 1] == '_')
}

/// `'a'`, `'\n'`, `'\''` are char literals; `'a` (a lifetime) is not.
fn is_char_literal(b: &[char], i: usize) -> bool {
    matches!(
        (b.get(i + 1), b.get(i + 2)),
        (Some('\\'), _) | (Some(_), Some('\''))
    )
}

fn ident_at(b: &[char], i: usize) -> String {
    b[i..]
        .iter()
        .take_while(|c| c.is_alphanumeric() || **c == '_')
        .collect()
}

fn skip_ws(b: &[char], mut i: usize) -> usize {
    while i < b.len() && b[i].is_whitespace() {
        i += 1;
    }
    i
}

/// The first path segment of each item of a `{...}` group starting at `i`
/// (the `{`), with the offset where each item starts.
fn group_heads(b: &[char], i: usize) -> Vec<(usize, String)> {
    let mut heads = Vec::new();
    let mut depth = 0;
    let mut j = i;
    let mut at_item_start = true;
    while j < b.len() {
        match b[j] {
            '{' => {
                depth += 1;
                if depth == 1 {
                    at_item_start = true;
                }
            }
            '}' => {
                depth -= 1;
                if depth == 0 {
                    break;
                }
            }
            ',' if depth == 1 => at_item_start = true,
            c if depth == 1 && at_item_start && !c.is_whitespace() => {
                heads.push((j, ident_at(b, j)));
                at_item_start = false;
            }
            _ => {}
        }
        j += 1;
    }
    heads
}

/// Every reference to another top-level module in one file's code.
fn references(src: &Path, file: &Path, text: &str) -> Vec<Reference> {
    let code: Vec<char> = code_only(text).chars().collect();
    let module = module_path(src, file);
    let line_of = |pos: usize| code[..pos].iter().filter(|&&c| c == '\n').count() + 1;
    let mut refs = Vec::new();
    // Inline modules (`mod tests { ... }`) add a level for `super::`.
    let mut braces = 0usize;
    let mut inline_mods: Vec<usize> = Vec::new();
    let mut i = 0;
    while i < code.len() {
        match code[i] {
            '{' => braces += 1,
            '}' => {
                braces = braces.saturating_sub(1);
                if inline_mods.last() == Some(&braces) {
                    inline_mods.pop();
                }
            }
            _ => {}
        }
        if ident_before(&code, i) || !code[i].is_alphabetic() {
            i += 1;
            continue;
        }
        let word = ident_at(&code, i);
        let after = i + word.len();
        if word == "mod" {
            let name_at = skip_ws(&code, after);
            let name = ident_at(&code, name_at);
            if code.get(skip_ws(&code, name_at + name.len())) == Some(&'{') {
                inline_mods.push(braces);
            }
        } else if word == "crate" && code[after..].starts_with(&[':', ':']) {
            let k = skip_ws(&code, after + 2);
            if code.get(k) == Some(&'{') {
                for (pos, head) in group_heads(&code, k) {
                    refs.push(Reference {
                        line: line_of(pos),
                        target: head,
                    });
                }
            } else {
                refs.push(Reference {
                    line: line_of(i),
                    target: ident_at(&code, k),
                });
            }
        } else if word == "super" {
            // `super::super::x`: resolve against the file's module path.
            let mut k = i;
            let mut ups = 0;
            while ident_at(&code, k) == "super" && code[k + 5..].starts_with(&[':', ':']) {
                ups += 1;
                k = skip_ws(&code, k + 7);
            }
            if ups >= module.len() + inline_mods.len() && ups > 1 {
                refs.push(Reference {
                    line: line_of(i),
                    target: ident_at(&code, k),
                });
            }
            i = k.max(i + 1);
            continue;
        }
        i = after.max(i + 1);
    }
    refs
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rust_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// `src/a/b.rs`, as the failure message names it.
fn shown(src: &Path, file: &Path) -> String {
    let root = src.parent().unwrap_or(src);
    file.strip_prefix(root)
        .unwrap_or(file)
        .display()
        .to_string()
}

/// Every reference that points up or sideways, as `file:line` messages.
fn violations(src: &Path) -> Vec<String> {
    let mut files = Vec::new();
    rust_files(src, &mut files);
    files.sort();
    let mut bad = Vec::new();
    for file in files {
        let module = module_path(src, &file);
        let Some(top) = module.first().cloned() else {
            continue;
        };
        if OUTSIDE.contains(&top.as_str()) || top == "lib" || top == "main" {
            continue;
        }
        let Some((from, from_name)) = layer_of(&top) else {
            bad.push(format!(
                "{}: module `{top}` is in no layer (add it to LAYERS)",
                shown(src, &file)
            ));
            continue;
        };
        let text = fs::read_to_string(&file).unwrap_or_default();
        for r in references(src, &file, &text) {
            if r.target == top || OUTSIDE.contains(&r.target.as_str()) {
                continue;
            }
            let Some((to, to_name)) = layer_of(&r.target) else {
                bad.push(format!(
                    "{}:{}: `{}` is in no layer",
                    shown(src, &file),
                    r.line,
                    r.target
                ));
                continue;
            };
            if to >= from {
                let how = if to == from {
                    "a sibling in"
                } else {
                    "the higher"
                };
                bad.push(format!(
                    "{}:{}: `{top}` (layer {from} {from_name}) uses `{}`, {how} layer {to} {to_name}",
                    shown(src, &file),
                    r.line,
                    r.target
                ));
            }
        }
    }
    bad
}

#[test]
fn imports_point_down() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let bad = violations(&src);
    assert!(
        bad.is_empty(),
        "{} import(s) point up or sideways (layers: docs/architecture.md, \"Layers\"):\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn every_module_has_a_layer() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let lib = fs::read_to_string(src.join("lib.rs")).unwrap_or_default();
    let missing: Vec<&str> = lib
        .lines()
        .filter_map(|l| l.trim().strip_prefix("pub mod "))
        .map(|m| m.trim_end_matches(';'))
        .filter(|m| layer_of(m).is_none() && !OUTSIDE.contains(m))
        .collect();
    assert!(
        missing.is_empty(),
        "modules in src/lib.rs without a layer: {missing:?}"
    );
}

#[test]
fn the_scanner_sees_every_form_of_reference() {
    let src = Path::new("/x/src");
    let file = Path::new("/x/src/backup/run.rs");
    let text = "use crate::{\n    config::Y,\n    fleet::{A, B},\n};\n// crate::api in a comment\n\
                let s = \"crate::cli\";\nfn f() { crate::manager::run(); super::super::ops::x(); }\n\
                mod tests { use super::super::X; use super::super::super::api::Y; }\n";
    let got: Vec<(usize, String)> = references(src, file, text)
        .into_iter()
        .map(|r| (r.line, r.target))
        .collect();
    let want: Vec<(usize, String)> = vec![
        (2, "config".into()),
        (3, "fleet".into()),
        (7, "manager".into()),
        (7, "ops".into()),
        (8, "api".into()),
    ];
    assert_eq!(got, want);
}
