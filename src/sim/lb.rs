//! Services of type LoadBalancer: what a cloud controller (or MetalLB) does
//! on a real cluster, here for every runtime. Each such Service gets
//! `status.loadBalancer.ingress: [{ip, ipMode: VIP}]` from an external pool
//! shared by every cluster of this process, so an ingress IP names one
//! Service of one cluster — it is how a pod of another member cluster
//! reaches it (the process runtime's proxy listens there, see
//! `process::proxy`). The address goes back to the pool when the Service is
//! deleted or stops being a LoadBalancer.
//!
//! It also releases a deleted Service's node ports (allocated by
//! `kinds`, as kube-apiserver does) and re-takes stored ones after a
//! restart.
//!
//! As on a real cluster the assignment is asynchronous: a new Service shows
//! `<pending>` until this controller writes its status a moment later.

use crate::cluster::{Cluster, Sub, WriteOpts};
use crate::json_ptr::Ptr;
use crate::resources::ResKey;
use crate::store::{EventType, str_at};
use serde_json::{Value, json};
use std::collections::{BTreeSet, HashMap, HashSet};
use std::net::Ipv4Addr;
use std::sync::{Arc, Mutex, Weak};

/// The external pool: 127.224.0.0–127.239.255.255, above the pod
/// (127.10–109) and service (127.120–219) ranges of [`crate::ipam`].
const FIRST: u32 = u32::from_be_bytes([127, 224, 0, 0]);
const SIZE: u32 = 16 << 16;

struct Pool {
    /// Offset of the last address handed out; None until first use.
    next: Option<u32>,
    used: BTreeSet<Ipv4Addr>,
}

static POOL: Mutex<Pool> = Mutex::new(Pool {
    next: None,
    used: BTreeSet::new(),
});

fn pool() -> std::sync::MutexGuard<'static, Pool> {
    POOL.lock().unwrap_or_else(|e| e.into_inner())
}

/// Marks an ingress IP as taken (read back from persisted state).
pub fn reserve(ip: &str) {
    if let Ok(ip) = ip.parse() {
        pool().used.insert(ip);
    }
}

pub fn release(ip: &str) {
    if let Ok(ip) = ip.parse::<Ipv4Addr>() {
        pool().used.remove(&ip);
    }
}

/// A free ingress IP on which every port of `ports` can be bound now (so
/// one held by another process is skipped). None when the pool is used up.
pub fn allocate(ports: &[u16]) -> Option<String> {
    let mut p = pool();
    // A random start keeps sims of different processes (parallel tests)
    // from picking the same addresses; within a process they are unique.
    let mut next = p.next.unwrap_or_else(|| rand::random_range(0..SIZE));
    for _ in 0..SIZE {
        next = (next + 1) % SIZE;
        let ip = Ipv4Addr::from(FIRST + next);
        if matches!(ip.octets()[3], 0 | 255) || p.used.contains(&ip) {
            continue;
        }
        let free = ports
            .iter()
            .all(|port| std::net::TcpListener::bind((ip, *port)).is_ok());
        p.used.insert(ip);
        if free {
            p.next = Some(next);
            return Some(ip.to_string());
        }
    }
    p.next = Some(next);
    None
}

fn services() -> ResKey {
    ResKey {
        group: String::new(),
        plural: "services".into(),
    }
}

/// The ingress IPs in a Service's status.
pub fn ingress_ips(svc: &Value) -> Vec<String> {
    svc.ptr("/status/loadBalancer/ingress")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .map(|i| str_at(i, "/ip").to_string())
        .filter(|ip| !ip.is_empty())
        .collect()
}

fn is_lb(svc: &Value) -> bool {
    str_at(svc, "/spec/type") == "LoadBalancer" && svc.ptr("/metadata/deletionTimestamp").is_none()
}

fn tcp_ports(svc: &Value) -> Vec<u16> {
    svc.ptr("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| u16::try_from(p.get("port")?.as_u64()?).ok())
        .collect()
}

/// Starts the controller of `cluster`'s LoadBalancer Services.
pub fn start(cluster: &Arc<Cluster>) {
    let weak = Arc::downgrade(cluster);
    let (_, rx) = cluster.store.subscribe();
    tokio::spawn(run(weak, rx));
}

type Events = tokio::sync::broadcast::Receiver<Arc<crate::store::WatchEvent>>;

async fn run(weak: Weak<Cluster>, mut rx: Events) {
    // Ingress IPs by Service uid, to release those of Services whose
    // deletion a lagging subscription missed.
    let mut held: HashMap<String, Vec<String>> = HashMap::new();
    let mut resync = true;
    loop {
        if resync {
            let Some(c) = weak.upgrade() else { return };
            let (items, _) = c.store.list(&services(), None, None);
            let live: HashSet<String> = items.iter().map(|o| o.uid().to_string()).collect();
            held.retain(|uid, ips| {
                let keep = live.contains(uid);
                if !keep {
                    ips.iter().for_each(|ip| release(ip));
                }
                keep
            });
            for o in items {
                reconcile(&c, &mut held, EventType::Modified, &o.value());
            }
            resync = false;
        }
        match rx.recv().await {
            Ok(ev) if ev.key == services() => {
                let Some(c) = weak.upgrade() else { return };
                reconcile(&c, &mut held, ev.kind, &ev.obj.value());
            }
            Ok(_) => {}
            Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => resync = true,
            Err(_) => return,
        }
    }
}

/// Brings one Service's ingress in line with its type.
fn reconcile(c: &Cluster, held: &mut HashMap<String, Vec<String>>, kind: EventType, svc: &Value) {
    let uid = str_at(svc, "/metadata/uid").to_string();
    let ips = ingress_ips(svc);
    let node_ports = svc
        .ptr("/spec/ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| u16::try_from(p.get("nodePort")?.as_u64()?).ok());
    if kind == EventType::Deleted {
        ips.iter().for_each(|ip| release(ip));
        if let Some(old) = held.remove(&uid) {
            old.iter().for_each(|ip| release(ip));
        }
        node_ports.for_each(|n| c.ipam.release_node_port(n));
        return;
    }
    // Idempotent; after a restart this re-takes what stored Services hold.
    node_ports.for_each(|n| {
        c.ipam.reserve_node_port(n);
    });
    let want = is_lb(svc);
    if want && !ips.is_empty() {
        ips.iter().for_each(|ip| reserve(ip));
        held.insert(uid, ips);
        return;
    }
    if !want && ips.is_empty() {
        return;
    }
    let ip = if want {
        match allocate(&tcp_ports(svc)) {
            Some(ip) => Some(ip),
            None => {
                tracing::warn!(cluster = %c.name, "the LoadBalancer address pool is used up");
                return;
            }
        }
    } else {
        None
    };
    let status = match &ip {
        Some(ip) => json!({"ingress": [{"ip": ip, "ipMode": "VIP"}]}),
        None => json!({}),
    };
    let written = write_status(c, svc, status);
    match (written, ip) {
        (true, Some(ip)) => {
            held.insert(uid, vec![ip]);
        }
        (false, Some(ip)) => release(&ip),
        (true, None) => {
            ips.iter().for_each(|ip| release(ip));
            held.remove(&uid);
        }
        (false, None) => {}
    }
}

/// Writes `status.loadBalancer` of the Service (if it is still the same
/// object); whether it was written.
fn write_status(c: &Cluster, svc: &Value, lb: Value) -> bool {
    let Some(rt) = c.type_of(&services()) else {
        return false;
    };
    let (ns, name, uid) = (
        str_at(svc, "/metadata/namespace"),
        str_at(svc, "/metadata/name"),
        str_at(svc, "/metadata/uid"),
    );
    let opts = WriteOpts {
        field_manager: "service-controller".into(),
        ..Default::default()
    };
    c.write(&rt, ns, name, Sub::Status, &opts, false, |cur| {
        let mut v = cur.cloned().unwrap_or_default();
        if str_at(&v, "/metadata/uid") != uid {
            return Err(crate::error::ApiError::conflict("services", name));
        }
        v["status"]["loadBalancer"] = lb.clone();
        Ok(v)
    })
    .is_ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ingress_ips_are_unique_in_the_external_range_and_come_back_on_release() {
        let a = allocate(&[]).unwrap();
        let b = allocate(&[]).unwrap();
        assert_ne!(a, b);
        for ip in [&a, &b] {
            let o = ip.parse::<Ipv4Addr>().unwrap().octets();
            assert!(o[0] == 127 && (224..=239).contains(&o[1]), "{ip}");
        }
        reserve(&a);
        assert!(pool().used.contains(&a.parse().unwrap()));
        release(&a);
        assert!(!pool().used.contains(&a.parse().unwrap()));
    }

    #[test]
    fn a_deleted_service_gives_back_its_ingress_ip_and_node_ports() {
        let c = Cluster::new("t", crate::ipam::Ipam::for_cluster(3), 10);
        let ip = allocate(&[]).unwrap();
        assert!(c.ipam.reserve_node_port(31_234));
        let svc = json!({"metadata": {"uid": "u1"}, "spec": {"type": "LoadBalancer",
            "ports": [{"port": 80, "nodePort": 31_234}]},
            "status": {"loadBalancer": {"ingress": [{"ip": ip}]}}});
        let mut held = HashMap::new();
        reconcile(&c, &mut held, EventType::Modified, &svc);
        assert_eq!(held.get("u1"), Some(&vec![ip.clone()]));
        reconcile(&c, &mut held, EventType::Deleted, &svc);
        assert!(held.is_empty());
        assert!(!pool().used.contains(&ip.parse().unwrap()));
        assert!(
            c.ipam.reserve_node_port(31_234),
            "the node port is free again"
        );
    }
}
