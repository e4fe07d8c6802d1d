//! The Service proxy (kube-proxy's job): each ClusterIP Service with a
//! selector listens on its ClusterIP (a loopback address) and ports, and
//! forwards every connection to a ready Pod its selector picks (round robin),
//! splicing bytes with tokio. It follows changes: when a Pod stops being
//! selected or ready (or is partitioned), open connections to it are closed,
//! so clients reconnect and land on the new backend, as after a failover.
//! A Service without a ready backend does not listen: connects are refused,
//! as with kube-proxy's REJECT rule.
//!
//! A Service of type LoadBalancer is also served on its ingress IP (the
//! same ports and backends): the exposed endpoint other member clusters
//! dial. Connections there pass a network-fault [`Gate`] — cut between
//! member clusters ([`crate::network`]), they are reset at once (one
//! listener serves every origin, so a refusal per origin cannot be a
//! closed port) and open ones are dropped when a cut appears.

use super::endpoints;
use super::origin::{Gate, Origin};
use super::probes::PortRef;
use crate::cluster::Cluster;
use crate::json_ptr::Ptr;
use crate::resources::ResKey;
use crate::selector::LabelSelector;
use crate::store::{StoredObject, str_at};
use serde_json::Value;
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// One Pod a Service forwards to.
#[derive(Debug, Clone, PartialEq)]
pub struct Backend {
    pub pod: String,
    pub uid: String,
    pub ip: String,
    /// Named container ports, for named targetPorts.
    pub ports: HashMap<String, u16>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct SvcPort {
    pub name: String,
    pub port: u16,
    pub target: PortRef,
}

type Backends = Arc<Vec<Backend>>;

/// A proxied Service: its listeners and the backends they forward to.
struct SvcRun {
    uid: String,
    ip: String,
    /// The LoadBalancer ingress IP, also listened on.
    ingress: Option<String>,
    ports: Vec<SvcPort>,
    backends: watch::Sender<Backends>,
    listeners: Vec<JoinHandle<()>>,
}

impl Drop for SvcRun {
    fn drop(&mut self) {
        for l in &self.listeners {
            l.abort();
        }
    }
}

#[derive(Default)]
pub struct Proxy {
    services: Mutex<HashMap<String, SvcRun>>,
}

fn key(plural: &str) -> ResKey {
    ResKey {
        group: String::new(),
        plural: plural.into(),
    }
}

/// Whether the Pod counts as a ready endpoint.
pub fn pod_ready(p: &Value) -> bool {
    p.ptr("/metadata/deletionTimestamp").is_none()
        && !str_at(p, "/status/podIP").is_empty()
        && p.ptr("/status/conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|c| str_at(c, "/type") == "Ready" && str_at(c, "/status") == "True")
}

/// Named container ports of a Pod.
pub fn pod_ports(p: &Value) -> HashMap<String, u16> {
    let mut out = HashMap::new();
    for ct in p
        .ptr("/spec/containers")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        for port in ct
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let (name, n) = (
                str_at(port, "/name"),
                port.get("containerPort").and_then(Value::as_u64),
            );
            if let (false, Some(n)) = (name.is_empty(), n.and_then(|n| u16::try_from(n).ok())) {
                out.insert(name.to_string(), n);
            }
        }
    }
    out
}

/// The Service's selector, None when it has none (not proxied here).
fn selector(svc: &Value) -> Option<LabelSelector> {
    let m = svc.ptr("/spec/selector")?.as_object()?;
    (!m.is_empty()).then(|| LabelSelector::from_map(m))
}

fn svc_ports(svc: &Value) -> Vec<SvcPort> {
    svc.ptr("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|p| matches!(str_at(p, "/protocol"), "" | "TCP"))
        .filter_map(|p| {
            let port = u16::try_from(p.get("port")?.as_u64()?).ok()?;
            Some(SvcPort {
                name: str_at(p, "/name").to_string(),
                port,
                target: PortRef::from_value(p.get("targetPort")).unwrap_or(PortRef::Num(port)),
            })
        })
        .collect()
}

/// Pods of the Service's namespace its selector picks.
fn selected(svc: &Value, sel: &LabelSelector, pods: &[Arc<StoredObject>]) -> Vec<Value> {
    let ns = str_at(svc, "/metadata/namespace");
    pods.iter()
        .filter(|p| p.namespace() == ns && sel.matches_object(p))
        .map(|p| p.value())
        .collect()
}

impl Proxy {
    /// Brings listeners and backends in line with the Services and Pods in
    /// the store; `partitioned` Pods get no traffic.
    pub fn sync(&self, c: &Arc<Cluster>, partitioned: &HashSet<String>) {
        let (services, _) = c.store.list(&key("services"), None, None);
        let (pods, _) = c.store.list(&key("pods"), None, None);
        let mut wanted = HashSet::new();
        let mut g = self.services.lock().unwrap_or_else(|e| e.into_inner());
        for s in &services {
            let svc = &s.value();
            let ip = str_at(svc, "/spec/clusterIP");
            let Some(sel) = selector(svc) else { continue };
            if ip.is_empty() || ip == "None" || str_at(svc, "/spec/type") == "ExternalName" {
                continue;
            }
            let id = format!(
                "{}/{}",
                str_at(svc, "/metadata/namespace"),
                str_at(svc, "/metadata/name")
            );
            let picked = selected(svc, &sel, &pods);
            let backends: Vec<Backend> = picked
                .iter()
                .filter(|p| pod_ready(p))
                .map(|p| Backend {
                    pod: format!(
                        "{}/{}",
                        str_at(p, "/metadata/namespace"),
                        str_at(p, "/metadata/name")
                    ),
                    uid: str_at(p, "/metadata/uid").to_string(),
                    ip: str_at(p, "/status/podIP").to_string(),
                    ports: pod_ports(p),
                })
                .filter(|b| !partitioned.contains(&b.pod))
                .collect();
            let ports = svc_ports(svc);
            let ingress = (str_at(svc, "/spec/type") == "LoadBalancer")
                .then(|| crate::lb::ingress_ips(svc).into_iter().next())
                .flatten();
            let same = g.get(&id).is_some_and(|r| {
                r.uid == s.uid() && r.ip == ip && r.ports == ports && r.ingress == ingress
            });
            if same {
                if let Some(r) = g.get(&id) {
                    r.backends.send_if_modified(|cur| {
                        let changed = **cur != backends;
                        if changed {
                            *cur = Arc::new(backends);
                        }
                        changed
                    });
                }
            } else {
                let addrs = Addrs {
                    cluster_ip: ip.to_string(),
                    ingress,
                    gate: Gate {
                        target: Arc::downgrade(c),
                    },
                };
                g.insert(id.clone(), SvcRun::start(s.uid(), addrs, ports, backends));
            }
            wanted.insert(id);
            endpoints::write(c, svc, &picked.iter().collect::<Vec<_>>());
        }
        let gone: Vec<String> = g.keys().filter(|k| !wanted.contains(*k)).cloned().collect();
        for id in gone {
            g.remove(&id);
            if let Some((ns, name)) = id.split_once('/')
                && c.store.get(&key("services"), ns, name).is_none()
            {
                endpoints::remove(c, ns, name);
            }
        }
    }

    /// The backends a Service forwards to now (tests, diagnostics).
    pub fn backends(&self, ns: &str, name: &str) -> Vec<Backend> {
        let g = self.services.lock().unwrap_or_else(|e| e.into_inner());
        g.get(&format!("{ns}/{name}"))
            .map(|r| r.backends.borrow().as_ref().clone())
            .unwrap_or_default()
    }
}

/// Where a Service is served: its ClusterIP and, for a LoadBalancer, its
/// ingress IP behind the network-fault gate of its cluster.
struct Addrs {
    cluster_ip: String,
    ingress: Option<String>,
    gate: Gate,
}

impl SvcRun {
    fn start(uid: &str, addrs: Addrs, ports: Vec<SvcPort>, backends: Vec<Backend>) -> SvcRun {
        let (tx, _) = watch::channel(Arc::new(backends));
        let rr = Arc::new(AtomicUsize::new(0));
        let on = |ip: &str, gate: Option<Gate>| {
            ports
                .iter()
                .map(|p| {
                    tokio::spawn(listen(
                        ip.to_string(),
                        p.clone(),
                        tx.subscribe(),
                        rr.clone(),
                        gate.clone(),
                    ))
                })
                .collect::<Vec<_>>()
        };
        let mut listeners = on(&addrs.cluster_ip, None);
        if let Some(ingress) = &addrs.ingress {
            listeners.extend(on(ingress, Some(addrs.gate.clone())));
        }
        SvcRun {
            uid: uid.to_string(),
            ip: addrs.cluster_ip,
            ingress: addrs.ingress,
            ports,
            backends: tx,
            listeners,
        }
    }
}

/// Accepts on `ip:port` while the Service has a ready backend and hands each
/// connection to [`forward`]. Without one nothing listens, so a connect is
/// refused, as kube-proxy's REJECT rule for a Service without endpoints does
/// (accepting and closing instead would tell a client such as a WAL
/// receiver "server closed the connection unexpectedly", an error a real
/// cluster never gives there).
async fn listen(
    ip: String,
    port: SvcPort,
    mut backends: watch::Receiver<Backends>,
    rr: Arc<AtomicUsize>,
    gate: Option<Gate>,
) {
    loop {
        while backends.borrow_and_update().is_empty() {
            if backends.changed().await.is_err() {
                return;
            }
        }
        let listener = bind(&ip, port.port).await;
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((sock, _)) = accepted else {
                        tokio::time::sleep(Duration::from_millis(50)).await;
                        continue;
                    };
                    let conn = Conn { target: port.target.clone(), rx: backends.clone(), rr: rr.clone() };
                    match gate.clone() {
                        None => { tokio::spawn(forward(sock, conn, None)); }
                        Some(g) => { tokio::spawn(forward_gated(sock, conn, g)); }
                    }
                }
                changed = backends.changed() => {
                    if changed.is_err() {
                        return;
                    }
                    if backends.borrow().is_empty() {
                        break;
                    }
                }
            }
        }
    }
}

/// Binds `ip:port`, retrying while the address is taken.
async fn bind(ip: &str, port: u16) -> TcpListener {
    let mut warned = false;
    loop {
        match TcpListener::bind((ip, port)).await {
            Ok(l) => return l,
            Err(e) => {
                if !warned {
                    tracing::warn!(%ip, port, error = %e, "service proxy cannot listen yet; retrying");
                    warned = true;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        }
    }
}

/// Connects to a backend from the client's own address when that is a
/// Pod's (127.0.0.0/8 but not 127.0.0.1, see `netshim`), as kube-proxy
/// forwards with the client's source: the backend sees who connected.
async fn connect_from(
    source: Option<std::net::IpAddr>,
    ip: &str,
    port: u16,
) -> std::io::Result<TcpStream> {
    let to = std::net::SocketAddr::new(
        ip.parse()
            .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidInput, e))?,
        port,
    );
    let socket = tokio::net::TcpSocket::new_v4()?;
    if let Some(std::net::IpAddr::V4(src)) = source
        && src.is_loopback()
        && src != std::net::Ipv4Addr::LOCALHOST
    {
        // Best effort: without it the backend sees 127.0.0.1, as before.
        let _ = socket.bind(std::net::SocketAddr::new(src.into(), 0));
    }
    socket.connect(to).await
}

/// What one proxied connection forwards to.
struct Conn {
    target: PortRef,
    rx: watch::Receiver<Backends>,
    rr: Arc<AtomicUsize>,
}

/// A connection to an exposed endpoint: reset at once when a network cut
/// separates its origin from the Service's cluster, else forwarded until
/// one does.
async fn forward_gated(client: TcpStream, conn: Conn, gate: Gate) {
    let (Ok(peer), Ok(local)) = (client.peer_addr(), client.local_addr()) else {
        return;
    };
    let mut origin = Origin::Unresolved;
    if gate.cut(&mut origin, peer, local).await {
        let _ = client.set_zero_linger();
        return;
    }
    let mut changes = crate::network::subscribe();
    let cut = async move {
        loop {
            if changes.changed().await.is_err() {
                return std::future::pending().await;
            }
            if gate.cut(&mut origin, peer, local).await {
                return;
            }
        }
    };
    forward(client, conn, Some(Box::pin(cut))).await;
}

type Cut = std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send>>;

/// Connects to a backend and splices until either side closes, the
/// backend leaves the Service or `cut` ends (then the client is reset).
async fn forward(mut client: TcpStream, conn: Conn, cut: Option<Cut>) {
    let Conn { target, mut rx, rr } = conn;
    let source = client.peer_addr().ok().map(|a| a.ip());
    let list = rx.borrow_and_update().clone();
    if list.is_empty() {
        // The last backend left while this connection was being accepted
        // (a race the listener closes right after).
        return;
    }
    let start = rr.fetch_add(1, Ordering::Relaxed);
    let mut chosen = None;
    for i in 0..list.len() {
        let b = &list[(start + i) % list.len()];
        let Some(port) = target.resolve(&b.ports) else {
            continue;
        };
        let connect = connect_from(source, &b.ip, port);
        if let Ok(Ok(s)) = tokio::time::timeout(Duration::from_secs(3), connect).await {
            chosen = Some((s, b.uid.clone()));
            break;
        }
    }
    let Some((mut server, uid)) = chosen else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let left = async {
        loop {
            if rx.changed().await.is_err() {
                return;
            }
            if !rx.borrow().iter().any(|b| b.uid == uid) {
                return;
            }
        }
    };
    let cut = async move {
        match cut {
            Some(c) => c.await,
            None => std::future::pending().await,
        }
    };
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut client, &mut server) => {}
        _ = left => {}
        _ = cut => {
            let _ = client.set_zero_linger();
            let _ = server.set_zero_linger();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn free_port() -> u16 {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    }

    /// Connects until the outcome is a connection (`ok`) or a refusal (a
    /// reset from a listener closing meanwhile is neither).
    async fn connect_until(port: u16, ok: bool) -> std::io::Result<TcpStream> {
        for _ in 0..200 {
            let r = TcpStream::connect(("127.0.0.1", port)).await;
            let refused = matches!(&r, Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused);
            if (ok && r.is_ok()) || (!ok && refused) {
                return r;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        TcpStream::connect(("127.0.0.1", port)).await
    }

    #[tokio::test]
    async fn a_service_without_backends_refuses_connections_and_listens_once_one_is_ready() {
        let (svc_port, pod_port) = (free_port(), free_port());
        let backend = TcpListener::bind(("127.0.0.1", pod_port)).await.unwrap();
        let port = SvcPort {
            name: "pg".into(),
            port: svc_port,
            target: PortRef::Num(pod_port),
        };
        let addrs = Addrs {
            cluster_ip: "127.0.0.1".into(),
            ingress: None,
            gate: Gate {
                target: std::sync::Weak::new(),
            },
        };
        let run = SvcRun::start("u", addrs, vec![port], vec![]);
        let e = connect_until(svc_port, false).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
        let b = Backend {
            pod: "ns/p".into(),
            uid: "p-1".into(),
            ip: "127.0.0.1".into(),
            ports: HashMap::new(),
        };
        run.backends.send_replace(Arc::new(vec![b]));
        let _client = connect_until(svc_port, true).await.unwrap();
        let accepted = tokio::time::timeout(Duration::from_secs(10), backend.accept()).await;
        assert!(matches!(accepted, Ok(Ok(_))), "forwarded to the backend");
        // The last backend leaves: refused again.
        run.backends.send_replace(Arc::new(vec![]));
        let e = connect_until(svc_port, false).await.unwrap_err();
        assert_eq!(e.kind(), std::io::ErrorKind::ConnectionRefused);
    }
}
