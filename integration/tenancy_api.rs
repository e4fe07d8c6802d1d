//! The manager's own HTTP edge, against the real `pgfleet run` binary
//! (embedded members on the virtual runtime), issue 19 findings 7 and 13:
//!
//! - a half-sent request is closed by the server (header-read timeout);
//! - more concurrent requests than `max_concurrent_requests` are answered
//!   503 at once, probes still answer, and the API recovers;
//! - concurrent unauthenticated fleet-wide reads cost one LIST per member,
//!   not one each (single flight);
//! - the placeholder token of deploy/manager, a short token, and plain HTTP
//!   on a non-loopback address stop `pgfleet run` with an error naming the
//!   key and never the token;
//! - path parameters that are not DNS-1123 names (`%2F`, `?`, `..`) are a
//!   JSON 400 naming the parameter, and nothing is created;
//! - the API over TLS: the CLI works given the CA, refuses a server it
//!   cannot verify, follows a renewed certificate; client certificates when
//!   the manager requires them; `--token` on the command line is refused.
//!
//! Outcomes only: nothing is timed beyond "eventually", with generous patience.
#![allow(clippy::unwrap_used)]

use crate::common::bin;
#[path = "tenancy_api/certs.rs"]
mod certs;

use bin::*;
use pgfleet::crd::PostgresBackup;
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const TOKEN: &str = "9c4e1a7f3b5d8e2c0a6f4b1d7e9c3a5f";

fn token_file(dir: &Path, token: &str) -> PathBuf {
    let p = dir.join("api-token");
    std::fs::write(&p, format!("{token}\n")).unwrap();
    p
}

/// Inserts `lines` into the `[manager]` table of a config from `config`.
fn with_manager(cfg: &Path, lines: &str) -> PathBuf {
    let text = std::fs::read_to_string(cfg).unwrap();
    std::fs::write(
        cfg,
        text.replacen("[manager]\n", &format!("[manager]\n{lines}\n"), 1),
    )
    .unwrap();
    cfg.to_path_buf()
}

/// Runs `pgfleet run` that must refuse to start; (exit code, everything printed).
fn refused(dir: &Path, cfg: &Path) -> (i32, String) {
    let out = dir.join("refused.log");
    let mut child = Command::new(env!("CARGO_BIN_EXE_pgfleet"))
        .args(["run", "--config"])
        .arg(cfg)
        .current_dir(dir)
        .env_remove("PGFLEET_CONFIG")
        .env_remove("PGFLEET_API_TOKEN")
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(dir.join("refused.out")).unwrap())
        .stderr(std::fs::File::create(&out).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + PATIENCE;
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "pgfleet run did not refuse to start:\n{}",
                std::fs::read_to_string(&out).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let printed = std::fs::read_to_string(&out).unwrap()
        + &std::fs::read_to_string(dir.join("refused.out")).unwrap();
    (status.code().unwrap_or(-1), printed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_half_sent_request_is_closed_by_the_server() {
    let dir = temp_dir("half-sent");
    let cfg = config(&dir, &["half-a"], None, "");
    let cfg = with_manager(&cfg, "header_read_timeout = \"2s\"");
    let m = ManagerBin::start(&dir, Some(&cfg), &[]);
    let mut s = tokio::net::TcpStream::connect(&m.addr).await.unwrap();
    s.write_all(b"GET /api/v1/fleet HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    // Eventually closed: read returns end of file (or a reset), never data.
    let mut buf = [0u8; 1024];
    let read = tokio::time::timeout(PATIENCE, s.read(&mut buf)).await;
    match read {
        Ok(Ok(n)) => assert!(
            n == 0 || String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 408"),
            "the server answered a half-sent request: {}",
            String::from_utf8_lossy(&buf[..n])
        ),
        Ok(Err(_)) => {} // reset: closed too
        Err(_) => panic!("the half-sent request is still open after {PATIENCE:?}"),
    }
    // The server itself is fine.
    assert_eq!(m.json("/healthz").await["status"], "ok");
}

/// Opens a POST with the token whose body never completes: its handler
/// holds one request slot until the connection goes away.
async fn held_request(addr: &str) -> tokio::net::TcpStream {
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    let head = format!(
        "POST /api/v1/rollouts/r1/pause HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\n\
         Content-Type: application/json\r\nContent-Length: 100\r\n\r\n{{"
    );
    s.write_all(head.as_bytes()).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_over_the_concurrency_limit_get_503_and_the_api_recovers() {
    let dir = temp_dir("limit");
    let tf = token_file(&dir, TOKEN);
    let rollout = "\n[rollouts.r1]\ntarget_version = \"15.20\"\n[[rollouts.r1.stages]]\nname = \"first\"\nclusters = \"env=test\"\n";
    let cfg = config(&dir, &["limit-a"], Some(&tf), rollout);
    let cfg = with_manager(
        &cfg,
        "max_concurrent_requests = 2\nrequest_timeout = \"10m\"",
    );
    let m = ManagerBin::start(&dir, Some(&cfg), &[]);
    let mut held = vec![held_request(&m.addr).await, held_request(&m.addr).await];
    // A held request the server answered (it never should: its body is
    // still coming) is reported and replaced, so the failure names it
    // instead of showing only the third request's 200.
    let mut answered_early = vec![];
    let deadline = Instant::now() + Duration::from_secs(90);
    let body = loop {
        for h in held.iter_mut() {
            let mut buf = [0u8; 512];
            let early = match h.try_read(&mut buf) {
                Ok(0) => Some("closed without an answer".to_string()),
                Ok(n) => Some(String::from_utf8_lossy(&buf[..n]).into_owned()),
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => None,
                Err(e) => Some(e.to_string()),
            };
            if let Some(what) = early {
                eprintln!("a held request was answered early: {what}");
                answered_early.push(what);
                *h = held_request(&m.addr).await;
            }
        }
        match m.get("/api/v1/clusters").await {
            (503, b) => break b,
            (c, b) => assert!(
                Instant::now() < deadline,
                "no 503 for a third request within 90 s (last: {c} {b}); \
                 held requests answered early: {answered_early:?}\n{}",
                m.output()
            ),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let v: Value = serde_json::from_str(&body).unwrap();
    assert!(
        v["error"]
            .as_str()
            .unwrap()
            .contains("max_concurrent_requests"),
        "{v}"
    );
    // Probes are not counted: a busy manager is not restarted.
    assert_eq!(m.get("/healthz").await.0, 200);
    drop(held);
    eventually("requests are served again", || async {
        match m.get("/api/v1/clusters").await {
            (200, b) => Ok(b),
            (c, b) => Err(format!("{c} {b}")),
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_fleet_reads_cost_one_list_per_member() {
    let dir = temp_dir("flight");
    let rollout = "\n[rollouts.r1]\ntarget_version = \"15.20\"\n[[rollouts.r1.stages]]\nname = \"first\"\nclusters = \"env=test\"\n";
    let path = config(&dir, &["flight-a"], None, rollout);
    let settings = pgfleet::config::load(Some(&path)).unwrap();
    let mgr = pgfleet::manager::start(&settings, true).await.unwrap();
    // No controller here (another replica's member): reads LIST the member.
    let hooks = pgfleet::api::Hooks::single(None, vec![]);
    let state = pgfleet::api::ApiState::new(&settings, mgr.fleet.clone(), None, hooks);
    let (addr, _server) = pgfleet::api::spawn("127.0.0.1:0".parse().unwrap(), state)
        .await
        .unwrap();
    let addr = addr.to_string();
    eventually("the member is Ready", || async {
        let (_, body) = http(&addr, "GET", "/api/v1/clusters", None, None).await;
        let v: Value = serde_json::from_str(&body).unwrap();
        if v["clusters"][0]["connectivity"] == "Ready" {
            Ok(())
        } else {
            Err(body)
        }
    })
    .await;
    let audit = &mgr.sim.as_ref().unwrap().clusters[0].cluster.audit;
    // Past the list caches' TTL, so every reader below finds them stale.
    tokio::time::sleep(Duration::from_secs(6)).await;
    audit.take();
    audit.start();
    let reads = (0..40).map(|i| {
        let addr = addr.clone();
        async move {
            let path = if i % 2 == 0 {
                "/api/v1/rollouts"
            } else {
                "/api/v1/fleet"
            };
            http(&addr, "GET", path, None, None).await
        }
    });
    let answers = futures::future::join_all(reads).await;
    audit.stop();
    for (code, body) in &answers {
        assert_eq!(*code, 200, "{body}");
    }
    let lists = audit
        .take()
        .into_iter()
        .filter(|r| r.attributes.verb == "list" && r.attributes.resource == "postgresclusters")
        .count();
    // 40 uncoalesced reads would LIST 40 times; coalesced they share a few
    // (one per cache and TTL; a slow machine may cross a TTL once or twice).
    assert!(lists <= 6, "{lists} LISTs of PostgresClusters for 40 reads");
    drop(mgr);
    let _ = std::fs::remove_dir_all(&dir);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn placeholder_short_and_inline_weak_tokens_are_refused_at_start_up() {
    let placeholder = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/deploy/manager/secrets/api-token"
    ))
    .unwrap();
    for (tag, token) in [
        ("placeholder", placeholder.trim()),
        ("short", "s3cr3t-but-short"),
    ] {
        let dir = temp_dir(tag);
        let tf = token_file(&dir, token);
        let cfg = config(&dir, &["weak-a"], Some(&tf), "");
        let (code, out) = refused(&dir, &cfg);
        assert_ne!(code, 0, "{out}");
        assert!(out.contains("manager.api_token_file"), "{tag}: {out}");
        assert!(out.contains(&tf.display().to_string()), "{tag}: {out}");
        assert!(!out.contains(token), "{tag}: the token was printed: {out}");
        assert!(!out.contains("API and dashboard on"), "{tag}: {out}");
    }
    let dir = temp_dir("inline");
    let cfg = config(&dir, &["weak-a"], None, "");
    let cfg = with_manager(&cfg, "api_token = \"hunter2hunter2\"");
    let (code, out) = refused(&dir, &cfg);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("manager.api_token"), "{out}");
    assert!(!out.contains("hunter2"), "the token was printed: {out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plain_http_on_a_non_loopback_address_is_refused() {
    let dir = temp_dir("plain");
    let cfg = config(&dir, &["plain-a"], None, "");
    let text = std::fs::read_to_string(&cfg)
        .unwrap()
        .replace("127.0.0.1:0", "0.0.0.0:0");
    std::fs::write(&cfg, text).unwrap();
    let (code, out) = refused(&dir, &cfg);
    assert_ne!(code, 0, "{out}");
    assert!(out.contains("manager.listen"), "{out}");
    assert!(out.contains("tls_cert_file"), "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn path_parameters_that_are_not_names_are_refused() {
    let dir = temp_dir("params");
    let tf = token_file(&dir, TOKEN);
    let cfg = config(&dir, &["param-a"], Some(&tf), "");
    let m = ManagerBin::start(&dir, Some(&cfg), &[]);
    let bearer = format!("Bearer {TOKEN}");
    let base = "/api/v1/postgresclusters";
    for (path, param) in [
        (format!("{base}/param-a/shop/x%2F..%2Fy"), "name"),
        (format!("{base}/param-a/shop/x%3F"), "name"),
        (format!("{base}/param-a/shop/.."), "name"),
        (
            format!("{base}/param-a/kube-system%2Fsecrets/x"),
            "namespace",
        ),
        (format!("{base}/param-a%3Fx/shop/x"), "cluster"),
    ] {
        for (method, p) in [("GET", path.clone()), ("POST", format!("{path}/backup"))] {
            let (code, body) = http(&m.addr, method, &p, Some(&bearer), Some("{}")).await;
            assert_eq!(code, 400, "{method} {p}: {body}");
            let v: Value = serde_json::from_str(&body).unwrap();
            let msg = v["error"].as_str().unwrap();
            assert!(
                msg.starts_with(&format!("path parameter {param} ")),
                "{method} {p}: {msg}"
            );
        }
    }
    // Nothing was created anywhere on the member.
    let client = client_from(&m.kubeconfig(&dir.join("state"), "param-a")).await;
    let backups: kube::Api<PostgresBackup> = kube::Api::all(client);
    assert!(
        backups
            .list(&Default::default())
            .await
            .unwrap()
            .items
            .is_empty()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_api_over_tls_with_the_cli() {
    let dir = temp_dir("tls");
    let ca = certs::Ca::new("pgfleet test CA");
    let ca_file = ca.write(&dir.join("ca.pem"));
    let (crt, key) = ca.leaf(&dir, "tls", &["127.0.0.1", "localhost"]);
    let cfg = config(&dir, &["tls-a"], None, "");
    let cfg = with_manager(
        &cfg,
        &format!(
            "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"",
            crt.display(),
            key.display()
        ),
    );
    let m = ManagerBin::start(&dir, Some(&cfg), &[]);
    assert!(m.url.starts_with("https://"), "{}", m.url);
    let ca_arg = ca_file.display().to_string();
    let get = |ca: Option<&str>| {
        let mut args = vec!["get", "clusters", "-o", "json", "--server", m.url.as_str()];
        if let Some(ca) = ca {
            args.extend(["--ca-file", ca]);
        }
        cli(&dir, &args, &[])
    };
    let (code, out, err) = get(Some(&ca_arg));
    assert_eq!(code, 0, "{out}{err}");
    let v: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["clusters"][0]["name"], "tls-a");

    // Without the CA the server cannot be verified: refused, nothing read.
    let (code, out, err) = get(None);
    assert_ne!(code, 0, "{out}");
    assert!(out.is_empty(), "{out}");
    assert!(err.to_lowercase().contains("certificate"), "{err}");
    // Plain HTTP to the TLS port gets no answer.
    let plain = m.url.replace("https://", "http://");
    let (code, _, _) = cli(&dir, &["get", "clusters", "--server", &plain], &[]);
    assert_ne!(code, 0);

    // A renewed certificate from another CA is picked up without a restart.
    let ca2 = certs::Ca::new("pgfleet test CA 2");
    let ca2_file = ca2.write(&dir.join("ca2.pem"));
    let (crt2, key2) = ca2.leaf(&dir, "tls2", &["127.0.0.1"]);
    std::fs::copy(&key2, &key).unwrap();
    std::fs::copy(&crt2, &crt).unwrap();
    let ca2_arg = ca2_file.display().to_string();
    eventually("the renewed certificate is served", || async {
        match get(Some(&ca2_arg)) {
            (0, out, _) => Ok(out),
            (c, out, err) => Err(format!("{c} {out}{err}")),
        }
    })
    .await;

    // The token is never taken from the command line.
    let (code, out, err) = cli(
        &dir,
        &[
            "backup",
            "now",
            "tls-a/shop/orders",
            "--server",
            &m.url,
            "--ca-file",
            &ca2_arg,
            "--token",
            "s3cr3t-on-argv",
        ],
        &[],
    );
    assert_ne!(code, 0, "{out}");
    assert!(err.contains("--token-file"), "{err}");
    assert!(!err.contains("s3cr3t-on-argv"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_certificates_when_the_manager_requires_them() {
    let dir = temp_dir("mtls");
    let ca = certs::Ca::new("pgfleet server CA");
    let ca_file = ca.write(&dir.join("ca.pem"));
    let (crt, key) = ca.leaf(&dir, "tls", &["127.0.0.1"]);
    let clients = certs::Ca::new("pgfleet client CA");
    let clients_file = clients.write(&dir.join("clients.pem"));
    let (ccrt, ckey) = clients.leaf(&dir, "operator", &["operator"]);
    let cfg = config(&dir, &["mtls-a"], None, "");
    let cfg = with_manager(
        &cfg,
        &format!(
            "tls_cert_file = \"{}\"\ntls_key_file = \"{}\"\ntls_client_ca_file = \"{}\"",
            crt.display(),
            key.display(),
            clients_file.display()
        ),
    );
    let m = ManagerBin::start(&dir, Some(&cfg), &[]);
    let ca_arg = ca_file.display().to_string();
    let base = [
        "get",
        "clusters",
        "--server",
        m.url.as_str(),
        "--ca-file",
        ca_arg.as_str(),
    ];
    let (code, out, _) = cli(&dir, &base, &[]);
    assert_ne!(code, 0, "served without a client certificate: {out}");
    let (c, k) = (ccrt.display().to_string(), ckey.display().to_string());
    let mut with = base.to_vec();
    with.extend(["--client-cert", c.as_str(), "--client-key", k.as_str()]);
    let (code, out, err) = cli(&dir, &with, &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("mtls-a"), "{out}");
}
