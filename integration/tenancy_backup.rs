//! Issue 19, backups a tenant cannot read or take over (findings 6, 11,
//! 12), on the embedded fleet with the virtual runtime: an image off the
//! fleet's allowlist makes the cluster Invalid and leaves its pods alone; a
//! cluster deleted and created again under the same name gets a repository
//! of its own (and an encryption passphrase Secret), a restore by name reads
//! the current incarnation and an earlier one only when `fromBackup.uid`
//! names it; the filesystem repository is a ReadWriteMany PVC every instance
//! mounts; a backup is Completed only once another instance has read it.
//! (`tenancy_backup_process` proves the same with real pgBackRest.)
#![allow(clippy::unwrap_used)]

use crate::common::fleet;

use fleet::*;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret};
use kube::api::{DeleteParams, ListParams, PostParams};
use kube::{Api, Client};
use pgfleet::crd::{PostgresBackup, PostgresCluster};
use serde_json::{Value, json};
use std::collections::BTreeMap;

const M: &str = "member-1";
const NS: &str = "shop";
const ALLOWED: &str = "registry.example.com/pgfleet/postgres:*";

/// A manager with one embedded member and an `[images]` allowlist.
struct Fleet {
    mgr: pgfleet::manager::Manager,
    client: Client,
    _dir: std::path::PathBuf,
}

async fn start(tag: &str) -> Fleet {
    init_tracing();
    let dir = temp_dir(tag);
    let toml = format!(
        "{}\n[images]\nallowed = [\"{ALLOWED}\"]\n",
        settings_toml(&dir, &[M])
    );
    let settings = pgfleet::config::load_str(&toml, "test").unwrap_or_else(|e| panic!("{e}"));
    let mgr = pgfleet::manager::start(&settings, false).await.unwrap();
    let kc = mgr.sim.as_ref().unwrap().clusters[0].kubeconfig.clone();
    let client = client_from(&kc).await;
    let api: Api<PostgresCluster> = Api::all(client.clone());
    eventually("the CRD served", || {
        let api = api.clone();
        async move {
            api.list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())
        }
    })
    .await;
    let ns: k8s_openapi::api::core::v1::Namespace =
        serde_json::from_value(json!({"metadata": {"name": NS}})).unwrap();
    let _ = Api::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await;
    Fleet {
        mgr,
        client,
        _dir: dir,
    }
}

impl Fleet {
    fn pgc(&self) -> Api<PostgresCluster> {
        Api::namespaced(self.client.clone(), NS)
    }

    async fn create(&self, name: &str, spec: Value) -> PostgresCluster {
        self.pgc()
            .create(&PostParams::default(), &pgc_object(name, spec))
            .await
            .unwrap()
    }

    async fn healthy(&self, name: &str, size: i32) -> PostgresCluster {
        let api = self.pgc();
        eventually(&format!("{name} Healthy"), || {
            let api = api.clone();
            async move {
                let pg = api.get(name).await.map_err(|e| e.to_string())?;
                let st = pg.status.clone().unwrap_or_default();
                if st.phase == Some(pgfleet::crd::Phase::Healthy) && st.ready_instances == size {
                    Ok(pg)
                } else {
                    Err(format!("{st:?}"))
                }
            }
        })
        .await
    }

    /// The repository path recorded for `name`, once it is.
    async fn repository(&self, name: &str) -> (String, bool) {
        let api = self.pgc();
        eventually(&format!("{name}'s repository recorded"), || {
            let api = api.clone();
            async move {
                let pg = api.get(name).await.map_err(|e| e.to_string())?;
                let b = pg.status.and_then(|s| s.backup).unwrap_or_default();
                match (b.repository_path, b.encrypted) {
                    (Some(p), Some(e)) => Ok((p, e)),
                    other => Err(format!("{other:?}")),
                }
            }
        })
        .await
    }

    async fn pod(&self, name: &str) -> Pod {
        let api: Api<Pod> = Api::namespaced(self.client.clone(), NS);
        eventually(&format!("pod {name}"), || {
            let api = api.clone();
            async move { api.get(name).await.map_err(|e| e.to_string()) }
        })
        .await
    }

    async fn passphrase(&self, cluster: &str) -> Vec<u8> {
        let api: Api<Secret> = Api::namespaced(self.client.clone(), NS);
        let name = format!("{cluster}-backup-encryption");
        let s = eventually(&format!("Secret {name}"), || {
            let api = api.clone();
            let name = name.clone();
            async move { api.get(&name).await.map_err(|e| e.to_string()) }
        })
        .await;
        s.data.unwrap().get("password").unwrap().0.clone()
    }
}

fn env_of(p: &Pod) -> BTreeMap<String, Value> {
    p.spec.as_ref().unwrap().containers[0]
        .env
        .clone()
        .unwrap_or_default()
        .into_iter()
        .map(|e| (e.name.clone(), serde_json::to_value(&e).unwrap()))
        .collect()
}

fn spec(size: u32) -> Value {
    json!({"clusterSize": size, "version": "15.20", "storage": {"size": "1Gi"}})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_image_off_the_allowlist_is_invalid_and_running_pods_are_left_alone() {
    let f = start("t19-images").await;
    f.create("orders", spec(1)).await;
    f.healthy("orders", 1).await;
    let before = f.pod("orders-1").await;

    let evil = "evil.example.org/miner:latest";
    f.pgc()
        .patch(
            "orders",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"image": evil}})),
        )
        .await
        .unwrap();
    let api = f.pgc();
    eventually("orders Invalid naming the image", || {
        let api = api.clone();
        async move {
            let pg = api.get("orders").await.map_err(|e| e.to_string())?;
            match condition(&pg, "Invalid") {
                Some(c) if c.status == "True" && c.message.contains(evil) => Ok(()),
                other => Err(format!("{other:?}")),
            }
        }
    })
    .await;
    let events = events_about(&f.client, NS, "orders").await;
    assert!(
        events
            .iter()
            .any(|(r, n)| r == "InvalidSpec" && n.contains(evil)),
        "{events:?}"
    );
    // Give the controller rounds to act, then: the same pod, same image.
    tokio::time::sleep(std::time::Duration::from_secs(3)).await;
    let after = f.pod("orders-1").await;
    assert_eq!(before.metadata.uid, after.metadata.uid);
    assert_eq!(
        after.spec.unwrap().containers[0].image.as_deref(),
        Some("postgres:15.20")
    );

    // An image on the list is accepted (and rolled out).
    let ok = "registry.example.com/pgfleet/postgres:15.20";
    f.pgc()
        .patch(
            "orders",
            &kube::api::PatchParams::default(),
            &kube::api::Patch::Merge(json!({"spec": {"image": ok}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(f.client.clone(), NS);
    eventually("the allowed image rolled out", || {
        let pods = pods.clone();
        async move {
            let p = pods.get("orders-1").await.map_err(|e| e.to_string())?;
            let img = p.spec.unwrap().containers[0].image.clone();
            if img.as_deref() == Some(ok) {
                Ok(())
            } else {
                Err(format!("{img:?}"))
            }
        }
    })
    .await;
    drop(f.mgr);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_recreated_cluster_gets_its_own_repository_and_restores_see_only_what_they_name() {
    let f = start("t19-incarnation").await;
    let first = f.create("orders", spec(2)).await;
    let uid1 = first.metadata.uid.clone().unwrap();
    f.healthy("orders", 2).await;
    let (p1, enc1) = f.repository("orders").await;
    assert!(p1.ends_with(&format!("/{M}/{NS}/orders/{uid1}")), "{p1}");
    assert!(enc1);
    let pass1 = f.passphrase("orders").await;
    assert!(pass1.len() >= 32);

    // Wired into the pods: the repository PVC (ReadWriteMany), the
    // passphrase by reference, the cipher and path in pgbackrest.conf.
    let pod = f.pod("orders-1").await;
    let env = env_of(&pod);
    assert_eq!(
        env["PGBACKREST_REPO1_CIPHER_PASS"]["valueFrom"]["secretKeyRef"]["name"],
        "orders-backup-encryption"
    );
    assert!(env["PGBACKREST_REPO1_CIPHER_PASS"].get("value").is_none());
    let vols = pod.spec.as_ref().unwrap().volumes.clone().unwrap();
    assert!(
        vols.iter().any(|v| v
            .persistent_volume_claim
            .as_ref()
            .is_some_and(|c| c.claim_name == "pgfleet-backups")),
        "{vols:?}"
    );
    let pvc = Api::<PersistentVolumeClaim>::namespaced(f.client.clone(), NS)
        .get("pgfleet-backups")
        .await
        .unwrap();
    assert_eq!(
        pvc.spec.unwrap().access_modes.unwrap(),
        vec!["ReadWriteMany".to_string()]
    );
    let cm = Api::<ConfigMap>::namespaced(f.client.clone(), NS)
        .get("orders-config")
        .await
        .unwrap();
    let conf = cm.data.unwrap()["pgbackrest.conf"].clone();
    assert!(conf.contains(&format!("repo1-path={p1}\n")), "{conf}");
    assert!(conf.contains("repo1-cipher-type=aes-256-cbc\n"), "{conf}");
    assert!(!conf.contains(std::str::from_utf8(&pass1).unwrap()));

    // Backups are recorded Completed only once another instance read them.
    let b: PostgresBackup = serde_json::from_value(json!({
        "apiVersion": "pgfleet.io/v1", "kind": "PostgresBackup",
        "metadata": {"name": "orders-b1", "namespace": NS}, "spec": {"cluster": "orders"}}))
    .unwrap();
    let backups: Api<PostgresBackup> = Api::namespaced(f.client.clone(), NS);
    backups.create(&PostParams::default(), &b).await.unwrap();
    let st = eventually("orders-b1 Completed", || {
        let backups = backups.clone();
        async move {
            let st = backups
                .get("orders-b1")
                .await
                .map_err(|e| e.to_string())?
                .status
                .unwrap_or_default();
            if st.phase.as_deref() == Some("Completed") {
                Ok(st)
            } else {
                Err(format!("{st:?}"))
            }
        }
    })
    .await;
    assert_eq!(st.repository_path.as_deref(), Some(p1.as_str()));
    let (took, seen) = (st.instance.unwrap(), st.verified_on.unwrap());
    assert_ne!(took, seen, "verified by the instance that took it");

    // Deleted and created again under the same name: a new incarnation.
    f.pgc()
        .delete("orders", &DeleteParams::default())
        .await
        .unwrap();
    let api = f.pgc();
    eventually("orders gone", || {
        let api = api.clone();
        async move {
            match api.get_opt("orders").await {
                Ok(None) => Ok(()),
                other => Err(format!("{:?}", other.map(|o| o.is_some()))),
            }
        }
    })
    .await;
    let second = f.create("orders", spec(1)).await;
    let uid2 = second.metadata.uid.clone().unwrap();
    assert_ne!(uid1, uid2);
    f.healthy("orders", 1).await;
    let (p2, _) = f.repository("orders").await;
    assert!(p2.ends_with(&format!("/orders/{uid2}")), "{p2}");
    assert_ne!(p1, p2);

    // A restore by name reads the current incarnation only...
    f.create(
        "by-name",
        json!({"clusterSize": 1, "version": "15.20", "storage": {"size": "1Gi"},
               "bootstrap": {"fromBackup": {"cluster": "orders"}}}),
    )
    .await;
    let env = env_of(&f.pod("by-name-1").await);
    assert_eq!(env["PGFLEET_RESTORE_REPO_PATH"]["value"], json!(p2));
    // ...the previous one when its uid is named.
    f.create(
        "by-uid",
        json!({"clusterSize": 1, "version": "15.20", "storage": {"size": "1Gi"},
               "bootstrap": {"fromBackup": {"cluster": "orders", "uid": uid1}}}),
    )
    .await;
    let env = env_of(&f.pod("by-uid-1").await);
    assert_eq!(env["PGFLEET_RESTORE_REPO_PATH"]["value"], json!(p1));
    // A restored cluster reads its source with the source's passphrase.
    assert_eq!(f.passphrase("by-name").await, f.passphrase("orders").await);
    let (own, _) = f.repository("by-name").await;
    assert!(own.contains("/by-name/"), "{own}");
    drop(f.mgr);
}
