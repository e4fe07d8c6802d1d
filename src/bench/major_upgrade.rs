//! `pgfleet bench major-upgrade`: the downtime of an in-place major upgrade
//! (PostgreSQL 15 → 18, process runtime, real binaries) as a writer sees it
//! — its last acknowledged write before, its first after — next to a floor
//! measured in the same run on a copy of the same data with the same
//! binaries: stop, bare `pg_upgrade --link`, start (the new cluster
//! initialised beforehand; `major_upgrade_floor.sh`). Figures and their
//! ratio are printed, with the timeline of the upgrade's steps
//! (`status.majorUpgrade.step`) against the writer's window, so the time
//! inside the window can be placed; nothing is asserted. Then blue/green
//! upgrades through the pooler against a PAUSE/RESUME floor
//! (`major_upgrade_bg.rs`).

use crate::testkit::pg;
use crate::testkit::process::{ProcessEnv, ProcessOptions};
use anyhow::{Context, Result, ensure};
use kube::api::{Patch, PatchParams};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Tables created before the upgrade (pg_upgrade's time grows with the
    /// catalog, not with the data).
    #[arg(long, default_value_t = 100)]
    pub tables: u32,
    /// Rows in each table.
    #[arg(long, default_value_t = 1000)]
    pub rows: u32,
    /// Instances of each upgraded PostgresCluster.
    #[arg(long, default_value_t = 2)]
    pub instances: i32,
    /// Upgrades to measure (one PostgresCluster each, each with its floor).
    #[arg(long, default_value_t = 3)]
    pub runs: usize,
    /// Blue/green upgrades to measure (through the pooler, each next to a
    /// PAUSE/RESUME floor on the same pooler); 0 skips them.
    #[arg(long, default_value_t = 5)]
    pub blue_green_runs: usize,
    /// Where the embedded cluster keeps its state (a temp dir by default).
    #[arg(long)]
    pub dir: Option<std::path::PathBuf>,
}

pub(super) const NS: &str = "bench";
const FLOOR_PORT: &str = "55433";
const FLOOR: &str = include_str!("major_upgrade_floor.sh");
pub(super) const LIMIT: Duration = Duration::from_secs(1200);

/// Writes one row per transaction, reconnecting after errors, and keeps the
/// time of every acknowledged write.
pub(super) struct Writer {
    acked: Arc<Mutex<Vec<Instant>>>,
    /// Writes sent on an open session that did not succeed (a refused
    /// connection is downtime, not a failed transaction).
    pub(super) failed: Arc<std::sync::atomic::AtomicU64>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

impl Writer {
    fn start(host: String, port: u16, pw: String) -> Writer {
        Writer::start_as(host, port, "postgres", pw)
    }

    /// As `user` (through a pooler: the application's role).
    pub(super) fn start_as(host: String, port: u16, user: &str, pw: String) -> Writer {
        let acked = Arc::new(Mutex::new(Vec::new()));
        let failed = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (a, f, s, user) = (acked.clone(), failed.clone(), stop.clone(), user.to_owned());
        let task = tokio::spawn(async move {
            let mut conn: Option<tokio_postgres::Client> = None;
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                if conn.as_ref().is_none_or(|c| c.is_closed()) {
                    let timeout = Duration::from_millis(500);
                    conn = pg::connect_as(&host, port, &user, &pw, timeout).await.ok();
                }
                let Some(c) = conn.as_ref() else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                let write = c.batch_execute("INSERT INTO probe VALUES (now())");
                match tokio::time::timeout(Duration::from_secs(10), write).await {
                    Ok(Ok(())) => a
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .push(Instant::now()),
                    _ => {
                        f.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        conn = None
                    }
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        });
        Writer {
            acked,
            failed,
            stop,
            task,
        }
    }

    /// When each acknowledged write returned, so far.
    pub(super) fn acked_times(&self) -> Vec<Instant> {
        self.acked.lock().map(|a| a.clone()).unwrap_or_default()
    }

    pub(super) fn count(&self) -> usize {
        self.acked.lock().map(|a| a.len()).unwrap_or_default()
    }

    /// Stops; the longest gap between acknowledged writes after `from`, as
    /// (last ok before, first ok after).
    pub(super) async fn stop(self, from: Instant) -> Option<(Instant, Instant)> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        let _ = self.task.await;
        let acked = self.acked.lock().map(|a| a.clone()).unwrap_or_default();
        acked
            .windows(2)
            .filter(|w| w[1] >= from)
            .map(|w| (w[0], w[1]))
            .max_by_key(|(a, b)| b.duration_since(*a))
    }
}

pub async fn run(args: Args) -> Result<()> {
    ensure!(
        args.instances >= 1 && args.runs + args.blue_green_runs >= 1,
        "--instances must be at least 1, and something must run"
    );
    let catalog = crate::config::catalog::builtin();
    let bin = |v: &str| -> Result<String> {
        let r = crate::config::catalog::resolve(&catalog, v).map_err(anyhow::Error::msg)?;
        r.bin_dir.context("no bin_dir in the built-in catalog")
    };
    let (old, new) = (bin("15")?, bin("18")?);
    let owned = args.dir.is_none();
    let dir = args.dir.clone().unwrap_or_else(|| {
        std::env::temp_dir().join(format!("pgfleet-bench-major-{}", std::process::id()))
    });
    let b = ProcessEnv::start(ProcessOptions {
        dir: dir.clone(),
        member: "bench".into(),
        namespace: NS.into(),
        extra_toml: String::new(),
    })
    .await?;
    let mut result = Ok(());
    if args.runs > 0 {
        result = measure(&b, &args, [&old, &new]).await;
    }
    if result.is_ok() && args.blue_green_runs > 0 {
        result = super::major_upgrade_bg::measure(&b, args.blue_green_runs).await;
    }
    drop(b);
    if owned {
        // The instances stop with the manager; their files go after.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let _ = std::fs::remove_dir_all(&dir);
    }
    result
}

async fn measure(b: &ProcessEnv, args: &Args, bins: [&str; 2]) -> Result<()> {
    let names: Vec<String> = (0..args.runs).map(|i| format!("mu{i}")).collect();
    for name in &names {
        let spec = serde_json::json!({"clusterSize": args.instances, "version": "15",
            "enableSuperuserAccess": true, "majorUpgrade": {"method": "inPlace"}});
        b.create(name, spec).await?;
    }
    println!(
        "PostgreSQL 15 → 18, {} tables × {} rows, {} instance(s), {} run(s)",
        args.tables, args.rows, args.instances, args.runs
    );
    let (mut downs, mut floors) = (vec![], vec![]);
    for name in &names {
        let primary = b.wait_healthy(name, args.instances, true, LIMIT).await?;
        let rw = b.service_ip(&format!("{name}-rw")).await?;
        let pw = b.password(name).await?;
        load(&rw, &pw, args).await?;
        let floor = floor(b, &primary, &pw, bins[0], bins[1]).await?;
        let (down, timeline) = in_place(b, name, &rw, &pw).await?;
        println!(
            "{name}: in place {down:.0} ms, floor {floor:.0} ms; steps (s from the version change):"
        );
        for (what, at) in &timeline {
            println!("  {at:>8.2}  {what}");
        }
        downs.push(down);
        floors.push(floor);
    }
    let ratios: Vec<f64> = downs.iter().zip(&floors).map(|(d, f)| d / f).collect();
    let each: Vec<String> = ratios.iter().map(|r| format!("{r:.2}")).collect();
    let (down, floor) = (median(downs), median(floors));
    println!(
        "\n{:<46} {:>9} {:>9} {:>7}",
        "figure (ms, median)", "in place", "floor", "ratio"
    );
    println!(
        "{:<46} {:>9.0} {:>9.0} {:>7.2}",
        "writer: last ok write → first ok write",
        down,
        floor,
        down / floor
    );
    println!(
        "ratio per run: {} (median {:.2})",
        each.join(", "),
        median(ratios)
    );
    Ok(())
}

pub(super) fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    match v.len() {
        0 => f64::NAN,
        n if n % 2 == 1 => v[n / 2],
        n => (v[n / 2 - 1] + v[n / 2]) / 2.0,
    }
}

async fn load(rw: &str, pw: &str, args: &Args) -> Result<()> {
    let c = pg::connect(rw, 5432, pw, Duration::from_secs(10)).await?;
    c.batch_execute("CREATE TABLE IF NOT EXISTS probe (at timestamptz)")
        .await?;
    for t in 0..args.tables {
        let sql = format!(
            "CREATE TABLE IF NOT EXISTS t{t} (id bigint PRIMARY KEY, v text);
             INSERT INTO t{t} SELECT g, md5(g::text) FROM generate_series(1, {}) g ON CONFLICT DO NOTHING",
            args.rows
        );
        c.batch_execute(&sql).await?;
    }
    c.batch_execute("ANALYZE").await?;
    Ok(())
}

/// Runs a phase of the floor script in the primary's Pod.
async fn floor_phase(b: &ProcessEnv, pod: &str, phase: &str, bins: [&str; 3]) -> Result<String> {
    let argv: Vec<String> = [
        "sh", "-c", FLOOR, "floor", phase, bins[0], bins[1], bins[2], FLOOR_PORT,
    ]
    .map(str::to_owned)
    .to_vec();
    let what = format!("the floor's {phase}");
    crate::postgres::exec::run_command(&b.client, NS, pod, "postgres", argv, &what, LIMIT)
        .await
        .with_context(|| format!("the floor's {phase} in {pod}"))
}

/// The floor's writer-seen downtime in ms, on a copy of the primary's data.
async fn floor(b: &ProcessEnv, primary: &str, pw: &str, old: &str, new: &str) -> Result<f64> {
    let pod = b.pods().get(primary).await?;
    let ip = pod
        .status
        .and_then(|s| s.pod_ip)
        .context("the primary has no IP")?;
    let bins = [old, new, ip.as_str()];
    floor_phase(b, primary, "prepare", bins).await?;
    let port: u16 = FLOOR_PORT.parse()?;
    let w = Writer::start(ip.clone(), port, pw.to_owned());
    wait_for(|| w.count() > 20, "the floor's writer").await?;
    let t0 = Instant::now();
    let steps = floor_phase(b, primary, "window", bins).await;
    let before = w.count();
    let resumed = wait_for(|| w.count() > before + 20, "writes on the floor's 18").await;
    let gap = w.stop(t0).await;
    let _ = floor_phase(b, primary, "cleanup", bins).await;
    let steps = steps?;
    resumed?;
    let (a, z) = gap.context("no gap in the floor's writes")?;
    println!(
        "floor (stop, pg_upgrade --link, start on a copy): {}",
        steps.trim()
    );
    Ok(z.duration_since(a).as_secs_f64() * 1000.0)
}

/// The in-place upgrade's writer-seen downtime in ms, and its step timeline.
async fn in_place(
    b: &ProcessEnv,
    name: &str,
    rw: &str,
    pw: &str,
) -> Result<(f64, Vec<(String, f64)>)> {
    let w = Writer::start(rw.to_owned(), 5432, pw.to_owned());
    wait_for(|| w.count() > 20, "the writer").await?;
    let primary = b.status(name).await?.current_primary.unwrap_or_default();
    let mut pod = PodSeen::default();
    let t0 = Instant::now();
    let patch = serde_json::json!({"spec": {"version": "18"}});
    b.pgc()
        .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
        .await?;
    let mut timeline: Vec<(String, f64)> = vec![];
    let since = |t: Instant| t.duration_since(t0).as_secs_f64();
    loop {
        let st = b.status(name).await?;
        let step = st.major_upgrade.as_ref().map(|m| m.step.clone());
        if let Some(s) = step.filter(|s| timeline.last().is_none_or(|(l, _)| l != s)) {
            ensure!(
                !s.contains("Failed"),
                "the upgrade failed: {:?}",
                st.major_upgrade
            );
            timeline.push((s, since(Instant::now())));
        }
        for what in pod.look(b, &primary).await {
            timeline.push((what, since(Instant::now())));
        }
        if st.current_version.as_deref() == Some("18") && st.major_upgrade.is_none() {
            timeline.push(("done (record removed)".into(), since(Instant::now())));
            break;
        }
        ensure!(
            t0.elapsed() < LIMIT,
            "not upgraded within {LIMIT:?}: {st:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (a, z) = w.stop(t0).await.context("no gap in the writes")?;
    timeline.push(("writer: last ok write".into(), since(a)));
    timeline.push(("writer: first ok write".into(), since(z)));
    timeline.sort_by(|x, y| x.1.total_cmp(&y.1));
    Ok((z.duration_since(a).as_secs_f64() * 1000.0, timeline))
}

/// The primary's Pod as the bench last saw it, to place the Pod's own
/// moments (gone, created again, running, ready) in the timeline.
#[derive(Default)]
struct PodSeen {
    uid: Option<String>,
    deleting: bool,
    gone: bool,
    running: bool,
    ready: bool,
}

impl PodSeen {
    async fn look(&mut self, b: &ProcessEnv, name: &str) -> Vec<String> {
        let mut seen = vec![];
        let Ok(p) = b.pods().get_opt(name).await else {
            return seen;
        };
        let uid = p.as_ref().and_then(|p| p.metadata.uid.clone());
        if self.uid.is_none() {
            self.uid = uid;
            return seen;
        }
        let deleting = p
            .as_ref()
            .is_some_and(|p| p.metadata.deletion_timestamp.is_some());
        if deleting && !self.deleting && uid == self.uid {
            self.deleting = true;
            seen.push(format!("pod {name}: deletion asked"));
        }
        if uid != self.uid {
            if !self.gone {
                seen.push(format!("pod {name}: old one gone"));
                self.gone = true;
            }
            if uid.is_some() {
                seen.push(format!("pod {name}: created again"));
                (self.uid, self.running, self.ready) = (uid, false, false);
            }
        }
        let Some(st) = p.and_then(|p| p.status).filter(|_| self.gone) else {
            return seen;
        };
        if !self.running && st.phase.as_deref() == Some("Running") {
            self.running = true;
            seen.push(format!("pod {name}: running"));
        }
        let ready = st
            .conditions
            .unwrap_or_default()
            .iter()
            .any(|c| c.type_ == "Ready" && c.status == "True");
        if !self.ready && ready {
            self.ready = true;
            seen.push(format!("pod {name}: ready"));
        }
        seen
    }
}

pub(super) async fn wait_for(ok: impl Fn() -> bool, what: &str) -> Result<()> {
    let t = Instant::now();
    while !ok() {
        ensure!(t.elapsed() < LIMIT, "{what}: nothing within {LIMIT:?}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}
