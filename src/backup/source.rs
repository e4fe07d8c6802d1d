//! Which instance a backup reads from: a healthy streaming standby when
//! there is one, so the backup's read I/O stays off the primary (pgBackRest
//! `--backup-standby`, pgbackrest::tls); the primary otherwise.

use crate::crd::cluster::InstanceStatus;

/// What the choice looks at, per instance: its last reported status and
/// whether its Pod runs pgBackRest's TLS server.
pub struct Candidate<'a> {
    pub status: &'a InstanceStatus,
    pub serves_tls: bool,
}

/// The standby to back up from, if any: ready, a replica on the primary's
/// timeline, its Pod serving TLS (and the primary's too, which the standby
/// drives), the most caught-up first, then by name. `None` means: on the
/// primary.
pub fn standby<'a>(primary: &str, instances: &[Candidate<'a>]) -> Option<&'a str> {
    let p = instances.iter().find(|c| c.status.name == primary)?;
    if !p.serves_tls {
        return None;
    }
    instances
        .iter()
        .filter(|c| {
            c.status.name != primary
                && c.serves_tls
                && c.status.ready
                && c.status.role == crate::crd::Role::Replica
                && (p.status.timeline.is_none() || c.status.timeline == p.status.timeline)
        })
        .max_by(|a, b| {
            let lsn = |c: &Candidate| c.status.lsn.as_deref().and_then(crate::postgres::parse_lsn);
            lsn(a)
                .cmp(&lsn(b))
                .then_with(|| b.status.name.cmp(&a.status.name))
        })
        .map(|c| c.status.name.as_str())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn inst(name: &str, role: &str, ready: bool, tl: i64, lsn: &str) -> InstanceStatus {
        InstanceStatus {
            name: name.into(),
            role: crate::crd::Role::from_label(role),
            ready,
            timeline: Some(tl),
            lsn: Some(lsn.into()),
            version: None,
        }
    }

    fn pick(all: &[(InstanceStatus, bool)]) -> Option<String> {
        let c: Vec<Candidate> = all
            .iter()
            .map(|(s, t)| Candidate {
                status: s,
                serves_tls: *t,
            })
            .collect();
        standby("db-1", &c).map(str::to_string)
    }

    #[test]
    fn the_most_caught_up_ready_replica_on_the_primarys_timeline() {
        let all = [
            (inst("db-1", "primary", true, 2, "0/5000000"), true),
            (inst("db-2", "replica", true, 2, "0/4000000"), true),
            (inst("db-3", "replica", true, 2, "0/4800000"), true),
            (inst("db-4", "replica", true, 1, "0/4900000"), true),
            (inst("db-5", "replica", false, 2, "0/4F00000"), true),
        ];
        assert_eq!(pick(&all).as_deref(), Some("db-3"));
    }

    #[test]
    fn ties_go_to_the_lowest_name() {
        let all = [
            (inst("db-1", "primary", true, 1, "0/5000000"), true),
            (inst("db-3", "replica", true, 1, "0/4000000"), true),
            (inst("db-2", "replica", true, 1, "0/4000000"), true),
        ];
        assert_eq!(pick(&all).as_deref(), Some("db-2"));
    }

    #[test]
    fn the_primary_when_no_standby_qualifies_or_tls_is_missing() {
        let one = [(inst("db-1", "primary", true, 1, "0/5000000"), true)];
        assert_eq!(pick(&one), None);
        let old_primary_pod = [
            (inst("db-1", "primary", true, 1, "0/5000000"), false),
            (inst("db-2", "replica", true, 1, "0/5000000"), true),
        ];
        assert_eq!(pick(&old_primary_pod), None);
        let old_standby_pod = [
            (inst("db-1", "primary", true, 1, "0/5000000"), true),
            (inst("db-2", "replica", true, 1, "0/5000000"), false),
        ];
        assert_eq!(pick(&old_standby_pod), None);
    }
}
