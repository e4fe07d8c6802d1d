//! The metrics API (`metrics.k8s.io/v1beta1`) fed by the process runtime's
//! real processes: `kubectl top pod` shows the memory PostgreSQL's
//! processes use and the CPU a running query burns; `kubectl top node`
//! shows the machine; the group is in discovery as an aggregated API is.
//! On the virtual runtime every running container reports zero.
#![allow(clippy::unwrap_used)]

use crate::common;
use crate::s8_support as support;

use serde_json::{Value, json};
use support::*;

/// CPU in millicores and memory in MiB of one `kubectl top pod` row.
fn top_row(out: &str, pod: &str) -> Option<(u64, u64)> {
    let line = out
        .lines()
        .find(|l| l.split_whitespace().next() == Some(pod))?;
    let f: Vec<&str> = line.split_whitespace().collect();
    let cpu = f.get(1)?.strip_suffix('m')?.parse().ok()?;
    let mem = f.get(2)?.strip_suffix("Mi")?.parse().ok()?;
    Some((cpu, mem))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kubectl_top_shows_what_postgresql_uses() {
    let (_sim, client, kubeconfig) = process_sim("s8-metrics", 53).await;
    create_pod(
        &client,
        postgres_pod("top-0", "top", json!({"name": "data", "emptyDir": {}})),
    )
    .await;
    let ip = ready_pod(&client, "top-0", 0)
        .await
        .status
        .and_then(|s| s.pod_ip)
        .unwrap();
    psql_eventually(&ip, 5432, "SELECT 1").await;
    let k = Kubectl::new(&kubeconfig);

    let groups = k.ok(&["api-versions"]);
    assert!(
        groups.lines().any(|l| l == "metrics.k8s.io/v1beta1"),
        "{groups}"
    );
    let resources = k.ok(&[
        "api-resources",
        "--api-group=metrics.k8s.io",
        "--no-headers",
    ]);
    assert!(
        resources.contains("PodMetrics") && resources.contains("NodeMetrics"),
        "{resources}"
    );

    // A query that keeps a backend busy for a while: its CPU shows up.
    let busy_ip = ip.clone();
    let busy = std::thread::spawn(move || {
        psql(
            &busy_ip,
            5432,
            "SELECT count(*) FROM generate_series(1, 60000000)",
        )
    });
    let (cpu, mem) = common::eventually("kubectl top pod to show CPU and memory", || async {
        let out = k.ok(&["top", "pod", "--no-headers"]);
        let row = top_row(&out, "top-0").filter(|(cpu, mem)| *cpu > 0 && *mem > 0);
        if row.is_some() {
            println!("kubectl top pod (a query running): {out}");
        }
        row
    })
    .await;
    assert!(mem < 4096, "PostgreSQL's memory is sane: {mem}Mi");
    assert!(cpu > 0);
    let _ = busy.join();

    // Per container, through the API as kubectl reads it.
    let raw: Value = serde_json::from_str(&k.ok(&[
        "get",
        "--raw",
        "/apis/metrics.k8s.io/v1beta1/namespaces/default/pods/top-0",
    ]))
    .unwrap();
    assert_eq!(raw["kind"], "PodMetrics");
    assert_eq!(raw["containers"][0]["name"], "postgres");
    let nodes = k.ok(&["top", "node", "--no-headers"]);
    assert!(nodes.starts_with("sim-node"), "{nodes}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_virtual_runtime_reports_zero_usage() {
    let mut opts = common::options(&common::temp_dir("s8-metrics-virtual"), false);
    opts.runtime = pgfleet::emulated::virtual_runtime();
    let sim = common::TestSim::start(opts).await;
    let client = sim.client().await;
    create_pod(
        &client,
        json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "v-0"},
               "spec": {"containers": [{"name": "c", "image": "busybox"}]}}),
    )
    .await;
    let k = Kubectl::new(sim.kubeconfig());
    let out = common::eventually("the pod in kubectl top", || async {
        let out = k.ok(&["top", "pod", "--no-headers"]);
        top_row(&out, "v-0").map(|_| out)
    })
    .await;
    assert_eq!(top_row(&out, "v-0"), Some((0, 0)), "{out}");
}
