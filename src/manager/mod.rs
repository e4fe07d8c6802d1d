//! The `pgfleet run` service: loads the fleet config, starts the embedded
//! clusters it names, connects to every member cluster, installs the CRDs,
//! and runs one controller per member, keeping a compact fleet summary on the
//! terminal.

pub mod bootstrap;

use crate::config::{EmbeddedRuntime, Settings};
use crate::controller;
use crate::fleet::Fleet;
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// A running manager (the embedded clusters stay alive while it lives).
pub struct Manager {
    pub fleet: Arc<Fleet>,
    pub controllers: Vec<controller::Handle>,
    /// One engine per `[rollouts.<name>]`; aborted with the manager.
    pub rollouts: Vec<AbortOnDrop>,
    /// The fleet's backup dispatcher (schedules, caps, archiving checks).
    pub backups: AbortOnDrop,
    pub sim: Option<crate::sim::Sim>,
}

/// A background task that ends when its owner is dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
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
        let mut opts = crate::sim::SimOptions::new(settings.manager.state_dir.join("embedded"), 0);
        opts.names = embedded;
        opts.runtime = match settings.manager.embedded.runtime.get() {
            EmbeddedRuntime::Virtual => crate::sim::RuntimeKind::Virtual,
            EmbeddedRuntime::Process => crate::sim::RuntimeKind::Process,
        };
        Some(crate::sim::start(&opts).await?)
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
    let backup_env = Arc::new(crate::backup::repo::BackupEnv::from_settings(settings));
    let mut controllers = vec![];
    for member in &fleet.members {
        let is_embedded = kubeconfigs.contains_key(&member.name);
        tokio::spawn(bootstrap::install(
            member.clone(),
            apply_examples && is_embedded,
        ));
        controllers.push(controller::start(
            member.clone(),
            m.shards_per_cluster,
            m.workers_per_cluster,
            // The default repository is a directory on this machine: only
            // the embedded runtimes' instances can reach it. Real clusters
            // archive and back up only to a configured repository.
            (settings.backups.repository.is_some() || is_embedded).then(|| backup_env.clone()),
        ));
    }
    let mut dispatcher = crate::backup::dispatch::Dispatcher::new(
        &settings.backups,
        backup_env.clone(),
        fleet.clone(),
        Arc::new(crate::clock::SystemClock),
    );
    if settings.backups.repository.is_none() {
        dispatcher.members = Some(kubeconfigs.keys().cloned().collect());
    }
    let dispatcher = Arc::new(dispatcher);
    let backups = AbortOnDrop(tokio::spawn(dispatcher.clone().run()));
    let mut rollouts = vec![];
    for name in settings.rollouts.keys() {
        let engine = crate::rollout::engine::Engine::new(
            name,
            settings,
            fleet.clone(),
            Arc::new(crate::rollout::engine::SystemClock),
        )?;
        rollouts.push(AbortOnDrop(tokio::spawn(Arc::new(engine).run())));
    }
    Ok(Manager {
        fleet,
        controllers,
        rollouts,
        backups,
        sim,
    })
}

impl Manager {
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
        for h in &self.controllers {
            let (ok, n) = h.health();
            healthy += ok;
            total += n;
            parts.push(format!(
                "{} {} {ok}/{n}",
                h.member.name,
                h.member.state().label()
            ));
        }
        format!(
            "clusters ready {ready}/{} · PostgresClusters healthy {healthy}/{total} · {}",
            self.fleet.members.len(),
            parts.join(" · ")
        )
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
    let mgr = start(&settings, true).await?;
    let api_state = crate::api::ApiState::of(&settings, &mgr);
    let (addr, _api) = crate::api::spawn(settings.manager.listen_addr(), api_state).await?;
    println!("pgfleet API and dashboard on http://{addr}/");
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
            _ = tokio::signal::ctrl_c() => {
                println!("stopping; state stays in {}", settings.manager.state_dir.display());
                return Ok(0);
            }
        }
    }
}
