//! The instance Pod (typed). Its spec is a real one: it runs on a real
//! cluster with the stock `postgres:<version>` image, because its command is
//! the `pgfleet-instance run` verb from the ConfigMap, not the image's
//! entrypoint. The pod template hash stamped on it must stay byte-identical
//! for the same spec across pgfleet releases (`golden_tests`): a moved hash
//! restarts every instance of the fleet.

use super::build::{ANN_HASH, ANN_VERSION, LABEL_INSTANCE, LABEL_KIND, LABEL_ROLE, Owner, image};
use crate::crd::{PostgresCluster, Role};
use crate::platform::hash::content_hash;
use crate::platform::objects::{container_port, env_field, env_value, mount};
use k8s_openapi::api::core::v1::{
    Capabilities, ConfigMapVolumeSource, Container, DownwardAPIVolumeFile, DownwardAPIVolumeSource,
    EmptyDirVolumeSource, EnvVar, ExecAction, KeyToPath, ObjectFieldSelector,
    PersistentVolumeClaimVolumeSource, Pod, PodSecurityContext, PodSpec, Probe,
    ProjectedVolumeSource, ResourceRequirements, SeccompProfile, SecretProjection,
    SecretVolumeSource, SecurityContext, Volume, VolumeProjection,
};
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use serde_json::json;
use std::collections::BTreeMap;

const DATA_MOUNT: &str = "/var/lib/postgresql/data";
/// PGDATA inside every instance pod.
pub const PGDATA: &str = "/var/lib/postgresql/data/pgdata";
const CONFIG_MOUNT: &str = "/etc/pgfleet/config";

/// The Pod-level security context of every Pod pgfleet creates: uid/gid
/// 999 (the `postgres` user of deploy/images/postgres and the user of
/// deploy/images/pgbouncer), never root, the runtime's default seccomp
/// profile. Together with [`container_security_context`] this passes Pod
/// Security "restricted", so a platform team can enforce that level on
/// tenant namespaces. `fs_group` gives mounted volumes (the data PVC) to
/// that group.
pub fn pod_security_context(fs_group: bool) -> PodSecurityContext {
    PodSecurityContext {
        run_as_user: Some(999),
        run_as_group: Some(999),
        run_as_non_root: Some(true),
        seccomp_profile: Some(SeccompProfile {
            type_: "RuntimeDefault".into(),
            ..SeccompProfile::default()
        }),
        fs_group: fs_group.then_some(999),
        ..PodSecurityContext::default()
    }
}

/// The container-level half of Pod Security "restricted": no privilege
/// escalation (setuid binaries) and no Linux capabilities at all; PostgreSQL
/// and PgBouncer need none (they listen on ports above 1024).
pub fn container_security_context() -> SecurityContext {
    SecurityContext {
        allow_privilege_escalation: Some(false),
        capabilities: Some(Capabilities {
            drop: Some(vec!["ALL".into()]),
            ..Capabilities::default()
        }),
        ..SecurityContext::default()
    }
}

/// The instance Pod. `role` goes into a label the instance reads through the
/// downward API, so it knows whether it may run as primary.
/// `extra_env` carries what only the caller knows: repository credentials
/// (by Secret reference) and where to restore from.
pub fn pod(
    o: &Owner,
    pg: &PostgresCluster,
    ordinal: u32,
    role: Role,
    init: &str,
    extra_env: &[EnvVar],
) -> Pod {
    let name = o.instance_name(ordinal);
    let mut env = instance_env(o, init);
    env.extend(extra_env.iter().cloned());
    let container = container(pg, env);
    let h = template_hash(&container, pg);
    let mut metadata = o.meta(
        &name,
        &[
            (LABEL_INSTANCE, &name),
            (LABEL_KIND, "instance"),
            (LABEL_ROLE, role.as_str()),
        ],
        true,
    );
    metadata.annotations = Some(BTreeMap::from([
        (ANN_HASH.to_string(), h),
        (ANN_VERSION.to_string(), pg.spec.version.clone()),
    ]));
    let mut spec = PodSpec {
        hostname: Some(name.clone()),
        security_context: Some(pod_security_context(true)),
        automount_service_account_token: Some(false),
        termination_grace_period_seconds: Some(30),
        enable_service_links: Some(false),
        containers: vec![container],
        volumes: Some(volumes(
            o,
            &name,
            super::access::superuser_secret_needed(pg),
        )),
        ..PodSpec::default()
    };
    super::placement::instance(&mut spec, o, pg);
    Pod {
        metadata,
        spec: Some(spec),
        ..Pod::default()
    }
}

fn instance_env(o: &Owner, init: &str) -> Vec<EnvVar> {
    vec![
        env_value("PGDATA", PGDATA),
        env_field("POD_NAME", "metadata.name"),
        env_field("POD_NAMESPACE", "metadata.namespace"),
        env_field("POD_IP", "status.podIP"),
        env_value("PGFLEET_CLUSTER", &o.name),
        env_value("PGFLEET_INIT", init),
        env_value("PGFLEET_PRIMARY_HOST", &format!("{}-rw", o.name)),
        env_value("PGFLEET_PODINFO", "/etc/pgfleet/podinfo"),
        env_value("PGFLEET_CONFIG", CONFIG_MOUNT),
        env_value("PGFLEET_SECRETS", "/etc/pgfleet/secrets"),
        env_value("PGFLEET_SERVER_TLS", super::tls::MOUNT),
    ]
}

fn container(pg: &PostgresCluster, env: Vec<EnvVar>) -> Container {
    let script = format!("{CONFIG_MOUNT}/pgfleet-instance");
    // Not ready while a restore's temporary server runs (it stops again);
    // a server starting is waited for a little (`ready` in instance.sh).
    let ready = format!("exec /bin/sh {script} ready");
    // A restore or clone copies data for as long as it takes, with no server
    // up: the instance is alive while it says it is initializing. So is one
    // kept stopped by a fence, or rewinding (which waits up to 120 s for its
    // source): a restart would not help either, and would lose its log.
    let alive = "pg_isready -q -h /tmp -p 5432 || test -e /tmp/pgfleet.initializing \
                 || test -e /tmp/pgfleet.fenced || test -e /tmp/pgfleet.rewinding";
    Container {
        name: "postgres".into(),
        image: Some(image(pg)),
        security_context: Some(container_security_context()),
        command: Some(vec!["/bin/sh".into(), script, "run".into()]),
        env: Some(env),
        ports: Some(vec![container_port("postgresql", 5432)]),
        readiness_probe: Some(probe(&ready, 2, 3)),
        liveness_probe: Some(probe(alive, 10, 6)),
        resources: Some(resources(pg)),
        volume_mounts: Some(vec![
            mount("pgdata", DATA_MOUNT, false),
            mount("config", CONFIG_MOUNT, false),
            mount("podinfo", "/etc/pgfleet/podinfo", false),
            mount("secrets", "/etc/pgfleet/secrets", false),
            mount("server-tls", super::tls::MOUNT, true),
            mount("tmp", "/tmp", false),
        ]),
        ..Container::default()
    }
}

/// `superuser`: whether the cluster has a `<name>-superuser` Secret; without
/// one the projection is optional and initdb gives `postgres` no password.
fn volumes(o: &Owner, name: &str, superuser: bool) -> Vec<Volume> {
    let volume = |name: &str| Volume {
        name: name.into(),
        ..Volume::default()
    };
    let password = |secret: &str, path: &str| VolumeProjection {
        secret: Some(SecretProjection {
            name: o.secret_name(secret),
            items: Some(vec![KeyToPath {
                key: "password".into(),
                path: path.into(),
                ..KeyToPath::default()
            }]),
            ..SecretProjection::default()
        }),
        ..VolumeProjection::default()
    };
    vec![
        Volume {
            persistent_volume_claim: Some(PersistentVolumeClaimVolumeSource {
                claim_name: name.into(),
                ..PersistentVolumeClaimVolumeSource::default()
            }),
            ..volume("pgdata")
        },
        Volume {
            config_map: Some(ConfigMapVolumeSource {
                name: o.config_name(),
                default_mode: Some(0o755),
                ..ConfigMapVolumeSource::default()
            }),
            ..volume("config")
        },
        Volume {
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..volume("tmp")
        },
        Volume {
            downward_api: Some(DownwardAPIVolumeSource {
                items: Some(vec![DownwardAPIVolumeFile {
                    path: "labels".into(),
                    field_ref: Some(ObjectFieldSelector {
                        field_path: "metadata.labels".into(),
                        ..ObjectFieldSelector::default()
                    }),
                    ..DownwardAPIVolumeFile::default()
                }]),
                ..DownwardAPIVolumeSource::default()
            }),
            ..volume("podinfo")
        },
        Volume {
            projected: Some(ProjectedVolumeSource {
                sources: Some(vec![
                    optional(password("superuser", "superuser-password"), !superuser),
                    password("replication", "replication-password"),
                ]),
                ..ProjectedVolumeSource::default()
            }),
            ..volume("secrets")
        },
        // Group-readable (fsGroup 999); the instance copies the key to a
        // 0600 file of its own, as PostgreSQL wants.
        Volume {
            secret: Some(SecretVolumeSource {
                secret_name: Some(super::tls::server_secret(&o.name)),
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..volume("server-tls")
        },
    ]
}

/// A Secret projection that may be missing (left as it was otherwise, so
/// the pods of clusters that have the Secret do not change).
fn optional(mut v: VolumeProjection, optional: bool) -> VolumeProjection {
    if optional && let Some(s) = v.secret.as_mut() {
        s.optional = Some(true);
    }
    v
}

/// An exec probe through the shell.
fn probe(cmd: &str, period: i32, failures: i32) -> Probe {
    Probe {
        exec: Some(ExecAction {
            command: Some(vec!["/bin/sh".into(), "-c".into(), cmd.into()]),
        }),
        period_seconds: Some(period),
        failure_threshold: Some(failures),
        timeout_seconds: Some(5),
        ..Probe::default()
    }
}

/// Requests and limits alike, from `spec.resources` (`{}` without it).
fn resources(pg: &PostgresCluster) -> ResourceRequirements {
    let Some(r) = &pg.spec.resources else {
        return ResourceRequirements::default();
    };
    let mut req = BTreeMap::new();
    if let Some(c) = &r.cpu {
        req.insert("cpu".to_string(), Quantity(c.clone()));
    }
    if let Some(m) = &r.memory {
        req.insert("memory".to_string(), Quantity(m.clone()));
    }
    ResourceRequirements {
        requests: Some(req.clone()),
        limits: Some(req),
        ..ResourceRequirements::default()
    }
}

/// The pod template hash. It leaves out the role label (relabelled in
/// place on failover) and the init mode (only meaningful for an empty
/// volume). Parameters that only take effect at a restart are part of it
/// too: a change to them makes every instance outdated, so the rolling
/// update restarts them (left out when there are none, so the hash of
/// existing pods does not change). The basis is JSON with sorted keys, as
/// it was when the pod was built as JSON: the hash must not move.
fn template_hash(container: &Container, pg: &PostgresCluster) -> String {
    let mut basis = json!({"spec": container.image, "res": container.resources});
    let restart: BTreeMap<&String, &String> = pg
        .spec
        .postgresql
        .parameters
        .iter()
        .filter(|(k, _)| crate::postgres::needs_restart(k))
        .collect();
    if !restart.is_empty() {
        basis["restart"] = json!(restart);
    }
    // Stated placement only: see controller/placement.rs (upgrade rule).
    if let Some(p) = super::placement::hash_basis(pg) {
        basis["placement"] = p;
    }
    content_hash(&basis)
}
