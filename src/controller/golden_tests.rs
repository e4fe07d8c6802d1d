//! Golden fixtures of the child builders. The JSON each builder produces
//! for a few representative specs, and the content hashes stamped on them,
//! are recorded in `fixtures/*.json`. A hash that moves makes every running
//! instance outdated after a pgfleet upgrade (the rolling update restarts
//! the whole fleet), so a change here must be deliberate: regenerate with
//! `PGFLEET_BLESS_FIXTURES=1 cargo nextest run --lib golden` and review.
//!
//! The test is written against `serde_json::to_value` of what the builders
//! return, so it holds whether they return JSON or typed objects.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use super::build::{self, ANN_HASH, Owner};
use super::pooler;
use crate::config::backups::{FilesystemRepository, Repository, Retention, S3Repository};
use crate::crd::{PostgresCluster, Role};
use crate::pgbackrest::repo::{BackupEnv, credential_env};
use serde::Serialize;
use serde_json::{Value, json};
use std::collections::BTreeMap;

fn cluster(spec: Value) -> PostgresCluster {
    let mut pg = PostgresCluster::new("orders", serde_json::from_value(spec).unwrap());
    pg.metadata.namespace = Some("shop".into());
    pg.metadata.uid = Some("5f0c-uid".into());
    pg
}

fn v<T: Serialize>(x: &T) -> Value {
    serde_json::to_value(x).unwrap()
}

fn hash_of(obj: &Value) -> Value {
    obj["metadata"]["annotations"][ANN_HASH].clone()
}

/// Everything the builders make of `pg` (with `backup` wired in when given).
fn render(pg: &PostgresCluster, backup: Option<&BackupEnv>) -> Value {
    let o = Owner::of(pg, 3).unwrap();
    let mut env = backup
        .map(|b| credential_env(&b.repository))
        .unwrap_or_default();
    if backup.is_some() {
        env.push(crate::pgbackrest::encryption::env(&o.name));
    }
    let mut pod = build::pod(&o, pg, 0, Role::Primary, "initdb", &env);
    if let Some(b) = backup {
        pod = b.mount(pod);
        pod = crate::pgbackrest::tls::mount(pod, &o.name);
    }
    let replica = build::pod(&o, pg, 2, Role::Replica, "clone", &[]);
    let params = crate::postgres::effective_parameters(&pg.spec.postgresql.parameters, None);
    let conf = backup.map(|b| {
        crate::pgbackrest::repo::render_conf(
            &b.repository,
            "/fleet/orders",
            &b.retention,
            build::PGDATA,
            true,
        )
    });
    let cm = build::config_map(
        &o,
        &params,
        (&[], &pg.spec.postgresql.pg_hba),
        conf.as_deref(),
        &BTreeMap::new(),
    );
    let services = v(&build::services(&o, false));
    let objects = json!({
        "pod": v(&pod),
        "replica": v(&replica),
        "pvc": v(&build::pvc(&o, pg, 0)),
        "services": services,
        "pdbs": v(&build::pdbs(&o, pg.spec.cluster_size)),
        "config_map": v(&cm),
        "secret": v(&build::secret(&o, "superuser", "postgres", "pw")),
        "tls_secret": v(&build::tls_secret(&o, "orders-backup-tls", "CA", "CRT", "KEY")),
        "pooler": {
            "config_map": v(&pooler::config_map(&o, pg, &pooler::Upstream::own(&o))),
            "pod": v(&pooler::pod(&o, 1)),
            "service": v(&pooler::service(&o)),
        },
        "claim": backup.map(|b| v(&b.claim("shop"))),
    });
    let mut objects = objects;
    redact_script(&mut objects["config_map"]);
    let hashes: BTreeMap<&str, Value> = [
        ("pod", hash_of(&objects["pod"])),
        ("replica", hash_of(&objects["replica"])),
        ("pvc", hash_of(&objects["pvc"])),
        ("pdb", hash_of(&objects["pdbs"][0])),
        ("pdb_primary", hash_of(&objects["pdbs"][1])),
        ("service_rw", hash_of(&objects["services"][0])),
        ("service_ro", hash_of(&objects["services"][1])),
        ("service_r", hash_of(&objects["services"][2])),
        (
            "pooler_config_map",
            hash_of(&objects["pooler"]["config_map"]),
        ),
        ("pooler_pod", hash_of(&objects["pooler"]["pod"])),
        ("pooler_service", hash_of(&objects["pooler"]["service"])),
    ]
    .into_iter()
    // What a spec does not make (a single instance has no budgets).
    .filter(|(_, h)| !h.is_null())
    .collect();
    json!({"objects": objects, "hashes": hashes})
}

/// The instance ConfigMap carries instance.sh, and its hash covers it: an
/// edit of the script changes both (and only makes instances reload, it
/// restarts none). The fixture keeps neither, so script edits need no new
/// fixtures; everything else of the ConfigMap is compared.
fn redact_script(cm: &mut Value) {
    let h = hash_of(cm).as_str().unwrap_or("?").to_string();
    let text = serde_json::to_string(cm)
        .unwrap()
        .replace(&h, "<config-hash>");
    *cm = serde_json::from_str(&text).unwrap();
    assert_eq!(
        cm["data"]["pgfleet-instance"],
        crate::postgres::INSTANCE_SCRIPT
    );
    cm["data"]["pgfleet-instance"] = json!("<instance.sh>");
}

fn check(name: &str, fixture: &str, got: Value) {
    if std::env::var_os("PGFLEET_BLESS_FIXTURES").is_some() {
        let path = format!(
            "{}/src/controller/fixtures/{name}.json",
            env!("CARGO_MANIFEST_DIR")
        );
        let text = serde_json::to_string_pretty(&got).unwrap() + "\n";
        std::fs::write(path, text).unwrap();
        return;
    }
    let want: Value = serde_json::from_str(fixture).unwrap();
    // The hashes exactly, as strings, first: they are what must not move.
    let (w, g) = (&want["hashes"], &got["hashes"]);
    for (k, h) in w.as_object().expect("fixture has hashes") {
        let h = h.as_str().expect("a recorded hash");
        assert_eq!(Some(h), g[k].as_str(), "{name}: hash of {k} moved");
    }
    assert_eq!(want["hashes"], got["hashes"], "{name}: hashes");
    for (k, obj) in want["objects"].as_object().expect("fixture has objects") {
        assert_eq!(obj, &got["objects"][k], "{name}: object {k} differs");
    }
    assert_eq!(want, got, "{name}");
}

#[test]
fn golden_minimal() {
    let pg = cluster(json!({"clusterSize": 1, "version": "15.20"}));
    check(
        "minimal",
        include_str!("fixtures/minimal.json"),
        render(&pg, None),
    );
}

#[test]
fn golden_three_instances_with_pooler() {
    let pg = cluster(json!({
        "clusterSize": 3, "version": "16.4", "image": "registry.example/postgres:16.4",
        "pooler": {"enabled": true, "instances": 2, "poolMode": "session"},
        "synchronous": {"mode": "quorum", "number": 1},
    }));
    check(
        "pooler",
        include_str!("fixtures/pooler.json"),
        render(&pg, None),
    );
}

#[test]
fn golden_with_backups() {
    let pg = cluster(json!({"clusterSize": 2, "version": "15.20",
        "storage": {"size": "5Gi", "storageClass": "fast"}}));
    let fs = BackupEnv {
        repository: Repository::Filesystem {
            path: "/var/lib/pgfleet/backups".into(),
        },
        retention: Retention::default(),
        volume: Some(FilesystemRepository {
            path: "/var/lib/pgfleet/backups".into(),
            storage_class: Some("shared".into()),
            ..FilesystemRepository::default()
        }),
    };
    let s3 = BackupEnv {
        repository: Repository::S3(S3Repository {
            bucket: "b".into(),
            endpoint: "https://minio:9000".into(),
            region: "eu".into(),
            credentials_secret: Some("s3-keys".into()),
            ..S3Repository::default()
        }),
        retention: Retention::default(),
        volume: None,
    };
    let got = json!({"fs": render(&pg, Some(&fs)), "s3": render(&pg, Some(&s3))});
    let got = json!({"objects": got, "hashes": {
        "fs_pod": got["fs"]["hashes"]["pod"], "s3_pod": got["s3"]["hashes"]["pod"],
    }});
    check("backups", include_str!("fixtures/backups.json"), got);
}

#[test]
fn golden_with_resources_and_parameters() {
    let pg = cluster(json!({
        "clusterSize": 3, "version": "15.20",
        "resources": {"cpu": "500m", "memory": "1Gi"},
        "postgresql": {
            "parameters": {"shared_buffers": "256MB", "work_mem": "8MB", "max_connections": "200"},
            "pgHba": ["host all all 10.0.0.0/8 scram-sha-256"],
        },
    }));
    check(
        "tuned",
        include_str!("fixtures/tuned.json"),
        render(&pg, None),
    );
    // Resources without any value: an empty map still enters the hash.
    let empty = cluster(json!({"clusterSize": 1, "version": "15.20", "resources": {}}));
    let got = render(&empty, None);
    assert_eq!(
        got["objects"]["pod"]["spec"]["containers"][0]["resources"],
        json!({"requests": {}, "limits": {}})
    );
}
