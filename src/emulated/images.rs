//! What pgfleet's images stand for under the emulator's process runtime:
//! `postgres:<major>…` runs the locally installed PostgreSQL of that major
//! (else 15, the one the project's machines carry, else the newest
//! installed), anything named `*pgbouncer*` runs the local PgBouncer.

use pgfleet_sim::{BinDir, ImageMatch, ImageRule};

const PGBOUNCER: &str = "/usr/sbin/pgbouncer";

/// pgfleet's image table, first match wins.
pub fn rules() -> Vec<ImageRule> {
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
    }
}
