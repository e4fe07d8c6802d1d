//! The `pgfleet run` service: loads the fleet config, starts the embedded
//! clusters it names, connects to every member cluster, installs the CRDs,
//! and runs one controller per member, keeping a compact fleet summary on the
//! terminal.

pub mod bootstrap;

use crate::config::{EmbeddedRuntime, Settings};
use crate::controller;
use crate::fleet::Fleet;
use crate::platform::task::AbortOnDrop;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A running manager (the embedded clusters stay alive while it lives).
pub struct Manager {
    pub fleet: Arc<Fleet>,
    /// Member ownership (Leases) and the controllers of the members this
    /// replica owns; dropping it stops them (see [`Manager::release`]).
    pub ha: crate::ha::Ha,
    /// Runs the `[rollouts.<name>]` engines while this replica owns the
    /// fleet's lowest-named member (so exactly one replica runs them).
    pub rollouts: Vec<AbortOnDrop>,
    /// The fleet's backup dispatcher (schedules, caps, archiving checks).
    pub backups: AbortOnDrop,
    /// The `[dr.<topology>]` engines (run like the rollout engines); kept
    /// here for their status and for switchovers.
    pub dr: Vec<Arc<crate::dr::Engine>>,
    pub sim: Option<pgfleet_sim::Sim>,
    /// Hands the memory a burst of reconciles freed back to the system
    /// (`platform::memory`).
    pub memory: AbortOnDrop,
}

/// Starts everything the settings describe.
pub async fn start(settings: &Settings, apply_examples: bool) -> anyhow::Result<Manager> {
    let embedded: Vec<String> = settings
        .clusters
        .iter()
        .filter(|c| c.embedded)
        .map(|c| c.name.clone())
        .collect();
    let sim = if embedded.is_empty() {
        None
    } else {
        let mut opts = crate::emulated::sim_options(settings.manager.state_dir.join("embedded"), 0);
        opts.names = embedded;
        opts.images = crate::emulated::images::rules_with(&settings.images.catalog());
        opts.runtime = match settings.manager.embedded.runtime.get() {
            EmbeddedRuntime::Virtual => crate::emulated::virtual_runtime(),
            EmbeddedRuntime::Process => pgfleet_sim::RuntimeKind::Process,
        };
        let e = &settings.manager.embedded;
        opts.nodes = pgfleet_sim::nodes::NodeLayout::new(e.nodes, e.zones)
            .map_err(|why| anyhow::anyhow!("[manager.embedded] nodes/zones: {why}"))?;
        Some(pgfleet_sim::start(&opts).await?)
    };
    let kubeconfigs: BTreeMap<String, std::path::PathBuf> = sim
        .as_ref()
        .map(|s| {
            s.clusters
                .iter()
                .map(|c| (c.name.clone(), c.kubeconfig.clone()))
                .collect()
        })
        .unwrap_or_default();
    let fleet = Arc::new(Fleet::connect(settings, &kubeconfigs).await?);
    let m = &settings.manager;
    fleet.spawn_probes(
        m.probe_interval.get(),
        m.probe_timeout.get(),
        m.probe_failure_threshold.max(1),
    );
    let backup_env = Arc::new(crate::pgbackrest::repo::BackupEnv::from_settings(settings));
    for member in &fleet.members {
        let is_embedded = kubeconfigs.contains_key(&member.name);
        tokio::spawn(bootstrap::install(
            member.clone(),
            apply_examples && is_embedded,
        ));
    }
    let (shards, workers) = (m.shards_per_cluster, m.workers_per_cluster);
    let has_repository = settings.backups.repository.is_some();
    let embedded_names: std::collections::BTreeSet<String> = kubeconfigs.keys().cloned().collect();
    let env = backup_env.clone();
    let peers = fleet.members.clone();
    let dr_registry = Arc::new(controller::dr::registry::Registry::from_config(
        &settings.dr,
    ));
    let config = controller::FleetConfig {
        restore_policy: settings.tenancy.restore_policy(),
        images: Arc::new(settings.images.clone()),
        role_sets: Arc::new(settings.roles.clone()),
        tls: controller::tls::Policy {
            validity: settings.tls.validity(),
            renew_before: settings.tls.renew_before(),
        },
        dr: dr_registry.clone(),
        admission: controller::admission::Admission::new(m.reconciles_in_flight),
    };
    let starter: crate::ha::Starter = Arc::new(move |member: Arc<crate::fleet::Member>| {
        // The default repository is a directory on this machine: only
        // the embedded runtimes' instances can reach it. Real clusters
        // archive and back up only to a configured repository.
        let backup = (has_repository || embedded_names.contains(&member.name)).then(|| env.clone());
        controller::start(
            member,
            shards,
            workers,
            backup,
            peers.clone(),
            config.clone(),
        )
    });
    let identity = crate::ha::identity::resolve(m.identity.as_deref(), &m.state_dir)?;
    let ha = crate::ha::Ha::start(
        &fleet,
        identity,
        crate::ha::Timings::from_settings(m),
        starter,
    )
    .await;
    let mut dispatcher = crate::backup::dispatch::Dispatcher::new(
        &settings.backups,
        backup_env.clone(),
        fleet.clone(),
        Arc::new(crate::platform::clock::SystemClock),
    );
    if settings.backups.repository.is_none() {
        dispatcher.members = Some(kubeconfigs.keys().cloned().collect());
    }
    let owned = ha.ownership.clone();
    dispatcher.acts_on = Some(Arc::new(move |member: &str| owned.owns(member)));
    let dispatcher = Arc::new(dispatcher);
    let backups = AbortOnDrop(tokio::spawn(dispatcher.clone().run()));
    let mut engines = vec![];
    let mut engines_dr: Vec<Arc<crate::dr::Engine>> = vec![];
    for name in settings.rollouts.keys() {
        engines.push(Arc::new(crate::rollout::engine::Engine::new(
            name,
            settings,
            fleet.clone(),
            Arc::new(crate::platform::clock::SystemClock),
        )?));
    }
    for (name, t) in &settings.dr {
        engines_dr.push(Arc::new(crate::dr::Engine::new(
            name,
            t.clone(),
            fleet.clone(),
            dr_registry.clone(),
        )));
    }
    let mut rollouts = vec![];
    // Every replica reads the same config, so all agree on this member.
    let lead = fleet.members.iter().map(|m| m.name.as_str()).min();
    if let Some(rx) = lead.and_then(|l| ha.ownership.subscribe(l))
        && !engines.is_empty()
    {
        rollouts.push(AbortOnDrop(crate::ha::while_owned(rx, move || {
            engines
                .iter()
                .map(|e| AbortOnDrop(tokio::spawn(e.clone().run())))
                .collect::<Vec<_>>()
        })));
    }
    // A DR engine runs while this replica owns any member of its topology:
    // not only one member's, which may be the very one lost
    // (docs/disaster-recovery.md, "Manager replicas").
    for e in &engines_dr {
        let rxs = e
            .topology
            .members
            .iter()
            .filter_map(|m| ha.ownership.subscribe(m))
            .collect();
        let e = e.clone();
        rollouts.push(AbortOnDrop(crate::ha::while_any_owned(rxs, move || {
            AbortOnDrop(tokio::spawn(e.clone().run()))
        })));
    }
    Ok(Manager {
        fleet,
        ha,
        rollouts,
        backups,
        dr: engines_dr,
        sim,
        memory: crate::platform::memory::spawn_releaser(crate::platform::memory::RELEASE_EVERY),
    })
}

impl Manager {
    /// The controllers running on this replica (the members it owns).
    pub fn controllers(&self) -> Vec<controller::Handle> {
        self.ha.ownership.controllers()
    }

    /// Per member: its owner as last observed and whether it is this replica.
    pub fn ownership(&self) -> Vec<crate::ha::MemberOwnership> {
        self.ha.ownership.snapshot()
    }

    /// Graceful stop: controllers and engines end, the Leases are given
    /// back so another replica takes over at once.
    pub async fn release(self) {
        let Manager {
            ha,
            rollouts,
            backups,
            sim,
            ..
        } = self;
        drop((rollouts, backups));
        ha.release().await;
        // Embedded members must outlive the release of their Leases.
        drop(sim);
    }

    /// One line: members ready, PostgresClusters healthy / total.
    pub fn summary(&self) -> String {
        let ready = self
            .fleet
            .members
            .iter()
            .filter(|m| m.state() == crate::fleet::ConnState::Ready)
            .count();
        let (mut healthy, mut total) = (0, 0);
        let mut parts = vec![];
        let controllers = self.controllers();
        for o in self.ownership() {
            let Some(member) = self.fleet.get(&o.member) else {
                continue;
            };
            let state = member.state().label();
            match controllers.iter().find(|h| h.member.name == o.member) {
                Some(h) => {
                    let (ok, n) = h.health();
                    healthy += ok;
                    total += n;
                    parts.push(format!("{} {state} {ok}/{n}", o.member));
                }
                // Reconciled by another replica (or by nobody yet).
                None => parts.push(format!(
                    "{} {state} owner {}",
                    o.member,
                    o.owner.as_deref().unwrap_or("none")
                )),
            }
        }
        format!(
            "clusters ready {ready}/{} · PostgresClusters healthy {healthy}/{total} · {}",
            self.fleet.members.len(),
            parts.join(" · ")
        )
    }
}

impl Manager {
    /// What the API serves for this manager: the fleet and the default
    /// hooks. Owners and controllers come from the Leases (an HA replica
    /// runs only the controllers of the members it owns). It lives here, not
    /// in `api`, because the manager starts the API: `api` knows only the
    /// hooks it is given.
    pub fn api_state(&self, settings: &Settings) -> crate::api::ApiState {
        let ownership = self.ha.ownership.clone();
        let identity = Some(ownership.identity().to_string());
        let (o1, o2) = (ownership.clone(), ownership);
        let hooks = crate::api::Hooks {
            metrics: Arc::new(crate::metrics::encode),
            owner: Arc::new(move |member| {
                o1.snapshot()
                    .into_iter()
                    .find(|m| m.member == member)
                    .and_then(|m| m.owner)
            }),
            controllers: Arc::new(move || o2.controllers()),
        };
        crate::api::ApiState::new(settings, self.fleet.clone(), identity, hooks)
    }
}

/// Entry point of `pgfleet run`; returns the exit code.
pub async fn run_cli(config: Option<&Path>) -> anyhow::Result<i32> {
    let settings = match crate::config::load(config) {
        Ok(s) => s,
        Err(errs) => {
            eprintln!("pgfleet: the configuration is invalid, nothing was started:\n{errs}");
            return Ok(2);
        }
    };
    let edge = match crate::api::preflight(&settings) {
        Ok(edge) => edge,
        Err(e) => {
            eprintln!("pgfleet: {e:#}; nothing was started");
            return Ok(2);
        }
    };
    let scheme = edge.scheme();
    let telemetry = crate::telemetry::init(&settings.telemetry)?;
    let mgr = start(&settings, true).await?;
    let api_state = mgr.api_state(&settings);
    let (addr, _api) =
        crate::api::spawn_with(settings.manager.listen_addr(), api_state, edge).await?;
    println!("pgfleet API and dashboard on {scheme}://{addr}/");
    if let Some(sim) = &mgr.sim {
        for c in &sim.clusters {
            println!(
                "embedded cluster {:<14} https://{}  kubectl --kubeconfig {}",
                c.name,
                c.addr,
                c.kubeconfig.display()
            );
        }
    }
    let mut last = String::new();
    let mut tick = tokio::time::interval(Duration::from_secs(2));
    loop {
        tokio::select! {
            _ = tick.tick() => {
                let line = mgr.summary();
                if line != last {
                    println!("{line}");
                    last = line;
                }
            }
            _ = stop_signal() => {
                println!("stopping; state stays in {}", settings.manager.state_dir.display());
                mgr.release().await;
                telemetry.shutdown().await;
                return Ok(0);
            }
        }
    }
}

/// Ctrl-C, or SIGTERM (what Kubernetes sends a pod it stops): both are a
/// graceful stop that hands this replica's members over at once.
async fn stop_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
            return;
        }
    }
    let _ = tokio::signal::ctrl_c().await;
}
