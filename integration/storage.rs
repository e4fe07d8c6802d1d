//! Volume expansion with real PostgreSQL (issue 14): claims of a
//! StorageClass whose capacity the process runtime enforces (a tmpfs of the
//! claim's size, `src/sim/process/capacity.rs`), raised from 1Gi to 2Gi
//! while a client writes through `-rw`: every claim grows online (no
//! restart, zero failed transactions, the size the instance sees follows
//! the claim); lowering the size is refused with a condition naming both
//! sizes; a class without `allowVolumeExpansion` gets a condition and its
//! claim is left alone. Also the support the auto-grow scenarios share.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::process as env;

use env::{Env, NS, Writer, rows};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgfleet::crd::PostgresClusterStatus;
use pgfleet::postgres::contract::Usage;
use serde_json::json;
use std::time::Duration;

pub const MI: u64 = 1 << 20;
const GI: u64 = 1 << 30;

/// A StorageClass of the embedded cluster: `expand` sets
/// `allowVolumeExpansion`, `enforced` makes its claims size-limited.
pub async fn class(e: &Env, name: &str, expand: bool, enforced: bool) {
    let params = match enforced {
        true => json!({"pgfleet.io/capacity": "enforced"}),
        false => json!({}),
    };
    let sc: StorageClass = serde_json::from_value(json!({
        "apiVersion": "storage.k8s.io/v1", "kind": "StorageClass",
        "metadata": {"name": name}, "provisioner": "pgfleet.io/sim",
        "allowVolumeExpansion": expand, "parameters": params,
    }))
    .unwrap();
    Api::<StorageClass>::all(e.client.clone())
        .create(&PostParams::default(), &sc)
        .await
        .unwrap();
}

/// `pgfleet-instance usage` in `pod`, if it answers.
pub async fn usage(e: &Env, pod: &str) -> Option<Usage> {
    let out =
        pgfleet::postgres::exec::run_verb(&e.client, NS, pod, &["usage"], Duration::from_secs(20))
            .await
            .ok()?;
    serde_json::from_str(out.trim()).ok()
}

/// Waits until `pod`'s file system is `bytes` big. A size far from any
/// claim's means the runtime could not enforce capacity (it needs root to
/// mount a tmpfs): said loudly, so no test passes without a real limit.
pub async fn wait_fs_size(e: &Env, pod: &str, bytes: u64) {
    let mut last = 0;
    for _ in 0..600 {
        if let Some(u) = usage(e, pod).await {
            assert!(
                u.total_bytes <= 64 * GI,
                "{pod}: the volume is the host's file system ({} bytes): claim capacity is not \
                 enforced (the process runtime mounts a tmpfs per claim and needs root for it)",
                u.total_bytes
            );
            if u.total_bytes == bytes {
                return;
            }
            last = u.total_bytes;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    panic!("{pod}: file system size {last}, never {bytes}");
}

pub async fn set_spec(e: &Env, cluster: &str, spec: serde_json::Value) {
    e.pgc()
        .patch(
            cluster,
            &PatchParams::default(),
            &Patch::Merge(&json!({ "spec": spec })),
        )
        .await
        .unwrap();
}

pub fn condition<'a>(st: &'a PostgresClusterStatus, t: &str) -> Option<&'a str> {
    st.conditions
        .iter()
        .find(|c| c.type_ == t)
        .map(|c| c.message.as_str())
}

pub async fn claim_request(e: &Env, name: &str) -> String {
    let pvc = Api::<PersistentVolumeClaim>::namespaced(e.client.clone(), NS)
        .get(name)
        .await
        .unwrap();
    pvc.spec.unwrap().resources.unwrap().requests.unwrap()["storage"]
        .0
        .clone()
}

/// Every claim of the status at `size`, done.
fn claims_done(st: &PostgresClusterStatus, n: usize, size: &str) -> bool {
    st.storage.as_ref().is_some_and(|s| {
        s.claims.len() == n
            && s.claims
                .iter()
                .all(|c| c.state == "Bound" && c.capacity.as_deref() == Some(size))
    })
}

fn restarts(p: &Pod) -> i32 {
    p.status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|cs| cs.first())
        .map_or(0, |c| c.restart_count)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn raising_the_size_expands_every_claim_online_and_a_shrink_is_refused() {
    let e = Env::start("storage-expand").await;
    class(&e, "sized", true, true).await;
    class(&e, "fixed", false, false).await;
    let storage = json!({"size": "1Gi", "storageClass": "sized"});
    e.create(
        "ex",
        json!({"clusterSize": 2, "version": "15", "storage": storage}),
    )
    .await;
    let fixed = json!({"size": "64Mi", "storageClass": "fixed"});
    e.create(
        "fx",
        json!({"clusterSize": 1, "version": "15", "storage": fixed}),
    )
    .await;
    e.wait_healthy("ex", 2).await;
    for pod in ["ex-1", "ex-2"] {
        wait_fs_size(&e, pod, GI).await;
    }
    let before: Vec<(Option<String>, i32)> = {
        let mut v = vec![];
        for pod in ["ex-1", "ex-2"] {
            let p = e.pods().get(pod).await.unwrap();
            v.push((p.metadata.uid.clone(), restarts(&p)));
        }
        v
    };
    let (rw, pw) = e.setup_table("ex").await;
    let w = Writer::start(rw.clone(), 5432, pw.clone());
    e.wait_acked(&w, 50).await;

    set_spec(&e, "ex", json!({"storage": {"size": "2Gi"}})).await;
    e.wait("both claims at 2Gi", Duration::from_secs(120), || async {
        claims_done(&e.status("ex").await, 2, "2Gi")
    })
    .await;
    for pod in ["ex-1", "ex-2"] {
        // What the instance sees followed the claim.
        wait_fs_size(&e, pod, 2 * GI).await;
    }
    e.wait_acked(&w, 50).await;
    let (acked, failed) = w.stop().await;
    assert_eq!(failed, 0, "transactions failed during the expansion");
    let present = rows(&rw, &pw).await;
    assert!(acked.is_subset(&present), "acknowledged rows lost");
    for (pod, (uid, n)) in ["ex-1", "ex-2"].iter().zip(before) {
        let p = e.pods().get(pod).await.unwrap();
        assert_eq!(
            (p.metadata.uid.clone(), restarts(&p)),
            (uid, n),
            "{pod} restarted"
        );
    }
    let events = e.kubectl(&[
        "get",
        "events",
        "--field-selector",
        "reason=VolumeExpanding",
    ]);
    assert!(
        events.contains("ex-1") && events.contains("ex-2"),
        "{events}"
    );

    // Shrinking: refused with both sizes named, nothing touched.
    set_spec(&e, "ex", json!({"storage": {"size": "1Gi"}})).await;
    e.wait("the shrink refused", Duration::from_secs(60), || async {
        condition(&e.status("ex").await, "VolumeShrinkRefused")
            .is_some_and(|m| m.contains("1Gi is smaller") && m.contains("ex-1 (2Gi)"))
    })
    .await;
    for pod in ["ex-1", "ex-2"] {
        assert_eq!(claim_request(&e, pod).await, "2Gi");
    }
    wait_fs_size(&e, "ex-1", 2 * GI).await;
    assert!(rows(&rw, &pw).await.is_superset(&acked));

    // A class that cannot expand: a condition, the claim left alone.
    e.wait_healthy("fx", 1).await;
    set_spec(&e, "fx", json!({"storage": {"size": "128Mi"}})).await;
    e.wait("expansion unsupported", Duration::from_secs(60), || async {
        condition(&e.status("fx").await, "VolumeExpansionUnsupported")
            .is_some_and(|m| m.contains("fx-1") && m.contains("128Mi"))
    })
    .await;
    assert_eq!(claim_request(&e, "fx-1").await, "64Mi");
    eprintln!(
        "expansion 1Gi → 2Gi of 2 claims under a writer: {} acknowledged rows, 0 failed",
        acked.len()
    );
}
