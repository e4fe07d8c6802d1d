//! The PgBouncer pooler in front of the primary (`spec.pooler.enabled`):
//! Pods `<name>-pooler-<n>`, a ConfigMap and the `<name>-pooler` Service. It
//! is what makes a switchover invisible to clients: PAUSE holds new queries
//! while the primary changes, RESUME reconnects through `<name>-rw`.
//!
//! This file builds the objects (pure); `apply` creates, updates and removes
//! them, `pause` holds the poolers' clients during a switchover, `auth` is
//! how PgBouncer logs clients in without the superuser (its own role and
//! an `auth_query` lookup).

pub mod apply;
pub mod auth;
pub mod pause;

use super::build::{ANN_HASH, LABEL_KIND, Owner};
use super::plan::Observed;
use crate::crd::PostgresCluster;
use crate::platform::hash::content_hash_of;
use crate::platform::objects;
use k8s_openapi::api::core::v1::{
    ConfigMap, ConfigMapVolumeSource, Container, EmptyDirVolumeSource, KeyToPath, Pod, PodSpec,
    Probe, SecretVolumeSource, Service, ServiceSpec, TCPSocketAction, Volume,
};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use std::collections::BTreeMap;

use crate::platform::labels::LABEL_POOLER;
pub const PORT: u16 = 6432;
/// Pooler images need sh, pgbouncer and psql on PATH (psql for the admin
/// console through exec); `deploy/images/pgbouncer/Dockerfile` builds one.
pub const DEFAULT_IMAGE: &str = "pgfleet/pgbouncer:1.23";

/// The pooler pods a switchover pauses (those not being deleted).
pub fn live_pods(obs: &Observed) -> Vec<String> {
    obs.pooler_pods
        .values()
        .filter(|p| !p.deleting)
        .map(|p| p.name.clone())
        .collect()
}

/// The pooler objects a cluster should have per `spec.pooler`: none but
/// `count` 0 when it is disabled (existing pods are then removed).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Wanted {
    pub config_map: Option<ConfigMap>,
    pub service: Option<Service>,
    /// Pods `1..=count`, in order.
    pub pods: Vec<Pod>,
    pub count: u32,
    /// Where the ConfigMap sends clients: running pooler Pods are pointed
    /// there too when it changes (they copied the ini at their start).
    pub upstream: Option<Upstream>,
}

/// Where a pooler sends its clients: the cluster's own `-rw`, or — on a
/// replica side of a disaster-recovery topology — the primary side's
/// exposed address (`controller::dr`), so applications that connect to
/// the pooler of either side always reach the one primary. The load
/// balancer's address is in no certificate: `verify-ca` against the
/// topology's one CA.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Upstream {
    pub host: String,
    pub port: u16,
    pub tls: &'static str,
}

impl Upstream {
    pub fn own(o: &Owner) -> Self {
        Self::own_named(&o.name)
    }

    /// [`Upstream::own`] of the PostgresCluster called `name`.
    pub fn own_named(name: &str) -> Self {
        Self {
            host: format!("{name}-rw"),
            port: 5432,
            tls: "verify-full",
        }
    }

    /// [`Upstream::own`] for an image whose PostgreSQL is built without
    /// SSL (catalog `tls = false`): `verify-full` could never connect,
    /// since the server answers the SSL request with "no".
    pub fn own_plain(o: &Owner) -> Self {
        Self {
            tls: "disable",
            ..Self::own(o)
        }
    }

    pub fn remote(host: &str, port: u16) -> Self {
        Self {
            host: host.to_string(),
            port,
            tls: "verify-ca",
        }
    }

    /// A host that can be pasted into the ini and a sed expression: a DNS
    /// name or an address, nothing else.
    fn safe(&self) -> bool {
        !self.host.is_empty()
            && self
                .host
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | ':'))
    }
}

/// Points a running pooler at `to` at once: the ini PgBouncer runs with
/// is rewritten in place (its mounted ConfigMap follows on its own, for
/// restarts) and RELOADed; open client connections stay, server
/// connections to the old address are closed as they are released. The
/// server TLS mode follows `to` too (`verify-*` or `disable`; a Pod that
/// started without a certificate keeps its `prefer`). None for an address
/// that is not a plain host.
pub fn repoint_command(to: &Upstream) -> Option<Vec<String>> {
    if !to.safe() {
        return None;
    }
    let mut argv = admin_command("RELOAD");
    let edit = format!(
        "sed -i -e 's/^\\* = host=[^ ]* port=[0-9]*/* = host={} port={}/' -e 's/^server_tls_sslmode = \\(verify-[a-z]*\\|disable\\)$/server_tls_sslmode = {}/' /tmp/pgbouncer/pgbouncer.ini && ",
        to.host, to.port, to.tls
    );
    argv[2] = format!("{edit}{}", argv[2]);
    Some(argv)
}

/// What `spec.pooler` asks for.
pub fn wanted(o: &Owner, pg: &PostgresCluster, upstream: &Upstream) -> Wanted {
    let Some(spec) = pg.spec.pooler.as_ref().filter(|p| p.enabled) else {
        return Wanted::default();
    };
    let count = spec.instances.max(1) as u32;
    Wanted {
        config_map: Some(config_map(o, pg, upstream)),
        service: Some(service(o)),
        pods: (1..=count)
            .map(|n| {
                let mut p = pod(o, n);
                if let Some(spec) = p.spec.as_mut() {
                    super::placement::pooler(spec, o, pg);
                }
                p
            })
            .collect(),
        count,
        upstream: Some(upstream.clone()),
    }
}

pub fn pod_name(o: &Owner, n: u32) -> String {
    format!("{}-pooler-{n}", o.name)
}

fn config_name(o: &Owner) -> String {
    format!("{}-pooler", o.name)
}

/// The start script: PgBouncer listens on the pod's own address (so many
/// poolers share a port on one machine in the embedded runtime), and its
/// userlist — the pooler role alone (`auth`) — is written from Secret
/// `<name>-pooler-auth` at start, never stored (a `"` in the password
/// doubled, as PgBouncer's userlist quotes it).
///
/// Pods made before: one without a certificate mounted starts without the
/// client-side TLS settings, `hostssl` read as `host`, and with
/// `server_tls_sslmode = prefer` (TLS to instances that have it, which
/// refuse anything else); one that mounts the superuser's password instead
/// of the pooler role's keeps logging in as the superuser (no auth_query,
/// `admin_users = postgres`). Both instead of failing on missing files.
const START: &str = r#"set -eu
mkdir -p /tmp/pgbouncer
if [ -s /etc/pgbouncer/tls/tls.crt ]; then
  sed "s/@POD_IP@/${POD_IP:-0.0.0.0}/" /etc/pgbouncer/pgbouncer.ini > /tmp/pgbouncer/pgbouncer.ini
  cp /etc/pgbouncer/pgbouncer_hba.conf /tmp/pgbouncer/pgbouncer_hba.conf
else
  echo "pgfleet: no certificate in /etc/pgbouncer/tls: TLS to clients stays off until this Pod is replaced" >&2
  sed -e "s/@POD_IP@/${POD_IP:-0.0.0.0}/" -e '/^client_tls_/d' -e '/^server_tls_ca_file/d' \
    -e 's/^server_tls_sslmode = .*/server_tls_sslmode = prefer/' /etc/pgbouncer/pgbouncer.ini > /tmp/pgbouncer/pgbouncer.ini
  sed 's/^hostssl /host /' /etc/pgbouncer/pgbouncer_hba.conf > /tmp/pgbouncer/pgbouncer_hba.conf
fi
umask 077
if [ -s /etc/pgbouncer/secrets/pooler-password ]; then
  printf '"%s" "%s"\n' @ROLE@ "$(sed 's/"/""/g' /etc/pgbouncer/secrets/pooler-password)" > /tmp/pgbouncer/userlist.txt
else
  echo "pgfleet: no pooler password mounted: logging in as the superuser until this Pod is replaced" >&2
  sed -i -e '/^auth_query/d' -e '/^auth_hba_file/d' -e 's/^auth_type = .*/auth_type = scram-sha-256/' \
    -e 's/^admin_users = .*/admin_users = postgres/' -e 's/ auth_user=[^ ]*$//' /tmp/pgbouncer/pgbouncer.ini
  printf '"postgres" "%s"\n' "$(sed 's/"/""/g' /etc/pgbouncer/secrets/superuser-password)" > /tmp/pgbouncer/userlist.txt
fi
exec pgbouncer /tmp/pgbouncer/pgbouncer.ini
"#;

/// Where the pooler sees `<name>-server-tls`.
const TLS_MOUNT: &str = "/etc/pgbouncer/tls";

/// Waits until the mounted certificate is the one with fingerprint `fp`
/// (controller::tls::issue::fingerprint), then RELOADs: PgBouncer reads
/// its TLS files again, open client connections stay.
pub fn reload_tls_command(fp: &str) -> Vec<String> {
    let fp: String = fp.chars().filter(char::is_ascii_hexdigit).collect();
    let mut argv = admin_command("RELOAD");
    let wait = format!(
        "n=0; until [ \"$(cat {TLS_MOUNT}/tls.crt {TLS_MOUNT}/tls.key | sha256sum | cut -d' ' -f1)\" = {fp} ]; do \
n=$((n + 1)); [ \"$n\" -le 110 ] || {{ echo 'certificate {fp} not mounted yet' >&2; exit 75; }}; sleep 1; done; "
    );
    argv[2] = format!("{wait}{}", argv[2]);
    argv
}

/// The admin command run through exec for PAUSE / RESUME / SHOW: as the
/// pooler role over the local socket (the only place PgBouncer's hba lets
/// an admin in), or as the superuser in a Pod made before the pooler role.
pub fn admin_command(cmd: &str) -> Vec<String> {
    let role = auth::ROLE;
    vec![
        "/bin/sh".into(),
        "-c".into(),
        format!(
            "if [ -s /etc/pgbouncer/secrets/pooler-password ]; then u={role} f=pooler-password; else u=postgres f=superuser-password; fi; \
PGPASSWORD=\"$(cat /etc/pgbouncer/secrets/$f)\" psql -X -q -h /tmp -p {PORT} -U \"$u\" -d pgbouncer -c '{cmd}'"
        ),
    ]
}

pub fn config_map(o: &Owner, pg: &PostgresCluster, upstream: &Upstream) -> ConfigMap {
    let own = Upstream::own(o);
    let to = if upstream.safe() { upstream } else { &own };
    let mode = match pg.spec.pooler.as_ref().map(|p| p.pool_mode) {
        Some(crate::crd::cluster::PoolMode::Session) => "session",
        _ => "transaction",
    };
    let ini = format!(
        "[databases]\n* = host={host} port={port} auth_user={role}\n\n[pgbouncer]\nlisten_addr = @POD_IP@\nlisten_port = {PORT}\nunix_socket_dir = /tmp\n\
auth_type = hba\nauth_hba_file = /tmp/pgbouncer/pgbouncer_hba.conf\nauth_file = /tmp/pgbouncer/userlist.txt\n\
auth_query = {query}\nadmin_users = {role}\npool_mode = {mode}\n\
max_client_conn = 1000\ndefault_pool_size = 20\nserver_reset_query = DISCARD ALL\nserver_check_delay = 1\n\
server_login_retry = 1\nquery_wait_timeout = 120\nignore_startup_parameters = extra_float_digits,options\n\
pidfile = /tmp/pgbouncer/pgbouncer.pid\n\
client_tls_sslmode = require\nclient_tls_cert_file = {TLS_MOUNT}/tls.crt\nclient_tls_key_file = {TLS_MOUNT}/tls.key\n\
client_tls_ca_file = {TLS_MOUNT}/ca.crt\nserver_tls_sslmode = {tls}\nserver_tls_ca_file = {TLS_MOUNT}/ca.crt\n",
        host = to.host,
        port = to.port,
        tls = to.tls,
        role = auth::ROLE,
        query = auth::auth_query(),
    );
    let mut metadata = o.meta(&config_name(o), &[], true);
    let data = BTreeMap::from([
        ("pgbouncer.ini".to_string(), ini),
        ("pgbouncer_hba.conf".to_string(), auth::hba()),
        ("start.sh".to_string(), START.replace("@ROLE@", auth::ROLE)),
    ]);
    let mut obj = ConfigMap {
        metadata: metadata.clone(),
        data: Some(data),
        ..ConfigMap::default()
    };
    objects::annotate(&mut metadata, ANN_HASH, content_hash_of(&obj));
    obj.metadata = metadata;
    obj
}

pub fn pod(o: &Owner, n: u32) -> Pod {
    let name = pod_name(o, n);
    // Not an instance: the instance Services select `pgfleet.io/kind=instance`.
    let labels = [(LABEL_POOLER, o.name.as_str()), (LABEL_KIND, "pooler")];
    let spec = PodSpec {
        // fsGroup: the group-readable certificate key (on a real kubelet
        // Secret files belong to root).
        security_context: Some(super::build::pod_security_context(true)),
        // The pooler never talks to the Kubernetes API.
        automount_service_account_token: Some(false),
        enable_service_links: Some(false),
        containers: vec![container()],
        volumes: Some(volumes(o)),
        ..PodSpec::default()
    };
    let mut metadata = o.meta(&name, &labels, true);
    // The hash of the spec alone (as it always was).
    objects::annotate(&mut metadata, ANN_HASH, content_hash_of(&spec));
    Pod {
        metadata,
        spec: Some(spec),
        ..Pod::default()
    }
}

fn container() -> Container {
    Container {
        name: "pgbouncer".into(),
        image: Some(DEFAULT_IMAGE.into()),
        security_context: Some(super::build::container_security_context()),
        command: Some(vec!["/bin/sh".into(), "/etc/pgbouncer/start.sh".into()]),
        env: Some(vec![objects::env_field("POD_IP", "status.podIP")]),
        ports: Some(vec![objects::container_port("pgbouncer", i32::from(PORT))]),
        readiness_probe: Some(Probe {
            tcp_socket: Some(TCPSocketAction {
                port: IntOrString::Int(i32::from(PORT)),
                ..TCPSocketAction::default()
            }),
            period_seconds: Some(2),
            ..Probe::default()
        }),
        volume_mounts: Some(vec![
            objects::mount("config", "/etc/pgbouncer", false),
            objects::mount("secrets", "/etc/pgbouncer/secrets", false),
            objects::mount("tls", TLS_MOUNT, true),
            objects::mount("tmp", "/tmp", false),
        ]),
        ..Container::default()
    }
}

fn volumes(o: &Owner) -> Vec<Volume> {
    vec![
        Volume {
            name: "config".into(),
            config_map: Some(ConfigMapVolumeSource {
                name: config_name(o),
                ..ConfigMapVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "tmp".into(),
            empty_dir: Some(EmptyDirVolumeSource::default()),
            ..Volume::default()
        },
        Volume {
            name: "secrets".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(o.secret_name(auth::SECRET)),
                items: Some(vec![KeyToPath {
                    key: "password".into(),
                    path: "pooler-password".into(),
                    ..KeyToPath::default()
                }]),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
        Volume {
            name: "tls".into(),
            secret: Some(SecretVolumeSource {
                secret_name: Some(super::tls::server_secret(&o.name)),
                default_mode: Some(0o440),
                ..SecretVolumeSource::default()
            }),
            ..Volume::default()
        },
    ]
}

pub fn service(o: &Owner) -> Service {
    let mut obj = Service {
        metadata: o.meta(&format!("{}-pooler", o.name), &[], true),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(BTreeMap::from([(LABEL_POOLER.to_string(), o.name.clone())])),
            ports: Some(vec![super::build::service_port(
                "pgbouncer",
                i32::from(PORT),
            )]),
            ..ServiceSpec::default()
        }),
        ..Service::default()
    };
    let h = content_hash_of(&obj);
    objects::annotate(&mut obj.metadata, ANN_HASH, h);
    obj
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_replica_sides_pooler_points_at_the_primary_side_and_repoints_live() {
        let mut pg = PostgresCluster::new(
            "orders",
            serde_json::from_value(json!({"pooler": {"enabled": true}})).unwrap(),
        );
        pg.metadata.namespace = Some("shop".into());
        pg.metadata.uid = Some("u-1".into());
        let o = Owner::of(&pg, 1).unwrap();
        let remote = Upstream::remote("127.200.1.2", 5432);
        let cm = serde_json::to_value(config_map(&o, &pg, &remote)).unwrap();
        let ini = cm["data"]["pgbouncer.ini"].as_str().unwrap();
        assert!(
            ini.contains("* = host=127.200.1.2 port=5432 auth_user="),
            "{ini}"
        );
        assert!(ini.lines().any(|l| l == "server_tls_sslmode = verify-ca"));
        let cmd = repoint_command(&remote).unwrap().join(" ");
        assert!(
            cmd.contains("host=127.200.1.2 port=5432/")
                && cmd.contains("verify-ca")
                && cmd.contains("RELOAD")
        );
        // A hostile address is neither rendered nor run.
        let evil = Upstream::remote("x/; rm -rf /", 1);
        assert!(repoint_command(&evil).is_none());
        let cm = serde_json::to_value(config_map(&o, &pg, &evil)).unwrap();
        assert!(
            cm["data"]["pgbouncer.ini"]
                .as_str()
                .unwrap()
                .contains("host=orders-rw port=5432")
        );
    }

    /// The repoint's sed, run on a rendered ini: the server TLS mode
    /// follows the upstream both ways (to `disable` for an image without
    /// SSL, back to `verify-full`), host and port stay; a Pod that started
    /// without a certificate keeps `prefer`.
    #[test]
    fn a_running_pooler_follows_the_instances_tls_both_ways() {
        let mut pg = PostgresCluster::new(
            "orders",
            serde_json::from_value(json!({"pooler": {"enabled": true}})).unwrap(),
        );
        pg.metadata.namespace = Some("shop".into());
        pg.metadata.uid = Some("u-1".into());
        let o = Owner::of(&pg, 1).unwrap();
        let cm = serde_json::to_value(config_map(&o, &pg, &Upstream::own(&o))).unwrap();
        let dir = std::env::temp_dir().join(format!("pgfleet-repoint-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let ini = dir.join("pgbouncer.ini");
        std::fs::write(&ini, cm["data"]["pgbouncer.ini"].as_str().unwrap()).unwrap();
        let run = |to: &Upstream| {
            let argv = repoint_command(to).unwrap();
            let sed = argv[2]
                .split(" && ")
                .next()
                .unwrap()
                .replace("/tmp/pgbouncer/pgbouncer.ini", ini.to_str().unwrap());
            let ok = std::process::Command::new("sh")
                .args(["-c", &sed])
                .status()
                .unwrap();
            assert!(ok.success(), "{sed}");
            std::fs::read_to_string(&ini).unwrap()
        };
        let mode = |text: &str| {
            text.lines()
                .find_map(|l| l.strip_prefix("server_tls_sslmode = "))
                .unwrap()
                .to_string()
        };
        let plain = run(&Upstream::own_plain(&o));
        assert_eq!(mode(&plain), "disable");
        assert!(
            plain.contains("* = host=orders-rw port=5432 auth_user="),
            "{plain}"
        );
        assert_eq!(mode(&run(&Upstream::own(&o))), "verify-full");
        let started_without_cert = plain.replace("= disable", "= prefer");
        std::fs::write(&ini, started_without_cert).unwrap();
        assert_eq!(mode(&run(&Upstream::own_plain(&o))), "prefer");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn pooler_points_at_rw_and_is_not_an_instance() {
        let mut pg = PostgresCluster::new(
            "orders",
            serde_json::from_value(json!({"pooler": {"enabled": true}})).unwrap(),
        );
        pg.metadata.namespace = Some("shop".into());
        pg.metadata.uid = Some("u-1".into());
        let o = Owner::of(&pg, 1).unwrap();
        let cm = serde_json::to_value(config_map(&o, &pg, &Upstream::own(&o))).unwrap();
        assert!(
            cm["data"]["pgbouncer.ini"]
                .as_str()
                .unwrap()
                .contains("host=orders-rw port=5432")
        );
        assert!(
            cm["data"]["pgbouncer.ini"]
                .as_str()
                .unwrap()
                .contains("pool_mode = transaction")
        );
        let p = serde_json::to_value(pod(&o, 1)).unwrap();
        assert_eq!(p["metadata"]["name"], "orders-pooler-1");
        assert_eq!(p["metadata"]["labels"][LABEL_KIND], "pooler");
        let svc = serde_json::to_value(service(&o)).unwrap();
        assert_eq!(svc["spec"]["selector"][LABEL_POOLER], "orders");
        assert!(admin_command("PAUSE")[2].contains("-c 'PAUSE'"));
        // The pooler's own role, not the superuser: in the userlist, as
        // admin and as auth_user; the superuser Secret is not mounted.
        let ini = cm["data"]["pgbouncer.ini"].as_str().unwrap();
        for l in [
            "* = host=orders-rw port=5432 auth_user=pgfleet_pooler",
            "auth_type = hba",
            "admin_users = pgfleet_pooler",
            &format!("auth_query = {}", auth::auth_query()),
        ] {
            assert!(ini.lines().any(|x| x == l), "{l}");
        }
        assert!(!ini.contains("postgres"), "{ini}");
        assert_eq!(cm["data"]["pgbouncer_hba.conf"], auth::hba());
        let start = cm["data"]["start.sh"].as_str().unwrap();
        assert!(
            start.contains(r#"printf '"%s" "%s"\n' pgfleet_pooler"#),
            "{start}"
        );
        assert_eq!(
            p["spec"]["volumes"][2]["secret"]["secretName"],
            "orders-pooler-auth"
        );
        assert!(admin_command("PAUSE")[2].contains("u=pgfleet_pooler f=pooler-password"));
    }
}
