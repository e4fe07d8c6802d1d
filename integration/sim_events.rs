//! One Event in two groups (issue 18 item 1): the manager writes
//! `events.k8s.io/v1` Events, and kubectl — which reads core/v1 Events —
//! finds them in `describe`, `kubectl events --for`, field selectors and
//! `--sort-by=.lastTimestamp`; a core/v1 Event written by a client is seen in
//! `events.k8s.io/v1` (get, list with the group's field labels, watch), with
//! one resourceVersion sequence. Everything over real HTTP with kubectl and
//! a kube client.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::fleet::*;
use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Event as CoreEvent, Namespace};
use k8s_openapi::api::events::v1::Event;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams, WatchEvent, WatchParams};
use serde_json::{Value, json};
use std::path::{Path, PathBuf};

const M: &str = "member-1";

/// kubectl's (exit success, stdout, stderr).
fn kubectl(kubeconfig: &Path, args: &[&str]) -> (bool, String, String) {
    let out = std::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("running /usr/bin/kubectl");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Polls kubectl until its output contains `want`.
async fn kubectl_until(kc: &Path, args: &[&str], want: &str) -> String {
    let args: Vec<String> = args.iter().map(|s| s.to_string()).collect();
    eventually(&format!("kubectl {args:?} shows {want}"), || {
        let (kc, args, want) = (kc.to_path_buf(), args.clone(), want.to_string());
        async move {
            let out = tokio::task::spawn_blocking(move || {
                let a: Vec<&str> = args.iter().map(String::as_str).collect();
                kubectl(&kc, &a)
            })
            .await
            .unwrap();
            if out.0 && out.1.contains(&want) {
                Ok(out.1)
            } else {
                Err(format!("stdout:\n{}\nstderr:\n{}", out.1, out.2))
            }
        }
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_finds_the_events_the_manager_wrote() {
    let f = TestFleet::start("events", &[M]).await;
    f.create(
        M,
        "shop",
        "orders",
        json!({"clusterSize": 1, "version": "15.20", "storage": {"size": "1Gi"}}),
    )
    .await;
    f.wait_healthy(M, "shop", "orders", 1).await;
    let kc: PathBuf = f.kubeconfig(M);

    let described = kubectl_until(
        &kc,
        &["describe", "pgc", "-n", "shop", "orders"],
        "instance orders-1",
    )
    .await;
    let events_part = described.split("Events:").nth(1).unwrap_or_default();
    assert!(
        events_part.contains("Created") && !events_part.contains("<none>"),
        "{described}"
    );
    kubectl_until(
        &kc,
        &["events", "-n", "shop", "--for", "pgc/orders"],
        "instance orders-1",
    )
    .await;
    let selected = kubectl_until(
        &kc,
        &[
            "get",
            "events",
            "-n",
            "shop",
            "--field-selector",
            "involvedObject.name=orders",
        ],
        "postgrescluster/orders",
    )
    .await;
    let header: Vec<&str> = selected
        .lines()
        .next()
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        ["LAST", "SEEN", "TYPE", "REASON", "OBJECT", "MESSAGE"],
        "{selected}"
    );
    assert!(
        selected
            .lines()
            .skip(1)
            .all(|l| l.contains("postgrescluster/orders")),
        "only the cluster's Events:\n{selected}"
    );
    kubectl_until(
        &kc,
        &["get", "events", "-n", "shop", "--sort-by=.lastTimestamp"],
        "instance orders-1",
    )
    .await;

    // The stored Event in the core shape, as a real API server serves it.
    let (ok, json_out, err) = kubectl(
        &kc,
        &[
            "get",
            "events",
            "-n",
            "shop",
            "--field-selector",
            "reason=Created",
            "-o",
            "json",
        ],
    );
    assert!(ok, "{err}");
    let list: Value = serde_json::from_str(&json_out).unwrap();
    let item = &list["items"][0];
    assert_eq!(item["apiVersion"], "v1", "{item}");
    assert_eq!(item["involvedObject"]["kind"], "PostgresCluster", "{item}");
    assert!(
        item["message"].as_str().is_some_and(|m| !m.is_empty()),
        "{item}"
    );
    assert_eq!(item["source"], json!({}), "{item}");
    assert!(item.get("regarding").is_none(), "{item}");
}

async fn namespace(client: &kube::Client, ns: &str) {
    let _ = Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
        )
        .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_core_event_is_served_in_events_k8s_io() {
    let f = TestFleet::start("events-core", &[M]).await;
    let client = f.client(M);
    namespace(&client, "shop").await;
    let kc = f.kubeconfig(M);
    let v1: Api<Event> = Api::namespaced(client.clone(), "shop");
    let core: Api<CoreEvent> = Api::namespaced(client.clone(), "shop");

    // A watch in the events group, opened before the core write.
    let rv = v1
        .list(&ListParams::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut watch = v1
        .watch(&WatchParams::default(), &rv)
        .await
        .unwrap()
        .boxed();

    let manifest = kc.with_file_name("event.yaml");
    std::fs::write(
        &manifest,
        r#"apiVersion: v1
kind: Event
metadata: {name: orders.manual, namespace: shop}
involvedObject: {kind: PostgresCluster, name: orders, namespace: shop, apiVersion: pgfleet.io/v1}
reason: Manual
message: written by kubectl
type: Warning
count: 3
firstTimestamp: "2026-01-01T00:00:00Z"
lastTimestamp: "2026-01-01T00:05:00Z"
source: {component: kubectl, host: laptop}
"#,
    )
    .unwrap();
    let (ok, _, err) = kubectl(&kc, &["create", "-f", manifest.to_str().unwrap()]);
    assert!(ok, "{err}");

    let ev = v1.get("orders.manual").await.unwrap();
    assert_eq!(
        ev.regarding.as_ref().unwrap().name.as_deref(),
        Some("orders")
    );
    assert_eq!(ev.note.as_deref(), Some("written by kubectl"));
    assert_eq!(ev.deprecated_count, Some(3));
    let src = ev.deprecated_source.as_ref().unwrap();
    assert_eq!(
        (src.component.as_deref(), src.host.as_deref()),
        (Some("kubectl"), Some("laptop"))
    );
    assert!(ev.deprecated_last_timestamp.is_some());
    let seen = loop {
        match watch.try_next().await.unwrap().expect("watch open") {
            WatchEvent::Added(e) => break e,
            WatchEvent::Bookmark(_) => continue,
            other => panic!("unexpected {other:?}"),
        }
    };
    assert_eq!(seen.note.as_deref(), Some("written by kubectl"));
    assert_eq!(seen.metadata.resource_version, ev.metadata.resource_version);

    // The events group's field labels; the core ones are refused there.
    let by_regarding = v1
        .list(&ListParams::default().fields("regarding.name=orders,reportingController="))
        .await
        .unwrap();
    assert_eq!(by_regarding.items.len(), 1);
    let refused = v1
        .list(&ListParams::default().fields("involvedObject.name=orders"))
        .await
        .unwrap_err();
    assert!(
        matches!(&refused, kube::Error::Api(s) if s.code == 400 && s.message.contains("field label not supported: involvedObject.name")),
        "{refused:?}"
    );
    let by_source = core
        .list(&ListParams::default().fields("source=kubectl"))
        .await
        .unwrap();
    assert_eq!(by_source.items.len(), 1);

    // An update through the events group is a core update (one storage).
    let patched = v1
        .patch(
            "orders.manual",
            &PatchParams::default(),
            &Patch::Merge(json!({"note": "edited in events.k8s.io"})),
        )
        .await
        .unwrap();
    let c = core.get("orders.manual").await.unwrap();
    assert_eq!(c.message.as_deref(), Some("edited in events.k8s.io"));
    assert_eq!(
        c.metadata.resource_version,
        patched.metadata.resource_version
    );

    // The table of the events group has the core columns.
    let (ok, out, err) = kubectl(&kc, &["get", "events.v1.events.k8s.io", "-n", "shop"]);
    assert!(ok, "{err}");
    assert!(
        out.contains("postgrescluster/orders") && out.contains("edited in events.k8s.io"),
        "{out}"
    );

    // A missing Event named as the group names it.
    let missing = v1.get("nope").await.unwrap_err();
    assert!(
        matches!(&missing, kube::Error::Api(s) if s.code == 404 && s.message == "events.events.k8s.io \"nope\" not found"),
        "{missing:?}"
    );
    v1.delete("orders.manual", &Default::default())
        .await
        .unwrap();
    assert!(core.get_opt("orders.manual").await.unwrap().is_none());
}
