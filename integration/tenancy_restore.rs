//! Issue 19, finding 1 and the name parts of finding 13: a tenant owns its
//! namespace and nothing else. A restore (`spec.bootstrap.fromBackup`) from
//! another namespace or another member cluster needs the source's consent,
//! every name is validated before a request is made with it, and a name too
//! long for its children is refused instead of looping.
//!
//! Each theft attempt ends with the tenant's cluster Invalid (condition and
//! InvalidSpec event), and the proof is the data: no Secret in the tenant's
//! namespace holds the victim's password or the victim's other Secret.
#![allow(clippy::unwrap_used)]

use crate::common::fleet;

use fleet::*;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::Api;
use kube::api::{ListParams, PostParams};
use pgfleet::crd::PostgresCluster;
use serde_json::{Value, json};
use std::collections::BTreeMap;

const CONSENT: &str = "pgfleet.io/restore-allowed-namespaces";

fn spec(size: u32) -> Value {
    // Superuser access on: the restores copy the source's superuser Secret.
    json!({"clusterSize": size, "version": "15.20", "enableSuperuserAccess": true})
}

fn restore_spec(from: Value) -> Value {
    let mut s = spec(1);
    s["bootstrap"] = json!({ "fromBackup": from });
    s
}

/// Waits for the password in Secret `member`/`ns`/`secret`.
async fn wait_password(
    f: &TestFleet,
    member: &str,
    ns: &str,
    secret: &str,
    patience: std::time::Duration,
) -> String {
    let secrets: Api<Secret> = Api::namespaced(f.client(member), ns);
    eventually_within(patience, &format!("{member} {ns}/{secret}"), || {
        let secrets = secrets.clone();
        async move {
            let s = secrets.get_opt(secret).await.map_err(|e| e.to_string())?;
            s.and_then(|s| s.data)
                .and_then(|d| d.get("password").cloned())
                .map(|p| String::from_utf8(p.0).unwrap())
                .ok_or_else(|| "not yet".to_string())
        }
    })
    .await
}

/// A victim PostgresCluster `vault` in `member`/`ns`, with `annotations`,
/// once its generated superuser password exists; returns that password.
async fn victim(f: &TestFleet, member: &str, ns: &str, annotations: Value) -> String {
    f.namespace(member, ns).await;
    let mut obj = pgc_object("vault", spec(1));
    obj.metadata.annotations = serde_json::from_value(annotations).unwrap();
    f.pgc(member, ns)
        .create(&PostParams::default(), &obj)
        .await
        .unwrap();
    wait_password(f, member, ns, "vault-superuser", PATIENCE).await
}

/// An Opaque Secret of the victim's that is nobody's business.
async fn unrelated_secret(f: &TestFleet, member: &str, ns: &str, name: &str, value: &str) {
    f.namespace(member, ns).await;
    let s = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([(
            "password".to_string(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    Api::<Secret>::namespaced(f.client(member), ns)
        .create(&PostParams::default(), &s)
        .await
        .unwrap();
}

/// Waits until `member`/`ns`/`name` is Invalid with a message containing
/// `needle`; returns the message.
async fn wait_invalid(f: &TestFleet, member: &str, ns: &str, name: &str, needle: &str) -> String {
    let api = f.pgc(member, ns);
    eventually(
        &format!("{member} {ns}/{name} Invalid naming {needle:?}"),
        || {
            let api = api.clone();
            async move {
                let pg = api.get(name).await.map_err(|e| e.to_string())?;
                match condition(&pg, "Invalid") {
                    Some(c) if c.status == "True" && c.message.contains(needle) => {
                        Ok(c.message.clone())
                    }
                    other => Err(format!("{other:?}")),
                }
            }
        },
    )
    .await
}

/// Every Secret value in a namespace, as text.
async fn secret_values(f: &TestFleet, member: &str, ns: &str) -> Vec<(String, String)> {
    let list = Api::<Secret>::namespaced(f.client(member), ns)
        .list(&ListParams::default())
        .await
        .unwrap();
    list.items
        .into_iter()
        .flat_map(|s| {
            let name = s.metadata.name.clone().unwrap_or_default();
            s.data
                .unwrap_or_default()
                .into_values()
                .map(move |v| (name.clone(), String::from_utf8_lossy(&v.0).into_owned()))
        })
        .collect()
}

/// The attacker's cluster is refused with an event, created no children,
/// and no Secret in its namespace holds any of `stolen`.
async fn assert_nothing_taken(f: &TestFleet, member: &str, ns: &str, name: &str, stolen: &[&str]) {
    let kids = child_names(&f.client(member), ns, name).await;
    assert_eq!(kids, ChildNames::default(), "{name}: children were created");
    for (secret, value) in secret_values(f, member, ns).await {
        for s in stolen {
            assert!(
                !value.contains(s),
                "{member} {ns}/{secret} holds a victim's secret (restore {name})"
            );
        }
    }
    let evs = events_about(&f.client(member), ns, name).await;
    assert!(
        evs.iter().any(|(r, _)| r == "InvalidSpec"),
        "{name}: {evs:?}"
    );
}

/// Variant (a): another namespace's superuser password, and variant (c):
/// another member cluster's, both with the restore naming them directly.
/// The victim consents to `friend`, which does not make `evil` a friend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_cannot_copy_another_namespaces_or_members_password() {
    let f = TestFleet::start("theft-ns", &["alpha", "beta"]).await;
    let a_pw = victim(&f, "alpha", "victim", json!({CONSENT: "friend"})).await;
    let b_pw = victim(&f, "beta", "victim", json!({CONSENT: "friend"})).await;
    // The same namespace name in another member cluster may be another team's.
    let s_pw = victim(&f, "beta", "shared", json!({})).await;
    f.namespace("alpha", "evil").await;
    f.namespace("alpha", "shared").await;
    let attempts = [
        (
            "evil",
            "steal-ns",
            json!({"cluster": "vault", "namespace": "victim"}),
        ),
        (
            "evil",
            "steal-member",
            json!({"cluster": "vault", "namespace": "victim", "memberCluster": "beta"}),
        ),
        (
            "shared",
            "steal-same-ns-name",
            json!({"cluster": "vault", "memberCluster": "beta"}),
        ),
    ];
    for (ns, name, from) in &attempts {
        f.create("alpha", ns, name, restore_spec(from.clone()))
            .await;
    }
    for (ns, name, _) in &attempts {
        let msg = wait_invalid(&f, "alpha", ns, name, CONSENT).await;
        assert!(msg.contains("Nothing was read from the source"), "{msg}");
        assert_nothing_taken(&f, "alpha", ns, name, &[&a_pw, &b_pw, &s_pw]).await;
    }
}

/// Variant (b): names that change the request URL (`x?` read the Secret
/// `x`; `/` and `%2F` walk the path) are refused before any request, in
/// this namespace and across.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_with_a_name_that_would_rewrite_the_url_is_invalid() {
    let f = TestFleet::start("theft-names", &["alpha"]).await;
    let secret = "an-unrelated-opaque-secret-value";
    unrelated_secret(&f, "alpha", "victim", "x", secret).await;
    unrelated_secret(&f, "alpha", "victim", "x-superuser", secret).await;
    let pw = victim(&f, "alpha", "victim", json!({CONSENT: "evil"})).await;
    f.namespace("alpha", "evil").await;
    // The victim even consents to `evil` restoring `vault`: consent for one
    // cluster must not open the namespace's other Secrets.
    let attempts = [
        ("q-own", json!({"cluster": "x?"}), "fromBackup.cluster"),
        (
            "q-victim",
            json!({"cluster": "x?", "namespace": "victim"}),
            "fromBackup.cluster",
        ),
        (
            "slash",
            json!({"cluster": "vault/../x", "namespace": "victim"}),
            "fromBackup.cluster",
        ),
        (
            "pct",
            json!({"cluster": "x%3F", "namespace": "victim"}),
            "fromBackup.cluster",
        ),
        (
            "ns-q",
            json!({"cluster": "vault", "namespace": "victim/secrets/x?"}),
            "fromBackup.namespace",
        ),
        (
            "member-q",
            json!({"cluster": "vault", "memberCluster": "alpha?"}),
            "fromBackup.memberCluster",
        ),
        (
            "backup-q",
            json!({"cluster": "vault", "namespace": "victim", "backup": "x?"}),
            "fromBackup.backup",
        ),
    ];
    for (name, from, _) in &attempts {
        f.create("alpha", "evil", name, restore_spec(from.clone()))
            .await;
    }
    for (name, _, field) in &attempts {
        wait_invalid(&f, "alpha", "evil", name, field).await;
        assert_nothing_taken(&f, "alpha", "evil", name, &[secret, &pw]).await;
    }
}

/// With the source's consent a restore crosses namespaces and member
/// clusters and inherits the source's passwords, as before.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_consented_restore_crosses_namespaces_and_members_and_inherits_the_password() {
    let f = TestFleet::start("consent", &["alpha", "beta"]).await;
    let a_pw = victim(
        &f,
        "alpha",
        "source",
        json!({CONSENT: "friend, beta/friend"}),
    )
    .await;
    f.create(
        "alpha",
        "friend",
        "copy",
        restore_spec(json!({"cluster": "vault", "namespace": "source"})),
    )
    .await;
    f.create(
        "beta",
        "friend",
        "copy",
        restore_spec(json!({"cluster": "vault", "namespace": "source", "memberCluster": "alpha"})),
    )
    .await;
    for member in ["alpha", "beta"] {
        let got = wait_password(&f, member, "friend", "copy-superuser", PATIENCE).await;
        assert!(
            got == a_pw,
            "{member}: copy-superuser is not the source's password"
        );
        let pg: PostgresCluster = f.pgc(member, "friend").get("copy").await.unwrap();
        assert!(
            condition(&pg, "Invalid").is_none_or(|c| c.status != "True"),
            "{member}: {:?}",
            pg.status
        );
    }
}

/// A source that consents later is picked up without touching the spec.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consent_given_later_lets_a_refused_restore_proceed() {
    let f = TestFleet::start("consent-later", &["alpha"]).await;
    let pw = victim(&f, "alpha", "source", json!({})).await;
    f.create(
        "alpha",
        "friend",
        "copy",
        restore_spec(json!({"cluster": "vault", "namespace": "source"})),
    )
    .await;
    wait_invalid(&f, "alpha", "friend", "copy", CONSENT).await;
    assert_nothing_taken(&f, "alpha", "friend", "copy", &[&pw]).await;
    f.patch(
        "alpha",
        "source",
        "vault",
        json!({"metadata": {"annotations": {CONSENT: "friend"}}}),
    )
    .await;
    let got = wait_password(
        &f,
        "alpha",
        "friend",
        "copy-superuser",
        std::time::Duration::from_secs(120),
    )
    .await;
    assert!(got == pw, "copy-superuser is not the source's password");
}

/// A future targetTime, a PostgresBackup that does not exist, and a name
/// too long for the cluster's children are Invalid with a condition and an
/// event, and nothing is created.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn future_times_unknown_backups_and_overlong_names_are_invalid() {
    let f = TestFleet::start("restore-invalid", &["alpha"]).await;
    let pw = victim(&f, "alpha", "db", json!({})).await;
    f.create(
        "alpha",
        "db",
        "future",
        restore_spec(json!({"cluster": "vault", "targetTime": "2099-01-01T00:00:00Z"})),
    )
    .await;
    f.create(
        "alpha",
        "db",
        "nobackup",
        restore_spec(json!({"cluster": "vault", "backup": "vault-nope"})),
    )
    .await;
    let long = format!("l{}", "o".repeat(69));
    assert_eq!(long.len(), 70);
    f.create("alpha", "db", &long, spec(1)).await;
    wait_invalid(&f, "alpha", "db", "future", "is in the future").await;
    wait_invalid(
        &f,
        "alpha",
        "db",
        "nobackup",
        "no PostgresBackup named vault-nope",
    )
    .await;
    let msg = wait_invalid(&f, "alpha", "db", &long, "at most 50").await;
    assert!(msg.contains("metadata.name"), "{msg}");
    for name in ["future", "nobackup", long.as_str()] {
        let kids = child_names(&f.client("alpha"), "db", name).await;
        assert_eq!(kids, ChildNames::default(), "{name}");
        let evs = events_about(&f.client("alpha"), "db", name).await;
        assert!(
            evs.iter().any(|(r, _)| r == "InvalidSpec"),
            "{name}: {evs:?}"
        );
    }
    // Refused before credentials: the source's password was not copied.
    for (secret, value) in secret_values(&f, "alpha", "db").await {
        assert!(
            secret.starts_with("vault-") || value != pw,
            "{secret} holds the source's password"
        );
    }
    // A same-namespace restore of that source still works as before.
    f.create(
        "alpha",
        "db",
        "copy",
        restore_spec(json!({"cluster": "vault"})),
    )
    .await;
    f.wait_healthy("alpha", "db", "copy", 1).await;
    let copy = Api::<Secret>::namespaced(f.client("alpha"), "db")
        .get("copy-superuser")
        .await
        .unwrap();
    let got = String::from_utf8(copy.data.unwrap()["password"].0.clone()).unwrap();
    assert!(got == pw, "copy-superuser is not the source's password");
}

/// The embedded API server refuses Service names a real one refuses
/// (DNS-1035: a leading digit, more than 63 characters), so tests see the
/// failures a real cluster would give.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_emulator_refuses_service_names_a_real_api_server_refuses() {
    let f = TestFleet::start("svc-names", &["alpha"]).await;
    f.namespace("alpha", "db").await;
    let api: Api<k8s_openapi::api::core::v1::Service> = Api::namespaced(f.client("alpha"), "db");
    let svc = |name: &str| -> k8s_openapi::api::core::v1::Service {
        serde_json::from_value(json!({"metadata": {"name": name},
            "spec": {"ports": [{"port": 5432}]}}))
        .unwrap()
    };
    for bad in ["1db-rw".to_string(), format!("a{}", "b".repeat(63))] {
        match api.create(&PostParams::default(), &svc(&bad)).await {
            Err(kube::Error::Api(e)) => assert_eq!(e.code, 422, "{bad}: {e:?}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    api.create(&PostParams::default(), &svc("db1-rw"))
        .await
        .unwrap();
}
