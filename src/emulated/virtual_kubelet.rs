//! The virtual kubelet: pods are scheduled and Ready at once, PVCs bind at
//! once, and `pgfleet-instance` verbs run against an in-memory model of a
//! PostgreSQL instance (role, timeline, LSNs that advance). Everything but the
//! data can be exercised with thousands of pods on one machine.
//!
//! The model follows the real script: an empty data directory is initialised
//! (`PGFLEET_INIT=initdb` and wanted role primary) or cloned; a former primary
//! whose pod is labelled replica rejoins on the primary's timeline; the data
//! (role, timeline) lives with the PVC, so it outlives the pod.

use crate::postgres::{CONTRACT_VERSION, InstanceReport, format_lsn};
use bytes::Bytes;
use futures::future::BoxFuture;
use pgfleet_sim::cluster::{Cluster, Sub, WriteOpts};
use pgfleet_sim::hostexec::settle_pod;
use pgfleet_sim::resources::ResKey;
use pgfleet_sim::runtime::{ExecOutcome, ExecRequest, LogRequest, Runtime};
use pgfleet_sim::store::{EventType, str_at};
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Instant;
use tokio::sync::mpsc;

#[path = "virtual_verbs.rs"]
mod verbs;

/// A verb's reply as the JSON line the real script prints: always one of
/// the typed contract structs of `postgres::contract`.
fn reply<T: serde::Serialize>(r: T) -> Result<Value, String> {
    serde_json::to_value(r).map_err(|e| e.to_string())
}

/// One emulated PostgreSQL data directory.
#[derive(Debug, Clone)]
struct Instance {
    cluster: String,
    primary: bool,
    timeline: i64,
    /// Where this instance's WAL was when it last changed role.
    base_lsn: u64,
    since: Instant,
    fenced: bool,
    version: String,
    /// Created with `CREATE EXTENSION` (virtual_extensions); a clone
    /// carries the primary's.
    extensions: std::collections::BTreeSet<String>,
}

#[derive(Default)]
pub struct VirtualRuntime {
    /// Keyed by namespace/claim (or namespace/pod without a PVC).
    data: Mutex<HashMap<String, Instance>>,
    /// namespace/pod -> data key of the running pod.
    pods: Mutex<HashMap<String, String>>,
    /// Labels of the backups taken, by namespace/cluster (`backup-info`).
    backups: Mutex<HashMap<String, Vec<String>>>,
}

const BYTES_PER_MS: u64 = 64;

fn pods_key() -> ResKey {
    ResKey {
        group: String::new(),
        plural: "pods".into(),
    }
}

fn pvcs_key() -> ResKey {
    ResKey {
        group: String::new(),
        plural: "persistentvolumeclaims".into(),
    }
}

impl Instance {
    fn lsn(&self) -> u64 {
        if self.primary && !self.fenced {
            self.base_lsn + self.since.elapsed().as_millis() as u64 * BYTES_PER_MS
        } else {
            self.base_lsn
        }
    }
}

impl VirtualRuntime {
    fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
        m.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The data key of a pod: its PVC if it mounts one.
    fn data_key(pod: &Value) -> String {
        let ns = str_at(pod, "/metadata/namespace");
        let claim = pod
            .pointer("/spec/volumes")
            .and_then(Value::as_array)
            .and_then(|vs| {
                vs.iter()
                    .find_map(|v| v.pointer("/persistentVolumeClaim/claimName")?.as_str())
            });
        format!(
            "{ns}/{}",
            claim.unwrap_or_else(|| str_at(pod, "/metadata/name"))
        )
    }

    /// The running primary of a cluster: the one on the highest timeline
    /// (a lost primary that never learnt of its demotion stays on the old one).
    fn primary_of(
        data: &HashMap<String, Instance>,
        cluster: &str,
        except: &str,
    ) -> Option<Instance> {
        data.iter()
            .filter(|(k, i)| k.as_str() != except && i.cluster == cluster && i.primary && !i.fenced)
            .max_by_key(|(_, i)| i.timeline)
            .map(|(_, i)| i.clone())
    }

    /// Starts (or restarts) the instance model behind a pod.
    fn start_instance(&self, pod: &Value) {
        let key = Self::data_key(pod);
        let pod_id = format!(
            "{}/{}",
            str_at(pod, "/metadata/namespace"),
            str_at(pod, "/metadata/name")
        );
        let labels = pod
            .pointer("/metadata/labels")
            .cloned()
            .unwrap_or(json!({}));
        let cluster = format!(
            "{}/{}",
            str_at(pod, "/metadata/namespace"),
            labels
                .get("pgfleet.io/cluster")
                .and_then(Value::as_str)
                .unwrap_or_default()
        );
        let wants_primary =
            labels.get("pgfleet.io/role").and_then(Value::as_str) == Some("primary");
        let env_init = pod
            .pointer("/spec/containers/0/env")
            .and_then(Value::as_array)
            .and_then(|env| env.iter().find(|e| str_at(e, "/name") == "PGFLEET_INIT"))
            .map(|e| str_at(e, "/value").to_string())
            .unwrap_or_default();
        let version = str_at(pod, "/spec/containers/0/image")
            .rsplit(':')
            .next()
            .unwrap_or("15")
            .to_string();
        let mut data = Self::lock(&self.data);
        let primary = Self::primary_of(&data, &cluster, &key);
        let entry = data.entry(key.clone());
        let inst = entry.or_insert_with(|| {
            let is_primary = wants_primary && env_init == "initdb";
            Instance {
                cluster: cluster.clone(),
                primary: is_primary,
                timeline: primary.as_ref().map(|p| p.timeline).unwrap_or(1),
                base_lsn: primary.as_ref().map(|p| p.lsn()).unwrap_or(0x0300_0000),
                since: Instant::now(),
                fenced: false,
                version: version.clone(),
                extensions: primary
                    .as_ref()
                    .map(|p| p.extensions.clone())
                    .unwrap_or_default(),
            }
        });
        inst.version = version;
        if inst.primary && !wants_primary {
            // Rewind: rejoin as a replica on the current primary's timeline.
            inst.primary = false;
            inst.base_lsn = primary
                .as_ref()
                .map(|p| p.lsn())
                .unwrap_or_else(|| inst.lsn());
            if let Some(p) = &primary {
                inst.timeline = p.timeline;
            }
        }
        Self::lock(&self.pods).insert(pod_id, key);
    }

    /// The `status` reply, built from the contract type the manager parses.
    fn report(&self, pod_id: &str) -> Option<InstanceReport> {
        let key = Self::lock(&self.pods).get(pod_id).cloned()?;
        let data = Self::lock(&self.data);
        let inst = data.get(&key)?;
        let base = InstanceReport {
            contract: CONTRACT_VERSION,
            ..Default::default()
        };
        if inst.fenced {
            return Some(InstanceReport {
                role: "stopped".into(),
                fenced: true,
                ..base
            });
        }
        let running = InstanceReport {
            ready: true,
            version: Some(inst.version.clone()),
            ..base
        };
        Some(if inst.primary {
            InstanceReport {
                role: "primary".into(),
                timeline: Some(inst.timeline),
                current_lsn: Some(format_lsn(inst.lsn())),
                ..running
            }
        } else {
            // Streaming while there is a primary to stream from, or (as a
            // real standby following -rw does) a running standby: a
            // demoted primary that still carries the label cascades.
            let upstream = Self::primary_of(&data, &inst.cluster, &key).or_else(|| {
                let running = Self::lock(&self.pods);
                running
                    .values()
                    .filter(|k| **k != key)
                    .filter_map(|k| data.get(k))
                    .find(|i| i.cluster == inst.cluster && !i.fenced)
                    .cloned()
            });
            let wal_receiver = upstream.as_ref().map(|_| "streaming".to_string());
            let timeline = upstream
                .as_ref()
                .map(|p| p.timeline)
                .unwrap_or(inst.timeline);
            let at = upstream.map(|p| p.lsn()).unwrap_or(inst.base_lsn);
            let l = format_lsn(at.max(inst.base_lsn));
            InstanceReport {
                role: "replica".into(),
                timeline: Some(timeline),
                received_lsn: Some(l.clone()),
                replayed_lsn: Some(l),
                wal_receiver,
                ..running
            }
        })
    }

    fn bind_pvc(c: &Cluster, v: &Value) {
        if str_at(v, "/status/phase") == "Bound"
            || v.pointer("/metadata/deletionTimestamp").is_some()
        {
            return;
        }
        let Some(rt) = c.type_of(&pvcs_key()) else {
            return;
        };
        let ns = str_at(v, "/metadata/namespace").to_string();
        let name = str_at(v, "/metadata/name").to_string();
        let size = v
            .pointer("/spec/resources/requests/storage")
            .cloned()
            .unwrap_or(json!("1Gi"));
        let opts = WriteOpts {
            field_manager: "virtual-kubelet".into(),
            ..Default::default()
        };
        let _ = c.write(&rt, &ns, &name, Sub::Status, &opts, false, |cur| {
            let mut v = cur.cloned().unwrap_or_default();
            v["status"] = json!({"phase": "Bound", "accessModes": ["ReadWriteOnce"], "capacity": {"storage": size}});
            Ok(v)
        });
    }

    fn on_event(self: &Arc<Self>, c: &Arc<Cluster>, key: &ResKey, kind: EventType, v: &Value) {
        if *key == pvcs_key() {
            if kind == EventType::Deleted {
                let id = format!(
                    "{}/{}",
                    str_at(v, "/metadata/namespace"),
                    str_at(v, "/metadata/name")
                );
                Self::lock(&self.data).remove(&id);
            } else {
                Self::bind_pvc(c, v);
                if v.pointer("/metadata/deletionTimestamp").is_none() {
                    let (ns, claim) = (
                        str_at(v, "/metadata/namespace"),
                        str_at(v, "/metadata/name"),
                    );
                    for p in pgfleet_sim::volume_wait::waiting_on(c, ns, claim) {
                        self.on_event(c, &pods_key(), EventType::Modified, &p);
                    }
                }
            }
            return;
        }
        if *key != pods_key() {
            return;
        }
        let pod_id = format!(
            "{}/{}",
            str_at(v, "/metadata/namespace"),
            str_at(v, "/metadata/name")
        );
        if kind == EventType::Deleted {
            Self::lock(&self.pods).remove(&pod_id);
            return;
        }
        // The scheduler binds first; a node whose kubelet is down runs nothing.
        let node = str_at(v, "/spec/nodeName");
        if node.is_empty() || c.nodes.is_down(node) {
            return;
        }
        let image = str_at(v, "/spec/containers/0/image");
        if v.pointer("/metadata/deletionTimestamp").is_none()
            && c.faults.get().failing_images.iter().any(|i| i == image)
        {
            pgfleet_sim::hostexec::hold_image_pull(c, v);
            return;
        }
        let starting = str_at(v, "/status/phase") != "Running"
            && v.pointer("/metadata/deletionTimestamp").is_none();
        if starting && let Some(wait) = Self::start_wait(c, v) {
            // Look again when the start delay is over (fresh copy then).
            let (this, c) = (self.clone(), c.clone());
            let (ns, name) = (
                str_at(v, "/metadata/namespace").to_string(),
                str_at(v, "/metadata/name").to_string(),
            );
            tokio::spawn(async move {
                tokio::time::sleep(wait).await;
                let Some(rt) = c.type_of(&pods_key()) else {
                    return;
                };
                if let Some(obj) = c.store.get(&rt.key(), &ns, &name) {
                    this.on_event(&c, &pods_key(), EventType::Modified, &obj.value());
                }
            });
            return;
        }
        if starting && pgfleet_sim::volume_wait::blocked(c, v).is_some() {
            // Held Pending by `settle_pod` until the claim is usable.
            settle_pod(c, v, "virtual-node");
            return;
        }
        if starting {
            self.start_instance(v);
        }
        settle_pod(c, v, "virtual-node");
    }
}

impl VirtualRuntime {
    /// How much longer a new pod waits before it runs (the
    /// `pod_start_delay_ms` fault), if at all.
    fn start_wait(c: &Cluster, v: &Value) -> Option<std::time::Duration> {
        let delay = std::time::Duration::from_millis(c.faults.get().pod_start_delay_ms);
        if delay.is_zero() {
            return None;
        }
        let created =
            chrono::DateTime::parse_from_rfc3339(str_at(v, "/metadata/creationTimestamp")).ok()?;
        let age = (chrono::Utc::now() - created.with_timezone(&chrono::Utc))
            .to_std()
            .unwrap_or_default();
        delay.checked_sub(age).filter(|d| !d.is_zero())
    }
}

impl Runtime for VirtualRuntime {
    /// A node's kubelet stopped: its instances stop (their WAL stops
    /// advancing); when it comes back, its pods are looked at again.
    fn node_changed(&self, c: &Arc<Cluster>, node: &str) {
        let pods = pgfleet_sim::nodes::pods_on(c, node);
        if c.nodes.is_down(node) {
            let mut running = Self::lock(&self.pods);
            for p in &pods {
                running.remove(&format!(
                    "{}/{}",
                    str_at(p, "/metadata/namespace"),
                    str_at(p, "/metadata/name")
                ));
            }
            return;
        }
        for p in pods {
            if p.pointer("/metadata/deletionTimestamp").is_none() {
                self.start_instance(&p);
            }
            settle_pod(c, &p, node);
        }
    }

    fn start(self: Arc<Self>, cluster: Arc<Cluster>) {
        let weak = Arc::downgrade(&cluster);
        let (_, mut rx) = cluster.store.subscribe();
        let mut existing = vec![];
        for k in [pvcs_key(), pods_key()] {
            let (items, _) = cluster.store.list(&k, None, None);
            existing.extend(items.into_iter().map(|o| (k.clone(), o)));
        }
        drop(cluster);
        tokio::spawn(async move {
            if let Some(c) = weak.upgrade() {
                for (k, o) in existing {
                    if k == pods_key() {
                        // Pods that ran before a restart run again.
                        self.start_instance(&o.value());
                    }
                    self.on_event(&c, &k, EventType::Added, &o.value());
                }
            }
            loop {
                match rx.recv().await {
                    Ok(ev) => {
                        let Some(c) = weak.upgrade() else { return };
                        // Only the kinds it acts on are parsed.
                        if ev.key == pods_key() || ev.key == pvcs_key() {
                            self.on_event(&c, &ev.key, ev.kind, &ev.obj.value());
                        }
                    }
                    Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                        // Catch up from the current state: pods deleted
                        // while it lagged stop; a pod deleted and created
                        // again under the same name is Pending, so it starts.
                        let Some(c) = weak.upgrade() else { return };
                        let (live, _) = c.store.list(&pods_key(), None, None);
                        let live: std::collections::HashSet<String> = live
                            .iter()
                            .map(|p| format!("{}/{}", p.namespace(), p.name()))
                            .collect();
                        Self::lock(&self.pods).retain(|id, _| live.contains(id));
                        for k in [pvcs_key(), pods_key()] {
                            let (items, _) = c.store.list(&k, None, None);
                            for o in items {
                                self.on_event(&c, &k, EventType::Modified, &o.value());
                            }
                        }
                    }
                    Err(_) => return,
                }
            }
        });
    }

    fn exec(&self, req: ExecRequest) -> BoxFuture<'static, ExecOutcome> {
        let pod_id = format!("{}/{}", req.namespace, req.pod);
        let is_instance = req.command.iter().any(|a| a.ends_with("pgfleet-instance"));
        // The verb follows the script path (`sh …/pgfleet-instance slots a b`).
        let at = req
            .command
            .iter()
            .position(|a| a.ends_with("pgfleet-instance"));
        let verb = at
            .and_then(|i| req.command.get(i + 1))
            .cloned()
            .unwrap_or_default();
        let args = at
            .and_then(|i| req.command.get(i + 2..))
            .unwrap_or_default();
        let result = if is_instance {
            self.verb(&pod_id, &verb, args)
        } else {
            Err(format!(
                "the virtual runtime only runs pgfleet-instance verbs, not {:?}",
                req.command
            ))
        };
        // A backup takes a while, so that caps are observable.
        let delay = if verb == "backup" {
            std::time::Duration::from_millis(300)
        } else {
            std::time::Duration::ZERO
        };
        Box::pin(async move {
            tokio::time::sleep(delay).await;
            match result {
                Ok(v) => {
                    let _ = req.stdout.send(Bytes::from(format!("{v}\n"))).await;
                    ExecOutcome::Exited(0)
                }
                Err(e) => {
                    let _ = req
                        .stderr
                        .send(Bytes::from(format!("pgfleet-instance: {e}\n")))
                        .await;
                    ExecOutcome::Exited(if is_instance { 1 } else { 127 })
                }
            }
        })
    }

    fn logs(&self, req: LogRequest) -> BoxFuture<'static, Result<mpsc::Receiver<Bytes>, String>> {
        Box::pin(async move {
            let (tx, rx) = mpsc::channel(2);
            let _ = tx
                .send(Bytes::from(format!(
                    "virtual instance {}/{} ({}) running\n",
                    req.namespace, req.pod, req.container
                )))
                .await;
            Ok(rx)
        })
    }
}
