//! More acceptance tests of the PostgresCluster controller (split from
//! `controller.rs` by concern): what an operator reads and turns — the
//! printer columns of `kubectl get pgc`, the paused annotation, parameter
//! changes reloaded or recorded as pending a restart. Same setup: a whole
//! manager against the embedded Kubernetes, virtual kubelet runtime.

#![allow(clippy::unwrap_used)]

use crate::common;
use crate::controller::{M, spec};
use common::fleet;
use fleet::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::{Api, ResourceExt};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

/// Parses `kubectl get` output by the header's column positions (values
/// may be empty or contain spaces only where headers do).
fn parse_table(out: &str) -> Vec<BTreeMap<String, String>> {
    let mut lines = out.lines();
    let header = lines.next().unwrap_or_default();
    let mut starts = vec![];
    let mut prev_space = true;
    for (i, ch) in header.char_indices() {
        // Column titles are separated by at least two spaces ("LAST BACKUP").
        if !ch.is_whitespace() && prev_space && (i == 0 || header[..i].ends_with("  ")) {
            starts.push(i);
        }
        prev_space = ch.is_whitespace();
    }
    let cell = |line: &str, k: usize| {
        let end = starts.get(k + 1).copied().unwrap_or(usize::MAX);
        let start = starts[k].min(line.len());
        line[start..end.min(line.len())].trim().to_string()
    };
    let titles: Vec<String> = (0..starts.len()).map(|k| cell(header, k)).collect();
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            titles
                .iter()
                .enumerate()
                .map(|(k, t)| (t.clone(), cell(l, k)))
                .collect()
        })
        .collect()
}

fn kubectl(kubeconfig: &std::path::Path, args: &[&str]) -> String {
    let out = std::process::Command::new("/usr/bin/kubectl")
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(args)
        .output()
        .expect("running /usr/bin/kubectl");
    assert!(
        out.status.success(),
        "kubectl {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_get_pgc_shows_the_printer_columns() {
    let f = TestFleet::start("kubectl", &[M]).await;
    f.create(M, "shop", "orders", spec(3)).await;
    let mut other = spec(1);
    other["version"] = json!("18");
    f.create(M, "analytics", "events", other).await;
    f.wait_healthy(M, "shop", "orders", 3).await;
    f.wait_healthy(M, "analytics", "events", 1).await;

    let kc = f.kubeconfig(M);
    let out = tokio::task::spawn_blocking(move || kubectl(&kc, &["get", "pgc", "-A"]))
        .await
        .unwrap();
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    let pos = |t: &str| {
        header
            .iter()
            .position(|h| *h == t)
            .unwrap_or_else(|| panic!("column {t} in {header:?}"))
    };
    assert!(
        pos("NAMESPACE") < pos("NAME")
            && pos("NAME") < pos("SIZE")
            && pos("SIZE") < pos("READY")
            && pos("READY") < pos("PRIMARY")
            && pos("PRIMARY") < pos("VERSION")
            && pos("VERSION") < pos("PHASE")
            && pos("PHASE") < pos("AGE"),
        "{out}"
    );
    let rows = parse_table(&out);
    assert_eq!(rows.len(), 2, "{out}");
    let row = |name: &str| {
        rows.iter()
            .find(|r| r["NAME"] == name)
            .unwrap_or_else(|| panic!("row {name} in\n{out}"))
    };
    let orders = row("orders");
    assert_eq!(orders["NAMESPACE"], "shop", "{out}");
    assert_eq!(orders["SIZE"], "3", "{out}");
    assert_eq!(orders["READY"], "3", "{out}");
    assert_eq!(orders["PRIMARY"], "orders-1", "{out}");
    assert_eq!(orders["VERSION"], "15.20", "{out}");
    assert_eq!(orders["PHASE"], "Healthy", "{out}");
    let events = row("events");
    assert_eq!(events["NAMESPACE"], "analytics", "{out}");
    assert_eq!(events["SIZE"], "1", "{out}");
    assert_eq!(events["READY"], "1", "{out}");
    assert_eq!(events["PRIMARY"], "events-1", "{out}");
    assert_eq!(events["VERSION"], "18", "{out}");
    assert_eq!(events["PHASE"], "Healthy", "{out}");

    // The other short name, one namespace.
    let kc = f.kubeconfig(M);
    let out = tokio::task::spawn_blocking(move || {
        kubectl(&kc, &["get", "pgcluster", "-n", "shop", "orders"])
    })
    .await
    .unwrap();
    let rows = parse_table(&out);
    assert_eq!(rows.len(), 1, "{out}");
    assert_eq!(rows[0]["PHASE"], "Healthy", "{out}");
    assert_eq!(rows[0]["PRIMARY"], "orders-1", "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn paused_annotation_stops_reconciling_one_object() {
    let f = TestFleet::start("paused", &[M]).await;
    let client = f.client(M);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    f.create(M, "shop", "orders", spec(2)).await;
    f.create(M, "shop", "other", spec(1)).await;
    f.wait_healthy(M, "shop", "orders", 2).await;
    f.wait_healthy(M, "shop", "other", 1).await;
    let before = uids(&instance_pods(&pods, "orders").await);

    f.patch(
        M,
        "shop",
        "orders",
        json!({"metadata": {"annotations": {"pgfleet.io/paused": "true"}}}),
    )
    .await;
    let pg = f
        .patch(M, "shop", "orders", json!({"spec": {"clusterSize": 3}}))
        .await;
    let generation = pg.metadata.generation.unwrap();
    let old_generation = pg.status.as_ref().unwrap().observed_generation;

    // Make sure the controller has seen the paused, scaled object: wait for
    // its cache to hold the new generation, then for one more reconcile
    // triggered after that (a label change wakes it).
    let handle = f.handle(M).clone();
    eventually("the controller cache to hold the scaled object", || {
        let handle = handle.clone();
        async move {
            let cached: Vec<_> = handle
                .store
                .state()
                .iter()
                .filter(|p| p.name_any() == "orders")
                .map(|p| p.metadata.generation)
                .collect();
            if cached == [Some(generation)] {
                Ok(())
            } else {
                Err(format!("{cached:?}"))
            }
        }
    })
    .await;
    let baseline = handle.stats.reconciles.load(Ordering::Relaxed);
    f.patch(
        M,
        "shop",
        "orders",
        json!({"metadata": {"labels": {"poke": "1"}}}),
    )
    .await;
    eventually("a reconcile after the pause", || {
        let handle = handle.clone();
        async move {
            let n = handle.stats.reconciles.load(Ordering::Relaxed);
            if n > baseline {
                Ok(())
            } else {
                Err(format!("reconciles {n}"))
            }
        }
    })
    .await;
    // Watch for a while: nothing moves.
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        let pg = f.pgc(M, "shop").get("orders").await.unwrap();
        let st = pg.status.clone().unwrap();
        assert_eq!(st.observed_generation, old_generation, "paused: no status");
        assert_eq!(st.ready_instances, 2);
        let now = uids(&instance_pods(&pods, "orders").await);
        assert_eq!(now, before, "paused: no pods created or replaced");
        let kids = child_names(&client, "shop", "orders").await;
        assert_eq!(kids.pvcs, instance_names("orders", &[1, 2]), "no PVC");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // The other object in the same member is still reconciled.
    f.patch(M, "shop", "other", json!({"spec": {"clusterSize": 2}}))
        .await;
    f.wait_healthy(M, "shop", "other", 2).await;

    f.patch(
        M,
        "shop",
        "orders",
        json!({"metadata": {"annotations": {"pgfleet.io/paused": null}}}),
    )
    .await;
    f.wait_healthy(M, "shop", "orders", 3).await;
    let after = uids(&instance_pods(&pods, "orders").await);
    for (n, uid) in &before {
        assert_eq!(&after[n], uid);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameter_changes_are_reloaded_or_recorded_as_pending_restart() {
    let f = TestFleet::start("params", &[M]).await;
    let client = f.client(M);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let mut s = spec(2);
    s["postgresql"] = json!({"parameters": {"work_mem": "4MB"}});
    f.create(M, "shop", "orders", s).await;
    f.wait_healthy(M, "shop", "orders", 2).await;
    let before = uids(&instance_pods(&pods, "orders").await);
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "shop");

    // Reload-only: the ConfigMap changes and the instances are reloaded.
    f.patch(
        M,
        "shop",
        "orders",
        json!({"spec": {"postgresql": {"parameters": {"work_mem": "8MB"}}}}),
    )
    .await;
    let note = eventually("a Reloaded event naming work_mem", || {
        let client = client.clone();
        async move {
            let evs = events_about(&client, "shop", "orders").await;
            evs.iter()
                .find(|(r, n)| r == "Reloaded" && n.contains("work_mem"))
                .map(|(_, n)| n.clone())
                .ok_or_else(|| format!("{evs:?}"))
        }
    })
    .await;
    assert!(note.contains("2 instances"), "{note}");
    let conf = cms.get("orders-config").await.unwrap().data.unwrap()["postgresql.conf"].clone();
    assert!(
        conf.lines()
            .any(|l| l.starts_with("work_mem") && l.contains("8MB")),
        "{conf}"
    );
    let pg = f.wait_healthy(M, "shop", "orders", 2).await;
    assert!(
        pg.status.as_ref().unwrap().pending_restart.is_empty(),
        "{:?}",
        pg.status
    );
    assert!(condition(&pg, "PendingRestart").is_none_or(|c| c.status != "True"));

    // Restart-requiring: recorded as pending, then a rolling restart applies
    // it to every instance and the pending list empties.
    f.patch(
        M,
        "shop",
        "orders",
        json!({"spec": {"postgresql": {"parameters": {"max_connections": "200"}}}}),
    )
    .await;
    let restarted = eventually("every instance restarted, nothing pending", || {
        let (api, pods) = (f.pgc(M, "shop"), pods.clone());
        let before = before.clone();
        async move {
            let pg = api.get("orders").await.map_err(|e| e.to_string())?;
            let st = pg.status.clone().unwrap_or_default();
            let now = uids(&instance_pods(&pods, "orders").await);
            let all_new = now.len() == 2 && now.values().all(|u| !before.values().any(|b| b == u));
            if st.pending_restart.is_empty()
                && all_new
                && st.phase == Some(pgfleet::crd::Phase::Healthy)
                && st.observed_generation == pg.metadata.generation
            {
                Ok(now)
            } else {
                Err(serde_json::to_string(&st).unwrap_or_default())
            }
        }
    })
    .await;
    let evs = events_about(&client, "shop", "orders").await;
    assert!(
        evs.iter()
            .any(|(r, n)| r == "PendingRestart" && n.contains("max_connections")),
        "{evs:?}"
    );
    let conf = cms.get("orders-config").await.unwrap().data.unwrap()["postgresql.conf"].clone();
    assert!(
        conf.lines()
            .any(|l| l.starts_with("max_connections") && l.contains("200")),
        "{conf}"
    );
    assert!(
        evs.iter()
            .filter(|(r, _)| r == "RestartingInstance")
            .count()
            >= 2,
        "{evs:?}"
    );
    assert_eq!(uids(&instance_pods(&pods, "orders").await), restarted);
}

/// A cluster that ran before pgfleet managed access (a primary in its
/// status, no `status.access`) keeps superuser network access: its first
/// access round marks it so, and a catalog round in the same reconcile
/// (here: a database was added meanwhile) keeps the mark instead of
/// writing it back to false.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_from_before_access_management_keeps_superuser_access() {
    let f = TestFleet::start("legacy", &[M]).await;
    f.create(M, "shop", "old", spec(1)).await;
    f.wait_healthy(M, "shop", "old", 1).await;
    let cm: Api<ConfigMap> = Api::namespaced(f.client(M), "shop");
    let before = format!("{:?}", cm.get("old-config").await.unwrap().data);
    assert!(before.contains("postgres 0.0.0.0/0 reject"), "{before}");
    let paused = |v: &str| json!({"metadata": {"annotations": {"pgfleet.io/paused": v}}});
    f.patch(M, "shop", "old", paused("true")).await;
    let api = f.pgc(M, "shop");
    let status = json!({"status": {"access": null}});
    api.patch_status(
        "old",
        &Default::default(),
        &kube::api::Patch::Merge(&status),
    )
    .await
    .unwrap();
    let dbs = json!({"spec": {"databases": [{"name": "reports", "owner": "app"}]}});
    let generation = f.patch(M, "shop", "old", dbs).await.metadata.generation;
    f.patch(M, "shop", "old", paused("false")).await;
    let access = eventually("the access round of the new generation", || {
        let api = api.clone();
        async move {
            let pg = api.get("old").await.map_err(|e| e.to_string())?;
            let a = pg.status.and_then(|s| s.access).ok_or("no status.access")?;
            match a.observed_generation == generation && a.primary.is_some() {
                true => Ok(a),
                false => Err(format!("{a:?}")),
            }
        }
    })
    .await;
    assert!(access.legacy_superuser_access, "{access:?}");
    let config = eventually("the configuration without the superuser reject", || {
        let cm = cm.clone();
        async move {
            let c = cm.get("old-config").await.map_err(|e| e.to_string())?;
            let text = format!("{:?}", c.data);
            match text.contains("postgres 0.0.0.0/0 reject") {
                true => Err(text),
                false => Ok(text),
            }
        }
    })
    .await;
    assert!(config.contains("hba"), "{config}");
}

/// The `<name>-app` Secret exists before the first instance runs (as with
/// CloudNativePG), so an application deployed with the cluster can mount
/// it at once: here the instance cannot even be scheduled (no node has the
/// label it asks for), and the Secret is there with a usable login, its
/// creation in the round's one `Created` Event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_app_secret_exists_before_the_first_instance_runs() {
    let f = TestFleet::start("early-app", &[M]).await;
    let mut s = spec(1);
    s["affinity"] = json!({"nodeSelector": {"pgfleet.test/none": "yes"}});
    f.create(M, "shop", "early", s).await;
    let secrets: Api<k8s_openapi::api::core::v1::Secret> = Api::namespaced(f.client(M), "shop");
    let secret = eventually("the app Secret", || {
        let secrets = secrets.clone();
        async move {
            secrets
                .get_opt("early-app")
                .await
                .map_err(|e| e.to_string())?
                .ok_or_else(|| "no early-app Secret yet".to_string())
        }
    })
    .await;
    let data = secret.data.unwrap_or_default();
    let key = |k: &str| String::from_utf8(data[k].0.clone()).unwrap();
    assert_eq!(key("username"), "app");
    assert!(!key("password").is_empty());
    assert!(
        key("uri").starts_with("postgresql://app:"),
        "{}",
        key("uri")
    );
    let client = f.client(M);
    let note = eventually("the round's Created Event naming the Secret", || {
        let client = client.clone();
        async move {
            let events = events_about(&client, "shop", "early").await;
            events
                .iter()
                .find(|(r, n)| r == "Created" && n.contains("Secret early-app"))
                .map(|(_, n)| n.clone())
                .ok_or_else(|| format!("{events:?}"))
        }
    })
    .await;
    assert!(note.contains("application credentials"), "{note}");
    // Whatever happened meanwhile, the instance never ran.
    let pods: Api<Pod> = Api::namespaced(client, "shop");
    let pod = pods.get("early-1").await.unwrap();
    let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
    assert_eq!(phase, "Pending", "the instance never ran");
}
