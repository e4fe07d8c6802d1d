//! The credential-leak test of `integration/api.rs`: recognisable secrets
//! (the API token, S3 keys in a credentials Secret, the member kubeconfig's
//! token, the generated PostgreSQL passwords) must appear nowhere in what
//! the manager printed (stdout and stderr, debug logs on) or answered, nor
//! in the CLI's output.

use super::bin::*;
use super::{ROLLOUT, TOKEN, token_file, wait_fleet};
use k8s_openapi::api::core::v1::{Namespace, Secret};
use kube::Api;
use kube::api::{ListParams, PostParams};
use pgfleet::crd::PostgresBackup;
use serde_json::{Value, json};

/// Every value of every Secret in `ns` (the generated PostgreSQL passwords
/// among them).
async fn secret_values(client: &kube::Client, ns: &str) -> Vec<String> {
    let mut out = vec![];
    for s in Api::<Secret>::namespaced(client.clone(), ns)
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
    {
        for v in s.data.unwrap_or_default().into_values() {
            out.push(String::from_utf8_lossy(&v.0).into_owned());
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_credential_in_output_or_answers() {
    let dir = temp_dir("leak");
    let tf = token_file(&dir, TOKEN);
    let s3 = r#"
[backups.repository.s3]
bucket = "canary-bucket"
endpoint = "https://127.0.0.1:9"
region = "us-east-1"
verify_tls = false
credentials_secret = "pg-backup-s3"
"#;
    let cfg = config(&dir, &["leak-a"], Some(&tf), &format!("{s3}{ROLLOUT}"));
    // The most verbose logs there are: a leak at any level counts.
    let m = ManagerBin::start(&dir, Some(&cfg), &[("PGFLEET_LOG", "debug")]);
    let kubeconfig = m.kubeconfig(&dir.join("state"), "leak-a");
    let client = client_from(&kubeconfig).await;

    // The S3 keys live in a credentials Secret in each PostgresCluster namespace.
    let key_id = "AKIACANARY5Q2W7E9R1T";
    let key_secret = "s3-secret-canary-Zq8xV3nB6mK1pL0a";
    for ns in ["shop", "reporting"] {
        let nss: Api<Namespace> = Api::all(client.clone());
        let _ = nss
            .create(
                &PostParams::default(),
                &serde_json::from_value(json!({"metadata": {"name": ns}})).unwrap(),
            )
            .await;
        let secret: Secret = serde_json::from_value(json!({
            "metadata": {"name": "pg-backup-s3", "namespace": ns},
            "stringData": {"AWS_ACCESS_KEY_ID": key_id, "AWS_SECRET_ACCESS_KEY": key_secret},
        }))
        .unwrap();
        Api::<Secret>::namespaced(client.clone(), ns)
            .create(&PostParams::default(), &secret)
            .await
            .unwrap();
    }
    wait_fleet(&m, &["leak-a"], 3).await;

    let mut answers = String::new();
    let bearer = format!("Bearer {TOKEN}");
    // Operations that touch the credentials: a backup to the S3 repository
    // (it fails: nothing listens there), a switchover, rollout commands.
    let (code, body) = m
        .post(
            "/api/v1/postgresclusters/leak-a/shop/orders/backup",
            Some(&bearer),
            "{}",
        )
        .await;
    assert_eq!(code, 201, "{body}");
    answers.push_str(&body);
    let name = serde_json::from_str::<Value>(&body).unwrap()["backup"]
        .as_str()
        .unwrap()
        .to_string();
    eventually("the S3 backup attempt ends or is retried", || async {
        let b = Api::<PostgresBackup>::namespaced(client.clone(), "shop")
            .get(&name)
            .await
            .unwrap();
        let st = b.status.unwrap_or_default();
        if st.phase.as_deref() == Some("Failed")
            || st.phase.as_deref() == Some("Completed")
            || st.attempts > 0
        {
            Ok(())
        } else {
            Err(format!("{st:?}"))
        }
    })
    .await;
    for (path, body) in [
        (
            "/api/v1/postgresclusters/leak-a/shop/orders/switchover",
            "{}",
        ),
        ("/api/v1/rollouts/r1/pause", "{}"),
        ("/api/v1/rollouts/r1/approve", r#"{"stage": "first"}"#),
    ] {
        let (_, b) = m.post(path, Some(&bearer), body).await;
        answers.push_str(&b);
    }
    for auth in [
        None,
        Some(format!("Bearer {TOKEN}x")),
        Some(format!("Basic {TOKEN}")),
        Some(TOKEN.to_string()),
    ] {
        let (_, b) = m
            .post("/api/v1/rollouts/r1/abort", auth.as_deref(), "{}")
            .await;
        answers.push_str(&b);
    }
    for path in [
        "/",
        "/healthz",
        "/readyz",
        "/metrics",
        "/api/v1/fleet",
        "/api/v1/clusters",
        "/api/v1/postgresclusters",
        "/api/v1/postgresclusters/leak-a/shop/orders",
        "/api/v1/rollouts",
        "/api/v1/rollouts/r1",
        "/api/v1/nope",
    ] {
        answers.push_str(&m.get(path).await.1);
    }
    let env = [("PGFLEET_API_TOKEN", TOKEN)];
    for args in [
        vec!["status", "--server", m.url.as_str()],
        vec!["status", "--server", m.url.as_str(), "-o", "json"],
        vec!["get", "pgc", "--server", m.url.as_str(), "-o", "json"],
        vec!["rollout", "status", "r1", "--server", m.url.as_str()],
        vec![
            "switchover",
            "leak-a/shop/inventory",
            "--to",
            "inventory-9",
            "--server",
            m.url.as_str(),
        ],
    ] {
        let (_, out, err) = cli(&dir, &args, &env);
        answers.push_str(&out);
        answers.push_str(&err);
    }

    // The secrets to look for.
    let mut secrets = vec![
        TOKEN.to_string(),
        key_id.to_string(),
        key_secret.to_string(),
    ];
    let kc = std::fs::read_to_string(&kubeconfig).unwrap();
    let kc_token = kc
        .lines()
        .find_map(|l| l.trim().strip_prefix("token:"))
        .map(|t| t.trim().to_string())
        .expect("the embedded kubeconfig holds a token");
    secrets.push(kc_token);
    let mut passwords = 0;
    for ns in ["shop", "reporting"] {
        for v in secret_values(&client, ns).await {
            if v.len() >= 12 && !secrets.contains(&v) {
                passwords += 1;
                secrets.push(v);
            }
        }
    }
    assert!(
        passwords >= 6,
        "expected the PostgreSQL passwords, found {passwords}"
    );

    let printed = m.output();
    assert!(
        printed.contains("member cluster connection changed"),
        "{printed}"
    );
    // The searched material is the real thing: fleet answers and refusals.
    assert!(answers.contains("orders") && answers.contains("wrong bearer token"));
    for s in &secrets {
        assert!(
            !printed.contains(s.as_str()),
            "a credential appears in the manager's output"
        );
        assert!(
            !answers.contains(s.as_str()),
            "a credential appears in an API or CLI answer"
        );
    }
}
