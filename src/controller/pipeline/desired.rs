//! Step 4b, build (pure): from the spec, what was observed and the inputs,
//! the children this cluster should have — the [`Desired`] value the
//! applier works through. Nothing here talks to the API.

use super::inputs::Inputs;
use super::observe::Seen;
use crate::controller::build;
use crate::controller::config::{self, Config};
use crate::controller::plan::{self, InstancePlan};
use crate::controller::pooler;
use crate::controller::reconcile::Error;
use crate::crd::{PostgresCluster, Role};
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;

/// The children one round wants, in the terms the applier needs.
pub struct Desired {
    /// The instance that is (or becomes) primary.
    pub primary: Option<String>,
    pub config: Config,
    /// `-rw`, `-ro`, `-r`.
    pub services: Vec<Service>,
    pub pooler: pooler::Wanted,
    /// The replicas' and the primary's disruption budgets.
    pub pdbs: Vec<PodDisruptionBudget>,
    /// Instances to create (PVC and Pod) and Pods to recreate, in order.
    pub instances: Vec<NewInstance>,
    /// Pods whose role label is wrong: (pod, role). Exactly one pod carries
    /// the primary label; the Services follow labels.
    pub relabel: Vec<(String, Role)>,
    /// Replicas whose volume is gone: their Pod is deleted to rebuild them.
    pub rebuild: Vec<String>,
    /// Instances a scale-down removes (Pod and PVC).
    pub remove: Vec<String>,
    /// The pod template hash of the spec: the rolling update's target.
    pub template_hash: String,
    /// Conditions a step knows besides the derived ones: (type, reason,
    /// message), e.g. `BackupsUnavailable`, `MajorUpgradeBlocked`.
    pub notices: Vec<(&'static str, &'static str, String)>,
    /// The major upgrade's record as this round left it (Some(None):
    /// removed), so the status write does not put back the stale one.
    pub major_upgrade: Option<Option<crate::crd::major_upgrade::MajorUpgradeStatus>>,
    /// `status.storage` as the storage step left it.
    pub storage: Option<crate::crd::storage::StorageStatus>,
    /// `status.access` as the access step computed it (None: unchanged).
    pub access: Option<crate::crd::access::AccessStatus>,
}

/// An instance Pod to create, with its volume when the instance is new.
pub struct NewInstance {
    pub name: String,
    pub role: Role,
    /// None: the volume exists, only the Pod is missing.
    pub pvc: Option<PersistentVolumeClaim>,
    pub pod: Pod,
    /// The Event announcing it: reason and note.
    pub reason: &'static str,
    pub note: String,
}

pub fn build(pg: &PostgresCluster, seen: &Seen, inputs: &Inputs) -> Result<Desired, Error> {
    let owner = &seen.owner;
    let size = pg.spec.cluster_size.max(1) as u32;
    let current_primary = seen.prev.as_ref().and_then(|s| s.current_primary.clone());
    let plan = plan::plan_instances(&seen.name, size, current_primary.as_deref(), &seen.obs);
    let config = config::desired(
        pg,
        inputs.backup.as_deref(),
        owner,
        &plan,
        seen.is_drill,
        inputs.repo.as_ref(),
        seen.dr.as_ref(),
    )?;
    let names = |os: &[u32]| os.iter().map(|o| owner.instance_name(*o)).collect();
    Ok(Desired {
        primary: plan.primary.map(|o| owner.instance_name(o)),
        services: build::services(owner, seen.dr.is_some()),
        pooler: pooler::wanted(
            owner,
            pg,
            &crate::controller::dr::pooler_upstream(
                owner,
                &seen.dr,
                inputs.tls_unavailable.is_none(),
            ),
        ),
        pdbs: build::pdbs(owner, pg.spec.cluster_size),
        instances: instances(pg, seen, inputs, &plan, &config.hash)?,
        relabel: relabel(seen, &plan),
        rebuild: names(&plan.rebuild),
        remove: names(&plan.remove),
        template_hash: template_hash(pg, seen)?,
        notices: notices(inputs),
        major_upgrade: None,
        storage: None,
        access: None,
        config,
    })
}

/// What the inputs found missing in the image, as conditions.
fn notices(inputs: &Inputs) -> Vec<(&'static str, &'static str, String)> {
    let backups = inputs
        .backups_unavailable
        .clone()
        .map(|why| ("BackupsUnavailable", "NoPgBackRest", why));
    let tls = inputs
        .tls_unavailable
        .clone()
        .map(|why| ("TLSUnavailable", "ImageWithoutSSL", why));
    backups.into_iter().chain(tls).collect()
}

fn role_of(plan: &InstancePlan, o: u32) -> Role {
    if Some(o) == plan.primary {
        Role::Primary
    } else {
        Role::Replica
    }
}

/// New instances (a first one restoring from a backup when the spec says
/// so), then Pods whose volume exists but whose Pod is missing.
fn instances(
    pg: &PostgresCluster,
    seen: &Seen,
    inputs: &Inputs,
    plan: &InstancePlan,
    config_hash: &str,
) -> Result<Vec<NewInstance>, Error> {
    let owner = &seen.owner;
    let mut out = vec![];
    for (o, init) in &plan.create {
        let (init, env) = match (*init, &pg.spec.bootstrap) {
            ("initdb", Some(b)) if b.from_backup.is_some() => {
                // initdb means no volume exists, so authorize() ran.
                let env = inputs
                    .restore_env
                    .clone()
                    .ok_or_else(|| Error::Validate("restore source not authorized".into()))?;
                ("restore", env)
            }
            _ => (*init, inputs.repo_env.clone()),
        };
        let (name, role) = (owner.instance_name(*o), role_of(plan, *o));
        let pod = build::pod(owner, pg, *o, role, init, &env);
        out.push(NewInstance {
            note: format!("instance {name} ({role}, {init})"),
            name,
            role,
            pvc: Some(build::pvc(owner, pg, *o)),
            pod: finish(pod, seen, inputs, config_hash),
            reason: "CreatedInstance",
        });
    }
    for o in &plan.recreate_pods {
        let (name, role) = (owner.instance_name(*o), role_of(plan, *o));
        let pod = build::pod(owner, pg, *o, role, "clone", &inputs.repo_env);
        out.push(NewInstance {
            note: format!("Pod {name} was missing"),
            name,
            role,
            pvc: None,
            pod: finish(pod, seen, inputs, config_hash),
            reason: "RecreatedPod",
        });
    }
    Ok(out)
}

/// A blue/green upgrade's green instance (`major_upgrade::blue_green_exec`):
/// the new version, initdb, kind `green` (no Service selects it), with
/// what every new Pod gets.
pub fn green(
    g: &crate::controller::major_upgrade::execute::GreenInstance,
    seen: &Seen,
    inputs: &Inputs,
    config_hash: &str,
) -> NewInstance {
    let owner = &seen.owner;
    let env = match g.repository {
        true => inputs.repo_env.clone(),
        false => vec![],
    };
    let mut pod = build::pod(owner, &g.pg, g.ordinal, Role::Primary, "initdb", &env);
    if let Some(labels) = pod.metadata.labels.as_mut() {
        let kind = crate::controller::major_upgrade::blue_green_exec::GREEN;
        labels.insert(build::LABEL_KIND.into(), kind.into());
    }
    let name = owner.instance_name(g.ordinal);
    NewInstance {
        note: format!(
            "green instance {name} (primary, initdb, {})",
            g.pg.spec.version
        ),
        pvc: Some(build::pvc(owner, &g.pg, g.ordinal)),
        pod: finish(pod, seen, inputs, config_hash),
        name,
        role: Role::Primary,
        reason: "CreatedInstance",
    }
}

/// What every new Pod gets besides its spec: the configuration it starts
/// with, the repository volume, the pgBackRest TLS pair.
fn finish(mut pod: Pod, seen: &Seen, inputs: &Inputs, config_hash: &str) -> Pod {
    crate::platform::objects::annotate(&mut pod.metadata, build::ANN_CONFIG, config_hash);
    if let Some(b) = &inputs.backup {
        pod = b.mount(pod);
    }
    match inputs.backup_tls {
        true => crate::pgbackrest::tls::mount(pod, &seen.name),
        false => pod,
    }
}

/// Live instance Pods the plan keeps whose role label is not their role.
fn relabel(seen: &Seen, plan: &InstancePlan) -> Vec<(String, Role)> {
    seen.obs
        .pods
        .values()
        .filter(|p| !p.deleting)
        .filter_map(|p| {
            let o = plan::ordinal(&seen.name, &p.name)?;
            let role = role_of(plan, o);
            (plan.keep.contains(&o) && p.role != Some(role)).then(|| (p.name.clone(), role))
        })
        .collect()
}

/// The pod template hash of the spec (role, init mode and env do not
/// enter it). The builder always stamps it; its absence is a bug reported
/// as such, not a rolling update towards "".
fn template_hash(pg: &PostgresCluster, seen: &Seen) -> Result<String, Error> {
    build::child_hash(&build::pod(&seen.owner, pg, 1, Role::Replica, "clone", &[]))
}
