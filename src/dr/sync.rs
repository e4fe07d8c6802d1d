//! What must be identical on every side of a topology, copied from the
//! primary side by pgfleet — never by hand (issue 15): the credentials
//! (the roles are the same physical roles, streamed), the cluster CA (each
//! side's server certificate is issued from it, so one side verifies the
//! other), and the PostgresCluster's spec. Secrets are copied before the
//! replica side's PostgresCluster exists, so its controller finds them and
//! generates none of its own.

use crate::crd::PostgresCluster;
use crate::fleet::Member;
use anyhow::Context;
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{Patch, PatchParams};
use serde_json::json;

const FIELD_MANAGER: &str = "pgfleet-dr";
pub const LABEL_TOPOLOGY: &str = "pgfleet.io/dr-topology";

/// The Secrets copied: `<name>-<suffix>`.
pub const SECRETS: &[&str] = &[
    "replication",
    "superuser",
    "ca",
    "ca-key",
    "app",
    "pooler-auth",
];

/// The Secrets without which no replica side is made.
const REQUIRED: &[&str] = &["replication", "ca", "ca-key"];

/// Copies the Secrets and the spec from `from` to `to` (both reachable).
pub async fn replicate(
    from: &Member,
    to: &Member,
    topology: &str,
    ns: &str,
    name: &str,
) -> anyhow::Result<()> {
    let Some(pg) = Api::<PostgresCluster>::namespaced(from.client(), ns)
        .get_opt(name)
        .await
        .with_context(|| format!("reading {ns}/{name} on {}", from.name))?
    else {
        return Ok(());
    };
    let pp = PatchParams::apply(FIELD_MANAGER).force();
    let nsobj = json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
    Api::<Namespace>::all(to.client())
        .patch(ns, &pp, &Patch::Apply(&nsobj))
        .await
        .with_context(|| format!("creating namespace {ns} on {}", to.name))?;
    let src: Api<Secret> = Api::namespaced(from.client(), ns);
    let dst: Api<Secret> = Api::namespaced(to.client(), ns);
    // Not before the primary side has made what the replica side must not
    // make on its own: its own CA would sign a certificate the other side
    // rejects, its own replication password would not log in.
    for needed in REQUIRED {
        let sname = format!("{name}-{needed}");
        if src.get_opt(&sname).await.ok().flatten().is_none() {
            tracing::debug!(topology, %sname, "DR copy waits for the primary side's Secret");
            return Ok(());
        }
    }
    for suffix in SECRETS {
        let sname = format!("{name}-{suffix}");
        let Some(s) = src
            .get_opt(&sname)
            .await
            .with_context(|| format!("reading Secret {ns}/{sname} on {}", from.name))?
        else {
            continue;
        };
        let there = dst.get_opt(&sname).await.ok().flatten();
        if there.is_some_and(|t| t.data == s.data) {
            continue;
        }
        let copy = json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": sname, "namespace": ns, "labels": {LABEL_TOPOLOGY: topology}},
            "type": s.type_,
            "data": s.data,
        });
        dst.patch(&sname, &pp, &Patch::Apply(&copy))
            .await
            .with_context(|| format!("copying Secret {ns}/{sname} to {}", to.name))?;
        tracing::info!(topology, %sname, from = %from.name, to = %to.name, "copied Secret");
    }
    let mut labels = pg.metadata.labels.clone().unwrap_or_default();
    labels.remove(crate::platform::labels::LABEL_SHARD);
    labels.insert(LABEL_TOPOLOGY.into(), topology.into());
    let copy = json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "metadata": {"name": name, "namespace": ns, "labels": labels},
        "spec": pg.spec,
    });
    Api::<PostgresCluster>::namespaced(to.client(), ns)
        .patch(name, &pp, &Patch::Apply(&copy))
        .await
        .with_context(|| format!("applying {ns}/{name} on {}", to.name))?;
    Ok(())
}
