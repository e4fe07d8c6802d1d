//! What `pgfleet bench fleet` prints: the rate steps, and the table of every
//! figure next to its floor and their ratio.

use super::load::Step;
use super::{Args, P99_LIMIT, bulkhead};
use std::time::Duration;

/// A latency; `None` is a quantile that fell on changes never observed.
pub(super) fn ms(d: Option<Duration>) -> String {
    match d {
        Some(d) => format!("{:.0} ms", d.as_secs_f64() * 1e3),
        None => "lost".into(),
    }
}

/// A latency that may not have been measured at all.
pub(super) fn ms_or_dash(d: Option<Duration>) -> String {
    d.map_or_else(|| "-".into(), |d| ms(Some(d)))
}

pub(super) fn print_step(indent: &str, s: &Step) {
    println!(
        "{indent}{:>5}/s offered: {:>7.1}/s achieved, p50 {:>7}, p99 {:>7} \
         (patch round trip p50 {} p99 {}; the change reaches a bench watcher p50 {} p99 {}, \
         the controller's cache p50 {} p99 {}; {} changes, {} errors, {} not observed)",
        s.offered,
        s.achieved,
        ms(s.p50),
        ms(s.p99),
        ms_or_dash(s.rtt_p50),
        ms_or_dash(s.rtt_p99),
        ms_or_dash(s.delivery_p50),
        ms_or_dash(s.delivery_p99),
        ms_or_dash(s.cached_p50),
        ms_or_dash(s.cached_p99),
        s.changes,
        s.errors,
        s.missed
    );
}

pub(super) struct Report<'a> {
    pub(super) total: usize,
    pub(super) cold: (Duration, usize),
    pub(super) fcold: (Duration, usize),
    pub(super) mem: (u64, u64),
    pub(super) fmem: (u64, u64),
    /// Requests during the cold converge: the manager's, the floor's.
    pub(super) requests: (u64, u64),
    pub(super) steps: &'a [Step],
    pub(super) fsteps: &'a [Step],
    pub(super) bulkhead: Option<&'a bulkhead::Figure>,
}

/// The highest step meeting p99 ≤ 1 s, as its achieved rate.
pub(super) fn sustained(steps: &[Step]) -> Option<&Step> {
    steps
        .iter()
        .filter(|s| s.within(P99_LIMIT))
        .max_by(|a, b| a.achieved.total_cmp(&b.achieved))
}

pub(super) fn ratio(a: f64, b: f64) -> String {
    if b > 0.0 && a.is_finite() {
        format!("{:.2}×", a / b)
    } else {
        "-".into()
    }
}

impl Report<'_> {
    pub(super) fn print(&self, args: &Args) {
        let mut rows: Vec<[String; 5]> = vec![];
        let secs = |(d, n): (Duration, usize)| {
            let s = format!("{:.2} s", d.as_secs_f64());
            if n < self.total {
                format!("{s} ({n}/{} only)", self.total)
            } else {
                s
            }
        };
        rows.push([
            format!("cold converge ({}×{})", args.clusters, args.per_cluster),
            secs(self.cold),
            secs(self.fcold),
            ratio(self.cold.0.as_secs_f64(), self.fcold.0.as_secs_f64()),
            "≤ 60 s at 100×100".into(),
        ]);
        let per = |(b, a): (u64, u64)| a.saturating_sub(b) as f64 / self.total as f64;
        rows.push([
            "memory per PostgresCluster".into(),
            format!("{:.2} KiB", per(self.mem) / 1024.0),
            format!("{:.2} KiB", per(self.fmem) / 1024.0),
            ratio(per(self.mem), per(self.fmem)),
            "≤ 4 KiB at 10,000".into(),
        ]);
        let (rq, frq) = (
            self.requests.0 as f64 / self.total as f64,
            self.requests.1 as f64 / self.total as f64,
        );
        rows.push([
            "requests per PostgresCluster (cold)".into(),
            format!("{rq:.2}"),
            format!("{frq:.2}"),
            ratio(rq, frq),
            "≤ 6 per new PostgresCluster".into(),
        ]);
        let member = |(b, a): (u64, u64)| a.saturating_sub(b) as f64 / args.clusters as f64;
        rows.push([
            "memory per member cluster".into(),
            format!("{:.2} KiB", member(self.mem) / 1024.0),
            format!("{:.2} KiB", member(self.fmem) / 1024.0),
            ratio(member(self.mem), member(self.fmem)),
            "≤ 1 MiB at 1,000 idle members".into(),
        ]);
        let mib = |b: u64| format!("{:.1} MiB", b as f64 / 1048576.0);
        rows.push([
            "  RSS before → after cold".into(),
            format!("{} → {}", mib(self.mem.0), mib(self.mem.1)),
            format!("{} → {}", mib(self.fmem.0), mib(self.fmem.1)),
            String::new(),
            String::new(),
        ]);
        for (s, f) in self.steps.iter().zip(self.fsteps) {
            rows.push([
                format!("{}/s offered: achieved", s.offered),
                format!("{:.1}/s", s.achieved),
                format!("{:.1}/s", f.achieved),
                ratio(s.achieved, f.achieved),
                String::new(),
            ]);
            let d = |d: Option<Duration>| d.map_or(f64::INFINITY, |d| d.as_secs_f64());
            for (what, a, b) in [("p50", s.p50, f.p50), ("p99", s.p99, f.p99)] {
                rows.push([
                    format!("  change→status {what}"),
                    ms(a),
                    ms(b),
                    ratio(d(a), d(b)),
                    if what == "p99" {
                        "≤ 1 s".into()
                    } else {
                        String::new()
                    },
                ]);
            }
            rows.push([
                "  p99 of the watch delivery alone".into(),
                ms_or_dash(s.delivery_p99),
                ms_or_dash(f.delivery_p99),
                ratio(d(s.delivery_p99), d(f.delivery_p99)),
                String::new(),
            ]);
        }
        if let (Some(b), Some(s)) = (self.bulkhead, self.steps.first()) {
            let d = |d: Option<Duration>| d.map_or(f64::INFINITY, |d| d.as_secs_f64());
            rows.push([
                format!(
                    "{}/s with {} members unreachable{}: p99",
                    b.step.offered,
                    b.cut,
                    b.noticed.map_or(" (not all noticed)".into(), |t| format!(
                        " (noticed in {:.0} s)",
                        t.as_secs_f64()
                    ))
                ),
                ms(b.step.p99),
                format!("{} all reachable", ms(s.p99)),
                ratio(d(b.step.p99), d(s.p99)),
                "the rest not slowed".into(),
            ]);
        }
        let best = |steps: &[Step]| sustained(steps).map_or(0.0, |s| s.achieved);
        let (m, f) = (best(self.steps), best(self.fsteps));
        rows.push([
            "changes/s sustained, p99 ≤ 1 s".into(),
            format!("{m:.1}/s"),
            format!("{f:.1}/s"),
            ratio(m, f),
            "≥ 200/s".into(),
        ]);
        let header = [
            "figure".to_string(),
            "pgfleet".into(),
            "floor".into(),
            "ratio".into(),
            "target".into(),
        ];
        let w: Vec<usize> = (0..5)
            .map(|i| {
                rows.iter()
                    .chain(std::iter::once(&header))
                    .map(|r| r[i].chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        println!();
        for r in std::iter::once(&header).chain(rows.iter()) {
            println!(
                "{:<a$}  {:>b$}  {:>c$}  {:>d$}  {}",
                r[0],
                r[1],
                r[2],
                r[3],
                r[4],
                a = w[0],
                b = w[1],
                c = w[2],
                d = w[3]
            );
        }
        if self.steps.iter().all(|s| s.within(P99_LIMIT)) {
            println!(
                "(every offered rate stayed within p99 ≤ 1 s: the sustained rate is a lower bound)"
            );
        }
    }
}
