//! Validation like a real API server (issue 18 item 6): names per kind,
//! `generateName`, labels and annotations answered with kube's 422 `Invalid`
//! Status (causes with field paths); lists and watches at a resourceVersion
//! the server has not reached (504 `ResourceVersionTooLarge`); kubectl's
//! OpenAPI v2 (protobuf) fetch, so a kind without CRD is reported as kubectl
//! reports it against a real cluster. Over real HTTP, with a kube client and
//! kubectl.
#![allow(clippy::unwrap_used)]

mod support;

use futures::TryStreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::{Api, ListParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use support::*;

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// The (field, reason) pairs of a 422's causes.
fn causes(s: &kube::core::Status) -> Vec<(String, String)> {
    s.details
        .as_ref()
        .map(|d| {
            d.causes
                .iter()
                .map(|c| (c.field.clone(), c.reason.clone()))
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_labels_and_annotations_are_validated_like_kube() {
    let s = start("validation-names").await;
    let client = s.client().await;
    let pp = PostParams::default();
    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let long = "a".repeat(70);

    // Services are DNS-1035 labels: 63 characters at most.
    let err = api_err(
        svcs.create(
            &pp,
            &obj(json!({"metadata": {"name": long}, "spec": {"ports": [{"port": 80}]}})),
        )
        .await,
    );
    assert_eq!((err.code, err.reason.as_str()), (422, "Invalid"), "{err:?}");
    assert!(
        err.message
            .contains("metadata.name: Invalid value: \"aaaaaaaaaa")
            && err.message.contains("must be no more than 63 characters"),
        "{err:?}"
    );
    assert_eq!(
        causes(&err),
        [("metadata.name".into(), "FieldValueInvalid".into())]
    );
    // ... while a ConfigMap name is a DNS-1123 subdomain (253).
    cms.create(&pp, &obj(json!({"metadata": {"name": long}})))
        .await
        .unwrap();

    // generateName: kube's 5-character suffix, the prefix cut to 58.
    let made = cms
        .create(&pp, &obj(json!({"metadata": {"generateName": "web-"}})))
        .await
        .unwrap();
    let name = made.metadata.name.unwrap();
    assert!(
        name.len() == 9
            && name.starts_with("web-")
            && name[4..]
                .bytes()
                .all(|b| b"bcdfghjklmnpqrstvwxz2456789".contains(&b)),
        "{name}"
    );
    let made = cms
        .create(
            &pp,
            &obj(json!({"metadata": {"generateName": format!("{long}-")}})),
        )
        .await
        .unwrap();
    assert_eq!(made.metadata.name.unwrap().len(), 63);
    let err = api_err(
        cms.create(&pp, &obj(json!({"metadata": {"generateName": "Web-"}})))
            .await,
    );
    assert_eq!(err.code, 422, "{err:?}");
    assert!(
        causes(&err).contains(&("metadata.generateName".into(), "FieldValueInvalid".into())),
        "{err:?}"
    );

    // Labels: key syntax and value length; annotations: 256 KiB in total.
    let err = api_err(
        cms.create(
            &pp,
            &obj(json!({"metadata": {"name": "labelled",
                "labels": {"bad key": "v", "ok": "x".repeat(64)}}})),
        )
        .await,
    );
    assert_eq!(err.code, 422, "{err:?}");
    assert_eq!(causes(&err).len(), 2, "{err:?}");
    assert!(
        err.message.contains("must be no more than 63 characters"),
        "{err:?}"
    );
    let err = api_err(
        cms.create(
            &pp,
            &obj(json!({"metadata": {"name": "annotated",
                "annotations": {"a": "x".repeat(200 * 1024), "b": "y".repeat(60 * 1024)}}})),
        )
        .await,
    );
    assert_eq!(err.code, 422, "{err:?}");
    assert_eq!(
        causes(&err),
        [("metadata.annotations".into(), "FieldValueTooLong".into())]
    );
    assert!(
        err.message
            .ends_with("metadata.annotations: Too long: may not be more than 262144 bytes"),
        "{err:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_resource_version_from_the_future_is_too_large() {
    let s = start("validation-rv").await;
    let client = client_without_retries(s.kubeconfig()).await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let current: u64 = cms
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap()
        .parse()
        .unwrap();
    let future = (current + 1000).to_string();

    let lp = ListParams::default()
        .at(&future)
        .matching(kube::api::VersionMatch::NotOlderThan);
    let err = api_err(cms.list(&lp).await);
    assert_eq!((err.code, err.reason.as_str()), (504, "Timeout"), "{err:?}");
    // `current` may have moved on (the sim's own controllers write too).
    assert!(
        err.message.starts_with(&format!(
            "Timeout: Too large resource version: {future}, current: "
        )),
        "{err:?}"
    );
    let d = err.details.as_ref().unwrap();
    assert_eq!(d.causes[0].reason, "ResourceVersionTooLarge", "{err:?}");
    assert_eq!(d.retry_after_seconds, 1, "{err:?}");

    // A watch is accepted and ends with the same Status as its ERROR event.
    let mut w = Box::pin(cms.watch(&WatchParams::default(), &future).await.unwrap());
    match w.try_next().await.unwrap() {
        Some(WatchEvent::Error(e)) => {
            assert_eq!((e.code, e.reason.as_str()), (504, "Timeout"), "{e:?}");
            assert!(e.message.contains("Too large resource version"), "{e:?}");
        }
        other => panic!("expected an ERROR event, got {other:?}"),
    }

    // A revision the server reaches within the wait is served.
    let next = (current + 1).to_string();
    let writer = cms.clone();
    let write = tokio::spawn(async move {
        tokio::time::sleep(std::time::Duration::from_millis(300)).await;
        writer
            .create(
                &PostParams::default(),
                &obj(json!({"metadata": {"name": "late"}})),
            )
            .await
            .unwrap();
    });
    let lp = ListParams::default()
        .at(&next)
        .matching(kube::api::VersionMatch::NotOlderThan);
    let list = cms.list(&lp).await.unwrap();
    write.await.unwrap();
    assert!(
        list.items
            .iter()
            .any(|c| c.metadata.name.as_deref() == Some("late"))
    );
}

#[test]
fn kubectl_reports_a_kind_without_crd_as_against_a_real_cluster() {
    let s = TestSim::start_blocking(options(&temp_dir("validation-openapi"), false));
    let manifest = s.kubeconfig().with_file_name("servicemonitor.yaml");
    std::fs::write(
        &manifest,
        "apiVersion: monitoring.coreos.com/v1\nkind: ServiceMonitor\nmetadata: {name: m, namespace: default}\nspec: {}\n",
    )
    .unwrap();
    let out = std::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(s.kubeconfig())
        .arg("--cache-dir")
        .arg(s.kubeconfig().with_file_name("kubectl-cache"))
        .args(["apply", "-f"])
        .arg(&manifest)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(
            "no matches for kind \"ServiceMonitor\" in version \"monitoring.coreos.com/v1\""
        ) && err.contains("ensure CRDs are installed first")
            && !err.contains("proto:"),
        "{err}"
    );
}
