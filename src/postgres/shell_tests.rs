//! The instance script's quoting helpers, run by `sh` on random strings
//! and read back the way libpq and PostgreSQL read them: .pgpass fields,
//! conninfo values, postgresql.conf strings, and the path check that
//! guards `restore_command`.
#![allow(clippy::unwrap_used)]

use super::INSTANCE_SCRIPT;
use proptest::prelude::*;
use std::process::Command;

/// The block between the BEGIN/END markers of instance.sh.
fn helpers() -> String {
    let start = INSTANCE_SCRIPT.find("# BEGIN quoting helpers").unwrap();
    let end = INSTANCE_SCRIPT.find("# END quoting helpers").unwrap();
    INSTANCE_SCRIPT[start..end].to_string()
}

/// Runs `FUNC "$arg"` for every argument in one `sh`; outputs NUL-separated.
fn run(func: &str, args: &[String]) -> Vec<String> {
    let script = format!(
        "{}\nfor a in \"$@\"; do {func} \"$a\"; printf '\\0'; done",
        helpers()
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8(out.stdout).unwrap();
    let mut v: Vec<String> = text.split('\0').map(String::from).collect();
    v.pop();
    v
}

/// Exit status of `FUNC "$arg"` for every argument, as '0'/'1'.
fn verdicts(func: &str, args: &[String]) -> Vec<bool> {
    let script = format!(
        "{}\nfor a in \"$@\"; do if {func} \"$a\"; then printf 1; else printf 0; fi; done",
        helpers()
    );
    let out = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg("sh")
        .args(args)
        .output()
        .unwrap();
    String::from_utf8(out.stdout)
        .unwrap()
        .chars()
        .map(|c| c == '1')
        .collect()
}

/// libpq's reading of the password field of a .pgpass line: the fields
/// split at unescaped `:`, `\` takes the next character literally.
fn pgpass_fields(line: &str) -> Vec<String> {
    let mut fields = vec![String::new()];
    let mut it = line.chars();
    while let Some(c) = it.next() {
        match c {
            '\\' => match it.next() {
                Some(n) => fields.last_mut().unwrap().push(n),
                None => fields.last_mut().unwrap().push('\\'),
            },
            ':' => fields.push(String::new()),
            c => fields.last_mut().unwrap().push(c),
        }
    }
    fields
}

/// libpq's reading of a single-quoted conninfo value; `None` when the
/// quotes do not enclose exactly the whole text.
fn conninfo_value(q: &str) -> Option<String> {
    let body = q.strip_prefix('\'')?;
    let mut out = String::new();
    let mut it = body.chars();
    while let Some(c) = it.next() {
        match c {
            '\\' => out.push(it.next()?),
            '\'' => return it.next().is_none().then_some(out),
            c => out.push(c),
        }
    }
    None
}

/// PostgreSQL's reading of a postgresql.conf quoted string.
fn conf_string(q: &str) -> Option<String> {
    let body = q.strip_prefix('\'')?.strip_suffix('\'')?;
    let mut out = String::new();
    let mut it = body.chars();
    while let Some(c) = it.next() {
        match c {
            '\'' => {
                if it.next()? != '\'' {
                    return None;
                }
                out.push('\'');
            }
            '\\' => match it.next()? {
                'n' | 'r' | 'b' | 'f' | 't' | '0'..='7' => return None,
                n => out.push(n),
            },
            c => out.push(c),
        }
    }
    Some(out)
}

/// One-line strings (a shell argument cannot hold NUL) heavy on quoting
/// trouble.
fn one_line() -> impl Strategy<Value = String> {
    let unit = prop_oneof![
        3 => proptest::char::range('a', 'z').prop_map(String::from),
        5 => prop::sample::select(vec![
            "'", "\"", "\\", ":", " ", "$", "`", "%", ";", "#", "=", "*", "-", "/", ".", "_", "é",
            "\\n", "$(id)", "\t",
        ])
        .prop_map(String::from),
    ];
    prop::collection::vec(unit, 0..20).prop_map(|v| v.concat())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(6))]

    #[test]
    fn pgpass_conninfo_and_conf_quoting_read_back(args in prop::collection::vec(one_line(), 1..80)) {
        for (a, f) in args.iter().zip(run("pgpass_field", &args)) {
            let line = format!("*:*:*:replicator:{f}");
            let fields = pgpass_fields(&line);
            prop_assert_eq!(fields.len(), 5, "{:?}", line);
            prop_assert_eq!(&fields[4], a);
        }
        for (a, q) in args.iter().zip(run("conninfo_q", &args)) {
            prop_assert_eq!(conninfo_value(&q), Some(a.clone()), "{:?}", q);
        }
        for (a, q) in args.iter().zip(run("conf_q", &args)) {
            prop_assert_eq!(conf_string(&q), Some(a.clone()), "{:?}", q);
        }
    }

    #[test]
    fn line_breaks_and_unsafe_paths_are_caught(args in prop::collection::vec(
        prop_oneof![one_line(), one_line().prop_map(|s| format!("{s}\n{s}")), one_line().prop_map(|s| format!("a\r{s}"))],
        1..80,
    )) {
        for (a, ok) in args.iter().zip(verdicts("one_line", &args)) {
            prop_assert_eq!(ok, !a.contains('\n') && !a.contains('\r'), "{:?}", a);
        }
        for (a, ok) in args.iter().zip(verdicts("safe_path", &args)) {
            prop_assert_eq!(ok, super::quote::is_safe_path(a), "{:?}", a);
        }
    }
}
