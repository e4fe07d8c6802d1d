//! A pgfleet manager on a Tokio runtime of its own, so stopping it ends every
//! task it spawned — as killing the process would. For tests of resuming
//! after a crash.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;

/// One embedded member on the process runtime (no persistence, no admin
/// API) under `dir`, for a test that runs its own killable manager: the
/// member (dropping it stops it), its kubeconfig and a client.
pub async fn process_member(dir: &Path) -> (pgfleet::sim::Sim, PathBuf, kube::Client) {
    let mut opts = pgfleet::emulated::sim_options(dir.join("sim"), 1);
    opts.runtime = pgfleet::sim::RuntimeKind::Process;
    opts.persist = false;
    opts.admin = false;
    let sim = pgfleet::sim::start(&opts).await.unwrap();
    let kc = sim.clusters[0].kubeconfig.clone();
    let client = super::client_from(&kc).await;
    (sim, kc, client)
}

/// A manager on its own runtime, so stopping it kills every task it spawned
/// — as killing the process would.
pub struct ManagerProcess {
    stop: Option<std::sync::mpsc::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl ManagerProcess {
    /// A manager of one member cluster `name` reached through `kubeconfig`.
    pub fn start(kubeconfig: &Path, name: &str, dir: &Path) -> ManagerProcess {
        let toml = format!(
            // One identity for every restart: a restarted process is the
            // same replica and re-takes its Lease without waiting it out.
            "[manager]\nidentity = \"manager-process\"\nstate_dir = \"{}\"\nprobe_interval = \"500ms\"\nprobe_timeout = \"500ms\"\n[[clusters]]\nname = \"{name}\"\nkubeconfig = \"{}\"\n",
            dir.display(),
            kubeconfig.display()
        );
        let settings = pgfleet::config::load_str(&toml, "test").unwrap();
        let (tx, rx) = std::sync::mpsc::channel::<()>();
        let thread = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .enable_all()
                .build()
                .unwrap();
            rt.block_on(async {
                let _m = pgfleet::manager::start(&settings, false).await.unwrap();
                let _ = tokio::task::spawn_blocking(move || rx.recv()).await;
            });
            rt.shutdown_timeout(Duration::from_secs(1));
        });
        ManagerProcess {
            stop: Some(tx),
            thread: Some(thread),
        }
    }

    /// Stops every task of the manager, as killing the process would.
    pub fn kill(mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ManagerProcess {
    fn drop(&mut self) {
        self.stop.take();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}
