//! Container filesystems like a real kubelet's on the process runtime: a
//! container sees the host's files as its image and the volumes its Pod
//! mounts; what it writes anywhere else is private to it (not on the host,
//! not in another Pod) and gone when the container restarts, while a path
//! in a PVC survives the restart.
#![allow(clippy::unwrap_used)]

use crate::s8_support as support;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::Api;
use kube::api::AttachParams;
use pgfleet::sim::process::ProcessRuntime;
use serde_json::json;
use support::*;
use tokio::io::AsyncReadExt;

/// Runs `sh -c script` in the Pod; its stdout and whether it exited 0.
async fn sh(client: &kube::Client, pod: &str, script: &str) -> (String, bool) {
    let pods = Api::<Pod>::namespaced(client.clone(), "default");
    let params = AttachParams::default().stdout(true).stderr(false);
    let mut p = pods.exec(pod, ["sh", "-c", script], &params).await.unwrap();
    let status = p.take_status().unwrap();
    let mut out = String::new();
    p.stdout().unwrap().read_to_string(&mut out).await.unwrap();
    let st = status.await;
    let _ = p.join().await;
    (
        out,
        st.is_some_and(|s| s.status.as_deref() == Some("Success")),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn undeclared_paths_are_private_to_the_container_and_a_pvc_survives_restarts() {
    let (sim, client, _) = process_sim("s8-fs", 52).await;
    let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data-fs-0"},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), "default")
        .create(&Default::default(), &pvc)
        .await
        .unwrap();
    let claim = json!({"name": "data", "persistentVolumeClaim": {"claimName": "data-fs-0"}});
    create_pod(&client, postgres_pod("fs-0", "fs", claim)).await;
    create_pod(
        &client,
        postgres_pod("fs-1", "fs1", json!({"name": "data", "emptyDir": {}})),
    )
    .await;
    ready_pod(&client, "fs-0", 0).await;
    ready_pod(&client, "fs-1", 0).await;

    // A "backup repository" at a path no volume declares, and one in the PVC.
    // (postgres's home: writable for the container's user, no volume there.)
    let undeclared = "/var/lib/postgresql/s8-fs-repo/backup.info";
    let (_, ok) = sh(
        &client,
        "fs-0",
        &format!(
            "mkdir -p /var/lib/postgresql/s8-fs-repo && echo full > {undeclared} && \
             echo kept > /var/lib/postgresql/data/kept.txt && cat {undeclared}"
        ),
    )
    .await;
    assert!(ok, "writing inside the container works");
    assert_eq!(
        sh(&client, "fs-0", &format!("cat {undeclared}")).await.0,
        "full\n"
    );
    assert!(
        !std::path::Path::new(undeclared).exists(),
        "the host does not see the container's write"
    );
    let (_, seen) = sh(&client, "fs-1", &format!("test -e {undeclared}")).await;
    assert!(!seen, "another Pod does not see it");
    // The image's files are there (PostgreSQL itself, /etc), the host's
    // workspace is readable but not writable through the container.
    assert!(
        sh(
            &client,
            "fs-0",
            "test -x /usr/lib/postgresql/15/bin/postgres"
        )
        .await
        .1
    );
    assert!(sh(&client, "fs-0", "test -s /etc/passwd").await.1);

    // kill -9 the container: it restarts with a fresh filesystem, the PVC kept.
    let rt = ProcessRuntime::for_cluster(&sim.sim.clusters[52].cluster).unwrap();
    rt.kill_container("default", "fs-0", "").unwrap();
    ready_pod(&client, "fs-0", 1).await;
    let (_, still) = sh(&client, "fs-0", &format!("test -e {undeclared}")).await;
    assert!(!still, "the undeclared path vanished with the container");
    assert_eq!(
        sh(&client, "fs-0", "cat /var/lib/postgresql/data/kept.txt")
            .await
            .0,
        "kept\n"
    );
    // PostgreSQL came back on its PVC data.
    let ip = ready_pod(&client, "fs-0", 1)
        .await
        .status
        .and_then(|s| s.pod_ip)
        .unwrap();
    assert_eq!(psql_eventually(&ip, 5432, "SELECT 1").await, "1");
}
