//! The runtime's DNS: each Pod's /etc/hosts names the Pod itself and every
//! Service (short names within its namespace), so a replica's
//! `primary_conninfo` host `orders-rw` resolves to that Service's ClusterIP.
//! The file is bind-mounted over /etc/hosts and kept current as Services come
//! and go.

use crate::store::str_at;
use anyhow::Context;
use serde_json::Value;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;

/// The /etc/hosts of a pod: itself and every Service (short names for its
/// own namespace, `<svc>.<ns>[.svc[.cluster.local]]` for all). This is the
/// runtime's DNS: names like `orders-rw` resolve to the Service's ClusterIP.
pub fn hosts_content(pod: &Value, services: &[(String, String, String)]) -> String {
    let ns = str_at(pod, "/metadata/namespace");
    let hostname = match str_at(pod, "/spec/hostname") {
        "" => str_at(pod, "/metadata/name"),
        h => h,
    };
    let mut out = String::from(
        "# Kubernetes-managed hosts file (pgfleet process runtime).\n127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n",
    );
    out.push_str(&format!("{}\t{hostname}\n", str_at(pod, "/status/podIP")));
    for (sns, name, ip) in services {
        let short = if sns == ns {
            format!(" {name}")
        } else {
            String::new()
        };
        out.push_str(&format!(
            "{ip}\t{name}.{sns}.svc.cluster.local {name}.{sns}.svc {name}.{sns}{short}\n"
        ));
    }
    out
}

/// Rewrites the hosts file in place: it is bind-mounted as a file, so it must
/// keep its inode (a rename would leave the container on the old one).
pub fn write_hosts(path: &Path, content: &str) -> anyhow::Result<()> {
    if std::fs::read_to_string(path).is_ok_and(|cur| cur == content) {
        return Ok(());
    }
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .with_context(|| format!("writing {}", path.display()))?;
    f.write_all(content.as_bytes())
        .with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o644))?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn hosts_name_services_of_the_namespace_by_short_name() {
        let pod =
            json!({"metadata": {"name": "p", "namespace": "n"}, "status": {"podIP": "127.10.0.2"}});
        let h = hosts_content(
            &pod,
            &[
                ("n".into(), "db-rw".into(), "127.120.0.2".into()),
                ("o".into(), "x".into(), "127.120.0.3".into()),
            ],
        );
        assert!(h.contains("127.120.0.2\tdb-rw.n.svc.cluster.local db-rw.n.svc db-rw.n db-rw\n"));
        assert!(h.contains("127.120.0.3\tx.o.svc.cluster.local x.o.svc x.o\n"));
        assert!(h.contains("127.10.0.2\tp\n"));
    }
}
