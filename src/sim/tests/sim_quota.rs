//! ResourceQuota and LimitRange enforcement of the embedded API server over
//! real HTTP (kube client): kube's 403 messages for exceeded quotas, missing
//! compute values and LimitRange bounds, LimitRange defaults, and the quota
//! controller's `status.used`.
#![allow(clippy::unwrap_used)]

mod support;

use kube::Api;
use kube::api::{DeleteParams, DynamicObject, PostParams};
use pgfleet_sim::RuntimeKind;
use serde_json::{Value, json};
use support::{TestSim, api_err, eventually, temp_dir};

async fn sim(tag: &str) -> (TestSim, kube::Client) {
    let mut opts = support::options(&temp_dir(tag), false);
    opts.runtime = RuntimeKind::None;
    let sim = TestSim::start(opts).await;
    let client = sim.client().await;
    let ns: Api<k8s_openapi::api::core::v1::Namespace> = Api::all(client.clone());
    ns.create(
        &PostParams::default(),
        &serde_json::from_value(json!({"metadata": {"name": "q"}})).unwrap(),
    )
    .await
    .unwrap();
    (sim, client)
}

fn api(client: &kube::Client, kind: &str, plural: &str) -> Api<DynamicObject> {
    let ar = kube::api::ApiResource {
        group: String::new(),
        version: "v1".into(),
        api_version: "v1".into(),
        kind: kind.into(),
        plural: plural.into(),
    };
    Api::namespaced_with(client.clone(), "q", &ar)
}

async fn create(
    client: &kube::Client,
    kind: &str,
    plural: &str,
    body: Value,
) -> Result<DynamicObject, kube::Error> {
    let obj: DynamicObject = serde_json::from_value(body).unwrap();
    api(client, kind, plural)
        .create(&PostParams::default(), &obj)
        .await
}

fn pod(name: &str, resources: Value) -> Value {
    json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": {"containers": [{"name": "app", "image": "postgres:15", "resources": resources}]}})
}

fn pvc(name: &str, size: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim", "metadata": {"name": name},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": size}}}})
}

/// `status.used` of quota `name`, once the controller wrote it.
async fn used(client: &kube::Client, name: &str, want: Value) {
    let quotas = api(client, "ResourceQuota", "resourcequotas");
    eventually(&format!("quota {name} used = {want}"), || {
        let quotas = quotas.clone();
        let want = want.clone();
        async move {
            let q = quotas.get(name).await.ok()?;
            let got = q.data.pointer("/status/used").cloned().unwrap_or_default();
            (got == want).then_some(())
        }
    })
    .await;
}

#[tokio::test]
async fn quota_counts_objects_and_refuses_with_kubes_message() {
    let (_sim, client) = sim("quota-count").await;
    create(
        &client,
        "ResourceQuota",
        "resourcequotas",
        json!({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "objects"},
        "spec": {"hard": {"pods": "1", "requests.storage": "1Gi", "count/services": "0"}}}),
    )
    .await
    .unwrap();
    used(
        &client,
        "objects",
        json!({"pods": "0", "requests.storage": "0", "count/services": "0"}),
    )
    .await;

    create(&client, "Pod", "pods", pod("p1", json!({})))
        .await
        .unwrap();
    let e = api_err(create(&client, "Pod", "pods", pod("p2", json!({}))).await);
    assert_eq!(e.code, 403);
    assert_eq!(e.reason, "Forbidden");
    assert_eq!(
        e.message,
        "pods \"p2\" is forbidden: exceeded quota: objects, requested: pods=1, used: pods=1, limited: pods=1"
    );

    create(
        &client,
        "PersistentVolumeClaim",
        "persistentvolumeclaims",
        pvc("d1", "600Mi"),
    )
    .await
    .unwrap();
    let e = api_err(
        create(
            &client,
            "PersistentVolumeClaim",
            "persistentvolumeclaims",
            pvc("d2", "600Mi"),
        )
        .await,
    );
    assert_eq!(
        e.message,
        "persistentvolumeclaims \"d2\" is forbidden: exceeded quota: objects, requested: \
         requests.storage=600Mi, used: requests.storage=600Mi, limited: requests.storage=1Gi"
    );
    let svc = json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"},
        "spec": {"ports": [{"port": 5432}]}});
    let e = api_err(create(&client, "Service", "services", svc).await);
    assert_eq!(
        e.message,
        "services \"s\" is forbidden: exceeded quota: objects, requested: count/services=1, \
         used: count/services=0, limited: count/services=0"
    );
    used(
        &client,
        "objects",
        json!({"pods": "1", "requests.storage": "600Mi", "count/services": "0"}),
    )
    .await;

    // Deleting the pod frees the quota.
    api(&client, "Pod", "pods")
        .delete("p1", &DeleteParams::default())
        .await
        .unwrap();
    used(
        &client,
        "objects",
        json!({"pods": "0", "requests.storage": "600Mi", "count/services": "0"}),
    )
    .await;
    create(&client, "Pod", "pods", pod("p2", json!({})))
        .await
        .unwrap();
}

#[tokio::test]
async fn compute_quota_needs_values_and_sums_them() {
    let (_sim, client) = sim("quota-compute").await;
    create(
        &client,
        "ResourceQuota",
        "resourcequotas",
        json!({
        "apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "compute"},
        "spec": {"hard": {"limits.cpu": "1", "requests.memory": "1Gi"}}}),
    )
    .await
    .unwrap();
    let e = api_err(create(&client, "Pod", "pods", pod("bare", json!({}))).await);
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        "pods \"bare\" is forbidden: failed quota: compute: must specify limits.cpu for: app; requests.memory for: app"
    );
    let res = json!({"limits": {"cpu": "600m", "memory": "512Mi"}});
    create(&client, "Pod", "pods", pod("a", res.clone()))
        .await
        .unwrap();
    used(
        &client,
        "compute",
        json!({"limits.cpu": "600m", "requests.memory": "512Mi"}),
    )
    .await;
    let e = api_err(create(&client, "Pod", "pods", pod("b", res)).await);
    assert_eq!(
        e.message,
        "pods \"b\" is forbidden: exceeded quota: compute, requested: limits.cpu=600m, \
         used: limits.cpu=600m, limited: limits.cpu=1"
    );
}

#[tokio::test]
async fn limit_range_defaults_and_bounds_containers() {
    let (_sim, client) = sim("limitrange").await;
    create(
        &client,
        "LimitRange",
        "limitranges",
        json!({
        "apiVersion": "v1", "kind": "LimitRange", "metadata": {"name": "lr"},
        "spec": {"limits": [{"type": "Container", "default": {"cpu": "500m"},
            "defaultRequest": {"cpu": "100m"}, "max": {"cpu": "1"}, "min": {"cpu": "50m"}}]}}),
    )
    .await
    .unwrap();
    let p = create(&client, "Pod", "pods", pod("bare", json!({})))
        .await
        .unwrap();
    assert_eq!(
        p.data.pointer("/spec/containers/0/resources").unwrap(),
        &json!({"limits": {"cpu": "500m"}, "requests": {"cpu": "100m"}})
    );
    let e = api_err(
        create(
            &client,
            "Pod",
            "pods",
            pod("big", json!({"limits": {"cpu": "2"}})),
        )
        .await,
    );
    assert_eq!(e.code, 403);
    assert_eq!(
        e.message,
        "pods \"big\" is forbidden: maximum cpu usage per Container is 1, but limit is 2"
    );
    let small = json!({"requests": {"cpu": "10m"}, "limits": {"cpu": "20m"}});
    let e = api_err(create(&client, "Pod", "pods", pod("small", small)).await);
    assert_eq!(
        e.message,
        "pods \"small\" is forbidden: minimum cpu usage per Container is 50m, but request is 10m"
    );
}

/// Usage is counted and admitted under the create's own write lock: many
/// concurrent creates against the last slots are admitted exactly up to the
/// quota, never past it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn concurrent_creates_cannot_both_take_the_last_slot() {
    let (_sim, client) = sim("quota-race").await;
    create(
        &client,
        "ResourceQuota",
        "resourcequotas",
        json!({"apiVersion": "v1", "kind": "ResourceQuota", "metadata": {"name": "maps"},
               "spec": {"hard": {"configmaps": "3"}}}),
    )
    .await
    .unwrap();
    let maps = api(&client, "ConfigMap", "configmaps");
    for round in 0..5 {
        let tries = (0..24).map(|i| {
            let client = client.clone();
            let body = json!({"apiVersion": "v1", "kind": "ConfigMap",
                              "metadata": {"name": format!("m{round}-{i}")}, "data": {"k": "v"}});
            tokio::spawn(async move { create(&client, "ConfigMap", "configmaps", body).await })
        });
        let mut admitted = 0;
        for r in futures::future::join_all(tries).await {
            match r.unwrap() {
                Ok(_) => admitted += 1,
                refused => {
                    let s = api_err(refused);
                    assert_eq!(s.code, 403, "{}", s.message);
                    assert!(s.message.contains("exceeded quota: maps"), "{}", s.message);
                }
            }
        }
        assert_eq!(admitted, 3, "round {round}: exactly the quota's three");
        assert_eq!(maps.list(&Default::default()).await.unwrap().items.len(), 3);
        maps.delete_collection(&DeleteParams::default(), &Default::default())
            .await
            .unwrap();
    }
}
