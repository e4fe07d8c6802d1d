//! Fault injection for chaos tests and demos: added latency, a rate of 429 or
//! 500 answers, dropping every open watch, and refusing connections (the
//! cluster looks unreachable). Settable from tests directly and over the sim's
//! admin endpoint.

use crate::network::NetworkFault;
use serde::{Deserialize, Serialize};
use std::sync::Mutex;
use tokio::sync::watch;

/// The fault settings; all off by default.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct FaultSpec {
    /// Added to every API request before it is served.
    pub latency_ms: u64,
    /// Fraction (0..=1) of requests answered with `error_code` instead.
    pub error_rate: f64,
    /// 429 (with Retry-After) or 500.
    pub error_code: u16,
    /// Close the listener and every open connection until cleared.
    pub refuse_connections: bool,
    /// Container images this cluster cannot pull (a registry mirror that
    /// lacks a new version): pods using one stay Pending in
    /// `ImagePullBackOff`. Honoured by the virtual runtime.
    pub failing_images: Vec<String>,
    /// Pods take this long from creation to Running and Ready (an image
    /// pull and a database start), so timings of rolling work look real.
    /// Honoured by the virtual runtime.
    pub pod_start_delay_ms: u64,
    /// `pods/exec` calls whose command line (argv joined by spaces)
    /// contains one of these exit 1 without running, saying so on stderr:
    /// one step of a multi-step operation failing (e.g. `--standby` for
    /// backups from a standby). Every runtime.
    pub failing_exec: Vec<String>,
    /// `pods/exec` calls whose command line contains one of these run, and
    /// then the session hangs (no exit status) for [`HANG`]: a PgBouncer
    /// PAUSE waiting on a long transaction, a wedged container. Every
    /// runtime.
    pub hanging_exec: Vec<String>,
    /// `pods/exec` calls whose command line contains one of these exit 127
    /// without running, as in an image that lacks that file (`sh: 0:
    /// cannot open <it>: No such file`): a wrong image. Every runtime.
    pub missing_exec: Vec<String>,
}

/// How long a `hanging_exec` session stays open after its command ran.
pub const HANG: std::time::Duration = std::time::Duration::from_secs(600);

/// Whether the API server's listeners are closed: both by
/// `refuse_connections` (the API server is down), the manager-facing one
/// also by a network cut from the manager (see [`crate::network`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Gate {
    pub refuse: bool,
    pub manager_cut: bool,
}

impl Gate {
    /// Whether the listener for the manager (`observer` false) or for
    /// observers is closed.
    pub fn closed(&self, observer: bool) -> bool {
        self.refuse || (!observer && self.manager_cut)
    }
}

pub struct Faults {
    spec: Mutex<FaultSpec>,
    network: Mutex<NetworkFault>,
    /// Bumped to drop every open watch; watches select on changes.
    drop_gen: watch::Sender<u64>,
    /// Carries `refuse_connections` and the manager cut to the accept loops.
    gate: watch::Sender<Gate>,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            spec: Mutex::new(FaultSpec::default()),
            network: Mutex::new(NetworkFault::default()),
            drop_gen: watch::channel(0).0,
            gate: watch::channel(Gate::default()).0,
        }
    }
}

impl Faults {
    pub fn get(&self) -> FaultSpec {
        self.spec.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn set(&self, spec: FaultSpec) {
        let refuse = spec.refuse_connections;
        *self.spec.lock().unwrap_or_else(|e| e.into_inner()) = spec;
        self.gate.send_modify(|g| g.refuse = refuse);
    }

    /// The cluster's network fault (see [`crate::network`]).
    pub fn network(&self) -> NetworkFault {
        self.network
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Sets the network fault; unchecked (names are checked by
    /// [`crate::Sim::set_network`], which tests and the admin API use).
    pub fn set_network(&self, fault: NetworkFault) {
        let cut = fault.manager;
        *self.network.lock().unwrap_or_else(|e| e.into_inner()) = fault;
        self.gate.send_modify(|g| g.manager_cut = cut);
        crate::network::changed();
    }

    pub fn clear(&self) {
        self.set(FaultSpec::default());
    }

    /// Ends every watch stream that is open now.
    pub fn drop_watches(&self) {
        self.drop_gen.send_modify(|g| *g += 1);
    }

    pub fn watch_drops(&self) -> watch::Receiver<u64> {
        self.drop_gen.subscribe()
    }

    pub fn gate(&self) -> watch::Receiver<Gate> {
        self.gate.subscribe()
    }

    /// The injected error for this request, if the dice say so.
    pub fn roll_error(&self) -> Option<u16> {
        let spec = self.get();
        if spec.error_rate > 0.0 && rand::random::<f64>() < spec.error_rate {
            Some(if spec.error_code == 0 {
                500
            } else {
                spec.error_code
            })
        } else {
            None
        }
    }
}
