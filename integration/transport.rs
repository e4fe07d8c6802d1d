//! The manager's transport to a member (`fleet::transport`): a dozen watches
//! and a burst of requests share **one** TCP connection (HTTP/2 streams),
//! while exec, which upgrades its connection, still works over HTTP/1.1
//! beside it. Counted from the kernel's socket table, not from our own
//! bookkeeping.
#![allow(clippy::unwrap_used)]

use crate::common;

use common::{eventually, temp_dir};
use futures::StreamExt as _;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret, Service};
use kube::api::{Api, AttachParams, ListParams, PostParams};
use kube::runtime::watcher;
use pgfleet::fleet::{client_from_kubeconfig, ratelimit::RateLimit};
use pgfleet::sim::{self, RuntimeKind, SimOptions};
use tokio::io::AsyncReadExt as _;

/// ESTABLISHED TCP connections of this process whose remote port is `port`
/// (the test runs the emulator in-process too, so its accepted sockets are
/// in the table as well: they have `port` as their local port instead).
fn client_connections_to(port: u16) -> usize {
    let mut n = 0;
    for table in ["/proc/self/net/tcp", "/proc/self/net/tcp6"] {
        let Ok(text) = std::fs::read_to_string(table) else {
            continue;
        };
        for line in text.lines().skip(1) {
            let cols: Vec<&str> = line.split_whitespace().collect();
            let remote_port = cols[2].rsplit(':').next().unwrap();
            if u16::from_str_radix(remote_port, 16).unwrap() == port && cols[3] == "01" {
                n += 1;
            }
        }
    }
    n
}

/// A watch on kind `K` in `ns`, consumed until aborted.
fn watch<K>(client: &kube::Client, ns: &str) -> tokio::task::JoinHandle<()>
where
    K: kube::Resource<Scope = k8s_openapi::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::de::DeserializeOwned
        + Send
        + 'static,
    K::DynamicType: Default,
{
    let api = Api::<K>::namespaced(client.clone(), ns);
    tokio::spawn(watcher(api, watcher::Config::default()).for_each(|_| async {}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn watches_and_requests_share_one_connection_and_exec_still_upgrades() {
    let dir = temp_dir("transport");
    // Declared first, dropped last: after the member stops.
    let _cleanup = pgfleet::testkit::dirs::RemoveOnDrop(dir.clone());
    let mut opts = SimOptions::new(dir.join("sim"), 1);
    opts.runtime = RuntimeKind::Host;
    let sim = sim::start(&opts).await.unwrap();
    let member = &sim.clusters[0];
    let port = member.addr.port();
    let limit = RateLimit::new(1000.0, 1000);
    let client = client_from_kubeconfig(&member.kubeconfig, None, false, &limit)
        .await
        .unwrap();

    // Twelve watches at once, as a manager keeps per member.
    let mut watches = Vec::new();
    for i in 0..3 {
        let ns = format!("ns-{i}");
        watches.push(watch::<Pod>(&client, &ns));
        watches.push(watch::<Service>(&client, &ns));
        watches.push(watch::<Secret>(&client, &ns));
        watches.push(watch::<ConfigMap>(&client, &ns));
    }
    // And a burst of writes and reads while they run.
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    let writes = (0..40).map(|i| {
        let cms = cms.clone();
        async move {
            let cm: ConfigMap = serde_json::from_value(serde_json::json!({
                "metadata": {"name": format!("cm-{i}")},
                "data": {"i": i.to_string()},
            }))
            .unwrap();
            cms.create(&PostParams::default(), &cm).await.unwrap();
        }
    });
    futures::future::join_all(writes).await;
    assert_eq!(
        cms.list(&ListParams::default()).await.unwrap().items.len(),
        40
    );

    // Concurrent first requests may each have dialled before ALPN said h2;
    // all but one are given up, so the count settles at one.
    eventually(
        "one connection to the member carries everything",
        || async { client_connections_to(port) == 1 },
    )
    .await;

    // exec upgrades an HTTP/1.1 connection of its own, beside the h2 one.
    let pods: Api<Pod> = Api::namespaced(client.clone(), "default");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "metadata": {"name": "shell"},
        "spec": {"containers": [{"name": "c", "image": "busybox"}]},
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();
    eventually("the pod runs", || async {
        pods.get("shell")
            .await
            .ok()
            .and_then(|p| p.status?.phase)
            .is_some_and(|phase| phase == "Running")
    })
    .await;
    let params = AttachParams::default().stdout(true).stderr(false);
    let mut proc = pods
        .exec("shell", ["echo", "through-an-upgrade"], &params)
        .await
        .unwrap();
    let mut out = String::new();
    proc.stdout()
        .unwrap()
        .read_to_string(&mut out)
        .await
        .unwrap();
    proc.join().await.unwrap();
    assert_eq!(out.trim(), "through-an-upgrade");

    // The upgraded connection ends with the session; the watches never left
    // theirs.
    eventually("back to the one multiplexed connection", || async {
        client_connections_to(port) == 1
    })
    .await;
    assert!(watches.iter().all(|w| !w.is_finished()));
    for w in watches {
        w.abort();
    }
}
