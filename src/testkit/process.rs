//! One embedded member cluster on the process runtime (real PostgreSQL and
//! PgBouncer per pod), the manager in-process, one namespace for the
//! PostgresClusters, and clients reaching the databases through the
//! Services' ClusterIPs like real applications. The environment of the
//! failover and backup tests and of `pgfleet bench failover|backup`.

use super::{Error, Result, fleet, wait};
use crate::crd::{PostgresCluster, PostgresClusterStatus};
use crate::manager::Manager;
use crate::sim::SimCluster;
use crate::sim::process::ProcessRuntime;
use k8s_openapi::api::core::v1::{Pod, Secret, Service};
use kube::api::{Api, DeleteParams, PostParams};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

/// How long the manager may take to install its CRDs in a fresh member.
const SERVED: Duration = Duration::from_secs(60);

/// What a process environment is made of.
pub struct ProcessOptions {
    /// The manager's state directory (the member persists into it).
    pub dir: PathBuf,
    /// The embedded member's name.
    pub member: String,
    /// The namespace of the PostgresClusters (created on start).
    pub namespace: String,
    /// More fleet TOML, e.g. a `[backups]` section.
    pub extra_toml: String,
}

pub struct ProcessEnv {
    pub mgr: Manager,
    /// The member's client (the manager's own).
    pub client: kube::Client,
    pub dir: PathBuf,
    pub ns: String,
    /// Last, so it runs after the manager has been dropped.
    _cleanup: super::dirs::RemoveOnDrop,
}

impl ProcessEnv {
    pub async fn start(opts: ProcessOptions) -> Result<ProcessEnv> {
        Self::start_on(opts, "").await
    }

    /// Like [`ProcessEnv::start`], with `embedded_extra` added to
    /// `[manager.embedded]` (e.g. `nodes = 3\nzones = 3\n` for the node
    /// faults); a separate entry so `ProcessOptions` keeps its fields.
    pub async fn start_on(opts: ProcessOptions, embedded_extra: &str) -> Result<ProcessEnv> {
        let mut toml = fleet::embedded_toml(&opts.dir, "process", &[&opts.member], "").replacen(
            "[manager.embedded]\n",
            &format!("[manager.embedded]\n{embedded_extra}"),
            1,
        );
        toml.push_str(&opts.extra_toml);
        let mgr = fleet::start_manager(&toml, SERVED).await?;
        let client = mgr
            .fleet
            .get(&opts.member)
            .ok_or_else(|| Error::Unexpected(format!("no member {} in the fleet", opts.member)))?
            .client();
        fleet::apply_namespace(&client, &opts.namespace).await?;
        Ok(ProcessEnv {
            mgr,
            client,
            _cleanup: super::dirs::RemoveOnDrop(opts.dir.clone()),
            dir: opts.dir,
            ns: opts.namespace,
        })
    }

    /// The embedded member (its pods' runtime, its kubeconfig).
    pub fn sim_cluster(&self) -> Result<&SimCluster> {
        self.mgr
            .sim
            .as_ref()
            .and_then(|s| s.clusters.first())
            .ok_or_else(|| Error::Unexpected("the manager has no embedded cluster".into()))
    }

    /// The process runtime running the member's pods.
    pub fn runtime(&self) -> Result<Arc<ProcessRuntime>> {
        ProcessRuntime::for_cluster(&self.sim_cluster()?.cluster)
            .ok_or_else(|| Error::Unexpected("the member is not on the process runtime".into()))
    }

    pub fn pgc(&self) -> Api<PostgresCluster> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    /// Creates PostgresCluster `name` with `spec` (JSON). The test kit's
    /// clients log in as the superuser (testkit::pg), so superuser access
    /// is on unless `spec` says otherwise (its default is off).
    pub async fn create(&self, name: &str, spec: serde_json::Value) -> Result<()> {
        let mut spec = spec;
        if let Some(m) = spec.as_object_mut() {
            m.entry("enableSuperuserAccess")
                .or_insert(serde_json::Value::Bool(true));
        }
        let obj = serde_json::json!({"apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": name, "namespace": self.ns}, "spec": spec});
        let pg: PostgresCluster = serde_json::from_value(obj)
            .map_err(|e| Error::Unexpected(format!("PostgresCluster {name}: {e}")))?;
        self.pgc()
            .create(&PostParams::default(), &pg)
            .await
            .map_err(Error::kube(format!("creating PostgresCluster {name}")))?;
        Ok(())
    }

    /// The status of PostgresCluster `name` (empty before the first one).
    pub async fn status(&self, name: &str) -> Result<PostgresClusterStatus> {
        let pg = self
            .pgc()
            .get(name)
            .await
            .map_err(Error::kube(format!("reading PostgresCluster {name}")))?;
        Ok(pg.status.unwrap_or_default())
    }

    /// Waits for phase Healthy with `size` ready instances and, when
    /// `settled`, no switchover in progress; returns the primary.
    pub async fn wait_healthy(
        &self,
        name: &str,
        size: i32,
        settled: bool,
        patience: Duration,
    ) -> Result<String> {
        let what = format!("{name} Healthy with {size} ready instances");
        wait::until(patience, &what, || async move {
            let st = self.status(name).await.map_err(|e| e.to_string())?;
            match &st.current_primary {
                Some(p)
                    if st.phase == Some(crate::crd::Phase::Healthy)
                        && st.ready_instances == size
                        && (!settled || st.switchover.is_none()) =>
                {
                    Ok(p.clone())
                }
                _ => Err(format!("{st:?}")),
            }
        })
        .await
    }

    /// The ClusterIP of Service `svc`.
    pub async fn service_ip(&self, svc: &str) -> Result<String> {
        let s = Api::<Service>::namespaced(self.client.clone(), &self.ns)
            .get(svc)
            .await
            .map_err(Error::kube(format!("reading Service {svc}")))?;
        s.spec
            .and_then(|s| s.cluster_ip)
            .ok_or_else(|| Error::Unexpected(format!("Service {svc} has no ClusterIP")))
    }

    /// The superuser password of PostgresCluster `cluster`.
    pub async fn password(&self, cluster: &str) -> Result<String> {
        let name = format!("{cluster}-superuser");
        let s = Api::<Secret>::namespaced(self.client.clone(), &self.ns)
            .get(&name)
            .await
            .map_err(Error::kube(format!("reading Secret {name}")))?;
        let raw = s
            .data
            .and_then(|d| d.get("password").cloned())
            .ok_or_else(|| Error::Unexpected(format!("Secret {name} has no password")))?;
        String::from_utf8(raw.0)
            .map_err(|_| Error::Unexpected(format!("the password in Secret {name} is not UTF-8")))
    }

    /// Deletes `pod` with grace period 0, as a node failure would.
    pub async fn force_delete_pod(&self, pod: &str) -> Result<()> {
        let dp = DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        };
        self.pods()
            .delete(pod, &dp)
            .await
            .map_err(Error::kube(format!("deleting pod {pod}")))?;
        Ok(())
    }
}
