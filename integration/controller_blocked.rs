//! Failures a person must act on are named on the PostgresCluster instead of
//! a generic Warning and a silent backoff (`controller::blocked`):
//!
//! - a child create refused by a ResourceQuota gives the `QuotaExceeded`
//!   condition and Event naming the quota and the resource; raising the
//!   quota lets the cluster finish and clears the condition;
//! - an image without the instance script (the `missing_exec` fault: exec
//!   exits 127 as such an image does) gives the `InstanceContractMissing`
//!   condition and Event naming the pod and the exit code, and a fixed
//!   image clears it.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::fleet::*;
use k8s_openapi::api::core::v1::ResourceQuota;
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgfleet::sim::faults::FaultSpec;
use serde_json::json;

const M: &str = "member-1";

fn spec(size: i32) -> serde_json::Value {
    json!({"clusterSize": size, "version": "15.18", "storage": {"size": "1Gi"}})
}

/// Waits until the cluster has condition `type_` True, and returns its message.
async fn condition_true(f: &TestFleet, name: &str, type_: &str) -> String {
    let api = f.pgc(M, "shop");
    eventually(&format!("{name} has condition {type_}"), || async {
        let pg = api.get(name).await.ok()?;
        let c = condition(&pg, type_)?;
        (c.status == "True").then(|| c.message.clone())
    })
    .await
}

/// Waits for a Warning Event with `reason` whose note contains `text`;
/// returns every Event about the cluster then.
async fn named_event(f: &TestFleet, reason: &str, text: &str) -> Vec<(String, String)> {
    let client = f.client(M);
    eventually(&format!("an Event {reason} naming {text}"), || async {
        let evs = events_about(&client, "shop", "orders").await;
        evs.iter()
            .any(|(r, n)| r == reason && n.contains(text))
            .then_some(evs.clone())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_quota_refusal_is_named_on_the_cluster_and_clears_when_raised() {
    let f = TestFleet::start("blocked-quota", &[M]).await;
    f.namespace(M, "shop").await;
    let quotas: Api<ResourceQuota> = Api::namespaced(f.client(M), "shop");
    let q: ResourceQuota = serde_json::from_value(json!({
        "metadata": {"name": "tenant-pods"}, "spec": {"hard": {"pods": "1"}}
    }))
    .unwrap();
    quotas.create(&PostParams::default(), &q).await.unwrap();
    f.create(M, "shop", "orders", spec(2)).await;

    let msg = condition_true(&f, "orders", "QuotaExceeded").await;
    assert!(
        msg.contains("ResourceQuota tenant-pods refuses pods") && msg.contains("Pod orders-2"),
        "{msg}"
    );
    let evs = named_event(&f, "QuotaExceeded", "tenant-pods").await;
    assert!(
        !evs.iter().any(|(r, _)| r == "ReconcileForbidden"),
        "the named reason replaces the generic one: {evs:?}"
    );

    quotas
        .patch(
            "tenant-pods",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"hard": {"pods": "5"}}})),
        )
        .await
        .unwrap();
    // A quota change is not a cluster event: nudge it rather than wait
    // out the Forbidden backoff.
    f.patch(
        M,
        "shop",
        "orders",
        json!({"metadata": {"annotations": {"nudge": "1"}}}),
    )
    .await;
    let pg = f.wait_healthy(M, "shop", "orders", 2).await;
    assert!(condition(&pg, "QuotaExceeded").is_none(), "{:?}", pg.status);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_without_the_instance_script_is_named_with_pod_and_exit_code() {
    let f = TestFleet::start("blocked-contract", &[M]).await;
    f.create(M, "shop", "orders", spec(2)).await;
    f.wait_healthy(M, "shop", "orders", 2).await;
    let sim = f.sim_cluster(M).cluster.clone();
    sim.faults.set(FaultSpec {
        missing_exec: vec!["pgfleet-instance".into()],
        ..Default::default()
    });
    // A rolling update asks the instances for their positions.
    f.patch(M, "shop", "orders", json!({"spec": {"version": "15.20"}}))
        .await;
    let msg = condition_true(&f, "orders", "InstanceContractMissing").await;
    assert!(
        msg.contains("pod orders-") && msg.contains("exited 127"),
        "{msg}"
    );
    named_event(&f, "InstanceContractMissing", "exited 127").await;

    sim.faults.set(FaultSpec::default());
    eventually("the condition to clear once the script answers", || async {
        let pg = f.pgc(M, "shop").get("orders").await.ok()?;
        condition(&pg, "InstanceContractMissing")
            .is_none()
            .then_some(())
    })
    .await;
}
