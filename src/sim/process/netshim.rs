//! A Pod's own source address. Containers of the process runtime share the
//! host's network namespace, so the kernel gives every connection to a
//! loopback address the source 127.0.0.1 — where a real Pod's connections
//! come from its Pod IP. Whatever reads the peer address then sees the
//! wrong thing: a `pg_hba.conf` rule scoped to another Pod's address
//! (blue/green's subscriber, docs/major-upgrades.md) can never match, and
//! `pg_stat_replication.client_addr` names no replica.
//!
//! The fix is a tiny `LD_PRELOAD` library, compiled once per process from
//! the C below with the host's `cc` (the crate forbids unsafe code, and a
//! network namespace per Pod would need a bridge and routes to the API
//! server): its `connect()` binds a still-unbound IPv4 socket to the Pod IP
//! (`PGFLEET_SIM_POD_IP`) before connecting to a 127.0.0.0/8 address other
//! than 127.0.0.1 — that one is the Pod's own localhost on a real cluster,
//! and a connection there keeps 127.0.0.1. Every container process and
//! `pods/exec` gets it through its environment. Without `cc` the runtime
//! runs without it (a warning) and sources stay 127.0.0.1, as before.
//!
//! The Service proxy keeps the client's address the same way (kube-proxy
//! forwards with the client's source), see `proxy::connect_from`.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The variable the library reads the Pod IP from.
pub const POD_IP_VAR: &str = "PGFLEET_SIM_POD_IP";

const SOURCE: &str = r#"
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*connect_fn)(int, const struct sockaddr *, socklen_t);

int connect(int fd, const struct sockaddr *addr, socklen_t len) {
    static connect_fn real;
    if (!real) real = (connect_fn)dlsym(RTLD_NEXT, "connect");
    const char *ip = getenv("PGFLEET_SIM_POD_IP");
    if (ip && addr && addr->sa_family == AF_INET && len >= sizeof(struct sockaddr_in)) {
        const struct sockaddr_in *to = (const struct sockaddr_in *)addr;
        unsigned long dst = ntohl(to->sin_addr.s_addr);
        struct sockaddr_in self;
        socklen_t self_len = sizeof self;
        memset(&self, 0, sizeof self);
        if ((dst >> 24) == 127 && dst != 0x7f000001UL
            && getsockname(fd, (struct sockaddr *)&self, &self_len) == 0
            && self.sin_family == AF_INET && self.sin_port == 0
            && self.sin_addr.s_addr == htonl(INADDR_ANY)) {
            struct sockaddr_in src;
            memset(&src, 0, sizeof src);
            src.sin_family = AF_INET;
            if (inet_pton(AF_INET, ip, &src.sin_addr) == 1) {
                int saved = errno;
                (void)bind(fd, (struct sockaddr *)&src, sizeof src);
                errno = saved;
            }
        }
    }
    return real(fd, addr, len);
}
"#;

/// The library's path, compiled on first use; `None` when it cannot be
/// built (logged once).
pub fn library() -> Option<&'static Path> {
    static LIB: OnceLock<Option<PathBuf>> = OnceLock::new();
    LIB.get_or_init(|| match build() {
        Ok(p) => Some(p),
        Err(e) => {
            tracing::warn!(error = %e, "no Pod source addresses: connections from Pods come from 127.0.0.1");
            None
        }
    })
    .as_deref()
}

/// The environment a container's processes get for it.
pub fn env(pod_ip: &str) -> Vec<(String, String)> {
    match library() {
        Some(lib) if !pod_ip.is_empty() => vec![
            ("LD_PRELOAD".into(), lib.display().to_string()),
            (POD_IP_VAR.into(), pod_ip.into()),
        ],
        _ => vec![],
    }
}

/// Compiles the library into /var/tmp (not /tmp: every Pod gets a /tmp of
/// its own, and the path must resolve inside the containers too), named by
/// the source's hash so builds of other versions never clash.
fn build() -> Result<PathBuf, String> {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    SOURCE.hash(&mut h);
    let dir = PathBuf::from("/var/tmp");
    let lib = dir.join(format!("pgfleet-sim-netshim-{:016x}.so", h.finish()));
    if lib.exists() {
        return Ok(lib);
    }
    let tag = format!("{}-{:x}", std::process::id(), rand::random::<u32>());
    let src = dir.join(format!("pgfleet-sim-netshim-{tag}.c"));
    let tmp = dir.join(format!("pgfleet-sim-netshim-{tag}.so"));
    std::fs::write(&src, SOURCE).map_err(|e| format!("writing {}: {e}", src.display()))?;
    let out = std::process::Command::new("cc")
        .args(["-shared", "-fPIC", "-O2", "-o"])
        .arg(&tmp)
        .arg(&src)
        .arg("-ldl")
        .output();
    let _ = std::fs::remove_file(&src);
    let out = out.map_err(|e| format!("running cc: {e}"))?;
    if !out.status.success() {
        let _ = std::fs::remove_file(&tmp);
        return Err(format!(
            "cc failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    {
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(0o755))
            .map_err(|e| format!("chmod {}: {e}", tmp.display()))?;
    }
    // Atomic: a concurrent build by another process renames over the same
    // content.
    std::fs::rename(&tmp, &lib).map_err(|e| format!("renaming to {}: {e}", lib.display()))?;
    Ok(lib)
}
