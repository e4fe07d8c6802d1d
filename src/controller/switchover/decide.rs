//! Switchover decisions, pure: which instance an automatic switchover (the
//! `auto` request, the rolling update's last step) goes to, and when a
//! request is refused. The target is ranked exactly as failover ranks its
//! candidates (`failover::decide::most_advanced`): a switchover then waits
//! least for the target to catch up, and both pick the same replica.

use crate::controller::failover::decide::{Candidate, eligible, most_advanced};
use crate::controller::plan::Observed;

/// The instance an automatic switchover promotes: among the ready replicas
/// other than `current` that answered, the most advanced by failover's
/// ranking; None when there is none.
pub fn target(current: &str, candidates: &[Candidate]) -> Option<String> {
    most_advanced(
        candidates
            .iter()
            .filter(|c| c.name != current && c.ready && eligible(c)),
    )
    .map(|c| c.name.clone())
}

/// Why a switchover to `target` cannot start, if it cannot.
pub fn refusal(target: Option<&str>, current: &str, obs: &Observed) -> Option<String> {
    match target {
        None => Some("no ready replica to switch over to".to_string()),
        Some(t) if t == current => Some(format!("{t} is already the primary")),
        Some(t) if !obs.pods.get(t).is_some_and(|p| p.ready && !p.deleting) => {
            Some(format!("{t} is not a ready instance of this cluster"))
        }
        _ => None,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::controller::failover::decide::choose;
    use crate::controller::plan::PodInfo;
    use crate::postgres::InstanceReport;

    fn cand(name: &str, rx: Option<&str>, replay: &str) -> Candidate {
        Candidate {
            name: name.into(),
            ordinal: name.rsplit('-').next().unwrap().parse().unwrap(),
            ready: true,
            report: Some(InstanceReport {
                contract: 1,
                role: "replica".into(),
                ready: true,
                received_lsn: rx.map(String::from),
                replayed_lsn: Some(replay.into()),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn ties_go_to_the_lowest_ordinal_numerically_not_by_string() {
        // "pg-10" < "pg-2" as strings; as ordinals 2 < 10.
        let cs = vec![
            cand("pg-10", Some("0/5000000"), "0/5000000"),
            cand("pg-2", Some("0/5000000"), "0/5000000"),
        ];
        assert_eq!(target("pg-1", &cs).unwrap(), "pg-2");
        let reversed: Vec<Candidate> = cs.into_iter().rev().collect();
        assert_eq!(target("pg-1", &reversed).unwrap(), "pg-2");
    }

    #[test]
    fn received_wal_counts_not_only_replayed() {
        // The old rule looked at the replayed LSN only and took pg-2.
        let cs = vec![
            cand("pg-2", Some("0/5000000"), "0/4000000"),
            cand("pg-3", Some("0/6000000"), "0/3000000"),
        ];
        assert_eq!(target("pg-1", &cs).unwrap(), "pg-3");
    }

    #[test]
    fn matches_failovers_choice_on_the_same_reports() {
        let sets = vec![
            vec![
                cand("pg-2", Some("0/5000000"), "0/4000000"),
                cand("pg-3", Some("0/6000000"), "0/3000000"),
            ],
            vec![
                cand("pg-10", None, "0/7000000"),
                cand("pg-2", Some("0/7000000"), "0/6000000"),
                cand("pg-3", Some("0/6FFFFFF"), "0/6FFFFFF"),
            ],
            vec![
                cand("pg-10", Some("0/5000000"), "0/5000000"),
                cand("pg-9", Some("0/5000000"), "0/5000000"),
            ],
        ];
        for cs in sets {
            assert_eq!(
                target("pg-1", &cs),
                Some(choose(&cs, None).unwrap()),
                "{cs:?}"
            );
        }
    }

    #[test]
    fn the_primary_silent_fenced_or_unready_instances_are_not_targets() {
        let mut silent = cand("pg-2", Some("0/9000000"), "0/9000000");
        silent.report = None;
        let mut unready = cand("pg-3", Some("0/9000000"), "0/9000000");
        unready.ready = false;
        let mut fenced = cand("pg-4", Some("0/9000000"), "0/9000000");
        if let Some(r) = fenced.report.as_mut() {
            r.fenced = true;
        }
        let current = cand("pg-1", Some("0/9000000"), "0/9000000");
        let ok = cand("pg-5", Some("0/1000000"), "0/1000000");
        let cs = vec![silent, unready, fenced, current, ok];
        assert_eq!(target("pg-1", &cs).unwrap(), "pg-5");
        assert_eq!(target("pg-1", &cs[..4]), None);
    }

    #[test]
    fn requests_are_refused_with_a_reason() {
        let mut obs = Observed::default();
        obs.pods.insert(
            "pg-2".into(),
            PodInfo {
                name: "pg-2".into(),
                ready: true,
                ..Default::default()
            },
        );
        assert!(
            refusal(None, "pg-1", &obs)
                .unwrap()
                .contains("no ready replica")
        );
        assert!(
            refusal(Some("pg-1"), "pg-1", &obs)
                .unwrap()
                .contains("already the primary")
        );
        assert!(
            refusal(Some("pg-3"), "pg-1", &obs)
                .unwrap()
                .contains("not a ready instance")
        );
        assert_eq!(refusal(Some("pg-2"), "pg-1", &obs), None);
    }
}
