//! One Pod on the process runtime: its volumes, its containers, the status
//! kubelet reports for it, and its termination (stop the containers, then
//! delete the object with grace 0).

use super::container::Container;
use super::dns;
use super::images::ImageRule;
use super::spec;
use super::volumes::{self, PodDirs, RunUser};
use crate::cluster::{Cluster, DeleteOpts, Sub, WriteOpts, now_rfc3339};
use crate::error::ApiError;
use crate::json_ptr::Ptr;
use crate::resources::ResKey;
use crate::store::str_at;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};
use std::time::Duration;
use tokio::sync::{Notify, watch};

pub fn pods_key() -> ResKey {
    ResKey {
        group: String::new(),
        plural: "pods".into(),
    }
}

pub struct PodRun {
    pub ns: String,
    pub name: String,
    pub uid: String,
    pub ip: String,
    pub dirs: PodDirs,
    pub user: RunUser,
    /// The image table (`SimOptions::images`).
    images: Arc<[ImageRule]>,
    /// The latest Pod object, with `status.podIP` set to `ip`.
    view: Mutex<Value>,
    containers: Mutex<Vec<Arc<Container>>>,
    /// `Some(grace)` once the Pod is being deleted.
    stop: watch::Sender<Option<Duration>>,
    changed: Arc<Notify>,
    /// Condition type → (status, lastTransitionTime).
    conditions: Mutex<HashMap<&'static str, (bool, String)>>,
    /// Why containers cannot be created yet.
    pending: Mutex<Option<(String, String)>>,
    start_time: String,
    /// Cut off from the control plane (partition fault): like a partitioned
    /// node, its Ready condition turns False while its processes run on.
    unreachable: std::sync::atomic::AtomicBool,
    /// Its node is gone (kubelet down): killed, and the object is left as
    /// it is, no status written and not deleted.
    lost: std::sync::atomic::AtomicBool,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl PodRun {
    pub fn new(
        pod: &Value,
        ip: String,
        dirs: PodDirs,
        user: RunUser,
        images: Arc<[ImageRule]>,
    ) -> Arc<Self> {
        let mut view = pod.clone();
        view["status"]["podIP"] = json!(ip);
        Arc::new(PodRun {
            ns: str_at(pod, "/metadata/namespace").to_string(),
            name: str_at(pod, "/metadata/name").to_string(),
            uid: str_at(pod, "/metadata/uid").to_string(),
            ip,
            dirs,
            user,
            images,
            view: Mutex::new(view),
            containers: Mutex::new(vec![]),
            stop: watch::channel(None).0,
            changed: Arc::new(Notify::new()),
            conditions: Mutex::new(HashMap::new()),
            pending: Mutex::new(Some(("ContainerCreating".into(), String::new()))),
            start_time: now_rfc3339(),
            unreachable: std::sync::atomic::AtomicBool::new(false),
            lost: std::sync::atomic::AtomicBool::new(false),
        })
    }

    pub fn id(&self) -> String {
        format!("{}/{}", self.ns, self.name)
    }

    pub fn view(&self) -> Value {
        lock(&self.view).clone()
    }

    pub fn containers(&self) -> Vec<Arc<Container>> {
        lock(&self.containers).clone()
    }

    /// The named container, or the first one when `name` is empty.
    pub fn container(&self, name: &str) -> Option<Arc<Container>> {
        let cs = self.containers();
        if name.is_empty() {
            return cs.first().cloned();
        }
        cs.into_iter().find(|c| c.spec.name == name)
    }

    /// Asks the containers to stop (SIGTERM, SIGKILL after `grace`).
    pub fn stop(&self, grace: Duration) {
        self.stop.send_if_modified(|cur| {
            let next = Some(cur.map_or(grace, |g| g.min(grace)));
            let changed = *cur != next;
            *cur = next;
            changed
        });
    }

    pub fn stopping(&self) -> bool {
        self.stop.borrow().is_some()
    }

    /// Takes a newer version of the Pod object: downward API files follow
    /// label and annotation changes.
    pub fn update(&self, c: &Cluster, pod: &Value) {
        let meta = |v: &Value| {
            (
                v.ptr("/metadata/labels").cloned(),
                v.ptr("/metadata/annotations").cloned(),
            )
        };
        let mut view = pod.clone();
        view["status"]["podIP"] = json!(self.ip);
        let changed = meta(&lock(&self.view)) != meta(&view);
        *lock(&self.view) = view.clone();
        if changed {
            volumes::refresh(c, &view, &self.dirs, &self.user);
        }
    }

    /// Re-reads ConfigMap/Secret-backed volumes.
    /// Marks the pod partitioned (or healed) and republishes its status.
    pub fn set_unreachable(&self, yes: bool) {
        self.unreachable
            .store(yes, std::sync::atomic::Ordering::Relaxed);
        self.changed.notify_one();
    }

    /// The node's kubelet died: every container is killed at once and the
    /// Pod object stays as the API last saw it (the node lifecycle
    /// controller, not this kubelet, decides what becomes of it).
    pub fn lose_node(&self) {
        self.lost.store(true, std::sync::atomic::Ordering::Relaxed);
        for ct in self.containers() {
            let _ = ct.signal_all("KILL");
        }
        self.stop(Duration::ZERO);
    }

    fn is_lost(&self) -> bool {
        self.lost.load(std::sync::atomic::Ordering::Relaxed)
    }

    pub fn refresh(&self, c: &Cluster) {
        volumes::refresh(c, &self.view(), &self.dirs, &self.user);
    }

    /// The lifecycle: create volumes (retrying while references are missing),
    /// run the containers, and once stopped delete the Pod object.
    pub async fn run(self: Arc<Self>, cluster: Weak<Cluster>) {
        let publisher = tokio::spawn(self.clone().publish_loop(cluster.clone()));
        self.changed.notify_one();
        let mut stop = self.stop.subscribe();
        let mut handles = vec![];
        while !self.stopping() {
            let Some(c) = cluster.upgrade() else { return };
            match self.create_containers(&c) {
                Ok(cs) => {
                    *lock(&self.pending) = None;
                    let grace = Duration::from_secs(
                        self.view()
                            .ptr("/spec/terminationGracePeriodSeconds")
                            .and_then(Value::as_u64)
                            .unwrap_or(30),
                    );
                    for ct in &cs {
                        handles.push(tokio::spawn(ct.clone().supervise(
                            self.dirs.clone(),
                            self.stop.subscribe(),
                            grace,
                        )));
                    }
                    *lock(&self.containers) = cs;
                    self.changed.notify_one();
                    break;
                }
                Err((reason, e)) => {
                    tracing::debug!(pod = %self.id(), error = %e, "pod not startable yet");
                    *lock(&self.pending) = Some((reason.into(), e));
                    self.changed.notify_one();
                }
            }
            drop(c);
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                _ = stop.changed() => break,
            }
        }
        for h in handles {
            let _ = h.await;
        }
        if !self.stopping() {
            // restartPolicy Never/OnFailure and every container is done: the
            // final status stays until the Pod is deleted.
            self.changed.notify_one();
            let _ = stop.changed().await;
        }
        publisher.abort();
        if let Some(c) = cluster.upgrade()
            && !self.is_lost()
        {
            self.delete_object(&c);
        }
        let _ = std::fs::remove_dir_all(&self.dirs.root);
    }

    fn create_containers(
        &self,
        c: &Cluster,
    ) -> Result<Vec<Arc<Container>>, (&'static str, String)> {
        let view = self.view();
        let hosts = dns::hosts_content(&view, &super::service_names(c));
        let vols = volumes::prepare(c, &view, &self.dirs, &self.user)
            .map_err(|e| ("ContainerCreating", format!("{e:#}")))?;
        dns::write_hosts(&self.dirs.hosts(), &hosts)
            .map_err(|e| ("ContainerCreating", format!("{e:#}")))?;
        let policy = str_at(&view, "/spec/restartPolicy").to_string();
        let mut out = vec![];
        for ct in view
            .ptr("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let s = spec::resolve(c, &view, ct, &vols, &self.user.home, &self.images)
                .map_err(|e| ("CreateContainerConfigError", format!("{e:#}")))?;
            out.push(Arc::new(Container::new(
                s,
                self.user.clone(),
                self.ip.clone(),
                &self.dirs,
                &policy,
                self.changed.clone(),
            )));
        }
        Ok(out)
    }

    /// Deletes the Pod object (this uid only) once its containers are gone.
    fn delete_object(&self, c: &Cluster) {
        let Some(rt) = c.type_of(&pods_key()) else {
            return;
        };
        let opts = DeleteOpts {
            grace_period: Some(0),
            precondition_uid: Some(self.uid.clone()),
            ..Default::default()
        };
        let _ = c.delete(&rt, &self.ns, &self.name, &opts);
    }

    async fn publish_loop(self: Arc<Self>, cluster: Weak<Cluster>) {
        loop {
            self.changed.notified().await;
            // Coalesce bursts (several containers changing at once).
            tokio::time::sleep(Duration::from_millis(10)).await;
            let Some(c) = cluster.upgrade() else { return };
            self.publish(&c);
        }
    }

    fn condition(&self, t: &'static str, ok: bool) -> Value {
        let mut g = lock(&self.conditions);
        let e = g.entry(t).or_insert_with(|| (ok, now_rfc3339()));
        if e.0 != ok {
            *e = (ok, now_rfc3339());
        }
        json!({"type": t, "status": if ok { "True" } else { "False" }, "lastProbeTime": null, "lastTransitionTime": e.1})
    }

    /// The status kubelet would report now.
    pub fn status(&self) -> Value {
        let cs = self.containers();
        let view = self.view();
        let statuses: Vec<Value> = if cs.is_empty() {
            let (reason, message) = lock(&self.pending).clone().unwrap_or_default();
            view.ptr("/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|ct| {
                    json!({"name": str_at(ct, "/name"), "image": str_at(ct, "/image"), "imageID": "",
                        "ready": false, "started": false, "restartCount": 0, "lastState": {},
                        "state": {"waiting": {"reason": reason, "message": message}}})
                })
                .collect()
        } else {
            cs.iter().map(|c| c.status_json()).collect()
        };
        let states: Vec<_> = cs.iter().map(|c| c.state()).collect();
        let all_ready = !states.is_empty() && states.iter().all(|s| s.ready);
        let ever_ran = states.iter().any(|s| {
            s.pid.is_some()
                || s.restart_count > 0
                || s.last_terminated.is_some()
                || s.terminated.is_some()
        });
        let all_done = !states.is_empty() && states.iter().all(|s| s.terminated.is_some());
        let phase = if all_done && !self.stopping() {
            let ok = states
                .iter()
                .all(|s| s.terminated.as_ref().and_then(|t| t["exitCode"].as_i64()) == Some(0));
            if ok { "Succeeded" } else { "Failed" }
        } else if ever_ran {
            "Running"
        } else {
            "Pending"
        };
        json!({
            "phase": phase,
            "conditions": [
                self.condition("PodScheduled", true),
                self.condition("Initialized", true),
                self.condition("ContainersReady", all_ready),
                self.condition("Ready", all_ready && !self.unreachable.load(std::sync::atomic::Ordering::Relaxed)),
            ],
            "hostIP": "127.0.0.1", "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": self.ip, "podIPs": [{"ip": self.ip}],
            "startTime": self.start_time,
            "qosClass": str_at(&view, "/status/qosClass"),
            "containerStatuses": statuses,
        })
    }

    /// Writes the status when it differs from the stored one.
    pub fn publish(&self, c: &Cluster) {
        let Some(rt) = c.type_of(&pods_key()) else {
            return;
        };
        if self.is_lost() {
            return;
        }
        let status = self.status();
        match c.store.get(&pods_key(), &self.ns, &self.name) {
            Some(cur) if cur.uid() == self.uid && cur.value().get("status") != Some(&status) => {}
            _ => return,
        }
        let opts = WriteOpts {
            field_manager: "kubelet".into(),
            ..Default::default()
        };
        let uid = self.uid.clone();
        let _ = c.write(
            &rt,
            &self.ns,
            &self.name,
            Sub::Status,
            &opts,
            false,
            |cur| {
                let mut v = cur.cloned().unwrap_or_default();
                if str_at(&v, "/metadata/uid") != uid {
                    return Err(ApiError::conflict("pods", &self.name));
                }
                v["status"] = status.clone();
                Ok(v)
            },
        );
    }
}
