//! The `kubernetes.io/pvc-protection` finalizer (issue 18 item 6): every new
//! PersistentVolumeClaim carries it; an unused claim deleted goes at once; a
//! claim deleted while a running pod mounts it stays `Terminating` (kubectl
//! shows it so) until the pod is gone, then disappears; a pod created on a
//! Terminating claim is held Pending with a FailedMount Event, not started
//! (the kubelet's volume manager). Over real HTTP with a
//! kube client and kubectl, as against a real cluster.
#![allow(clippy::unwrap_used)]

mod support;

use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::{Value, json};
use support::*;

const FINALIZER: &str = "kubernetes.io/pvc-protection";

fn pvc(name: &str) -> PersistentVolumeClaim {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}
    }))
    .unwrap()
}

fn pod_on(claim: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": "db"},
        "spec": {
            "containers": [{"name": "db", "image": "postgres:15", "command": ["sleep", "3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        }
    }))
    .unwrap()
}

async fn gone(pvcs: &Api<PersistentVolumeClaim>, name: &str) {
    eventually(&format!("pvc {name} to disappear"), || async {
        pvcs.get_opt(name).await.unwrap().is_none().then_some(())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_in_use_stays_terminating_until_its_pod_is_gone() {
    let s = start("pvc-protection").await;
    let client = s.client().await;
    let pp = PostParams::default();
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());

    // Admission adds the finalizer on create.
    for name in ["data", "spare"] {
        let created = pvcs.create(&pp, &pvc(name)).await.unwrap();
        assert_eq!(
            created.metadata.finalizers,
            Some(vec![FINALIZER.to_string()]),
            "{created:?}"
        );
    }

    // A running (scheduled) pod mounts "data".
    pods.create(&pp, &pod_on("data")).await.unwrap();
    eventually("pod db scheduled and running", || async {
        let p = pods.get("db").await.unwrap();
        let scheduled = p.spec.as_ref().and_then(|s| s.node_name.clone()).is_some();
        let running = p.status.and_then(|s| s.phase).as_deref() == Some("Running");
        (scheduled && running).then_some(())
    })
    .await;

    // Deleted while in use: marked, kept with its finalizer.
    pvcs.delete("data", &DeleteParams::default()).await.unwrap();
    // An unused claim deleted afterwards goes, so the controller has looked
    // at "data" since it was marked, and kept it.
    pvcs.delete("spare", &DeleteParams::default())
        .await
        .unwrap();
    gone(&pvcs, "spare").await;
    let kept = pvcs.get("data").await.unwrap();
    assert!(kept.metadata.deletion_timestamp.is_some(), "{kept:?}");
    assert_eq!(kept.metadata.finalizers, Some(vec![FINALIZER.to_string()]));

    // kubectl reports it as a real cluster does.
    let out = std::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(s.kubeconfig())
        .args(["get", "pvc", "data", "-o", "json"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    let seen: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(seen["metadata"]["finalizers"], json!([FINALIZER]));
    let table = std::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(s.kubeconfig())
        .args(["get", "pvc", "data", "--no-headers"])
        .output()
        .unwrap();
    let line = String::from_utf8_lossy(&table.stdout).to_string();
    assert!(line.contains("Terminating"), "{line:?} {table:?}");

    // No new finalizers on a claim being deleted, as kube answers.
    let mut extra = kept.clone();
    extra.metadata.finalizers = Some(vec![FINALIZER.into(), "example.com/hold".into()]);
    let err = api_err(pvcs.replace("data", &pp, &extra).await);
    assert_eq!(err.code, 422, "{err:?}");

    // A new pod on the Terminating claim is not started: Pending with
    // ContainerCreating and a FailedMount Warning, as a real kubelet leaves it.
    let mut late = pod_on("data");
    late.metadata.name = Some("late".into());
    pods.create(&pp, &late).await.unwrap();
    let events: Api<k8s_openapi::api::core::v1::Event> = Api::default_namespaced(client.clone());
    let note = eventually("a FailedMount event for pod late", || async {
        events
            .list(&Default::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find_map(|e| {
                (e.reason.as_deref() == Some("FailedMount")
                    && e.involved_object.name.as_deref() == Some("late"))
                .then(|| e.message.unwrap_or_default())
            })
    })
    .await;
    assert!(
        note.contains("can't start pod because PVC default/data is being deleted"),
        "{note}"
    );
    let held = pods.get("late").await.unwrap();
    let st = held.status.unwrap();
    assert_eq!(st.phase.as_deref(), Some("Pending"));
    let waiting = st.container_statuses.unwrap()[0]
        .state
        .clone()
        .unwrap()
        .waiting
        .unwrap();
    assert_eq!(waiting.reason.as_deref(), Some("ContainerCreating"));

    // The pods go: the controller releases the claim and it disappears.
    for name in ["db", "late"] {
        pods.delete(name, &DeleteParams::default().grace_period(0))
            .await
            .unwrap();
    }
    gone(&pvcs, "data").await;

    // A claim never mounted is deleted at once through kubectl too.
    pvcs.create(&pp, &pvc("free")).await.unwrap();
    let del = std::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(s.kubeconfig())
        .args(["delete", "pvc", "free"])
        .output()
        .unwrap();
    assert!(del.status.success(), "{del:?}");
    gone(&pvcs, "free").await;
}

/// Output of `sh -c script` in a pod (stdout and stderr).
async fn sh_in(pods: &Api<Pod>, pod: &str, script: &str) -> String {
    let (out, err, _) = exec_in(pods, pod, &["sh", "-c", script]).await;
    format!("{out}{err}").trim().to_string()
}

fn writer(name: &str, claim: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "securityContext": {"runAsUser": 999, "runAsNonRoot": true},
            "terminationGracePeriodSeconds": 1,
            "containers": [{"name": "c", "image": "x", "command": ["sleep", "3600"],
                            "volumeMounts": [{"name": "data", "mountPath": "/data"}]}],
            "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": claim}}]
        }
    }))
    .unwrap()
}

async fn running(pods: &Api<Pod>, name: &str) {
    eventually(&format!("pod {name} running"), || async {
        let p = pods.get_opt(name).await.ok()??;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
}

/// A claim deleted and created again under the same name is a new, empty
/// volume its pods can write (a new PersistentVolume on a real cluster),
/// and the old claim's cleanup never removes the new one's data. The
/// process runtime once let the old claim's deferred cleanup remove the
/// new claim's directory (pods then found a root-owned empty mount point:
/// a rebuilt replica crash-looped on "Permission denied").
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_claim_created_again_under_its_name_is_a_new_empty_volume() {
    // Address index 41: no other process-runtime test uses it.
    let opts = process_options("pvc-again", 41);
    let sim = TestSim::start(opts).await;
    let client = client_from(&sim.sim.clusters[41].kubeconfig).await;
    let pp = PostParams::default();
    let pvcs: Api<PersistentVolumeClaim> = Api::default_namespaced(client.clone());
    let pods: Api<Pod> = Api::default_namespaced(client.clone());

    pvcs.create(&pp, &pvc("data")).await.unwrap();
    pods.create(&pp, &writer("first", "data")).await.unwrap();
    running(&pods, "first").await;
    assert_eq!(
        sh_in(&pods, "first", "echo old > /data/f && echo ok").await,
        "ok"
    );

    // Both go; the claim is created again as soon as its name is free.
    pvcs.delete("data", &DeleteParams::default()).await.unwrap();
    pods.delete("first", &DeleteParams::default())
        .await
        .unwrap();
    gone(&pvcs, "data").await;
    pvcs.create(&pp, &pvc("data")).await.unwrap();
    pods.create(&pp, &writer("second", "data")).await.unwrap();
    running(&pods, "second").await;
    assert_eq!(
        sh_in(
            &pods,
            "second",
            "ls -A /data; echo new > /data/g && echo ok"
        )
        .await,
        "ok",
        "the new claim's volume is empty and writable"
    );

    // With no pod on it any more, the old claim's cleanup may run: the new
    // claim's data stays.
    pods.delete("second", &DeleteParams::default())
        .await
        .unwrap();
    eventually("pod second gone", || async {
        pods.get_opt("second")
            .await
            .unwrap()
            .is_none()
            .then_some(())
    })
    .await;
    pods.create(&pp, &writer("third", "data")).await.unwrap();
    running(&pods, "third").await;
    assert_eq!(sh_in(&pods, "third", "cat /data/g").await, "new");
}
