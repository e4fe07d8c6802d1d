//! The authorization and authentication review APIs of the embedded API
//! server, through the real kubectl: `auth can-i`, `auth can-i --list` and
//! `auth whoami`, as the administrator and as the member's service account
//! (deploy/member applied, its token from the token controller).
#![allow(clippy::unwrap_used)]

use crate::common;
#[allow(dead_code)]
use crate::kubectl;

use common::temp_dir;
use kubectl::Kubectl;
use pgfleet::sim::{self, RuntimeKind, SimOptions};
use serde_json::Value;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

const SA_USER: &str = "system:serviceaccount:pgfleet-system:pgfleet-manager";

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn sim_options(dir: &Path) -> SimOptions {
    SimOptions {
        dir: dir.to_path_buf(),
        names: vec!["m1".into()],
        runtime: RuntimeKind::None,
        persist: false,
        history: 10_000,
        admin: false,
        images: Vec::new(),
        run_as: None,
        nodes: Default::default(),
    }
}

/// The manager's token, once the token controller has filled it in.
fn manager_token(admin: &Kubectl) -> String {
    for _ in 0..100 {
        let b64 = admin.ok(&[
            "-n",
            "pgfleet-system",
            "get",
            "secret",
            "pgfleet-manager-token",
            "-o",
            "jsonpath={.data.token}",
        ]);
        if !b64.trim().is_empty() {
            use base64::Engine as _;
            let raw = base64::engine::general_purpose::STANDARD
                .decode(b64.trim())
                .unwrap();
            return String::from_utf8(raw).unwrap();
        }
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    panic!("the token controller issued no token");
}

/// One row of `kubectl auth can-i --list`: (resource, resource names) →
/// verbs. kubectl merges rules that name the same resource and names.
type Rows = BTreeMap<(String, String), BTreeSet<String>>;

fn words(list: &str) -> BTreeSet<String> {
    list.trim_matches(|c| c == '[' || c == ']')
        .split_whitespace()
        .map(String::from)
        .collect()
}

/// The resource rows of `kubectl auth can-i --list` output.
fn listed(out: &str) -> Rows {
    let mut rows = Rows::new();
    for line in out.lines().skip(1) {
        let cols: Vec<&str> = line
            .split("   ")
            .map(str::trim)
            .filter(|c| !c.is_empty())
            .collect();
        // Resources, Non-Resource URLs, Resource Names, Verbs; the
        // non-resource rows have an empty first column.
        if cols.len() != 4 {
            continue;
        }
        let names = words(cols[2]).into_iter().collect::<Vec<_>>().join(" ");
        rows.entry((cols[0].to_string(), names))
            .or_default()
            .extend(words(cols[3]));
    }
    rows
}

/// The rows deploy/member's ClusterRole and Role (in pgfleet-system) should
/// produce, plus what every authenticated user holds (system:basic-user).
fn expected() -> Rows {
    let text = std::fs::read_to_string(repo().join("deploy/member/rbac.yaml")).unwrap();
    let mut rules: Vec<Value> = vec![];
    for doc in serde_yaml::Deserializer::from_str(&text) {
        let v: Value = serde::Deserialize::deserialize(doc).unwrap();
        if matches!(v["kind"].as_str(), Some("ClusterRole" | "Role")) {
            rules.extend(v["rules"].as_array().unwrap().iter().cloned());
        }
    }
    rules.push(serde_json::json!({"apiGroups": ["authorization.k8s.io"],
        "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"], "verbs": ["create"]}));
    rules.push(serde_json::json!({"apiGroups": ["authentication.k8s.io"],
        "resources": ["selfsubjectreviews"], "verbs": ["create"]}));
    let strs = |v: &Value| -> Vec<String> {
        v.as_array()
            .map(|a| {
                a.iter()
                    .filter_map(Value::as_str)
                    .map(String::from)
                    .collect()
            })
            .unwrap_or_default()
    };
    let mut rows = Rows::new();
    for r in rules {
        // kubectl shows one row per resource name, and a subresource
        // after the group (`postgresclusters.pgfleet.io/status`).
        let mut names = strs(&r["resourceNames"]);
        if names.is_empty() {
            names.push(String::new());
        }
        for g in strs(&r["apiGroups"]) {
            for res in strs(&r["resources"]) {
                let (base, sub) = match res.split_once('/') {
                    Some((b, s)) => (b.to_string(), format!("/{s}")),
                    None => (res.clone(), String::new()),
                };
                let shown = if g.is_empty() {
                    res.clone()
                } else {
                    format!("{base}.{g}{sub}")
                };
                for n in &names {
                    rows.entry((shown.clone(), n.clone()))
                        .or_default()
                        .extend(strs(&r["verbs"]));
                }
            }
        }
    }
    rows
}

#[test]
fn kubectl_auth_answers_from_the_emulated_rbac() {
    let dir = temp_dir("sim-authz");
    let rt = tokio::runtime::Runtime::new().unwrap();
    let sim = rt
        .block_on(sim::start(&sim_options(&dir.join("sim"))))
        .unwrap();
    let admin = Kubectl::new(&sim.clusters[0].kubeconfig, &dir);
    admin.ok(&[
        "apply",
        "--server-side",
        "-k",
        &repo().join("deploy/member").to_string_lossy(),
    ]);
    let token = manager_token(&admin);
    let sa = |args: &[&str]| {
        let mut all = vec!["--token", token.as_str()];
        all.extend_from_slice(args);
        all.iter().map(|s| s.to_string()).collect::<Vec<_>>()
    };
    let run = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        admin.ok(&refs)
    };
    let refused = |args: Vec<String>| {
        let refs: Vec<&str> = args.iter().map(String::as_str).collect();
        admin.fails(&refs)
    };

    // The review kinds are in discovery, create-only.
    let resources = admin.ok(&[
        "api-resources",
        "--api-group=authorization.k8s.io",
        "-o",
        "wide",
    ]);
    assert!(
        resources.contains("selfsubjectaccessreviews"),
        "{resources}"
    );
    assert!(resources.contains("selfsubjectrulesreviews"), "{resources}");
    let line = resources
        .lines()
        .find(|l| l.starts_with("subjectaccessreviews"))
        .unwrap_or_else(|| panic!("{resources}"));
    assert_eq!(line.split_whitespace().last(), Some("create"), "{line}");

    // The administrator may do anything.
    assert_eq!(
        admin
            .ok(&["auth", "can-i", "create", "pods", "-n", "x"])
            .trim(),
        "yes"
    );
    assert_eq!(
        admin.ok(&["auth", "can-i", "delete", "nodes"]).trim(),
        "yes"
    );

    // The service account: what deploy/member grants, nothing more.
    for (args, want) in [
        (vec!["auth", "can-i", "create", "pods", "-n", "x"], "yes"),
        (
            vec![
                "auth",
                "can-i",
                "get",
                "pods",
                "--subresource=exec",
                "-n",
                "x",
            ],
            "yes",
        ),
        (vec!["auth", "can-i", "update", "pods", "-n", "x"], "no"),
        (vec!["auth", "can-i", "get", "nodes"], "no"),
        (
            vec!["auth", "can-i", "get", "leases", "-n", "pgfleet-system"],
            "yes",
        ),
        (vec!["auth", "can-i", "get", "leases", "-n", "x"], "no"),
        (
            vec!["auth", "can-i", "patch", "namespace/pgfleet-system"],
            "yes",
        ),
        (vec!["auth", "can-i", "patch", "namespace/shop"], "no"),
    ] {
        let args = sa(&args);
        let shown = args[2..].join(" ");
        if want == "yes" {
            assert_eq!(run(args).trim(), "yes", "kubectl {shown}");
        } else {
            // `can-i` answers "no" with exit code 1.
            let (code, _) = refused(args);
            assert_eq!(code, 1, "kubectl {shown}");
        }
    }

    // `--list` in pgfleet-system: exactly the ClusterRole's and the Role's
    // rules (and the default self reviews every user holds).
    let out = run(sa(&["auth", "can-i", "--list", "-n", "pgfleet-system"]));
    assert_eq!(listed(&out), expected(), "{out}");
    assert!(out.contains("[/api/*]"), "{out}");

    // whoami, as each.
    let who = run(sa(&["auth", "whoami", "-o", "json"]));
    let v: Value = serde_json::from_str(&who).unwrap();
    assert_eq!(v["status"]["userInfo"]["username"], SA_USER, "{who}");
    let groups = v["status"]["userInfo"]["groups"].to_string();
    assert!(
        groups.contains("system:serviceaccounts:pgfleet-system"),
        "{who}"
    );
    let uid = admin.ok(&[
        "-n",
        "pgfleet-system",
        "get",
        "sa",
        "pgfleet-manager",
        "-o",
        "jsonpath={.metadata.uid}",
    ]);
    assert_eq!(v["status"]["userInfo"]["uid"], uid.trim(), "{who}");
    let table = admin.ok(&["auth", "whoami"]);
    assert!(table.contains("system:masters"), "{table}");

    // A SubjectAccessReview about the manager needs a grant it lacks, and
    // the administrator gets the authorizer's reason.
    let sar = admin.file(
        "sar.json",
        &format!(
            r#"{{"apiVersion":"authorization.k8s.io/v1","kind":"SubjectAccessReview","spec":{{"user":"{SA_USER}","groups":["system:serviceaccounts"],"resourceAttributes":{{"verb":"create","resource":"pods","namespace":"x"}}}}}}"#
        ),
    );
    let out = admin.ok(&["create", "-f", &sar, "-o", "json"]);
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["status"]["allowed"], true, "{out}");
    assert!(
        v["status"]["reason"]
            .as_str()
            .unwrap()
            .contains("ClusterRoleBinding \"pgfleet-manager\""),
        "{out}"
    );
    let (_, err) = refused(sa(&["create", "-f", &sar]));
    assert!(err.contains("forbidden"), "{err}");
    // Not stored: there is nothing to get.
    let (_, err) = admin.fails(&["get", "selfsubjectaccessreviews"]);
    assert!(
        err.contains("405") || err.contains("not allowed") || err.contains("NotAllowed"),
        "{err}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
