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
