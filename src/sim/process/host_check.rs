//! Whether this machine can run the process runtime: it starts containers
//! as root (namespaces, then a drop to an unprivileged user), needs util-linux's
//! `unshare`, `nsenter` and `setpriv`, and an installed PostgreSQL for the
//! `postgres:*` images. `pgfleet sim` picks its default runtime from this.

use std::path::Path;

/// Why the process runtime cannot run here, or `Ok` when it can;
/// `run_as` is the local user it would fall back to (`SimOptions::run_as`).
pub fn check(run_as: Option<&str>) -> Result<(), String> {
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
    if let Some(user) = run_as
        && super::volumes::lookup_user(user).is_err()
    {
        return Err(format!("there is no `{user}` user"));
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
