//! The words of the PostgresCluster status and of the role label, as types.
//! They serialize to the same strings as ever (the CRD's status and the
//! `pgfleet.io/role` label keep their wire format); a value written by
//! another version that this one does not know reads as `Unknown` instead
//! of failing the whole object.

use serde::{Deserialize, Serialize};
use std::fmt;

/// `status.phase` of a PostgresCluster (docs/architecture.md).
#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Phase {
    /// No instance was ready yet and there was never a primary.
    Creating,
    /// The instance count differs from `clusterSize`.
    Scaling,
    /// A rolling update is replacing instances.
    Updating,
    /// Every instance ready, the primary among them.
    Healthy,
    /// Running, but not every instance is ready.
    Degraded,
    /// The spec is refused; nothing that runs is touched.
    Invalid,
    /// A phase this version does not know.
    #[serde(other)]
    Unknown,
}

impl Phase {
    pub fn as_str(self) -> &'static str {
        match self {
            Phase::Creating => "Creating",
            Phase::Scaling => "Scaling",
            Phase::Updating => "Updating",
            Phase::Healthy => "Healthy",
            Phase::Degraded => "Degraded",
            Phase::Invalid => "Invalid",
            Phase::Unknown => "Unknown",
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What an instance is: its `pgfleet.io/role` label (which the Services
/// select on and the instance reads to know whether it may run as primary)
/// and `status.instances[].role`.
#[derive(
    Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Default,
)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    Primary,
    Replica,
    /// A former primary being demoted: out of `-rw` and `-ro` until it
    /// restarts as a replica.
    Fenced,
    /// No (or an unknown) role label.
    #[serde(other)]
    #[default]
    Unknown,
}

impl Role {
    pub fn as_str(self) -> &'static str {
        match self {
            Role::Primary => "primary",
            Role::Replica => "replica",
            Role::Fenced => "fenced",
            Role::Unknown => "unknown",
        }
    }

    /// The role a label value names; anything else is `Unknown`.
    pub fn from_label(v: &str) -> Role {
        match v {
            "primary" => Role::Primary,
            "replica" => Role::Replica,
            "fenced" => Role::Fenced,
            _ => Role::Unknown,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn phases_and_roles_keep_their_wire_strings() {
        for p in [
            Phase::Creating,
            Phase::Scaling,
            Phase::Updating,
            Phase::Healthy,
            Phase::Degraded,
            Phase::Invalid,
        ] {
            assert_eq!(serde_json::to_value(p).unwrap(), json!(p.as_str()));
            assert_eq!(
                serde_json::from_value::<Phase>(json!(p.as_str())).unwrap(),
                p
            );
        }
        for r in [Role::Primary, Role::Replica, Role::Fenced, Role::Unknown] {
            assert_eq!(serde_json::to_value(r).unwrap(), json!(r.as_str()));
            assert_eq!(Role::from_label(r.as_str()), r);
        }
        assert_eq!(json!(Phase::Healthy), json!("Healthy"));
        assert_eq!(json!(Role::Primary), json!("primary"));
    }

    #[test]
    fn unknown_words_read_as_unknown() {
        assert_eq!(
            serde_json::from_value::<Phase>(json!("Hibernating")).unwrap(),
            Phase::Unknown
        );
        assert_eq!(
            serde_json::from_value::<Role>(json!("witness")).unwrap(),
            Role::Unknown
        );
        assert_eq!(Role::from_label(""), Role::Unknown);
    }
}
