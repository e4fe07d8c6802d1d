//! The `<name>-app` Secret applications connect with (type
//! `kubernetes.io/basic-auth`): the application owner's credentials and
//! every form a client library wants them in. `render` is pure; `ensure`
//! creates it once and keeps its derived keys current (a renamed database
//! or a changed password Secret), never changing the password itself.

use crate::controller::reconcile::{Error, FIELD_MANAGER, kerr};
use crate::crd::PostgresCluster;
use crate::platform::labels::{LABEL_CLUSTER, LABEL_MANAGED_BY};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Patch, PatchParams};
use kube::{Api, Resource};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const PORT: u16 = 5432;

/// `<cluster>-app`.
pub fn name(cluster: &str) -> String {
    format!("{cluster}-app")
}

/// The application's credentials and where it connects.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AppLogin {
    pub cluster: String,
    pub namespace: String,
    pub username: String,
    pub password: String,
    pub dbname: String,
    /// The cluster runs the pooler: the `pooler-*` keys are written too.
    pub pooler: bool,
}

/// Everything but unreserved characters (RFC 3986) percent-encoded: a
/// user, password or database name is one URI component whatever it holds.
pub fn pct(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// One field of a .pgpass line (`:` and `\` escaped).
fn pgpass_field(s: &str) -> String {
    s.replace('\\', "\\\\").replace(':', "\\:")
}

/// The Secret's string data, by key.
pub fn data(l: &AppLogin) -> BTreeMap<String, String> {
    let host = format!("{}-rw.{}.svc", l.cluster, l.namespace);
    let ro_host = format!("{}-ro.{}.svc", l.cluster, l.namespace);
    let (u, p, d) = (pct(&l.username), pct(&l.password), pct(&l.dbname));
    // TLS only (the server refuses plain text), and the server's name
    // checked against the cluster CA: `ca.crt` of the `<name>-ca` Secret,
    // given to libpq as `sslrootcert` (docs/connecting-applications.md).
    let uri = |h: &str| format!("postgresql://{u}:{p}@{h}:{PORT}/{d}?sslmode=verify-full");
    let jdbc = |h: &str| {
        format!("jdbc:postgresql://{h}:{PORT}/{d}?user={u}&password={p}&sslmode=verify-full")
    };
    let mut m = BTreeMap::new();
    m.insert("username".into(), l.username.clone());
    m.insert("password".into(), l.password.clone());
    m.insert("host".into(), host.clone());
    m.insert("ro-host".into(), ro_host.clone());
    m.insert("port".into(), PORT.to_string());
    m.insert("dbname".into(), l.dbname.clone());
    m.insert("uri".into(), uri(&host));
    m.insert("ro-uri".into(), uri(&ro_host));
    m.insert("jdbc-uri".into(), jdbc(&host));
    m.insert("ro-jdbc-uri".into(), jdbc(&ro_host));
    if l.pooler {
        // PgBouncer logs the application's own role in (pooler::auth).
        let ph = format!("{}-pooler.{}.svc", l.cluster, l.namespace);
        let pp = crate::controller::pooler::PORT;
        m.insert(
            "pooler-uri".into(),
            format!("postgresql://{u}:{p}@{ph}:{pp}/{d}?sslmode=verify-full"),
        );
        m.insert(
            "pooler-jdbc-uri".into(),
            format!("jdbc:postgresql://{ph}:{pp}/{d}?user={u}&password={p}&sslmode=verify-full"),
        );
        m.insert("pooler-host".into(), ph);
        m.insert("pooler-port".into(), pp.to_string());
    }
    m.insert(
        "pgpass".into(),
        format!(
            "{}:{PORT}:{}:{}:{}\n",
            host,
            pgpass_field(&l.dbname),
            pgpass_field(&l.username),
            pgpass_field(&l.password)
        ),
    );
    m
}

/// The Secret, owned by the cluster (deleted with it).
pub fn render(pg: &PostgresCluster, l: &AppLogin) -> Secret {
    let labels = BTreeMap::from([
        (LABEL_CLUSTER.to_string(), l.cluster.clone()),
        (LABEL_MANAGED_BY.to_string(), "pgfleet".to_string()),
    ]);
    Secret {
        metadata: ObjectMeta {
            name: Some(name(&l.cluster)),
            namespace: Some(l.namespace.clone()),
            labels: Some(labels),
            owner_references: pg.controller_owner_ref(&()).map(|o| vec![o]),
            ..Default::default()
        },
        type_: Some("kubernetes.io/basic-auth".into()),
        data: Some(
            data(l)
                .into_iter()
                .map(|(k, v)| (k, ByteString(v.into_bytes())))
                .collect(),
        ),
        ..Default::default()
    }
}

/// Reads one key of a Secret as text (None: no Secret, no key, not UTF-8).
pub fn key(secret: &Secret, key: &str) -> Option<String> {
    let b = secret.data.as_ref()?.get(key)?;
    let s = String::from_utf8(b.0.clone()).ok()?;
    Some(s.trim_end_matches(['\n', '\r']).to_string())
}

/// What [`ensure`] compares: a hash of a Secret's type, keys and values
/// (so what is kept of the early Secret is a number, not its keys).
pub fn fingerprint(s: &Secret) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    s.type_.hash(&mut h);
    for (k, v) in s.data.iter().flatten() {
        k.hash(&mut h);
        v.0.hash(&mut h);
    }
    h.finish()
}

/// Applies the Secret when it is missing or any key differs from the one
/// whose [`fingerprint`] is `existing` (the password is the caller's: the
/// existing one, or a new one for a new Secret). Returns the Secret as the
/// API server stored it when it was written.
pub async fn ensure(
    client: &kube::Client,
    pg: &PostgresCluster,
    l: &AppLogin,
    existing: Option<u64>,
) -> Result<Option<Secret>, Error> {
    let want = render(pg, l);
    if existing == Some(fingerprint(&want)) {
        return Ok(None);
    }
    let n = name(&l.cluster);
    let written = Api::<Secret>::namespaced(client.clone(), &l.namespace)
        .patch(
            &n,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&want),
        )
        .await
        .map_err(kerr("apply", "Secret", &n))?;
    Ok(Some(written))
}

/// A new cluster's `<name>-app` Secret as its early write returned it
/// (`round::early_app_secret`): what the first access round would read.
#[derive(Clone, PartialEq)]
pub struct Early {
    pub resource_version: String,
    pub password: String,
    pub fingerprint: u64,
}

/// Without the password: credentials never reach a log line, even
/// through a debug print of something that holds one.
impl std::fmt::Debug for Early {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Early")
            .field("resource_version", &self.resource_version)
            .field("password", &"<redacted>")
            .field("fingerprint", &self.fingerprint)
            .finish()
    }
}

/// [`Early`] by `member/namespace/cluster`, kept until the cluster's first
/// access round takes it: that round then reads no Secret — one request
/// less per new cluster (issue 16). Held only for that short while (the
/// first instance's start), and small: a cold start of 10,000 clusters
/// holds up to 10,000 at once.
type Stash = HashMap<String, (Instant, Early)>;

fn stash() -> &'static Mutex<Stash> {
    static STASH: OnceLock<Mutex<Stash>> = OnceLock::new();
    STASH.get_or_init(Default::default)
}

/// An entry older than this is dropped when the stash grows (a cluster
/// whose primary never became ready, deleted by another manager).
const EARLY_KEPT: Duration = Duration::from_secs(600);

/// Keeps what the early write of `secret` (for `password`) returned.
pub(super) fn keep_early(key: String, secret: &Secret, password: String) {
    let Some(rv) = secret.metadata.resource_version.clone() else {
        return;
    };
    let early = Early {
        resource_version: rv,
        password,
        fingerprint: fingerprint(secret),
    };
    let mut m = stash().lock().unwrap_or_else(|e| e.into_inner());
    if m.len() % 256 == 255 {
        m.retain(|_, (at, _)| at.elapsed() < EARLY_KEPT);
    }
    m.insert(key, (Instant::now(), early));
}

/// The kept Secret, once, when it is still the version the Secret watch
/// shows (`seen`): one changed since — a tenant's new password — or not
/// seen by the watch yet is read fresh instead.
pub(super) fn take_early(key: &str, seen: Option<&str>) -> Option<Early> {
    let mut m = stash().lock().unwrap_or_else(|e| e.into_inner());
    let (_, e) = m.remove(key)?;
    // Drained (the cold start is over): give its table back.
    if m.len() * 4 < m.capacity() {
        m.shrink_to_fit();
    }
    (Some(e.resource_version.as_str()) == seen).then_some(e)
}

pub(super) fn forget_early(key: &str) {
    stash()
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .remove(key);
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_early_secret_is_taken_once_and_only_at_the_version_the_watch_shows() {
        let with_rv = |rv: &str| {
            let mut s = Secret::default();
            s.metadata.resource_version = Some(rv.into());
            s
        };
        let pw = || "pw".to_string();
        keep_early("m/shop/a".into(), &with_rv("7"), pw());
        let e = take_early("m/shop/a", Some("7")).unwrap();
        assert_eq!(
            (e.resource_version.as_str(), e.password.as_str()),
            ("7", "pw")
        );
        assert_eq!(
            e.fingerprint,
            fingerprint(&with_rv("8")),
            "the keys, not the version"
        );
        // Taken once: the next round reads.
        assert!(take_early("m/shop/a", Some("7")).is_none());
        // Edited since (a tenant's new password), or not seen by the watch
        // yet: read fresh, and the stash is dropped either way.
        keep_early("m/shop/b".into(), &with_rv("7"), pw());
        assert!(take_early("m/shop/b", Some("9")).is_none());
        assert!(take_early("m/shop/b", Some("7")).is_none());
        keep_early("m/shop/c".into(), &with_rv("7"), pw());
        assert!(take_early("m/shop/c", None).is_none());
        keep_early("m/shop/d".into(), &with_rv("7"), pw());
        forget_early("m/shop/d");
        assert!(take_early("m/shop/d", Some("7")).is_none());
    }

    #[test]
    fn the_fingerprint_sees_every_key_and_value() {
        let l = AppLogin {
            cluster: "orders".into(),
            namespace: "shop".into(),
            username: "app".into(),
            password: "one".into(),
            dbname: "app".into(),
            pooler: false,
        };
        let pg = PostgresCluster::new(
            "orders",
            serde_json::from_value(serde_json::json!({})).unwrap(),
        );
        let f = fingerprint(&render(&pg, &l));
        assert_eq!(f, fingerprint(&render(&pg, &l)));
        let other_pw = AppLogin {
            password: "two".into(),
            ..l.clone()
        };
        assert_ne!(f, fingerprint(&render(&pg, &other_pw)));
        assert_ne!(
            f,
            fingerprint(&render(&pg, &AppLogin { pooler: true, ..l }))
        );
    }

    #[test]
    fn every_form_of_the_login() {
        let l = AppLogin {
            cluster: "orders".into(),
            namespace: "shop".into(),
            username: "app".into(),
            password: "p@ss:w/rd\\".into(),
            dbname: "app".into(),
            pooler: false,
        };
        let d = data(&l);
        assert_eq!(d["host"], "orders-rw.shop.svc");
        assert_eq!(
            d["uri"],
            "postgresql://app:p%40ss%3Aw%2Frd%5C@orders-rw.shop.svc:5432/app?sslmode=verify-full"
        );
        assert_eq!(
            d["ro-uri"],
            "postgresql://app:p%40ss%3Aw%2Frd%5C@orders-ro.shop.svc:5432/app?sslmode=verify-full"
        );
        assert_eq!(
            d["jdbc-uri"],
            "jdbc:postgresql://orders-rw.shop.svc:5432/app?user=app&password=p%40ss%3Aw%2Frd%5C&sslmode=verify-full"
        );
        assert_eq!(
            d["pgpass"],
            "orders-rw.shop.svc:5432:app:app:p@ss\\:w/rd\\\\\n"
        );
        assert_eq!(d["port"], "5432");
        assert!(!d.contains_key("pooler-uri"));
        let d = data(&AppLogin { pooler: true, ..l });
        assert_eq!(
            d["pooler-uri"],
            "postgresql://app:p%40ss%3Aw%2Frd%5C@orders-pooler.shop.svc:6432/app?sslmode=verify-full"
        );
        assert_eq!(
            d["pooler-jdbc-uri"],
            "jdbc:postgresql://orders-pooler.shop.svc:6432/app?user=app&password=p%40ss%3Aw%2Frd%5C&sslmode=verify-full"
        );
        assert_eq!(d["pooler-host"], "orders-pooler.shop.svc");
        assert_eq!(d["pooler-port"], "6432");
    }
}
