//! OpenTelemetry traces of a real `pgfleet run` process: an OTLP/HTTP
//! receiver inside the test decodes what the manager exports (the real
//! protobuf, `opentelemetry-proto`), while the manager rolls a version out
//! over two of its three embedded member clusters.
//!
//! Asserted: one trace carries spans of both member clusters the rollout
//! touched, every span of it has its parent in the same trace and leads to
//! one root; reconcile spans carry cluster, namespace, name and shard; no
//! attribute anywhere holds a seeded secret (the API token, a Secret's
//! password, a generated superuser password).
#![allow(clippy::unwrap_used)]

use crate::common;
use common::fleet;
use common::otlp as receiver;

use base64::Engine as _;
use fleet::{TestFleet, client_from, eventually, eventually_within, pgc_object, temp_dir};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::PostParams;
use opentelemetry_proto::tonic::trace::v1::Span;
use pgfleet::crd::PostgresCluster;
use receiver::{Flat, Received, all_values, attr, spans};
use serde_json::json;
use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use tokio::io::{AsyncBufReadExt, BufReader};

const API_TOKEN: &str = "seeded-api-token-7f3c9e1d2b-4a6c8e0f1b3d";
const PASSWORD: &str = "seeded-secret-password-4a8b6c";
const MEMBERS: [&str; 3] = ["east", "west", "north"];
/// A rolling update of two instances per cluster on a shared machine.
const ROLLOUT_PATIENCE: std::time::Duration = std::time::Duration::from_secs(240);

/// Writes the fleet config: three embedded members, a rollout over the
/// first two (waves 0 and 1) for PostgresClusters labelled `app=otlp`.
fn config(dir: &std::path::Path, port: u16) -> PathBuf {
    let mut toml = format!(
        r#"[manager]
state_dir = "{}"
probe_interval = "500ms"
probe_timeout = "500ms"
api_token = "{API_TOKEN}"

[telemetry]
otlp_endpoint = "http://127.0.0.1:{port}"
log_format = "text"
"#,
        dir.join("state").display()
    );
    for (i, m) in MEMBERS.iter().enumerate() {
        toml.push_str(&format!(
            "\n[[clusters]]\nname = \"{m}\"\nembedded = true\nlabels = {{ wave = \"{i}\" }}\n"
        ));
    }
    toml.push_str(
        r#"
[rollouts.x]
target_version = "15.20"
progress_deadline = "24h"
[[rollouts.x.stages]]
name = "all"
clusters = "wave!=2"
postgresclusters = "app=otlp"
max_concurrency = 2
"#,
    );
    let path = dir.join("fleet.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

/// Runs `pgfleet run` on `cfg` (stderr to `<tag>.log` in `dir`); returns the
/// process and the kubeconfigs of the embedded clusters it printed.
async fn manager(
    cfg: &std::path::Path,
    dir: &std::path::Path,
    tag: &str,
) -> (tokio::process::Child, BTreeMap<String, PathBuf>) {
    let stderr = std::fs::File::create(dir.join(format!("{tag}.log"))).unwrap();
    let mut child = tokio::process::Command::new(env!("CARGO_BIN_EXE_pgfleet"))
        .args(["run", "--config"])
        .arg(cfg)
        .current_dir(dir)
        .env_remove("RUST_LOG")
        .env_remove("PGFLEET_LOG")
        .env("OTEL_BSP_SCHEDULE_DELAY", "300")
        .stdout(std::process::Stdio::piped())
        .stderr(stderr)
        .kill_on_drop(true)
        .spawn()
        .unwrap();
    // "embedded cluster NAME https://ADDR  kubectl --kubeconfig PATH"
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    let mut kubeconfigs: BTreeMap<String, PathBuf> = BTreeMap::new();
    while kubeconfigs.len() < MEMBERS.len() {
        let line = tokio::time::timeout(fleet::PATIENCE, lines.next_line())
            .await
            .expect("the manager printing its embedded clusters")
            .unwrap()
            .expect("the manager exited early (see its log in the test dir)");
        let words: Vec<&str> = line.split_whitespace().collect();
        if words.first() == Some(&"embedded") {
            kubeconfigs.insert(words[2].to_string(), PathBuf::from(words[words.len() - 1]));
        }
    }
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    (child, kubeconfigs)
}

/// Stops a manager as an operator would (SIGINT: it flushes its spans).
async fn stop(mut child: tokio::process::Child) {
    let _ = std::process::Command::new("kill")
        .args(["-INT", &child.id().unwrap_or_default().to_string()])
        .status();
    let _ = tokio::time::timeout(std::time::Duration::from_secs(20), child.wait()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rollout_is_one_trace_across_the_clusters_it_touched() {
    let dir = temp_dir("otlp");
    let (port, store) = receiver::start().await;

    let cfg = config(&dir, port);
    let (child, kubeconfigs) = manager(&cfg, &dir, "first").await;

    let touched = &MEMBERS[..2];
    for m in touched {
        let client = client_from(&kubeconfigs[*m]).await;
        let pgcs: Api<PostgresCluster> = Api::namespaced(client.clone(), "db");
        eventually(&format!("the PostgresCluster kind served in {m}"), || {
            let pgcs = pgcs.clone();
            async move {
                pgcs.list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())
            }
        })
        .await;
        let ns: Namespace = serde_json::from_value(json!({"metadata": {"name": "db"}})).unwrap();
        let _ = Api::<Namespace>::all(client.clone())
            .create(&PostParams::default(), &ns)
            .await;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "app-credentials"},
            "data": {"password": base64::engine::general_purpose::STANDARD.encode(PASSWORD)},
        }))
        .unwrap();
        Api::<Secret>::namespaced(client.clone(), "db")
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
        let mut pg = pgc_object(
            "pg0",
            json!({"clusterSize": 2, "version": "15.18", "storage": {"size": "1Gi"},
                "enableSuperuserAccess": true}),
        );
        pg.metadata.labels = Some([("app".to_string(), "otlp".to_string())].into());
        pgcs.create(&PostParams::default(), &pg).await.unwrap();
    }

    // The rollout finishes both, and its spans of both members arrive.
    for m in touched {
        let pgcs: Api<PostgresCluster> = Api::namespaced(client_from(&kubeconfigs[*m]).await, "db");
        let what = format!("pg0 in {m} updated to 15.20 and Healthy");
        eventually_within(ROLLOUT_PATIENCE, &what, || {
            let pgcs = pgcs.clone();
            async move {
                let pg = pgcs.get("pg0").await.map_err(|e| e.to_string())?;
                let st = pg.status.unwrap_or_default();
                let done = st.current_version.as_deref() == Some("15.20")
                    && st.phase == Some(pgfleet::crd::Phase::Healthy);
                match done {
                    true => Ok(()),
                    false => Err(format!("{:?} {:?}", st.current_version, st.phase)),
                }
            }
        })
        .await;
    }
    let finished = |s: &Received| -> BTreeSet<String> {
        spans(s)
            .iter()
            .filter(|f| f.span.name == "rollout.finish")
            .filter_map(|f| attr(&f.span, "cluster"))
            .collect()
    };
    eventually("rollout.finish spans of both touched members", || {
        let got = finished(&store);
        async move {
            match got.len() >= 2 {
                true => Ok(()),
                false => Err(format!("finished in {got:?}")),
            }
        }
    })
    .await;

    let all = spans(&store);
    // One trace covers both member clusters.
    let mut by_trace: BTreeMap<Vec<u8>, Vec<&Flat>> = BTreeMap::new();
    for f in &all {
        by_trace.entry(f.span.trace_id.clone()).or_default().push(f);
    }
    let (trace_id, trace) = by_trace
        .iter()
        .find(|(_, spans)| {
            let clusters: BTreeSet<String> = spans
                .iter()
                .filter_map(|f| attr(&f.span, "cluster"))
                .collect();
            touched.iter().all(|m| clusters.contains(*m))
        })
        .unwrap_or_else(|| {
            let names: Vec<_> = all.iter().map(|f| f.span.name.clone()).collect();
            panic!("no trace spans both {touched:?}; spans seen: {names:?}")
        });
    let ids: BTreeMap<&Vec<u8>, &Span> = trace.iter().map(|f| (&f.span.span_id, &f.span)).collect();
    let roots: Vec<&&Flat> = trace
        .iter()
        .filter(|f| f.span.parent_span_id.is_empty())
        .collect();
    assert_eq!(roots.len(), 1, "one root in trace {trace_id:?}");
    assert_eq!(roots[0].span.name, "rollout");
    let root_id = roots[0].span.span_id.clone();
    assert_eq!(attr(&roots[0].span, "rollout").as_deref(), Some("x"));
    for f in trace {
        let mut s = &f.span;
        let mut hops = 0;
        while !s.parent_span_id.is_empty() {
            s = ids.get(&s.parent_span_id).unwrap_or_else(|| {
                panic!(
                    "span {} has a parent outside its trace (or one never exported)",
                    f.span.name
                )
            });
            hops += 1;
            assert!(hops < 64, "a parent cycle at {}", f.span.name);
        }
        assert_eq!(
            s.span_id, roots[0].span.span_id,
            "{} reaches the root",
            f.span.name
        );
    }
    for m in touched {
        for op in ["rollout.start", "rollout.finish", "rollout.wait"] {
            assert!(
                trace
                    .iter()
                    .any(|f| f.span.name == op && attr(&f.span, "cluster").as_deref() == Some(*m)),
                "a {op} span for {m} in the rollout's trace"
            );
        }
    }

    // The root's context is stored with the rollout's control, so a
    // restarted manager parents its spans on the same trace.
    let control: Api<k8s_openapi::api::core::v1::ConfigMap> = Api::namespaced(
        client_from(&kubeconfigs[touched[0]]).await,
        "pgfleet-system",
    );
    let stored = control
        .get("pgfleet-rollout-x")
        .await
        .unwrap()
        .data
        .and_then(|d| d.get("traceparent").cloned())
        .expect("a traceparent in the rollout's control ConfigMap");
    let hex: String = trace_id.iter().map(|b| format!("{b:02x}")).collect();
    assert_eq!(stored.split('-').nth(1), Some(hex.as_str()), "{stored}");

    // A rolling update that switched over left a trace of its switchover,
    // linked to the reconcile that ran it.
    for m in touched {
        let pgcs: Api<PostgresCluster> = Api::namespaced(client_from(&kubeconfigs[*m]).await, "db");
        let switched = pgcs
            .get("pg0")
            .await
            .unwrap()
            .status
            .and_then(|s| s.last_switchover);
        if switched.is_none() {
            continue;
        }
        let span = eventually(&format!("a switchover span of {m}"), || {
            let found = spans(&store).into_iter().find(|f| {
                f.span.name == "switchover" && attr(&f.span, "cluster").as_deref() == Some(*m)
            });
            async move { found.ok_or("none yet") }
        })
        .await;
        assert!(
            span.span.parent_span_id.is_empty(),
            "a switchover is a root"
        );
        for key in ["namespace", "name", "from", "to"] {
            assert!(
                attr(&span.span, key).is_some(),
                "switchover span without {key}"
            );
        }
    }

    // On-demand backups: the dispatcher round that starts one is a
    // `backup.sweep` trace with a `backup` span per job and its cluster.
    for m in touched {
        let backups: Api<pgfleet::crd::PostgresBackup> =
            Api::namespaced(client_from(&kubeconfigs[*m]).await, "db");
        let record = serde_json::from_value(json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
            "metadata": {"name": "now"},
            "spec": {"cluster": "pg0", "trigger": "manual"},
        }))
        .unwrap();
        backups
            .create(&PostParams::default(), &record)
            .await
            .unwrap();
    }
    for m in touched {
        eventually(&format!("a backup span of {m} under its sweep"), || {
            let all = spans(&store);
            let found = all.iter().any(|f| {
                f.span.name == "backup"
                    && attr(&f.span, "cluster").as_deref() == Some(*m)
                    && attr(&f.span, "backup").as_deref() == Some("now")
                    && all.iter().any(|p| {
                        p.span.name == "backup.sweep"
                            && p.span.span_id == f.span.parent_span_id
                            && p.span.trace_id == f.span.trace_id
                            && p.span.parent_span_id.is_empty()
                    })
            });
            async move { if found { Ok(()) } else { Err("none yet") } }
        })
        .await;
    }

    // Reconcile spans carry cluster, namespace, name and shard.
    let reconciles: Vec<&Flat> = all.iter().filter(|f| f.span.name == "reconcile").collect();
    assert!(!reconciles.is_empty(), "reconcile spans exported");
    for f in &reconciles {
        for key in ["cluster", "namespace", "name", "shard"] {
            assert!(
                attr(&f.span, key).is_some(),
                "reconcile span without {key}: {f:?}"
            );
        }
    }
    let reconciled: BTreeSet<(String, String, String)> = reconciles
        .iter()
        .map(|f| {
            (
                attr(&f.span, "cluster").unwrap(),
                attr(&f.span, "namespace").unwrap(),
                attr(&f.span, "name").unwrap(),
            )
        })
        .collect();
    for m in touched {
        assert!(reconciled.contains(&(m.to_string(), "db".into(), "pg0".into())));
    }

    // No seeded or generated secret in any attribute.
    let client = client_from(&kubeconfigs[touched[0]]).await;
    let generated = Api::<Secret>::namespaced(client, "db")
        .get("pg0-superuser")
        .await
        .ok()
        .and_then(|s| s.data)
        .and_then(|d| d.get("password").cloned())
        .map(|b| String::from_utf8_lossy(&b.0).to_string());
    let mut secrets = vec![
        API_TOKEN.to_string(),
        PASSWORD.to_string(),
        base64::engine::general_purpose::STANDARD.encode(PASSWORD),
    ];
    secrets.extend(generated.filter(|p| p.len() >= 8));
    for f in &all {
        for v in all_values(f) {
            for s in &secrets {
                assert!(
                    !v.contains(s.as_str()),
                    "a secret in span {}: {v}",
                    f.span.name
                );
            }
        }
    }

    stop(child).await;

    // A new manager (the same state) parents the rollout's later work on
    // the stored root: a PostgresCluster added now joins the same trace.
    let (child, kubeconfigs) = manager(&cfg, &dir, "second").await;
    let west = client_from(&kubeconfigs[touched[1]]).await;
    let pgcs: Api<PostgresCluster> = Api::namespaced(west, "db");
    let mut pg = pgc_object(
        "pg1",
        json!({"clusterSize": 1, "version": "15.18", "storage": {"size": "1Gi"}}),
    );
    pg.metadata.labels = Some([("app".to_string(), "otlp".to_string())].into());
    eventually("creating pg1 through the second manager's cluster", || {
        let (pgcs, pg) = (pgcs.clone(), pg.clone());
        async move {
            pgcs.create(&PostParams::default(), &pg)
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
    let later = eventually_within(ROLLOUT_PATIENCE, "rollout.finish of pg1", || {
        let found = spans(&store).into_iter().find(|f| {
            f.span.name == "rollout.finish" && attr(&f.span, "name").as_deref() == Some("pg1")
        });
        async move { found.ok_or("none yet") }
    })
    .await;
    assert_eq!(
        &later.span.trace_id, trace_id,
        "pg1's finish joins the rollout's trace"
    );
    assert_eq!(
        &later.span.parent_span_id, &root_id,
        "parented on the stored root"
    );
    stop(child).await;

    for tag in ["first", "second"] {
        let logs = std::fs::read_to_string(dir.join(format!("{tag}.log"))).unwrap_or_default();
        for s in &secrets {
            assert!(
                !logs.contains(s.as_str()),
                "a secret in the {tag} manager's log"
            );
        }
    }
    let _ = std::fs::remove_dir_all(&dir);
}

/// The in-process manager's `/metrics` page names every member: its
/// connectivity and its reconcile series (present from the start, at zero).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_carry_reconcile_and_connectivity_series_for_each_member() {
    let members = ["metrics-a", "metrics-b"];
    let _f = TestFleet::start("metrics", &members).await;
    for m in members {
        let up = format!("pgfleet_cluster_up{{cluster=\"{m}\"}} 1");
        let reconcile = format!("pgfleet_reconcile_duration_seconds_count{{cluster=\"{m}\"}}");
        let errors = format!("pgfleet_reconcile_errors_total{{cluster=\"{m}\",category=");
        let queue = format!("pgfleet_reconcile_queue_depth{{cluster=\"{m}\"}}");
        let state = format!("pgfleet_cluster_state{{cluster=\"{m}\",state=\"Ready\"}} 1");
        eventually(&format!("connectivity and reconcile series of {m}"), || {
            let page = pgfleet::metrics::encode();
            let ok = [&up, &reconcile, &errors, &queue, &state]
                .iter()
                .all(|s| page.contains(s.as_str()));
            async move {
                if ok {
                    Ok(())
                } else {
                    Err("not yet on the page")
                }
            }
        })
        .await;
    }
}
