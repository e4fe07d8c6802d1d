//! Write semantics of the embedded API server through `kube::Client`:
//! optimistic concurrency, the three patch flavours, server-side apply,
//! finalizers and deletionTimestamp, ownerReference garbage collection.
#![allow(clippy::unwrap_used)]

mod support;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{
    Api, DeleteParams, DynamicObject, Patch, PatchParams, PostParams, PropagationPolicy,
};
use serde_json::{Value, json};
use support::*;

fn cm(name: &str, data: Value) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name}, "data": data})).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn put_with_a_stale_resource_version_is_a_conflict() {
    let s = start("conflict").await;
    let api: Api<ConfigMap> = Api::default_namespaced(s.client().await);
    api.create(&Default::default(), &cm("c", json!({"k": "1"})))
        .await
        .unwrap();
    let stale = api.get("c").await.unwrap();
    let mut first = stale.clone();
    first.data.as_mut().unwrap().insert("k".into(), "2".into());
    api.replace("c", &PostParams::default(), &first)
        .await
        .unwrap();

    let mut second = stale.clone();
    second.data.as_mut().unwrap().insert("k".into(), "3".into());
    let st = api_err(api.replace("c", &PostParams::default(), &second).await);
    assert_eq!((st.code, st.reason.as_str()), (409, "Conflict"), "{st:?}");
    assert_eq!(api.get("c").await.unwrap().data.unwrap()["k"], "2");

    // Without a resourceVersion the PUT is unconditional.
    let mut blind = second;
    blind.metadata.resource_version = None;
    api.replace("c", &PostParams::default(), &blind)
        .await
        .unwrap();
    assert_eq!(api.get("c").await.unwrap().data.unwrap()["k"], "3");
    // Creating an existing name is a 409 AlreadyExists.
    let st = api_err(api.create(&Default::default(), &cm("c", json!({}))).await);
    assert_eq!((st.code, st.reason.as_str()), (409, "AlreadyExists"));
}

fn pod(name: &str) -> Pod {
    serde_json::from_value(json!({
        "metadata": {"name": name, "labels": {"app": "db"}},
        "spec": {"containers": [
            {"name": "main", "image": "postgres:15", "env": [{"name": "A", "value": "1"}]},
            {"name": "sidecar", "image": "busybox"}
        ]}
    }))
    .unwrap()
}

/// PATCH with `application/json-patch+json` on pod `name` in "default".
async fn json_patch_pod(client: &kube::Client, name: &str, ops: &Value) -> kube::Result<Pod> {
    let req = axum::http::Request::patch(format!("/api/v1/namespaces/default/pods/{name}"))
        .header("Content-Type", "application/json-patch+json")
        .body(serde_json::to_vec(ops).unwrap())
        .unwrap();
    client.request::<Pod>(req).await
}

fn images(p: &Pod) -> Vec<(String, String)> {
    p.spec
        .as_ref()
        .unwrap()
        .containers
        .iter()
        .map(|c| (c.name.clone(), c.image.clone().unwrap_or_default()))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn merge_json_and_strategic_merge_patches_on_a_pod() {
    let s = start("patches").await;
    let client = s.client().await;
    let api: Api<Pod> = Api::default_namespaced(client.clone());
    api.create(&Default::default(), &pod("p")).await.unwrap();
    let pp = PatchParams::default();

    // JSON merge patch: maps merge, null deletes, lists are replaced whole.
    let p = api
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"tier": "data", "app": null}}})),
        )
        .await
        .unwrap();
    assert_eq!(p.labels().get("tier").map(String::as_str), Some("data"));
    assert!(!p.labels().contains_key("app"));

    // JSON patch (RFC 6902), including a failing test operation. Sent as a
    // raw request: kube's `Patch::Json` takes another json-patch major version.
    let ops = json!([
        {"op": "add", "path": "/metadata/annotations", "value": {"note": "x"}},
        {"op": "replace", "path": "/spec/containers/1/image", "value": "busybox:1.36"},
        {"op": "test", "path": "/spec/containers/0/name", "value": "main"}
    ]);
    let p = json_patch_pod(&client, "p", &ops).await.unwrap();
    assert_eq!(p.annotations().get("note").map(String::as_str), Some("x"));
    assert_eq!(images(&p)[1], ("sidecar".into(), "busybox:1.36".into()));
    let failing = json!([{"op": "test", "path": "/spec/containers/0/name", "value": "nope"}]);
    let st = api_err(json_patch_pod(&client, "p", &failing).await);
    assert_eq!(st.code, 422, "{st:?}");

    // Strategic merge patch: containers merge by name.
    let p = api
        .patch(
            "p",
            &pp,
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "main", "image": "postgres:16"}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(
        images(&p),
        vec![
            ("main".into(), "postgres:16".into()),
            ("sidecar".into(), "busybox:1.36".into())
        ]
    );
    let env = p.spec.as_ref().unwrap().containers[0].env.clone().unwrap();
    assert_eq!(
        env[0].value.as_deref(),
        Some("1"),
        "untouched fields of the merged item stay"
    );
    let p = api
        .patch(
            "p",
            &pp,
            &Patch::Strategic(
                json!({"spec": {"containers": [{"name": "sidecar", "$patch": "delete"}]}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(images(&p), vec![("main".into(), "postgres:16".into())]);

    // The same list in a merge patch replaces the whole list.
    let p = api
        .patch(
            "p",
            &pp,
            &Patch::Merge(json!({"spec": {"containers": [{"name": "other", "image": "x"}]}})),
        )
        .await
        .unwrap();
    assert_eq!(images(&p), vec![("other".into(), "x".into())]);
}

fn managers(o: &ConfigMap) -> Vec<(String, String)> {
    o.managed_fields()
        .iter()
        .map(|m| {
            (
                m.manager.clone().unwrap_or_default(),
                m.operation.clone().unwrap_or_default(),
            )
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_side_apply_records_managers_and_conflicts() {
    let s = start("ssa").await;
    let api: Api<ConfigMap> = Api::default_namespaced(s.client().await);
    let cfg = |data: Value| json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": data});

    let alice = PatchParams::apply("alice");
    let o = api
        .patch("c", &alice, &Patch::Apply(cfg(json!({"a": "1", "b": "1"}))))
        .await
        .unwrap();
    assert_eq!(managers(&o), vec![("alice".into(), "Apply".into())]);
    let fields = serde_json::to_value(&o.managed_fields()[0].fields_v1).unwrap();
    assert!(fields.to_string().contains("f:a"), "{fields}");

    // An apply that drops a field the applier alone owned removes it.
    let o = api
        .patch("c", &alice, &Patch::Apply(cfg(json!({"a": "1"}))))
        .await
        .unwrap();
    assert_eq!(
        o.data.clone().unwrap().keys().cloned().collect::<Vec<_>>(),
        vec!["a"]
    );

    // Another manager changing alice's field conflicts, unless it forces.
    let bob = PatchParams::apply("bob");
    let st = api_err(
        api.patch("c", &bob, &Patch::Apply(cfg(json!({"a": "2"}))))
            .await,
    );
    assert_eq!(st.code, 409, "{st:?}");
    assert!(st.message.contains(".data.a"), "{}", st.message);
    assert_eq!(api.get("c").await.unwrap().data.unwrap()["a"], "1");
    let o = api
        .patch(
            "c",
            &bob.clone().force(),
            &Patch::Apply(cfg(json!({"a": "2"}))),
        )
        .await
        .unwrap();
    assert_eq!(o.data.clone().unwrap()["a"], "2");
    let m = managers(&o);
    assert!(m.contains(&("bob".into(), "Apply".into())), "{m:?}");
    // Applying the same value as the owner is no conflict (shared ownership).
    api.patch(
        "c",
        &PatchParams::apply("carol"),
        &Patch::Apply(cfg(json!({"a": "2"}))),
    )
    .await
    .unwrap();

    // A plain update records an Update entry for its manager.
    let pp = PatchParams {
        field_manager: Some("dave".into()),
        ..Default::default()
    };
    let o = api
        .patch("c", &pp, &Patch::Merge(json!({"data": {"d": "4"}})))
        .await
        .unwrap();
    assert!(
        managers(&o).contains(&("dave".into(), "Update".into())),
        "{:?}",
        managers(&o)
    );

    // Apply creates missing objects; a field manager is required.
    let o = api
        .patch("fresh", &alice, &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "fresh"}, "data": {"x": "y"}})))
        .await
        .unwrap();
    assert!(o.uid().is_some());
    let st = api_err(
        api.patch("c", &PatchParams::default(), &Patch::Apply(cfg(json!({}))))
            .await,
    );
    assert_eq!(st.code, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn finalizers_hold_a_deleted_object_until_cleared() {
    let s = start("finalizers").await;
    let c = s.client().await;
    register_widgets(&c).await;
    let api: Api<DynamicObject> = Api::default_namespaced_with(c.clone(), &widget_resource());
    let mut w = widget("w", json!({"size": 1}));
    w.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&Default::default(), &w).await.unwrap();

    api.delete("w", &DeleteParams::default()).await.unwrap();
    let held = api.get("w").await.unwrap();
    assert!(
        held.metadata.deletion_timestamp.is_some(),
        "deletionTimestamp is set"
    );
    assert_eq!(held.finalizers(), ["example.com/hold"]);
    // Deleting again is fine and keeps the first timestamp; adding finalizers is refused.
    api.delete("w", &DeleteParams::default()).await.unwrap();
    assert_eq!(
        api.get("w").await.unwrap().metadata.deletion_timestamp,
        held.metadata.deletion_timestamp
    );
    let more =
        Patch::Merge(json!({"metadata": {"finalizers": ["example.com/hold", "example.com/more"]}}));
    assert_eq!(
        api_err(api.patch("w", &PatchParams::default(), &more).await).code,
        422
    );
    // Other updates still work while the finalizer is pending.
    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
    )
    .await
    .unwrap();

    api.patch(
        "w",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    eventually("the widget to disappear once its finalizer is gone", || {
        let api = api.clone();
        async move { api.get_opt("w").await.unwrap().is_none().then_some(()) }
    })
    .await;
}

fn owned(name: &str, owner: &ConfigMap) -> ConfigMap {
    serde_json::from_value(json!({"metadata": {"name": name, "ownerReferences": [{
        "apiVersion": "v1", "kind": "ConfigMap", "name": owner.name_any(), "uid": owner.uid().unwrap(),
        "blockOwnerDeletion": true
    }]}})).unwrap()
}

async fn gone(api: &Api<ConfigMap>, names: &[&str]) {
    for n in names {
        eventually(&format!("{n} to be garbage-collected"), || {
            let api = api.clone();
            async move { api.get_opt(n).await.unwrap().is_none().then_some(()) }
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn owner_reference_garbage_collection() {
    let s = start("gc").await;
    let api: Api<ConfigMap> = Api::default_namespaced(s.client().await);
    let pp = PostParams::default();

    // Background (the default): the owner goes at once, its dependents after.
    let owner = api.create(&pp, &cm("bg-owner", json!({}))).await.unwrap();
    api.create(&pp, &owned("bg-dep1", &owner)).await.unwrap();
    api.create(&pp, &owned("bg-dep2", &owner)).await.unwrap();
    api.delete("bg-owner", &DeleteParams::background())
        .await
        .unwrap();
    gone(&api, &["bg-owner", "bg-dep1", "bg-dep2"]).await;

    // Foreground: the owner waits (deletionTimestamp + foregroundDeletion)
    // until its dependents are gone; a finalizer on a dependent holds it.
    let owner = api.create(&pp, &cm("fg-owner", json!({}))).await.unwrap();
    let mut held = owned("fg-held", &owner);
    held.metadata.finalizers = Some(vec!["example.com/hold".into()]);
    api.create(&pp, &held).await.unwrap();
    api.create(&pp, &owned("fg-dep", &owner)).await.unwrap();
    api.delete("fg-owner", &DeleteParams::foreground())
        .await
        .unwrap();
    gone(&api, &["fg-dep"]).await;
    let o = api.get("fg-owner").await.unwrap();
    assert!(o.metadata.deletion_timestamp.is_some());
    assert!(
        o.finalizers().contains(&"foregroundDeletion".to_string()),
        "{:?}",
        o.finalizers()
    );
    let h = eventually("the held dependent to be marked for deletion", || {
        let api = api.clone();
        async move {
            api.get("fg-held")
                .await
                .ok()
                .filter(|h| h.metadata.deletion_timestamp.is_some())
        }
    })
    .await;
    assert_eq!(h.finalizers(), ["example.com/hold"]);
    assert!(
        api.get_opt("fg-owner").await.unwrap().is_some(),
        "the owner waits for its dependents"
    );
    api.patch(
        "fg-held",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    gone(&api, &["fg-held", "fg-owner"]).await;

    // Orphan: the owner goes, the dependents stay without the reference.
    let owner = api.create(&pp, &cm("or-owner", json!({}))).await.unwrap();
    api.create(&pp, &owned("or-dep", &owner)).await.unwrap();
    let dp = DeleteParams {
        propagation_policy: Some(PropagationPolicy::Orphan),
        ..Default::default()
    };
    api.delete("or-owner", &dp).await.unwrap();
    gone(&api, &["or-owner"]).await;
    let dep = api.get("or-dep").await.unwrap();
    assert!(
        dep.owner_references().is_empty(),
        "{:?}",
        dep.owner_references()
    );

    // A dependent created pointing at an owner that does not exist is collected.
    let ghost = cm("ghost", json!({}));
    let mut ghost = ghost;
    ghost.metadata.uid = Some("00000000-0000-4000-a000-000000000000".into());
    api.create(&pp, &owned("orphaned", &ghost)).await.unwrap();
    gone(&api, &["orphaned"]).await;
    assert!(api.get_opt("or-dep").await.unwrap().is_some());

    // Background, an owner held by a finalizer of its own (an operator's
    // cleanup): it still exists, so kube's collector keeps its dependents
    // until the finalizer is cleared and the owner is gone.
    let mut held_owner = cm("fin-owner", json!({}));
    held_owner.metadata.finalizers = Some(vec!["example.com/cleanup".into()]);
    let owner = api.create(&pp, &held_owner).await.unwrap();
    api.create(&pp, &owned("fin-dep", &owner)).await.unwrap();
    api.delete("fin-owner", &DeleteParams::background())
        .await
        .unwrap();
    // A later write to the dependent is a point by which the collector has
    // seen the owner's deletion mark (it handles writes in order).
    api.patch(
        "fin-dep",
        &PatchParams::default(),
        &Patch::Merge(json!({"data": {"seen": "1"}})),
    )
    .await
    .unwrap();
    let probe = api.create(&pp, &owned("fin-probe", &ghost)).await.unwrap();
    gone(&api, &[probe.metadata.name.as_deref().unwrap()]).await;
    let dep = api.get("fin-dep").await.unwrap();
    assert!(
        dep.metadata.deletion_timestamp.is_none(),
        "kept while the owner exists"
    );
    api.patch(
        "fin-owner",
        &PatchParams::default(),
        &Patch::Merge(json!({"metadata": {"finalizers": null}})),
    )
    .await
    .unwrap();
    gone(&api, &["fin-owner", "fin-dep"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pods_are_deleted_gracefully_by_the_kubelet() {
    use futures::StreamExt;
    use kube::api::WatchEvent;
    let s = start("graceful").await;
    let api: Api<Pod> = Api::default_namespaced(s.client().await);
    for name in ["slow", "now"] {
        api.create(&Default::default(), &pod(name)).await.unwrap();
    }
    for name in ["slow", "now"] {
        eventually(&format!("{name} to run"), || {
            let api = api.clone();
            async move {
                let p = api.get(name).await.ok()?;
                (p.status?.phase.as_deref() == Some("Running")).then_some(())
            }
        })
        .await;
    }
    let rv = api
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    let mut w = api.watch(&Default::default(), &rv).await.unwrap().boxed();
    let mut next = async || loop {
        match tokio::time::timeout(PATIENCE, w.next())
            .await
            .unwrap()
            .unwrap()
            .unwrap()
        {
            WatchEvent::Bookmark(_) => continue,
            e => return e,
        }
    };

    // A graceful delete marks the pod; the kubelet then removes it.
    api.delete("slow", &DeleteParams::default()).await.unwrap();
    match next().await {
        WatchEvent::Modified(p) => {
            assert_eq!(p.name_any(), "slow");
            assert!(p.metadata.deletion_timestamp.is_some());
            assert_eq!(p.metadata.deletion_grace_period_seconds, Some(30));
        }
        other => panic!("expected slow to be marked for deletion, got {other:?}"),
    }
    match next().await {
        WatchEvent::Deleted(p) => assert_eq!(p.name_any(), "slow"),
        other => panic!("expected slow DELETED, got {other:?}"),
    }
    // gracePeriodSeconds=0 deletes at once.
    api.delete(
        "now",
        &DeleteParams {
            grace_period_seconds: Some(0),
            ..Default::default()
        },
    )
    .await
    .unwrap();
    match next().await {
        WatchEvent::Deleted(p) => assert_eq!(p.name_any(), "now"),
        other => panic!("expected now DELETED, got {other:?}"),
    }
}
