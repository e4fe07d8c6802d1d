//! Per-member-cluster controllers. Each member has one PostgresCluster watch
//! and cache; its objects are handed by `hash(namespace/name) mod S` to S
//! shard Controllers (kube-runtime; `shards`). All shards of a member share
//! its bounded worker pool, so no member can take the fleet's capacity and
//! none waits for another. A kube-runtime Controller never reconciles one
//! object twice at the same time, and an object lives in exactly one shard.

pub mod access;
pub mod admission;
pub mod batched;
pub mod blocked;
pub mod build;
pub mod cached;
mod config;
pub mod dr;
pub mod drain;
pub mod error;
pub mod expect;
pub mod failover;
#[cfg(test)]
mod function_length;
#[cfg(test)]
mod golden_tests;
mod image_policy;
pub mod index;
mod index_wire;
/// Metadata that skips `managedFields` while parsing: the index's
/// metadata-only watches, the rollout and backup wake-ups, and answers read
/// only for their resourceVersion.
pub use index_wire::SlimMeta;
mod instance;
mod instance_pod;
pub mod major_upgrade;
pub mod names;
#[cfg(test)]
mod names_props;
mod pipeline;
pub mod placement;
pub mod plan;
pub mod pooler;
pub mod reconcile;
mod record;
mod repository;
mod restore;
pub mod restore_source;
pub mod retry;
pub mod rolling_update;
mod secrets;
pub mod shards;
pub mod storage;
mod streaming;
pub mod switchover;
pub mod tls;
pub mod validate;
pub mod written;

use crate::fleet::Member;
use crate::platform::events::Recorder;
use cached::CachedCluster;
use futures::{StreamExt, TryStreamExt};
use kube::runtime::events::{EventType, Reporter};
use kube::runtime::reflector::{self, ObjectRef, Store};
use kube::runtime::{WatchStreamExt, watcher};
use kube::{Api, ResourceExt};
use std::sync::Arc;
use std::sync::atomic::AtomicU64;
use tokio::sync::Semaphore;

/// Counters the summary line, metrics and benchmarks read.
#[derive(Debug, Default)]
pub struct Stats {
    pub reconciles: AtomicU64,
    pub errors: AtomicU64,
    pub status_writes: AtomicU64,
    pub failovers: AtomicU64,
    pub switchovers: AtomicU64,
}

/// What every reconcile of one member cluster shares.
pub struct Ctx {
    pub member: String,
    pub client: kube::Client,
    pub index: Arc<index::ChildIndex>,
    /// Our own recent creations/removals the caches may not show yet.
    pub expect: expect::Expectations,
    pub pool: Arc<Semaphore>,
    /// The fleet-wide bound on reconciles at once (see `admission`).
    pub admission: admission::Admission,
    /// When the member last answered (admissions are held while it does).
    pub answered: crate::fleet::swap::Answered,
    pub recorder: Recorder,
    pub shards: u32,
    pub stats: Arc<Stats>,
    /// The backup repository; instances archive WAL to it when set.
    pub backup: Option<Arc<crate::pgbackrest::repo::BackupEnv>>,
    /// Every member cluster of the fleet: a restore from another member
    /// reads the source's backup records and passwords there.
    pub peers: Vec<Arc<Member>>,
    /// Whether a restore may cross namespaces without the source's consent
    /// (`[tenancy] restore_across_namespaces`).
    pub restore_policy: crate::config::CrossNamespaceRestore,
    /// `[tls]`: server certificate validity and renewal.
    pub tls: tls::Policy,
    /// `[images]`: what `spec.image` may name (image_policy).
    pub images: Arc<crate::config::images::Images>,
    /// `[roles.<set>]`: fleet role sets, applied by the access step.
    pub role_sets: Arc<std::collections::BTreeMap<String, crate::config::roles::RoleSet>>,
    /// `[dr.<topology>]`: which side a cluster is on.
    pub dr: Arc<dr::registry::Registry>,
    /// Consecutive failures per PostgresCluster, for the retry policy.
    pub failures: retry::Failures,
    /// Replicas seen without a streaming WAL receiver (`streaming`).
    pub streaming: streaming::Watch,
    /// When each cluster's volume usage was last read (`storage`).
    pub storage: storage::Readings,
    /// Instance pods that cannot run the instance script (`blocked`).
    pub contract: instance::ContractFailures,
    /// The member's cordoned Nodes (`drain`).
    pub cordoned: Arc<drain::Cordoned>,
    /// Our last write to each PostgresCluster (`written`).
    pub written: written::Written,
    /// Creation Events of the running reconciles (`batched`).
    pub created: batched::Batched,
}

pub use shards::shard_of;

/// A running member controller: its PostgresCluster cache, for summaries.
#[derive(Clone)]
pub struct Handle {
    pub member: Arc<Member>,
    pub store: Store<CachedCluster>,
    pub stats: Arc<Stats>,
    tasks: Arc<Tasks>,
}

/// The tasks of one member controller, so that it can be stopped when this
/// replica loses the member's Lease (`ha`): dropping a reconcile at an
/// await point is safe because every multi-step operation records its
/// intent first.
#[derive(Default)]
struct Tasks(std::sync::Mutex<Vec<tokio::task::AbortHandle>>);

impl Tasks {
    fn spawn(&self, f: impl std::future::Future<Output = ()> + Send + 'static) {
        let h = tokio::spawn(f).abort_handle();
        self.0.lock().unwrap_or_else(|e| e.into_inner()).push(h);
    }
}

impl Handle {
    /// Stops the controller: watches, shard controllers, in-flight reconciles.
    pub fn stop(&self) {
        for h in self
            .tasks
            .0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .drain(..)
        {
            h.abort();
        }
    }

    /// (healthy, total) PostgresClusters from the caches.
    pub fn health(&self) -> (usize, usize) {
        let mut healthy = 0;
        let mut total = 0;
        for pg in self.store.state() {
            total += 1;
            if pg.phase() == Some(crate::crd::Phase::Healthy) {
                healthy += 1;
            }
        }
        (healthy, total)
    }
}

/// What the fleet config tells the controllers of every member cluster.
#[derive(Clone)]
pub struct FleetConfig {
    /// `[tenancy] restore_across_namespaces`.
    pub restore_policy: crate::config::CrossNamespaceRestore,
    /// `[images]`.
    pub images: Arc<crate::config::images::Images>,
    /// `[roles.<set>]`.
    pub role_sets: Arc<std::collections::BTreeMap<String, crate::config::roles::RoleSet>>,
    /// `[tls]`.
    pub tls: tls::Policy,
    /// `[dr.<topology>]`: each cluster's side, kept by the DR engines.
    pub dr: Arc<dr::registry::Registry>,
    /// `manager.reconciles_in_flight`: shared by every member's controllers.
    pub admission: admission::Admission,
}

/// An annotation pgfleet reads: `pgfleet.io/…` or `<sub>.pgfleet.io/…`.
fn ours(key: &str) -> bool {
    key.split_once('/')
        .is_some_and(|(domain, _)| domain == "pgfleet.io" || domain.ends_with(".pgfleet.io"))
}

/// Events come from `pgfleet`, instance: the manager's Pod (`HOSTNAME`).
fn recorder(client: kube::Client) -> Recorder {
    let reporter = Reporter {
        controller: "pgfleet".into(),
        instance: std::env::var("HOSTNAME").ok(),
    };
    Recorder::new(client, reporter)
}

/// Starts the PostgresCluster watch, the shard controllers and the child
/// watches of one member cluster; they run (reconnecting with backoff)
/// until dropped.
pub fn start(
    member: Arc<Member>,
    shards: u32,
    workers: u32,
    backup: Option<Arc<crate::pgbackrest::repo::BackupEnv>>,
    peers: Vec<Arc<Member>>,
    config: FleetConfig,
) -> Handle {
    let shards = shards.max(1);
    let categories = error::Category::ALL.map(error::Category::label);
    crate::metrics::reconcile::member_started(&member.name, &categories);
    // Stable for the member's lifetime; follows kubeconfig changes (fleet::swap).
    let client = member.client();
    let stats = Arc::new(Stats::default());
    let idx = Arc::new(index::ChildIndex::default());
    let (store, writer) = reflector::store();
    let ctx = context(
        &member,
        client.clone(),
        store.clone(),
        shards,
        workers,
        &stats,
        &idx,
        backup,
        peers,
        config,
    );
    let tasks = Arc::new(Tasks::default());
    let (router, receivers) = shards::Router::new(shards);
    for (shard, rx) in (0..).zip(receivers) {
        spawn_shard(
            &tasks,
            &ctx,
            &member.name,
            shard,
            workers,
            store.clone(),
            rx,
        );
    }
    let router = Arc::new(router);
    let trigger: index::Trigger = {
        let router = router.clone();
        Arc::new(move |r: ObjectRef<CachedCluster>| router.send(r))
    };
    tasks.spawn(shards::route(
        watch(client.clone(), writer, ctx.clone()),
        move |r| router.send(r),
        member.name.clone(),
    ));
    tasks.spawn(drain::watch(
        client.clone(),
        ctx.cordoned.clone(),
        idx.clone(),
        trigger.clone(),
    ));
    tasks.spawn(index::run(client, idx, trigger));
    Handle {
        member,
        store,
        stats,
        tasks,
    }
}

/// What every reconcile of the member shares.
#[allow(clippy::too_many_arguments)]
fn context(
    member: &Member,
    client: kube::Client,
    cache: Store<CachedCluster>,
    shards: u32,
    workers: u32,
    stats: &Arc<Stats>,
    idx: &Arc<index::ChildIndex>,
    backup: Option<Arc<crate::pgbackrest::repo::BackupEnv>>,
    peers: Vec<Arc<Member>>,
    config: FleetConfig,
) -> Arc<Ctx> {
    let FleetConfig {
        restore_policy,
        images,
        role_sets,
        tls,
        dr,
        admission,
    } = config;
    Arc::new(Ctx {
        member: member.name.clone(),
        client: client.clone(),
        index: idx.clone(),
        expect: expect::Expectations::default(),
        pool: Arc::new(Semaphore::new(workers.max(1) as usize)),
        admission,
        answered: member.answered(),
        recorder: recorder(client),
        shards,
        stats: stats.clone(),
        backup,
        peers,
        restore_policy,
        tls,
        images,
        role_sets,
        dr,
        failures: retry::Failures::default(),
        streaming: streaming::Watch::default(),
        storage: storage::Readings::default(),
        contract: instance::ContractFailures::default(),
        cordoned: Arc::new(drain::Cordoned::default()),
        written: written::Written::new(cache),
        created: batched::Batched::default(),
    })
}

/// The member's PostgresCluster watch, reflected into the cache in the form
/// reconcile reads (`cached`: spec and status as text): no managedFields,
/// no annotations but pgfleet's own (`pgfleet.io/` and its subdomains, such
/// as a role set's `roles.pgfleet.io/<set>`; a tenant's object may carry up
/// to 256 KiB of others; the spec itself is bounded by the CRD,
/// docs/security.md).
/// Reconcile works from this copy, or reads the object fresh while the
/// copy lags behind our own last write (`written`).
fn watch(
    client: kube::Client,
    writer: reflector::store::Writer<CachedCluster>,
    ctx: Arc<Ctx>,
) -> impl futures::Stream<Item = Result<CachedCluster, watcher::Error>> + Send {
    let api: Api<CachedCluster> = Api::all(client);
    watcher(api, watcher::Config::default())
        .default_backoff()
        .modify(strip)
        .reflect(writer)
        .touched_objects()
        .inspect_ok(move |pg| ctx.written.caught_up(pg))
}

/// The cache's form of a PostgresCluster (see [`watch`]); its
/// `managedFields` were skipped while parsing (`CachedCluster`).
fn strip(pg: &mut CachedCluster) {
    pg.annotations_mut().retain(|k, _| ours(k));
}

/// One shard's kube-runtime Controller over the member's cache: it
/// reconciles what `rx` names (its objects from the watch, child changes).
fn spawn_shard(
    tasks: &Tasks,
    ctx: &Arc<Ctx>,
    member: &str,
    shard: u32,
    workers: u32,
    cache: Store<CachedCluster>,
    rx: shards::Triggers,
) {
    let ctx = ctx.clone();
    let name = member.to_string();
    tasks.spawn(async move {
        shards::controller(cache, rx, workers)
            .run(
                move |pg, ctx| observed(pg, ctx, shard),
                reconcile::error_policy,
                ctx,
            )
            .for_each(|r| {
                if let Err(e) = r {
                    tracing::debug!(cluster = %name, shard, error = %e, "controller event");
                }
                futures::future::ready(())
            })
            .await;
    });
}

/// A reconcile inside its span (a trace of its own), timed and counted for
/// the metrics (`crate::metrics::reconcile` says what its queue depth is).
/// A failure is counted under its category and, unless it is a routine
/// conflict (retried at once), recorded as a Warning Event whose reason is
/// the category — or, for a failure a person must act on (`blocked`), as a
/// condition and an Event naming it.
async fn observed(
    pg: Arc<CachedCluster>,
    ctx: Arc<Ctx>,
    shard: u32,
) -> Result<kube::runtime::controller::Action, reconcile::Error> {
    use tracing::Instrument;
    let (ns, name) = (pg.namespace().unwrap_or_default(), pg.name_any());
    let span = crate::telemetry::spans::reconcile(&ctx.member, &ns, &name, shard);
    let timer = crate::metrics::reconcile::start(&ctx.member);
    let result = async {
        let result = reconcile::reconcile(pg.clone(), ctx.clone()).await;
        // At debug: one line per reconcile, carrying its trace id.
        tracing::debug!(ok = result.is_ok(), "reconciled");
        result
    }
    .instrument(span)
    .await;
    let category = result.as_ref().err().map(reconcile::Error::category);
    timer.finish(category.map(error::Category::label));
    match (&result, category) {
        (Ok(_), _) => {
            ctx.failures.succeeded(&retry::key(&*pg));
            // An instance whose script cannot run answers None to `report`;
            // the round may still succeed, but the cluster must say so.
            let pods = ctx.index.get(&ns, &name).pods;
            if let Some(b) = ctx.contract.of(&ns, &pods) {
                blocked::surface(&ctx, &*pg, &b).await;
            }
        }
        (Err(_), Some(error::Category::Conflict)) | (Err(_), None) => {}
        (Err(e), Some(c)) => match blocked::classify(e) {
            // A quota or an image without the instance script: named, with
            // a condition, instead of the generic category Event.
            Some(b) => blocked::surface(&ctx, &*pg, &b).await,
            None => {
                // An Event's note is at most 1 KiB on a real API server.
                let note: String = e.to_string().chars().take(1000).collect();
                reconcile::event_on(&ctx, &*pg, EventType::Warning, c.reason(), note).await;
            }
        },
    }
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::Ordering;

    #[test]
    fn the_cache_keeps_pgfleet_s_annotations_and_its_subdomains_only() {
        for k in ["pgfleet.io/switchover", "roles.pgfleet.io/monitor"] {
            assert!(ours(k), "{k}");
        }
        for k in [
            "evilpgfleet.io/x",
            "example.com/pgfleet.io",
            "pgfleet.io",
            "kubectl.kubernetes.io/last-applied-configuration",
        ] {
            assert!(!ours(k), "{k}");
        }
    }

    #[test]
    fn counter_defaults() {
        let s = Stats::default();
        s.reconciles.fetch_add(1, Ordering::Relaxed);
        assert_eq!(s.reconciles.load(Ordering::Relaxed), 1);
    }
}
