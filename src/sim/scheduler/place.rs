//! The placement decision for one pod, as kube-scheduler's default profile
//! makes it: filter every node (the first failing plugin names the reason),
//! then score the feasible ones and take the best. Pure: the loop in
//! [`super`] hands in the nodes and the pods already bound.
//!
//! Filters, in upstream order: `NodeUnschedulable`, `TaintToleration`
//! (NoSchedule/NoExecute), `NodeAffinity` (nodeSelector + required terms),
//! `PodTopologySpread` (DoNotSchedule), `InterPodAffinity` (existing pods'
//! required anti-affinity, then the pod's required affinity and
//! anti-affinity). Scores, each normalised to 0..=100 over the feasible
//! nodes and weighted as the default profile weights them: node affinity
//! preferences (2), pod (anti-)affinity preferences (2), topology spreading
//! (2; the system default spreads a controller's pods over hostnames and
//! zones when the pod states no constraints), PreferNoSchedule taints (3)
//! and fewer pods on the node (1, standing in for least-allocated).
//! Ties go to the first node by name, so tests are reproducible where the
//! real scheduler would pick at random among equals.

use super::terms::{self, PodTerm};
use crate::json_ptr::Ptr;
use crate::selector::LabelSelector;
use crate::store::str_at;
use serde_json::Value;
use std::borrow::Borrow;
use std::collections::{BTreeMap, HashMap};

pub const HOSTNAME: &str = "kubernetes.io/hostname";
pub const ZONE: &str = "topology.kubernetes.io/zone";

/// What the scheduler does with a pod.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    Bind(String),
    /// The FailedScheduling message ("0/3 nodes are available: …").
    Unschedulable(String),
}

/// A node with the pods bound to it.
struct NodeView<'a> {
    node: &'a Value,
    name: &'a str,
    pods: Vec<&'a Value>,
    /// The terms each of `pods` holds against others, same order.
    terms: Vec<&'a Held>,
}

/// The (anti-)affinity terms a bound pod holds against pods placed near
/// it, parsed once per pod version (the scheduling loop keeps them with its
/// pod cache): filtering and scoring ask for them at every node, which
/// parsed every bound pod's terms once per node for every decision — most
/// of the emulated scheduler's time once a cluster holds hundreds of pods.
pub struct Held {
    required_anti: Vec<PodTerm>,
    /// Preferred terms, with +1 for affinity and -1 for anti-affinity.
    preferred: Vec<(PodTerm, i64)>,
}

impl Held {
    pub fn of(pod: &Value) -> Held {
        let mut preferred = vec![];
        for (kind, sign) in [("podAffinity", 1), ("podAntiAffinity", -1)] {
            preferred.extend(
                terms::pod_terms(pod, kind, false)
                    .into_iter()
                    .map(|t| (t, sign)),
            );
        }
        Held {
            required_anti: terms::pod_terms(pod, "podAntiAffinity", true),
            preferred,
        }
    }
}

/// Decides where `pod` goes among `nodes`, given the pods already bound
/// (`spec.nodeName` set; finished pods should be left out by the caller).
///
/// Generic over owned or borrowed objects: the scheduling loop hands in
/// references into the store, never copies.
pub fn place<N: Borrow<Value>, B: Borrow<Value>>(
    pod: &Value,
    nodes: &[N],
    bound: &[B],
) -> Decision {
    let held: Vec<Held> = bound.iter().map(|p| Held::of(p.borrow())).collect();
    let bound: Vec<(&Value, &Held)> = bound.iter().map(Borrow::borrow).zip(&held).collect();
    place_held(pod, nodes, &bound)
}

/// [`place`], with each bound pod's terms already parsed.
pub fn place_held<N: Borrow<Value>>(
    pod: &Value,
    nodes: &[N],
    bound: &[(&Value, &Held)],
) -> Decision {
    if nodes.is_empty() {
        return Decision::Unschedulable("no nodes available to schedule pods".into());
    }
    let views = views(nodes, bound);
    let mut reasons: BTreeMap<String, usize> = BTreeMap::new();
    let mut feasible = vec![];
    for v in &views {
        match filter(pod, v, &views) {
            Some(reason) => *reasons.entry(reason).or_default() += 1,
            None => feasible.push(v),
        }
    }
    if feasible.is_empty() {
        return Decision::Unschedulable(message(nodes.len(), &reasons));
    }
    let scores = score(pod, &feasible, &views);
    let best = feasible
        .iter()
        .zip(scores)
        .max_by(|(a, sa), (b, sb)| sa.cmp(sb).then_with(|| b.name.cmp(a.name)));
    match best {
        Some((v, _)) => Decision::Bind(v.name.to_string()),
        None => Decision::Unschedulable(message(nodes.len(), &reasons)),
    }
}

/// kube-scheduler's FitError text: reasons counted and sorted, then the
/// preemption post-filter's verdict (no priorities to preempt here).
pub fn message(n: usize, reasons: &BTreeMap<String, usize>) -> String {
    let parts: Vec<String> = reasons.iter().map(|(r, c)| format!("{c} {r}")).collect();
    let mut parts = parts;
    parts.sort();
    format!(
        "0/{n} nodes are available: {}. preemption: 0/{n} nodes are available: {n} Preemption is not helpful for scheduling.",
        parts.join(", ")
    )
}

fn views<'a, N: Borrow<Value>>(
    nodes: &'a [N],
    bound: &[(&'a Value, &'a Held)],
) -> Vec<NodeView<'a>> {
    let mut by_node: HashMap<&str, Vec<(&Value, &Held)>> = HashMap::new();
    for (p, h) in bound {
        by_node
            .entry(str_at(p, "/spec/nodeName"))
            .or_default()
            .push((p, h));
    }
    let mut out: Vec<NodeView> = nodes
        .iter()
        .map(Borrow::borrow)
        .map(|n| {
            let name = str_at(n, "/metadata/name");
            let (pods, terms) = by_node.remove(name).unwrap_or_default().into_iter().unzip();
            NodeView {
                node: n,
                name,
                pods,
                terms,
            }
        })
        .collect();
    out.sort_by(|a, b| a.name.cmp(b.name));
    out
}

/// The first reason `v` cannot take `pod`, in upstream plugin order.
fn filter(pod: &Value, v: &NodeView, all: &[NodeView]) -> Option<String> {
    let cordoned = v
        .node
        .ptr("/spec/unschedulable")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let cordon_taint = terms::Taint {
        key: "node.kubernetes.io/unschedulable".into(),
        value: String::new(),
        effect: "NoSchedule".into(),
    };
    if cordoned && !terms::pod_tolerates(pod, &cordon_taint) {
        return Some("node(s) were unschedulable".into());
    }
    if let Some(t) = terms::untolerated(pod, v.node, &["NoSchedule", "NoExecute"]) {
        return Some(format!("node(s) had untolerated taint {}", t.display()));
    }
    if !terms::node_selected(pod, v.node) {
        return Some("node(s) didn't match Pod's node affinity/selector".into());
    }
    if let Some(r) = spread_filter(pod, v, all) {
        return Some(r);
    }
    interpod_filter(pod, v, all)
}

/// Whether `a` and `b` share a topology domain for `key` (both have the
/// label, with the same value).
fn same_domain(a: &Value, b: &Value, key: &str) -> bool {
    match (terms::node_label(a, key), terms::node_label(b, key)) {
        (Some(x), Some(y)) => x == y,
        _ => false,
    }
}

/// Pods selected by `term` in `v`'s topology domain.
fn in_domain<'a>(
    term: &'a PodTerm,
    v: &'a NodeView,
    all: &'a [NodeView],
) -> impl Iterator<Item = &'a Value> + 'a {
    all.iter()
        .filter(move |o| same_domain(o.node, v.node, &term.topology_key))
        .flat_map(|o| o.pods.iter().copied())
        .filter(move |p| term.selects(p))
}

/// Upstream order: the pod's required affinity, its required
/// anti-affinity, then existing pods' required anti-affinity against it.
fn interpod_filter(pod: &Value, v: &NodeView, all: &[NodeView]) -> Option<String> {
    let affinity = terms::pod_terms(pod, "podAffinity", true);
    if !affinity.is_empty() {
        let satisfied = affinity
            .iter()
            .all(|t| in_domain(t, v, all).next().is_some());
        // The first pod of a group that selects itself may go anywhere.
        let none_anywhere = affinity.iter().all(|t| {
            all.iter()
                .flat_map(|o| o.pods.iter())
                .all(|p| !t.selects(p))
        });
        let selects_itself = affinity.iter().all(|t| t.selects(pod));
        if !(satisfied || (none_anywhere && selects_itself)) {
            return Some("node(s) didn't match pod affinity rules".into());
        }
    }
    let anti = terms::pod_terms(pod, "podAntiAffinity", true);
    if anti.iter().any(|t| in_domain(t, v, all).next().is_some()) {
        return Some("node(s) didn't match pod anti-affinity rules".into());
    }
    for o in all.iter().filter(|o| !o.pods.is_empty()) {
        for held in &o.terms {
            let rejects = held
                .required_anti
                .iter()
                .any(|t| t.selects(pod) && same_domain(o.node, v.node, &t.topology_key));
            if rejects {
                return Some("node(s) didn't satisfy existing pods anti-affinity rules".into());
            }
        }
    }
    None
}

/// One topology spread constraint, parsed.
struct Spread {
    key: String,
    max_skew: i64,
    min_domains: usize,
    selector: LabelSelector,
    hard: bool,
}

fn spreads(pod: &Value) -> Vec<Spread> {
    pod.ptr("/spec/topologySpreadConstraints")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|c| {
            Some(Spread {
                key: str_at(c, "/topologyKey").to_string(),
                max_skew: c.get("maxSkew").and_then(Value::as_i64).unwrap_or(1).max(1),
                min_domains: c.get("minDomains").and_then(Value::as_u64).unwrap_or(1) as usize,
                selector: LabelSelector::from_label_selector_json(c.get("labelSelector")?).ok()?,
                hard: str_at(c, "/whenUnsatisfiable") != "ScheduleAnyway",
            })
        })
        .collect()
}

/// Pods in `pod`'s namespace the constraint counts, per domain, over the
/// nodes `pod` could go to by its node affinity (`nodeAffinityPolicy: Honor`).
fn domain_counts(pod: &Value, s: &Spread, all: &[NodeView]) -> HashMap<String, i64> {
    let ns = str_at(pod, "/metadata/namespace");
    let mut counts: HashMap<String, i64> = HashMap::new();
    for o in all.iter().filter(|o| terms::node_selected(pod, o.node)) {
        let Some(d) = terms::node_label(o.node, &s.key) else {
            continue;
        };
        let n = o
            .pods
            .iter()
            .filter(|p| {
                str_at(p, "/metadata/namespace") == ns
                    && s.selector
                        .matches(p.ptr("/metadata/labels").and_then(Value::as_object))
            })
            .count() as i64;
        *counts.entry(d.to_string()).or_default() += n;
    }
    counts
}

fn spread_filter(pod: &Value, v: &NodeView, all: &[NodeView]) -> Option<String> {
    let labels = pod.ptr("/metadata/labels").and_then(Value::as_object);
    for s in spreads(pod).iter().filter(|s| s.hard) {
        let Some(domain) = terms::node_label(v.node, &s.key) else {
            return Some(
                "node(s) didn't match pod topology spread constraints (missing required label)"
                    .into(),
            );
        };
        let counts = domain_counts(pod, s, all);
        let min = if counts.len() < s.min_domains {
            0
        } else {
            counts.values().copied().min().unwrap_or(0)
        };
        let own = i64::from(s.selector.matches(labels));
        let here = counts.get(domain).copied().unwrap_or(0);
        if here + own - min > s.max_skew {
            return Some("node(s) didn't match pod topology spread constraints".into());
        }
    }
    None
}

/// Scales raw scores to 0..=100 over the feasible nodes; `lower_better`
/// flips them (fewer matching pods is better for spreading).
fn normalise(raw: &[i64], lower_better: bool) -> Vec<i64> {
    let (min, max) = (
        raw.iter().copied().min().unwrap_or(0),
        raw.iter().copied().max().unwrap_or(0),
    );
    if max == min {
        return vec![0; raw.len()];
    }
    raw.iter()
        .map(|r| {
            if lower_better {
                (max - r) * 100 / (max - min)
            } else {
                (r - min) * 100 / (max - min)
            }
        })
        .collect()
}

fn score(pod: &Value, feasible: &[&NodeView], all: &[NodeView]) -> Vec<i64> {
    let node_aff: Vec<i64> = feasible
        .iter()
        .map(|v| terms::node_preference(pod, v.node))
        .collect();
    let interpod: Vec<i64> = feasible
        .iter()
        .map(|v| interpod_preference(pod, v, all))
        .collect();
    let spread: Vec<i64> = feasible
        .iter()
        .map(|v| spread_penalty(pod, v, all))
        .collect();
    let soft_taints: Vec<i64> = feasible
        .iter()
        .map(|v| {
            terms::taints(v.node)
                .iter()
                .filter(|t| t.effect == "PreferNoSchedule" && !terms::pod_tolerates(pod, t))
                .count() as i64
        })
        .collect();
    let load: Vec<i64> = feasible.iter().map(|v| v.pods.len() as i64).collect();
    let parts = [
        (normalise(&node_aff, false), 2),
        (normalise(&interpod, false), 2),
        (normalise(&spread, true), 2),
        (normalise(&soft_taints, true), 3),
        (normalise(&load, true), 1),
    ];
    (0..feasible.len())
        .map(|i| parts.iter().map(|(s, w)| s[i] * w).sum())
        .collect()
}

/// Preferred pod affinity minus preferred anti-affinity, the pod's own
/// terms and (symmetrically) those of the pods already there.
fn interpod_preference(pod: &Value, v: &NodeView, all: &[NodeView]) -> i64 {
    let own: i64 = terms::pod_terms(pod, "podAffinity", false)
        .iter()
        .map(|t| t.weight * in_domain(t, v, all).count() as i64)
        .sum::<i64>()
        - terms::pod_terms(pod, "podAntiAffinity", false)
            .iter()
            .map(|t| t.weight * in_domain(t, v, all).count() as i64)
            .sum::<i64>();
    let mut theirs = 0;
    for o in all {
        for held in &o.terms {
            for (t, sign) in &held.preferred {
                if t.selects(pod) && same_domain(o.node, v.node, &t.topology_key) {
                    theirs += sign * t.weight;
                }
            }
        }
    }
    own + theirs
}

/// Matching pods in the node's domains: the pod's soft constraints, or
/// the system default (a controller's pods over hostnames and zones) when
/// it states none.
fn spread_penalty(pod: &Value, v: &NodeView, all: &[NodeView]) -> i64 {
    let stated = spreads(pod);
    if !stated.is_empty() {
        return stated
            .iter()
            .filter(|s| !s.hard)
            .map(|s| match terms::node_label(v.node, &s.key) {
                Some(d) => domain_counts(pod, s, all).get(d).copied().unwrap_or(0),
                None => 0,
            })
            .sum();
    }
    let owner = str_at(pod, "/metadata/ownerReferences/0/uid");
    if owner.is_empty() {
        return 0;
    }
    let siblings = |o: &NodeView| {
        o.pods
            .iter()
            .filter(|p| str_at(p, "/metadata/ownerReferences/0/uid") == owner)
            .count() as i64
    };
    let host = siblings(v);
    let zone: i64 = all
        .iter()
        .filter(|o| same_domain(o.node, v.node, ZONE))
        .map(siblings)
        .sum();
    host * 2 + zone
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "place_tests.rs"]
mod tests;
