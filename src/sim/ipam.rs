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
}

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
                ..State::default()
            }),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
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
}
