//! The process kubelet runtime with real PostgreSQL 15: the real instance Pod
//! (`pgfleet-instance run` from the ConfigMap pgfleet builds) behind its
//! Services, clients connecting through the ClusterIP, kill -9 and restart
//! with the data kept, exec and logs through the API server, graceful
//! deletion, two instances on port 5432 side by side, and the faults.
//!
//! No timed assertions: every wait polls for a condition with a generous
//! deadline. Containers die with the sim (the runtime's threads end and the
//! kernel kills each container's PID namespace).

#![allow(clippy::unwrap_used)]

use crate::common;

use common::TestSim;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use kube::Api;
use kube::api::{AttachParams, DeleteParams, LogParams, Patch, PatchParams, PostParams};
use pgfleet::controller::build;
use pgfleet::crd::PostgresCluster;
use pgfleet::sim::process::ProcessRuntime;
use pgfleet::sim::{RuntimeKind, SimOptions};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

/// initdb, clone and restarts take seconds each on a shared 2-core machine.
pub(crate) const PATIENCE: Duration = Duration::from_secs(180);

pub(crate) async fn until<T, F, Fut>(what: &str, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A sim whose used cluster has address index `index` (pods in
/// 127.(10+index).0.0/16), so tests running at the same time never share
/// loopback addresses. Clusters before it exist only to shift the index.
pub(crate) async fn sim_at(
    tag: &str,
    index: usize,
) -> (TestSim, Arc<ProcessRuntime>, kube::Client) {
    let dir = common::temp_dir(tag);
    let opts = SimOptions {
        dir,
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
    let c = &sim.sim.clusters[index];
    let rt = ProcessRuntime::for_cluster(&c.cluster).expect("the process runtime of the cluster");
    let client = common::client_from(&c.kubeconfig).await;
    (sim, rt, client)
}

pub(crate) fn obj<T: serde::de::DeserializeOwned>(v: impl serde::Serialize) -> T {
    let mut v = serde_json::to_value(v).unwrap();
    // The owner (a PostgresCluster) does not exist here; the GC would
    // collect its dependents.
    if let Some(m) = v["metadata"].as_object_mut() {
        m.remove("ownerReferences");
    }
    serde_json::from_value(v).unwrap()
}

pub(crate) fn pod_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

pub(crate) fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .map_or(0, |c| c.restart_count)
}

pub(crate) async fn ready_pod(pods: &Api<Pod>, name: &str, min_restarts: i32) -> Pod {
    until(
        &format!("pod {name} ready (restarts >= {min_restarts})"),
        || async {
            let p = pods.get_opt(name).await.ok()??;
            (pod_ready(&p) && restarts(&p) >= min_restarts).then_some(p)
        },
    )
    .await
}

/// psql as a client over TCP; None when the query failed.
pub(crate) fn psql(host: &str, password: &str, sql: &str) -> Option<String> {
    let out = std::process::Command::new("psql")
        .args([
            "-h",
            host,
            "-p",
            "5432",
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-XAtq",
            "-v",
            "ON_ERROR_STOP=1",
            "-c",
            sql,
        ])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "5")
        .output()
        .ok()?;
    out.status
        .success()
        .then(|| String::from_utf8_lossy(&out.stdout).trim().to_string())
}

pub(crate) async fn psql_eventually(host: &str, password: &str, sql: &str) -> String {
    until(&format!("`{sql}` through {host}"), || async {
        psql(host, password, sql)
    })
    .await
}

/// Runs a command in a pod through the API server's `pods/exec`: its stdout,
/// or the failure status message.
pub(crate) async fn exec(pods: &Api<Pod>, pod: &str, argv: &[&str]) -> Result<String, String> {
    let params = AttachParams::default()
        .stdin(false)
        .stdout(true)
        .stderr(false);
    let mut proc = pods
        .exec(pod, argv.iter().map(|s| s.to_string()), &params)
        .await
        .map_err(|e| e.to_string())?;
    let status = proc.take_status();
    let mut out = String::new();
    if let Some(mut s) = proc.stdout() {
        let _ = s.read_to_string(&mut out).await;
    }
    let status = match status {
        Some(s) => s.await,
        None => None,
    };
    let _ = proc.join().await;
    match status {
        Some(s) if s.status.as_deref() == Some("Failure") => Err(s.message.unwrap_or_default()),
        _ => Ok(out),
    }
}

pub(crate) fn alive(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// What pgfleet creates for a PostgresCluster `db` but the Pods: the
/// ConfigMap with the instance script, the Secrets, the Services and the
/// PVCs of `ordinals`.
pub(crate) async fn instance_objects(
    client: &kube::Client,
    ns: &str,
    ordinals: &[u32],
) -> (PostgresCluster, build::Owner) {
    let mut pg = PostgresCluster::new(
        "db",
        serde_json::from_value(json!({"clusterSize": 2, "version": "15"})).unwrap(),
    );
    pg.metadata.namespace = Some(ns.into());
    pg.metadata.uid = Some("u-1".into());
    let o = build::Owner::of(&pg, 0).unwrap();
    let params = BTreeMap::from([
        ("max_connections".to_string(), "30".to_string()),
        ("shared_buffers".to_string(), "16MB".to_string()),
    ]);
    let pp = PostParams::default();
    Api::<ConfigMap>::namespaced(client.clone(), ns)
        .create(
            &pp,
            &obj(build::config_map(
                &o,
                &params,
                (&[], &[]),
                None,
                &Default::default(),
            )),
        )
        .await
        .unwrap();
    let secrets = Api::<Secret>::namespaced(client.clone(), ns);
    for (which, user, pw) in [
        ("superuser", "postgres", "s3cret"),
        ("replication", "replicator", "r3pl"),
    ] {
        secrets
            .create(&pp, &obj(build::secret(&o, which, user, pw)))
            .await
            .unwrap();
    }
    // The server certificate the manager would issue (TLS is always on).
    let now = std::time::SystemTime::now();
    let ca = pgfleet::controller::tls::issue::ca("db", ns, now).unwrap();
    let (pair, _) = pgfleet::controller::tls::issue::server(
        "db",
        ns,
        &ca.key,
        now,
        std::time::Duration::from_secs(3600),
    )
    .unwrap();
    let tls = pgfleet::controller::tls::server_secret("db");
    secrets
        .create(
            &pp,
            &obj(build::tls_secret(&o, &tls, &ca.cert, &pair.cert, &pair.key)),
        )
        .await
        .unwrap();
    let services = Api::<Service>::namespaced(client.clone(), ns);
    for s in build::services(&o, false) {
        services.create(&pp, &obj(s)).await.unwrap();
    }
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    for n in ordinals {
        pvcs.create(&pp, &obj(build::pvc(&o, &pg, *n)))
            .await
            .unwrap();
    }
    (pg, o)
}

pub(crate) fn cluster_ip(s: Service) -> String {
    s.spec.and_then(|s| s.cluster_ip).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replica_clones_and_streams_through_the_rw_service() {
    let (_sim, _rt, client) = sim_at("proc-replica", 7).await;
    let ns = "default";
    let (pg, o) = instance_objects(&client, ns, &[0, 1]).await;
    let pp = PostParams::default();
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let services = Api::<Service>::namespaced(client.clone(), ns);
    pods.create(
        &pp,
        &obj(build::pod(
            &o,
            &pg,
            0,
            pgfleet::crd::Role::Primary,
            "initdb",
            &[],
        )),
    )
    .await
    .unwrap();
    ready_pod(&pods, "db-0", 0).await;
    let rw = cluster_ip(services.get("db-rw").await.unwrap());
    let ro = cluster_ip(services.get("db-ro").await.unwrap());
    // The replica streams through a slot named after it (the manager's job
    // in a real cluster), from the -rw Service its conninfo names.
    psql_eventually(
        &rw,
        "s3cret",
        "SELECT pg_create_physical_replication_slot('db_1')",
    )
    .await;
    psql_eventually(
        &rw,
        "s3cret",
        "CREATE TABLE t (n int); INSERT INTO t SELECT generate_series(1, 10)",
    )
    .await;
    pods.create(
        &pp,
        &obj(build::pod(
            &o,
            &pg,
            1,
            pgfleet::crd::Role::Replica,
            "clone",
            &[],
        )),
    )
    .await
    .unwrap();
    ready_pod(&pods, "db-1", 0).await;
    psql_eventually(
        &rw,
        "s3cret",
        "INSERT INTO t SELECT generate_series(11, 20)",
    )
    .await;
    until("the rows to reach the replica through -ro", || async {
        (psql(&ro, "s3cret", "SELECT count(*) FROM t").as_deref() == Some("20")).then_some(())
    })
    .await;
    assert_eq!(
        psql(&ro, "s3cret", "SELECT pg_is_in_recovery()").as_deref(),
        Some("t")
    );
    assert_eq!(
        psql(
            &rw,
            "s3cret",
            "SELECT count(*) FROM pg_stat_replication WHERE application_name = 'db-1'"
        )
        .as_deref(),
        Some("1")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn instance_pod_serves_sql_through_its_service_and_survives_kill_9() {
    let (sim, rt, client) = sim_at("proc-instance", 5).await;
    let ns = "default";
    let (pg, o) = instance_objects(&client, ns, &[0]).await;
    let pp = PostParams::default();
    let pvcs = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns);
    let services = Api::<Service>::namespaced(client.clone(), ns);
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    pods.create(
        &pp,
        &obj(build::pod(
            &o,
            &pg,
            0,
            pgfleet::crd::Role::Primary,
            "initdb",
            &[],
        )),
    )
    .await
    .unwrap();

    until("the PVC to bind", || async {
        let p = pvcs.get("db-0").await.ok()?;
        (p.status?.phase.as_deref() == Some("Bound")).then_some(())
    })
    .await;
    let pod = ready_pod(&pods, "db-0", 0).await;
    let pod_ip = pod.status.as_ref().and_then(|s| s.pod_ip.clone()).unwrap();
    assert!(
        pod_ip.starts_with("127.15."),
        "pod IP {pod_ip} is from the cluster's range"
    );
    let rw = services
        .get("db-rw")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();

    // SQL through the -rw ClusterIP, as the superuser with the Secret's password.
    psql_eventually(
        &rw,
        "s3cret",
        "CREATE TABLE t (n int); INSERT INTO t SELECT generate_series(1, 100)",
    )
    .await;
    assert_eq!(
        psql(&rw, "s3cret", "SELECT count(*) FROM t").as_deref(),
        Some("100")
    );
    assert_eq!(
        psql(&rw, "s3cret", "SELECT inet_server_addr()").as_deref(),
        Some(pod_ip.as_str())
    );
    // The Pod spec's mount path resolves inside the container.
    assert_eq!(
        psql(&rw, "s3cret", "SELECT current_setting('data_directory')").as_deref(),
        Some("/var/lib/postgresql/data/pgdata")
    );

    // The manager's path: the instance contract through pods/exec.
    let status = exec(
        &pods,
        "db-0",
        &["/bin/sh", "/etc/pgfleet/config/pgfleet-instance", "status"],
    )
    .await
    .unwrap();
    let status: Value =
        serde_json::from_str(status.trim()).unwrap_or_else(|e| panic!("status {status:?}: {e}"));
    assert_eq!(status["role"], "primary");
    assert_eq!(
        exec(&pods, "db-0", &["id", "-un"]).await.unwrap().trim(),
        "postgres"
    );
    // Service names resolve inside the pod (the runtime's /etc/hosts).
    let hosts = exec(&pods, "db-0", &["getent", "hosts", "db-rw"])
        .await
        .unwrap();
    assert!(
        hosts.starts_with(&format!("{rw} ")),
        "db-rw resolves to {rw}: {hosts}"
    );
    // The downward API labels file follows label changes.
    let patch = json!({"metadata": {"labels": {"pgfleet.io/role": "replica"}}});
    pods.patch("db-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    until("the labels file to follow the label change", || async {
        let labels = exec(&pods, "db-0", &["cat", "/etc/pgfleet/podinfo/labels"])
            .await
            .ok()?;
        labels.contains("pgfleet.io/role=\"replica\"").then_some(())
    })
    .await;
    let patch = json!({"metadata": {"labels": {"pgfleet.io/role": "primary"}}});
    pods.patch("db-0", &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let logs = pods.logs("db-0", &LogParams::default()).await.unwrap();
    assert!(
        logs.contains("database system is ready to accept connections"),
        "logs: {logs}"
    );
    let eps: Api<k8s_openapi::api::core::v1::Endpoints> = Api::namespaced(client.clone(), ns);
    until("the -rw Endpoints to list the pod", || async {
        let e = eps.get("db-rw").await.ok()?;
        let ips: Vec<String> = e
            .subsets?
            .into_iter()
            .flat_map(|s| s.addresses.unwrap_or_default())
            .map(|a| a.ip)
            .collect();
        (ips == vec![pod_ip.clone()]).then_some(())
    })
    .await;

    // kill -9: the container restarts, the data is still there.
    let pid = rt.container_pid(ns, "db-0", "postgres").unwrap();
    rt.kill_container(ns, "db-0", "").unwrap();
    ready_pod(&pods, "db-0", 1).await;
    assert_ne!(rt.container_pid(ns, "db-0", "postgres"), Some(pid));
    assert_eq!(
        psql_eventually(&rw, "s3cret", "SELECT count(*) FROM t").await,
        "100"
    );

    // Graceful deletion: processes gone, object gone, the PVC's data stays.
    let pid = rt.container_pid(ns, "db-0", "postgres").unwrap();
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    until("the pod object to be deleted", || async {
        pods.get_opt("db-0").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(!alive(pid), "the container's PID 1 ({pid}) is gone");
    let pvc_dir = sim.dir.join("process/c5/pvc/default/db-0");
    assert!(
        pvc_dir.join("pgdata/PG_VERSION").exists(),
        "the PVC directory outlives the pod"
    );
    assert!(
        psql(&rw, "s3cret", "SELECT 1").is_none(),
        "no backend behind -rw"
    );

    // A new pod on the same claim finds the data.
    pods.create(
        &pp,
        &obj(build::pod(
            &o,
            &pg,
            0,
            pgfleet::crd::Role::Primary,
            "initdb",
            &[],
        )),
    )
    .await
    .unwrap();
    ready_pod(&pods, "db-0", 0).await;
    assert_eq!(
        psql_eventually(&rw, "s3cret", "SELECT count(*) FROM t").await,
        "100"
    );
    let pid = rt.container_pid(ns, "db-0", "postgres").unwrap();
    pods.delete("db-0", &DeleteParams::default()).await.unwrap();
    until("the pod object to be deleted", || async {
        pods.get_opt("db-0").await.ok()?.is_none().then_some(())
    })
    .await;
    assert!(!alive(pid));
    // Deleting the claim deletes its data.
    pvcs.delete("db-0", &DeleteParams::default()).await.unwrap();
    until("the PVC directory to go", || async {
        (!pvc_dir.exists()).then_some(())
    })
    .await;
}
