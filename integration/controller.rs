//! Acceptance tests of the PostgresCluster controller (issue 3), one member
//! cluster each: a whole pgfleet manager against the embedded Kubernetes
//! over real HTTP, with the virtual kubelet runtime. Every test asserts
//! outcomes (objects, labels, status, events) and polls for them with a
//! generous patience; none asserts on how fast anything happens.
#![allow(clippy::unwrap_used)]

use crate::common;
use common::fleet;

use fleet::*;
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret, Service};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{DeleteParams, Patch, PatchParams};
use kube::{Api, ResourceExt};
use pgfleet::crd::PostgresCluster;
use serde_json::json;
use std::collections::BTreeMap;

pub(crate) const M: &str = "member-1";

pub(crate) fn spec(size: u32) -> serde_json::Value {
    json!({"clusterSize": size, "version": "15.20", "storage": {"size": "1Gi"}})
}

fn is_ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// The primary is unique, recorded in the status, and the three Services
/// pick exactly the right pods by label (`-rw` the primary, `-ro` the
/// replicas, `-r` every instance).
async fn assert_topology(f: &TestFleet, ns: &str, name: &str, size: u32) -> String {
    let client = f.client(M);
    let pg = f.pgc(M, ns).get(name).await.unwrap();
    let pods = instance_pods(&Api::<Pod>::namespaced(client.clone(), ns), name).await;
    let want: Vec<u32> = (1..=size).collect();
    assert_eq!(
        pods.keys().cloned().collect::<Vec<_>>(),
        instance_names(name, &want)
    );
    let primary = primaries(&pods);
    assert_eq!(primary.len(), 1, "exactly one primary pod: {primary:?}");
    let primary = primary[0].clone();
    let st = pg.status.clone().unwrap();
    assert_eq!(st.current_primary.as_deref(), Some(primary.as_str()));
    assert_eq!(st.ready_instances, size as i32);
    assert_eq!(st.instances.len(), size as usize, "{:?}", st.instances);
    for i in &st.instances {
        assert!(i.ready, "instance {} ready in status", i.name);
        let want_role = if i.name == primary {
            "primary"
        } else {
            "replica"
        };
        assert_eq!(i.role.as_str(), want_role, "role of {} in status", i.name);
    }
    for (n, p) in &pods {
        assert!(is_ready(p), "pod {n} is Ready");
    }
    let replicas: Vec<String> = pods.keys().filter(|n| **n != primary).cloned().collect();
    let svcs: Api<Service> = Api::namespaced(client, ns);
    let rw = svcs.get(&format!("{name}-rw")).await.unwrap();
    let ro = svcs.get(&format!("{name}-ro")).await.unwrap();
    let r = svcs.get(&format!("{name}-r")).await.unwrap();
    assert_eq!(
        selected(&rw, &pods),
        vec![primary.clone()],
        "-rw selects the primary"
    );
    assert_eq!(selected(&ro, &pods), replicas, "-ro selects the replicas");
    assert_eq!(
        selected(&r, &pods),
        pods.keys().cloned().collect::<Vec<_>>(),
        "-r selects every instance"
    );
    primary
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_instances_become_ready_with_one_primary_and_services_by_role() {
    let f = TestFleet::start("ready", &[M]).await;
    f.create(M, "shop", "orders", spec(3)).await;
    let pg = f.wait_healthy(M, "shop", "orders", 3).await;

    let ready = condition(&pg, "Ready").unwrap();
    assert_eq!(ready.status, "True");
    assert_eq!(condition(&pg, "Invalid").unwrap().status, "False");
    assert_eq!(condition(&pg, "Degraded").unwrap().status, "False");
    let st = pg.status.clone().unwrap();
    assert_eq!(st.phase, Some(pgfleet::crd::Phase::Healthy));
    assert_eq!(st.observed_generation, pg.metadata.generation);
    assert_eq!(st.current_version.as_deref(), Some("15.20"));
    let primary = assert_topology(&f, "shop", "orders", 3).await;
    assert_eq!(primary, "orders-1", "a new cluster bootstraps instance 1");

    // What else a PostgresCluster becomes: one bound PVC per instance, the
    // two generated credentials, the application's `orders-app`, the TLS
    // Secrets (CA key, published CA, server certificate), and (backups are configured: the embedded
    // default repository) the pgBackRest TLS pair and the repository's
    // encryption passphrase, the ConfigMap with the
    // instance script,
    // the PodDisruptionBudget; the controller's finalizer is on the object.
    let client = f.client(M);
    let kids = child_names(&client, "shop", "orders").await;
    assert_eq!(kids.pvcs, instance_names("orders", &[1, 2, 3]));
    assert_eq!(
        kids.secrets,
        [
            "orders-app",
            "orders-backup-encryption",
            "orders-backup-tls",
            "orders-ca",
            "orders-ca-key",
            "orders-replication",
            "orders-server-tls",
        ]
    );
    assert_eq!(kids.config_maps, ["orders-config"]);
    assert_eq!(kids.services, ["orders-r", "orders-ro", "orders-rw"]);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "shop");
    let pvcs = eventually("the PVCs to be Bound", || {
        let pvcs = pvcs.clone();
        async move {
            let all = children(&pvcs, "orders").await;
            let phases: BTreeMap<String, Option<String>> = all
                .iter()
                .map(|(n, p)| (n.clone(), p.status.as_ref().and_then(|s| s.phase.clone())))
                .collect();
            if phases.values().all(|p| p.as_deref() == Some("Bound")) {
                Ok(all)
            } else {
                Err(format!("{phases:?}"))
            }
        }
    })
    .await;
    assert_eq!(pvcs.len(), 3);
    let cm = Api::<ConfigMap>::namespaced(client.clone(), "shop")
        .get("orders-config")
        .await
        .unwrap();
    let data = cm.data.unwrap_or_default();
    assert!(data.contains_key("pgfleet-instance"), "{:?}", data.keys());
    assert!(data.contains_key("postgresql.conf"));
    assert!(data.contains_key("pg_hba.conf"));
    let pdb = Api::<PodDisruptionBudget>::namespaced(client.clone(), "shop")
        .get("orders")
        .await
        .unwrap();
    assert_eq!(
        pdb.spec.unwrap().selector.unwrap().match_labels.unwrap()[LABEL_CLUSTER],
        "orders"
    );
    // No superuser Secret: enableSuperuserAccess is off by default.
    let pw = Api::<Secret>::namespaced(client.clone(), "shop")
        .get("orders-replication")
        .await
        .unwrap();
    assert!(pw.data.unwrap_or_default().contains_key("password"));
    assert!(
        pg.finalizers().iter().any(|f| f == "pgfleet.io/cleanup"),
        "{:?}",
        pg.finalizers()
    );
    let pods = instance_pods(&Api::<Pod>::namespaced(client.clone(), "shop"), "orders").await;
    for p in pods.values() {
        let c = &p.spec.as_ref().unwrap().containers[0];
        assert_eq!(c.image.as_deref(), Some("postgres:15.20"));
        let owner = &p.owner_references()[0];
        assert_eq!(owner.kind, "PostgresCluster");
        assert_eq!(owner.uid, pg.uid().unwrap());
    }
    // What a round created is one `Created` Event; the instance is in it.
    let events = events_about(&client, "shop", "orders").await;
    assert!(
        events
            .iter()
            .any(|(r, note)| r == "Created" && note.contains("instance orders-1")),
        "the round's Created Event names the instance: {events:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scale_up_and_down_follows_cluster_size_and_keeps_the_primary() {
    let f = TestFleet::start("scale", &[M]).await;
    let client = f.client(M);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    f.create(M, "shop", "orders", spec(3)).await;
    f.wait_healthy(M, "shop", "orders", 3).await;
    let primary = assert_topology(&f, "shop", "orders", 3).await;
    let primary_uid = instance_pods(&pods, "orders").await[&primary]
        .uid()
        .unwrap();

    // 3 → 5 through spec.clusterSize: two new replicas with their volumes.
    f.patch(M, "shop", "orders", json!({"spec": {"clusterSize": 5}}))
        .await;
    f.wait_healthy(M, "shop", "orders", 5).await;
    assert_eq!(assert_topology(&f, "shop", "orders", 5).await, primary);
    let kids = child_names(&client, "shop", "orders").await;
    assert_eq!(kids.pvcs, instance_names("orders", &[1, 2, 3, 4, 5]));

    // 5 → 2 through the scale subresource: the highest ordinals go, the
    // primary stays (same pod, never restarted).
    let api = f.pgc(M, "shop");
    let scale = api
        .patch_scale(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 2}})),
        )
        .await
        .unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    assert_eq!(api.get("orders").await.unwrap().spec.cluster_size, 2);
    f.wait_healthy(M, "shop", "orders", 2).await;
    assert_eq!(assert_topology(&f, "shop", "orders", 2).await, primary);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "shop");
    eventually("the PVCs of removed instances to go", || {
        let pvcs = pvcs.clone();
        async move {
            let names: Vec<String> = children(&pvcs, "orders").await.into_keys().collect();
            if names == instance_names("orders", &[1, 2]) {
                Ok(())
            } else {
                Err(format!("{names:?}"))
            }
        }
    })
    .await;
    assert_eq!(
        instance_pods(&pods, "orders").await[&primary].uid(),
        Some(primary_uid.clone()),
        "the primary pod was never replaced"
    );
    let scale = api.get_scale("orders").await.unwrap();
    assert_eq!(scale.spec.unwrap().replicas, Some(2));
    assert_eq!(scale.status.unwrap().replicas, 2);
    let removed: Vec<String> = events_about(&client, "shop", "orders")
        .await
        .into_iter()
        .filter(|(r, _)| r == "RemovedInstance")
        .map(|(_, n)| n)
        .collect();
    assert_eq!(
        removed.len(),
        3,
        "one event per removed replica: {removed:?}"
    );
    assert!(removed.iter().all(|n| !n.contains(&primary)), "{removed:?}");

    // And up again: the freed ordinal is reused by a new replica.
    f.patch(M, "shop", "orders", json!({"spec": {"clusterSize": 3}}))
        .await;
    f.wait_healthy(M, "shop", "orders", 3).await;
    assert_eq!(assert_topology(&f, "shop", "orders", 3).await, primary);
    assert_eq!(
        instance_pods(&pods, "orders").await[&primary].uid(),
        Some(primary_uid)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_replica_pod_and_deleted_service_come_back() {
    let f = TestFleet::start("heal", &[M]).await;
    let client = f.client(M);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let svcs: Api<Service> = Api::namespaced(client.clone(), "shop");
    f.create(M, "shop", "orders", spec(3)).await;
    f.wait_healthy(M, "shop", "orders", 3).await;
    let primary = assert_topology(&f, "shop", "orders", 3).await;
    let before = uids(&instance_pods(&pods, "orders").await);
    let victim = before.keys().find(|n| **n != primary).unwrap().clone();

    pods.delete(&victim, &DeleteParams::default())
        .await
        .unwrap();
    let back = eventually(&format!("pod {victim} to be recreated and Ready"), || {
        let (pods, victim, old) = (pods.clone(), victim.clone(), before[&victim].clone());
        async move {
            match pods.get_opt(&victim).await.map_err(|e| e.to_string())? {
                Some(p) if p.uid().as_deref() != Some(old.as_str()) && is_ready(&p) => Ok(p),
                other => Err(format!(
                    "{:?}",
                    other.map(|p| (p.uid(), p.metadata.deletion_timestamp, p.status))
                )),
            }
        }
    })
    .await;
    assert_eq!(
        back.labels().get(LABEL_ROLE).map(String::as_str),
        Some("replica")
    );
    f.wait_healthy(M, "shop", "orders", 3).await;
    assert_eq!(assert_topology(&f, "shop", "orders", 3).await, primary);
    let after = uids(&instance_pods(&pods, "orders").await);
    for (n, uid) in &before {
        if *n != victim {
            assert_eq!(&after[n], uid, "pod {n} was left alone");
        }
    }

    for svc in ["orders-ro", "orders-rw"] {
        let old = svcs.get(svc).await.unwrap().uid().unwrap();
        svcs.delete(svc, &DeleteParams::default()).await.unwrap();
        eventually(&format!("Service {svc} to be recreated"), || {
            let (svcs, old) = (svcs.clone(), old.clone());
            async move {
                match svcs.get_opt(svc).await.map_err(|e| e.to_string())? {
                    Some(s) if s.uid().as_deref() != Some(old.as_str()) => Ok(s),
                    other => Err(format!("{:?}", other.map(|s| s.uid()))),
                }
            }
        })
        .await;
    }
    assert_eq!(assert_topology(&f, "shop", "orders", 3).await, primary);
}

/// Waits for condition Invalid=True whose message names `needle`, written
/// for the latest generation.
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_volume_is_deleted_is_rebuilt_on_a_new_one() {
    let f = TestFleet::start("pvc", &[M]).await;
    let client = f.client(M);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "shop");
    f.create(M, "shop", "orders", spec(3)).await;
    f.wait_healthy(M, "shop", "orders", 3).await;
    let primary = assert_topology(&f, "shop", "orders", 3).await;
    let before = uids(&instance_pods(&pods, "orders").await);
    let victim = "orders-3";
    assert_ne!(primary, victim);
    let old_pvc = pvcs.get(victim).await.unwrap().uid().unwrap();

    pvcs.delete(victim, &DeleteParams::default()).await.unwrap();
    eventually("the replica to be rebuilt on a new volume", || {
        let (pods, pvcs, old_pod) = (pods.clone(), pvcs.clone(), before[victim].clone());
        let old_pvc = old_pvc.clone();
        async move {
            let pvc = pvcs.get_opt(victim).await.map_err(|e| e.to_string())?;
            let pod = pods.get_opt(victim).await.map_err(|e| e.to_string())?;
            let pvc_uid = pvc.as_ref().and_then(|p| p.uid());
            let pod_uid = pod.as_ref().and_then(|p| p.uid());
            let ready = pod.as_ref().is_some_and(is_ready);
            if pvc_uid.as_ref().is_some_and(|u| *u != old_pvc)
                && pod_uid.as_ref().is_some_and(|u| *u != old_pod)
                && ready
            {
                Ok(())
            } else {
                Err(format!("pvc {pvc_uid:?} pod {pod_uid:?} ready {ready}"))
            }
        }
    })
    .await;
    f.wait_healthy(M, "shop", "orders", 3).await;
    assert_eq!(assert_topology(&f, "shop", "orders", 3).await, primary);
    let after = uids(&instance_pods(&pods, "orders").await);
    for n in ["orders-1", "orders-2"] {
        assert_eq!(after[n], before[n], "pod {n} was left alone");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn invalid_spec_sets_invalid_and_leaves_running_pods_alone() {
    let f = TestFleet::start("invalid", &[M]).await;
    let client = f.client(M);
    let pods: Api<Pod> = Api::namespaced(client.clone(), "shop");
    let api = f.pgc(M, "shop");
    f.create(M, "shop", "orders", spec(3)).await;
    f.wait_healthy(M, "shop", "orders", 3).await;
    let before = uids(&instance_pods(&pods, "orders").await);

    // The CRD schema itself rejects an out-of-range size (never stored).
    let err = api
        .patch(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"clusterSize": 17}})),
        )
        .await
        .unwrap_err();
    match &err {
        kube::Error::Api(s) => {
            assert_eq!(s.code, 422, "{s:?}");
            assert!(s.message.contains("clusterSize"), "{}", s.message);
        }
        other => panic!("expected 422, got {other}"),
    }
    assert_eq!(api.get("orders").await.unwrap().spec.cluster_size, 3);
    // Also through the scale subresource.
    let err = api
        .patch_scale(
            "orders",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"replicas": 17}})),
        )
        .await
        .unwrap_err();
    match &err {
        kube::Error::Api(s) => assert_eq!(s.code, 422, "{s:?}"),
        other => panic!("expected 422, got {other}"),
    }
    assert_eq!(api.get("orders").await.unwrap().spec.cluster_size, 3);

    // Schema-valid but semantically invalid: the controller says why.
    // Scale and version change in one go: neither may happen.
    f.patch(
        M,
        "shop",
        "orders",
        json!({"spec": {"version": "9.6", "clusterSize": 4}}),
    )
    .await;
    let pg = wait_invalid(&api, "spec.version").await;
    let st = pg.status.clone().unwrap();
    assert_eq!(st.phase, Some(pgfleet::crd::Phase::Invalid));
    assert_eq!(condition(&pg, "Invalid").unwrap().reason, "InvalidSpec");
    assert!(
        condition(&pg, "Invalid").unwrap().message.contains("9.6"),
        "{:?}",
        condition(&pg, "Invalid")
    );
    assert_eq!(st.current_primary.as_deref(), Some("orders-1"));
    let warned = events_about(&client, "shop", "orders").await;
    assert!(
        warned
            .iter()
            .any(|(r, n)| r == "InvalidSpec" && n.contains("spec.version")),
        "{warned:?}"
    );

    f.patch(
        M,
        "shop",
        "orders",
        json!({"spec": {"version": "15.20", "backupSchedule": "99 * * * *"}}),
    )
    .await;
    let pg = wait_invalid(&api, "spec.backupSchedule").await;
    let msg = condition(&pg, "Invalid").unwrap().message.clone();
    assert!(!msg.contains("spec.version"), "{msg}");

    let pods_now = instance_pods(&pods, "orders").await;
    assert_eq!(uids(&pods_now), before, "running pods untouched");
    for p in pods_now.values() {
        assert_eq!(
            p.spec.as_ref().unwrap().containers[0].image.as_deref(),
            Some("postgres:15.20")
        );
    }
    let kids = child_names(&client, "shop", "orders").await;
    assert_eq!(kids.pvcs, instance_names("orders", &[1, 2, 3]));

    // Fixed: valid again, and the pending scale to 4 goes ahead.
    f.patch(
        M,
        "shop",
        "orders",
        json!({"spec": {"backupSchedule": null}}),
    )
    .await;
    let pg = f.wait_healthy(M, "shop", "orders", 4).await;
    assert_eq!(condition(&pg, "Invalid").unwrap().status, "False");
    let after = uids(&instance_pods(&pods, "orders").await);
    for (n, uid) in &before {
        assert_eq!(&after[n], uid, "pod {n} survived the invalid spell");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_a_cluster_removes_its_children_and_volumes_per_reclaim_policy() {
    let f = TestFleet::start("delete", &[M]).await;
    let client = f.client(M);
    let mut keep = spec(2);
    keep["storage"]["reclaimPolicy"] = json!("Retain");
    let mut drop = spec(2);
    drop["storage"]["reclaimPolicy"] = json!("Delete");
    f.create(M, "shop", "keep", keep).await;
    f.create(M, "shop", "drop", drop).await;
    f.wait_healthy(M, "shop", "keep", 2).await;
    f.wait_healthy(M, "shop", "drop", 2).await;
    let api = f.pgc(M, "shop");
    for name in ["keep", "drop"] {
        let kids = child_names(&client, "shop", name).await;
        assert_eq!(kids.pods.len(), 2, "{kids:?}");
        assert_eq!(kids.services.len(), 3, "{kids:?}");
        api.delete(name, &DeleteParams::default()).await.unwrap();
    }
    let pdbs: Api<PodDisruptionBudget> = Api::namespaced(client.clone(), "shop");
    for (name, want_pvcs) in [("keep", instance_names("keep", &[1, 2])), ("drop", vec![])] {
        let (api, client, pdbs) = (api.clone(), client.clone(), pdbs.clone());
        eventually(
            &format!("{name} and its children to be gone (PVCs: {want_pvcs:?})"),
            || {
                let (api, client, pdbs, want) =
                    (api.clone(), client.clone(), pdbs.clone(), want_pvcs.clone());
                async move {
                    let obj = api.get_opt(name).await.map_err(|e| e.to_string())?;
                    let kids = child_names(&client, "shop", name).await;
                    let pdb = pdbs.get_opt(name).await.map_err(|e| e.to_string())?;
                    // The repository's passphrase outlives the cluster, as
                    // its backups do (docs/backups.md).
                    let want_kids = ChildNames {
                        pvcs: want,
                        secrets: vec![format!("{name}-backup-encryption")],
                        ..Default::default()
                    };
                    if obj.is_none() && pdb.is_none() && kids == want_kids {
                        Ok(())
                    } else {
                        Err(format!(
                            "object {:?}, pdb {}, children {kids:?}",
                            obj.map(|o| (
                                o.metadata.deletion_timestamp.clone(),
                                o.finalizers().to_vec()
                            )),
                            pdb.is_some()
                        ))
                    }
                }
            },
        )
        .await;
    }
    let reasons: Vec<String> = events_about(&client, "shop", "keep")
        .await
        .into_iter()
        .map(|(r, _)| r)
        .collect();
    assert!(
        reasons.iter().any(|r| r == "RetainedVolumes"),
        "{reasons:?}"
    );

    // A new cluster of the same name adopts the retained volumes (no
    // initdb over existing data): it comes up with them, same names.
    f.create(M, "shop", "keep", spec(2)).await;
    f.wait_healthy(M, "shop", "keep", 2).await;
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), "shop");
    assert_eq!(
        children(&pvcs, "keep")
            .await
            .into_keys()
            .collect::<Vec<_>>(),
        instance_names("keep", &[1, 2])
    );
}
