//! Loopback address allocation. Pods and Services of the embedded clusters get
//! addresses in 127.0.0.0/8 so that, with the process runtime, real programs
//! can listen on them side by side (Linux routes all of 127/8 to `lo`).

use std::collections::HashSet;
use std::net::Ipv4Addr;
use std::sync::Mutex;

/// Hands out addresses from one /16 for pods and one for services.
pub struct Ipam {
    pod_net: [u8; 2],
    svc_net: [u8; 2],
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    next_pod: u32,
    next_svc: u32,
    used: HashSet<Ipv4Addr>,
    next_node_port: u16,
    node_ports: HashSet<u16>,
}

/// kube-apiserver's default `--service-node-port-range`.
pub const NODE_PORTS: std::ops::RangeInclusive<u16> = 30000..=32767;

impl Ipam {
    /// Cluster `index` gets pods in 127.(10+i).0.0/16 and services in
    /// 127.(120+i).0.0/16; beyond 100 clusters the ranges repeat, which only
    /// matters for the process runtime (it runs a handful of clusters).
    pub fn for_cluster(index: usize) -> Self {
        let i = (index % 100) as u8;
        Ipam {
            pod_net: [127, 10 + i],
            svc_net: [127, 120 + i],
            // Pod and Service addresses are listened on by real programs
            // (PostgreSQL, the proxy) with the process runtime; a random
            // start keeps clusters of different processes (parallel tests,
            // two sims) from picking the same ones. The bind check at
            // allocation cannot: both pick an address before either listens,
            // and the loser's PostgreSQL then never starts.
            state: Mutex::new(State {
                next_pod: rand::random_range(0..60_000),
                next_svc: rand::random_range(0..60_000),
                next_node_port: rand::random_range(0..2_000),
                ..State::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// A free node port (NodePort and LoadBalancer Services; the ports are
    /// per cluster, as node ports are). None when all are taken.
    pub fn node_port(&self) -> Option<u16> {
        let mut st = self.state();
        let (lo, n) = (*NODE_PORTS.start(), NODE_PORTS.len() as u16);
        for _ in 0..n {
            st.next_node_port = (st.next_node_port + 1) % n;
            let p = lo + st.next_node_port;
            if st.node_ports.insert(p) {
                return Some(p);
            }
        }
        None
    }

    /// Takes node port `p` (one a client asked for, or read back); false
    /// when another Service holds it.
    pub fn reserve_node_port(&self, p: u16) -> bool {
        self.state().node_ports.insert(p)
    }

    pub fn release_node_port(&self, p: u16) {
        self.state().node_ports.remove(&p);
    }

    /// Marks an address as taken (addresses read back from persisted state).
    pub fn reserve(&self, ip: &str) {
        if let Ok(ip) = ip.parse() {
            self.state().used.insert(ip);
        }
    }

    pub fn release(&self, ip: &str) {
        if let Ok(ip) = ip.parse::<Ipv4Addr>() {
            self.state().used.remove(&ip);
        }
    }

    pub fn pod_ip(&self) -> String {
        self.alloc(true)
    }

    pub fn service_ip(&self) -> String {
        self.alloc(false)
    }

    fn alloc(&self, pod: bool) -> String {
        let net = if pod { self.pod_net } else { self.svc_net };
        let mut st = self.state();
        for _ in 0..65_000 {
            let n = if pod {
                &mut st.next_pod
            } else {
                &mut st.next_svc
            };
            *n = (*n % 65_000) + 1;
            let host = *n + 1; // skip .0.0 and .0.1
            let ip = Ipv4Addr::new(net[0], net[1], (host >> 8) as u8, (host & 0xff) as u8);
            if ip.octets()[3] == 0 || ip.octets()[3] == 255 {
                continue;
            }
            if st.used.insert(ip) {
                return ip.to_string();
            }
        }
        // Exhausted: reuse is better than failing the write.
        Ipv4Addr::new(net[0], net[1], 255, 254).to_string()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_unique_and_skip_reserved() {
        let ipam = Ipam::for_cluster(2);
        ipam.reserve("127.12.0.2");
        let a = ipam.pod_ip();
        let b = ipam.pod_ip();
        assert_ne!(a, b);
        assert_ne!(a, "127.12.0.2");
        assert!(a.starts_with("127.12."));
        assert!(ipam.service_ip().starts_with("127.122."));
    }

    #[test]
    fn node_ports_stay_in_range_and_are_not_handed_out_twice() {
        let ipam = Ipam::for_cluster(0);
        assert!(ipam.reserve_node_port(30_000));
        assert!(!ipam.reserve_node_port(30_000));
        let mut seen = HashSet::from([30_000]);
        while let Some(p) = ipam.node_port() {
            assert!(NODE_PORTS.contains(&p) && seen.insert(p), "{p}");
        }
        assert_eq!(seen.len(), NODE_PORTS.len());
        ipam.release_node_port(31_000);
        assert_eq!(ipam.node_port(), Some(31_000));
    }
}
