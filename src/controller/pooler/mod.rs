//! The PgBouncer pooler in front of the primary (`spec.pooler.enabled`):
//! Pods `<name>-pooler-<n>`, a ConfigMap and the `<name>-pooler` Service. It
//! is what makes a switchover invisible to clients: PAUSE holds new queries
//! while the primary changes, RESUME reconnects through `<name>-rw`.
//!
//! This file builds the objects (pure); `apply` creates, updates and removes
//! them, `pause` holds the poolers' clients during a switchover.

pub mod apply;
pub mod pause;

use super::build::{ANN_HASH, LABEL_KIND, Owner, content_hash};
use super::plan::Observed;
use crate::crd::PostgresCluster;
use serde_json::{Value, json};

use crate::platform::labels::LABEL_POOLER;
pub const PORT: u16 = 6432;
/// Pooler images need sh, pgbouncer and psql on PATH (psql for the admin
/// console through exec); `deploy/images/pgbouncer/Dockerfile` builds one.
pub const DEFAULT_IMAGE: &str = "pgfleet/pgbouncer:1.23";

/// The pooler pods a switchover pauses (those not being deleted).
pub fn live_pods(obs: &Observed) -> Vec<String> {
    obs.pooler_pods
        .values()
        .filter(|p| !p.deleting)
        .map(|p| p.name.clone())
        .collect()
}

/// The pooler objects a cluster should have per `spec.pooler`: none but
/// `count` 0 when it is disabled (existing pods are then removed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted {
    pub config_map: Option<Value>,
    pub service: Option<Value>,
    /// Pods `1..=count`, in order.
    pub pods: Vec<Value>,
    pub count: u32,
}

/// What `spec.pooler` asks for.
pub fn wanted(o: &Owner, pg: &PostgresCluster) -> Wanted {
    let Some(spec) = pg.spec.pooler.as_ref().filter(|p| p.enabled) else {
        return Wanted::default();
    };
    let count = spec.instances.max(1) as u32;
    Wanted {
        config_map: Some(config_map(o, pg)),
        service: Some(service(o)),
        pods: (1..=count)
            .map(|n| {
                let mut p = pod(o, n);
                super::placement::pooler(&mut p, o, pg);
                p
            })
            .collect(),
        count,
    }
}

pub fn pod_name(o: &Owner, n: u32) -> String {
    format!("{}-pooler-{n}", o.name)
}

fn config_name(o: &Owner) -> String {
    format!("{}-pooler", o.name)
}

/// The start script: PgBouncer listens on the pod's own address (so many
/// poolers share a port on one machine in the embedded runtime), and its
/// userlist is written from the superuser Secret at start, never stored
/// (a `"` in the password doubled, as PgBouncer's userlist quotes it).
const START: &str = r#"set -eu
mkdir -p /tmp/pgbouncer
sed "s/@POD_IP@/${POD_IP:-0.0.0.0}/" /etc/pgbouncer/pgbouncer.ini > /tmp/pgbouncer/pgbouncer.ini
umask 077
printf '"postgres" "%s"\n' "$(sed 's/"/""/g' /etc/pgbouncer/secrets/superuser-password)" > /tmp/pgbouncer/userlist.txt
exec pgbouncer /tmp/pgbouncer/pgbouncer.ini
"#;

/// The admin command run through exec for PAUSE / RESUME / SHOW.
pub fn admin_command(cmd: &str) -> Vec<String> {
    vec![
        "/bin/sh".into(),
        "-c".into(),
        format!(
            "PGPASSWORD=\"$(cat /etc/pgbouncer/secrets/superuser-password)\" psql -X -q -h /tmp -p {PORT} -U postgres -d pgbouncer -c '{cmd}'"
        ),
    ]
}

pub fn config_map(o: &Owner, pg: &PostgresCluster) -> Value {
    let mode = match pg.spec.pooler.as_ref().map(|p| p.pool_mode) {
        Some(crate::crd::cluster::PoolMode::Session) => "session",
        _ => "transaction",
    };
    let ini = format!(
        "[databases]\n* = host={name}-rw port=5432\n\n[pgbouncer]\nlisten_addr = @POD_IP@\nlisten_port = {PORT}\nunix_socket_dir = /tmp\n\
auth_type = scram-sha-256\nauth_file = /tmp/pgbouncer/userlist.txt\nadmin_users = postgres\npool_mode = {mode}\n\
max_client_conn = 1000\ndefault_pool_size = 20\nserver_reset_query = DISCARD ALL\nserver_check_delay = 1\n\
server_login_retry = 1\nquery_wait_timeout = 120\nignore_startup_parameters = extra_float_digits,options\n\
pidfile = /tmp/pgbouncer/pgbouncer.pid\n",
        name = o.name
    );
    let mut obj = json!({
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": config_name(o), "namespace": o.namespace, "labels": o.labels(),
                     "ownerReferences": owner_ref(o)},
        "data": {"pgbouncer.ini": ini, "start.sh": START},
    });
    let h = content_hash(&obj);
    obj["metadata"]["annotations"] = json!({ANN_HASH: h});
    obj
}

fn owner_ref(o: &Owner) -> Value {
    json!([{"apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster", "name": o.name,
            "uid": o.uid, "controller": true, "blockOwnerDeletion": true}])
}

pub fn pod(o: &Owner, n: u32) -> Value {
    let name = pod_name(o, n);
    let mut labels = o.labels();
    labels.insert(LABEL_POOLER.into(), o.name.clone());
    // Not an instance: the instance Services select `pgfleet.io/kind=instance`.
    labels.insert(LABEL_KIND.into(), "pooler".into());
    let mut obj = json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "namespace": o.namespace, "labels": labels, "ownerReferences": owner_ref(o)},
        "spec": {
            "securityContext": super::build::pod_security_context(false),
            // The pooler never talks to the Kubernetes API.
            "automountServiceAccountToken": false,
            "enableServiceLinks": false,
            "containers": [{
                "name": "pgbouncer",
                "image": DEFAULT_IMAGE,
                "securityContext": super::build::container_security_context(),
                "command": ["/bin/sh", "/etc/pgbouncer/start.sh"],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "ports": [{"name": "pgbouncer", "containerPort": PORT, "protocol": "TCP"}],
                "readinessProbe": {"tcpSocket": {"port": PORT}, "periodSeconds": 2},
                "volumeMounts": [
                    {"name": "config", "mountPath": "/etc/pgbouncer"},
                    {"name": "secrets", "mountPath": "/etc/pgbouncer/secrets"},
                    {"name": "tmp", "mountPath": "/tmp"},
                ],
            }],
            "volumes": [
                {"name": "config", "configMap": {"name": config_name(o)}},
                {"name": "tmp", "emptyDir": {}},
                {"name": "secrets", "secret": {"secretName": o.secret_name("superuser"),
                    "items": [{"key": "password", "path": "superuser-password"}]}},
            ],
        },
    });
    let h = content_hash(&obj["spec"]);
    obj["metadata"]["annotations"] = json!({ANN_HASH: h});
    obj
}

pub fn service(o: &Owner) -> Value {
    let mut obj = json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": format!("{}-pooler", o.name), "namespace": o.namespace, "labels": o.labels(),
                     "ownerReferences": owner_ref(o)},
        "spec": {"type": "ClusterIP", "selector": {LABEL_POOLER: o.name},
                 "ports": [{"name": "pgbouncer", "port": PORT, "targetPort": PORT, "protocol": "TCP"}]},
    });
    let h = content_hash(&obj);
    obj["metadata"]["annotations"] = json!({ANN_HASH: h});
    obj
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn pooler_points_at_rw_and_is_not_an_instance() {
        let mut pg = PostgresCluster::new(
            "orders",
            serde_json::from_value(json!({"pooler": {"enabled": true}})).unwrap(),
        );
        pg.metadata.namespace = Some("shop".into());
        pg.metadata.uid = Some("u-1".into());
        let o = Owner::of(&pg, 1).unwrap();
        let cm = config_map(&o, &pg);
        assert!(
            cm["data"]["pgbouncer.ini"]
                .as_str()
                .unwrap()
                .contains("host=orders-rw port=5432")
        );
        assert!(
            cm["data"]["pgbouncer.ini"]
                .as_str()
                .unwrap()
                .contains("pool_mode = transaction")
        );
        let p = pod(&o, 1);
        assert_eq!(p["metadata"]["name"], "orders-pooler-1");
        assert_eq!(p["metadata"]["labels"][LABEL_KIND], "pooler");
        assert_eq!(service(&o)["spec"]["selector"][LABEL_POOLER], "orders");
        assert!(admin_command("PAUSE")[2].contains("-c 'PAUSE'"));
    }
}
