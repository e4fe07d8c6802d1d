//! kubectl conformance: `/usr/bin/kubectl` (a client no one here wrote)
//! against the embedded API server: apply of the pgfleet CRDs and custom
//! objects from files, get/list in yaml and json with label selectors, the
//! three patch types and server-side apply, `get -w`, `wait`, printer
//! columns, `delete` with finalizers, `exec`, `logs`, `scale` and `explain`.
#![allow(clippy::unwrap_used)]

mod support;

use serde_json::Value;
use std::io::{BufRead, BufReader, Write};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use support::*;

use support::kubectl::Kubectl;

impl Kubectl {
    /// Spawns kubectl with stdout piped into a line channel.
    fn spawn(&self, args: &[&str]) -> (Child, mpsc::Receiver<String>) {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        (child, rx)
    }
}

/// Reads lines until one satisfies `pred`; panics after [`PATIENCE`].
fn expect_line(rx: &mpsc::Receiver<String>, what: &str, pred: impl Fn(&str) -> bool) -> String {
    let deadline = std::time::Instant::now() + PATIENCE;
    let mut seen = vec![];
    loop {
        let left = deadline.saturating_duration_since(std::time::Instant::now());
        match rx.recv_timeout(left) {
            Ok(l) if pred(&l) => return l,
            Ok(l) => seen.push(l),
            Err(_) => panic!("no line with {what} within {PATIENCE:?}; saw {seen:?}"),
        }
    }
}

const CLUSTERS: &str = "\
apiVersion: pgfleet.io/v1
kind: PostgresCluster
metadata:
  name: alpha
  labels: {tier: gold}
spec:
  clusterSize: 3
  version: \"15\"
---
apiVersion: pgfleet.io/v1
kind: PostgresCluster
metadata:
  name: beta
  labels: {tier: silver}
spec:
  clusterSize: 1
";

/// pgfleet's CRDs, a realistic fixture: the repository's generated file
/// (`pgfleet crd` writes it), read from disk so this crate needs no pgfleet.
const PGFLEET_CRDS: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../../crds/pgfleet.io.yaml");

/// A sim with the pgfleet CRDs applied from a file and two clusters.
fn sim_with_clusters(tag: &str) -> (TestSim, Kubectl) {
    let s = TestSim::start_blocking(options(&temp_dir(tag), false));
    let k = Kubectl::new(&s);
    let crd_file = k.file("crds.yaml", &std::fs::read_to_string(PGFLEET_CRDS).unwrap());
    let out = k.ok(&["apply", "-f", &crd_file]);
    assert!(out.contains("postgresclusters.pgfleet.io created"), "{out}");
    k.ok(&[
        "wait",
        "--for=condition=Established",
        "crd/postgresclusters.pgfleet.io",
        "--timeout=60s",
    ]);
    let objs = k.file("clusters.yaml", CLUSTERS);
    let out = k.ok(&["apply", "-f", &objs]);
    assert!(
        out.contains("postgrescluster.pgfleet.io/alpha created"),
        "{out}"
    );
    (s, k)
}

fn names(list: &Value) -> Vec<String> {
    list["items"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["metadata"]["name"].as_str().unwrap().to_string())
        .collect()
}

#[test]
fn apply_get_and_list_with_selectors() {
    let (_s, k) = sim_with_clusters("kubectl-get");
    assert!(k.ok(&["get", "ns"]).contains("kube-system"));
    let res = k.ok(&["api-resources", "--api-group=pgfleet.io"]);
    assert!(
        res.contains("postgresclusters") && res.contains("pgc"),
        "{res}"
    );

    let yaml: Value = serde_yaml::from_str(&k.ok(&["get", "pgc", "-o", "yaml"])).unwrap();
    assert_eq!(names(&yaml), vec!["alpha", "beta"]);
    let alpha = &yaml["items"][0];
    assert_eq!(alpha["spec"]["clusterSize"], 3);
    assert_eq!(
        alpha["spec"]["failoverDelay"], "5s",
        "schema defaults are applied"
    );
    let json = k.json(&["get", "postgresclusters.pgfleet.io", "-l", "tier=gold"]);
    assert_eq!(names(&json), vec!["alpha"]);
    assert_eq!(
        names(&k.json(&["get", "pgcluster", "-l", "tier!=gold"])),
        vec!["beta"]
    );
    assert_eq!(
        names(&k.json(&["get", "pgc", "-l", "tier in (gold,silver)"])),
        vec!["alpha", "beta"]
    );
    assert_eq!(
        names(&k.json(&["get", "pgc", "-l", "!tier"])),
        Vec::<String>::new()
    );
    assert_eq!(
        names(&k.json(&["get", "pgc", "--field-selector", "metadata.name=beta"])),
        vec!["beta"]
    );
    assert_eq!(names(&k.json(&["get", "pgc", "-A"])).len(), 2);
    // The `pgfleet` category names the kind too.
    assert!(k.ok(&["get", "pgfleet"]).contains("alpha"));
    let one = k.json(&["get", "pgc", "alpha"]);
    assert_eq!(one["kind"], "PostgresCluster");

    // Re-applying the same file changes nothing; an invalid object is refused naming the field.
    let objs = k.file("clusters.yaml", CLUSTERS);
    assert!(k.ok(&["apply", "-f", &objs]).contains("alpha unchanged"));
    let bad = k.file("bad.yaml", "apiVersion: pgfleet.io/v1\nkind: PostgresCluster\nmetadata: {name: bad}\nspec: {clusterSize: 99}\n");
    let (_, err) = k.fails(&["apply", "-f", &bad]);
    assert!(err.contains("spec.clusterSize"), "{err}");
}

#[test]
fn printer_columns_show() {
    let (_s, k) = sim_with_clusters("kubectl-columns");
    let out = k.ok(&["get", "pgc"]);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    for h in [
        "NAME", "SIZE", "READY", "PRIMARY", "VERSION", "PHASE", "AGE",
    ] {
        assert!(header.contains(&h), "{h} not in {header:?}");
    }
    let alpha: Vec<&str> = out
        .lines()
        .find(|l| l.starts_with("alpha"))
        .unwrap()
        .split_whitespace()
        .collect();
    assert_eq!(alpha[1], "3", "SIZE column: {out}");
    // Built-in kinds get kube's columns from the server too.
    let out = k.ok(&["get", "ns", "kube-system"]);
    let header: Vec<&str> = out.lines().next().unwrap().split_whitespace().collect();
    assert_eq!(header, ["NAME", "STATUS", "AGE"], "{out}");
    assert!(out.contains("Active"), "{out}");
}

#[test]
fn merge_json_and_server_side_apply_patches() {
    let (_s, k) = sim_with_clusters("kubectl-patch");
    k.ok(&[
        "patch",
        "pgc",
        "alpha",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"clusterSize":4}}"#,
    ]);
    k.ok(&[
        "patch",
        "pgc",
        "alpha",
        "--type",
        "json",
        "-p",
        r#"[{"op":"replace","path":"/spec/version","value":"16"}]"#,
    ]);
    let a = k.json(&["get", "pgc", "alpha"]);
    assert_eq!(
        (
            a["spec"]["clusterSize"].as_i64(),
            a["spec"]["version"].as_str()
        ),
        (Some(4), Some("16"))
    );
    assert_eq!(
        a["metadata"]["generation"], 3,
        "each spec change bumps the generation"
    );
    // A strategic merge patch on a built-in kind (kubectl's default patch type).
    // (`kubectl create configmap` would send protobuf, which the sim
    // refuses with 415; apply sends JSON.)
    let cfg = k.file(
        "cfg.yaml",
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cfg}\ndata: {a: \"1\"}\n",
    );
    k.ok(&["apply", "-f", &cfg]);
    k.ok(&["patch", "configmap", "cfg", "-p", r#"{"data":{"b":"2"}}"#]);
    let cm = k.json(&["get", "cm", "cfg"]);
    assert_eq!(
        (cm["data"]["a"].as_str(), cm["data"]["b"].as_str()),
        (Some("1"), Some("2"))
    );

    let ssa = |size: u32| {
        k.file("gamma.yaml", &format!("apiVersion: pgfleet.io/v1\nkind: PostgresCluster\nmetadata:\n  name: gamma\nspec:\n  clusterSize: {size}\n"))
    };
    let out = k.ok(&["apply", "--server-side", "-f", &ssa(2)]);
    assert!(out.contains("serverside-applied"), "{out}");
    let g = k.json(&["get", "pgc", "gamma", "--show-managed-fields"]);
    let mf = g["metadata"]["managedFields"].as_array().unwrap();
    assert!(
        mf.iter()
            .any(|m| m["manager"] == "kubectl" && m["operation"] == "Apply"),
        "{mf:?}"
    );
    // Another manager changing an owned field conflicts, then forces.
    let (_, err) = k.fails(&[
        "apply",
        "--server-side",
        "--field-manager",
        "other",
        "-f",
        &ssa(5),
    ]);
    assert!(err.contains("conflict"), "{err}");
    assert_eq!(k.json(&["get", "pgc", "gamma"])["spec"]["clusterSize"], 2);
    k.ok(&[
        "apply",
        "--server-side",
        "--field-manager",
        "other",
        "--force-conflicts",
        "-f",
        &ssa(5),
    ]);
    assert_eq!(k.json(&["get", "pgc", "gamma"])["spec"]["clusterSize"], 5);
}

#[test]
fn get_watch_sees_changes() {
    let (_s, k) = sim_with_clusters("kubectl-watch");
    let (mut child, rx) = k.spawn(&["get", "pgc", "-w", "--output-watch-events"]);
    // The initial list arrives first, so the watch is open before the change.
    expect_line(&rx, "beta in the initial list", |l| l.contains("beta"));
    k.ok(&[
        "patch",
        "pgc",
        "alpha",
        "--type",
        "merge",
        "-p",
        r#"{"spec":{"clusterSize":7}}"#,
    ]);
    let l = expect_line(&rx, "alpha modified to size 7", |l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.first() == Some(&"MODIFIED") && f.get(1) == Some(&"alpha") && f.get(2) == Some(&"7")
    });
    assert!(l.starts_with("MODIFIED"));
    k.ok(&["delete", "pgc", "beta"]);
    expect_line(&rx, "beta deleted", |l| {
        l.starts_with("DELETED") && l.contains("beta")
    });
    child.kill().unwrap();
    child.wait().unwrap();
}

#[test]
fn wait_for_a_condition_set_through_the_status_subresource() {
    let (_s, k) = sim_with_clusters("kubectl-wait");
    let waiter = k
        .command(&[
            "wait",
            "--for=condition=Ready",
            "pgc/alpha",
            "--timeout=120s",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    // The main resource cannot write status.
    k.ok(&[
        "patch",
        "pgc",
        "alpha",
        "--type",
        "merge",
        "-p",
        r#"{"status":{"phase":"Hacked"}}"#,
    ]);
    assert_eq!(
        k.json(&["get", "pgc", "alpha"])["status"]["phase"],
        Value::Null
    );
    let status = r#"{"status":{"phase":"Running","readyInstances":3,"currentPrimary":"alpha-0","currentVersion":"15",
        "conditions":[{"type":"Ready","status":"True","reason":"AllReady","message":"ok","lastTransitionTime":"2026-01-01T00:00:00Z"}]}}"#;
    k.ok(&[
        "patch",
        "pgc",
        "alpha",
        "--subresource=status",
        "--type",
        "merge",
        "-p",
        status,
    ]);
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success(), "kubectl wait exited {}", out.status);
    assert!(String::from_utf8_lossy(&out.stdout).contains("condition met"));
    // Already true: returns at once. The printer columns show the status.
    k.ok(&[
        "wait",
        "--for=condition=Ready",
        "pgc/alpha",
        "--timeout=60s",
    ]);
    let row = k.ok(&["get", "pgc", "alpha", "--no-headers"]);
    let f: Vec<&str> = row.split_whitespace().collect();
    assert_eq!(&f[..5], ["alpha", "3", "3", "alpha-0", "15"], "{row}");
    assert!(row.contains("Running"), "{row}");
    k.ok(&[
        "wait",
        "--for=jsonpath={.status.phase}=Running",
        "pgc/alpha",
        "--timeout=60s",
    ]);
}

#[test]
fn delete_with_finalizers() {
    let (_s, k) = sim_with_clusters("kubectl-finalizers");
    k.ok(&[
        "patch",
        "pgc",
        "alpha",
        "--type",
        "merge",
        "-p",
        r#"{"metadata":{"finalizers":["pgfleet.io/hold"]}}"#,
    ]);
    let out = k.ok(&["delete", "pgc", "alpha", "--wait=false"]);
    assert!(out.contains("deleted"), "{out}");
    let a = k.json(&["get", "pgc", "alpha"]);
    assert!(a["metadata"]["deletionTimestamp"].is_string(), "{a}");
    assert_eq!(a["metadata"]["finalizers"][0], "pgfleet.io/hold");
    // A waiting delete returns once the finalizer is removed. kubectl prints
    // "deleted" after its DELETE call, before it waits.
    let (mut waiting, rx) = k.spawn(&["delete", "pgc", "alpha", "--timeout=120s"]);
    expect_line(&rx, "the DELETE call to be answered", |l| {
        l.contains("deleted")
    });
    k.ok(&[
        "patch",
        "pgc",
        "alpha",
        "--type",
        "json",
        "-p",
        r#"[{"op":"remove","path":"/metadata/finalizers"}]"#,
    ]);
    assert!(
        waiting.wait().unwrap().success(),
        "kubectl delete waited and succeeded"
    );
    let (_, err) = k.fails(&["get", "pgc", "alpha"]);
    assert!(
        err.contains("NotFound") || err.contains("not found"),
        "{err}"
    );
    // Without finalizers, delete is immediate.
    k.ok(&["delete", "pgc", "beta"]);
    k.fails(&["get", "pgc", "beta"]);
}

#[test]
fn exec_and_logs_in_a_pod() {
    let s = TestSim::start_blocking(options(&temp_dir("kubectl-exec"), false));
    let k = Kubectl::new(&s);
    k.ok(&["run", "p", "--image=busybox", "--restart=Never"]);
    k.ok(&["wait", "--for=condition=Ready", "pod/p", "--timeout=60s"]);
    let out = k.run(&[
        "exec",
        "p",
        "--",
        "sh",
        "-c",
        "echo out; echo err >&2; exit 7",
    ]);
    assert_eq!(String::from_utf8_lossy(&out.stdout), "out\n");
    assert!(String::from_utf8_lossy(&out.stderr).contains("err"));
    assert_eq!(out.status.code(), Some(7), "the command's exit code");
    assert_eq!(k.ok(&["exec", "p", "--", "echo", "hello"]), "hello\n");

    let mut child = k
        .command(&["exec", "-i", "p", "--", "tr", "a-z", "A-Z"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(b"shout\n").unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8_lossy(&out.stdout), "SHOUT\n");

    assert!(k.ok(&["logs", "p"]).contains("default/p"));
    let (_, err) = k.fails(&["exec", "missing", "--", "true"]);
    assert!(err.contains("not found"), "{err}");
}

#[test]
fn scale_a_custom_resource() {
    let (_s, k) = sim_with_clusters("kubectl-scale");
    let out = k.ok(&["scale", "pgc", "alpha", "--replicas=5"]);
    assert!(out.contains("scaled"), "{out}");
    assert_eq!(k.json(&["get", "pgc", "alpha"])["spec"]["clusterSize"], 5);
    let scale = k.json(&["get", "pgc", "alpha", "--subresource=scale"]);
    assert_eq!(
        (scale["kind"].as_str(), scale["spec"]["replicas"].as_i64()),
        (Some("Scale"), Some(5))
    );
    // --current-replicas is a precondition kubectl checks against /scale.
    let (_, err) = k.fails(&[
        "scale",
        "pgc",
        "alpha",
        "--current-replicas=2",
        "--replicas=6",
    ]);
    assert!(err.contains("Expected replicas to be 2"), "{err}");
}

#[test]
fn explain_reads_the_crd_schema() {
    let (_s, k) = sim_with_clusters("kubectl-explain");
    let out = k.ok(&["explain", "pgc.spec.clusterSize"]);
    assert!(
        out.contains("clusterSize") && out.contains("<integer>"),
        "{out}"
    );
    assert!(
        out.contains("Number of instances"),
        "the field's description: {out}"
    );
    let out = k.ok(&["explain", "postgresclusters.spec"]);
    assert!(out.contains("failoverDelay"), "{out}");
}

#[test]
fn create_generators_for_namespaces_configmaps_secrets_and_serviceaccounts() {
    // These send protobuf bodies (client-go's default for built-in kinds).
    let s = TestSim::start_blocking(options(&temp_dir("kubectl-create"), false));
    let k = Kubectl::new(&s);
    k.ok(&["create", "namespace", "team-a"]);
    assert_eq!(
        k.json(&["get", "ns", "team-a"])["status"]["phase"],
        "Active"
    );
    k.ok(&[
        "create",
        "configmap",
        "cfg",
        "-n",
        "team-a",
        "--from-literal=a=1",
        "--from-literal=b=two",
    ]);
    let cm = k.json(&["get", "cm", "cfg", "-n", "team-a"]);
    assert_eq!(
        (cm["data"]["a"].as_str(), cm["data"]["b"].as_str()),
        (Some("1"), Some("two"))
    );
    k.ok(&[
        "create",
        "secret",
        "generic",
        "pw",
        "-n",
        "team-a",
        "--from-literal=password=hunter2",
    ]);
    let sec = k.json(&["get", "secret", "pw", "-n", "team-a"]);
    assert_eq!(sec["data"]["password"], "aHVudGVyMg==");
    assert_eq!(sec["type"], "Opaque");
    k.ok(&["create", "serviceaccount", "bot", "-n", "team-a"]);
    k.ok(&["get", "sa", "bot", "-n", "team-a"]);
    // Kinds without a protobuf decoder are refused with a message naming the way out.
    let (_, err) = k.fails(&["create", "job", "j", "--image=x"]);
    assert!(err.contains("Job") && err.contains("apply"), "{err}");
}
