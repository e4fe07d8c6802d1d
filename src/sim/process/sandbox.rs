//! How a container's processes are set up, with util-linux tools only (the
//! crate forbids unsafe code, so no namespace or signal syscalls of its own).
//!
//! How a container runs (util-linux only, no unsafe code):
//!
//! ```text
//! setpriv --pdeathsig KILL --                  # dies with the runtime thread
//!   unshare --mount --pid --uts --fork --kill-child --mount-proc --propagation private --
//!     /bin/sh -c '<bind mounts>; mount --bind <hosts> /etc/hosts;
//!                 mount --bind <tmp> /tmp; hostname <pod>; cd <workingDir>;
//!                 exec setpriv --pdeathsig KILL --reuid=postgres --regid=postgres \
//!                      --init-groups -- "$@"' sh <argv>
//! ```
//!
//! The private mount namespace makes the Pod spec's absolute mount paths
//! resolve to the volume directories, gives each Pod its own /tmp (where
//! PostgreSQL puts its socket) and its own /etc/hosts (the runtime's DNS); the
//! UTS namespace gives it the Pod's hostname. The
//! PID namespace makes the container's main process PID 1 there: when it
//! exits, the kernel kills everything else in the container, as it does in a
//! real one, and `--pdeathsig` (outside, and again after the uid change,
//! which clears the one `--kill-child` set) ties the container's life to the
//! runtime: when the runtime's process or thread ends, so does the container. `pods/exec` and exec probes enter the same namespaces with
//! `nsenter --mount --pid --uts` and drop to the same user with `setpriv`.

use super::spec::ContainerSpec;
use super::volumes::{PodDirs, RunUser};
use anyhow::Context;
use std::time::Duration;

/// How to enter a running container: its PID-1's host pid, user, env.
#[derive(Debug, Clone)]
pub struct Entry {
    pub pid: u32,
    pub user: RunUser,
    pub env: Vec<(String, String)>,
    pub working_dir: String,
}

impl Entry {
    /// A command that runs `argv` inside the container (stdin null, output inherited).
    pub fn command(&self, argv: &[String]) -> tokio::process::Command {
        let mut cmd = tokio::process::Command::new("nsenter");
        cmd.arg(format!("--target={}", self.pid))
            .args(["--mount", "--pid", "--uts"])
            .arg(format!("--wd={}", self.working_dir))
            .args(["--", "setpriv", "--pdeathsig", "KILL"])
            .arg(format!("--reuid={}", self.user.uid))
            .arg(format!("--regid={}", self.user.gid))
            .args(["--init-groups", "--"])
            .args(argv)
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .current_dir("/")
            .stdin(std::process::Stdio::null())
            .kill_on_drop(true);
        cmd
    }
}

/// Quotes a string for sh.
fn q(s: &str) -> String {
    format!("'{}'", s.replace('\'', "'\\''"))
}

/// Sends a signal to pids with kill(1) (the crate forbids unsafe code, so no
/// kill(2) binding).
pub fn signal(pids: &[u32], sig: &str) {
    if pids.is_empty() {
        return;
    }
    let _ = std::process::Command::new("kill")
        .args(["-s", sig, "--"])
        .args(pids.iter().map(u32::to_string))
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status();
}

/// Every process in the PID namespace whose PID 1 is `init` (host pids).
pub fn ns_members(init: u32) -> Vec<u32> {
    let Ok(ns) = std::fs::read_link(format!("/proc/{init}/ns/pid")) else {
        return vec![];
    };
    let mut out = vec![init];
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if pid != init && std::fs::read_link(e.path().join("ns/pid")).is_ok_and(|l| l == ns) {
            out.push(pid);
        }
    }
    out
}

/// The shell script that sets up the mount namespace and drops privileges.
///
/// Mount order: parents before children, and mounts whose target would
/// hide the source of another mount (a `/tmp` volume while the sim
/// directory lives under the host's /tmp) after all others, since a
/// source is resolved when it is mounted.
pub fn script(spec: &ContainerSpec, user: &RunUser, dirs: &PodDirs) -> String {
    let mut mounts: Vec<(String, String, bool)> = spec
        .mounts
        .iter()
        .map(|m| {
            (
                m.source.to_string_lossy().into_owned(),
                m.target.clone(),
                m.read_only,
            )
        })
        .collect();
    mounts.push((
        dirs.hosts().to_string_lossy().into_owned(),
        "/etc/hosts".into(),
        false,
    ));
    if !mounts.iter().any(|m| m.1 == "/tmp") {
        mounts.push((
            dirs.tmp().to_string_lossy().into_owned(),
            "/tmp".into(),
            false,
        ));
    }
    let sources: Vec<String> = mounts.iter().map(|m| m.0.clone()).collect();
    let hides = |target: &str| {
        let t = format!("{}/", target.trim_end_matches('/'));
        sources.iter().any(|s| s.starts_with(&t))
    };
    // A mount below a hiding one (a volume under /tmp) cannot be made
    // after it (its source is hidden by then): it goes onto the hiding
    // mount's source first, and the hiding mount carries it (`--rbind`).
    let hiding: Vec<(String, String)> = mounts
        .iter()
        .filter(|m| hides(&m.1))
        .map(|m| (m.0.clone(), m.1.clone()))
        .collect();
    let mut recursive = vec![];
    for m in mounts.iter_mut() {
        if let Some((hsrc, htgt)) = hiding
            .iter()
            .find(|(_, t)| m.1.starts_with(&format!("{}/", t.trim_end_matches('/'))))
        {
            m.1 = format!("{hsrc}{}", &m.1[htgt.trim_end_matches('/').len()..]);
        } else if hides(&m.1) {
            recursive.push(m.1.clone());
        }
    }
    mounts.sort_by_key(|m| (hides(&m.1), m.1.matches('/').count()));
    let mut s = String::from("set -e\n");
    for (src, tgt, ro) in &mounts {
        let bind = if recursive.contains(tgt) {
            "--rbind"
        } else {
            "--bind"
        };
        let (src, tgt) = (q(src), q(tgt));
        s.push_str(&format!(
            "[ -e {src} ] || mkdir -p {src}\nif [ -d {src} ]; then mkdir -p {tgt}; elif [ ! -e {tgt} ]; then mkdir -p \"$(dirname {tgt})\"; : > {tgt}; fi\nmount {bind} {src} {tgt}\n"
        ));
        if *ro {
            s.push_str(&format!("mount -o remount,bind,ro {tgt}\n"));
        }
    }
    if let Some((_, h)) = spec.env.iter().find(|(k, _)| k == "HOSTNAME") {
        s.push_str(&format!("hostname {} 2>/dev/null || true\n", q(h)));
    }
    s.push_str(&format!(
        "cd {} 2>/dev/null || cd /\nexec setpriv --pdeathsig KILL --reuid={} --regid={} --init-groups -- \"$@\"\n",
        q(&spec.working_dir),
        user.uid,
        user.gid
    ));
    s
}

pub fn spawn(
    spec: &ContainerSpec,
    user: &RunUser,
    dirs: &PodDirs,
) -> anyhow::Result<tokio::process::Child> {
    let mut cmd = tokio::process::Command::new("setpriv");
    cmd.args([
        "--pdeathsig",
        "KILL",
        "--",
        "unshare",
        "--mount",
        "--pid",
        "--uts",
        "--fork",
    ])
    .args([
        "--kill-child",
        "--mount-proc",
        "--propagation",
        "private",
        "--",
        "/bin/sh",
        "-c",
    ])
    .arg(script(spec, user, dirs))
    .arg("sh")
    .args(&spec.argv)
    .env_clear()
    .envs(spec.env.iter().map(|(k, v)| (k, v)))
    .current_dir("/")
    .process_group(0)
    .stdin(std::process::Stdio::null())
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .kill_on_drop(true);
    cmd.spawn()
        .with_context(|| format!("starting container {} ({:?})", spec.name, spec.argv))
}

/// The PID 1 of the container: the child unshare forked.
pub async fn find_init(unshare: u32) -> Option<u32> {
    for _ in 0..200 {
        let children =
            std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).ok()?;
        if let Some(pid) = children.split_whitespace().find_map(|p| p.parse().ok()) {
            return Some(pid);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}
