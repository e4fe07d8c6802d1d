//! pgfleet's own Pods (instance and pooler) are admitted by the emulator's
//! `restricted` Pod Security level over HTTP, as a tenant namespace on a real
//! cluster would admit them. (Moved out of the emulator's tests: the emulator
//! crate knows no pgfleet types.)
#![allow(clippy::unwrap_used)]

use crate::common;

use common::*;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::{Api, PostParams};
use serde_json::{Value, json};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgfleets_own_pods_pass_a_restricted_namespace() {
    let s = start("tenancy-psa-pgfleet").await;
    let client = s.client().await;
    let pp = PostParams::default();
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "shop",
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&pp, &ns)
        .await
        .unwrap();
    let mut pg = pgfleet::crd::PostgresCluster::new(
        "orders",
        serde_json::from_value(json!({"clusterSize": 2, "version": "15.20",
            "pooler": {"enabled": true}}))
        .unwrap(),
    );
    pg.metadata.namespace = Some("shop".into());
    pg.metadata.uid = Some("u-1".into());
    let o = pgfleet::controller::build::Owner::of(&pg, 1).unwrap();
    let instance =
        pgfleet::controller::build::pod(&o, &pg, 1, pgfleet::crd::Role::Primary, "initdb", &[]);
    let pooler = pgfleet::controller::pooler::pod(&o, 1);
    let pods: Api<Pod> = Api::namespaced(client, "shop");
    for mut pod in [instance, pooler] {
        // No owner in this cluster: the garbage collector would remove them.
        pod.metadata.owner_references = None;
        let name = pod.metadata.name.clone().unwrap();
        let created = pods.create(&pp, &pod).await.unwrap();
        let spec = serde_json::to_value(created.spec).unwrap_or(Value::Null);
        assert_eq!(spec["automountServiceAccountToken"], false, "{name}");
    }
}
