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
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use support::*;

/// Address index of this test's process-runtime cluster (see `process_sim`).
const INDEX: usize = 57;

const PGC: &str = "\
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
const WEB: &str = "\
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
fn run(k: &Kubectl, args: &[&str]) -> (i32, String, String) {
    let out = k.run(args);
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn json_of(k: &Kubectl, args: &[&str]) -> Value {
    let mut a = args.to_vec();
    a.extend(["-o", "json"]);
    serde_json::from_str(&k.ok(&a)).unwrap()
}

/// A file in the test's directory holding `content`.
fn file(k: &Kubectl, name: &str, content: &str) -> String {
    let p = k.kubeconfig.with_file_name(name);
    std::fs::write(&p, content).unwrap();
    p.to_string_lossy().into_owned()
}

/// A long-running kubectl (killed on drop) whose stdout lines arrive on a channel.
struct Streaming {
    child: Child,
    lines: mpsc::Receiver<String>,
}

impl Drop for Streaming {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn stream(k: &Kubectl, args: &[&str]) -> Streaming {
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
    fn expect(&self, want: &str) -> String {
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
async fn until(k: &Kubectl, args: &[&str], want: &str) -> String {
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
    pods(&k).await;
    access_and_explain(&k);
    generators(&k);
    cleanup(&k);
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

/// Pods: wait, describe, logs and logs -f, exec (-i), cp, port-forward, top.
async fn pods(k: &Kubectl) {
    k.ok(&["apply", "-f", &file(k, "web.yaml", WEB)]);
    let pg = serde_json::to_string(&postgres_pod(
        "db-0",
        "db",
        json!({"name": "data", "emptyDir": {}}),
    ))
    .unwrap();
    k.ok(&["apply", "-f", &file(k, "db.json", &pg)]);
    let out = k.ok(&[
        "wait",
        "--for=condition=Ready",
        "pod/web-0",
        "pod/db-0",
        "--timeout=120s",
    ]);
    assert_eq!(out.lines().count(), 2, "{out}");
    k.ok(&[
        "wait",
        "--for=jsonpath={.status.phase}=Running",
        "pod/web-0",
        "--timeout=60s",
    ]);
    let table = k.ok(&["get", "pods", "-l", "app=web"]);
    assert!(
        table.contains("web-0") && table.contains("1/1") && table.contains("Running"),
        "{table}"
    );
    let described = k.ok(&["describe", "pod", "web-0"]);
    for want in [
        "Status:       Running",
        "Containers:",
        "web:",
        "/scratch from scratch",
    ] {
        assert!(
            described.contains(want),
            "describe pod shows {want:?}: {described}"
        );
    }
    let wide = k.ok(&["get", "pod", "web-0", "-o", "wide", "--no-headers"]);
    let ip = k.ok(&["get", "pod", "web-0", "-o", "jsonpath={.status.podIP}"]);
    assert!(!ip.is_empty() && wide.contains(&ip), "{wide}");

    // logs, then logs -f seeing a line written after it started.
    assert_eq!(until(k, &["logs", "web-0"], "started").await, "started\n");
    let follow = stream(k, &["logs", "-f", "web-0"]);
    follow.expect("started");
    k.ok(&[
        "exec",
        "web-0",
        "--",
        "sh",
        "-c",
        "echo follow-me > /scratch/say",
    ]);
    follow.expect("follow-me");
    drop(follow);
    assert!(k.ok(&["logs", "web-0", "--tail=1"]).contains("follow-me"));

    // exec: output, exit code, stdin.
    assert_eq!(k.ok(&["exec", "web-0", "--", "echo", "hello"]), "hello\n");
    let (code, out, err) = run(
        k,
        &[
            "exec",
            "web-0",
            "-c",
            "web",
            "--",
            "sh",
            "-c",
            "echo out; echo err >&2; exit 3",
        ],
    );
    assert_eq!((code, out.as_str()), (3, "out\n"), "{err}");
    assert!(err.contains("err"), "{err}");
    let mut child = k
        .command(&["exec", "-i", "web-0", "--", "tr", "a-z", "A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"shout\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SHOUT\n");

    // cp in and out.
    let local = file(k, "notes.txt", "runbook line\n");
    k.ok(&["cp", &local, "web-0:/scratch/notes.txt"]);
    assert_eq!(
        k.ok(&["exec", "web-0", "--", "cat", "/scratch/notes.txt"]),
        "runbook line\n"
    );
    let back = k.kubeconfig.with_file_name("notes-back.txt");
    k.ok(&["cp", "web-0:/scratch/notes.txt", back.to_str().unwrap()]);
    assert_eq!(std::fs::read_to_string(&back).unwrap(), "runbook line\n");

    // port-forward + psql.
    let fwd = stream(k, &["port-forward", "pod/db-0", ":5432"]);
    let line = fwd.expect("Forwarding from 127.0.0.1:");
    let port: u16 = line
        .trim_start_matches("Forwarding from 127.0.0.1:")
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    let n = psql_eventually(
        "127.0.0.1",
        port,
        "CREATE TABLE t AS SELECT generate_series(1, 10) n; SELECT count(*) FROM t",
    )
    .await;
    assert_eq!(n, "10");
    drop(fwd);

    // top: the metrics API reports the real processes.
    let top = until(k, &["top", "pod", "db-0", "--no-headers"], "db-0").await;
    let f: Vec<&str> = top.split_whitespace().collect();
    assert!(
        f.len() == 3 && f[1].ends_with('m') && f[2].ends_with("Mi"),
        "{top}"
    );
}

fn access_and_explain(k: &Kubectl) {
    assert_eq!(k.ok(&["auth", "can-i", "create", "pods"]).trim(), "yes");
    assert_eq!(
        k.ok(&["auth", "can-i", "delete", "postgresclusters.pgfleet.io"])
            .trim(),
        "yes"
    );
    let who = k.ok(&[
        "auth",
        "whoami",
        "-o",
        "jsonpath={.status.userInfo.username}",
    ]);
    assert!(!who.is_empty());
    let out = k.ok(&["explain", "pgc.spec.clusterSize"]);
    assert!(out.contains("<integer>"), "{out}");
    // Built-in kinds have permissive schemas here (docs/embedded-kubernetes.md):
    // the kind is explained, its fields are not.
    let out = k.ok(&["explain", "pods"]);
    assert!(out.contains("KIND:") && out.contains("Pod"), "{out}");
}

/// `kubectl create <kind>` generators send protobuf bodies for built-in kinds.
fn generators(k: &Kubectl) {
    let out = k.ok(&["create", "namespace", "team-a"]);
    assert_eq!(out.trim(), "namespace/team-a created");
    let ns = ["-n", "team-a"];
    let create = |args: &[&str], want: &str| {
        let out = k.ok(&[args, &ns[..]].concat());
        assert_eq!(out.trim(), want);
    };
    create(
        &["create", "configmap", "cfg", "--from-literal=a=1"],
        "configmap/cfg created",
    );
    create(
        &[
            "create",
            "secret",
            "generic",
            "pw",
            "--from-literal=password=hunter2",
        ],
        "secret/pw created",
    );
    create(
        &[
            "create",
            "deployment",
            "web",
            "--image=nginx:1.27",
            "--port=8080",
            "--replicas=2",
        ],
        "deployment.apps/web created",
    );
    let d = json_of(k, &["get", "deployment", "web", "-n", "team-a"]);
    assert_eq!(d["spec"]["replicas"], 2, "{d}");
    assert_eq!(d["spec"]["selector"]["matchLabels"]["app"], "web", "{d}");
    let c = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        (c["image"].as_str(), c["ports"][0]["containerPort"].as_i64()),
        (Some("nginx:1.27"), Some(8080)),
        "{d}"
    );
    create(
        &["create", "service", "clusterip", "web", "--tcp=80:8080"],
        "service/web created",
    );
    let svc = json_of(k, &["get", "service", "web", "-n", "team-a"]);
    let port = &svc["spec"]["ports"][0];
    assert_eq!(
        (port["port"].as_i64(), port["targetPort"].as_i64()),
        (Some(80), Some(8080)),
        "{svc}"
    );
    assert_eq!(svc["spec"]["selector"]["app"], "web", "{svc}");
    assert!(
        svc["spec"]["clusterIP"]
            .as_str()
            .is_some_and(|ip| !ip.is_empty()),
        "{svc}"
    );
    create(
        &[
            "create",
            "role",
            "reader",
            "--verb=get,list",
            "--resource=postgresclusters.pgfleet.io",
        ],
        "role.rbac.authorization.k8s.io/reader created",
    );
    create(
        &[
            "create",
            "rolebinding",
            "reader",
            "--role=reader",
            "--serviceaccount=team-a:default",
        ],
        "rolebinding.rbac.authorization.k8s.io/reader created",
    );
    let rb = json_of(k, &["get", "rolebinding", "reader", "-n", "team-a"]);
    assert_eq!(
        (
            rb["roleRef"]["name"].as_str(),
            rb["subjects"][0]["kind"].as_str()
        ),
        (Some("reader"), Some("ServiceAccount")),
        "{rb}"
    );
    create(
        &[
            "create",
            "quota",
            "small",
            "--hard=pods=5,requests.storage=10Gi",
        ],
        "resourcequota/small created",
    );
    let q = json_of(k, &["get", "quota", "small", "-n", "team-a"]);
    assert_eq!(q["spec"]["hard"]["requests.storage"], "10Gi", "{q}");
    let out = k.ok(&["delete", "namespace", "team-a", "--wait=false"]);
    assert_eq!(out.trim(), "namespace \"team-a\" deleted");
}

/// `delete -l` removes exactly what the selector names.
fn cleanup(k: &Kubectl) {
    let out = k.ok(&[
        "delete",
        "pods",
        "-l",
        "app=web",
        "--wait=true",
        "--timeout=120s",
    ]);
    assert_eq!(out.trim(), "pod \"web-0\" deleted");
    let (_, out, err) = run(k, &["get", "pods", "-l", "app=web"]);
    assert!(
        out.is_empty() && err.contains("No resources found"),
        "{out} {err}"
    );
    assert!(k.ok(&["get", "pods", "-o", "name"]).contains("pod/db-0"));
    let out = k.ok(&["delete", "pgc", "-l", "tier=silver"]);
    assert_eq!(out.trim(), "postgrescluster.pgfleet.io \"orders\" deleted");
    assert_eq!(k.ok(&["get", "pgc", "-o", "name"]), "");
}
