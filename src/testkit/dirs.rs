//! Fresh directories for environments.

use super::{Error, Result};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};

/// A fresh, empty directory under the system temp dir, unique per process
/// and call (`pgfleet-<tag>-<pid>-<nanos>-<n>`), so parallel tests and
/// repeated runs never share state.
pub fn temp_dir(tag: &str) -> Result<PathBuf> {
    static N: AtomicUsize = AtomicUsize::new(0);
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    let path = std::env::temp_dir().join(format!(
        "pgfleet-{tag}-{}-{nanos}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&path).map_err(|source| Error::Dir {
        path: path.clone(),
        source,
    })?;
    Ok(path)
}

/// Removes its directory when dropped, unless the thread is panicking (a
/// failed test keeps its logs and data directories to be read). The last
/// field of an environment, so the manager and the member's processes are
/// dropped before their directory goes: a process environment leaves up to
/// 700 MB of PostgreSQL data behind otherwise, and a disk filled by earlier
/// runs failed a CI build.
#[derive(Debug)]
pub struct RemoveOnDrop(pub PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}
