//! Issue 15 item 4 with real PostgreSQL: two member clusters on the process
//! runtime; a LoadBalancer Service in the first exposes a PostgreSQL pod,
//! and a pod of the second reaches it on the ingress IP (kubectl shows it
//! as EXTERNAL-IP). Cutting the two members apart stops that and nothing
//! inside either cluster; cutting the first from the manager closes its API
//! port (the observer kubeconfig still works) and leaves member traffic
//! alone; healing restores everything.

use crate::common;
use crate::s8_support::{Kubectl, create_pod, postgres_pod, process_sim, ready_pod};
use kube::Api;
use kube::api::PostParams;
use pgfleet::testkit::network;
use serde_json::json;

/// `psql -h ip -c 'select 42'` run by `kubectl exec` in `pod`: whether it
/// answered 42, and what kubectl printed.
fn psql_from(k: &Kubectl, pod: &str, ip: &str) -> (bool, String) {
    let out = k.run(&[
        "exec",
        pod,
        "--",
        "psql",
        "-h",
        ip,
        "-U",
        "postgres",
        "-XAtc",
        "select 42",
    ]);
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.success() && text.trim() == "42", text)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_load_balancer_of_one_member_is_reached_from_another_until_the_link_is_cut() {
    common::init_tracing();
    // Address indexes 60 and 61: no other process-runtime test uses them.
    let (s, two, _) = process_sim("net-lb", 61).await;
    let (m1, m2) = ("c60", "c61");
    let sim = &s.sim;
    let (c1, c2) = (sim.get(m1).unwrap(), sim.get(m2).unwrap());
    let one = common::client_from(&c1.kubeconfig).await;
    create_pod(
        &one,
        postgres_pod("pg", "pg", json!({"name": "data", "emptyDir": {}})),
    )
    .await;
    let client = json!({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "client"},
        "spec": {"terminationGracePeriodSeconds": 1, "containers": [{"name": "c",
            "image": "postgres:15", "command": ["sleep", "3600"]}]}});
    create_pod(&two, client).await;
    let svc: k8s_openapi::api::core::v1::Service = serde_json::from_value(json!({
        "metadata": {"name": "pg"}, "spec": {"type": "LoadBalancer", "selector": {"app": "pg"},
        "ports": [{"name": "postgres", "port": 5432, "targetPort": "postgres"}]}}))
    .unwrap();
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(one.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    ready_pod(&one, "pg", 0).await;
    ready_pod(&two, "client", 0).await;

    // kubectl shows the ingress IP as EXTERNAL-IP.
    let k1 = Kubectl::new(&c1.kubeconfig);
    let k1_observer = Kubectl::new(&c1.observer_kubeconfig);
    let k2 = Kubectl::new(&c2.kubeconfig);
    let ip = common::eventually("an EXTERNAL-IP", || async {
        let out = k1.ok(&["get", "svc", "pg", "--no-headers"]);
        let cols: Vec<&str> = out.split_whitespace().collect();
        (cols.get(1) == Some(&"LoadBalancer")
            && cols.get(3).is_some_and(|ip| ip.starts_with("127.2")))
        .then(|| cols[3].to_string())
    })
    .await;
    let out = k1.ok(&[
        "get",
        "svc",
        "pg",
        "-o",
        "jsonpath={.spec.ports[0].nodePort}",
    ]);
    assert!(
        out.parse::<u16>()
            .is_ok_and(|p| (30000..=32767).contains(&p)),
        "{out}"
    );

    // member-2's pod reaches member-1's database on the ingress IP.
    common::eventually("psql from member 2 through the load balancer", || async {
        psql_from(&k2, "client", &ip).0.then_some(())
    })
    .await;

    // The link member-1 ↔ member-2 is cut: refused from member 2; inside
    // member 1 nothing changes, and the manager still reaches both.
    network::cut_members(sim, m1, &[m2]).unwrap();
    let (ok, text) = psql_from(&k2, "client", &ip);
    assert!(!ok, "member 2 still reached member 1: {text}");
    let (ok, text) = psql_from(&k1, "pg", &ip);
    assert!(ok, "inside member 1 the load balancer answers: {text}");
    k1.ok(&["get", "pods"]);

    // Manager ↔ member-1 only: the API port is closed for the manager's
    // kubeconfig, the observer's works, and member traffic flows again.
    network::cut_manager(sim, m1).unwrap();
    common::eventually("member 1's API closed to the manager", || async {
        let out = k1.run(&["get", "pods", "--request-timeout=5s"]);
        let err = String::from_utf8_lossy(&out.stderr).to_string();
        (!out.status.success() && err.contains("refused")).then_some(())
    })
    .await;
    k1_observer.ok(&["get", "pods"]);
    let (ok, text) = psql_from(&k2, "client", &ip);
    assert!(ok, "a manager cut leaves members connected: {text}");

    // Heal: the manager's kubeconfig works again, and so does the link.
    network::heal(sim, m1).unwrap();
    common::eventually("member 1's API back", || async {
        k1.run(&["get", "pods"]).status.success().then_some(())
    })
    .await;
    let (ok, text) = psql_from(&k2, "client", &ip);
    assert!(ok, "healed: {text}");
}
