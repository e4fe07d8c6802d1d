//! `pgfleet bench backup`: backup throughput through pgfleet next to bare
//! pgBackRest on the same data in the same run, and how scheduled starts
//! spread across a fleet. Figures and ratios only; nothing is asserted.
//!
//! Throughput (process runtime, real PostgreSQL and pgBackRest, a
//! filesystem repository): a 1-instance PostgresCluster is loaded with
//! `--size-mb` of data, then full backups alternate between
//! * pgfleet: a PostgresBackup record, timed from the moment the dispatcher
//!   marks it Running to Completed (the exec of `pgfleet-instance
//!   backup-init` and `backup full`, the script's parsing of `pgbackrest
//!   info`, the status writes), and separately from its creation (which adds
//!   the dispatcher's pickup, at most one `tick`);
//! * the floor: bare `pgbackrest --config=<rendered conf> --stanza=db backup
//!   --type=full` run in the same pod through `pods/exec` — the same
//!   pgBackRest, configuration, data and repository, without pgfleet's
//!   dispatch, records, script or status writes.
//!
//! The floor writes to the same repository and stanza, not a separate
//! `repo1-path`: pgBackRest's backup waits until the WAL of the backup is in
//! *its* repository's archive, and `archive_command` pushes to the cluster's
//! own path, so a floor in another path would have to turn the archive check
//! off and skip work pgfleet's backup does. Every backup here is full, so
//! sharing the repository changes nothing about what each one copies.
//!
//! Spread (pure, no cluster): the start offsets `backup::schedule::offset`
//! gives N PostgresClusters in the default window, against an even spread;
//! then one day of the default schedule on a manual clock through
//! `schedule::due` and `schedule::select` under the caps, each backup
//! taking `--duration`: peak concurrency and how late the latest start is
//! against `start_deadline` (a start later than that is skipped).

#[path = "backup_env.rs"]
mod env;

use crate::backup::schedule::{self, Candidate, Caps, Due, Running};
use crate::config::backups::Backups;
use crate::crd::PostgresBackup;
use anyhow::{Context, Result, bail, ensure};
use chrono::{DateTime, TimeDelta, TimeZone as _, Utc};
use env::{CONF, Env, NAME, NS};
use kube::api::PostParams;
use std::collections::HashMap;
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Data set to back up, in MiB of table data.
    #[arg(long, default_value_t = 256)]
    pub size_mb: u64,
    /// Backups of each kind (pgfleet and bare), alternating.
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// PostgresClusters in the spread simulation.
    #[arg(long, default_value_t = 300)]
    pub clusters: usize,
    /// Member clusters they are spread over (round robin).
    #[arg(long, default_value_t = 3)]
    pub members: usize,
    /// How long each simulated backup takes.
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration)]
    pub duration: Duration,
    /// `max_concurrent` of the simulation.
    #[arg(long, default_value_t = 20)]
    pub max_concurrent: u32,
    /// `max_concurrent_per_cluster` (per member cluster) of the simulation.
    #[arg(long, default_value_t = 2)]
    pub max_concurrent_per_cluster: u32,
    /// Only the spread simulation (no PostgreSQL).
    #[arg(long)]
    pub spread_only: bool,
    /// Base directory of the run, outside /tmp (default
    /// /var/tmp/pgfleet-bench-backup-<pid>, removed afterwards).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

/// How often a PostgresBackup's phase is read (the time resolution).
const POLL: Duration = Duration::from_millis(50);
const BACKUP_LIMIT: Duration = Duration::from_secs(3600);

pub async fn run(args: Args) -> Result<()> {
    ensure!(
        args.runs >= 1 && args.clusters >= 1 && args.members >= 1,
        "--runs, --clusters and --members must be at least 1"
    );
    spread(&args)?;
    if !args.spread_only {
        throughput(&args).await?;
    }
    Ok(())
}

/// One full backup as measured.
struct Sample {
    /// The figure the throughput is computed from.
    secs: f64,
    /// PostgresBackup creation → Completed (pgfleet only).
    e2e_secs: Option<f64>,
    /// pgBackRest's own start → stop (whole seconds).
    pgbr_secs: i64,
    bytes: i64,
}

impl Sample {
    fn mib_s(&self) -> f64 {
        self.bytes as f64 / 1048576.0 / self.secs
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

async fn throughput(args: &Args) -> Result<()> {
    let t = Instant::now();
    let env = Env::start(args.dir.clone()).await?;
    let result = measure(&env, args).await;
    let (base, owned) = (env.base.clone(), env.owned);
    drop(env);
    if owned {
        // The instances stop with the manager; their files go after.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let _ = std::fs::remove_dir_all(&base);
    }
    result?;
    println!("(throughput part took {:.0} s)", t.elapsed().as_secs_f64());
    Ok(())
}

async fn measure(env: &Env, args: &Args) -> Result<()> {
    let primary = env.create_cluster().await?;
    let loading = Instant::now();
    let db = env.load(args.size_mb).await?;
    println!(
        "\ndata set: {:.0} MiB database ({} MiB of table data asked), loaded and archived in {:.0} s; repository {}",
        db as f64 / 1048576.0,
        args.size_mb,
        loading.elapsed().as_secs_f64(),
        env.base.join("repo").display()
    );
    let (mut ours, mut bare) = (vec![], vec![]);
    for i in 1..=args.runs {
        let s = pgfleet_backup(env, &format!("bench-{i}")).await?;
        println!(
            "pgfleet run {i}: {:.2} s Running→Completed ({:.2} s from creation), pgBackRest {} s, {:.0} MiB, {:.1} MiB/s",
            s.secs,
            s.e2e_secs.unwrap_or(f64::NAN),
            s.pgbr_secs,
            s.bytes as f64 / 1048576.0,
            s.mib_s()
        );
        ours.push(s);
        let s = bare_backup(env, &primary).await?;
        println!(
            "bare    run {i}: {:.2} s exec start→exit, pgBackRest {} s, {:.0} MiB, {:.1} MiB/s",
            s.secs,
            s.pgbr_secs,
            s.bytes as f64 / 1048576.0,
            s.mib_s()
        );
        bare.push(s);
    }
    let m = |v: &[Sample], f: fn(&Sample) -> f64| median(v.iter().map(f).collect());
    let (t_ours, t_bare) = (m(&ours, Sample::mib_s), m(&bare, Sample::mib_s));
    let e2e = m(&ours, |s| {
        s.bytes as f64 / 1048576.0 / s.e2e_secs.unwrap_or(f64::NAN)
    });
    let pgbr = |v: &[Sample]| m(v, |s| s.pgbr_secs as f64);
    println!(
        "\n{:<52} {:>9} {:>9} {:>7}",
        "figure (median of runs)", "pgfleet", "bare", "ratio"
    );
    println!(
        "{:<52} {:>9.1} {:>9.1} {:>7.2}",
        "backup throughput, MiB/s (Running→Completed)",
        t_ours,
        t_bare,
        t_ours / t_bare
    );
    println!(
        "{:<52} {:>9.1} {:>9.1} {:>7.2}",
        "  incl. dispatcher pickup, MiB/s (creation→Completed)",
        e2e,
        t_bare,
        e2e / t_bare
    );
    let secs = |v: &[Sample]| m(v, |s| s.secs);
    println!(
        "{:<52} {:>9.2} {:>9.2} {:>7.2}",
        "  time per backup, s",
        secs(&ours),
        secs(&bare),
        secs(&ours) / secs(&bare)
    );
    println!(
        "{:<52} {:>9.0} {:>9.0} {:>7.2}",
        "  pgBackRest's own start→stop, s",
        pgbr(&ours),
        pgbr(&bare),
        pgbr(&ours) / pgbr(&bare)
    );
    println!("target (DESIGN §8): throughput ≥ 0.90 of bare pgBackRest on the same data");
    Ok(())
}

/// A PostgresBackup record, as `pgfleet backup now` creates it.
async fn pgfleet_backup(env: &Env, name: &str) -> Result<Sample> {
    let obj: PostgresBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
        "metadata": {"name": name, "namespace": NS, "labels": {"pgfleet.io/cluster": NAME}},
        "spec": {"cluster": NAME, "type": "full", "trigger": "manual"}}))?;
    let created = Instant::now();
    env.pgb().create(&PostParams::default(), &obj).await?;
    let mut running = None;
    loop {
        let st = env.pgb().get(name).await?.status.unwrap_or_default();
        match st.phase.as_deref() {
            Some("Running") if running.is_none() => running = Some(Instant::now()),
            Some("Completed") => {
                let done = Instant::now();
                // Completed without Running seen between two polls: the
                // dispatcher's own start time is gone (overwritten with
                // pgBackRest's), so count from creation.
                let from = running.unwrap_or(created);
                let secs = |a: Option<&str>, b: Option<&str>| -> Option<i64> {
                    let p = |s: &str| DateTime::parse_from_rfc3339(s).ok();
                    Some((p(b?)? - p(a?)?).num_seconds())
                };
                return Ok(Sample {
                    secs: (done - from).as_secs_f64(),
                    e2e_secs: Some((done - created).as_secs_f64()),
                    pgbr_secs: secs(st.started_at.as_deref(), st.stopped_at.as_deref())
                        .unwrap_or(0),
                    bytes: st
                        .size_bytes
                        .context("no sizeBytes on a Completed backup")?,
                });
            }
            Some("Failed") => bail!(
                "backup {name} failed: {}",
                st.failure_reason.unwrap_or_default()
            ),
            _ => {}
        }
        if created.elapsed() > BACKUP_LIMIT {
            bail!("backup {name} not Completed after {BACKUP_LIMIT:?}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// Bare pgBackRest in the instance's pod, with its rendered configuration.
async fn bare_backup(env: &Env, pod: &str) -> Result<Sample> {
    let conf = format!("--config={CONF}");
    let argv = ["pgbackrest", &conf, "--stanza=db", "backup", "--type=full"];
    // pgfleet's runner expires old backups after it marks one Completed;
    // pgBackRest then holds the stanza's lock for a moment. Wait for it
    // (and time only the attempt that got the lock).
    let mut tries = 0;
    let secs = loop {
        let t = Instant::now();
        match env.exec(pod, &argv, BACKUP_LIMIT).await {
            Ok(_) => break t.elapsed().as_secs_f64(),
            Err(e) if tries < 100 && format!("{e:#}").contains("unable to acquire lock") => {
                tries += 1;
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => return Err(e),
        }
    };
    let (_, bytes, pgbr_secs) = env.newest_backup(pod).await?;
    Ok(Sample {
        secs,
        e2e_secs: None,
        pgbr_secs,
        bytes,
    })
}

/// Offsets of the fleet in the window, then a simulated day under the caps.
fn spread(args: &Args) -> Result<()> {
    let cfg = Backups::default();
    let window = cfg.window.get();
    let deadline = cfg.start_deadline.get();
    let cron = cfg
        .default_schedule
        .parsed()
        .context("default schedule")?
        .clone();
    let fleet: Vec<(String, String, Duration)> = (0..args.clusters)
        .map(|i| {
            let member = format!("member-{}", i % args.members + 1);
            let name = format!("pg-{:04}", i / args.members);
            let off = schedule::offset(window, &member, "db", &name);
            (member.clone(), format!("{member}/db/{name}"), off)
        })
        .collect();
    let mut secs: Vec<u64> = fleet.iter().map(|f| f.2.as_secs()).collect();
    secs.sort_unstable();
    let gaps: Vec<u64> = secs.windows(2).map(|w| w[1] - w[0]).collect();
    let busiest = |width: u64| {
        // Sliding window [start, start + width) over the sorted offsets.
        let mut best = 0;
        let mut lo = 0;
        for hi in 0..secs.len() {
            while secs[hi] - secs[lo] >= width {
                lo += 1;
            }
            best = best.max(hi - lo + 1);
        }
        best
    };
    let minutes = window.as_secs_f64() / 60.0;
    let n = args.clusters as f64;
    println!(
        "spread: {} PostgresClusters on {} member clusters, schedule {}, window {}",
        args.clusters,
        args.members,
        cfg.default_schedule,
        humantime::format_duration(window)
    );
    println!(
        "\n{:<52} {:>9} {:>9} {:>7}",
        "figure", "value", "ideal", "ratio"
    );
    let row = |label: &str, v: f64, ideal: f64| {
        println!("{label:<52} {v:>9.1} {ideal:>9.1} {:>7.2}", v / ideal);
    };
    row(
        "most starts in any 1-minute span",
        busiest(60) as f64,
        n / minutes,
    );
    row(
        "most starts in any 10-minute span",
        busiest(600) as f64,
        n / minutes * 10.0,
    );
    let even = window.as_secs_f64() / n;
    row(
        "largest gap between starts, s",
        gaps.iter().max().copied().unwrap_or(0) as f64,
        even,
    );
    println!(
        "{:<52} {:>9} {:>9.1}",
        "smallest gap between starts, s",
        gaps.iter().min().copied().unwrap_or(0),
        even
    );
    println!(
        "{:<52} {:>9}",
        "first / last start after the cron time",
        format!(
            "{} / {}",
            humantime::format_duration(Duration::from_secs(secs[0])),
            humantime::format_duration(Duration::from_secs(secs[secs.len() - 1]))
        )
    );
    report_day(args, &cron, deadline, &fleet);
    Ok(())
}

/// What one simulated day under the caps came to.
struct Day {
    peak: usize,
    peak_member: usize,
    /// Start − slot of every backup that started, seconds.
    waits: Vec<f64>,
    skipped: usize,
    /// The longest wait and whose it was.
    worst: (TimeDelta, String),
    /// From the cron time to the end of the last backup.
    makespan: TimeDelta,
}

/// One day of the schedule on a manual clock, rounds every 10 s like the
/// dispatcher's tick, each backup taking `took`.
fn simulate_day(
    caps: &Caps,
    took: Duration,
    cron: &croner::Cron,
    deadline: Duration,
    fleet: &[(String, String, Duration)],
) -> Day {
    let tick = TimeDelta::seconds(10);
    let took = TimeDelta::from_std(took).unwrap_or(TimeDelta::MAX);
    let at = |d: u32, h: u32| Utc.with_ymd_and_hms(2026, 3, d, h, 0, 0).unwrap();
    let (created, start, cron_time) = (at(1, 0), at(15, 1), at(15, 2));
    // Yesterday's backups all ran.
    let mut handled: Vec<Option<DateTime<Utc>>> = fleet
        .iter()
        .map(|(_, _, off)| schedule::last_slot(cron, *off, start))
        .collect();
    let mut running: Vec<(DateTime<Utc>, Running)> = vec![];
    let mut day = Day {
        peak: 0,
        peak_member: 0,
        waits: vec![],
        skipped: 0,
        worst: (TimeDelta::zero(), String::new()),
        makespan: TimeDelta::zero(),
    };
    let mut latest_end = cron_time;
    let mut now = start;
    // Until every slot of the day has started or been skipped.
    while now < at(16, 1) && day.waits.len() + day.skipped < fleet.len() {
        running.retain(|(end, _)| *end > now);
        let (mut candidates, mut owner) = (vec![], vec![]);
        for (i, (member, key, off)) in fleet.iter().enumerate() {
            match schedule::due(cron, *off, handled[i], created, now, deadline) {
                Due::Idle { .. } => {}
                Due::Start { slot } => {
                    owner.push((i, slot));
                    candidates.push(Candidate {
                        member: member.clone(),
                        repository: "repo".into(),
                        cluster_key: key.clone(),
                        priority: slot,
                        not_before: None,
                    });
                }
                Due::Skip { slot, .. } => {
                    handled[i] = Some(slot);
                    day.skipped += 1;
                }
            }
        }
        let current: Vec<Running> = running.iter().map(|(_, r)| r.clone()).collect();
        for c in schedule::select(caps, &current, &candidates, now) {
            let (i, slot) = owner[c];
            handled[i] = Some(slot);
            let wait = now - slot;
            day.waits.push(wait.num_seconds() as f64);
            if wait > day.worst.0 {
                day.worst = (wait, fleet[i].1.clone());
            }
            latest_end = latest_end.max(now + took);
            running.push((
                now + took,
                Running {
                    member: fleet[i].0.clone(),
                    repository: "repo".into(),
                    cluster_key: fleet[i].1.clone(),
                },
            ));
        }
        day.peak = day.peak.max(running.len());
        let mut per: HashMap<&str, usize> = HashMap::new();
        for (_, r) in &running {
            *per.entry(r.member.as_str()).or_default() += 1;
        }
        day.peak_member = day
            .peak_member
            .max(per.values().copied().max().unwrap_or(0));
        now += tick;
    }
    day.makespan = latest_end - cron_time;
    day
}

fn meets_deadline(day: &Day, deadline: Duration) -> bool {
    day.skipped == 0 && day.worst.0.to_std().unwrap_or_default() <= deadline
}

/// The day under the configured caps, next to what the caps allow.
fn report_day(
    args: &Args,
    cron: &croner::Cron,
    deadline: Duration,
    fleet: &[(String, String, Duration)],
) {
    let caps = Caps {
        global: args.max_concurrent,
        per_member: args.max_concurrent_per_cluster,
        per_repository: None,
    };
    let day = simulate_day(&caps, args.duration, cron, deadline, fleet);
    let concurrency = (caps.global as usize)
        .min(args.members * caps.per_member as usize)
        .max(1);
    let started = day.waits.len();
    let floor = started.div_ceil(concurrency) as f64 * args.duration.as_secs_f64();
    let makespan = day.makespan.num_seconds() as f64;
    let mut sorted = day.waits.clone();
    sorted.sort_by(|a, b| a.total_cmp(b));
    let p = |q: f64| {
        sorted
            .get(((sorted.len().max(1) - 1) as f64 * q).round() as usize)
            .copied()
            .unwrap_or(f64::NAN)
    };
    println!(
        "\nunder the caps: max_concurrent {}, max_concurrent_per_cluster {} × {} members, each backup {}, rounds every 10 s",
        caps.global,
        caps.per_member,
        args.members,
        humantime::format_duration(args.duration)
    );
    println!(
        "{:<52} {:>9} {:>9} {:>7}",
        "figure", "value", "bound", "ratio"
    );
    println!(
        "{:<52} {:>9} {:>9} {:>7.2}",
        "peak concurrent backups (bound: the caps)",
        day.peak,
        concurrency,
        day.peak as f64 / concurrency as f64
    );
    println!(
        "{:<52} {:>9} {:>9} {:>7.2}",
        "peak concurrent backups in one member cluster",
        day.peak_member,
        caps.per_member,
        day.peak_member as f64 / f64::from(caps.per_member.max(1))
    );
    println!(
        "{:<52} {:>9.0} {:>9.0} {:>7.2}",
        format!("cron time → last of {started} backups done, min (⌈n/cap⌉·d)"),
        makespan / 60.0,
        floor / 60.0,
        makespan / floor
    );
    println!(
        "{:<52} {:>9.1} {:>9.1}",
        "start wait behind the caps, p50 / p99, min",
        p(0.5) / 60.0,
        p(0.99) / 60.0
    );
    let verdict = if meets_deadline(&day, deadline) {
        "within start_deadline".to_string()
    } else {
        format!(
            "EXCEEDS start_deadline: {} of {} slots skipped",
            day.skipped,
            fleet.len()
        )
    };
    println!(
        "{:<52} {:>9.1} {:>9.1}   {verdict} (worst: {})",
        "latest start relative to its slot, min (deadline)",
        day.worst.0.num_seconds() as f64 / 60.0,
        deadline.as_secs_f64() / 60.0,
        day.worst.1
    );
    if !meets_deadline(&day, deadline) {
        // The smallest per-member cap (global cap permitting) that fits.
        let fits = (caps.per_member + 1..=64).find(|&k| {
            let wider = Caps {
                per_member: k,
                global: caps.global.max(k * args.members as u32),
                ..caps
            };
            meets_deadline(
                &simulate_day(&wider, args.duration, cron, deadline, fleet),
                deadline,
            )
        });
        match fits {
            Some(k) => println!(
                "every slot starts within start_deadline from max_concurrent_per_cluster = {k} (max_concurrent ≥ {})",
                k as usize * args.members
            ),
            None => println!("no max_concurrent_per_cluster up to 64 meets start_deadline"),
        }
    }
}
