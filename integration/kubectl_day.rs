//! A platform engineer's day with the real `/usr/bin/kubectl` against the
//! embedded Kubernetes on the process runtime (real processes, real
//! PostgreSQL): install the CRDs, apply/diff/dry-run a PostgresCluster, read
//! it in every output format, annotate/label/scale it, watch and wait on it,
//! find its Events, then work with Pods — logs (and `logs -f` seeing a new
//! line), exec (with stdin), cp, port-forward + psql, top — check access with
//! `auth can-i`, read `explain`, create built-in objects with kubectl's
//! generators (protobuf bodies) and clean up with `delete -l`. Every step
//! asserts what kubectl prints or what the cluster then holds.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::s8_support as support;

use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use support::*;

/// Address index of this test's process-runtime cluster (see `process_sim`).
pub(crate) const INDEX: usize = 57;

pub(crate) const PGC: &str = "\
apiVersion: pgfleet.io/v1
kind: PostgresCluster
metadata:
  name: orders
  labels: {tier: gold}
spec:
  clusterSize: 1
  version: \"15\"
";

/// A Pod that prints `started`, then every line an exec drops in /scratch/say.
pub(crate) const WEB: &str = "\
apiVersion: v1
kind: Pod
metadata:
  name: web-0
  labels: {app: web}
spec:
  containers:
  - name: web
    image: busybox
    command: [sh, -c, 'echo started; while true; do if [ -f /scratch/say ]; then cat /scratch/say; rm -f /scratch/say; fi; sleep 0.2; done']
    volumeMounts: [{name: scratch, mountPath: /scratch}]
  volumes: [{name: scratch, emptyDir: {}}]
";

/// Runs kubectl; (exit code, stdout, stderr).
pub(crate) fn run(k: &Kubectl, args: &[&str]) -> (i32, String, String) {
    let out = k.run(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

pub(crate) fn json_of(k: &Kubectl, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    serde_json::from_str(&k.ok(&a)).unwrap()
}

/// A file in the test's directory holding `content`.
pub(crate) fn file(k: &Kubectl, name: &str, content: &str) -> String {
    let p = k.kubeconfig.with_file_name(name);
    std::fs::write(&p, content).unwrap();
    p.to_string_lossy().into_owned()
}

/// A long-running kubectl (killed on drop) whose stdout lines arrive on a channel.
pub(crate) struct Streaming {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub(crate) fn stream(k: &Kubectl, args: &[&str]) -> Streaming {
    let mut child = k
        .command(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    Streaming { child, lines }
}

impl Streaming {
    /// Reads lines until one contains `want`.
    pub(crate) fn expect(&self, want: &str) -> String {
        let deadline = std::time::Instant::now() + common::PATIENCE;
        let mut seen = vec![];
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) if l.contains(want) => return l,
                Ok(l) => seen.push(l),
                Err(_) => panic!("no line with {want:?}; saw {seen:?}"),
            }
        }
    }
}

/// Polls a kubectl command until its stdout contains `want`.
pub(crate) async fn until(k: &Kubectl, args: &[&str], want: &str) -> String {
    common::eventually(&format!("kubectl {args:?} shows {want}"), || async {
        let (code, out, _) = run(k, args);
        (code == 0 && out.contains(want)).then_some(out)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_day_with_kubectl() {
    let (_sim, _client, kubeconfig) = process_sim("kubectl-day", INDEX).await;
    let k = Kubectl::new(&kubeconfig);
    clusters(&k).await;
    events(&k).await;
    crate::kubectl_day_pods::pods(&k).await;
    crate::kubectl_day_pods::access_and_explain(&k);
    crate::kubectl_day_pods::generators(&k);
    crate::kubectl_day_pods::cleanup(&k);
}

/// CRDs, apply/diff/dry-run, output formats, annotate/label/scale, watch, wait.
async fn clusters(k: &Kubectl) {
    let crds = concat!(env!("CARGO_MANIFEST_DIR"), "/crds/pgfleet.io.yaml");
    k.ok(&["apply", "-f", crds]);
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/postgresclusters.pgfleet.io",
        "--timeout=60s",
    ]);
    let pgc = file(k, "pgc.yaml", PGC);
    let out = k.ok(&["apply", "-f", &pgc]);
    assert_eq!(out.trim(), "postgrescluster.pgfleet.io/orders created");
    let out = k.ok(&["apply", "-f", &pgc]);
    assert_eq!(out.trim(), "postgrescluster.pgfleet.io/orders unchanged");

    // Output formats.
    let table = k.ok(&["get", "pgc"]);
    assert!(table.starts_with("NAME"), "{table}");
    assert!(
        table.lines().nth(1).unwrap().starts_with("orders "),
        "{table}"
    );
    assert!(
        k.ok(&["get", "pgc", "orders", "-o", "yaml"])
            .contains("  clusterSize: 1\n")
    );
    let j = json_of(k, &["get", "pgc", "orders"]);
    assert_eq!(
        (j["kind"].as_str(), j["spec"]["clusterSize"].as_i64()),
        (Some("PostgresCluster"), Some(1))
    );
    let size = k.ok(&["get", "pgc", "orders", "-o", "jsonpath={.spec.clusterSize}"]);
    assert_eq!(size, "1");
    let cols = k.ok(&[
        "get",
        "pgc",
        "-o",
        "custom-columns=NAME:.metadata.name,SIZE:.spec.clusterSize,TIER:.metadata.labels.tier",
    ]);
    let rows: Vec<Vec<&str>> = cols
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(
        rows,
        [vec!["NAME", "SIZE", "TIER"], vec!["orders", "1", "gold"]]
    );

    // diff: exit 1 with the change, exit 0 with nothing to show.
    let bigger = file(
        k,
        "pgc-3.yaml",
        &PGC.replace("clusterSize: 1", "clusterSize: 3"),
    );
    let (code, out, err) = run(k, &["diff", "-f", &bigger]);
    assert_eq!(code, 1, "diff exits 1 when something differs: {out} {err}");
    assert!(
        out.contains("-  clusterSize: 1") && out.contains("+  clusterSize: 3"),
        "{out}"
    );
    let (code, out, err) = run(k, &["diff", "-f", &pgc]);
    assert_eq!((code, out.as_str()), (0, ""), "{err}");

    // A server-side dry run validates and answers, but stores nothing.
    let out = k.ok(&["apply", "--dry-run=server", "-f", &bigger]);
    assert_eq!(
        out.trim(),
        "postgrescluster.pgfleet.io/orders configured (server dry run)"
    );
    let other = file(
        k,
        "billing.yaml",
        &PGC.replace("name: orders", "name: billing"),
    );
    let out = k.ok(&["apply", "--dry-run=server", "-f", &other]);
    assert_eq!(
        out.trim(),
        "postgrescluster.pgfleet.io/billing created (server dry run)"
    );
    let (code, _, err) = run(k, &["get", "pgc", "billing"]);
    assert!(code != 0 && err.contains("NotFound"), "{err}");
    assert_eq!(
        k.ok(&["get", "pgc", "orders", "-o", "jsonpath={.spec.clusterSize}"]),
        "1"
    );
    let bad = file(
        k,
        "bad.yaml",
        &PGC.replace("clusterSize: 1", "clusterSize: many"),
    );
    let (code, _, err) = run(k, &["apply", "--dry-run=server", "-f", &bad]);
    assert!(
        code != 0 && err.contains("spec.clusterSize"),
        "schema errors name the field: {err}"
    );
    k.ok(&["apply", "-f", &bigger]);
    assert_eq!(
        k.ok(&["get", "pgc", "orders", "-o", "jsonpath={.spec.clusterSize}"]),
        "3"
    );

    // annotate, label, select by label, scale.
    let out = k.ok(&["annotate", "pgc", "orders", "owner=team-a"]);
    assert_eq!(out.trim(), "postgrescluster.pgfleet.io/orders annotated");
    assert_eq!(
        k.ok(&[
            "get",
            "pgc",
            "orders",
            "-o",
            "jsonpath={.metadata.annotations.owner}"
        ]),
        "team-a"
    );
    let out = k.ok(&["label", "pgc", "orders", "env=prod"]);
    assert_eq!(out.trim(), "postgrescluster.pgfleet.io/orders labeled");
    assert_eq!(
        k.ok(&["get", "pgc", "-l", "env=prod", "-o", "name"]).trim(),
        "postgrescluster.pgfleet.io/orders"
    );
    let (code, _, err) = run(k, &["label", "pgc", "orders", "tier=silver"]);
    assert!(code != 0 && err.contains("--overwrite"), "{err}");
    k.ok(&["label", "pgc", "orders", "env-"]);
    assert_eq!(k.ok(&["get", "pgc", "-l", "env=prod", "-o", "name"]), "");
    let out = k.ok(&["scale", "pgc", "orders", "--replicas=2"]);
    assert_eq!(out.trim(), "postgrescluster.pgfleet.io/orders scaled");
    assert_eq!(
        k.ok(&["get", "pgc", "orders", "-o", "jsonpath={.spec.clusterSize}"]),
        "2"
    );

    // get -w prints the change as it happens.
    let watch = stream(
        k,
        &["get", "pgc", "orders", "-w", "-L", "tier", "--no-headers"],
    );
    watch.expect("gold");
    k.ok(&["label", "pgc", "orders", "tier=silver", "--overwrite"]);
    watch.expect("silver");
    drop(watch);

    // wait for a jsonpath value and a condition the status subresource sets.
    let waiting = stream(
        k,
        &[
            "wait",
            "--for=jsonpath={.status.phase}=Running",
            "pgc/orders",
            "--timeout=120s",
        ],
    );
    let status = json!({"status": {"phase": "Running", "readyInstances": 2, "currentPrimary": "orders-0",
        "conditions": [{"type": "Ready", "status": "True", "reason": "AllReady", "message": "ok",
                        "lastTransitionTime": "2026-01-01T00:00:00Z"}]}});
    k.ok(&[
        "patch",
        "pgc",
        "orders",
        "--subresource=status",
        "--type=merge",
        "-p",
        &status.to_string(),
    ]);
    waiting.expect("condition met");
    let out = k.ok(&[
        "wait",
        "--for=condition=Ready",
        "pgc/orders",
        "--timeout=60s",
    ]);
    assert_eq!(
        out.trim(),
        "postgrescluster.pgfleet.io/orders condition met"
    );
}

/// An Event about the cluster, found by describe, field selectors and `kubectl events`.
async fn events(k: &Kubectl) {
    let uid = k.ok(&["get", "pgc", "orders", "-o", "jsonpath={.metadata.uid}"]);
    let ev = format!(
        "apiVersion: v1\nkind: Event\nmetadata: {{name: orders.failover}}\n\
         involvedObject: {{apiVersion: pgfleet.io/v1, kind: PostgresCluster, name: orders, namespace: default, uid: {uid}}}\n\
         reason: FailoverStarted\nmessage: primary orders-0 is gone\ntype: Warning\n\
         source: {{component: pgfleet}}\nfirstTimestamp: \"2026-01-01T00:00:00Z\"\nlastTimestamp: \"2026-01-01T00:00:00Z\"\ncount: 1\n"
    );
    k.ok(&["apply", "-f", &file(k, "event.yaml", &ev)]);
    let described = k.ok(&["describe", "pgc", "orders"]);
    let part = described.split("Events:").nth(1).unwrap_or_default();
    assert!(
        part.contains("FailoverStarted") && part.contains("primary orders-0 is gone"),
        "{described}"
    );
    assert!(
        described
            .lines()
            .any(|l| l.split_whitespace().collect::<Vec<_>>() == ["Cluster", "Size:", "2"]),
        "describe shows the spec: {described}"
    );
    let got = k.ok(&[
        "get",
        "events",
        "--field-selector",
        "involvedObject.name=orders,type=Warning",
        "-o",
        "custom-columns=REASON:.reason,OBJ:.involvedObject.kind",
        "--no-headers",
    ]);
    assert_eq!(
        got.split_whitespace().collect::<Vec<_>>(),
        ["FailoverStarted", "PostgresCluster"]
    );
    until(k, &["events", "--for", "pgc/orders"], "FailoverStarted").await;
}
