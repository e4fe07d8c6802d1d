//! A guard for DESIGN §10 ("functions short"): no function in
//! src/controller is longer than [`MAX_LINES`], signature and closing
//! brace included. Relies on rustfmt's layout: a function ends at the first
//! `}` line indented like its `fn` line.

use std::path::{Path, PathBuf};

const MAX_LINES: usize = 80;

/// (lines, file, function) of every function in the `.rs` files under `dir`.
fn functions(dir: &Path) -> Vec<(usize, PathBuf, String)> {
    let mut out = vec![];
    let Ok(entries) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            out.extend(functions(&path));
        } else if path.extension().is_some_and(|e| e == "rs") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            for (len, name) in in_file(&text) {
                out.push((len, path.clone(), name));
            }
        }
    }
    out
}

fn in_file(text: &str) -> Vec<(usize, String)> {
    let lines: Vec<&str> = text.lines().collect();
    let mut out = vec![];
    for (i, line) in lines.iter().enumerate() {
        let trimmed = line.trim_start();
        let indent = &line[..line.len() - trimmed.len()];
        let Some(name) = fn_name(trimmed) else {
            continue;
        };
        let close = format!("{indent}}}");
        if let Some(end) = lines[i..].iter().position(|l| *l == close) {
            out.push((end + 1, name));
        }
    }
    out
}

/// The name of the function a line starts, if it starts one.
fn fn_name(line: &str) -> Option<String> {
    let mut rest = line;
    for prefix in ["pub(crate) ", "pub(super) ", "pub ", "const ", "async "] {
        rest = rest.strip_prefix(prefix).unwrap_or(rest);
    }
    let rest = rest.strip_prefix("async ").unwrap_or(rest);
    let name: String = rest
        .strip_prefix("fn ")?
        .chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect();
    (!name.is_empty()).then_some(name)
}

#[test]
fn the_checker_measures_a_function() {
    let text = "fn a() {\n    x();\n}\n\n    pub async fn b(\n        y: u8,\n    ) {\n        if y {\n        }\n    }\n";
    assert_eq!(
        in_file(text),
        vec![(3, "a".to_string()), (6, "b".to_string())]
    );
}

#[test]
fn no_controller_function_is_longer_than_the_limit() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/controller");
    let mut all = functions(&dir);
    assert!(all.len() > 100, "found only {} functions", all.len());
    all.sort();
    let too_long: Vec<String> = all
        .iter()
        .filter(|(len, _, _)| *len > MAX_LINES)
        .map(|(len, file, name)| format!("{}: {name} ({len} lines)", file.display()))
        .collect();
    assert!(too_long.is_empty(), "over {MAX_LINES} lines: {too_long:#?}");
    if let Some((len, file, name)) = all.last() {
        println!("longest: {name} in {} ({len} lines)", file.display());
    }
}
