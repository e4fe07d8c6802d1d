//! One emulated cluster: the store, the served types, faults, addresses and
//! the kubelet runtime, plus the write semantics kube-apiserver applies on top
//! of storage (identity, generation, status subresource, schema, finalizers).

use super::error::ApiError;
use super::faults::Faults;
use super::ipam::Ipam;
use super::patch;
use super::pod_security::Level as PsaLevel;
use super::resources::{Registry, ResKey, ResourceType};
use super::runtime::Runtime;
use super::schema;
use super::store::{Change, EventType, Outcome, Store, StoredObject, str_at};
use crate::json_ptr::Ptr;
use serde_json::{Value, json};
use std::sync::{Arc, RwLock};

#[path = "cluster_values.rs"]
mod values;
pub use values::finalizers;
use values::{dedup, removed_fields, same_spec};

/// Which part of an object a write addresses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Sub {
    Main,
    Status,
    /// A Pod's `binding` subresource: `spec.nodeName` and the
    /// `PodScheduled` condition in one write, as kube-apiserver's binding
    /// storage does (one update, not a spec write and a status write).
    Binding,
}

/// Per-request write options from the query string.
#[derive(Debug, Clone, Default)]
pub struct WriteOpts {
    pub field_manager: String,
    pub dry_run: bool,
    pub force: bool,
    /// Server-side apply computes managedFields itself.
    pub is_apply: bool,
    /// `fieldValidation=Strict`: unknown fields are an error instead of pruned.
    pub strict: bool,
}

/// Per-request delete options (query string and DeleteOptions body).
#[derive(Debug, Clone, Default)]
pub struct DeleteOpts {
    pub propagation: Option<String>,
    pub grace_period: Option<i64>,
    pub precondition_uid: Option<String>,
    pub precondition_rv: Option<String>,
    pub dry_run: bool,
}

pub struct Cluster {
    pub name: String,
    pub store: Store,
    pub registry: RwLock<Registry>,
    pub faults: Faults,
    pub ipam: Ipam,
    pub runtime: RwLock<Option<Arc<dyn Runtime>>>,
    /// The writes the garbage collector and the storage controllers act
    /// on (see `gc`).
    pub gc: super::gc::Queue,
    /// Request log for tests (off by default).
    pub audit: super::audit::AuditLog,
    /// Every exec command asked of this cluster (for tests).
    pub execs: super::exec_log::ExecLog,
    /// The CA that signs the server certificate; service-account token
    /// Secrets carry it as `ca.crt`, as on a real cluster.
    pub ca_pem: std::sync::OnceLock<String>,
    /// Node state the API does not hold (kubelets that are down).
    pub nodes: super::nodes::NodeState,
}

pub fn now_rfc3339() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true)
}

fn new_uid() -> String {
    let n: u128 = rand::random();
    let h = format!("{n:032x}");
    format!(
        "{}-{}-4{}-a{}-{}",
        &h[0..8],
        &h[8..12],
        &h[13..16],
        &h[17..20],
        &h[20..32]
    )
}

impl Cluster {
    pub fn new(name: &str, ipam: Ipam, history: usize) -> Arc<Self> {
        Arc::new(Cluster {
            name: name.to_string(),
            store: Store::new(history),
            registry: RwLock::new(Registry::default()),
            faults: Faults::default(),
            ipam,
            runtime: RwLock::new(None),
            gc: Default::default(),
            audit: Default::default(),
            execs: Default::default(),
            ca_pem: Default::default(),
            nodes: Default::default(),
        })
    }

    pub fn registry(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        self.registry.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn runtime(&self) -> Option<Arc<dyn Runtime>> {
        self.runtime
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Resolves a stored kind to its type (first served version).
    pub fn type_of(&self, key: &ResKey) -> Option<ResourceType> {
        self.registry().by_key(key).cloned()
    }

    pub fn get(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
    ) -> Result<Arc<StoredObject>, ApiError> {
        self.store
            .get(&rt.key(), ns, name)
            .ok_or_else(|| ApiError::not_found(&rt.qualified(), name))
    }

    fn check_namespace(&self, rt: &ResourceType, ns: &str) -> Result<(), ApiError> {
        if !rt.namespaced {
            return Ok(());
        }
        let key = ResKey {
            group: String::new(),
            plural: "namespaces".into(),
        };
        match self.store.get(&key, "", ns) {
            None => Err(ApiError::not_found("namespaces", ns)),
            Some(n) if n.is_deleting() => Err(ApiError::new(
                403,
                "Forbidden",
                format!(
                    "{} is forbidden: unable to create new content in namespace {ns} because it is being terminated",
                    rt.qualified()
                ),
            )),
            Some(_) => Ok(()),
        }
    }

    /// The Pod Security level the namespace enforces on new Pods (read before
    /// the store is locked for the write; None for other kinds).
    fn pod_security_level(&self, rt: &ResourceType, ns: &str) -> Option<PsaLevel> {
        if rt.group.is_empty() && rt.plural == "pods" {
            let key = ResKey {
                group: String::new(),
                plural: "namespaces".into(),
            };
            self.store
                .get(&key, "", ns)
                .and_then(|n| PsaLevel::of_namespace(&n.value()))
        } else {
            None
        }
    }

    /// POST: creates an object (name or generateName).
    pub fn create(
        &self,
        rt: &ResourceType,
        ns: &str,
        mut obj: Value,
        opts: &WriteOpts,
    ) -> Result<Arc<StoredObject>, ApiError> {
        if !obj.is_object() {
            return Err(ApiError::bad_request("the body must be a JSON object"));
        }
        let mut name = str_at(&obj, "/metadata/name").to_string();
        if name.is_empty() {
            let prefix = str_at(&obj, "/metadata/generateName").to_string();
            if prefix.is_empty() {
                return Err(ApiError::invalid(
                    &rt.kind,
                    "",
                    vec![(
                        "metadata.name".into(),
                        "FieldValueRequired".into(),
                        "metadata.name: Required value: name or generateName is required".into(),
                    )],
                ));
            }
            name = super::names::generate_name(&prefix);
            obj["metadata"]["name"] = json!(name);
        }
        let body_ns = str_at(&obj, "/metadata/namespace").to_string();
        if rt.namespaced && !body_ns.is_empty() && body_ns != ns {
            return Err(ApiError::bad_request(format!(
                "the namespace of the provided object ({body_ns}) does not match the namespace sent on the request ({ns})"
            )));
        }
        self.check_namespace(rt, ns)?;
        let psa = self.pod_security_level(rt, ns);
        let mut dry = None;
        let out = self
            .store
            .mutate_viewing(&rt.key(), ns, &name, |cur, view| {
                if cur.is_some() {
                    return Err(ApiError::already_exists(&rt.qualified(), &name));
                }
                // A copy per attempt: a lost race decides again on the body.
                let mut v = obj.clone();
                self.finish(rt, ns, &name, None, &mut v, Sub::Main, opts.strict)?;
                super::storage::admit(view, rt, None, &mut v)?;
                if let Some(q) = super::quota::Admission::prepare(view, rt, ns) {
                    if !view.is_locked() {
                        return Ok(Change::Locked);
                    }
                    q.admit(&name, &mut v)?;
                }
                admit_pod(psa, &name, &v)?;
                patch::record_update(None, &mut v, &opts.field_manager, &now_rfc3339());
                if opts.dry_run {
                    dry = Some(v);
                    return Ok(Change::Keep);
                }
                Ok(Change::Put(v))
            })?;
        self.after_write(rt, out.as_ref());
        dry.map(|v| StoredObject::new(&v))
            .or(out.map(|o| o.obj))
            .ok_or_else(|| ApiError::new(500, "InternalError", "create produced nothing"))
    }

    /// Writes the result of `edit` on the current object (PUT, PATCH, apply).
    // The arguments are the parts of one API request; a struct would only rename them.
    /// `edit` gets the current object (None when absent) and returns the
    /// object to store; absent objects are created only when `create_missing`.
    #[allow(clippy::too_many_arguments)]
    pub fn write(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        sub: Sub,
        opts: &WriteOpts,
        create_missing: bool,
        mut edit: impl FnMut(Option<&Value>) -> Result<Value, ApiError>,
    ) -> Result<Arc<StoredObject>, ApiError> {
        if create_missing {
            self.check_namespace(rt, ns)?;
        }
        let psa = self.pod_security_level(rt, ns);
        let mut dry = None;
        let out = self.store.mutate_viewing(&rt.key(), ns, name, |cur, view| {
            let parsed = cur.map(|c| c.value());
            let old = parsed.as_ref();
            if old.is_none() && !create_missing {
                return Err(ApiError::not_found(&rt.qualified(), name));
            }
            let mut v = edit(old)?;
            if !v.is_object() {
                return Err(ApiError::bad_request("the body must be a JSON object"));
            }
            if let (Some(o), Some(want)) = (old, v.ptr("/metadata/resourceVersion")) {
                let want = want.as_str().unwrap_or_default();
                if !want.is_empty() && want != str_at(o, "/metadata/resourceVersion") {
                    return Err(ApiError::conflict(&rt.qualified(), name));
                }
            }
            let body_name = str_at(&v, "/metadata/name");
            if !body_name.is_empty() && body_name != name {
                return Err(ApiError::bad_request(format!(
                    "the name of the object ({body_name}) does not match the name on the URL ({name})"
                )));
            }
            v["metadata"]["name"] = json!(name);
            // Server-side apply computed managedFields itself; `finish` must
            // not drop them (it clears client-sent ones on create and keeps
            // the stored ones on status writes).
            let applied_fields = opts
                .is_apply
                .then(|| v.ptr("/metadata/managedFields").cloned())
                .flatten();
            self.finish(rt, ns, name, old, &mut v, sub, opts.strict)?;
            if sub == Sub::Main {
                super::storage::admit(view, rt, old, &mut v)?;
            }
            if old.is_none() {
                if let Some(q) = super::quota::Admission::prepare(view, rt, ns) {
                    if !view.is_locked() {
                        return Ok(Change::Locked);
                    }
                    q.admit(name, &mut v)?;
                }
                admit_pod(psa, name, &v)?;
            }
            if let Some(mf) = applied_fields {
                v["metadata"]["managedFields"] = mf;
            }
            if !opts.is_apply {
                patch::record_update(old, &mut v, &opts.field_manager, &now_rfc3339());
            }
            if opts.dry_run {
                dry = Some(v);
                return Ok(Change::Keep);
            }
            if v.ptr("/metadata/deletionTimestamp").is_some() && finalizers(&v).is_empty() {
                return Ok(Change::Delete);
            }
            match old {
                Some(o) if super::store::same_content(o, &v) => Ok(Change::Keep),
                _ => Ok(Change::Changed(v)),
            }
        })?;
        self.after_write(rt, out.as_ref());
        dry.map(|v| StoredObject::new(&v))
            .or(out.map(|o| o.obj))
            .ok_or_else(|| ApiError::not_found(&rt.qualified(), name))
    }

    /// The semantics kube-apiserver applies to every write: identity fields,
    /// the status subresource split, generation, schema and kind-specific defaults.
    #[allow(clippy::too_many_arguments)]
    fn finish(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        old: Option<&Value>,
        v: &mut Value,
        sub: Sub,
        strict: bool,
    ) -> Result<(), ApiError> {
        v["apiVersion"] = json!(rt.api_version());
        v["kind"] = json!(rt.kind);
        if !v.get("metadata").is_some_and(Value::is_object) {
            v["metadata"] = json!({});
        }
        if rt.namespaced {
            v["metadata"]["namespace"] = json!(ns);
        } else if let Some(m) = v["metadata"].as_object_mut() {
            m.remove("namespace");
        }
        super::names::validate_object(rt, name, v)?;
        match old {
            Some(o) => {
                if sub == Sub::Status {
                    let status = v.get("status").cloned();
                    *v = o.clone();
                    match status {
                        Some(s) => v["status"] = s,
                        None => {
                            if let Some(m) = v.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                } else if rt.status_subresource && sub == Sub::Main {
                    match o.get("status") {
                        Some(s) => v["status"] = s.clone(),
                        None => {
                            if let Some(m) = v.as_object_mut() {
                                m.remove("status");
                            }
                        }
                    }
                }
                for k in [
                    "uid",
                    "creationTimestamp",
                    "deletionTimestamp",
                    "deletionGracePeriodSeconds",
                ] {
                    match o["metadata"].get(k) {
                        Some(x) => v["metadata"][k] = x.clone(),
                        None => {
                            if let Some(m) = v["metadata"].as_object_mut() {
                                m.remove(k);
                            }
                        }
                    }
                }
                let generation = o
                    .ptr("/metadata/generation")
                    .and_then(Value::as_i64)
                    .unwrap_or(1);
                let changed = !same_spec(o, v);
                v["metadata"]["generation"] =
                    json!(if changed { generation + 1 } else { generation });
                if o.ptr("/metadata/deletionTimestamp").is_some() {
                    let before = finalizers(o);
                    if let Some(new) = finalizers(v).iter().find(|f| !before.contains(f)) {
                        return Err(ApiError::invalid(
                            &rt.kind,
                            name,
                            vec![(
                                "metadata.finalizers".into(),
                                "FieldValueForbidden".into(),
                                format!(
                                    "metadata.finalizers: Forbidden: no new finalizers can be added if the object is being deleted, found new finalizers [\"{new}\"]"
                                ),
                            )],
                        ));
                    }
                }
            }
            None => {
                if let Some(m) = v["metadata"].as_object_mut() {
                    for k in [
                        "resourceVersion",
                        "deletionTimestamp",
                        "deletionGracePeriodSeconds",
                        "managedFields",
                    ] {
                        m.remove(k);
                    }
                }
                v["metadata"]["uid"] = json!(new_uid());
                v["metadata"]["creationTimestamp"] = json!(now_rfc3339());
                v["metadata"]["generation"] = json!(1);
                if rt.status_subresource
                    && rt.crd.is_some()
                    && let Some(m) = v.as_object_mut()
                {
                    m.remove("status");
                }
            }
        }
        if let Some(schema) = &rt.schema {
            let before = strict.then(|| v.clone());
            schema::prepare(schema, v).map_err(|errs| {
                ApiError::invalid(
                    &format!("{}.{}", rt.kind, rt.group),
                    name,
                    errs.into_iter()
                        .map(|e| (e.field, e.reason.to_string(), e.message))
                        .collect(),
                )
            })?;
            if let Some(before) = before {
                let mut unknown = vec![];
                removed_fields(&before, v, String::new(), &mut unknown);
                if !unknown.is_empty() {
                    return Err(ApiError::bad_request(format!(
                        "{} in version \"{}\" cannot be handled as a {}: strict decoding error: {}",
                        rt.kind,
                        rt.version,
                        rt.kind,
                        unknown
                            .iter()
                            .map(|f| format!("unknown field \"{f}\""))
                            .collect::<Vec<_>>()
                            .join(", ")
                    )));
                }
            }
        }
        super::kinds::on_write(self, rt, old, v)
    }

    /// Side effects of a committed write: CRDs start or stop being served,
    /// the garbage collector sees what it acts on.
    fn after_write(&self, rt: &ResourceType, out: Option<&Outcome>) {
        let Some((o, kind)) = out.and_then(|o| Some((o, o.kind?))) else {
            return;
        };
        let obj = &o.obj;
        if rt.namespaced {
            super::quota::refresh(&self.store, obj.namespace());
        }
        if rt.plural == "customresourcedefinitions" && rt.group == "apiextensions.k8s.io" {
            let mut reg = self.registry.write().unwrap_or_else(|e| e.into_inner());
            if kind == EventType::Deleted {
                reg.remove_crd(obj.name());
            } else {
                reg.register_crd(&obj.value());
            }
        }
        // Deletions, new dependents, claims and pods: gc's task acts on them.
        self.gc.offer(&rt.key(), obj, kind, o.prev.as_ref());
    }

    /// DELETE: immediate, or marked for deletion while finalizers (or a
    /// graceful pod shutdown) are pending.
    pub fn delete(
        &self,
        rt: &ResourceType,
        ns: &str,
        name: &str,
        opts: &DeleteOpts,
    ) -> Result<Arc<StoredObject>, ApiError> {
        let has_runtime = self.runtime().is_some();
        let mut dry = None;
        let out = self.store.mutate(&rt.key(), ns, name, |cur| {
            let Some(cur) = cur else {
                return Err(ApiError::not_found(&rt.qualified(), name));
            };
            if let Some(uid) = &opts.precondition_uid
                && uid != cur.uid()
            {
                return Err(ApiError::conflict(&rt.qualified(), name));
            }
            if let Some(rv) = &opts.precondition_rv
                && rv != str_at(&cur.value(), "/metadata/resourceVersion")
            {
                return Err(ApiError::conflict(&rt.qualified(), name));
            }
            let mut v = cur.value();
            let mut fins = finalizers(&v);
            let already = v.ptr("/metadata/deletionTimestamp").is_some();
            match opts.propagation.as_deref() {
                Some("Foreground") if !already => fins.push("foregroundDeletion".into()),
                Some("Orphan") if !already => fins.push("orphan".into()),
                _ => {}
            }
            if rt.plural == "namespaces" && rt.group.is_empty() && !already {
                fins.push("kubernetes".into());
                v["status"] = json!({"phase": "Terminating"});
            }
            let grace = opts.grace_period.unwrap_or_else(|| {
                v.ptr("/spec/terminationGracePeriodSeconds")
                    .and_then(Value::as_i64)
                    .unwrap_or(30)
            });
            let graceful_pod = rt.plural == "pods"
                && rt.group.is_empty()
                && has_runtime
                && grace > 0
                && !str_at(&v, "/spec/nodeName").is_empty()
                && v.ptr("/status/phase")
                    .and_then(Value::as_str)
                    .is_none_or(|p| p != "Succeeded" && p != "Failed");
            if fins.is_empty() && !graceful_pod {
                if opts.dry_run {
                    dry = Some(v);
                    return Ok(Change::Keep);
                }
                return Ok(Change::Delete);
            }
            if graceful_pod && !already {
                v["metadata"]["deletionGracePeriodSeconds"] = json!(grace);
            } else if !already {
                v["metadata"]["deletionGracePeriodSeconds"] = json!(0);
            }
            if !already {
                v["metadata"]["deletionTimestamp"] = json!(now_rfc3339());
            }
            v["metadata"]["finalizers"] = json!(dedup(fins));
            if opts.dry_run {
                dry = Some(v);
                return Ok(Change::Keep);
            }
            Ok(Change::Put(v))
        })?;
        self.after_write(rt, out.as_ref());
        dry.map(|v| StoredObject::new(&v))
            .or(out.map(|o| o.obj))
            .ok_or_else(|| ApiError::not_found(&rt.qualified(), name))
    }

    /// Removes a finalizer (used by the garbage collector and runtimes).
    pub fn remove_finalizer(&self, rt: &ResourceType, ns: &str, name: &str, finalizer: &str) {
        let opts = WriteOpts {
            field_manager: "kube-controller-manager".into(),
            ..Default::default()
        };
        let _ = self.write(rt, ns, name, Sub::Main, &opts, false, |cur| {
            let mut v = cur.cloned().unwrap_or_default();
            let fins: Vec<String> = finalizers(&v)
                .into_iter()
                .filter(|f| f != finalizer)
                .collect();
            v["metadata"]["finalizers"] = json!(fins);
            Ok(v)
        });
    }
}

/// Pod Security admission of a new Pod (kube answers 403 Forbidden).
fn admit_pod(level: Option<PsaLevel>, name: &str, pod: &Value) -> Result<(), ApiError> {
    let Some(level) = level else {
        return Ok(());
    };
    super::pod_security::admit(level, name, pod).map_err(|msg| {
        ApiError::new(403, "Forbidden", msg).with_details(json!({"name": name, "kind": "pods"}))
    })
}
