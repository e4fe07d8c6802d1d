//! Issue 19, hostile specs (findings 4, 5, 8 and the echoed value of 13):
//! a tenant's parameters and pg_hba lines are checked against an allowlist
//! and for line breaks before anything is rendered, oversized specs are
//! refused by the API server, nothing huge travels into conditions or
//! events, and passwords with quotes, colons and backslashes work end to
//! end with real PostgreSQL. Every test talks to the embedded Kubernetes
//! over real HTTP and checks objects, not log lines.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::fleet;

use crate::common::process as env;

use fleet::*;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Secret};
use kube::Api;
use kube::api::PostParams;
use pgfleet::crd::PostgresCluster;
use serde_json::{Value, json};
use std::time::Duration;

const M: &str = "member-1";

fn spec(size: u32) -> Value {
    json!({"clusterSize": size, "version": "15.20", "storage": {"size": "1Gi"},
           "postgresql": {"parameters": {"work_mem": "4MB"}}})
}

/// Waits for Invalid=True naming `needle`, for the latest generation.
async fn wait_invalid(api: &Api<PostgresCluster>, needle: &str) -> PostgresCluster {
    eventually(&format!("condition Invalid=True naming {needle}"), || {
        let api = api.clone();
        async move {
            let pg = api.get("orders").await.map_err(|e| e.to_string())?;
            let st = pg.status.clone().unwrap_or_default();
            match condition(&pg, "Invalid") {
                Some(c)
                    if c.status == "True"
                        && c.message.contains(needle)
                        && st.observed_generation == pg.metadata.generation =>
                {
                    Ok(pg)
                }
                _ => Err(serde_json::to_string(&st).unwrap_or_default()),
            }
        }
    })
    .await
}

/// The rendered files of the cluster's ConfigMap.
async fn config(client: &kube::Client) -> (String, String) {
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "shop")
        .get("orders-config")
        .await
        .unwrap();
    let data = cm.data.unwrap();
    (data["postgresql.conf"].clone(), data["pg_hba.conf"].clone())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_parameters_and_hba_lines_are_invalid_and_running_instances_untouched() {
    let f = TestFleet::start("hostile-params", &[M]).await;
    let client = f.client(M);
    let api = f.pgc(M, "shop");
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    f.create(M, "shop", "orders", spec(2)).await;
    f.wait_healthy(M, "shop", "orders", 2).await;
    let before = uids(&instance_pods(&pods, "orders").await);
    let files = config(&client).await;

    // Each hostile entry alone: Invalid naming it, nothing rendered.
    let cases: Vec<(Value, &str)> = vec![
        (
            json!({"parameters": {"work_mem": "8MB\nshared_preload_libraries = 'evil'"}}),
            "spec.postgresql.parameters.work_mem: value contains a control character",
        ),
        (
            json!({"parameters": {"archive_library": "evil"}}),
            "spec.postgresql.parameters.archive_library",
        ),
        (
            json!({"parameters": {"include_if_exists": "/etc/evil.conf"}}),
            "spec.postgresql.parameters.include_if_exists",
        ),
        (
            json!({"parameters": {"shared_preload_libraries": "evil"}}),
            "spec.postgresql.parameters.shared_preload_libraries",
        ),
        (
            json!({"parameters": {"archive_cleanup_command": "touch /tmp/pwned"}}),
            "spec.postgresql.parameters.archive_cleanup_command",
        ),
        (
            json!({"pgHba": ["host all all 0.0.0.0/0 md5\rlocal all all trust"]}),
            "spec.postgresql.pgHba[0]: contains a control character",
        ),
        (
            json!({"pgHba": ["host all all 10.0.0.0/8 md5", "include /etc/evil"]}),
            "spec.postgresql.pgHba[1]: `include` directives are not allowed",
        ),
    ];
    for (postgresql, needle) in cases {
        let mut patch = json!({"spec": {"postgresql": postgresql.clone()}});
        f.patch(M, "shop", "orders", patch.clone()).await;
        let pg = wait_invalid(&api, needle).await;
        let st = pg.status.clone().unwrap();
        assert_eq!(st.phase, Some(pgfleet::crd::Phase::Invalid));
        let msg = &condition(&pg, "Invalid").unwrap().message;
        assert!(!msg.contains("evil") && !msg.contains("pwned"), "{msg}");
        assert_eq!(config(&client).await, files, "ConfigMap unchanged");
        assert_eq!(
            uids(&instance_pods(&pods, "orders").await),
            before,
            "pods untouched"
        );
        let evs = events_about(&client, "shop", "orders").await;
        assert!(
            evs.iter()
                .any(|(r, n)| r == "InvalidSpec" && n.contains(needle)),
            "{evs:?}"
        );
        // Take the entry out again (merge patch: null removes a key).
        if let Some(p) = postgresql.get("parameters").and_then(Value::as_object) {
            for k in p.keys() {
                patch["spec"]["postgresql"]["parameters"][k] = Value::Null;
            }
            patch["spec"]["postgresql"]["parameters"]["work_mem"] = json!("4MB");
        } else {
            patch["spec"]["postgresql"]["pgHba"] = json!([]);
        }
        f.patch(M, "shop", "orders", patch).await;
        let pg = f.wait_healthy(M, "shop", "orders", 2).await;
        assert_eq!(condition(&pg, "Invalid").unwrap().status, "False");
    }
    assert_eq!(uids(&instance_pods(&pods, "orders").await), before);

    // Allowed values with quotes and backslashes render on their own line
    // and are reloaded.
    f.patch(
        M,
        "shop",
        "orders",
        json!({"spec": {"postgresql": {"parameters": {"log_line_prefix": "it's \\ %m "},
               "pgHba": ["host all all 10.0.0.0/8 scram-sha-256"]}}}),
    )
    .await;
    f.wait_healthy(M, "shop", "orders", 2).await;
    let (conf, hba) = eventually("the new configuration rendered", || {
        let client = client.clone();
        async move {
            let (conf, hba) = config(&client).await;
            if conf.contains("log_line_prefix") {
                Ok((conf, hba))
            } else {
                Err(conf)
            }
        }
    })
    .await;
    assert!(
        conf.lines()
            .any(|l| l == r"log_line_prefix = 'it''s \\ %m '"),
        "{conf}"
    );
    // The tenant's rule comes before pgfleet's own (only the superuser's
    // reject rules, enableSuperuserAccess off, come before it).
    let lines: Vec<&str> = hba.lines().collect();
    let tenant = lines
        .iter()
        .position(|l| *l == "host all all 10.0.0.0/8 scram-sha-256");
    let own = lines.iter().position(|l| *l == "local all all trust");
    assert!(tenant.is_some() && tenant < own, "{hba}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_specs_are_refused_and_nothing_huge_is_echoed() {
    let f = TestFleet::start("oversized", &[M]).await;
    let client = f.client(M);
    f.namespace(M, "shop").await;
    let api = f.pgc(M, "shop");
    let too_many: serde_json::Map<String, Value> =
        (0..65).map(|i| (format!("p{i}"), json!("1"))).collect();
    let hostile: Vec<(&str, Value)> = vec![
        (
            "65 parameters",
            json!({"postgresql": {"parameters": too_many}}),
        ),
        (
            "a 2000-character parameter value",
            json!({"postgresql": {"parameters": {"search_path": "x".repeat(2000)}}}),
        ),
        (
            "65 pg_hba lines",
            json!({"postgresql": {"pgHba": vec!["host all all all md5"; 65]}}),
        ),
        (
            "a 1000-character pg_hba line",
            json!({"postgresql": {"pgHba": [format!("host all all all md5 {}", "x".repeat(1000))]}}),
        ),
        ("a 600-character image", json!({"image": "i".repeat(600)})),
        (
            "a 5 MB failoverDelay",
            json!({"failoverDelay": "9".repeat(5 << 20)}),
        ),
        // Over maxLength and not matching the pattern: only "Too long", as a
        // real API server answers, never the value itself.
        ("a 5 MB version", json!({"version": "v".repeat(5 << 20)})),
    ];
    for (what, extra) in hostile {
        let mut s = spec(1);
        for (k, v) in extra.as_object().unwrap() {
            s[k] = v.clone();
        }
        let err = api
            .create(&PostParams::default(), &pgc_object("orders", s))
            .await
            .expect_err(what);
        match &err {
            kube::Error::Api(s) => {
                assert_eq!(s.code, 422, "{what}: {s:?}");
                assert!(s.message.len() < 4096, "{what}: message echoes the value");
            }
            other => panic!("{what}: expected 422, got {other}"),
        }
        assert!(api.get_opt("orders").await.unwrap().is_none(), "{what}");
    }

    // Within the schema's bounds but wrong: the condition and the event say
    // which field, repeat at most a short head of the value, and stay
    // under an Event's 1 KiB.
    let mut s = spec(1);
    s["failoverDelay"] = json!("y".repeat(32));
    let mut params = serde_json::Map::new();
    for i in 0..40 {
        params.insert(format!("{}{i}", "n".repeat(3000)), json!("z".repeat(1024)));
    }
    s["postgresql"]["parameters"] = Value::Object(params);
    f.create(M, "shop", "orders", s).await;
    let pg = wait_invalid(&api, "spec.failoverDelay").await;
    let msg = condition(&pg, "Invalid").unwrap().message.clone();
    assert!(msg.len() < 1024, "{} bytes: {msg}", msg.len());
    assert!(msg.contains("more problems"), "{msg}");
    assert!(!msg.contains(&"n".repeat(100)), "{msg}");
    assert!(!msg.contains("zzz"), "{msg}");
    let evs = events_about(&client, "shop", "orders").await;
    let note = evs
        .iter()
        .find(|(r, _)| r == "InvalidSpec")
        .map(|(_, n)| n.clone())
        .unwrap_or_else(|| panic!("no InvalidSpec event: {evs:?}"));
    assert!(note.len() < 1024, "{note}");
    // Nothing was created for it.
    let kids = child_names(&client, "shop", "orders").await;
    assert!(kids.pods.is_empty() && kids.pvcs.is_empty(), "{kids:?}");
}

/// Real PostgreSQL (process runtime): credentials with `'`, `:`, `\` and
/// `"` (Secrets created before the cluster; pgfleet keeps existing ones)
/// initialise the instance, the replica clones and streams with the
/// replication password through .pgpass, and the superuser logs in. A
/// parameter value with a quote and a backslash reaches PostgreSQL intact.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn passwords_with_quotes_colons_and_backslashes_work_end_to_end() {
    use env::{Env, NS, connect};
    let e = Env::start("tenancy-pw").await;
    let superuser = r#"su'p:er\pw"x"#;
    let replication = r#"re'p:l\pw"y"#;
    for (which, user, pw) in [
        ("superuser", "postgres", superuser),
        ("replication", "replicator", replication),
    ] {
        let s: Secret = serde_json::from_value(json!({
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": format!("orders-{which}"), "namespace": NS},
            "type": "kubernetes.io/basic-auth",
            "stringData": {"username": user, "password": pw},
        }))
        .unwrap();
        Api::<Secret>::namespaced(e.client.clone(), NS)
            .create(&PostParams::default(), &s)
            .await
            .unwrap();
    }
    let prefix = r"%m it's a \ ";
    e.create(
        "orders",
        json!({"clusterSize": 2, "version": "15", "storage": {"size": "1Gi"},
               "postgresql": {"parameters": {"log_line_prefix": prefix}}}),
    )
    .await;
    e.wait_healthy("orders", 2).await;
    assert_eq!(e.password("orders").await, superuser, "the Secret was kept");
    let rw = e.service_ip("orders-rw").await;
    let mut streaming = 0;
    let mut shown = String::new();
    for _ in 0..300 {
        if let Ok(c) = connect(&rw, 5432, superuser).await {
            shown = c
                .query_one("SHOW log_line_prefix", &[])
                .await
                .map(|r| r.get::<_, String>(0))
                .unwrap_or_default();
            streaming = c
                .query_one(
                    "SELECT count(*) FROM pg_stat_replication WHERE usename = 'replicator' AND state = 'streaming'",
                    &[],
                )
                .await
                .map(|r| r.get::<_, i64>(0))
                .unwrap_or_default();
            if streaming == 1 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(streaming, 1, "the replica streams as replicator");
    assert_eq!(shown, prefix);
    assert!(
        connect(&rw, 5432, "wrong").await.is_err(),
        "the password is checked"
    );
}
