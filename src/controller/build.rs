//! What a PostgresCluster becomes: the child objects, built as JSON for
//! server-side apply. Pure. The Pod spec is a real one: it runs on a real
//! cluster with the stock `postgres:<version>` image, because its command is
//! the `pgfleet-instance run` verb from the ConfigMap, not the image's
//! entrypoint.

use super::error::Error;
use crate::crd::{PostgresCluster, Role};
use crate::postgres;
use serde_json::{Value, json};
use std::collections::BTreeMap;

pub use crate::platform::hash::content_hash;
pub use crate::platform::labels::{
    ANN_CONFIG, ANN_HASH, ANN_PARAMETERS, ANN_VERSION, LABEL_CLUSTER, LABEL_INSTANCE, LABEL_KIND,
    LABEL_MANAGED_BY, LABEL_ROLE, LABEL_SHARD,
};

const DATA_MOUNT: &str = "/var/lib/postgresql/data";
/// PGDATA inside every instance pod.
pub const PGDATA: &str = "/var/lib/postgresql/data/pgdata";
const CONFIG_MOUNT: &str = "/etc/pgfleet/config";

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
pub fn identity(pg: &PostgresCluster) -> Result<(String, String), Error> {
    let name = required(pg.metadata.name.as_ref(), "?", "metadata.name")?;
    let ns = required(pg.metadata.namespace.as_ref(), name, "metadata.namespace")?;
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
pub fn child_name(obj: &Value) -> Result<String, Error> {
    child_field(obj, "name", "metadata.name")
}

/// The content hash annotation of a child built here.
pub fn child_hash(obj: &Value) -> Result<String, Error> {
    obj["metadata"]["annotations"][ANN_HASH]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| missing_in(obj, "metadata.annotations[pgfleet.io/hash]"))
}

fn child_field(obj: &Value, key: &str, field: &'static str) -> Result<String, Error> {
    obj["metadata"][key]
        .as_str()
        .filter(|v| !v.is_empty())
        .map(str::to_string)
        .ok_or_else(|| missing_in(obj, field))
}

fn missing_in(obj: &Value, field: &'static str) -> Error {
    Error::Missing {
        kind: "child",
        name: obj["metadata"]["name"].as_str().unwrap_or("?").to_string(),
        field,
    }
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

    fn reference(&self) -> Value {
        json!([{"apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster", "name": self.name,
                "uid": self.uid, "controller": true, "blockOwnerDeletion": true}])
    }

    pub fn labels(&self) -> BTreeMap<String, String> {
        BTreeMap::from([
            (LABEL_CLUSTER.to_string(), self.name.clone()),
            (LABEL_SHARD.to_string(), self.shard.to_string()),
            (LABEL_MANAGED_BY.to_string(), "pgfleet".to_string()),
        ])
    }

    fn meta(&self, name: &str, extra_labels: &[(&str, &str)], owned: bool) -> Value {
        let mut labels = self.labels();
        for (k, v) in extra_labels {
            labels.insert((*k).to_string(), (*v).to_string());
        }
        let mut m = json!({"name": name, "namespace": self.namespace, "labels": labels});
        if owned {
            m["ownerReferences"] = self.reference();
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
fn with_hash(mut obj: Value) -> Value {
    let h = content_hash(&obj);
    obj["metadata"]["annotations"][ANN_HASH] = json!(h);
    obj
}

pub fn image(pg: &PostgresCluster) -> String {
    pg.spec
        .image
        .clone()
        .unwrap_or_else(|| format!("postgres:{}", pg.spec.version))
}

/// A Secret with generated credentials; created once, never rotated silently.
pub fn secret(o: &Owner, which: &str, username: &str, password: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": o.meta(&o.secret_name(which), &[], true),
        "type": "kubernetes.io/basic-auth",
        "stringData": {"username": username, "password": password},
    })
}

/// The pgBackRest TLS pair of the cluster (backup::tls).
pub fn tls_secret(o: &Owner, name: &str, ca: &str, cert: &str, key: &str) -> Value {
    json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": o.meta(name, &[], true),
        "type": "kubernetes.io/tls",
        "stringData": {"ca.crt": ca, "tls.crt": cert, "tls.key": key},
    })
}

/// The configuration of every instance. Its hash is also written into
/// postgresql.conf, so `pgfleet-instance reload <hash>` can wait until the
/// kubelet has refreshed the mounted ConfigMap (which lags on real clusters).
pub fn config_map(
    o: &Owner,
    params: &BTreeMap<String, String>,
    pg_hba: &[String],
    backrest: Option<&str>,
) -> Value {
    let h = content_hash(
        &json!({"params": params, "hba": pg_hba, "script": postgres::INSTANCE_SCRIPT, "backrest": backrest}),
    );
    let conf = format!(
        "{}# pgfleet-config-hash: {h}\n",
        postgres::render_postgresql_conf(params)
    );
    let mut cm = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {
            "name": o.config_name(), "namespace": o.namespace, "labels": o.labels(),
            "ownerReferences": o.reference(),
            "annotations": {ANN_HASH: h, ANN_PARAMETERS: serde_json::to_string(params).unwrap_or_default()},
        },
        "data": {
            "postgresql.conf": conf,
            "pg_hba.conf": postgres::render_pg_hba(pg_hba),
            "pgfleet-instance": postgres::INSTANCE_SCRIPT,
        },
    });
    if let Some(b) = backrest {
        cm["data"]["pgbackrest.conf"] = json!(b);
    }
    cm
}

pub fn pvc(o: &Owner, pg: &PostgresCluster, ordinal: u32) -> Value {
    let mut spec = json!({
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": pg.spec.storage.size}},
    });
    if let Some(sc) = &pg.spec.storage.storage_class {
        spec["storageClassName"] = json!(sc);
    }
    let name = o.instance_name(ordinal);
    // No owner reference: whether data outlives the cluster is the
    // reclaim policy's decision, taken by the finalizer, not the GC's.
    with_hash(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": o.meta(&name, &[(LABEL_INSTANCE, &name)], false),
        "spec": spec,
    }))
}

/// The Pod-level security context of every Pod pgfleet creates: uid/gid
/// 999 (the `postgres` user of deploy/images/postgres and the user of
/// deploy/images/pgbouncer), never root, the runtime's default seccomp
/// profile. Together with [`container_security_context`] this passes Pod
/// Security "restricted", so a platform team can enforce that level on
/// tenant namespaces. `fs_group` gives mounted volumes (the data PVC) to
/// that group.
pub fn pod_security_context(fs_group: bool) -> Value {
    let mut sc = json!({"runAsUser": 999, "runAsGroup": 999, "runAsNonRoot": true,
                        "seccompProfile": {"type": "RuntimeDefault"}});
    if fs_group {
        sc["fsGroup"] = json!(999);
    }
    sc
}

/// The container-level half of Pod Security "restricted": no privilege
/// escalation (setuid binaries) and no Linux capabilities at all; PostgreSQL
/// and PgBouncer need none (they listen on ports above 1024).
pub fn container_security_context() -> Value {
    json!({"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}})
}

/// The instance Pod. `role` goes into a label the instance reads through the
/// downward API, so it knows whether it may run as primary.
/// `extra_env` carries what only the caller knows: repository credentials
/// (by Secret reference) and where to restore from.
pub fn pod(
    o: &Owner,
    pg: &PostgresCluster,
    ordinal: u32,
    role: Role,
    init: &str,
    extra_env: &[Value],
) -> Value {
    let name = o.instance_name(ordinal);
    let env = |n: &str, v: &str| json!({"name": n, "value": v});
    let field =
        |n: &str, path: &str| json!({"name": n, "valueFrom": {"fieldRef": {"fieldPath": path}}});
    let script = format!("{CONFIG_MOUNT}/pgfleet-instance");
    // Not ready while a restore's temporary server runs (it stops again).
    let ready = "test ! -e /tmp/pgfleet.initializing && pg_isready -q -h /tmp -p 5432";
    // A restore or clone copies data for as long as it takes, with no server
    // up: the instance is alive while it says it is initializing.
    let alive = "pg_isready -q -h /tmp -p 5432 || test -e /tmp/pgfleet.initializing";
    let resources = resources(pg);
    let mut obj = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": o.meta(&name, &[(LABEL_INSTANCE, &name), (LABEL_KIND, "instance")], true),
        "spec": {
            "hostname": name,
            "securityContext": pod_security_context(true),
            "automountServiceAccountToken": false,
            "terminationGracePeriodSeconds": 30,
            "enableServiceLinks": false,
            "containers": [{
                "name": "postgres",
                "image": image(pg),
                "securityContext": container_security_context(),
                "command": ["/bin/sh", script, "run"],
                "env": [
                    env("PGDATA", PGDATA),
                    field("POD_NAME", "metadata.name"),
                    field("POD_NAMESPACE", "metadata.namespace"),
                    field("POD_IP", "status.podIP"),
                    env("PGFLEET_CLUSTER", &o.name),
                    env("PGFLEET_INIT", init),
                    env("PGFLEET_PRIMARY_HOST", &format!("{}-rw", o.name)),
                    env("PGFLEET_PODINFO", "/etc/pgfleet/podinfo"),
                    env("PGFLEET_CONFIG", CONFIG_MOUNT),
                    env("PGFLEET_SECRETS", "/etc/pgfleet/secrets"),
                ],
                "ports": [{"name": "postgresql", "containerPort": 5432, "protocol": "TCP"}],
                "readinessProbe": probe(ready, 2, 3),
                "livenessProbe": probe(alive, 10, 6),
                "resources": resources,
                "volumeMounts": [
                    {"name": "pgdata", "mountPath": DATA_MOUNT},
                    {"name": "config", "mountPath": CONFIG_MOUNT},
                    {"name": "podinfo", "mountPath": "/etc/pgfleet/podinfo"},
                    {"name": "secrets", "mountPath": "/etc/pgfleet/secrets"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }],
            "volumes": [
                {"name": "pgdata", "persistentVolumeClaim": {"claimName": name}},
                {"name": "config", "configMap": {"name": o.config_name(), "defaultMode": 0o755}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "podinfo", "downwardAPI": {"items": [{"path": "labels", "fieldRef": {"fieldPath": "metadata.labels"}}]}},
                {"name": "secrets", "projected": {"sources": [
                    {"secret": {"name": o.secret_name("superuser"), "items": [{"key": "password", "path": "superuser-password"}]}},
                    {"secret": {"name": o.secret_name("replication"), "items": [{"key": "password", "path": "replication-password"}]}},
                ]}},
            ],
        },
    });
    if let Some(env) = obj["spec"]["containers"][0]["env"].as_array_mut() {
        env.extend(extra_env.iter().cloned());
    }
    super::placement::instance(&mut obj, o, pg);
    let h = template_hash(&obj, pg);
    obj["metadata"]["labels"][LABEL_ROLE] = json!(role);
    obj["metadata"]["annotations"] = json!({ANN_HASH: h, ANN_VERSION: pg.spec.version});
    obj
}

/// An exec probe through the shell.
fn probe(cmd: &str, period: i64, failures: i64) -> Value {
    json!({"exec": {"command": ["/bin/sh", "-c", cmd]},
           "periodSeconds": period, "failureThreshold": failures, "timeoutSeconds": 5})
}

/// Requests and limits alike, from `spec.resources`.
fn resources(pg: &PostgresCluster) -> Value {
    let Some(r) = &pg.spec.resources else {
        return json!({});
    };
    let mut req = serde_json::Map::new();
    if let Some(c) = &r.cpu {
        req.insert("cpu".into(), json!(c));
    }
    if let Some(m) = &r.memory {
        req.insert("memory".into(), json!(m));
    }
    json!({"requests": req.clone(), "limits": req})
}

/// The pod template hash. It leaves out the role label (relabelled in
/// place on failover) and the init mode (only meaningful for an empty
/// volume). Parameters that only take effect at a restart are part of it
/// too: a change to them makes every instance outdated, so the rolling
/// update restarts them (left out when there are none, so the hash of
/// existing pods does not change).
fn template_hash(pod: &Value, pg: &PostgresCluster) -> String {
    let container = &pod["spec"]["containers"][0];
    let mut basis = json!({"spec": container["image"], "res": container["resources"]});
    let restart: BTreeMap<&String, &String> = pg
        .spec
        .postgresql
        .parameters
        .iter()
        .filter(|(k, _)| crate::postgres::needs_restart(k))
        .collect();
    if !restart.is_empty() {
        basis["restart"] = json!(restart);
    }
    // Stated placement only: see controller/placement.rs (upgrade rule).
    if let Some(p) = super::placement::hash_basis(pg) {
        basis["placement"] = p;
    }
    content_hash(&basis)
}

/// `-rw` (primary), `-ro` (replicas) and `-r` (any instance).
pub fn services(o: &Owner) -> Vec<Value> {
    [
        ("rw", Some(Role::Primary)),
        ("ro", Some(Role::Replica)),
        ("r", None),
    ]
    .into_iter()
    .map(|(suffix, role)| {
        let mut selector = json!({LABEL_CLUSTER: o.name, LABEL_KIND: "instance"});
        if let Some(r) = role {
            selector[LABEL_ROLE] = json!(r);
        }
        with_hash(json!({
            "apiVersion": "v1", "kind": "Service",
            "metadata": o.meta(&format!("{}-{suffix}", o.name), &[], true),
            "spec": {"type": "ClusterIP", "selector": selector,
                     "ports": ports(suffix)},
        }))
    })
    .collect()
}

/// PostgreSQL on every Service; `-rw` also carries pgBackRest's TLS server,
/// which a standby's backup drives the primary through (backup::tls).
fn ports(suffix: &str) -> Value {
    let mut ports =
        vec![json!({"name": "postgresql", "port": 5432, "targetPort": 5432, "protocol": "TCP"})];
    if suffix == "rw" {
        let p = crate::pgbackrest::tls::PORT;
        ports.push(json!({"name": "pgbackrest", "port": p, "targetPort": p, "protocol": "TCP"}));
    }
    json!(ports)
}

/// At most one instance voluntarily disrupted at a time.
pub fn pdb(o: &Owner) -> Value {
    with_hash(json!({
        "apiVersion": "policy/v1", "kind": "PodDisruptionBudget",
        "metadata": o.meta(&o.name, &[], true),
        "spec": {"maxUnavailable": 1, "selector": {"matchLabels": {LABEL_CLUSTER: o.name}}},
    }))
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
        let p = pod(&o, &pg, 2, Role::Replica, "clone", &[]);
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
        let q = pod(&o, &pg, 2, Role::Primary, "initdb", &[]);
        assert_eq!(
            p["metadata"]["annotations"][ANN_HASH],
            q["metadata"]["annotations"][ANN_HASH]
        );
    }

    #[test]
    fn services_select_by_role_and_pvcs_are_not_owned() {
        let pg = pg();
        let o = Owner::of(&pg, 0).unwrap();
        let s = services(&o);
        assert_eq!(s[0]["metadata"]["name"], "orders-rw");
        assert_eq!(s[0]["spec"]["selector"][LABEL_ROLE], "primary");
        assert_eq!(s[1]["spec"]["selector"][LABEL_ROLE], "replica");
        assert!(s[2]["spec"]["selector"].get(LABEL_ROLE).is_none());
        assert!(pvc(&o, &pg, 1)["metadata"].get("ownerReferences").is_none());
    }
}
