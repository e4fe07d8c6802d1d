//! The process kubelet runtime with real PostgreSQL 15, continued (split
//! from `process_runtime.rs`): two bare PostgreSQL Pods on port 5432 side
//! by side behind one Service, and a network partition (and its heal)
//! steering the Service's endpoints. Same rules: no timed assertions.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::process_runtime::*;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::{DeleteParams, PostParams};
use serde_json::json;
use std::collections::HashSet;
use std::time::Duration;

/// A bare PostgreSQL pod: initdb into an emptyDir, listen on the pod's IP.
fn tiny_pg(name: &str, app: &str) -> Pod {
    let script = "set -e\nif [ ! -s \"$PGDATA/PG_VERSION\" ]; then initdb -D \"$PGDATA\" -U postgres --auth=trust >/dev/null; echo 'host all all 127.0.0.0/8 trust' >> \"$PGDATA/pg_hba.conf\"; fi\nexec postgres -D \"$PGDATA\" -c listen_addresses=\"$POD_IP\" -c unix_socket_directories=/tmp -c shared_buffers=16MB";
    obj(json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": name, "labels": {"app": app}},
        "spec": {
            "terminationGracePeriodSeconds": 5,
            "containers": [{
                "name": "pg", "image": "postgres:15",
                "command": ["/bin/sh", "-c", script],
                "env": [
                    {"name": "PGDATA", "value": "/var/lib/postgresql/data/pgdata"},
                    {"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}},
                ],
                "ports": [{"name": "pg", "containerPort": 5432}],
                "readinessProbe": {"exec": {"command": ["pg_isready", "-q", "-h", "/tmp"]}, "periodSeconds": 1, "failureThreshold": 2},
                "volumeMounts": [{"name": "data", "mountPath": "/var/lib/postgresql/data"}],
            }],
            "volumes": [{"name": "data", "emptyDir": {}}],
        },
    }))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_instances_share_port_5432_and_faults_steer_the_service() {
    let (sim, rt, client) = sim_at("proc-pair", 6).await;
    let ns = "default";
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let pp = PostParams::default();
    pods.create(&pp, &tiny_pg("pa", "pair")).await.unwrap();
    pods.create(&pp, &tiny_pg("pb", "pair")).await.unwrap();
    let svc: Service = obj(
        json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "pair"},
        "spec": {"selector": {"app": "pair"}, "ports": [{"port": 5432, "targetPort": "pg"}]}}),
    );
    let services = Api::<Service>::namespaced(client.clone(), ns);
    let ip = services
        .create(&pp, &svc)
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let a = ready_pod(&pods, "pa", 0)
        .await
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    let b = ready_pod(&pods, "pb", 0)
        .await
        .status
        .unwrap()
        .pod_ip
        .unwrap();
    assert_ne!(a, b);
    // Each answers on its own address, port 5432.
    assert_eq!(
        psql_eventually(&a, "", "SELECT inet_server_addr()").await,
        a
    );
    assert_eq!(
        psql_eventually(&b, "", "SELECT inet_server_addr()").await,
        b
    );
    // The Service spreads connections over both.
    let seen = until("both pods behind the service", || async {
        let mut seen = HashSet::new();
        for _ in 0..6 {
            seen.insert(psql(&ip, "", "SELECT inet_server_addr()")?);
        }
        (seen.len() == 2).then_some(seen)
    })
    .await;
    assert!(seen.contains(&a) && seen.contains(&b));

    // Partition pa (through the admin endpoint): its Service traffic and
    // exec fail; heal brings it back.
    let admin = sim.sim.admin_addr.unwrap();
    let token = sim.sim.clusters[6].token.clone();
    let (code, body) = common::admin_request(
        admin,
        "POST",
        "/clusters/c6/pods/default/pa/partition",
        &token,
        None,
    )
    .await;
    assert_eq!(code, 204, "{body}");
    assert!(rt.is_partitioned(ns, "pa"));
    until("the service to avoid the partitioned pod", || async {
        (rt.service_backends(ns, "pair") == vec!["default/pb".to_string()]).then_some(())
    })
    .await;
    for _ in 0..4 {
        assert_eq!(
            psql(&ip, "", "SELECT inet_server_addr()").as_deref(),
            Some(b.as_str())
        );
    }
    let err = exec(&pods, "pa", &["true"]).await.unwrap_err();
    assert!(
        err.contains("partitioned"),
        "exec into a partitioned pod fails: {err}"
    );
    assert_eq!(
        exec(&pods, "pb", &["echo", "ok"]).await.unwrap().trim(),
        "ok"
    );
    let (code, body) = common::admin_request(
        admin,
        "POST",
        "/clusters/c6/pods/default/pa/heal",
        &token,
        None,
    )
    .await;
    assert_eq!(code, 204, "{body}");
    until("the healed pod back in the service", || async {
        (rt.service_backends(ns, "pair").len() == 2).then_some(())
    })
    .await;

    // An open connection to a pod that leaves the Service is closed.
    let mut held = tokio::process::Command::new("psql")
        .args([
            "-h",
            &ip,
            "-U",
            "postgres",
            "-d",
            "postgres",
            "-XAtq",
            "-c",
            "SELECT pg_sleep(600)",
        ])
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    rt.partition(ns, "pa");
    rt.partition(ns, "pb");
    let st = until("the held connection to be closed", || {
        let r = held.try_wait().unwrap();
        async move { r }
    })
    .await;
    assert!(!st.success());
    rt.heal(ns, "pa");
    rt.heal(ns, "pb");

    // Freeze pb: readiness fails, it leaves the Service; thaw: it comes back.
    rt.freeze(ns, "pb").unwrap();
    until("the frozen pod to turn unready", || async {
        let p = pods.get("pb").await.ok()?;
        (!pod_ready(&p)).then_some(())
    })
    .await;
    assert_eq!(
        psql_eventually(&ip, "", "SELECT inet_server_addr()").await,
        a
    );
    rt.thaw(ns, "pb").unwrap();
    ready_pod(&pods, "pb", 0).await;

    // Force deletion kills at once; graceful deletion stops with SIGTERM.
    let (pa, pb) = (
        rt.container_pid(ns, "pa", "").unwrap(),
        rt.container_pid(ns, "pb", "").unwrap(),
    );
    pods.delete(
        "pa",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    pods.delete("pb", &DeleteParams::default()).await.unwrap();
    until("both pods gone", || async {
        let l = pods.list(&Default::default()).await.ok()?;
        l.items.is_empty().then_some(())
    })
    .await;
    until("the processes gone", || async {
        (!alive(pa) && !alive(pb)).then_some(())
    })
    .await;
}
