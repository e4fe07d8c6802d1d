//! The process runtime reached the way users reach a database on a real
//! cluster: `kubectl port-forward` to a Pod and to a Service, then psql
//! through the local port; `kubectl cp` in and out of a container (tar
//! through exec); and an exec of a command that is not there answering
//! exit code 127 with the reason.
#![allow(clippy::unwrap_used)]

use crate::s8_support as support;

use serde_json::json;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use support::*;

/// A running `kubectl port-forward` (killed on drop) and its local port.
struct Forward {
    child: Child,
    port: u16,
}

impl Drop for Forward {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `kubectl port-forward <what> :<remote>` and reads the local port
/// kubectl picked from its "Forwarding from 127.0.0.1:N -> remote" line.
fn port_forward(k: &Kubectl, what: &str, remote: u16) -> Forward {
    port_forward_with(k, what, remote, true)
}

/// `websockets: false` makes kubectl speak plain SPDY (its fallback).
fn port_forward_with(k: &Kubectl, what: &str, remote: u16, websockets: bool) -> Forward {
    let mut child = k
        .command(&["port-forward", what, &format!(":{remote}")])
        .env("KUBECTL_PORT_FORWARD_WEBSOCKETS", websockets.to_string())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let mut lines = BufReader::new(out).lines();
    let port = loop {
        let line = lines
            .next()
            .expect("kubectl port-forward printed its local port")
            .unwrap();
        if let Some(rest) = line.strip_prefix("Forwarding from 127.0.0.1:") {
            break rest.split_whitespace().next().unwrap().parse().unwrap();
        }
    };
    // Keep draining "Handling connection" lines so kubectl never blocks.
    std::thread::spawn(move || for _ in lines {});
    Forward { child, port }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_forward_to_a_pod_and_a_service_reads_and_writes_rows() {
    let (_sim, client, kubeconfig) = process_sim("s8-portforward", 50).await;
    create_pod(
        &client,
        postgres_pod(
            "orders-0",
            "orders",
            json!({"name": "data", "emptyDir": {}}),
        ),
    )
    .await;
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": "orders-rw"},
        "spec": {"selector": {"app": "orders"},
                 "ports": [{"name": "postgres", "port": 5432, "targetPort": "postgres"}]}
    }))
    .unwrap();
    kube::Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), "default")
        .create(&Default::default(), &svc)
        .await
        .unwrap();
    ready_pod(&client, "orders-0", 0).await;
    let k = Kubectl::new(&kubeconfig);

    let pod = port_forward(&k, "pod/orders-0", 5432);
    psql_eventually(
        "127.0.0.1",
        pod.port,
        "CREATE TABLE t (n int); INSERT INTO t SELECT generate_series(1, 50)",
    )
    .await;
    assert_eq!(
        psql("127.0.0.1", pod.port, "SELECT count(*) FROM t").as_deref(),
        Some("50")
    );

    // kubectl resolves the Service to a Pod and its named targetPort.
    let svc = port_forward(&k, "svc/orders-rw", 5432);
    assert_eq!(
        psql_eventually(
            "127.0.0.1",
            svc.port,
            "INSERT INTO t VALUES (51); SELECT count(*) FROM t"
        )
        .await,
        "51"
    );
    // Several connections through one forward, one after the other.
    for _ in 0..3 {
        assert_eq!(
            psql("127.0.0.1", svc.port, "SELECT sum(n) FROM t").as_deref(),
            Some("1326")
        );
    }
    // The plain SPDY upgrade kubectl falls back to works the same.
    let spdy = port_forward_with(&k, "pod/orders-0", 5432, false);
    assert_eq!(
        psql_eventually("127.0.0.1", spdy.port, "SELECT count(*) FROM t").await,
        "51"
    );
    // A port nothing listens on: the connection fails, the forward reports it.
    let dead = port_forward(&k, "pod/orders-0", 5999);
    assert!(psql("127.0.0.1", dead.port, "SELECT 1").is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_cp_copies_into_and_out_of_a_container_and_missing_commands_exit_127() {
    let (_sim, client, kubeconfig) = process_sim("s8-cp", 51).await;
    create_pod(
        &client,
        postgres_pod("cp-0", "cp", json!({"name": "data", "emptyDir": {}})),
    )
    .await;
    ready_pod(&client, "cp-0", 0).await;
    let k = Kubectl::new(&kubeconfig);
    let local = kubeconfig.with_file_name("upload.txt");
    std::fs::write(&local, "rows from the laptop\n").unwrap();

    k.ok(&[
        "cp",
        local.to_str().unwrap(),
        "cp-0:/var/lib/postgresql/data/upload.txt",
    ]);
    let inside = k.ok(&[
        "exec",
        "cp-0",
        "--",
        "cat",
        "/var/lib/postgresql/data/upload.txt",
    ]);
    assert_eq!(inside, "rows from the laptop\n");

    let back = kubeconfig.with_file_name("PG_VERSION");
    k.ok(&[
        "cp",
        "cp-0:/var/lib/postgresql/data/pg/PG_VERSION",
        back.to_str().unwrap(),
    ]);
    assert_eq!(std::fs::read_to_string(&back).unwrap().trim(), "15");

    let out = k.run(&["exec", "cp-0", "--", "no-such-command", "--flag"]);
    assert_eq!(out.status.code(), Some(127), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("no-such-command"),
        "the reason names the command: {err}"
    );
}
