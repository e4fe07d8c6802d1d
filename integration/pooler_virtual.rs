//! A pooler's ConfigMap change in the virtual runtime (the embedded
//! default where PostgreSQL cannot run): the controller points running
//! pooler Pods at their upstream through exec before it writes the
//! ConfigMap (`controller/pooler/apply.rs`), and the virtual runtime's Pods
//! run no shell. A refusal is logged, not retried: the change is written
//! and the cluster stays Healthy on the new generation — before, the round
//! failed at the exec every time and the ConfigMap never changed.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::fleet;

use common::eventually;
use fleet::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use serde_json::json;

const M: &str = "member-1";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pooler_change_is_written_when_the_running_pooler_cannot_take_it() {
    let f = TestFleet::start("pooler-virtual", &[M]).await;
    let client = f.client(M);
    f.create(
        M,
        "shop",
        "orders",
        json!({"clusterSize": 1, "version": "15.20", "storage": {"size": "1Gi"},
            "pooler": {"enabled": true, "instances": 1}}),
    )
    .await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    eventually("the pooler Pod running", || {
        let pods = pods.clone();
        async move {
            let p = pods
                .get_opt("orders-pooler-1")
                .await
                .map_err(|e| e.to_string())?;
            let phase = p.and_then(|p| p.status?.phase);
            match phase.as_deref() {
                Some("Running") => Ok(()),
                other => Err(format!("phase {other:?}")),
            }
        }
    })
    .await;

    let pg = f
        .patch(
            M,
            "shop",
            "orders",
            json!({"spec": {"pooler": {"poolMode": "session"}}}),
        )
        .await;
    let generation = pg.metadata.generation;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "shop");
    eventually("the pooler ConfigMap in session mode", || {
        let cms = cms.clone();
        async move {
            let cm = cms.get("orders-pooler").await.map_err(|e| e.to_string())?;
            let ini = cm
                .data
                .and_then(|d| d.get("pgbouncer.ini").cloned())
                .unwrap_or_default();
            match ini.lines().any(|l| l == "pool_mode = session") {
                true => Ok(()),
                false => Err("still transaction".to_string()),
            }
        }
    })
    .await;
    eventually("the cluster Healthy on the new generation", || {
        let api = f.pgc(M, "shop");
        async move {
            let pg = api.get("orders").await.map_err(|e| e.to_string())?;
            let st = pg.status.unwrap_or_default();
            match (st.phase, st.observed_generation == generation) {
                (Some(pgfleet::crd::Phase::Healthy), true) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
}
