//! pgfleet's Pods pass Pod Security "restricted" (issue 19, finding 10): in
//! a tenant namespace labelled `pod-security.kubernetes.io/enforce:
//! restricted` the manager's database and pooler Pods are admitted and the
//! cluster becomes Healthy, while a Pod that breaks the level is refused
//! with kube's 403. Outcomes only; nothing is timed.
#![allow(clippy::unwrap_used)]

use crate::common::fleet;

use fleet::*;
use k8s_openapi::api::core::v1::{Namespace, Pod};
use kube::api::PostParams;
use kube::{Api, ResourceExt};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn database_and_pooler_pods_run_in_a_restricted_namespace() {
    let f = TestFleet::start("tenancy-pods", &["member-1"]).await;
    let client = f.client("member-1");
    let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "tenant",
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
    .unwrap();
    Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
        .unwrap();
    let spec = json!({"clusterSize": 2, "version": "15.18", "storage": {"size": "1Gi"},
                      "pooler": {"enabled": true}});
    f.create("member-1", "tenant", "orders", spec).await;
    // (`wait_healthy` counts the pooler Pods as instances.)
    let pgs = f.pgc("member-1", "tenant");
    eventually("orders Healthy with 2 ready instances", || {
        let pgs = pgs.clone();
        async move {
            let pg = pgs.get("orders").await.map_err(|e| e.to_string())?;
            let st = pg.status.unwrap_or_default();
            match st.phase == Some(pgfleet::crd::Phase::Healthy) && st.ready_instances == 2 {
                true => Ok(()),
                false => Err(format!("{st:?}")),
            }
        }
    })
    .await;

    let pods: Api<Pod> = Api::namespaced(client.clone(), "tenant");
    let pooler = eventually("the pooler pod Ready", || {
        let pods = pods.clone();
        async move {
            let p = pods
                .get_opt("orders-pooler-1")
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "no pooler pod yet".to_string())?;
            let ready = p
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if ready {
                Ok(p)
            } else {
                Err(format!("{:?}", p.status))
            }
        }
    })
    .await;
    let instances: Vec<Pod> = instance_pods(&pods, "orders")
        .await
        .into_values()
        .filter(|p| p.labels().get("pgfleet.io/kind").map(String::as_str) == Some("instance"))
        .collect();
    assert_eq!(instances.len(), 2);
    for p in instances.iter().chain([&pooler]) {
        let spec = p.spec.as_ref().unwrap();
        assert_eq!(spec.automount_service_account_token, Some(false));
        let psc = spec.security_context.as_ref().unwrap();
        assert_eq!(psc.run_as_non_root, Some(true));
        assert_eq!(psc.run_as_user, Some(999));
        let c = spec.containers[0].security_context.as_ref().unwrap();
        assert_eq!(c.allow_privilege_escalation, Some(false));
        assert_eq!(
            c.capabilities.as_ref().unwrap().drop,
            Some(vec!["ALL".to_string()])
        );
    }

    // The same namespace refuses a Pod that does not pass.
    let bad: Pod = serde_json::from_value(json!({"metadata": {"name": "debug"},
        "spec": {"containers": [{"name": "shell", "image": "postgres:15.18",
            "securityContext": {"runAsUser": 0}}]}}))
    .unwrap();
    let err = match pods.create(&PostParams::default(), &bad).await {
        Err(kube::Error::Api(e)) => e,
        other => panic!("the violating pod was not refused: {other:?}"),
    };
    assert_eq!(err.code, 403);
    assert!(
        err.message.starts_with(
            "pods \"debug\" is forbidden: violates PodSecurity \"restricted:latest\": "
        ) && err
            .message
            .contains("runAsUser=0 (container \"shell\" must not set runAsUser=0)"),
        "{err:?}"
    );
    assert!(pods.get_opt("debug").await.unwrap().is_none());
}
