//! Where instance and pooler pods run: `spec.affinity`,
//! `spec.topologySpreadConstraints` and `spec.priorityClassName` rendered
//! into the pod spec, and validated first (every field is tenant input).
//!
//! Upgrade rule (docs/placement.md): the pod template hash covers the
//! placement only when the cluster states some (`spec.affinity`, spread
//! constraints or a priority class). A cluster that states none keeps the
//! hash its pods have, so upgrading pgfleet restarts nothing; the default
//! anti-affinity (preferred, per hostname) reaches its pods as they are
//! created or recreated for other reasons. Stating or changing placement
//! makes every instance outdated and the primary-aware rolling update
//! replaces them one at a time. Pooler pods are never applied over once
//! running, so their (always preferred) spread also only affects new pods.

use super::build::{LABEL_CLUSTER, LABEL_KIND, LABEL_SHARD, Owner};
use crate::crd::PostgresCluster;
use crate::crd::PostgresClusterSpec;
use crate::crd::placement::{
    AffinitySpec, AntiAffinityType, LabelSelector, PodAffinityRules, SelectorOperator, Toleration,
    TolerationOperator,
};
use k8s_openapi::api::core::v1::PodSpec;
use serde_json::{Value, json};

/// Whether the cluster states any placement (then it is part of the hash).
pub fn hash_basis(pg: &PostgresCluster) -> Option<Value> {
    let s = &pg.spec;
    let stated = s.affinity.is_some()
        || !s.topology_spread_constraints.is_empty()
        || s.priority_class_name.is_some();
    stated.then(|| {
        json!({"affinity": s.affinity, "spread": s.topology_spread_constraints,
               "priority": s.priority_class_name})
    })
}

/// The pods of one group: this shard's instances, or the cluster's poolers.
fn group_selector(o: &Owner, kind: &str) -> Value {
    let mut labels = json!({LABEL_CLUSTER: o.name, LABEL_KIND: kind});
    if kind == "instance" {
        labels[LABEL_SHARD] = json!(o.shard.to_string());
    }
    json!({"matchLabels": labels})
}

fn term(selector: &Value, key: &str) -> Value {
    json!({"labelSelector": selector, "topologyKey": key})
}

/// Renders placement into an instance pod's spec.
pub fn instance(spec: &mut PodSpec, o: &Owner, pg: &PostgresCluster) {
    let mut rendered = json!({});
    instance_json(&mut rendered, o, pg);
    merge(spec, rendered);
}

/// Renders placement into a pooler pod's spec: poolers prefer distinct
/// nodes, and go where the instances may go (selector, tolerations,
/// priority).
pub fn pooler(spec: &mut PodSpec, o: &Owner, pg: &PostgresCluster) {
    let mut rendered = json!({});
    pooler_json(&mut rendered, o, pg);
    merge(spec, rendered);
}

/// Copies the placement fields rendered as JSON into the typed pod spec.
/// The CRD's placement types serialize to kube's own schema (validated
/// before any pod is built), so a field that does not read back is a bug in
/// this module: it is logged, and the pod goes without it rather than not
/// at all.
fn merge(spec: &mut PodSpec, mut rendered: Value) {
    rendered["containers"] = json!([]);
    match serde_json::from_value::<PodSpec>(rendered) {
        Ok(p) => {
            spec.affinity = p.affinity.or(spec.affinity.take());
            spec.node_selector = p.node_selector.or(spec.node_selector.take());
            spec.tolerations = p.tolerations.or(spec.tolerations.take());
            spec.priority_class_name = p.priority_class_name.or(spec.priority_class_name.take());
            spec.topology_spread_constraints = p
                .topology_spread_constraints
                .or(spec.topology_spread_constraints.take());
        }
        Err(e) => tracing::error!(error = %e, "placement does not render into a pod spec"),
    }
}

/// Renders placement into an instance pod spec as JSON.
fn instance_json(spec: &mut Value, o: &Owner, pg: &PostgresCluster) {
    let aff = pg.spec.affinity.clone().unwrap_or_default();
    let selector = group_selector(o, "instance");
    let mut anti = aff
        .additional_pod_anti_affinity
        .as_ref()
        .map(rules_json)
        .unwrap_or_else(|| json!({}));
    if aff.enable_pod_anti_affinity {
        let own = term(&selector, &aff.topology_key);
        let (field, item) = match aff.pod_anti_affinity_type {
            AntiAffinityType::Required => ("requiredDuringSchedulingIgnoredDuringExecution", own),
            AntiAffinityType::Preferred => (
                "preferredDuringSchedulingIgnoredDuringExecution",
                json!({"weight": 100, "podAffinityTerm": own}),
            ),
        };
        push(&mut anti, field, item);
    }
    let mut affinity = json!({});
    if !is_empty(&anti) {
        affinity["podAntiAffinity"] = anti;
    }
    if let Some(a) = aff.additional_pod_affinity.as_ref().map(rules_json)
        && !is_empty(&a)
    {
        affinity["podAffinity"] = a;
    }
    if !is_empty(&affinity) {
        spec["affinity"] = affinity;
    }
    common(spec, &aff, pg);
    let spread: Vec<Value> = pg
        .spec
        .topology_spread_constraints
        .iter()
        .map(|c| {
            let mut v = json!(c);
            if c.label_selector.is_none() {
                v["labelSelector"] = selector.clone();
            }
            v
        })
        .collect();
    if !spread.is_empty() {
        spec["topologySpreadConstraints"] = json!(spread);
    }
}

fn pooler_json(spec: &mut Value, o: &Owner, pg: &PostgresCluster) {
    let aff = pg.spec.affinity.clone().unwrap_or_default();
    let own = term(&group_selector(o, "pooler"), "kubernetes.io/hostname");
    spec["affinity"] = json!({"podAntiAffinity": {"preferredDuringSchedulingIgnoredDuringExecution":
        [{"weight": 100, "podAffinityTerm": own}]}});
    common(spec, &aff, pg);
}

fn common(spec: &mut Value, aff: &AffinitySpec, pg: &PostgresCluster) {
    if !aff.node_selector.is_empty() {
        spec["nodeSelector"] = json!(aff.node_selector);
    }
    if !aff.tolerations.is_empty() {
        spec["tolerations"] = json!(aff.tolerations);
    }
    if let Some(p) = &pg.spec.priority_class_name {
        spec["priorityClassName"] = json!(p);
    }
}

fn rules_json(r: &PodAffinityRules) -> Value {
    json!(r)
}

fn is_empty(v: &Value) -> bool {
    v.as_object().is_none_or(|m| m.is_empty())
}

fn push(obj: &mut Value, field: &str, item: Value) {
    match obj[field].as_array_mut() {
        Some(list) => list.push(item),
        None => obj[field] = json!([item]),
    }
}

/// Problems with the placement fields, each naming its field.
pub fn validate(spec: &PostgresClusterSpec, errs: &mut Vec<String>) {
    if let Some(a) = &spec.affinity {
        label_key("spec.affinity.topologyKey", &a.topology_key, errs);
        for (k, v) in &a.node_selector {
            label_key(
                &format!("spec.affinity.nodeSelector[{}]", shown(k)),
                k,
                errs,
            );
            label_value(
                &format!("spec.affinity.nodeSelector[{}]", shown(k)),
                v,
                errs,
            );
        }
        for (i, t) in a.tolerations.iter().enumerate() {
            toleration(&format!("spec.affinity.tolerations[{i}]"), t, errs);
        }
        let extra = [
            ("additionalPodAffinity", &a.additional_pod_affinity),
            ("additionalPodAntiAffinity", &a.additional_pod_anti_affinity),
        ];
        for (name, rules) in extra {
            if let Some(r) = rules {
                rules_ok(&format!("spec.affinity.{name}"), r, errs);
            }
        }
    }
    for (i, c) in spec.topology_spread_constraints.iter().enumerate() {
        let f = format!("spec.topologySpreadConstraints[{i}]");
        label_key(&format!("{f}.topologyKey"), &c.topology_key, errs);
        if let Some(s) = &c.label_selector {
            selector(&format!("{f}.labelSelector"), s, errs);
        }
    }
    if let Some(p) = &spec.priority_class_name
        && !dns_subdomain(p)
    {
        errs.push(format!(
            "spec.priorityClassName: \"{}\" is not a valid name (lowercase DNS subdomain)",
            shown(p)
        ));
    }
}

fn rules_ok(f: &str, r: &PodAffinityRules, errs: &mut Vec<String>) {
    let terms = r.required.iter().enumerate().map(|(i, t)| {
        (
            format!("{f}.requiredDuringSchedulingIgnoredDuringExecution[{i}]"),
            t,
        )
    });
    let weighted = r.preferred.iter().enumerate().map(|(i, w)| {
        (
            format!("{f}.preferredDuringSchedulingIgnoredDuringExecution[{i}].podAffinityTerm"),
            &w.pod_affinity_term,
        )
    });
    for (tf, t) in terms.chain(weighted) {
        label_key(&format!("{tf}.topologyKey"), &t.topology_key, errs);
        if let Some(s) = &t.label_selector {
            selector(&format!("{tf}.labelSelector"), s, errs);
        }
        for (j, ns) in t.namespaces.iter().enumerate() {
            if !dns_label(ns) {
                errs.push(format!(
                    "{tf}.namespaces[{j}]: \"{}\" is not a namespace name",
                    shown(ns)
                ));
            }
        }
    }
    for (i, w) in r.preferred.iter().enumerate() {
        if !(1..=100).contains(&w.weight) {
            errs.push(format!(
                "{f}.preferredDuringSchedulingIgnoredDuringExecution[{i}].weight: {} is outside 1..100",
                w.weight
            ));
        }
    }
}

fn selector(f: &str, s: &LabelSelector, errs: &mut Vec<String>) {
    for (k, v) in &s.match_labels {
        label_key(&format!("{f}.matchLabels[{}]", shown(k)), k, errs);
        label_value(&format!("{f}.matchLabels[{}]", shown(k)), v, errs);
    }
    for (i, e) in s.match_expressions.iter().enumerate() {
        let ef = format!("{f}.matchExpressions[{i}]");
        label_key(&format!("{ef}.key"), &e.key, errs);
        let wants_values = matches!(e.operator, SelectorOperator::In | SelectorOperator::NotIn);
        if wants_values == e.values.is_empty() {
            errs.push(format!(
                "{ef}.values: {} takes {}",
                json!(e.operator).as_str().unwrap_or("?"),
                if wants_values {
                    "at least one value"
                } else {
                    "no values"
                }
            ));
        }
        for v in &e.values {
            label_value(&format!("{ef}.values"), v, errs);
        }
    }
}

fn toleration(f: &str, t: &Toleration, errs: &mut Vec<String>) {
    let exists = t.operator == Some(TolerationOperator::Exists);
    match t.key.as_deref() {
        Some(k) if !k.is_empty() => label_key(&format!("{f}.key"), k, errs),
        _ if !exists => errs.push(format!("{f}.operator: must be Exists when key is empty")),
        _ => {}
    }
    if exists && t.value.as_deref().is_some_and(|v| !v.is_empty()) {
        errs.push(format!("{f}.value: must be empty when operator is Exists"));
    }
    if let Some(v) = &t.value {
        label_value(&format!("{f}.value"), v, errs);
    }
    if t.toleration_seconds.is_some()
        && t.effect != Some(crate::crd::placement::TaintEffect::NoExecute)
    {
        errs.push(format!(
            "{f}.tolerationSeconds: only valid with effect NoExecute"
        ));
    }
}

/// Text of tenant input fit for a message (bounded, printable).
fn shown(s: &str) -> String {
    crate::postgres::shown(s).to_string()
}

/// A label name part: 1..=63 alphanumerics, `-`, `_`, `.`, alphanumeric at both ends.
fn label_name(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || b"-_.".contains(c))
}

fn dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    !b.is_empty()
        && b.len() <= 63
        && b[0].is_ascii_alphanumeric()
        && b[b.len() - 1].is_ascii_alphanumeric()
        && b.iter()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || *c == b'-')
}

fn dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(dns_label)
}

/// Whether `s` is a Kubernetes label key (`[prefix/]name`).
pub fn is_label_key(s: &str) -> bool {
    match s.split_once('/') {
        Some((prefix, name)) => dns_subdomain(prefix) && label_name(name),
        None => label_name(s),
    }
}

fn label_key(f: &str, k: &str, errs: &mut Vec<String>) {
    if !is_label_key(k) {
        errs.push(format!("{f}: \"{}\" is not a valid label key", shown(k)));
    }
}

fn label_value(f: &str, v: &str, errs: &mut Vec<String>) {
    if !(v.is_empty() || label_name(v)) {
        errs.push(format!("{f}: \"{}\" is not a valid label value", shown(v)));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "placement_tests.rs"]
mod tests;
