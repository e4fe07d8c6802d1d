//! The dashboard in a real browser: Debian's headless Chromium loads `/`
//! from a running `pgfleet run` (embedded members, virtual runtime), and the
//! rendered DOM must show the member clusters and their PostgresClusters
//! with their health, the switchover on the failover timeline, backup
//! freshness and the rollout's stages. A PostgresCluster created afterwards
//! must appear in a later render (the page polls the API). A screenshot is
//! saved to `<target dir>/test-artefacts/dashboard.png`.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::bin;

use bin::*;
use kube::Api;
use kube::api::PostParams;
use pgfleet::crd::PostgresCluster;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "dashboard-test-token-5e1c9a7f3b2d8e04";
const ROLLOUT: &str = r#"
[rollouts.r1]
target_version = "15.20"
[[rollouts.r1.stages]]
name = "first"
clusters = "env=test"
"#;

/// The Chromium binary, or a failure that says how to get it.
fn chromium() -> PathBuf {
    if let Some(p) = std::env::var_os("CHROMIUM") {
        return PathBuf::from(p);
    }
    for name in ["chromium", "chromium-browser", "google-chrome"] {
        for dir in std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()) {
            let p = dir.join(name);
            if p.is_file() {
                return p;
            }
        }
    }
    panic!(
        "the dashboard test needs headless Chromium: install the Debian package \
         (`apt-get install chromium`; integration/run-tests.sh does it in CI) \
         or point CHROMIUM at a Chrome/Chromium binary"
    );
}

/// Runs headless Chromium on `url` with `extra` flags; its stdout.
fn browser(profile: &Path, url: &str, extra: &[&str]) -> String {
    let mut child = Command::new(chromium())
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-dev-shm-usage",
            "--no-first-run",
            "--hide-scrollbars",
            "--window-size=1400,1000",
            // Lets the page's polling run: the budget is virtual time.
            "--virtual-time-budget=6000",
        ])
        .arg(format!("--user-data-dir={}", profile.display()))
        .args(extra)
        .arg(url)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting chromium");
    let deadline = Instant::now() + PATIENCE;
    loop {
        if child.try_wait().unwrap().is_some() {
            break;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("chromium did not finish rendering {url}");
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut out = String::new();
    std::io::Read::read_to_string(&mut child.stdout.take().unwrap(), &mut out).unwrap();
    out
}

/// `<target dir>/test-artefacts`, found from this test binary's path
/// (`<target>/debug/deps/dashboard-…`), so it follows CARGO_TARGET_DIR.
fn artefacts() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let target = exe
        .ancestors()
        .nth(3)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("target"));
    let dir = target.join("test-artefacts");
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// The element with `attr="value"`: its opening tag, as rendered.
fn tag_with<'a>(dom: &'a str, attr: &str, value: &str) -> Option<&'a str> {
    let needle = format!("{attr}=\"{value}\"");
    let at = dom.find(&needle)?;
    let start = dom[..at].rfind('<')?;
    let end = at + dom[at..].find('>')?;
    Some(&dom[start..=end])
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_renders_the_fleet_and_follows_changes() {
    let chromium_bin = chromium();
    let dir = temp_dir("dashboard");
    let tf = dir.join("api-token");
    std::fs::write(&tf, TOKEN).unwrap();
    let cfg = config(&dir, &["dash-a", "dash-b"], Some(&tf), ROLLOUT);
    let m = ManagerBin::start(&dir, Some(&cfg), &[]);
    eventually(
        "both members Ready with 3 Healthy PostgresClusters",
        || async {
            let f = m.json("/api/v1/fleet").await;
            let n = f["phases"]["Healthy"].as_u64().unwrap_or(0);
            if n == 6 { Ok(()) } else { Err(f.to_string()) }
        },
    )
    .await;
    // Something for the failover timeline and the backup table.
    let bearer = format!("Bearer {TOKEN}");
    let (code, body) = m
        .post(
            "/api/v1/postgresclusters/dash-a/shop/orders/switchover",
            Some(&bearer),
            "{}",
        )
        .await;
    assert_eq!(code, 202, "{body}");
    let (code, body) = m
        .post(
            "/api/v1/postgresclusters/dash-b/shop/orders/backup",
            Some(&bearer),
            "{}",
        )
        .await;
    assert_eq!(code, 201, "{body}");
    eventually("the switchover and the backup are recorded", || async {
        let f = m.json("/api/v1/fleet").await;
        let pgcs = f["postgresclusters"].as_array().unwrap();
        let switched = pgcs.iter().any(|p| {
            p["member"] == "dash-a" && p["name"] == "orders" && p["lastSwitchover"].is_object()
        });
        let backed = pgcs.iter().any(|p| {
            p["member"] == "dash-b" && p["name"] == "orders" && p["lastBackup"]["at"].is_string()
        });
        if switched && backed {
            Ok(())
        } else {
            Err(f.to_string())
        }
    })
    .await;

    let url = format!("{}/", m.url);
    let profile = dir.join("chromium");
    let dom = eventually("the dashboard shows the fleet", || async {
        let dom = browser(&profile, &url, &["--dump-dom"]);
        let complete = ["dash-a", "dash-b"].iter().all(|mb| {
            tag_with(&dom, "data-member", mb)
                .is_some_and(|t| t.contains("data-connectivity=\"Ready\""))
                && ["reporting/analytics", "shop/inventory", "shop/orders"]
                    .iter()
                    .all(|p| {
                        tag_with(&dom, "data-pgc", &format!("{mb}/{p}"))
                            .is_some_and(|t| t.contains("data-health=\"healthy\""))
                    })
        }) && dom.contains("data-event=\"switchover\"")
            && dom.contains("data-rollout=\"r1\"")
            && dom.contains("data-stage=\"first\"");
        if complete { Ok(dom) } else { Err(dom) }
    })
    .await;
    // Backup freshness: the fresh backup is ok, the others never ran.
    assert!(
        dom.contains("data-freshness=\"ok\""),
        "no fresh backup shown"
    );
    assert!(
        dom.contains("data-freshness=\"critical\""),
        "missing backups not flagged"
    );
    assert!(!dom.contains("data-pgc=\"dash-b/shop/newdb\""));

    // A new PostgresCluster appears in a later render.
    let client = client_from(&m.kubeconfig(&dir.join("state"), "dash-b")).await;
    let pg: PostgresCluster = serde_json::from_value(json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
        "metadata": {"name": "newdb", "namespace": "shop"},
        "spec": {"clusterSize": 1, "version": "15.20", "storage": {"size": "1Gi"}},
    }))
    .unwrap();
    Api::<PostgresCluster>::namespaced(client, "shop")
        .create(&PostParams::default(), &pg)
        .await
        .unwrap();
    eventually(
        "the new PostgresCluster appears on the dashboard",
        || async {
            let dom = browser(&profile, &url, &["--dump-dom"]);
            match tag_with(&dom, "data-pgc", "dash-b/shop/newdb") {
                Some(t) if t.contains("data-health=") => Ok(()),
                _ => Err(dom),
            }
        },
    )
    .await;

    let shot = artefacts().join("dashboard.png");
    let _ = std::fs::remove_file(&shot);
    browser(
        &profile,
        &url,
        &[&format!("--screenshot={}", shot.display())],
    );
    let png = std::fs::read(&shot).unwrap_or_else(|e| {
        panic!(
            "{} wrote no screenshot at {}: {e}",
            chromium_bin.display(),
            shot.display()
        )
    });
    assert!(
        png.starts_with(b"\x89PNG") && png.len() > 10_000,
        "not a screenshot"
    );
    eprintln!("dashboard screenshot: {}", shot.display());
}
