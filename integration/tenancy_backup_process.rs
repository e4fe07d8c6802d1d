//! Issue 19, findings 6 and 12 with real PostgreSQL and real pgBackRest
//! (process runtime): the filesystem repository lives under `/tmp`, which
//! every container sees as its own private directory, so only a mounted
//! volume can hold a backup there. A backup is recorded Completed after the
//! other instance read it back; the files are on the repository PVC on the
//! host and encrypted (pgBackRest's `backup.info` is ciphertext, no
//! plaintext section headers); a restore from it, which needs the source's
//! passphrase, holds the rows.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common::process as env;

use env::{Env, NS, connect};
use kube::api::{Api, PostParams};
use pgfleet::crd::PostgresBackup;
use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

async fn sql(host: &str, pw: &str, q: &str) -> Vec<tokio_postgres::Row> {
    let start = std::time::Instant::now();
    loop {
        match connect(host, 5432, pw).await {
            Ok(c) => match c.query(q, &[]).await {
                Ok(rows) => return rows,
                Err(e) if e.is_closed() && start.elapsed() < Duration::from_secs(60) => {}
                Err(e) => panic!("{q}: {e}"),
            },
            Err(e) if start.elapsed() > Duration::from_secs(60) => {
                panic!("connecting for {q}: {e}")
            }
            Err(_) => {}
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

/// Every file named `name` below `dir`.
fn find(dir: &Path, name: &str, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() && !p.is_symlink() {
            find(&p, name, out);
        } else if p.file_name().is_some_and(|n| n == name) {
            out.push(p);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_encrypted_filesystem_repository_on_a_volume_is_verified_and_restores() {
    let repo = format!("/tmp/pgfleet-t19-repo-{:x}", rand::random::<u32>());
    let e = Env::start_with(
        "t19-fsrepo",
        &format!("[backups]\nrepository = {{ filesystem = {{ path = \"{repo}\" }} }}\n"),
    )
    .await;
    e.create(
        "src",
        serde_json::json!({"clusterSize": 2, "version": "15"}),
    )
    .await;
    e.wait_healthy("src", 2).await;
    let rw = e.service_ip("src-rw").await;
    let pw = e.password("src").await;
    e.wait("the table created", Duration::from_secs(120), || async {
        match connect(&rw, 5432, &pw).await {
            Ok(c) => c
                .batch_execute("CREATE TABLE IF NOT EXISTS marks (id bigint PRIMARY KEY)")
                .await
                .is_ok(),
            Err(_) => false,
        }
    })
    .await;
    sql(&rw, &pw, "INSERT INTO marks SELECT generate_series(1, 10)").await;

    let b: PostgresBackup = serde_json::from_value(serde_json::json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
        "metadata": {"name": "src-full", "namespace": NS}, "spec": {"cluster": "src"}}))
    .unwrap();
    let backups = Api::<PostgresBackup>::namespaced(e.client.clone(), NS);
    backups.create(&PostParams::default(), &b).await.unwrap();
    let start = std::time::Instant::now();
    let st = loop {
        let st = backups
            .get("src-full")
            .await
            .unwrap()
            .status
            .unwrap_or_default();
        match st.phase.as_deref() {
            Some("Completed") => break st,
            Some("Failed") => panic!("backup failed: {st:?}"),
            _ => {}
        }
        assert!(start.elapsed() < Duration::from_secs(300), "{st:?}");
        tokio::time::sleep(Duration::from_millis(300)).await;
    };
    // Read back by the other instance before it was recorded.
    let (took, seen) = (
        st.instance.clone().unwrap(),
        st.verified_on.clone().unwrap(),
    );
    assert_ne!(took, seen, "{st:?}");

    // The repository is on the PVC (a host directory of the runtime), not
    // in the pod's /tmp, and under this incarnation's own path.
    let status = e.status("src").await.backup.unwrap();
    let path = status.repository_path.unwrap();
    let uid = e.pgc().get("src").await.unwrap().metadata.uid.unwrap();
    assert!(path.starts_with(&repo) && path.ends_with(&uid), "{path}");
    assert_eq!(status.encrypted, Some(true));
    let mut infos = vec![];
    find(&e.dir, "backup.info", &mut infos);
    let infos: Vec<PathBuf> = infos
        .into_iter()
        .filter(|p| {
            p.to_string_lossy().contains("pgfleet-backups") && p.to_string_lossy().contains(&uid)
        })
        .collect();
    assert!(
        !infos.is_empty(),
        "no backup.info on the repository PVC under {}",
        e.dir.display()
    );
    let mut manifests = vec![];
    find(
        infos[0].parent().unwrap(),
        "backup.manifest",
        &mut manifests,
    );
    assert!(
        !manifests.is_empty(),
        "no backup set next to {}",
        infos[0].display()
    );
    // Encrypted: pgBackRest's info file is otherwise an INI text.
    let bytes = std::fs::read(&infos[0]).unwrap();
    assert!(
        bytes.starts_with(b"Salted__") && !bytes.windows(8).any(|w| w == b"[backup:"),
        "backup.info is readable without the passphrase"
    );

    // A restore reads it with the source's passphrase and holds the rows.
    e.create(
        "copy",
        serde_json::json!({"clusterSize": 1, "version": "15",
            "bootstrap": {"fromBackup": {"cluster": "src", "backup": "src-full"}}}),
    )
    .await;
    e.wait_healthy("copy", 1).await;
    let ip = e.service_ip("copy-rw").await;
    let got: BTreeSet<i64> = sql(&ip, &pw, "SELECT id FROM marks")
        .await
        .iter()
        .map(|r| r.get(0))
        .collect();
    assert_eq!(got, (1..=10).collect::<BTreeSet<i64>>());
    let _ = std::fs::remove_dir_all(&repo);
}
