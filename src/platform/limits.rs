//! The process's open-file limit. A fleet manager holds several HTTP
//! connections per member cluster (watches and a small pool), so a
//! thousand members need tens of thousands of sockets, far above the
//! usual soft limit of 1,024. Like the Go runtime (which every other
//! Kubernetes controller is built on), pgfleet raises its soft limit to
//! the hard one at start; a container's hard limit is usually 1,048,576.

use rlimit::Resource;
use std::io;

/// The soft and hard limit of open files after the change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OpenFiles {
    pub soft: u64,
    pub hard: u64,
}

/// Raises the soft limit to the hard one; with `at_least`, also the hard
/// limit to that many when it is lower, which only a privileged process
/// may (the benchmarks ask, as root, for what a thousand emulated members
/// need; a refused raise of the hard limit leaves it as it was).
pub fn raise_open_files(at_least: Option<u64>) -> io::Result<OpenFiles> {
    let (mut soft, mut hard) = Resource::NOFILE.get()?;
    if let Some(want) = at_least
        && hard < want
        && Resource::NOFILE.set(want, want).is_ok()
    {
        (soft, hard) = (want, want);
    }
    if soft < hard {
        Resource::NOFILE.set(hard, hard)?;
        soft = hard;
    }
    Ok(OpenFiles { soft, hard })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_soft_limit_ends_at_the_hard_one() {
        let got = raise_open_files(None).unwrap();
        assert_eq!(got.soft, got.hard);
        assert_eq!(Resource::NOFILE.get().unwrap(), (got.soft, got.hard));
    }
}
