//! PodDisruptionBudget arithmetic, as the disruption controller and the
//! eviction subresource apply it: how many pods are expected and healthy,
//! how many must stay healthy, and whether one more may go. Pure, so the
//! eviction handler and `PDB` status share one rule.
//!
//! Simplification: the expected count is the number of (non-terminal) pods
//! the budget selects, where upstream asks the owning controller's scale
//! for percentages and `maxUnavailable`; for pods that all exist (the
//! usual case when draining) the two agree.

use crate::json_ptr::Ptr;
use crate::selector::LabelSelector;
use crate::store::str_at;
use serde_json::{Value, json};

/// A budget's numbers at one moment.
#[derive(Debug, Clone, PartialEq)]
pub struct Budget {
    pub expected: i64,
    pub current_healthy: i64,
    pub desired_healthy: i64,
    pub disruptions_allowed: i64,
}

/// Whether a pod counts as healthy: Ready and not being deleted.
pub fn healthy(pod: &Value) -> bool {
    pod.ptr("/metadata/deletionTimestamp").is_none()
        && pod
            .ptr("/status/conditions")
            .and_then(Value::as_array)
            .is_some_and(|cs| {
                cs.iter()
                    .any(|c| str_at(c, "/type") == "Ready" && str_at(c, "/status") == "True")
            })
}

/// Whether `pdb` selects `pod` (same namespace, selector matches; a budget
/// without a selector selects nothing, as policy/v1 says).
pub fn selects(pdb: &Value, pod: &Value) -> bool {
    if str_at(pdb, "/metadata/namespace") != str_at(pod, "/metadata/namespace") {
        return false;
    }
    let Some(sel) = pdb.ptr("/spec/selector").filter(|s| !s.is_null()) else {
        return false;
    };
    LabelSelector::from_label_selector_json(sel)
        .is_ok_and(|s| s.matches(pod.ptr("/metadata/labels").and_then(Value::as_object)))
}

/// An int-or-percent of `total`, rounded up (as upstream does for both
/// `minAvailable` and `maxUnavailable`).
fn scaled(v: &Value, total: i64) -> Option<i64> {
    if let Some(n) = v.as_i64() {
        return Some(n);
    }
    let pct: i64 = v.as_str()?.strip_suffix('%')?.parse().ok()?;
    Some((pct * total + 99) / 100)
}

/// The budget's numbers over `pods` (all pods of its namespace).
pub fn budget(pdb: &Value, pods: &[Value]) -> Budget {
    let selected: Vec<&Value> = pods
        .iter()
        .filter(|p| !matches!(str_at(p, "/status/phase"), "Succeeded" | "Failed"))
        .filter(|p| selects(pdb, p))
        .collect();
    let expected = selected.len() as i64;
    let current_healthy = selected.iter().filter(|p| healthy(p)).count() as i64;
    let desired_healthy = if let Some(min) = pdb.ptr("/spec/minAvailable") {
        scaled(min, expected).unwrap_or(expected)
    } else if let Some(max) = pdb.ptr("/spec/maxUnavailable") {
        (expected - scaled(max, expected).unwrap_or(0)).max(0)
    } else {
        // Neither set: no disruption may happen (upstream's default of minAvailable 100%).
        expected
    };
    Budget {
        expected,
        current_healthy,
        desired_healthy,
        disruptions_allowed: (current_healthy - desired_healthy).max(0),
    }
}

/// Whether evicting `pod` keeps `pdb`; the refusal says why, as the
/// `DisruptionBudget` cause of the 429 upstream.
pub fn may_evict(pdb: &Value, pods: &[Value], pod: &Value) -> Result<(), String> {
    let b = budget(pdb, pods);
    let name = str_at(pdb, "/metadata/name");
    let policy = str_at(pdb, "/spec/unhealthyPodEvictionPolicy");
    if !healthy(pod) && (policy == "AlwaysAllow" || b.current_healthy >= b.desired_healthy) {
        // An unhealthy pod may go while the budget holds: it counts for nothing.
        return Ok(());
    }
    if b.disruptions_allowed > 0 {
        return Ok(());
    }
    Err(format!(
        "The disruption budget {name} needs {} healthy pods and has {} currently",
        b.desired_healthy, b.current_healthy
    ))
}

/// `status` of a budget for the PDB object (`kubectl get pdb` shows it).
pub fn status_json(b: &Budget, generation: i64) -> Value {
    json!({
        "observedGeneration": generation,
        "expectedPods": b.expected,
        "currentHealthy": b.current_healthy,
        "desiredHealthy": b.desired_healthy,
        "disruptionsAllowed": b.disruptions_allowed,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pod(name: &str, ready: bool) -> Value {
        json!({"metadata": {"name": name, "namespace": "db", "labels": {"app": "pg"}},
            "status": {"phase": "Running", "conditions": [{"type": "Ready", "status": if ready {"True"} else {"False"}}]}})
    }

    fn pdb(spec: Value) -> Value {
        let mut p = json!({"metadata": {"name": "pg", "namespace": "db"},
            "spec": {"selector": {"matchLabels": {"app": "pg"}}}});
        for (k, v) in spec.as_object().into_iter().flatten() {
            p["spec"][k] = v.clone();
        }
        p
    }

    #[test]
    fn min_available_allows_one_of_three() {
        let pods = vec![pod("a", true), pod("b", true), pod("c", true)];
        let p = pdb(json!({"minAvailable": 2}));
        assert_eq!(budget(&p, &pods).disruptions_allowed, 1);
        assert!(may_evict(&p, &pods, &pods[0]).is_ok());
        let mut after = pods.clone();
        after[0]["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:00:00Z");
        let refused = may_evict(&p, &after, &after[1]).unwrap_err();
        assert_eq!(
            refused,
            "The disruption budget pg needs 2 healthy pods and has 2 currently"
        );
    }

    #[test]
    fn max_unavailable_percent_rounds_up() {
        let pods = vec![pod("a", true), pod("b", true), pod("c", true)];
        // 34 % of 3 = 1.02, rounded up to 2 pods may be unavailable.
        let p = pdb(json!({"maxUnavailable": "34%"}));
        assert_eq!(budget(&p, &pods).desired_healthy, 1);
        assert_eq!(budget(&p, &pods).disruptions_allowed, 2);
    }

    #[test]
    fn unhealthy_pod_may_go_while_the_budget_holds() {
        let pods = vec![pod("a", true), pod("b", true), pod("c", false)];
        let p = pdb(json!({"minAvailable": 2}));
        assert!(may_evict(&p, &pods, &pods[2]).is_ok());
        assert!(may_evict(&p, &pods, &pods[0]).is_err());
    }

    #[test]
    fn selector_and_namespace_must_match() {
        let mut other = pod("x", true);
        other["metadata"]["namespace"] = json!("other");
        assert!(!selects(&pdb(json!({})), &other));
        let no_selector = json!({"metadata": {"name": "pg", "namespace": "db"}, "spec": {}});
        assert!(!selects(&no_selector, &pod("a", true)));
    }
}
