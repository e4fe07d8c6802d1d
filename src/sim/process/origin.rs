//! Which cluster a connection to an exposed endpoint (a LoadBalancer
//! ingress IP) comes from, so network cuts between member clusters
//! ([`crate::network`]) can be enforced by the proxy.
//!
//! Every Pod shares the host's network namespace and dials from 127.0.0.1,
//! so the peer address says nothing. The peer's *socket* does: the peer
//! port and our address find the client socket's inode in /proc/net/tcp,
//! the process holding that inode (a scan of /proc/<pid>/fd, only of
//! processes in a PID namespace of a running container) names the Pod,
//! and the Pod its cluster. Processes started by `pods/exec` (nsenter into
//! the container's PID namespace) count as the Pod's.
//!
//! When the lookup finds no Pod — a client on the host (the test process,
//! `kubectl port-forward`, the manager), or a socket that closed meanwhile
//! — the origin is *outside* every member cluster and no member cut applies
//! to it: the sim models cuts between member clusters, not the internet.
//!
//! The socket is found with one sock_diag netlink query (an exact lookup;
//! /proc/net/tcp only where netlink is unavailable). The lookup runs only
//! while some cluster of this process has a member cut; otherwise
//! connections are resolved only when a cut appears.

use super::ProcessRuntime;
use crate::cluster::Cluster;
use crate::network;
use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::sync::{Arc, Weak};

/// The cluster `(peer, local)`'s client socket belongs to, if a Pod of a
/// process-runtime cluster of this process holds it.
pub fn lookup(peer: SocketAddr, local: SocketAddr) -> Option<Arc<Cluster>> {
    let inode = match (peer, local) {
        (SocketAddr::V4(p), SocketAddr::V4(l)) => diag_inode(p, l),
        _ => None,
    };
    let inode = match inode {
        Some(found) => found?,
        None => socket_inode(&std::fs::read_to_string("/proc/net/tcp").ok()?, peer, local)?,
    };
    let namespaces = container_namespaces();
    if namespaces.is_empty() {
        return None;
    }
    let want = format!("socket:[{inode}]");
    for e in std::fs::read_dir("/proc").ok()?.flatten() {
        if e.file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
            .is_none()
        {
            continue;
        }
        let Ok(ns) = std::fs::read_link(e.path().join("ns/pid")) else {
            continue;
        };
        let Some(cluster) = namespaces.get(ns.as_os_str()) else {
            continue;
        };
        let fds = std::fs::read_dir(e.path().join("fd")).into_iter().flatten();
        if fds
            .flatten()
            .any(|fd| std::fs::read_link(fd.path()).is_ok_and(|l| l.as_os_str() == want.as_str()))
        {
            return cluster.upgrade();
        }
    }
    None
}

/// PID namespace (as /proc/<pid>/ns/pid reads) → cluster, for every
/// running container of every process-runtime cluster of this process.
fn container_namespaces() -> HashMap<std::ffi::OsString, Weak<Cluster>> {
    let mut out = HashMap::new();
    for (c, rt) in runtimes() {
        let pods: Vec<_> = super::lock(&rt.pods).values().cloned().collect();
        for ct in pods.iter().flat_map(|p| p.containers()) {
            if let Some(pid) = ct.state().pid
                && let Ok(ns) = std::fs::read_link(format!("/proc/{pid}/ns/pid"))
            {
                out.insert(ns.into_os_string(), Arc::downgrade(&c));
            }
        }
    }
    out
}

fn runtimes() -> Vec<(Arc<Cluster>, Arc<ProcessRuntime>)> {
    super::lock(&super::REGISTRY)
        .iter()
        .filter_map(|(c, r)| Some((c.upgrade()?, r.upgrade()?)))
        .collect()
}

/// Whether any cluster of this process cuts member traffic (else no
/// connection needs its origin).
fn any_member_cut() -> bool {
    runtimes()
        .iter()
        .any(|(c, _)| c.faults.network().members != network::Peers::None)
}

/// The inode of the TCP socket `peer` → `local` from the kernel's
/// sock_diag netlink interface, which looks one socket up by its addresses
/// (what `ss` uses). /proc/net/tcp instead walks every bucket of the
/// connection hash table: tens of milliseconds on a busy machine. `None`
/// when netlink is unavailable (then /proc/net/tcp is read), `Some(None)`
/// when there is no such socket.
fn diag_inode(peer: SocketAddrV4, local: SocketAddrV4) -> Option<Option<u64>> {
    use socket2::{Domain, Protocol, Socket, Type};
    use std::io::Read;
    const AF_NETLINK: i32 = 16;
    const NETLINK_SOCK_DIAG: i32 = 4;
    const SOCK_DIAG_BY_FAMILY: u16 = 20;
    const NLM_F_REQUEST: u16 = 1;
    let sock = Socket::new(
        Domain::from(AF_NETLINK),
        Type::DGRAM,
        Some(Protocol::from(NETLINK_SOCK_DIAG)),
    )
    .ok()?;
    sock.set_read_timeout(Some(std::time::Duration::from_secs(1)))
        .ok()?;
    let addr = |ip: &Ipv4Addr| {
        let mut a = [0u8; 16];
        a[..4].copy_from_slice(&ip.octets());
        a
    };
    // nlmsghdr (16 bytes), then inet_diag_req_v2 (56): AF_INET, TCP, no
    // extensions, every state, and the socket id (ports and addresses in
    // network order, any interface, no cookie). Without NLM_F_DUMP the
    // kernel answers with the one socket or an error.
    let mut msg = Vec::with_capacity(72);
    msg.extend(72u32.to_ne_bytes());
    msg.extend(SOCK_DIAG_BY_FAMILY.to_ne_bytes());
    msg.extend(NLM_F_REQUEST.to_ne_bytes());
    msg.extend(1u32.to_ne_bytes());
    msg.extend(0u32.to_ne_bytes());
    msg.extend([2u8, 6, 0, 0]);
    msg.extend(u32::MAX.to_ne_bytes());
    msg.extend(peer.port().to_be_bytes());
    msg.extend(local.port().to_be_bytes());
    msg.extend(addr(peer.ip()));
    msg.extend(addr(local.ip()));
    msg.extend(0u32.to_ne_bytes());
    msg.extend(u32::MAX.to_ne_bytes());
    msg.extend(u32::MAX.to_ne_bytes());
    sock.send(&msg).ok()?;
    let mut buf = [0u8; 512];
    let n = (&sock).read(&mut buf).ok()?;
    let field = |at: usize| -> Option<[u8; 4]> { buf.get(at..at + 4)?.try_into().ok() };
    let kind = u16::from_ne_bytes(buf.get(4..6)?.try_into().ok()?);
    if n < 16 + 72 || kind != SOCK_DIAG_BY_FAMILY {
        // NLMSG_ERROR: the socket is gone (or never was).
        return Some(None);
    }
    // inet_diag_msg: the inode is its last field, at 68.
    let inode = u32::from_ne_bytes(field(16 + 68)?);
    Some((inode != 0).then_some(u64::from(inode)))
}

/// The inode of the socket whose local address is `peer` and remote
/// address `local` (the other end of an accepted connection), from the
/// text of /proc/net/tcp.
pub fn socket_inode(table: &str, peer: SocketAddr, local: SocketAddr) -> Option<u64> {
    let (SocketAddr::V4(peer), SocketAddr::V4(local)) = (peer, local) else {
        return None;
    };
    let addr = |s: &str| -> Option<(Ipv4Addr, u16)> {
        let (ip, port) = s.split_once(':')?;
        let ip = u32::from_str_radix(ip, 16).ok()?;
        // The kernel prints the address as a native-endian u32 of its
        // network-order bytes.
        Some((
            Ipv4Addr::from(ip.to_ne_bytes()),
            u16::from_str_radix(port, 16).ok()?,
        ))
    };
    table.lines().skip(1).find_map(|l| {
        let f: Vec<&str> = l.split_whitespace().collect();
        let (me, them) = (addr(f.get(1)?)?, addr(f.get(2)?)?);
        (me == (*peer.ip(), peer.port()) && them == (*local.ip(), local.port()))
            .then(|| f.get(9)?.parse().ok())
            .flatten()
            .filter(|i| *i != 0)
    })
}

/// Where a connection to `target`'s exposed endpoint comes from: not looked
/// up yet, outside every member cluster, or a cluster.
#[derive(Clone)]
pub enum Origin {
    Unresolved,
    Outside,
    Cluster(Weak<Cluster>),
}

/// The network-fault check of one exposed endpoint of cluster `target`.
#[derive(Clone)]
pub struct Gate {
    pub target: Weak<Cluster>,
}

impl Gate {
    /// Resolves `origin` when a member cut exists (once), then tells
    /// whether the connection is cut.
    pub async fn cut(&self, origin: &mut Origin, peer: SocketAddr, local: SocketAddr) -> bool {
        if matches!(origin, Origin::Unresolved) {
            if !any_member_cut() {
                return false;
            }
            let started = std::time::Instant::now();
            let found = tokio::task::spawn_blocking(move || lookup(peer, local))
                .await
                .ok()
                .flatten();
            tracing::debug!(
                %peer,
                origin = found.as_ref().map(|c| c.name.as_str()).unwrap_or("outside"),
                took = ?started.elapsed(),
                "origin of a connection to an exposed endpoint"
            );
            *origin = match found {
                Some(c) => Origin::Cluster(Arc::downgrade(&c)),
                None => Origin::Outside,
            };
        }
        let (Origin::Cluster(from), Some(to)) = (&*origin, self.target.upgrade()) else {
            return false;
        };
        let Some(from) = from.upgrade() else {
            return false;
        };
        !Arc::ptr_eq(&from, &to)
            && network::members_cut(
                &from.name,
                &from.faults.network(),
                &to.name,
                &to.faults.network(),
            )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_client_socket_is_found_by_its_address_pair() {
        // 127.0.0.1:40000 -> 127.224.0.5:5432 (client), and the accepted end.
        let hex = |ip: [u8; 4]| format!("{:08X}", u32::from_ne_bytes(ip));
        let table = format!(
            "  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode\n\
             0: {a}:9C40 {b}:1538 01 00000000:00000000 00:00000000 00000000   999        0 4242 1 0\n\
             1: {b}:1538 {a}:9C40 01 00000000:00000000 00:00000000 00000000     0        0 4343 1 0\n",
            a = hex([127, 0, 0, 1]),
            b = hex([127, 224, 0, 5]),
        );
        let peer: SocketAddr = "127.0.0.1:40000".parse().unwrap();
        let local: SocketAddr = "127.224.0.5:5432".parse().unwrap();
        assert_eq!(socket_inode(&table, peer, local), Some(4242));
        assert_eq!(socket_inode(&table, local, peer), Some(4343));
        let other: SocketAddr = "127.0.0.1:40001".parse().unwrap();
        assert_eq!(socket_inode(&table, other, local), None);
    }

    #[test]
    fn a_real_local_connection_is_found_in_proc() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (_s, peer) = l.accept().unwrap();
        let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
        let inode = socket_inode(&table, peer, l.local_addr().unwrap()).unwrap();
        // Our own process holds it (not a pod: lookup says outside).
        let fd_has = std::fs::read_dir("/proc/self/fd")
            .unwrap()
            .flatten()
            .any(|f| {
                std::fs::read_link(f.path())
                    .is_ok_and(|p| p.to_string_lossy() == format!("socket:[{inode}]"))
            });
        assert!(fd_has);
        let server = l.local_addr().unwrap();
        let (SocketAddr::V4(p), SocketAddr::V4(s)) = (peer, server) else {
            unreachable!()
        };
        assert_eq!(diag_inode(p, s), Some(Some(inode)), "sock_diag agrees");
        let gone: SocketAddrV4 = "127.0.0.1:1".parse().unwrap();
        assert_eq!(diag_inode(gone, s), Some(None));
        assert!(lookup(peer, server).is_none());
        drop(c);
    }
}
