//! The tenant boundary as the API server draws it: `deploy/tenant` applied
//! for two tenants with the real kubectl, then kubectl acting with a token
//! bound to exactly the tenant Role. The embedded API server enforces RBAC
//! for service-account tokens, as a real one does for every user.
//!
//! What a tenant must not reach (docs/security.md, "Tenancy model"): another
//! tenant's Secrets and databases, the fleet's controls in `pgfleet-system`,
//! its own namespace's Pod Security label, RBAC objects, and the manager's
//! identity (a token Secret naming the manager's ServiceAccount from a tenant
//! namespace opens nothing).
#![allow(clippy::unwrap_used)]

use crate::common::fleet;
#[allow(dead_code)]
use crate::kubectl;

use fleet::temp_dir;
use kubectl::Kubectl;
use pgfleet::sim::{self, RuntimeKind, SimOptions};
use std::path::{Path, PathBuf};

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// `deploy/tenant` rendered for namespace `ns` (the base's namespace is
/// called `tenant`; a platform team sets its own in an overlay).
fn tenant_manifests(kubectl: &Kubectl, ns: &str) -> String {
    let base = kubectl.ok(&["kustomize", &repo().join("deploy/tenant").to_string_lossy()]);
    base.replace("namespace: tenant\n", &format!("namespace: {ns}\n"))
        .replace("  name: tenant\n", &format!("  name: {ns}\n"))
}

/// A service-account token from the token controller, as a user gets one.
/// `creator` is the token the Secret is created with (None: the admin).
fn token_for(kubectl: &Kubectl, creator: Option<&str>, ns: &str, sa: &str, secret: &str) -> String {
    let manifest = format!(
        "apiVersion: v1\nkind: Secret\nmetadata:\n  name: {secret}\n  namespace: {ns}\n  \
         annotations:\n    kubernetes.io/service-account.name: {sa}\ntype: kubernetes.io/service-account-token\n"
    );
    let file = kubectl.file(&format!("{ns}-{secret}.yaml"), &manifest);
    match creator {
        Some(t) => allowed(kubectl, t, &["apply", "-f", &file]),
        None => kubectl.ok(&["apply", "-f", &file]),
    };
    let mut token = String::new();
    for _ in 0..100 {
        token = kubectl.ok(&[
            "-n",
            ns,
            "get",
            "secret",
            secret,
            "-o",
            "jsonpath={.data.token}",
        ]);
        if !token.is_empty() {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    use base64::Engine as _;
    let raw = base64::engine::general_purpose::STANDARD
        .decode(token.trim())
        .unwrap_or_default();
    String::from_utf8(raw).unwrap_or_default()
}

fn pgc(ns: &str, name: &str) -> String {
    format!(
        "apiVersion: pgfleet.io/v1\nkind: PostgresCluster\nmetadata:\n  name: {name}\n  namespace: {ns}\n\
         spec:\n  clusterSize: 1\n  version: \"15.20\"\n  enableSuperuserAccess: true\n  storage:\n    size: 1Gi\n"
    )
}

fn forbidden(as_tenant: &Kubectl, token: &str, args: &[&str]) {
    refused(as_tenant, token, args, false)
}

/// Refused as forbidden (403), or — with `or_unknown` — because the token
/// identifies nobody (401).
fn refused(as_tenant: &Kubectl, token: &str, args: &[&str], or_unknown: bool) {
    let mut all = vec!["--token", token];
    all.extend_from_slice(args);
    let (_, err) = as_tenant.fails(&all);
    assert!(
        err.contains("forbidden")
            || err.contains("Forbidden")
            || (or_unknown && err.contains("Unauthorized")),
        "kubectl {} should be forbidden, got: {err}",
        args.join(" ")
    );
}

fn allowed(as_tenant: &Kubectl, token: &str, args: &[&str]) -> String {
    let mut all = vec!["--token", token];
    all.extend_from_slice(args);
    as_tenant.ok(&all)
}

fn sim_options(dir: &Path) -> SimOptions {
    SimOptions {
        dir: dir.to_path_buf(),
        names: vec!["m1".into()],
        runtime: RuntimeKind::None,
        persist: false,
        history: 10_000,
        admin: false,
        images: vec![],
        run_as: None,
        nodes: Default::default(),
    }
}

#[test]
fn a_tenant_reaches_its_own_namespace_and_nothing_else() {
    let dir = temp_dir("tenancy-rbac");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sim = rt
        .block_on(sim::start(&sim_options(&dir.join("sim"))))
        .unwrap();
    let admin = Kubectl::new(&sim.clusters[0].kubeconfig, &dir);

    // What the platform team installs: the member manifests (CRDs, the
    // manager's identity, pgfleet-system) and one deploy/tenant per team.
    admin.ok(&[
        "apply",
        "--server-side",
        "-k",
        &repo().join("deploy/member").to_string_lossy(),
    ]);
    for ns in ["shop", "bank"] {
        let file = admin.file(&format!("tenant-{ns}.yaml"), &tenant_manifests(&admin, ns));
        admin.ok(&["apply", "--server-side", "-f", &file]);
    }
    // Something of each kind a tenant must not reach.
    admin.ok(&[
        "-n",
        "bank",
        "create",
        "secret",
        "generic",
        "vault-superuser",
        "--from-literal=password=bank-secret-password",
    ]);
    let bank_pgc = admin.file("bank-pgc.yaml", &pgc("bank", "vault"));
    admin.ok(&["apply", "-f", &bank_pgc]);
    admin.ok(&[
        "-n",
        "pgfleet-system",
        "create",
        "configmap",
        "pgfleet-rollout-minor",
        "--from-literal=control={}",
    ]);

    let token = token_for(&admin, None, "shop", "tenant-admin", "tenant-admin-token");
    assert!(!token.is_empty(), "the token controller issued no token");
    let t = &admin;

    // Its own namespace: databases, backups, Secrets, what pgfleet made.
    let own = admin.file("shop-pgc.yaml", &pgc("shop", "orders"));
    allowed(t, &token, &["apply", "-f", &own]);
    allowed(t, &token, &["-n", "shop", "get", "pgc", "orders"]);
    allowed(
        t,
        &token,
        &["-n", "shop", "scale", "pgc", "orders", "--replicas=2"],
    );
    allowed(t, &token, &["-n", "shop", "get", "secrets"]);
    allowed(t, &token, &["-n", "shop", "get", "pods,services,pvc"]);

    // Another tenant's Secrets and databases.
    forbidden(
        t,
        &token,
        &["-n", "bank", "get", "secret", "vault-superuser"],
    );
    forbidden(t, &token, &["get", "secrets", "-A"]);
    forbidden(t, &token, &["-n", "bank", "get", "pgc", "vault"]);
    forbidden(
        t,
        &token,
        &[
            "-n",
            "bank",
            "patch",
            "pgc",
            "vault",
            "--type=merge",
            "-p",
            r#"{"spec":{"clusterSize":0}}"#,
        ],
    );
    let intruder = admin.file("intruder.yaml", &pgc("bank", "intruder"));
    forbidden(t, &token, &["apply", "-f", &intruder]);

    // The fleet's controls and the manager's identity.
    forbidden(t, &token, &["-n", "pgfleet-system", "get", "configmaps"]);
    forbidden(
        t,
        &token,
        &[
            "-n",
            "pgfleet-system",
            "create",
            "configmap",
            "forged",
            "--from-literal=a=b",
        ],
    );
    forbidden(
        t,
        &token,
        &[
            "-n",
            "pgfleet-system",
            "get",
            "secret",
            "pgfleet-manager-token",
        ],
    );

    // Its own namespace's guard rails: Pod Security label, RBAC.
    forbidden(
        t,
        &token,
        &[
            "label",
            "--overwrite",
            "namespace",
            "shop",
            "pod-security.kubernetes.io/enforce=privileged",
        ],
    );
    forbidden(
        t,
        &token,
        &[
            "-n",
            "shop",
            "create",
            "rolebinding",
            "escalate",
            "--clusterrole=cluster-admin",
            "--serviceaccount=shop:tenant-admin",
        ],
    );
    forbidden(
        t,
        &token,
        &[
            "-n",
            "shop",
            "create",
            "role",
            "more",
            "--verb=get",
            "--resource=secrets",
        ],
    );

    // A token Secret in the tenant's namespace naming the manager's
    // ServiceAccount (which lives in pgfleet-system) opens nothing: the
    // token controller only serves ServiceAccounts of the Secret's own
    // namespace.
    let forged = token_for(
        &admin,
        Some(&token),
        "shop",
        "pgfleet-manager",
        "borrowed-manager",
    );
    if !forged.is_empty() {
        refused(
            t,
            &forged,
            &["-n", "bank", "get", "secret", "vault-superuser"],
            true,
        );
        refused(t, &forged, &["get", "pods", "-A"], true);
    }

    drop(sim);
    drop(rt);
    let _ = std::fs::remove_dir_all(&dir);
}
