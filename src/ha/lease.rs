//! Reading and writing one member's ownership Lease. Every write carries
//! the `resourceVersion` it was decided on (or is a create), so when two
//! replicas decide to take the same Lease at once the API server accepts
//! exactly one and answers the other with 409.

use super::decide::{Record, Step, transitions_after};
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Patch, PatchParams, PostParams};
use kube::{Api, Client, ResourceExt};
use std::time::Duration;

/// The namespace of the Lease in every member cluster.
pub const NAMESPACE: &str = "pgfleet-system";
/// The name of the ownership Lease.
pub const NAME: &str = "pgfleet-manager";

pub fn api(client: Client) -> Api<Lease> {
    Api::namespaced(client, NAMESPACE)
}

/// What the decision needs from a Lease.
pub fn record(lease: &Lease) -> Record {
    let spec = lease.spec.clone().unwrap_or_default();
    Record {
        holder: spec.holder_identity.filter(|h| !h.is_empty()),
        duration: Duration::from_secs(spec.lease_duration_seconds.unwrap_or(0).max(0) as u64),
        transitions: spec.lease_transitions.unwrap_or(0),
        version: lease.resource_version().unwrap_or_default(),
    }
}

pub async fn read(api: &Api<Lease>) -> kube::Result<Option<Lease>> {
    api.get_opt(NAME).await
}

fn now() -> MicroTime {
    MicroTime(Timestamp::now())
}

/// Writes us in as holder: a create when there is no Lease, otherwise a
/// replace of `prev` guarded by its resourceVersion.
pub async fn write(
    api: &Api<Lease>,
    prev: Option<&Lease>,
    step: &Step,
    me: &str,
    duration: Duration,
) -> kube::Result<Lease> {
    let record = prev.map(record);
    let mut spec = prev.and_then(|l| l.spec.clone()).unwrap_or_default();
    let now = now();
    if !matches!(step, Step::Renew) || spec.acquire_time.is_none() {
        spec.acquire_time = Some(now.clone());
    }
    spec.holder_identity = Some(me.to_string());
    spec.lease_duration_seconds = Some(duration.as_secs().clamp(1, i32::MAX as u64) as i32);
    spec.renew_time = Some(now);
    spec.lease_transitions = Some(transitions_after(record.as_ref(), step));
    match prev {
        Some(p) => {
            let mut next = p.clone();
            next.spec = Some(spec);
            next.metadata.managed_fields = None;
            api.replace(NAME, &PostParams::default(), &next).await
        }
        None => {
            let mut lease = Lease::default();
            lease.metadata.name = Some(NAME.into());
            lease.metadata.namespace = Some(NAMESPACE.into());
            lease.metadata.labels = Some(
                [(
                    "app.kubernetes.io/managed-by".to_string(),
                    "pgfleet".to_string(),
                )]
                .into(),
            );
            lease.spec = Some(spec);
            match api.create(&PostParams::default(), &lease).await {
                Err(kube::Error::Api(e)) if e.code == 404 => {
                    // A member set up by hand may lack the namespace.
                    ensure_namespace(api).await?;
                    api.create(&PostParams::default(), &lease).await
                }
                other => other,
            }
        }
    }
}

async fn ensure_namespace(leases: &Api<Lease>) -> kube::Result<()> {
    let ns: Api<Namespace> = Api::all(leases.clone().into_client());
    let obj = serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}});
    ns.patch(
        NAMESPACE,
        &PatchParams::apply("pgfleet"),
        &Patch::Apply(&obj),
    )
    .await
    .map(|_| ())
}

/// Gives the Lease up (graceful stop) so another replica takes it at once
/// instead of after a lease duration. Only if we still hold it: the write
/// is guarded by the resourceVersion we read.
pub async fn release(api: &Api<Lease>, me: &str) -> kube::Result<bool> {
    let Some(mut lease) = read(api).await? else {
        return Ok(false);
    };
    let Some(spec) = lease.spec.as_mut() else {
        return Ok(false);
    };
    if spec.holder_identity.as_deref() != Some(me) {
        return Ok(false);
    }
    *spec = LeaseSpec {
        holder_identity: None,
        lease_duration_seconds: Some(1),
        renew_time: Some(now()),
        acquire_time: None,
        lease_transitions: spec.lease_transitions,
        ..LeaseSpec::default()
    };
    lease.metadata.managed_fields = None;
    api.replace(NAME, &PostParams::default(), &lease).await?;
    Ok(true)
}
