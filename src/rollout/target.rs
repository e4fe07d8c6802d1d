//! What a rollout moves on each PostgresCluster: its `spec.version` (a
//! minor-version rollout) or the password generation of a fleet role set
//! (a rotation, `[rollouts.<name>] role_set = "<set>"`).
//!
//! A rotation reuses the whole engine — stages, `max_concurrency`, soak,
//! approvals, pause/abort/rollback, failure budgets — by mapping the
//! generation onto the planner's "version" strings: the wanted generation
//! (the `roles.pgfleet.io/<set>` annotation, else the applied one) is the
//! spec version, the generation `status.access` reports applied is the
//! current version. Its marks live under `roles.pgfleet.io/<set>-rollout…`,
//! so a rotation and a version rollout on the same cluster do not overwrite
//! each other's memory.

use super::marks::{self, FAILED, FINISHED, PREVIOUS, REVERTED, ROLLOUT, STARTED};
use super::plan::Pgc;
use crate::config::choices::MajorMethod;
use crate::crd::PostgresCluster;
use crate::crd::access::role_set_annotation;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::time::SystemTime;

#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Target {
    Version,
    /// The fleet role set's name.
    RoleSet(String),
}

impl Target {
    /// The annotation key for one of the version rollout's mark keys.
    pub fn key(&self, version_key: &str) -> String {
        match self {
            Target::Version => version_key.to_string(),
            Target::RoleSet(set) => {
                version_key.replacen(ROLLOUT, &format!("roles.pgfleet.io/{set}-rollout"), 1)
            }
        }
    }

    /// This target's mark on a PostgresCluster, if complete.
    pub fn read(&self, annotations: &BTreeMap<String, String>) -> Option<super::plan::Mark> {
        match self {
            Target::Version => marks::read(annotations),
            Target::RoleSet(_) => {
                let renamed: BTreeMap<String, String> =
                    [ROLLOUT, PREVIOUS, STARTED, FINISHED, FAILED, REVERTED]
                        .iter()
                        .filter_map(|k| {
                            Some((k.to_string(), annotations.get(&self.key(k))?.clone()))
                        })
                        .collect();
                marks::read(&renamed)
            }
        }
    }

    /// The planner's view of one PostgresCluster.
    pub fn observe(&self, member: &str, pg: &PostgresCluster, stage: Option<usize>) -> Pgc {
        let mut pgc = marks::observe(member, pg, stage);
        let Target::RoleSet(set) = self else {
            return pgc;
        };
        let source = format!("fleet:{set}");
        let role = pg
            .status
            .as_ref()
            .and_then(|s| s.access.as_ref())
            .and_then(|a| {
                a.roles
                    .iter()
                    .find(|r| r.source.as_deref() == Some(&source))
            });
        pgc.spec_version = pg
            .role_set_pinned(set)
            .map(|g| g.to_string())
            .unwrap_or_default();
        pgc.current_version = pg.role_set_applied(set).map(|g| g.to_string());
        // Healthy for a rotation: the role is in place as declared.
        pgc.healthy = role.is_some_and(|r| r.state != "failed" && r.state != "refused");
        pgc.update_failure = None;
        pgc.mark = self.read(&pg.metadata.annotations.clone().unwrap_or_default());
        pgc
    }

    /// Starting: the new target and the mark, in one merge patch.
    pub fn start_patch(
        &self,
        rollout: &str,
        from: &str,
        to: &str,
        now: SystemTime,
        method: Option<MajorMethod>,
    ) -> Value {
        let mut p = marks::start_patch(rollout, from, to, now, method);
        if let Target::RoleSet(set) = self {
            p = json!({"metadata": {"annotations": self.rename(&p)}});
            p["metadata"]["annotations"][role_set_annotation(set)] = json!(to);
        }
        p
    }

    pub fn finish_patch(&self, at: SystemTime) -> Value {
        let p = marks::finish_patch(at);
        self.renamed(p)
    }

    pub fn fail_patch(&self, reason: &str) -> Value {
        self.renamed(marks::fail_patch(reason))
    }

    /// Back to `previous`; for a role set an empty previous generation (a
    /// cluster that had none) removes the pin.
    pub fn revert_patch(&self, previous: &str) -> Value {
        let mut p = marks::revert_patch(previous);
        if let Target::RoleSet(set) = self {
            p = json!({"metadata": {"annotations": self.rename(&p)}});
            let back = match previous {
                "" => Value::Null,
                g => json!(g),
            };
            p["metadata"]["annotations"][role_set_annotation(set)] = back;
        }
        p
    }

    fn renamed(&self, p: Value) -> Value {
        match self {
            Target::Version => p,
            Target::RoleSet(_) => json!({"metadata": {"annotations": self.rename(&p)}}),
        }
    }

    /// The patch's annotations under this target's keys.
    fn rename(&self, p: &Value) -> Value {
        let mut out = serde_json::Map::new();
        if let Some(a) = p["metadata"]["annotations"].as_object() {
            for (k, v) in a {
                out.insert(self.key(k), v.clone());
            }
        }
        Value::Object(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_rotation_pins_the_generation_and_marks_under_its_own_keys() {
        let t = Target::RoleSet("monitor".into());
        let now = marks::parse_time("2026-12-04T10:00:00Z").unwrap();
        let p = t.start_patch("rot", "1", "2", now, None);
        assert!(p.get("spec").is_none(), "no version change: {p}");
        let ann = &p["metadata"]["annotations"];
        assert_eq!(ann["roles.pgfleet.io/monitor"], "2");
        assert_eq!(ann["roles.pgfleet.io/monitor-rollout"], "rot");
        assert_eq!(
            ann["roles.pgfleet.io/monitor-rollout-previous-version"],
            "1"
        );
        assert!(ann.get(ROLLOUT).is_none());
        let read: BTreeMap<String, String> = ann
            .as_object()
            .unwrap()
            .iter()
            .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
            .collect();
        let m = t.read(&read).unwrap();
        assert_eq!(
            (m.rollout.as_str(), m.previous_version.as_str()),
            ("rot", "1")
        );
        assert!(Target::Version.read(&read).is_none());
        let back = t.revert_patch("");
        assert!(back["metadata"]["annotations"]["roles.pgfleet.io/monitor"].is_null());
        assert_eq!(
            back["metadata"]["annotations"]["roles.pgfleet.io/monitor-rollout-reverted"],
            "true"
        );
    }

    #[test]
    fn a_rotation_has_no_major_version_check_and_is_done_once_applied() {
        use crate::rollout::plan::{PgcState, pgc_state, tests as t};
        let mut spec = t::spec(vec![]);
        spec.role_set = Some("monitor".into());
        spec.target_version = "2".into();
        let mut p = t::pgc("m", "db", 0);
        p.spec_version = "1".into();
        p.current_version = Some("1".into());
        assert_eq!(pgc_state(&spec, &p), PgcState::Pending);
        p.spec_version = "2".into();
        p.current_version = Some("2".into());
        assert!(matches!(pgc_state(&spec, &p), PgcState::Done { .. }));
        spec.role_set = None;
        p.spec_version = "1".into();
        assert!(matches!(pgc_state(&spec, &p), PgcState::Ineligible { .. }));
    }
}
