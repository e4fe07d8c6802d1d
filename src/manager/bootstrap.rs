//! Installing what pgfleet needs in a member cluster: the CRDs (server-side
//! apply, retried until the cluster is reachable) and, for embedded clusters,
//! the sample PostgresClusters from `config/examples/`.

use crate::fleet::Member;
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{DynamicObject, Patch, PatchParams};
use kube::discovery::ApiResource;
use kube::{Api, Resource, ResourceExt};
use std::sync::Arc;
use std::time::Duration;

/// The samples, compiled in so `pgfleet run` works from any directory.
const EXAMPLES: &[(&str, &str)] = &[
    (
        "orders.yaml",
        include_str!("../../config/examples/orders.yaml"),
    ),
    (
        "inventory.yaml",
        include_str!("../../config/examples/inventory.yaml"),
    ),
    (
        "analytics.yaml",
        include_str!("../../config/examples/analytics.yaml"),
    ),
];

pub async fn install(member: Arc<Member>, examples: bool) {
    let mut wait = Duration::from_millis(200);
    loop {
        match install_once(&member, examples).await {
            Ok(()) => return,
            Err(e) => {
                tracing::warn!(cluster = %member.name, error = %format!("{e:#}"), "installing CRDs failed; retrying");
                tokio::time::sleep(wait).await;
                wait = (wait * 2).min(Duration::from_secs(30));
            }
        }
    }
}

/// A CRD with its content hash (of the CRD without it) in
/// [`crate::crd::HASH_ANNOTATION`].
fn stamped(mut crd: CustomResourceDefinition) -> CustomResourceDefinition {
    let hash = crate::platform::hash::content_hash_of(&crd);
    crd.metadata
        .annotations
        .get_or_insert_with(Default::default)
        .insert(crate::crd::HASH_ANNOTATION.to_string(), hash);
    crd
}

/// This build's CRDs, stamped, built once per process. Each member's
/// install used to build its own: the schemas are large `serde_json` trees
/// (about 700 KiB per member while built), so 300 members starting at once
/// peaked at 213 MB for them alone — half the start's heap peak, which
/// glibc then kept as resident memory (heaptrack of an idle 300-member
/// manager).
fn stamped_crds() -> &'static [CustomResourceDefinition] {
    static CRDS: std::sync::OnceLock<Vec<CustomResourceDefinition>> = std::sync::OnceLock::new();
    CRDS.get_or_init(|| crate::crd::all().into_iter().map(stamped).collect())
}

/// Applies each CRD unless the cluster already has this build's version of
/// it (its hash annotation, read with a metadata-only GET; a thousand
/// members each re-applying two large CRDs at start was a storm of their
/// API servers' most expensive writes, for nothing); the answer to the
/// apply — the whole CRD — is skipped, not parsed.
pub async fn install_crds(client: &kube::Client, pp: &PatchParams) -> anyhow::Result<()> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in stamped_crds() {
        let name = crd.name_any();
        let want = crd.annotations().get(crate::crd::HASH_ANNOTATION);
        let have = crds.get_metadata_opt(&name).await?;
        if have.is_some_and(|m| m.annotations().get(crate::crd::HASH_ANNOTATION) == want) {
            continue;
        }
        let req = kube::core::Request::new(CustomResourceDefinition::url_path(&(), None)).patch(
            &name,
            pp,
            &Patch::Apply(crd),
        )?;
        client.request::<serde::de::IgnoredAny>(req).await?;
    }
    Ok(())
}

async fn install_once(member: &Member, examples: bool) -> anyhow::Result<()> {
    let client = member.client();
    let pp = PatchParams::apply(crate::platform::labels::FIELD_MANAGER).force();
    install_crds(&client, &pp).await?;
    if !examples {
        return Ok(());
    }
    let ar = ApiResource::erase::<crate::crd::PostgresCluster>(&());
    for (file, text) in EXAMPLES {
        let obj: DynamicObject = serde_yaml::from_str(text)
            .map_err(|e| anyhow::anyhow!("config/examples/{file}: {e}"))?;
        let ns = obj.namespace().unwrap_or_else(|| "default".into());
        let nsobj =
            serde_json::json!({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}});
        Api::<Namespace>::all(client.clone())
            .patch(&ns, &pp, &Patch::Apply(&nsobj))
            .await?;
        // Applied once: a sample the user changed or deleted is left alone.
        let api: Api<DynamicObject> = Api::namespaced_with(client.clone(), &ns, &ar);
        if api.get_opt(&obj.name_any()).await?.is_none() {
            api.patch(
                &obj.name_any(),
                &PatchParams::apply("pgfleet-examples"),
                &Patch::Apply(&obj),
            )
            .await?;
        }
    }
    Ok(())
}
