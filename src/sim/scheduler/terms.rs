//! The matching rules kube-scheduler's filter plugins share, as pure
//! functions over `serde_json` objects: taints against tolerations
//! (`TaintToleration`), node selector terms (`NodeAffinity`), and pod
//! (anti-)affinity terms (`InterPodAffinity`). Kept apart from the placement
//! decision so each rule can be read next to its upstream counterpart.

use crate::json_ptr::Ptr;
use crate::selector::LabelSelector;
use crate::store::str_at;
use serde_json::{Map, Value};

/// A taint as it sits in `node.spec.taints`.
#[derive(Debug, Clone, PartialEq)]
pub struct Taint {
    pub key: String,
    pub value: String,
    pub effect: String,
}

impl Taint {
    pub fn of(v: &Value) -> Taint {
        Taint {
            key: str_at(v, "/key").to_string(),
            value: str_at(v, "/value").to_string(),
            effect: str_at(v, "/effect").to_string(),
        }
    }

    /// How kube-scheduler prints it in "had untolerated taint {key: value}".
    pub fn display(&self) -> String {
        format!("{{{}: {}}}", self.key, self.value)
    }
}

/// The taints of a node object.
pub fn taints(node: &Value) -> Vec<Taint> {
    node.ptr("/spec/taints")
        .and_then(Value::as_array)
        .map(|ts| ts.iter().map(Taint::of).collect())
        .unwrap_or_default()
}

/// `v1.Toleration.ToleratesTaint`: an empty key with `Exists` tolerates
/// everything; an empty effect matches every effect.
pub fn tolerates(toleration: &Value, t: &Taint) -> bool {
    let effect = str_at(toleration, "/effect");
    if !effect.is_empty() && effect != t.effect {
        return false;
    }
    let key = str_at(toleration, "/key");
    if !key.is_empty() && key != t.key {
        return false;
    }
    match str_at(toleration, "/operator") {
        "Exists" => true,
        "" | "Equal" => str_at(toleration, "/value") == t.value,
        _ => false,
    }
}

/// Whether any of the pod's tolerations tolerates `t`.
pub fn pod_tolerates(pod: &Value, t: &Taint) -> bool {
    tolerations(pod).iter().any(|tol| tolerates(tol, t))
}

pub fn tolerations(pod: &Value) -> &[Value] {
    pod.ptr("/spec/tolerations")
        .and_then(Value::as_array)
        .map_or(&[], Vec::as_slice)
}

/// The first taint of `effects` the pod does not tolerate.
pub fn untolerated(pod: &Value, node: &Value, effects: &[&str]) -> Option<Taint> {
    taints(node)
        .into_iter()
        .filter(|t| effects.contains(&t.effect.as_str()))
        .find(|t| !pod_tolerates(pod, t))
}

fn label<'a>(labels: Option<&'a Map<String, Value>>, key: &str) -> Option<&'a str> {
    labels?.get(key)?.as_str()
}

/// One `NodeSelectorRequirement` (In, NotIn, Exists, DoesNotExist, Gt, Lt)
/// against a value (`None`: the label is absent).
fn requirement_matches(req: &Value, actual: Option<&str>) -> bool {
    let values: Vec<&str> = req
        .get("values")
        .and_then(Value::as_array)
        .map(|vs| vs.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let number = |s: &str| s.parse::<i64>().ok();
    match str_at(req, "/operator") {
        "In" => actual.is_some_and(|a| values.contains(&a)),
        "NotIn" => !actual.is_some_and(|a| values.contains(&a)),
        "Exists" => actual.is_some(),
        "DoesNotExist" => actual.is_none(),
        "Gt" => {
            matches!((actual.and_then(number), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a > b)
        }
        "Lt" => {
            matches!((actual.and_then(number), values.first().and_then(|v| number(v))), (Some(a), Some(b)) if a < b)
        }
        _ => false,
    }
}

/// One `NodeSelectorTerm`: every matchExpression on the labels and every
/// matchField (only `metadata.name` exists) must hold. An empty term
/// matches nothing, as upstream.
pub fn node_term_matches(term: &Value, node: &Value) -> bool {
    let labels = node.ptr("/metadata/labels").and_then(Value::as_object);
    let exprs = term.get("matchExpressions").and_then(Value::as_array);
    let fields = term.get("matchFields").and_then(Value::as_array);
    if exprs.is_none_or(Vec::is_empty) && fields.is_none_or(Vec::is_empty) {
        return false;
    }
    exprs
        .into_iter()
        .flatten()
        .all(|r| requirement_matches(r, label(labels, str_at(r, "/key"))))
        && fields.into_iter().flatten().all(|r| {
            str_at(r, "/key") == "metadata.name"
                && requirement_matches(r, Some(str_at(node, "/metadata/name")))
        })
}

/// `spec.nodeSelector` and required node affinity (terms ORed), the
/// `NodeAffinity` filter.
pub fn node_selected(pod: &Value, node: &Value) -> bool {
    let labels = node.ptr("/metadata/labels").and_then(Value::as_object);
    let selector_ok = pod
        .ptr("/spec/nodeSelector")
        .and_then(Value::as_object)
        .into_iter()
        .flatten()
        .all(|(k, v)| label(labels, k) == v.as_str());
    let terms = pod
        .ptr("/spec/affinity/nodeAffinity/requiredDuringSchedulingIgnoredDuringExecution/nodeSelectorTerms")
        .and_then(Value::as_array);
    selector_ok && terms.is_none_or(|ts| ts.iter().any(|t| node_term_matches(t, node)))
}

/// Sum of the weights of the preferred node affinity terms `node` matches.
pub fn node_preference(pod: &Value, node: &Value) -> i64 {
    pod.ptr("/spec/affinity/nodeAffinity/preferredDuringSchedulingIgnoredDuringExecution")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| {
            p.get("preference")
                .is_some_and(|t| node_term_matches(t, node))
        })
        .map(|p| p.get("weight").and_then(Value::as_i64).unwrap_or(0))
        .sum()
}

/// A pod (anti-)affinity term, resolved against the pod that carries it.
#[derive(Debug, Clone)]
pub struct PodTerm {
    pub selector: LabelSelector,
    /// `None`: every namespace (an empty `namespaceSelector`).
    pub namespaces: Option<Vec<String>>,
    pub topology_key: String,
    pub weight: i64,
}

impl PodTerm {
    /// Builds a term; `owner_ns` is the namespace of the pod carrying it (the
    /// default when neither `namespaces` nor `namespaceSelector` is set).
    /// A term whose selector does not parse matches nothing.
    pub fn parse(term: &Value, owner_ns: &str, weight: i64) -> Option<PodTerm> {
        let selector = match term.get("labelSelector") {
            None | Some(Value::Null) => return None,
            Some(s) => LabelSelector::from_label_selector_json(s).ok()?,
        };
        let listed: Vec<String> = term
            .get("namespaces")
            .and_then(Value::as_array)
            .map(|ns| {
                ns.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default();
        let all = term
            .get("namespaceSelector")
            .and_then(Value::as_object)
            .is_some_and(Map::is_empty);
        let namespaces = if all {
            None
        } else if listed.is_empty() {
            Some(vec![owner_ns.to_string()])
        } else {
            Some(listed)
        };
        Some(PodTerm {
            selector,
            namespaces,
            topology_key: str_at(term, "/topologyKey").to_string(),
            weight,
        })
    }

    /// Whether `pod` is one the term selects.
    pub fn selects(&self, pod: &Value) -> bool {
        let ns = str_at(pod, "/metadata/namespace");
        self.namespaces
            .as_ref()
            .is_none_or(|list| list.iter().any(|n| n == ns))
            && self
                .selector
                .matches(pod.ptr("/metadata/labels").and_then(Value::as_object))
    }
}

/// The terms of one kind (`podAffinity` / `podAntiAffinity`) and strength
/// (`required` / `preferred`) a pod carries.
pub fn pod_terms(pod: &Value, kind: &str, required: bool) -> Vec<PodTerm> {
    let ns = str_at(pod, "/metadata/namespace");
    let base = format!("/spec/affinity/{kind}");
    if required {
        pod.ptr(&format!(
            "{base}/requiredDuringSchedulingIgnoredDuringExecution"
        ))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|t| PodTerm::parse(t, ns, 1))
        .collect()
    } else {
        pod.ptr(&format!(
            "{base}/preferredDuringSchedulingIgnoredDuringExecution"
        ))
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|w| {
            let weight = w.get("weight").and_then(Value::as_i64).unwrap_or(0);
            PodTerm::parse(w.get("podAffinityTerm")?, ns, weight)
        })
        .collect()
    }
}

/// The value of label `key` on a node, if it has it.
pub fn node_label<'a>(node: &'a Value, key: &str) -> Option<&'a str> {
    label(node.ptr("/metadata/labels").and_then(Value::as_object), key)
}
