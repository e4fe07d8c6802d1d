//! Whether this machine can run the process runtime: it starts containers
//! as root (namespaces, then a drop to `postgres`), needs util-linux's
//! `unshare`, `nsenter` and `setpriv`, and an installed PostgreSQL for the
//! `postgres:*` images. `pgfleet sim` picks its default runtime from this.

use std::path::Path;

/// Why the process runtime cannot run here, or `Ok` when it can.
pub fn check() -> Result<(), String> {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let euid = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|l| l.split_whitespace().nth(1))
        .unwrap_or("");
    if euid != "0" {
        return Err("it starts containers as root (mount and PID namespaces)".into());
    }
    for tool in ["unshare", "nsenter", "setpriv"] {
        if !on_path(tool) {
            return Err(format!("util-linux `{tool}` is not on PATH"));
        }
    }
    if super::volumes::lookup_user(super::RUN_AS).is_err() {
        return Err(format!("there is no `{}` user", super::RUN_AS));
    }
    let installed = std::fs::read_dir("/usr/lib/postgresql")
        .into_iter()
        .flatten()
        .flatten()
        .any(|e| e.path().join("bin/postgres").exists());
    if !installed {
        return Err("no PostgreSQL under /usr/lib/postgresql/<major>/bin".into());
    }
    Ok(())
}

fn on_path(tool: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| Path::new(&d).join(tool).is_file()))
}
