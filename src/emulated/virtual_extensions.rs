//! The virtual runtime's model of installed extensions, enough for the
//! major upgrade's pre-flight to fail the way the real one does: `CREATE
//! EXTENSION` through the `query` verb records the extension with the data
//! directory; `upgrade-check NEW_BIN` looks for each one's control file in
//! the new installation, as `instance.sh` does (`pg_config --sharedir`,
//! else `NEW_BIN/../share`). On this machine that is the real difference
//! between Debian's PostgreSQL 15 and the PostgreSQL 18 wheel (pgcrypto,
//! for one, is not in the wheel).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The extension a `CREATE EXTENSION [IF NOT EXISTS] name …` statement
/// creates, if `sql` is one (names as the script accepts them).
pub fn created(sql: &str) -> Option<String> {
    let words: Vec<String> = sql
        .split_whitespace()
        .map(|w| w.trim_end_matches(';').to_ascii_lowercase())
        .collect();
    let rest = match words.as_slice() {
        [c, e, rest @ ..] if c == "create" && e == "extension" => rest,
        _ => return None,
    };
    let name = match rest {
        [i, n, e, name, ..] if i == "if" && n == "not" && e == "exists" => name,
        [name, ..] => name,
        [] => return None,
    };
    let name = name.trim_matches('"');
    let ok = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-');
    ok.then(|| name.to_string())
}

/// The share directory of the installation whose binaries are in `bin`.
fn share_dir(bin: &Path) -> PathBuf {
    let asked = std::process::Command::new(bin.join("pg_config"))
        .arg("--sharedir")
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| PathBuf::from(s.trim()));
    asked.unwrap_or_else(|| bin.join("../share"))
}

/// Why the upgrade to the installation in `new_bin` cannot carry these
/// extensions over, as the script words it; `None` when it can.
pub fn missing(extensions: &BTreeSet<String>, new_bin: &str) -> Option<String> {
    if extensions.is_empty() {
        return None;
    }
    let share = share_dir(Path::new(new_bin));
    let dir = share.join("extension");
    extensions
        .iter()
        .find(|e| !dir.join(format!("{e}.control")).is_file())
        .map(|e| {
            format!(
                "extension {e} (database app) is not available in the installation at {new_bin} ({})",
                dir.display()
            )
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn create_extension_statements_are_recognised() {
        assert_eq!(
            created("CREATE EXTENSION pgcrypto").as_deref(),
            Some("pgcrypto")
        );
        assert_eq!(
            created("create extension if not exists \"citext\";").as_deref(),
            Some("citext")
        );
        assert_eq!(created("SELECT 1"), None);
        assert_eq!(created("CREATE EXTENSION \"a;b\""), None);
    }

    #[test]
    fn an_installation_without_the_control_file_is_named() {
        let none = BTreeSet::new();
        assert_eq!(missing(&none, "/nowhere/bin"), None);
        let one: BTreeSet<String> = ["pgcrypto".to_string()].into();
        let why = missing(&one, "/nowhere/bin").unwrap_or_default();
        assert!(why.contains("extension pgcrypto"), "{why}");
    }
}
