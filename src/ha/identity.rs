//! A replica's identity in the Leases. Configured (`[manager] identity`) or
//! generated once and kept in `state_dir/identity`: a manager restarted
//! with the same state directory is the same replica and renews its own
//! Leases at once instead of waiting a lease duration for them to expire.
//! A new replica (new pod, empty state directory) gets a new identity and
//! must wait, as it should: the old one may still be running.

use anyhow::Context;
use std::path::Path;

const FILE: &str = "identity";

pub fn resolve(configured: Option<&str>, state_dir: &Path) -> anyhow::Result<String> {
    if let Some(id) = configured.map(str::trim).filter(|s| !s.is_empty()) {
        return Ok(id.to_string());
    }
    let path = state_dir.join(FILE);
    match std::fs::read_to_string(&path) {
        Ok(s) if !s.trim().is_empty() => return Ok(s.trim().to_string()),
        Ok(_) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    }
    let id = generate();
    std::fs::create_dir_all(state_dir)
        .with_context(|| format!("creating the state directory {}", state_dir.display()))?;
    std::fs::write(&path, format!("{id}\n"))
        .with_context(|| format!("writing the manager identity to {}", path.display()))?;
    Ok(id)
}

/// `<host>-<random>`: the host name tells operators which machine or pod
/// a Lease belongs to; the suffix keeps two replicas on one host apart.
fn generate() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .or_else(|| std::fs::read_to_string("/etc/hostname").ok())
        .unwrap_or_default();
    let host: String = host
        .trim()
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '.' {
                c
            } else {
                '-'
            }
        })
        .take(40)
        .collect();
    let suffix: u32 = rand::random();
    if host.is_empty() {
        format!("pgfleet-{suffix:08x}")
    } else {
        format!("{host}-{suffix:08x}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_once_then_reused_and_configured_wins() {
        let n: u64 = rand::random();
        let dir = std::env::temp_dir().join(format!("pgfleet-identity-{n:x}"));
        let a = resolve(None, &dir).unwrap_or_default();
        assert!(!a.is_empty());
        assert_eq!(resolve(None, &dir).unwrap_or_default(), a);
        assert_eq!(resolve(Some(" m1 "), &dir).unwrap_or_default(), "m1");
        let other = std::env::temp_dir().join(format!("pgfleet-identity-{n:x}-2"));
        assert_ne!(resolve(None, &other).unwrap_or_default(), a);
        let _ = std::fs::remove_dir_all(dir);
        let _ = std::fs::remove_dir_all(other);
    }
}
