//! What a PostgresCluster becomes: the child objects, built as k8s-openapi
//! structs and serialized only where server-side apply sends them. Pure.
//! The instance Pod is in [`super::instance_pod`]. Every content hash
//! stamped here is computed over canonical JSON (sorted keys), so it is the
//! one the JSON builders before them stamped (`golden_tests`).

use super::error::Error;
use crate::crd::{PostgresCluster, Role};
use crate::platform::hash::content_hash_of;
use crate::platform::objects;
use crate::postgres;
use k8s_openapi::api::core::v1::{
    ConfigMap, PersistentVolumeClaim, PersistentVolumeClaimSpec, Secret, Service, ServicePort,
    ServiceSpec, VolumeResourceRequirements,
};
use k8s_openapi::api::policy::v1::{PodDisruptionBudget, PodDisruptionBudgetSpec};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Resource;
use serde::Serialize;
use serde_json::json;
use std::collections::BTreeMap;

pub use super::instance_pod::{PGDATA, container_security_context, pod, pod_security_context};
pub use crate::platform::hash::content_hash;
pub use crate::platform::labels::{
    ANN_CONFIG, ANN_HASH, ANN_PARAMETERS, ANN_VERSION, LABEL_CLUSTER, LABEL_INSTANCE, LABEL_KIND,
    LABEL_MANAGED_BY, LABEL_ROLE, LABEL_SHARD,
};

/// Identity of the owning PostgresCluster, as children need it.
#[derive(Debug, Clone)]
pub struct Owner {
    pub name: String,
    pub namespace: String,
    pub uid: String,
    pub shard: u32,
}

/// The namespace and name of a PostgresCluster; an object without them
/// (never one the API server returns) is an error, not an empty string.
pub fn identity(pg: &impl kube::Resource) -> Result<(String, String), Error> {
    let name = required(pg.meta().name.as_ref(), "?", "metadata.name")?;
    let ns = required(pg.meta().namespace.as_ref(), name, "metadata.namespace")?;
    Ok((ns.clone(), name.clone()))
}

fn required<'a>(
    v: Option<&'a String>,
    name: &str,
    field: &'static str,
) -> Result<&'a String, Error> {
    v.filter(|v| !v.is_empty()).ok_or_else(|| Error::Missing {
        kind: "PostgresCluster",
        name: name.to_string(),
        field,
    })
}

/// `metadata.name` of a child built here; every builder sets it, so its
/// absence is a bug reported as such, not an object named "".
pub fn child_name<K: Resource>(obj: &K) -> Result<String, Error> {
    obj.meta()
        .name
        .clone()
        .filter(|n| !n.is_empty())
        .ok_or_else(|| Error::Missing {
            kind: "child",
            name: "?".into(),
            field: "metadata.name",
        })
}

/// The content hash annotation of a child built here.
pub fn child_hash<K: Resource>(obj: &K) -> Result<String, Error> {
    hash_annotation(obj)
        .map(str::to_string)
        .ok_or_else(|| Error::Missing {
            kind: "child",
            name: obj.meta().name.clone().unwrap_or_else(|| "?".into()),
            field: "metadata.annotations[pgfleet.io/hash]",
        })
}

impl Owner {
    /// The owner of `pg`'s children. Its uid goes into every owner
    /// reference: without one the children could not be garbage-collected
    /// with the cluster, so a missing uid is an error.
    pub fn of(pg: &PostgresCluster, shard: u32) -> Result<Self, Error> {
        let (namespace, name) = identity(pg)?;
        let uid = required(pg.metadata.uid.as_ref(), &name, "metadata.uid")?.clone();
        Ok(Owner {
            name,
            namespace,
            uid,
            shard,
        })
    }

    /// The controller reference every owned child carries.
    pub fn reference(&self) -> Vec<OwnerReference> {
        vec![OwnerReference {
            api_version: "pgfleet.io/v1".into(),
            kind: "PostgresCluster".into(),
            name: self.name.clone(),
            uid: self.uid.clone(),
            controller: Some(true),
            block_owner_deletion: Some(true),
        }]
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_CLUSTER.to_string(), self.name.clone()),
            (LABEL_SHARD.to_string(), self.shard.to_string()),
            (LABEL_MANAGED_BY.to_string(), "pgfleet".to_string()),
        ])
    }

    /// The metadata of a child: the cluster's labels plus `extra_labels`,
    /// and the owner reference when `owned`.
    pub fn meta(&self, name: &str, extra_labels: &[(&str, &str)], owned: bool) -> ObjectMeta {
        let mut labels = self.labels();
        for (k, v) in extra_labels {
            labels.insert((*k).to_string(), (*v).to_string());
        }
        let mut m = objects::meta(name, &self.namespace, labels);
        if owned {
            m.owner_references = Some(self.reference());
        }
        m
    }

    pub fn instance_name(&self, ordinal: u32) -> String {
        format!("{}-{ordinal}", self.name)
    }

    pub fn config_name(&self) -> String {
        format!("{}-config", self.name)
    }

    pub fn secret_name(&self, which: &str) -> String {
        format!("{}-{which}", self.name)
    }
}

/// Stamps the hash annotation computed over everything else.
fn with_hash<K: Resource + Serialize>(mut obj: K) -> K {
    let h = content_hash_of(&obj);
    objects::annotate(obj.meta_mut(), ANN_HASH, h);
    obj
}

/// The content hash a child carries (set by every builder here).
pub fn hash_annotation<K: Resource>(obj: &K) -> Option<&str> {
    obj.meta()
        .annotations
        .as_ref()
        .and_then(|a| a.get(ANN_HASH))
        .map(String::as_str)
}

pub fn image(pg: &PostgresCluster) -> String {
    pg.spec
        .image
        .clone()
        .unwrap_or_else(|| format!("postgres:{}", pg.spec.version))
}

fn string_map(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
        .collect()
}

/// A Secret with generated credentials; created once, never rotated silently.
pub fn secret(o: &Owner, which: &str, username: &str, password: &str) -> Secret {
    Secret {
        metadata: o.meta(&o.secret_name(which), &[], true),
        type_: Some("kubernetes.io/basic-auth".into()),
        string_data: Some(string_map(&[
            ("username", username),
            ("password", password),
        ])),
        ..Secret::default()
    }
}

/// The pgBackRest TLS pair of the cluster (backup::tls).
pub fn tls_secret(o: &Owner, name: &str, ca: &str, cert: &str, key: &str) -> Secret {
    Secret {
        metadata: o.meta(name, &[], true),
        type_: Some("kubernetes.io/tls".into()),
        string_data: Some(string_map(&[
            ("ca.crt", ca),
            ("tls.crt", cert),
            ("tls.key", key),
        ])),
        ..Secret::default()
    }
}

/// The configuration of every instance. Its hash is also written into
/// postgresql.conf, so `pgfleet-instance reload <hash>` can wait until the
/// kubelet has refreshed the mounted ConfigMap (which lags on real clusters).
pub fn config_map(
    o: &Owner,
    params: &BTreeMap<String, String>,
    (plain, pg_hba): (&[String], &[String]),
    backrest: Option<&str>,
    dr_files: &BTreeMap<String, String>,
) -> ConfigMap {
    let mut hashed = json!({"params": params, "hba": pg_hba, "backrest": backrest});
    if !plain.is_empty() {
        hashed["plain"] = json!(plain);
    }
    if !dr_files.is_empty() {
        hashed["dr"] = json!(dr_files);
    }
    let h = config_hash(&hashed);
    let conf = format!(
        "{}# pgfleet-config-hash: {h}\n",
        postgres::render_postgresql_conf(params)
    );
    let mut metadata = o.meta(&o.config_name(), &[], true);
    // A map of strings always serializes; the annotation is informational.
    let rendered = serde_json::to_string(params).unwrap_or_default();
    metadata.annotations = Some(string_map(&[(ANN_HASH, &h), (ANN_PARAMETERS, &rendered)]));
    let mut data = string_map(&[
        ("postgresql.conf", &conf),
        ("pg_hba.conf", &postgres::render_pg_hba(plain, pg_hba)),
        ("pgfleet-instance", postgres::INSTANCE_SCRIPT),
    ]);
    if let Some(b) = backrest {
        data.insert("pgbackrest.conf".into(), b.into());
    }
    // A topology side's files (controller::dr): a replica cluster's source
    // (whose absence is what lets its designated primary be promoted), the
    // primary side's watchdog window.
    data.extend(dr_files.clone());
    ConfigMap {
        metadata,
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// The configuration's hash: [`content_hash`] of `hashed` with the
/// instance script under `"script"` — without turning the 66 KB script
/// into JSON and hashing it at every round of every cluster (that was
/// ~8 % of the manager's CPU in a cold start). `"script"` sorts after
/// every other key, so the canonical JSON is `hashed`'s without its
/// closing brace, then a constant tail; FNV-1a's state after the head
/// decides the result, so results are kept by that state (a few
/// configurations recur across a fleet and every round of one cluster).
fn config_hash(hashed: &serde_json::Value) -> String {
    use crate::platform::hash::{FNV64_BASIS, fnv1a64_on};
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static TAIL: OnceLock<Vec<u8>> = OnceLock::new();
    static DONE: OnceLock<Mutex<HashMap<u64, u64>>> = OnceLock::new();
    let mut head = serde_json::to_vec(hashed).unwrap_or_default();
    head.pop();
    let state = fnv1a64_on(FNV64_BASIS, &head);
    let done = DONE.get_or_init(Default::default);
    let known = done
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .get(&state)
        .copied();
    let h = known.unwrap_or_else(|| {
        let tail = TAIL.get_or_init(|| {
            let script = serde_json::to_string(postgres::INSTANCE_SCRIPT).unwrap_or_default();
            format!(",\"script\":{script}}}").into_bytes()
        });
        let h = fnv1a64_on(state, tail);
        let mut done = done.lock().unwrap_or_else(|e| e.into_inner());
        if done.len() >= 4096 {
            done.clear();
        }
        done.insert(state, h);
        h
    });
    format!("{h:016x}")
}

pub fn pvc(o: &Owner, pg: &PostgresCluster, ordinal: u32) -> PersistentVolumeClaim {
    let name = o.instance_name(ordinal);
    let storage = BTreeMap::from([(
        "storage".to_string(),
        Quantity(pg.spec.storage.size.clone()),
    )]);
    // No owner reference: whether data outlives the cluster is the
    // reclaim policy's decision, taken by the finalizer, not the GC's.
    with_hash(PersistentVolumeClaim {
        metadata: o.meta(&name, &[(LABEL_INSTANCE, &name)], false),
        spec: Some(PersistentVolumeClaimSpec {
            access_modes: Some(vec!["ReadWriteOnce".into()]),
            resources: Some(VolumeResourceRequirements {
                requests: Some(storage),
                ..VolumeResourceRequirements::default()
            }),
            storage_class_name: pg.spec.storage.storage_class.clone(),
            ..PersistentVolumeClaimSpec::default()
        }),
        ..PersistentVolumeClaim::default()
    })
}

/// `-rw` (primary), `-ro` (replicas) and `-r` (any instance); in a
/// disaster-recovery topology also `-dr`, the primary (or designated
/// primary) as a LoadBalancer: what the other member clusters stream from.
pub fn services(o: &Owner, exposed: bool) -> Vec<Service> {
    let dr = exposed.then_some(("dr", Some(Role::Primary)));
    [
        ("rw", Some(Role::Primary)),
        ("ro", Some(Role::Replica)),
        ("r", None),
    ]
    .into_iter()
    .chain(dr)
    .map(|(suffix, role)| {
        let mut selector = string_map(&[(LABEL_CLUSTER, &o.name), (LABEL_KIND, "instance")]);
        if let Some(r) = role {
            selector.insert(LABEL_ROLE.into(), r.as_str().into());
        }
        with_hash(Service {
            metadata: o.meta(&format!("{}-{suffix}", o.name), &[], true),
            spec: Some(ServiceSpec {
                type_: Some(
                    if suffix == "dr" {
                        "LoadBalancer"
                    } else {
                        "ClusterIP"
                    }
                    .into(),
                ),
                selector: Some(selector),
                ports: Some(ports(suffix)),
                ..ServiceSpec::default()
            }),
            ..Service::default()
        })
    })
    .collect()
}

/// A TCP Service port forwarding to the same container port.
pub fn service_port(name: &str, port: i32) -> ServicePort {
    ServicePort {
        name: Some(name.into()),
        port,
        target_port: Some(IntOrString::Int(port)),
        protocol: Some("TCP".into()),
        ..ServicePort::default()
    }
}

/// PostgreSQL on every Service; `-rw` also carries pgBackRest's TLS server,
/// which a standby's backup drives the primary through (backup::tls).
fn ports(suffix: &str) -> Vec<ServicePort> {
    let mut ports = vec![service_port("postgresql", 5432)];
    if suffix == "rw" {
        ports.push(service_port(
            "pgbackrest",
            i32::from(crate::pgbackrest::tls::PORT),
        ));
    }
    ports
}

/// The name of the budget that guards the primary. A dot cannot occur in
/// a PostgresCluster name (a DNS-1035 label), so no other cluster's budget
/// can be called this.
pub fn primary_pdb_name(cluster: &str) -> String {
    format!("{cluster}.primary")
}

/// The two disruption budgets of a cluster, disjoint as the eviction API
/// requires (a pod under two budgets cannot be evicted at all), the way
/// CloudNativePG splits them:
/// - `<name>`: the replicas, at most one voluntarily disrupted at a time;
/// - `<name>.primary`: the primary, never evicted while it is healthy
///   (`minAvailable: 1`). A `kubectl drain` of its node then retries,
///   and the controller, seeing the node cordoned, switches over to a
///   replica elsewhere (`controller::drain`); the old primary is then a
///   replica the first budget lets go.
///
/// A single instance gets neither (as with CloudNativePG): there is
/// nothing to switch over to, so a budget could only block a drain forever
/// or, allowing the eviction, guard nothing; a scale-down to one instance
/// deletes them (`pipeline::apply`). That also spares a new single-instance
/// cluster two writes.
///
/// Pooler pods are under neither: stateless, a drain may move them.
pub fn pdbs(o: &Owner, instances: i32) -> Vec<PodDisruptionBudget> {
    if instances <= 1 {
        return vec![];
    }
    let budget = |name: String, role: &str, spec: PodDisruptionBudgetSpec| {
        with_hash(PodDisruptionBudget {
            metadata: o.meta(&name, &[], true),
            spec: Some(PodDisruptionBudgetSpec {
                selector: Some(LabelSelector {
                    match_labels: Some(string_map(&[
                        (LABEL_CLUSTER, &o.name),
                        (LABEL_KIND, "instance"),
                        (LABEL_ROLE, role),
                    ])),
                    ..LabelSelector::default()
                }),
                ..spec
            }),
            ..PodDisruptionBudget::default()
        })
    };
    vec![
        budget(
            o.name.clone(),
            Role::Replica.as_str(),
            PodDisruptionBudgetSpec {
                max_unavailable: Some(IntOrString::Int(1)),
                ..PodDisruptionBudgetSpec::default()
            },
        ),
        budget(
            primary_pdb_name(&o.name),
            Role::Primary.as_str(),
            PodDisruptionBudgetSpec {
                min_available: Some(IntOrString::Int(1)),
                ..PodDisruptionBudgetSpec::default()
            },
        ),
    ]
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn pg() -> PostgresCluster {
        let mut pg = PostgresCluster::new(
            "orders",
            serde_json::from_value(json!({"clusterSize": 3, "version": "15.20"})).unwrap(),
        );
        pg.metadata.namespace = Some("shop".into());
        pg.metadata.uid = Some("u-1".into());
        pg
    }

    #[test]
    fn pod_runs_the_instance_script_on_the_stock_image() {
        let pg = pg();
        let o = Owner::of(&pg, 2).unwrap();
        let p = serde_json::to_value(pod(&o, &pg, 2, Role::Replica, "clone", &[])).unwrap();
        assert_eq!(p["metadata"]["name"], "orders-2");
        assert_eq!(p["spec"]["containers"][0]["image"], "postgres:15.20");
        assert_eq!(p["spec"]["containers"][0]["command"][2], "run");
        assert_eq!(p["metadata"]["labels"][LABEL_ROLE], "replica");
        assert_eq!(p["metadata"]["labels"][LABEL_SHARD], "2");
        assert_eq!(
            p["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"],
            "orders-2"
        );
        assert_eq!(p["metadata"]["ownerReferences"][0]["uid"], "u-1");
        // Same spec, other role: same hash (relabelled in place, not recreated).
        let q = serde_json::to_value(pod(&o, &pg, 2, Role::Primary, "initdb", &[])).unwrap();
        assert_eq!(
            p["metadata"]["annotations"][ANN_HASH],
            q["metadata"]["annotations"][ANN_HASH]
        );
    }

    #[test]
    fn services_select_by_role_and_pvcs_are_not_owned() {
        let pg = pg();
        let o = Owner::of(&pg, 0).unwrap();
        let s = serde_json::to_value(services(&o, false)).unwrap();
        assert_eq!(s[0]["metadata"]["name"], "orders-rw");
        assert_eq!(s[0]["spec"]["selector"][LABEL_ROLE], "primary");
        assert_eq!(s[1]["spec"]["selector"][LABEL_ROLE], "replica");
        assert!(s[2]["spec"]["selector"].get(LABEL_ROLE).is_none());
        assert!(pvc(&o, &pg, 1).metadata.owner_references.is_none());
    }

    /// The hash every running cluster's configuration carries must not
    /// move: it is the content hash of the whole document, script included,
    /// with or without the optional parts, however often it is asked.
    #[test]
    fn the_config_hash_is_the_content_hash_of_the_whole_document() {
        let params = BTreeMap::from([("max_connections".to_string(), "100".to_string())]);
        let hba = vec!["host all all 10.0.0.0/8 scram-sha-256".to_string()];
        let plain = ["host all upgrade 10.0.0.0/8 md5".to_string()];
        let dr = BTreeMap::from([("standby.signal".to_string(), String::new())]);
        for (plain, dr, backrest) in [
            (&[][..], BTreeMap::new(), None),
            (&plain[..], dr.clone(), Some("[global]\nrepo1-path=/r\n")),
        ] {
            let mut whole = json!({"params": params, "hba": hba,
                "script": postgres::INSTANCE_SCRIPT, "backrest": backrest});
            let mut rest = json!({"params": params, "hba": hba, "backrest": backrest});
            if !plain.is_empty() {
                whole["plain"] = json!(plain);
                rest["plain"] = json!(plain);
            }
            if !dr.is_empty() {
                whole["dr"] = json!(dr);
                rest["dr"] = json!(dr);
            }
            for _ in 0..2 {
                assert_eq!(config_hash(&rest), content_hash(&whole));
            }
        }
    }
}
