//! A topology's durable state: which member is the primary side, under
//! which epoch, and where it is reached. One ConfigMap
//! `pgfleet-dr-<topology>` in `pgfleet-system` on EVERY member of the
//! topology, because any one of them may be the one that is lost: the
//! highest epoch among the copies that can be read wins.
//!
//! Why that is safe: a promotion writes its new epoch to the member it
//! promotes *before* promoting (the write must succeed), so a member that
//! holds the newest epoch always exists among the survivors; a returning
//! old primary carries an older epoch and is outvoted as soon as the
//! manager reads the promoted side. The one gap — the manager restarting
//! while only the old primary side is reachable — is closed elsewhere: a
//! side that fenced itself is unfenced only after every member's copy has
//! been read (`decide.rs`).

use anyhow::Context;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

use crate::fleet::Member;

pub const NAMESPACE: &str = "pgfleet-system";
const FIELD_MANAGER: &str = "pgfleet-dr";

pub fn object_name(topology: &str) -> String {
    format!("pgfleet-dr-{topology}")
}

/// One copy of the state.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct State {
    /// Raised by every switchover and promotion.
    pub epoch: u64,
    /// The primary side's member.
    pub primary: String,
    /// Its `<name>-dr` address, "HOST:PORT", as last seen (a replica side
    /// keeps streaming from it while the primary side's API is away).
    pub endpoint: Option<String>,
    /// During a switchover: the old primary side's address, which the new
    /// one keeps streaming from until it has received everything.
    pub previous_endpoint: Option<String>,
    /// Written by a forced promotion (automatic failover, `dr promote`):
    /// the new primary is promoted without the old one's hand-over, and
    /// the old one rewinds when it returns.
    pub forced: bool,
}

impl State {
    pub fn from_config_map(cm: &ConfigMap) -> Option<State> {
        let d = cm.data.as_ref()?;
        Some(State {
            epoch: d.get("epoch")?.parse().ok()?,
            primary: d.get("primary")?.clone(),
            endpoint: d.get("endpoint").filter(|e| !e.is_empty()).cloned(),
            previous_endpoint: d.get("previousEndpoint").filter(|e| !e.is_empty()).cloned(),
            forced: d.get("forced").is_some_and(|f| f == "true"),
        })
    }

    /// The state after promoting `member` (`forced`: without a hand-over).
    pub fn promoted(&self, member: &str, forced: bool) -> anyhow::Result<State> {
        Ok(State {
            epoch: self
                .epoch
                .checked_add(1)
                .context("the topology's epoch is exhausted")?,
            primary: member.to_string(),
            endpoint: None,
            previous_endpoint: self.endpoint.clone(),
            forced,
        })
    }
}

/// The newest of the copies read (None: no copy anywhere).
pub fn newest(copies: impl IntoIterator<Item = State>) -> Option<State> {
    copies.into_iter().max_by_key(|s| s.epoch)
}

/// Reads one member's copy (Ok(None): it has none).
pub async fn read(member: &Member, topology: &str) -> anyhow::Result<Option<State>> {
    let api: Api<ConfigMap> = Api::namespaced(member.client(), NAMESPACE);
    let cm = api
        .get_opt(&object_name(topology))
        .await
        .with_context(|| format!("reading DR topology {topology}'s state on {}", member.name))?;
    Ok(cm.as_ref().and_then(State::from_config_map))
}

/// Writes `state` to one member; a copy with a higher epoch there is never
/// overwritten (two managers racing cannot move a topology backwards).
pub async fn write(member: &Member, topology: &str, state: &State) -> anyhow::Result<()> {
    if let Some(there) = read(member, topology).await?
        && there.epoch > state.epoch
    {
        anyhow::bail!(
            "{} holds epoch {} of topology {topology}, newer than {}",
            member.name,
            there.epoch,
            state.epoch
        );
    }
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let nsobj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    Api::<Namespace>::all(member.client())
        .patch(NAMESPACE, &pp, &Patch::Apply(&nsobj))
        .await
        .with_context(|| format!("creating namespace {NAMESPACE} on {}", member.name))?;
    let cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": object_name(topology), "namespace": NAMESPACE,
            "labels": {"app.kubernetes.io/managed-by": "pgfleet", "pgfleet.io/dr-topology": topology}},
        "data": {
            "epoch": state.epoch.to_string(),
            "primary": state.primary,
            "endpoint": state.endpoint.clone().unwrap_or_default(),
            "previousEndpoint": state.previous_endpoint.clone().unwrap_or_default(),
            "forced": state.forced.to_string(),
        },
    });
    Api::<ConfigMap>::namespaced(member.client(), NAMESPACE)
        .patch(&object_name(topology), &pp, &Patch::Apply(&cm))
        .await
        .with_context(|| format!("storing DR topology {topology}'s state on {}", member.name))?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn s(epoch: u64, primary: &str) -> State {
        State {
            epoch,
            primary: primary.into(),
            endpoint: None,
            previous_endpoint: None,
            forced: false,
        }
    }

    #[test]
    fn the_highest_epoch_wins_and_a_promotion_raises_it() {
        assert_eq!(newest([s(2, "a"), s(5, "b"), s(3, "a")]), Some(s(5, "b")));
        assert_eq!(newest([]), None);
        let mut b = s(5, "b");
        b.endpoint = Some("h:1".into());
        let next = b.promoted("a", false).unwrap();
        assert_eq!(
            (next.epoch, next.previous_endpoint.as_deref()),
            (6, Some("h:1"))
        );
        assert!(s(5, "b").promoted("a", true).unwrap().forced);
        assert!(s(u64::MAX, "a").promoted("b", false).is_err());
    }

    #[test]
    fn a_config_map_without_an_epoch_is_no_state() {
        let mut cm = ConfigMap::default();
        assert_eq!(State::from_config_map(&cm), None);
        cm.data = Some(
            [("epoch", "7"), ("primary", "m2"), ("endpoint", "")]
                .into_iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        );
        assert_eq!(State::from_config_map(&cm), Some(s(7, "m2")));
    }
}
