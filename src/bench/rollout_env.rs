//! The rollout benchmark's environment: a whole manager over embedded member
//! clusters (virtual runtime, labelled `wave=0,1,…` like the rollout tests),
//! the PostgresClusters it measures, and the settings rollout engines are
//! built from, and the failure → halt runs (which are mostly watches on
//! that environment). Rollouts are never put in the manager's own settings:
//! the manager would start an engine for each, and the benchmark must own
//! the engine whose timing it measures.

use crate::crd::PostgresCluster;
use crate::manager::Manager;
use crate::platform::clock::SystemClock;
use crate::platform::task::AbortOnDrop;
use crate::rollout::control;
use crate::rollout::engine::Engine;
use crate::rollout::plan::ControlState;
use crate::testkit::fleet;
use anyhow::{Context, Result, bail, ensure};
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::Api;
use kube::api::{ListParams, Patch, PatchParams, PostParams};
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event, watcher};
use pgfleet_sim::SimCluster;
use serde::de::DeserializeOwned;
use serde_json::json;
use std::fmt::Debug;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::sync::oneshot;

/// Namespace of every PostgresCluster of the benchmark.
pub const NS: &str = "bench";
/// Label that tells the rollout's PostgresClusters (`rollout`) from the
/// ones only used for the floor (`floor`); the stages select on it.
pub const LABEL: &str = "bench";
/// Longest wait for any one condition; generous because a shared 2-core
/// machine can be slow, and nothing here is a timed assertion.
pub const PATIENCE: Duration = Duration::from_secs(180);
/// The engines' longest pause between rounds (the manager's is 2 s, which
/// would dominate the pacing of clusters that update in well under that).
pub const TICK: Duration = Duration::from_millis(100);

pub struct Env {
    pub mgr: Manager,
    /// Member names in order; member `i` carries the label `wave=i`.
    pub members: Vec<String>,
    /// Kept after the run: the embedded clusters persist into it until the
    /// process exits, so removing it earlier only produces write errors.
    pub dir: PathBuf,
}

impl Env {
    /// Starts the manager and waits until every member serves the
    /// PostgresCluster kind (the manager installs the CRD in the background).
    pub async fn start(dir: Option<PathBuf>, members: usize) -> Result<Env> {
        let dir = dir.unwrap_or_else(|| {
            std::env::temp_dir().join(format!("pgfleet-bench-rollout-{}", std::process::id()))
        });
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        let members: Vec<String> = (1..=members).map(|i| format!("member-{i}")).collect();
        let mgr = fleet::start_manager(&base_toml(&dir, &members), PATIENCE).await?;
        for m in &members {
            let client = mgr
                .fleet
                .get(m)
                .with_context(|| format!("no member cluster {m}"))?
                .client();
            fleet::apply_namespace(&client, NS).await?;
        }
        Ok(Env { mgr, members, dir })
    }

    /// Settings with the manager's members plus `rollouts` (TOML), for
    /// [`crate::rollout::engine::Engine::new`].
    pub fn settings_with(&self, rollouts: &str) -> Result<crate::config::Settings> {
        load(&format!(
            "{}\n{rollouts}",
            base_toml(&self.dir, &self.members)
        ))
    }

    pub fn client(&self, member: &str) -> Result<kube::Client> {
        Ok(self
            .mgr
            .fleet
            .get(member)
            .with_context(|| format!("no member cluster {member}"))?
            .client())
    }

    pub fn pgc(&self, member: &str) -> Result<Api<PostgresCluster>> {
        Ok(Api::namespaced(self.client(member)?, NS))
    }

    pub fn pods(&self, member: &str) -> Result<Api<Pod>> {
        Ok(Api::namespaced(self.client(member)?, NS))
    }

    pub fn sim(&self, member: &str) -> Result<&SimCluster> {
        self.mgr
            .sim
            .as_ref()
            .and_then(|s| s.get(member))
            .with_context(|| format!("no embedded cluster {member}"))
    }

    /// Creates a PostgresCluster with `clusterSize` 2 at `version`, labelled
    /// `pgfleet.io/bench=<role>`.
    pub async fn create(&self, member: &str, name: &str, version: &str, role: &str) -> Result<()> {
        let pg: PostgresCluster = serde_json::from_value(json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": NS, "labels": {LABEL: role}},
            "spec": {"clusterSize": 2, "version": version, "storage": {"size": "1Gi"}},
        }))?;
        self.pgc(member)?
            .create(&PostParams::default(), &pg)
            .await
            .with_context(|| format!("creating {member}/{NS}/{name}"))?;
        Ok(())
    }

    /// Sets `spec.version` directly (the floor: no rollout engine involved).
    pub async fn set_version(&self, member: &str, name: &str, version: &str) -> Result<()> {
        let patch = json!({"spec": {"version": version}});
        self.pgc(member)?
            .patch(name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("patching {member}/{NS}/{name}"))?;
        Ok(())
    }

    /// Waits until every PostgresCluster labelled `role` on `member` is
    /// settled: at `version` when given, else Healthy on whatever version
    /// with no rolling update (see [`is_at`]).
    pub async fn wait_all(&self, member: &str, role: &str, version: Option<&str>) -> Result<()> {
        let api = self.pgc(member)?;
        let lp = ListParams::default().labels(&format!("{LABEL}={role}"));
        let deadline = Instant::now() + PATIENCE;
        loop {
            let list = api.list(&lp).await?;
            let behind = list.items.iter().filter(|p| !is_at(p, version)).count();
            if behind == 0 {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "{behind} PostgresClusters on {member} not settled at {version:?} after {PATIENCE:?}"
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Makes `member` unable to pull these images (added to what already
    /// fails there: a pod stuck on an earlier failing image stays stuck).
    pub fn fail_image(&self, member: &str, image: &str) -> Result<()> {
        let faults = &self.sim(member)?.cluster.faults;
        let mut spec = faults.get();
        spec.failing_images.push(image.to_string());
        faults.set(spec);
        Ok(())
    }
}

/// The moment a watch first delivered an object for which a predicate
/// held; the watch stops there (or when this is dropped).
pub struct FirstSeen {
    pub at: oneshot::Receiver<Instant>,
    _task: AbortOnDrop,
}

/// Starts watching `api` and returns once the watch's initial listing is
/// done, so nothing that happens afterwards is missed. Times are taken when
/// the event reaches this process (milliseconds, unlike the second-granular
/// timestamps in the objects).
pub async fn first_seen<K>(
    api: Api<K>,
    pred: impl Fn(&K) -> bool + Send + 'static,
) -> Result<FirstSeen>
where
    K: kube::Resource + Clone + DeserializeOwned + Debug + Send + 'static,
    K::DynamicType: Default,
{
    let (ready_tx, ready_rx) = oneshot::channel();
    let (at_tx, at) = oneshot::channel();
    let task = tokio::spawn(async move {
        let mut ready = Some(ready_tx);
        let mut stream = std::pin::pin!(watcher(api, watcher::Config::default()).default_backoff());
        while let Some(ev) = stream.next().await {
            let hit = match ev {
                Ok(Event::Apply(o) | Event::InitApply(o)) => pred(&o),
                Ok(Event::InitDone) => {
                    ready.take().map(|r| r.send(()));
                    false
                }
                _ => false,
            };
            if hit {
                let _ = at_tx.send(Instant::now());
                return;
            }
        }
    });
    // An early hit ends the task before InitDone: the sender is dropped.
    let _ = tokio::time::timeout(PATIENCE, ready_rx)
        .await
        .context("a watch did not finish its initial listing")?;
    Ok(FirstSeen {
        at,
        _task: AbortOnDrop(task),
    })
}

/// Healthy on `version` (any version when `None`) with nothing left to do.
pub fn is_at(pg: &PostgresCluster, version: Option<&str>) -> bool {
    let st = pg.status.clone().unwrap_or_default();
    st.phase.as_deref() == Some("Healthy")
        && version.is_none_or(|v| st.current_version.as_deref() == Some(v))
        && st.rolling_update.is_none()
        && st.observed_generation == pg.metadata.generation
}

fn load(toml: &str) -> Result<crate::config::Settings> {
    Ok(fleet::load(toml)?)
}

/// The manager's settings: the test fleet's (embedded virtual members
/// labelled `wave=0,1,…`, fast probes, generous client QPS: the benchmark
/// measures pacing, not the client rate limit).
fn base_toml(dir: &std::path::Path, members: &[String]) -> String {
    let names: Vec<&str> = members.iter().map(String::as_str).collect();
    fleet::embedded_toml(dir, "virtual", &names, fleet::MANY_OBJECTS)
}

/// One failure → halt measurement (seconds; `None` when never observed).
pub struct HaltRun {
    pub pull_to_halt: Option<f64>,
    pub seen_to_halt: Option<f64>,
}

/// Rollout `bench-fail-<k>` to `15.<20+k>` over every member, which the
/// `wave=1` member cannot pull: time from the failure to the stored halt.
pub async fn halt_run(env: &Env, concurrency: usize, k: usize) -> Result<HaltRun> {
    let failing = env.members[1].clone();
    let version = format!("15.{}", 20 + k);
    let image = format!("postgres:{version}");
    let name = format!("bench-fail-{k}");
    env.fail_image(&failing, &image)?;
    let toml = format!(
        "[rollouts.{name}]\ntarget_version = \"{version}\"\nprogress_deadline = \"1h\"\n\
         on_failure = \"pause\"\nmax_failures = 0\n[[rollouts.{name}.stages]]\nname = \"all\"\n\
         clusters = \"\"\npostgresclusters = \"{LABEL}=rollout\"\nmax_concurrency = {}\n",
        concurrency
    );
    let pull = first_seen(env.pods(&failing)?, {
        let image = image.clone();
        move |p: &Pod| stuck_on(p, &image)
    })
    .await?;
    let seen = first_seen(env.pgc(&failing)?, {
        let version = version.clone();
        move |pg: &PostgresCluster| {
            pg.status
                .as_ref()
                .and_then(|s| s.rolling_update.as_ref())
                .is_some_and(|r| r.target_version == version && r.failure.is_some())
        }
    })
    .await?;
    // The engine stores the halt on its control home (one of the members);
    // that copy is what `control::read` returns from then on.
    let mut stored = vec![];
    for m in &env.members {
        let cm_name = control::object_name(&name);
        stored.push(
            first_seen(
                Api::<ConfigMap>::all(env.client(m)?),
                move |cm: &ConfigMap| {
                    cm.metadata.name.as_deref() == Some(cm_name.as_str())
                        && cm.metadata.namespace.as_deref() == Some(control::NAMESPACE)
                        && cm
                            .data
                            .as_ref()
                            .and_then(|d| d.get("state"))
                            .map(String::as_str)
                            == Some("paused")
                },
            )
            .await?,
        );
    }
    let engine = engine(env, &toml, &name)?;
    let home = engine.control_home().clone();
    let t0 = Instant::now();
    let task = AbortOnDrop(tokio::spawn(engine.run()));
    let halts = futures::future::select_all(stored.iter_mut().map(|s| &mut s.at));
    let halt = match tokio::time::timeout(PATIENCE, halts).await {
        Ok((Ok(at), ..)) => at,
        Ok((Err(_), ..)) => bail!("a watch of {name}'s control ended"),
        Err(_) => bail!("{name} did not halt within {PATIENCE:?}"),
    };
    // Both happened before the halt; their events may still be in transit.
    let grace = Duration::from_secs(1);
    let pull = tokio::time::timeout(grace, pull.at)
        .await
        .ok()
        .and_then(Result::ok);
    let seen = tokio::time::timeout(grace, seen.at)
        .await
        .ok()
        .and_then(Result::ok);
    let stored = control::read(&home, &name).await?;
    ensure!(
        stored.control.state == ControlState::Paused,
        "{name}: the stored control reads {:?}",
        stored.control.state
    );
    drop(task);
    let since = |t: Option<Instant>| t.map(|t| as_secs(halt.saturating_duration_since(t)));
    let run = HaltRun {
        pull_to_halt: since(pull),
        seen_to_halt: since(seen),
    };
    let ms = |v: Option<f64>| v.map_or("not seen".into(), |v| format!("{:.0} ms", v * 1000.0));
    println!(
        "halt run {k} ({name} → {version}, {image} fails on {failing}): halted {:.2} s after \
         the engine started; image-pull failure → halt {}, status failure → halt {}\n  reason: {}",
        as_secs(halt - t0),
        ms(run.pull_to_halt),
        ms(run.seen_to_halt),
        stored.control.reason.unwrap_or_default()
    );
    // Let clusters updated before the halt finish, so the next run starts
    // from a settled fleet (the failing member's stay failed on purpose).
    for m in env.members.iter().filter(|m| **m != failing) {
        env.wait_all(m, "rollout", None)
            .await
            .context("settling after a halt")?;
    }
    Ok(run)
}

/// An engine for rollout `name` described by `toml`, on the system clock
/// with [`TICK`].
pub fn engine(env: &Env, toml: &str, name: &str) -> Result<Arc<Engine>> {
    let settings = env.settings_with(toml)?;
    let mut e = Engine::new(
        name,
        &settings,
        env.mgr.fleet.clone(),
        Arc::new(SystemClock),
    )?;
    e.tick = TICK;
    Ok(Arc::new(e))
}

/// A pod on `image` that cannot pull it.
fn stuck_on(p: &Pod, image: &str) -> bool {
    let on = p.spec.as_ref().and_then(|s| s.containers.first());
    let waiting = p.status.as_ref().and_then(|s| {
        s.container_statuses
            .as_ref()?
            .first()?
            .state
            .as_ref()?
            .waiting
            .as_ref()
    });
    on.and_then(|c| c.image.as_deref()) == Some(image)
        && waiting.and_then(|w| w.reason.as_deref()) == Some("ImagePullBackOff")
}

fn as_secs(d: Duration) -> f64 {
    d.as_secs_f64()
}
