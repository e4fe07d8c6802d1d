//! Shared by the S8 process-runtime tests (port-forward, cp, container
//! filesystems, metrics): a process-runtime sim at a private address index,
//! a plain PostgreSQL 15 Pod, kubectl bound to the sim and psql over TCP.
#![allow(dead_code)]

use crate::common::{self, TestSim};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::PostParams;
use pgfleet::sim::{RuntimeKind, SimOptions};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// A process-runtime sim whose used cluster has address index `index`
/// (pods in 127.(10+index).0.0/16), so concurrent tests never share
/// loopback addresses. Clusters before it only shift the index.
pub async fn process_sim(tag: &str, index: usize) -> (TestSim, kube::Client, PathBuf) {
    let opts = SimOptions {
        dir: common::temp_dir(tag),
        names: (0..=index).map(|i| format!("c{i}")).collect(),
        runtime: RuntimeKind::Process,
        persist: false,
        history: 10_000,
        admin: true,
        images: pgfleet::emulated::images::rules(),
        run_as: Some(pgfleet::emulated::RUN_AS.into()),
        nodes: Default::default(),
    };
    let sim = TestSim::start(opts).await;
    let kubeconfig = sim.sim.clusters[index].kubeconfig.clone();
    let client = common::client_from(&kubeconfig).await;
    (sim, client, kubeconfig)
}

/// A PostgreSQL 15 Pod (trust authentication from any address, as the
/// official image's entrypoint sets up with `POSTGRES_HOST_AUTH_METHOD=trust`;
/// initdb alone admits 127.0.0.1 only, and other Pods connect from their own
/// addresses), listening on its Pod IP, with its data in `volume` mounted at
/// /var/lib/postgresql/data.
pub fn postgres_pod(name: &str, app: &str, volume: Value) -> Value {
    let dir = "/var/lib/postgresql/data/pg";
    let script = format!(
        "[ -s {dir}/PG_VERSION ] || {{ initdb -D {dir} -U postgres --auth=trust >/dev/null && \
         echo 'host all all all trust' >> {dir}/pg_hba.conf; }}; \
         exec postgres -D {dir} -c listen_addresses=\"$POD_IP\" -c unix_socket_directories=/tmp"
    );
    json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "containers": [{
                "name": "postgres", "image": "postgres:15",
                "command": ["sh", "-c", script],
                "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}],
                "ports": [{"name": "postgres", "containerPort": 5432}],
                "readinessProbe": {"tcpSocket": {"port": 5432}, "periodSeconds": 1},
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
            }],
            "volumes": [volume],
        }
    })
}

pub async fn create_pod(client: &kube::Client, pod: Value) {
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let p: Pod = serde_json::from_value(pod).expect("a Pod");
    pods.create(&PostParams::default(), &p)
        .await
        .expect("pod created");
}

pub fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits until the Pod is Ready, with at least `min_restarts` restarts.
pub async fn ready_pod(client: &kube::Client, name: &str, min_restarts: i32) -> Pod {
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    common::eventually(&format!("pod {name} ready"), || async {
        let p = pods.get_opt(name).await.ok()??;
        let restarts = p
            .status
            .as_ref()
            .and_then(|s| s.container_statuses.as_ref())
            .and_then(|cs| cs.first())
            .map_or(0, |c| c.restart_count);
        (ready(&p) && restarts >= min_restarts).then_some(p)
    })
    .await
}

/// psql over TCP as postgres (trust); None when the query failed.
pub fn psql(host: &str, port: u16, sql: &str) -> Option<String> {
    let out = Command::new("psql")
        .args([
            "-h",
            host,
            "-p",
            &port.to_string(),
            "-U",
            "postgres",
            "-d",
            "postgres",
        ])
        .args(["-XAtq", "-v", "ON_ERROR_STOP=1", "-c", sql])
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub async fn psql_eventually(host: &str, port: u16, sql: &str) -> String {
    common::eventually(&format!("`{sql}` through {host}:{port}"), || async {
        psql(host, port, sql)
    })
    .await
}

/// kubectl 1.32 bound to one kubeconfig, with a private discovery cache.
pub struct Kubectl {
    pub kubeconfig: PathBuf,
    cache: PathBuf,
}

impl Kubectl {
    pub fn new(kubeconfig: &Path) -> Kubectl {
        let cache = kubeconfig.with_extension("kubectl-cache");
        Kubectl {
            kubeconfig: kubeconfig.to_path_buf(),
            cache,
        }
    }

    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new("/usr/bin/kubectl");
        c.arg("--kubeconfig")
            .arg(&self.kubeconfig)
            .arg("--cache-dir")
            .arg(&self.cache)
            .args(args);
        c
    }

    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("kubectl runs")
    }

    /// stdout of a command that must succeed.
    pub fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args);
        assert!(
            out.status.success(),
            "kubectl {args:?} failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}
