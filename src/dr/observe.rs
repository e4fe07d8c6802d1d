//! What one member of a topology shows this round: whether its API
//! answers, its copy of the state, its PostgresCluster's primary instance
//! and that instance's report, and its `<name>-dr` address. Every call is
//! bounded, so a member that hangs costs one timeout, not the round.

use super::decide::SideView;
use super::state;
use crate::crd::PostgresCluster;
use crate::fleet::Member;
use crate::postgres::InstanceReport;
use k8s_openapi::api::core::v1::{Pod, Service};
use kube::Api;
use kube::api::ListParams;
use std::time::Duration;

/// The bound on each API call or exec of a round.
pub const CALL_TIMEOUT: Duration = Duration::from_secs(4);

pub async fn side(member: &Member, topology: &str, ns: &str, name: &str) -> SideView {
    let mut v = SideView {
        member: member.name.clone(),
        ..SideView::default()
    };
    let copy = tokio::time::timeout(CALL_TIMEOUT, state::read(member, topology)).await;
    match copy {
        Ok(Ok(c)) => {
            v.reachable = true;
            v.copy = c;
        }
        Ok(Err(e)) => {
            tracing::debug!(member = %member.name, error = %e, "DR state unreadable");
            return v;
        }
        Err(_) => return v,
    }
    let client = member.client();
    let pgc = bounded(Api::<PostgresCluster>::namespaced(client.clone(), ns).get_opt(name)).await;
    v.primary_pod = pgc
        .flatten()
        .and_then(|p| p.status)
        .and_then(|s| s.current_primary);
    if let Some(pod) = &v.primary_pod {
        v.report = report(&client, ns, pod).await;
    }
    let svc = bounded(Api::<Service>::namespaced(client, ns).get_opt(&format!("{name}-dr"))).await;
    v.endpoint = svc.flatten().and_then(|s| endpoint(&s));
    v
}

/// The instances of cluster `name` on a member other than `primary`.
pub async fn other_instances(
    client: &kube::Client,
    ns: &str,
    name: &str,
    primary: &str,
) -> anyhow::Result<Vec<String>> {
    use crate::platform::labels::{LABEL_CLUSTER, LABEL_KIND};
    let lp = ListParams::default().labels(&format!("{LABEL_CLUSTER}={name},{LABEL_KIND}=instance"));
    let pods = tokio::time::timeout(
        CALL_TIMEOUT,
        Api::<Pod>::namespaced(client.clone(), ns).list(&lp),
    )
    .await
    .map_err(|_| anyhow::anyhow!("listing the instances of {ns}/{name} timed out"))??;
    Ok(pods
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .filter(|n| n != primary)
        .collect())
}

async fn bounded<T, E: std::fmt::Display>(
    f: impl std::future::Future<Output = Result<T, E>>,
) -> Option<T> {
    match tokio::time::timeout(CALL_TIMEOUT, f).await {
        Ok(Ok(t)) => Some(t),
        Ok(Err(e)) => {
            tracing::debug!(error = %e, "DR observation");
            None
        }
        Err(_) => None,
    }
}

/// The instance's status report through exec (None: no answer). `status
/// dr` is also the manager's heartbeat to a primary side's watchdog.
pub async fn report(client: &kube::Client, ns: &str, pod: &str) -> Option<InstanceReport> {
    let out = crate::postgres::exec::run_verb(client, ns, pod, &["status", "dr"], CALL_TIMEOUT)
        .await
        .ok()?;
    InstanceReport::parse(&out).ok()
}

/// A LoadBalancer's first ingress address with the PostgreSQL port.
fn endpoint(s: &Service) -> Option<String> {
    let ingress = s
        .status
        .as_ref()?
        .load_balancer
        .as_ref()?
        .ingress
        .as_ref()?;
    let first = ingress.first()?;
    let host = first.ip.clone().or_else(|| first.hostname.clone())?;
    let port = s
        .spec
        .as_ref()?
        .ports
        .as_ref()?
        .iter()
        .find(|p| p.name.as_deref() == Some("postgresql"))?
        .port;
    Some(format!("{host}:{port}"))
}
