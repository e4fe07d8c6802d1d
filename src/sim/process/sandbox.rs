//! How a container's processes are set up, with util-linux tools only (the
//! crate forbids unsafe code, so no namespace or signal syscalls of its own).
//!
//! How a container runs (util-linux only, no unsafe code):
//!
//! ```text
//! setpriv --pdeathsig KILL --                  # dies with the runtime thread
//!   unshare --mount --pid --uts --fork --kill-child --mount-proc --propagation private --
//!     /bin/sh -c '<tmpfs /run; rbind / /run/.host; an overlay per top-level
//!                 dir; tmpfs /dev/shm>; <bind mounts from /run/.host>;
//!                 mount --bind <hosts> /etc/hosts; mount --bind <tmp> /tmp;
//!                 umount /run/.host; hostname <pod>; cd <workingDir>;
//!                 exec setpriv --pdeathsig KILL --reuid=postgres --regid=postgres \
//!                      --init-groups -- "$@"' sh <argv>
//! ```
//!
//! The private mount namespace gives the container the host's files as its
//! image through private writable overlays (see [`script`]), makes the Pod
//! spec's absolute mount paths resolve to the volume directories, gives each
//! Pod its own /tmp (where
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

/// Where the host's tree stays reachable while the container's filesystem
/// is set up (detached before the container's program starts).
const HOST: &str = "/run/.host";
/// The container's writable layers (tmpfs, private to its mount namespace).
const LAYERS: &str = "/run/.layers";

/// The shell script that gives the container its filesystem, like a
/// kubelet's: the host's files are its image, seen through a private
/// writable overlay per top-level directory (writes vanish with the
/// container and no other container or the host sees them), a fresh /run
/// and /dev/shm, the Pod's /tmp and /etc/hosts, and the declared volumes
/// bind-mounted at their mount paths. Then it drops privileges.
///
/// Sources are resolved under [`HOST`], a recursive bind of the host's
/// root made before anything is covered, so the order of mounts only has
/// to put parents before children.
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
    mounts.sort_by_key(|m| m.1.trim_end_matches('/').matches('/').count());
    let mut s = String::from("set -e\n");
    s.push_str(&image_layers());
    for (src, tgt, ro) in &mounts {
        let host_src = q(&format!("{HOST}{src}"));
        let tgt = q(tgt);
        s.push_str(&format!(
            "[ -e {host_src} ] || mkdir -p {host_src}\nif [ -d {host_src} ]; then mkdir -p {tgt}; elif [ ! -e {tgt} ]; then mkdir -p \"$(dirname {tgt})\"; : > {tgt}; fi\nmount --bind {host_src} {tgt}\n"
        ));
        if *ro {
            s.push_str(&format!("mount -o remount,bind,ro {tgt}\n"));
        }
    }
    s.push_str(&format!("umount -l {HOST}\nrmdir {HOST}\n"));
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

/// The container's view of the host's files: a new /run holding the host
/// bind and the writable layers, a private overlay over every other
/// top-level directory (the pseudo filesystems excepted), a private
/// /dev/shm.
fn image_layers() -> String {
    format!(
        r#"mount -t tmpfs -o mode=0755 run /run
mkdir -p {HOST} {LAYERS}
mount --rbind / {HOST}
for d in {HOST}/*; do
  n=${{d#{HOST}}}
  case "$n" in /proc|/sys|/dev|/run) continue ;; esac
  if [ -L "$d" ] || [ ! -d "$d" ]; then continue; fi
  mkdir -p "{LAYERS}$n/upper" "{LAYERS}$n/work"
  mount -t overlay overlay -o "lowerdir=$d,upperdir={LAYERS}$n/upper,workdir={LAYERS}$n/work" "$n"
done
mount -t tmpfs -o mode=1777 shm /dev/shm
"#
    )
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

/// The PID 1 of the container: the child unshare forked, once the setup
/// script has exec'd the container's command. Before that its command line
/// is the script (it names `/run/.host`) and the container's mounts are not
/// all in place: an exec entering it then would see the host's files (a
/// real kubelet execs only into a started container). `None` when the
/// container ended before it started.
pub async fn find_init(unshare: u32) -> Option<u32> {
    let mut init = None;
    for _ in 0..3000 {
        if init.is_none() {
            let children =
                std::fs::read_to_string(format!("/proc/{unshare}/task/{unshare}/children")).ok()?;
            init = children.split_whitespace().find_map(|p| p.parse().ok());
        }
        if let Some(pid) = init {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            if !cmdline.windows(10).any(|w| w == b"/run/.host") {
                return Some(pid);
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}
