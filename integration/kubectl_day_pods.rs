//! A platform engineer's day with kubectl, continued (split from
//! `kubectl_day.rs`, which runs the day): working with Pods — logs (and
//! `logs -f`), exec with stdin, cp, port-forward + psql, top — then
//! `auth can-i`, `explain`, kubectl's generators and the cleanup.

use crate::kubectl_day::*;
use crate::s8_support as support;
use serde_json::json;
use std::io::Write;
use std::process::Stdio;
use support::*;

/// Pods: wait, describe, logs and logs -f, exec (-i), cp, port-forward, top.
pub(crate) async fn pods(k: &Kubectl) {
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

pub(crate) fn access_and_explain(k: &Kubectl) {
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
pub(crate) fn generators(k: &Kubectl) {
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
pub(crate) fn cleanup(k: &Kubectl) {
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
