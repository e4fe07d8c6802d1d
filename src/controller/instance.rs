//! Talking to one instance: its status report (through exec) and its role
//! label (the Services follow it). Shared by failover, switchover and the
//! rolling update, which all decide from reports and act through labels.

use super::Ctx;
use super::blocked::Blocked;
use super::build::LABEL_ROLE;
use super::error::api as api_failure;
use super::reconcile::Error;
use crate::crd::Role;
use crate::platform::small_map::SmallMap;
use crate::postgres::{InstanceReport, exec::run_verb};
use k8s_openapi::api::core::v1::Pod;
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

const EXEC_TIMEOUT: Duration = Duration::from_secs(5);

/// Sets a pod's role label (the Services follow); a gone pod is fine.
pub(super) async fn label(ctx: &Ctx, ns: &str, pod: &str, role: Role) -> Result<(), Error> {
    let patch = json!({"metadata": {"labels": {LABEL_ROLE: role}}});
    match Api::<Pod>::namespaced(ctx.client.clone(), ns)
        .patch(pod, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(source) => Err(Error::Primary(api_failure("relabel", "Pod", pod, source))),
    }
}

/// Instance pods whose script could not run (`blocked::CONTRACT_MISSING`),
/// by `ns/pod`: `report` answers None for them like for any silent
/// instance, and this is how the cluster's status still names them.
#[derive(Default)]
pub struct ContractFailures(Mutex<HashMap<String, Blocked>>);

impl ContractFailures {
    fn set(&self, ns: &str, pod: &str, b: Option<Blocked>) {
        let mut m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let key = format!("{ns}/{pod}");
        match b {
            Some(b) => m.insert(key, b),
            None => m.remove(&key),
        };
    }

    /// The failure of one of `pods` (the cluster's instance pods as this
    /// round sees them), forgetting pods that are gone.
    pub fn of<V>(&self, ns: &str, pods: &SmallMap<String, V>) -> Option<Blocked> {
        let m = self.0.lock().unwrap_or_else(|e| e.into_inner());
        pods.keys()
            .find_map(|p| m.get(&format!("{ns}/{p}")).cloned())
    }
}

/// Asks one instance for its status report (None when it does not answer).
pub async fn report(ctx: &Ctx, ns: &str, pod: &str) -> Option<InstanceReport> {
    let out = match run_verb(&ctx.client, ns, pod, &["status"], EXEC_TIMEOUT).await {
        Ok(o) => {
            ctx.contract.set(ns, pod, None);
            o
        }
        Err(e) => {
            let e = Error::Instance(e);
            tracing::debug!(%pod, error = %e, "instance status");
            ctx.contract.set(ns, pod, super::blocked::classify(&e));
            return None;
        }
    };
    let r = match InstanceReport::parse(&out) {
        Ok(r) => r,
        Err(e) => {
            tracing::debug!(%pod, error = %e, "instance status");
            return None;
        }
    };
    if r.contract != crate::postgres::CONTRACT_VERSION {
        // An instance speaking another contract is not trusted for decisions.
        tracing::warn!(%pod, contract = r.contract, "instance reports an unknown contract version");
        return None;
    }
    Some(r)
}
