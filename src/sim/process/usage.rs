//! What the containers of the process runtime use, for the metrics API
//! (`kubectl top`): CPU from the deltas of utime+stime in /proc/<pid>/stat
//! over a short window, memory as the proportional set size (Pss) from
//! /proc/<pid>/smaps_rollup, each summed over every process in the
//! container's PID namespace. Pss rather than RSS because PostgreSQL's
//! backends all map the same shared buffers: summing RSS would count them
//! once per backend, Pss splits them among the processes that share them.

use super::ProcessRuntime;
use super::sandbox::ns_members;
use crate::runtime::{ContainerUsage, UsageReport};
use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How long CPU is measured per request.
const WINDOW: Duration = Duration::from_millis(500);

/// Clock ticks per second (`getconf CLK_TCK`; 100 on every Linux we run on).
fn clk_tck() -> u64 {
    static TCK: OnceLock<u64> = OnceLock::new();
    *TCK.get_or_init(|| {
        std::process::Command::new("getconf")
            .arg("CLK_TCK")
            .output()
            .ok()
            .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
            .filter(|t| *t > 0)
            .unwrap_or(100)
    })
}

/// utime + stime of one process, in clock ticks (fields 14 and 15; the
/// command name in field 2 may hold spaces, so count after its ')').
pub fn cpu_ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    Some(f.get(11)?.parse::<u64>().ok()? + f.get(12)?.parse::<u64>().ok()?)
}

/// A `<Key>: <n> kB` line of /proc/<pid>/status or smaps_rollup, in bytes.
pub fn kb_field(text: &str, key: &str) -> Option<u64> {
    text.lines()
        .find_map(|l| l.strip_prefix(key)?.strip_prefix(':'))
        .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
        .map(|kb| kb * 1024)
}

fn ticks_of(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| std::fs::read_to_string(format!("/proc/{p}/stat")).ok())
        .filter_map(|s| cpu_ticks(&s))
        .sum()
}

fn memory_of(pids: &[u32]) -> u64 {
    pids.iter()
        .filter_map(|p| {
            std::fs::read_to_string(format!("/proc/{p}/smaps_rollup"))
                .ok()
                .and_then(|s| kb_field(&s, "Pss"))
                .or_else(|| {
                    let s = std::fs::read_to_string(format!("/proc/{p}/status")).ok()?;
                    kb_field(&s, "VmRSS")
                })
        })
        .sum()
}

/// Busy and total jiffies of the machine (first line of /proc/stat).
fn machine_ticks() -> (u64, u64) {
    let s = std::fs::read_to_string("/proc/stat").unwrap_or_default();
    let f: Vec<u64> = s
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .skip(1)
        .filter_map(|v| v.parse().ok())
        .collect();
    let total: u64 = f.iter().sum();
    let idle = f.get(3).copied().unwrap_or(0) + f.get(4).copied().unwrap_or(0);
    (total.saturating_sub(idle), total)
}

fn machine_memory() -> u64 {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    let total = kb_field(&s, "MemTotal").unwrap_or(0);
    total.saturating_sub(kb_field(&s, "MemAvailable").unwrap_or(total))
}

type Key = (String, String, String);

impl ProcessRuntime {
    /// (namespace, pod, container) → host pid of the container's PID 1.
    fn running_containers(&self) -> Vec<(Key, u32)> {
        let pods: Vec<_> = super::lock(&self.pods).values().cloned().collect();
        let mut out = vec![];
        for p in pods {
            for c in p.containers() {
                if let Some(pid) = c.state().pid {
                    out.push(((p.ns.clone(), p.name.clone(), c.spec.name.clone()), pid));
                }
            }
        }
        out
    }

    /// Samples every running container twice, [`WINDOW`] apart.
    pub async fn sample_usage(&self) -> UsageReport {
        let before: Vec<(Key, u32, u64)> = self
            .running_containers()
            .into_iter()
            .map(|(k, pid)| {
                let t = ticks_of(&ns_members(pid));
                (k, pid, t)
            })
            .collect();
        let (busy0, total0) = machine_ticks();
        let start = Instant::now();
        tokio::time::sleep(WINDOW).await;
        let secs = start.elapsed().as_secs_f64();
        let (busy1, total1) = machine_ticks();
        let mut pods: HashMap<(String, String), Vec<ContainerUsage>> = HashMap::new();
        let per_tick = 1e9 / clk_tck() as f64 / secs;
        for ((ns, pod, name), pid, t0) in before {
            let pids = ns_members(pid);
            let t1 = ticks_of(&pids);
            pods.entry((ns, pod)).or_default().push(ContainerUsage {
                name,
                cpu_nanocores: (t1.saturating_sub(t0) as f64 * per_tick) as u64,
                memory_bytes: memory_of(&pids),
            });
        }
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        let share = |d: u64| d as f64 / (total1.saturating_sub(total0)).max(1) as f64;
        UsageReport {
            window: start.elapsed(),
            pods,
            node: Some(ContainerUsage {
                name: super::NODE.into(),
                cpu_nanocores: (share(busy1.saturating_sub(busy0)) * cpus * 1e9) as u64,
                memory_bytes: machine_memory(),
            }),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn stat_and_status_fields_parse_as_the_kernel_writes_them() {
        let stat = "4242 (postgres: walwriter ) S 1 4242 4242 0 -1 4194560 95 0 0 0 7 3 0 0 20 0 1 0 100 0 0";
        assert_eq!(cpu_ticks(stat), Some(10));
        let status = "Name:\tpostgres\nVmRSS:\t   2048 kB\nPss:  10 kB\n";
        assert_eq!(kb_field(status, "VmRSS"), Some(2048 * 1024));
        assert_eq!(kb_field(status, "Pss"), Some(10 * 1024));
        assert_eq!(kb_field(status, "Rss"), None);
    }
}
