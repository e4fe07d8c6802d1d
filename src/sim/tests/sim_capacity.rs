//! Enforced claim capacity on the process runtime (issue 14): a claim of a
//! class with `pgfleet.io/capacity: enforced` is a file system of the
//! claim's size inside the pod (a real `ENOSPC` when full), and an
//! expansion grows it online, data kept, before the claim's capacity shows.
//! Needs root (it mounts a tmpfs): without, it fails saying so.
#![allow(clippy::unwrap_used)]

mod support;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;
use support::*;

async fn sh_in(pods: &Api<Pod>, pod: &str, script: &str) -> String {
    let (out, err, _) = exec_in(pods, pod, &["sh", "-c", script]).await;
    format!("{out}{err}").trim().to_string()
}

fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// `df -Pk /data`'s size in KiB.
async fn size_kb(pods: &Api<Pod>) -> String {
    sh_in(pods, "user", "df -Pk /data | awk 'NR == 2 {print $2}'").await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_enforced_claim_fills_up_and_grows_online_with_its_data() {
    // Address index 42: no other process-runtime test uses it.
    let sim = TestSim::start(process_options("capacity", 42)).await;
    let client = client_from(&sim.sim.clusters[42].kubeconfig).await;
    let pp = PostParams::default();
    let sc: StorageClass = obj(json!({"metadata": {"name": "sized"},
        "provisioner": "pgfleet.io/sim", "allowVolumeExpansion": true,
        "parameters": {"pgfleet.io/capacity": "enforced"}}));
    Api::<StorageClass>::all(client.clone())
        .create(&pp, &sc)
        .await
        .unwrap();
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    pvcs.create(
        &pp,
        &obj(json!({"metadata": {"name": "data"}, "spec": {
            "storageClassName": "sized", "accessModes": ["ReadWriteOnce"],
            "resources": {"requests": {"storage": "16Mi"}}}})),
    )
    .await
    .unwrap();
    pods.create(
        &pp,
        &obj(json!({"metadata": {"name": "user"}, "spec": {
            "securityContext": {"runAsUser": 999, "runAsNonRoot": true},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "x", "command": ["sleep", "3600"],
                "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "data"}}]}})),
    )
    .await
    .unwrap();
    eventually("pod running", || async {
        let p = pods.get_opt("user").await.ok()??;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    let kb = size_kb(&pods).await;
    assert_eq!(
        kb, "16384",
        "the claim is not size-limited (mounting a tmpfs needs root)"
    );
    let full = sh_in(
        &pods,
        "user",
        "dd if=/dev/zero of=/data/f bs=1M count=32 2>&1; echo rc=$?",
    )
    .await;
    assert!(
        full.contains("No space left on device") && !full.ends_with("rc=0"),
        "{full}"
    );

    let grow = json!({"spec": {"resources": {"requests": {"storage": "32Mi"}}}});
    pvcs.patch("data", &PatchParams::default(), &Patch::Merge(&grow))
        .await
        .unwrap();
    eventually("capacity 32Mi", || async {
        let c = pvcs.get("data").await.ok()?;
        let cap = c.status?.capacity?.get("storage")?.0.clone();
        (cap == "32Mi").then_some(())
    })
    .await;
    // Online: the same pod sees the new size, the data is still there.
    assert_eq!(size_kb(&pods).await, "32768");
    let more = sh_in(
        &pods,
        "user",
        "[ $(stat -c %s /data/f) -ge 15000000 ] && echo kept; \
         dd if=/dev/zero of=/data/g bs=1M count=8 2>/dev/null; echo rc=$?",
    )
    .await;
    assert_eq!(more, "kept\nrc=0", "{more}");
}
