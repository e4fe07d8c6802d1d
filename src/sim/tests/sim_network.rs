//! Services of type LoadBalancer (ingress IPs from the external pool, node
//! ports) and whole-cluster network faults (issue 15): a cluster cut from
//! the manager (its API server's port closes, the observer port stays),
//! from other member clusters (their pods cannot reach each other's ingress
//! IPs, open connections drop), asymmetric cuts, and healing.
#![allow(clippy::unwrap_used)]

mod support;

use k8s_openapi::api::core::v1::{Pod, Service};
use kube::api::{Api, Patch, PatchParams, PostParams};
use pgfleet_sim::network::{NetworkFault, Peers};
use serde_json::{Value, json};
use support::*;

fn obj<T: serde::de::DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

fn lb_service(name: &str, port: u16) -> Service {
    obj(
        json!({"metadata": {"name": name}, "spec": {"type": "LoadBalancer",
        "selector": {"app": name}, "ports": [{"name": "tcp", "port": port}]}}),
    )
}

/// The ingress IP once the emulated cloud controller has assigned one.
async fn ingress_of(svcs: &Api<Service>, name: &str) -> String {
    eventually("an ingress IP", || async {
        let s = svcs.get(name).await.ok()?;
        let ip = s.status?.load_balancer?.ingress?.first()?.ip.clone()?;
        Some(ip)
    })
    .await
}

fn in_external_pool(ip: &str) -> bool {
    let o = ip.parse::<std::net::Ipv4Addr>().unwrap().octets();
    o[0] == 127 && (224..=239).contains(&o[1])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn load_balancers_get_unique_ingress_ips_and_node_ports_released_on_type_change() {
    let mut opts = options(&temp_dir("lb"), false);
    opts.names = vec!["a".into(), "b".into()];
    let s = TestSim::start(opts).await;
    let a: Api<Service> = Api::default_namespaced(client_from(&s.sim.clusters[0].kubeconfig).await);
    let b: Api<Service> = Api::default_namespaced(client_from(&s.sim.clusters[1].kubeconfig).await);
    let pp = PostParams::default();
    a.create(&pp, &lb_service("db", 5432)).await.unwrap();
    b.create(&pp, &lb_service("db", 5432)).await.unwrap();
    let (ia, ib) = (ingress_of(&a, "db").await, ingress_of(&b, "db").await);
    assert!(in_external_pool(&ia) && in_external_pool(&ib), "{ia} {ib}");
    assert_ne!(ia, ib, "unique across the clusters of one sim");
    let svc = a.get("db").await.unwrap();
    let spec = svc.spec.unwrap();
    let node_port = spec.ports.unwrap()[0].node_port.unwrap();
    assert!((30000..=32767).contains(&node_port), "{node_port}");
    assert!(spec.cluster_ip.is_some_and(|ip| ip.starts_with("127.")));
    let ingress = svc.status.unwrap().load_balancer.unwrap().ingress.unwrap();
    assert_eq!(ingress[0].ip_mode.as_deref(), Some("VIP"));

    // A node port another Service holds, or one out of range: 422 naming the field.
    let mut taken = lb_service("other", 80);
    taken.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(node_port);
    let e = api_err(a.create(&pp, &taken).await);
    assert_eq!(e.code, 422);
    assert!(
        e.message.contains("spec.ports[0].nodePort") && e.message.contains("already allocated"),
        "{}",
        e.message
    );
    taken.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(80);
    let e = api_err(a.create(&pp, &taken).await);
    assert!(
        e.message.contains("not in the valid range"),
        "{}",
        e.message
    );

    // Type ClusterIP: the ingress goes back to the pool, node ports go.
    let to_cluster_ip = json!({"spec": {"type": "ClusterIP"}});
    a.patch("db", &PatchParams::default(), &Patch::Merge(&to_cluster_ip))
        .await
        .unwrap();
    eventually("the ingress released", || async {
        let s = a.get("db").await.ok()?;
        let gone = s
            .status?
            .load_balancer?
            .ingress
            .unwrap_or_default()
            .is_empty();
        let no_ports = s.spec?.ports?.iter().all(|p| p.node_port.is_none());
        (gone && no_ports).then_some(())
    })
    .await;
    // The freed node port can be asked for again.
    taken.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].node_port = Some(node_port);
    a.create(&pp, &taken).await.unwrap();
    assert!(in_external_pool(&ingress_of(&a, "other").await));
}

/// A pod running a TCP echo server on its own address, port 7000.
fn echo_pod(name: &str) -> Pod {
    let script = "import os, socket, threading\n\
        s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n\
        s.bind((os.environ['POD_IP'], 7000)); s.listen()\n\
        def serve(c):\n    while True:\n        d = c.recv(100)\n        if not d: return\n        c.sendall(d)\n\
        while True:\n    c, _ = s.accept(); threading.Thread(target=serve, args=(c,), daemon=True).start()\n";
    obj(
        json!({"metadata": {"name": name, "labels": {"app": "echo"}}, "spec": {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": "x", "command": ["python3", "-c", script],
            "ports": [{"containerPort": 7000}],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]}}),
    )
}

fn sleeper(name: &str) -> Pod {
    obj(
        json!({"metadata": {"name": name}, "spec": {"terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": "x", "command": ["sleep", "3600"]}]}}),
    )
}

/// Connects from inside a pod to `ip:7000` and echoes "ping"; then with
/// `held` it marks /tmp/held and waits for the connection to end, printing
/// how it ended; with `later` it marks /tmp/later, waits for /tmp/go and
/// echoes "pong" over the same connection.
const CLIENT: &str = r#"import os, socket, sys, time
try:
    s = socket.create_connection((sys.argv[1], 7000), 5); s.sendall(b'ping'); got = s.recv(4)
except OSError as e:
    print('failed', e); sys.exit(1)
if got != b'ping':
    print('failed', got); sys.exit(1)
print('ok', flush=True)
if len(sys.argv) > 2:
    open('/tmp/' + sys.argv[2], 'w').close(); s.settimeout(120)
    if sys.argv[2] == 'later':
        while not os.path.exists('/tmp/go'): time.sleep(0.1)
        s.sendall(b'pong'); print('later', s.recv(4))
    else:
        try:
            print('ended', s.recv(4))
        except OSError as e:
            print('ended', e)
"#;

async fn running(pods: &Api<Pod>, name: &str) {
    eventually("the pod ready", || async {
        let p = pods.get(name).await.ok()?;
        let ready = p
            .status?
            .conditions?
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        ready.then_some(())
    })
    .await;
}

async fn reaches(pods: &Api<Pod>, pod: &str, ip: &str) -> bool {
    let (out, _, st) = exec_in(pods, pod, &["python3", "-c", CLIENT, ip]).await;
    let ok = st.and_then(|s| s.status).as_deref() == Some("Success");
    assert_eq!(ok, out.starts_with("ok"), "{out}");
    ok
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn member_cuts_reset_cross_cluster_connections_and_manager_cuts_close_the_api_port() {
    // Address indexes 44 and 45: no other process-runtime test uses them.
    let mut opts = process_options("network", 45);
    opts.admin = true;
    let s = TestSim::start(opts).await;
    let (x, y) = (&s.sim.clusters[44], &s.sim.clusters[45]);
    let xp: Api<Pod> = Api::default_namespaced(client_from(&x.observer_kubeconfig).await);
    let yp: Api<Pod> = Api::default_namespaced(client_from(&y.observer_kubeconfig).await);
    let xs: Api<Service> = Api::default_namespaced(client_from(&x.kubeconfig).await);
    let pp = PostParams::default();
    xp.create(&pp, &echo_pod("echo")).await.unwrap();
    xp.create(&pp, &sleeper("local")).await.unwrap();
    yp.create(&pp, &sleeper("remote")).await.unwrap();
    xs.create(&pp, &lb_service("echo", 7000)).await.unwrap();
    let ip = ingress_of(&xs, "echo").await;
    for (pods, p) in [(&xp, "echo"), (&xp, "local"), (&yp, "remote")] {
        running(pods, p).await;
    }
    eventually("y reaches x's ingress", || async {
        reaches(&yp, "remote", &ip).await.then_some(())
    })
    .await;

    // A held connection from y, then x cuts y: it drops, new ones fail,
    // x's own pods still reach the same endpoint.
    let held = tokio::spawn({
        let (yp, ip) = (yp.clone(), ip.clone());
        async move { exec_in(&yp, "remote", &["python3", "-c", CLIENT, &ip, "held"]).await }
    });
    eventually("the held connection open", || async {
        let (_, _, st) = exec_in(&yp, "remote", &["test", "-e", "/tmp/held"]).await;
        (st.and_then(|s| s.status).as_deref() == Some("Success")).then_some(())
    })
    .await;
    let admin = s.sim.admin_addr.unwrap();
    let (code, body) = admin_request(
        admin,
        "PUT",
        "/clusters/c44/network",
        &x.token,
        Some(&json!({"members": ["c45"]})),
    )
    .await;
    assert_eq!(code, 200, "{body}");
    let (out, _, _) = tokio::time::timeout(PATIENCE, held).await.unwrap().unwrap();
    assert!(out.contains("ended"), "the open connection was cut: {out}");
    assert!(!reaches(&yp, "remote", &ip).await, "y is cut from x");
    assert!(reaches(&xp, "local", &ip).await, "inside x nothing changed");
    // Members only: the manager still reaches x's API server.
    xs.get("echo").await.unwrap();

    // A name that is not a cluster of the sim: 422 naming the field.
    let (code, body) = admin_request(
        admin,
        "PUT",
        "/clusters/c44/network",
        &x.token,
        Some(&json!({"members": ["nope"]})),
    )
    .await;
    assert_eq!(code, 422);
    assert!(body.contains("members[0]"), "{body}");

    // Manager only: y reaches x again (a connection opened before the cut
    // keeps streaming through it), x's API port is closed, the observer
    // port still answers.
    s.sim.set_network("c44", NetworkFault::default()).unwrap();
    eventually("y reaches x again", || async {
        reaches(&yp, "remote", &ip).await.then_some(())
    })
    .await;
    let later = tokio::spawn({
        let (yp, ip) = (yp.clone(), ip.clone());
        async move { exec_in(&yp, "remote", &["python3", "-c", CLIENT, &ip, "later"]).await }
    });
    eventually("the long connection open", || async {
        let (_, _, st) = exec_in(&yp, "remote", &["test", "-e", "/tmp/later"]).await;
        (st.and_then(|s| s.status).as_deref() == Some("Success")).then_some(())
    })
    .await;
    let mgr_only = NetworkFault {
        manager: true,
        members: Peers::None,
    };
    s.sim.set_network("c44", mgr_only.clone()).unwrap();
    assert_eq!(x.cluster.faults.network(), mgr_only);
    // Refused once the listener is gone; a connection the kernel had
    // queued as it closed is reset, which is the closing, not the result.
    eventually("x's API port closed", || async {
        std::net::TcpStream::connect(x.addr)
            .err()
            .filter(|e| e.kind() == std::io::ErrorKind::ConnectionRefused)
            .map(|_| ())
    })
    .await;
    assert!(reaches(&yp, "remote", &ip).await, "members still reach x");
    exec_in(&yp, "remote", &["touch", "/tmp/go"]).await;
    let (out, _, _) = tokio::time::timeout(PATIENCE, later)
        .await
        .unwrap()
        .unwrap();
    assert!(
        out.contains("later b'pong'"),
        "the open connection still streams: {out}"
    );
    xp.get("echo").await.unwrap();
    let (code, body) = admin_request(admin, "GET", "/clusters/c44/network", &x.token, None).await;
    assert_eq!(
        (code, serde_json::from_str::<Value>(&body).unwrap()),
        (200, json!({"manager": true, "members": []}))
    );

    // Heal: everything is back.
    let (code, _) = admin_request(admin, "DELETE", "/clusters/c44/network", &x.token, None).await;
    assert_eq!(code, 204);
    eventually("x's API answering the manager again", || async {
        xs.get("echo").await.ok()
    })
    .await;
    assert!(reaches(&yp, "remote", &ip).await);
}

/// A pod answering every connection on its address, port 7000, with the
/// peer's address, and on 127.0.0.1:7001 (its localhost) the same way.
fn whoami_pod(name: &str) -> Pod {
    let script = "import os, socket, threading\n\
        def serve(addr):\n    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n    \
        s.bind(addr); s.listen()\n    while True:\n        c, peer = s.accept(); c.sendall(peer[0].encode()); c.close()\n\
        threading.Thread(target=serve, args=(('127.0.0.1', 7001),), daemon=True).start()\n\
        serve((os.environ['POD_IP'], 7000))\n";
    obj(
        json!({"metadata": {"name": name, "labels": {"app": name}}, "spec": {
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": "x", "command": ["python3", "-c", script],
            "ports": [{"containerPort": 7000}],
            "env": [{"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}]}]}}),
    )
}

/// What the whoami server at `ip:port` says the connection came from.
const ASK: &str = "import socket, sys\n\
    s = socket.create_connection((sys.argv[1], int(sys.argv[2])), 5); print(s.recv(64).decode())\n";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_connect_from_their_own_address_and_services_keep_it() {
    // Address index 43: no other process-runtime test uses it.
    let s = TestSim::start(process_options("source", 43)).await;
    let c = &s.sim.clusters[43];
    let pods: Api<Pod> = Api::default_namespaced(client_from(&c.kubeconfig).await);
    let svcs: Api<Service> = Api::default_namespaced(client_from(&c.kubeconfig).await);
    let pp = PostParams::default();
    pods.create(&pp, &whoami_pod("whoami")).await.unwrap();
    pods.create(&pp, &sleeper("client")).await.unwrap();
    let svc: Service = obj(json!({"metadata": {"name": "whoami"}, "spec": {
        "selector": {"app": "whoami"}, "ports": [{"name": "tcp", "port": 7000}]}}));
    svcs.create(&pp, &svc).await.unwrap();
    for p in ["whoami", "client"] {
        running(&pods, p).await;
    }
    let ip_of = |p: Pod| p.status.unwrap().pod_ip.unwrap();
    let server_ip = ip_of(pods.get("whoami").await.unwrap());
    let client_ip = ip_of(pods.get("client").await.unwrap());
    let cluster_ip = svcs
        .get("whoami")
        .await
        .unwrap()
        .spec
        .unwrap()
        .cluster_ip
        .unwrap();
    let ask = |to: String, port: &'static str| {
        let pods = pods.clone();
        async move {
            let (out, err, _) = exec_in(&pods, "client", &["python3", "-c", ASK, &to, port]).await;
            assert!(err.is_empty(), "{err}");
            out.trim().to_string()
        }
    };
    // Pod to Pod: the client Pod's address, as on a real cluster.
    assert_eq!(ask(server_ip.clone(), "7000").await, client_ip);
    // Through the Service: the proxy keeps the client's address.
    let through = eventually("the Service to forward", || async {
        let (out, _, st) = exec_in(
            &pods,
            "client",
            &["python3", "-c", ASK, &cluster_ip, "7000"],
        )
        .await;
        (st.and_then(|s| s.status).as_deref() == Some("Success")).then(|| out.trim().to_string())
    })
    .await;
    assert_eq!(through, client_ip);
    // A Pod's own localhost stays 127.0.0.1.
    let (own, _, _) = exec_in(
        &pods,
        "whoami",
        &["python3", "-c", ASK, "127.0.0.1", "7001"],
    )
    .await;
    assert_eq!(own.trim(), "127.0.0.1");
    // The host is no Pod: its connections keep 127.0.0.1.
    let mut host = tokio::net::TcpStream::connect((server_ip.as_str(), 7000))
        .await
        .unwrap();
    let mut got = String::new();
    tokio::io::AsyncReadExt::read_to_string(&mut host, &mut got)
        .await
        .unwrap();
    assert_eq!(got, "127.0.0.1");
}
