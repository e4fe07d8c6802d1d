//! Claims whose capacity is enforced: a volume that fills up is a real
//! event (`ENOSPC`), and an expanded claim really has more room.
//!
//! A claim of a StorageClass with the parameter
//! `pgfleet.io/capacity: enforced` is a tmpfs mounted on its directory,
//! sized to the claim's `status.capacity`; the kubelet's file system
//! expansion is `mount -o remount,size=N`, which grows a tmpfs online with
//! its data kept (measured on the project's machines; ONLINE `resize2fs` of
//! an ext4-on-loop image is refused there, so a loop file system could only
//! grow offline, which is not what a real CSI driver does).
//!
//! Why only for such a class, and not every claim: a tmpfs lives in memory,
//! so its data does not survive the sim (its mounts are released when the
//! cluster goes away) and a big claim could use that much RAM. The default
//! class keeps plain directories (no limit, data kept across sim restarts);
//! tests of full volumes and expansion create a small enforced class.
//!
//! Mounting needs root (CAP_SYS_ADMIN). Without it the volume falls back to
//! the unenforced directory with a warning; a test that needs enforcement
//! checks the size the instance sees (`df`) and fails loudly.

use crate::cluster::Cluster;
use crate::json_ptr::Ptr;
use crate::quantity;
use crate::resources::ResKey;
use crate::store::str_at;
use serde_json::Value;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;

/// The StorageClass parameter that asks for enforced capacity.
pub const PARAMETER: &str = "pgfleet.io/capacity";
/// Its value.
pub const ENFORCED: &str = "enforced";

/// Directories this process mounted a tmpfs on (released on cleanup).
static MOUNTS: Mutex<Vec<PathBuf>> = Mutex::new(Vec::new());
/// Directories whose mount failed (warned once each).
static WARNED: Mutex<Option<HashSet<PathBuf>>> = Mutex::new(None);

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// The size `claim` is enforced at, when its class asks for enforcement:
/// its `status.capacity` (what the file system has been grown to), else
/// its request.
pub fn enforced_bytes(c: &Cluster, claim: &Value) -> Option<u64> {
    let class = str_at(claim, "/spec/storageClassName");
    let rk = ResKey {
        group: "storage.k8s.io".into(),
        plural: "storageclasses".into(),
    };
    let sc = c.store.get(&rk, "", class)?.value();
    let param = sc
        .ptr("/parameters")
        .and_then(|p| p.get(PARAMETER))
        .and_then(Value::as_str);
    if param != Some(ENFORCED) {
        return None;
    }
    let size = claim
        .ptr("/status/capacity/storage")
        .or_else(|| claim.ptr("/spec/resources/requests/storage"))
        .and_then(Value::as_str)?;
    bytes(size)
}

/// A quantity in bytes.
pub fn bytes(q: &str) -> Option<u64> {
    u64::try_from(quantity::parse(q)? / 1000).ok()
}

/// Mounts a tmpfs of `size` bytes on `dir` unless one is there already.
/// A failure (no privilege) leaves the plain directory, with a warning.
pub fn mount(dir: &Path, size: u64) {
    let mut mounts = lock(&MOUNTS);
    if let Err(e) = std::fs::create_dir_all(dir) {
        tracing::warn!(dir = %dir.display(), error = %e, "creating a claim directory");
        return;
    }
    if is_mount_point(dir) {
        return;
    }
    let opts = format!("size={size},mode=0750");
    match run(&["mount", "-t", "tmpfs", "-o", &opts, "pgfleet-claim"], dir) {
        Ok(()) => mounts.push(dir.to_path_buf()),
        Err(e) => {
            let mut warned = lock(&WARNED);
            if warned
                .get_or_insert_with(HashSet::new)
                .insert(dir.to_path_buf())
            {
                tracing::warn!(
                    dir = %dir.display(), error = %e,
                    "cannot enforce the claim's capacity (mounting a tmpfs needs root); \
                     the volume is an unlimited directory"
                );
            }
        }
    }
}

/// Grows the tmpfs on `dir` to `size` bytes, online (the kubelet's
/// NodeExpandVolume). Ok without a mount of ours: nothing to grow.
pub fn grow(dir: &Path, size: u64) -> Result<(), String> {
    let _mounts = lock(&MOUNTS);
    if !is_mount_point(dir) {
        return Ok(());
    }
    run(&["mount", "-o", &format!("remount,size={size}")], dir)
}

/// Unmounts the tmpfs on `dir` (its data goes), if this process mounted one.
pub fn release(dir: &Path) {
    let mut mounts = lock(&MOUNTS);
    if let Some(i) = mounts.iter().position(|m| m == dir) {
        mounts.remove(i);
        if let Err(e) = run(&["umount", "-l"], dir) {
            tracing::warn!(dir = %dir.display(), error = %e, "releasing a claim's tmpfs");
        }
    }
}

/// Releases every mount of ours below `root` (the cluster went away).
pub fn release_under(root: &Path) {
    let mine: Vec<PathBuf> = lock(&MOUNTS)
        .iter()
        .filter(|m| m.starts_with(root))
        .cloned()
        .collect();
    for m in mine {
        release(&m);
    }
}

fn run(argv: &[&str], dir: &Path) -> Result<(), String> {
    let out = Command::new(argv[0])
        .args(&argv[1..])
        .arg(dir)
        .output()
        .map_err(|e| format!("{}: {e}", argv[0]))?;
    match out.status.success() {
        true => Ok(()),
        false => Err(format!(
            "{}: {}",
            argv.join(" "),
            String::from_utf8_lossy(&out.stderr).trim()
        )),
    }
}

/// Whether `dir` is a mount point (from /proc/self/mountinfo, whose mount
/// points escape space, tab, newline and backslash in octal).
fn is_mount_point(dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    let want = escape(&dir.to_string_lossy());
    std::fs::read_to_string("/proc/self/mountinfo").is_ok_and(|info| {
        info.lines()
            .any(|l| l.split(' ').nth(4).is_some_and(|p| p == want))
    })
}

fn escape(p: &str) -> String {
    p.replace('\\', "\\134")
        .replace(' ', "\\040")
        .replace('\t', "\\011")
        .replace('\n', "\\012")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_and_mount_points() {
        assert_eq!(bytes("64Mi"), Some(64 << 20));
        assert_eq!(bytes("1G"), Some(1_000_000_000));
        assert_eq!(bytes("x"), None);
        assert!(is_mount_point(Path::new("/")));
        assert!(!is_mount_point(Path::new("/nonexistent-dir")));
        assert_eq!(escape("/a b"), "/a\\040b");
    }
}
