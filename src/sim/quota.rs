//! ResourceQuota admission and the quota controller, as kube-apiserver and
//! kube-controller-manager behave: a create that would push a namespace past a
//! quota's `spec.hard` is refused with 403 `exceeded quota: ...`, a Pod without
//! the compute values a quota constrains is refused with `failed quota: ...:
//! must specify ...`, and every quota's `status.hard`/`status.used` follows the
//! namespace's objects. Tenants run pgfleet in namespaces with quotas; the
//! emulator enforces them so pgfleet's handling of a refusal is tested.
//!
//! Usage is computed from the stored objects under the write lock of the
//! create itself (`Store::mutate_viewing`: a create in a namespace with a
//! quota answers `Change::Locked` to its optimistic attempt), so concurrent
//! creates are admitted one after the other and cannot both take the last
//! slot — as kube-apiserver's quota admission serialises its usage updates.

use super::error::ApiError;
use super::limit_range;
use super::quantity::{self, Milli};
use super::resources::{ResKey, ResourceType};
use super::store::{Change, Lister, Store, str_at};
use crate::json_ptr::Ptr;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, BTreeSet};

/// Quota resources that make every container state a value (kube's
/// backward-compatible pod constraint).
const COMPUTE: [&str; 6] = [
    "cpu",
    "limits.cpu",
    "limits.memory",
    "memory",
    "requests.cpu",
    "requests.memory",
];

/// Core kinds with a plain quota name besides `count/<plural>`.
const CORE_COUNTED: [&str; 7] = [
    "configmaps",
    "persistentvolumeclaims",
    "pods",
    "replicationcontrollers",
    "resourcequotas",
    "secrets",
    "services",
];

fn res_key(group: &str, plural: &str) -> ResKey {
    ResKey {
        group: group.into(),
        plural: plural.into(),
    }
}

/// The kind whose objects a quota resource name counts.
fn kind_of(resource: &str) -> Option<ResKey> {
    if COMPUTE.contains(&resource) {
        return Some(res_key("", "pods"));
    }
    if resource == "requests.storage" {
        return Some(res_key("", "persistentvolumeclaims"));
    }
    if CORE_COUNTED.contains(&resource) {
        return Some(res_key("", resource));
    }
    let counted = resource.strip_prefix("count/")?;
    Some(match counted.split_once('.') {
        Some((plural, group)) => res_key(group, plural),
        None => res_key("", counted),
    })
}

fn quantity_at(v: &Value, ptr: &str) -> Option<Milli> {
    v.ptr(ptr).and_then(Value::as_str).and_then(quantity::parse)
}

/// A Pod's compute usage: the sum over containers, at least the largest init
/// container (init containers run one at a time).
fn pod_compute(pod: &Value, out: &mut BTreeMap<String, Milli>) {
    for (name, ptr) in [
        ("requests.cpu", "/resources/requests/cpu"),
        ("requests.memory", "/resources/requests/memory"),
        ("limits.cpu", "/resources/limits/cpu"),
        ("limits.memory", "/resources/limits/memory"),
    ] {
        let list = |field: &str| -> Vec<Milli> {
            pod.ptr(&format!("/spec/{field}"))
                .and_then(Value::as_array)
                .map(|cs| {
                    cs.iter()
                        .map(|c| quantity_at(c, ptr).unwrap_or(0))
                        .collect()
                })
                .unwrap_or_default()
        };
        let sum: Milli = list("containers").iter().sum();
        let init = list("initContainers").into_iter().max().unwrap_or(0);
        out.insert(name.into(), sum.max(init));
    }
    out.insert("cpu".into(), out["requests.cpu"]);
    out.insert("memory".into(), out["requests.memory"]);
}

/// What one object adds to each quota resource it is counted under.
pub fn usage(k: &ResKey, obj: &Value) -> BTreeMap<String, Milli> {
    let mut u = BTreeMap::new();
    let core = k.group.is_empty();
    if core && k.plural == "pods" {
        let phase = str_at(obj, "/status/phase");
        if phase == "Succeeded" || phase == "Failed" {
            return u;
        }
        pod_compute(obj, &mut u);
    }
    if core && k.plural == "persistentvolumeclaims" {
        let storage = quantity_at(obj, "/spec/resources/requests/storage").unwrap_or(0);
        u.insert("requests.storage".into(), storage);
    }
    if core && CORE_COUNTED.contains(&k.plural.as_str()) {
        u.insert(k.plural.clone(), 1000);
    }
    let count = if core {
        format!("count/{}", k.plural)
    } else {
        format!("count/{}.{}", k.plural, k.group)
    };
    u.insert(count, 1000);
    u
}

fn hard_of(quota: &Value) -> Vec<(String, String)> {
    quota
        .ptr("/spec/hard")
        .and_then(Value::as_object)
        .map(|m| {
            m.iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_string())))
                .collect()
        })
        .unwrap_or_default()
}

/// Summed usage of one kind's objects in a namespace.
fn used_by(store: &impl Lister, k: &ResKey, ns: &str) -> BTreeMap<String, Milli> {
    let mut total = BTreeMap::new();
    for o in store.list_in(k, ns) {
        for (r, v) in usage(k, &o.value()) {
            *total.entry(r).or_insert(0) += v;
        }
    }
    total
}

/// What create admission needs, read under the store's write lock.
pub struct Admission {
    kind: ResKey,
    quotas: Vec<Value>,
    used: BTreeMap<String, Milli>,
    limit_ranges: Vec<Value>,
}

impl Admission {
    /// The namespace's quotas, the current usage of `rt`'s kind, and (for
    /// Pods) the LimitRanges. None when nothing constrains the write.
    pub fn prepare(store: &impl Lister, rt: &ResourceType, ns: &str) -> Option<Admission> {
        if !rt.namespaced || ns.is_empty() {
            return None;
        }
        let kind = rt.key();
        let quotas: Vec<Value> = store
            .list_in(&res_key("", "resourcequotas"), ns)
            .iter()
            .map(|o| o.value())
            .collect();
        let limit_ranges: Vec<Value> = if kind == res_key("", "pods") {
            let lrs = store.list_in(&res_key("", "limitranges"), ns);
            lrs.iter().map(|o| o.value()).collect()
        } else {
            vec![]
        };
        if quotas.is_empty() && limit_ranges.is_empty() {
            return None;
        }
        let used = if quotas.is_empty() {
            BTreeMap::new()
        } else {
            used_by(store, &kind, ns)
        };
        Some(Admission {
            kind,
            quotas,
            used,
            limit_ranges,
        })
    }

    /// Applies LimitRange defaults and checks, then every quota, to a new
    /// object; a refusal is kube's 403 Forbidden.
    pub fn admit(&self, name: &str, obj: &mut Value) -> Result<(), ApiError> {
        let forbidden = |msg: String| {
            ApiError::new(
                403,
                "Forbidden",
                format!("{} \"{name}\" is forbidden: {msg}", self.kind.plural),
            )
            .with_details(json!({"name": name, "kind": self.kind.plural}))
        };
        limit_range::admit(&self.limit_ranges, obj).map_err(forbidden)?;
        let add = usage(&self.kind, obj);
        for q in &self.quotas {
            self.check(q, &add, obj).map_err(forbidden)?;
        }
        Ok(())
    }

    fn check(
        &self,
        quota: &Value,
        add: &BTreeMap<String, Milli>,
        obj: &Value,
    ) -> Result<(), String> {
        let qname = str_at(quota, "/metadata/name");
        let hard: Vec<_> = hard_of(quota)
            .into_iter()
            .filter(|(r, _)| add.contains_key(r))
            .collect();
        if self.kind == res_key("", "pods") {
            let required: Vec<&str> = hard
                .iter()
                .map(|(r, _)| r.as_str())
                .filter(|r| COMPUTE.contains(r))
                .collect();
            missing_compute(&required, obj).map_err(|m| format!("failed quota: {qname}: {m}"))?;
        }
        let (mut req, mut used, mut lim) = (vec![], vec![], vec![]);
        for (r, h) in &hard {
            let Some(limit) = quantity::parse(h) else {
                continue;
            };
            let now = self.used.get(r).copied().unwrap_or(0);
            let more = add.get(r).copied().unwrap_or(0);
            if now + more > limit {
                req.push(format!("{r}={}", quantity::format(more, h)));
                used.push(format!("{r}={}", quantity::format(now, h)));
                lim.push(format!("{r}={}", quantity::format(limit, h)));
            }
        }
        if req.is_empty() {
            return Ok(());
        }
        Err(format!(
            "exceeded quota: {qname}, requested: {}, used: {}, limited: {}",
            req.join(","),
            used.join(","),
            lim.join(",")
        ))
    }
}

/// Kube's pod constraint: each container must state every compute resource a
/// quota limits (`must specify limits.cpu for: a,b; requests.memory for: a`).
fn missing_compute(required: &[&str], pod: &Value) -> Result<(), String> {
    let mut missing: BTreeMap<&str, BTreeSet<String>> = BTreeMap::new();
    for field in ["containers", "initContainers"] {
        let cs = pod.ptr(&format!("/spec/{field}")).and_then(Value::as_array);
        for c in cs.into_iter().flatten() {
            for r in required {
                let ptr = match *r {
                    "cpu" | "requests.cpu" => "/resources/requests/cpu",
                    "memory" | "requests.memory" => "/resources/requests/memory",
                    "limits.cpu" => "/resources/limits/cpu",
                    _ => "/resources/limits/memory",
                };
                if c.ptr(ptr).is_none() {
                    missing
                        .entry(r)
                        .or_default()
                        .insert(str_at(c, "/name").to_string());
                }
            }
        }
    }
    if missing.is_empty() {
        return Ok(());
    }
    let parts: Vec<String> = missing
        .iter()
        .map(|(r, names)| {
            format!(
                "{r} for: {}",
                names.iter().cloned().collect::<Vec<_>>().join(",")
            )
        })
        .collect();
    Err(format!("must specify {}", parts.join("; ")))
}

/// The quota controller: recomputes `status.hard`/`status.used` of every
/// quota in `ns` (called after each write in the namespace).
pub fn refresh(store: &Store, ns: &str) {
    let rq = res_key("", "resourcequotas");
    for q in store.list(&rq, Some(ns), None).0 {
        let hard = hard_of(&q.value());
        let mut by_kind: BTreeMap<ResKey, BTreeMap<String, Milli>> = BTreeMap::new();
        let mut used = Map::new();
        let mut hard_json = Map::new();
        for (r, h) in &hard {
            let Some(k) = kind_of(r) else { continue };
            let totals = by_kind
                .entry(k.clone())
                .or_insert_with(|| used_by(store, &k, ns));
            let n = totals.get(r).copied().unwrap_or(0);
            used.insert(r.clone(), json!(quantity::format(n, h)));
            hard_json.insert(r.clone(), json!(h));
        }
        let status = json!({"hard": hard_json, "used": used});
        if q.value().get("status") == Some(&status) {
            continue;
        }
        let name = q.name().to_string();
        let _ = store.mutate::<std::convert::Infallible>(&rq, ns, &name, |cur| {
            let Some(cur) = cur else {
                return Ok(Change::Keep);
            };
            let mut v = cur.value();
            v["status"] = status.clone();
            Ok(Change::Put(v))
        });
    }
}
