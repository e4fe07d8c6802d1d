//! The embedded API server through `kube::Client` over HTTPS: discovery
//! (legacy and aggregated), namespaces, CRUD of the built-in kinds, kind
//! defaults, pagination, selectors and bearer-token auth. Custom resources
//! are in `sim_crd.rs`.
#![allow(clippy::unwrap_used)]

mod support;

use futures::StreamExt;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{
    ConfigMap, Endpoints, Event, Namespace, PersistentVolumeClaim, Pod, Secret, Service,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::api::{Api, DeleteParams, ListParams, Patch, PostParams};
use kube::core::{GroupVersionKind, NamespaceResourceScope};
use kube::discovery::{Discovery, Scope};
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use std::fmt::Debug;
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discovery_finds_builtins_and_registered_crds() {
    let s = start("discovery").await;
    let client = s.client().await;
    let v = client.apiserver_version().await.unwrap();
    assert_eq!(v.major, "1");

    let d = Discovery::new(client.clone()).run().await.unwrap();
    for (g, k) in [
        ("", "Pod"),
        ("", "Namespace"),
        ("coordination.k8s.io", "Lease"),
        ("batch", "Job"),
        ("discovery.k8s.io", "EndpointSlice"),
        ("policy", "PodDisruptionBudget"),
        ("apiextensions.k8s.io", "CustomResourceDefinition"),
    ] {
        let (ar, caps) = d
            .resolve_gvk(&GroupVersionKind::gvk(g, "v1", k))
            .unwrap_or_else(|| panic!("discovery lacks {g}/v1 {k}"));
        assert_eq!(ar.kind, k);
        let want = if k == "Namespace" || k == "CustomResourceDefinition" {
            Scope::Cluster
        } else {
            Scope::Namespaced
        };
        assert_eq!(caps.scope, want, "scope of {k}");
    }
    let widget = GroupVersionKind::gvk("example.com", "v1", "Widget");
    assert!(d.resolve_gvk(&widget).is_none());

    register_widgets(&client).await;
    let d = Discovery::new(client.clone()).run().await.unwrap();
    let (ar, caps) = d
        .resolve_gvk(&widget)
        .expect("the CRD's kind after registering it");
    assert_eq!(ar.plural, "widgets");
    assert_eq!(caps.scope, Scope::Namespaced);
    let subs: Vec<&str> = caps
        .subresources
        .iter()
        .map(|(r, _)| r.plural.as_str())
        .collect();
    assert!(
        subs.contains(&"status") && subs.contains(&"scale"),
        "{subs:?}"
    );

    // Aggregated discovery (one request for /api, one for /apis) agrees.
    let agg = Discovery::new(client.clone())
        .run_aggregated()
        .await
        .unwrap();
    for (g, k) in [
        ("", "Pod"),
        ("coordination.k8s.io", "Lease"),
        ("example.com", "Widget"),
    ] {
        let gvk = GroupVersionKind::gvk(g, "v1", k);
        let (ar, caps) = agg
            .resolve_gvk(&gvk)
            .unwrap_or_else(|| panic!("aggregated discovery lacks {k}"));
        let (lar, lcaps) = d.resolve_gvk(&gvk).unwrap();
        assert_eq!(
            (&ar.plural, &caps.scope),
            (&lar.plural, &lcaps.scope),
            "{k}"
        );
        let subs = |c: &kube::discovery::ApiCapabilities| {
            let mut v: Vec<String> = c
                .subresources
                .iter()
                .map(|(r, _)| r.plural.clone())
                .collect();
            v.sort();
            v
        };
        assert_eq!(subs(&caps), subs(&lcaps), "subresources of {k}");
    }

    // shortNames and categories are in the APIResourceList kubectl reads.
    let list = client
        .list_api_group_resources("example.com/v1")
        .await
        .unwrap();
    let r = list.resources.iter().find(|r| r.name == "widgets").unwrap();
    assert_eq!(r.short_names.as_deref(), Some(&["wg".to_string()][..]));
    assert_eq!(r.categories.as_deref(), Some(&["gadgets".to_string()][..]));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn namespaces_scope_objects_and_delete_their_content() {
    let s = start("namespaces").await;
    let client = s.client().await;
    let nss: Api<Namespace> = Api::all(client.clone());
    let names: Vec<String> = nss
        .list(&Default::default())
        .await
        .unwrap()
        .iter()
        .map(|n| n.name_any())
        .collect();
    for n in ["default", "kube-system", "kube-public", "kube-node-lease"] {
        assert!(names.contains(&n.to_string()), "{n} missing from {names:?}");
    }
    let ns: Namespace =
        serde_json::from_value(json!({"metadata": {"name": "team-x", "labels": {"team": "x"}}}))
            .unwrap();
    let created = nss.create(&Default::default(), &ns).await.unwrap();
    assert_eq!(created.status.unwrap().phase.as_deref(), Some("Active"));

    // Objects live in their namespace only; a missing namespace is a 404.
    let cm: ConfigMap =
        serde_json::from_value(json!({"metadata": {"name": "c"}, "data": {"k": "v"}})).unwrap();
    let in_x: Api<ConfigMap> = Api::namespaced(client.clone(), "team-x");
    in_x.create(&Default::default(), &cm).await.unwrap();
    let in_default: Api<ConfigMap> = Api::default_namespaced(client.clone());
    assert_eq!(api_code(&in_default.get("c").await.unwrap_err()), Some(404));
    let nowhere: Api<ConfigMap> = Api::namespaced(client.clone(), "no-such-ns");
    assert_eq!(
        api_err(nowhere.create(&Default::default(), &cm).await).code,
        404
    );

    // Deleting a namespace deletes what is in it, then the namespace.
    nss.delete("team-x", &Default::default()).await.unwrap();
    eventually("team-x and its config map to go", || {
        let (nss, in_x) = (nss.clone(), in_x.clone());
        async move {
            let ns_gone = nss.get_opt("team-x").await.unwrap().is_none();
            let cm_gone = in_x.get_opt("c").await.unwrap().is_none();
            (ns_gone && cm_gone).then_some(())
        }
    })
    .await;
}

/// Sets the value at a JSON pointer of a typed object.
fn with<K: Serialize + DeserializeOwned>(obj: &K, ptr: &str, val: &Value) -> K {
    let mut v = serde_json::to_value(obj).unwrap();
    *v.pointer_mut(ptr)
        .unwrap_or_else(|| panic!("{ptr} missing")) = val.clone();
    serde_json::from_value(v).unwrap()
}

/// Create, get, list, replace and delete one namespaced object through its typed API.
async fn crud<K>(client: &kube::Client, obj: Value, ptr: &str, new_val: Value)
where
    K: Resource<Scope = NamespaceResourceScope, DynamicType = ()>
        + Clone
        + Debug
        + Serialize
        + DeserializeOwned,
{
    let api: Api<K> = Api::default_namespaced(client.clone());
    let kind = K::kind(&());
    let obj: K = serde_json::from_value(obj).unwrap();
    let name = obj.name_any();
    let created = api
        .create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {kind}: {e}"));
    assert!(created.uid().is_some(), "{kind} has a uid");
    assert!(
        created.resource_version().is_some(),
        "{kind} has a resourceVersion"
    );
    assert!(
        created.meta().creation_timestamp.is_some(),
        "{kind} has a creationTimestamp"
    );
    assert_eq!(created.namespace().as_deref(), Some("default"));
    let got = api.get(&name).await.unwrap();
    assert_eq!(got.uid(), created.uid());
    let listed = api.list(&Default::default()).await.unwrap();
    assert!(
        listed.iter().any(|o| o.name_any() == name),
        "{kind} {name} listed"
    );

    // A controller may write the object right after its creation (the PV
    // controller binds a claim): on a conflict, read again and retry, as
    // any client of a real API server does.
    let mut tries = 0;
    let (fresh, replaced) = loop {
        let fresh = api.get(&name).await.unwrap();
        match api
            .replace(&name, &PostParams::default(), &with(&fresh, ptr, &new_val))
            .await
        {
            Err(kube::Error::Api(s)) if s.code == 409 && tries < 10 => tries += 1,
            other => break (fresh, other.unwrap()),
        }
    };
    assert_ne!(replaced.resource_version(), fresh.resource_version());
    let v = serde_json::to_value(api.get(&name).await.unwrap()).unwrap();
    assert_eq!(v.pointer(ptr), Some(&new_val), "{kind} {ptr} after replace");

    api.delete(&name, &DeleteParams::default()).await.unwrap();
    eventually(&format!("{kind} {name} to be deleted"), || {
        let api = api.clone();
        let name = name.clone();
        async move { api.get_opt(&name).await.unwrap().is_none().then_some(()) }
    })
    .await;
    assert_eq!(api_code(&api.get(&name).await.unwrap_err()), Some(404));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crud_of_builtin_kinds() {
    let s = start("crud").await;
    let c = s.client().await;
    let pod = json!({"metadata": {"name": "p"}, "spec": {"containers": [{"name": "main", "image": "busybox"}]}});
    crud::<Pod>(&c, pod, "/spec/containers/0/image", json!("busybox:2")).await;
    let svc = json!({"metadata": {"name": "s"}, "spec": {"selector": {"app": "x"}, "ports": [{"port": 5432}]}});
    crud::<Service>(&c, svc, "/spec/selector/app", json!("y")).await;
    crud::<ConfigMap>(
        &c,
        json!({"metadata": {"name": "cm"}, "data": {"a": "1"}}),
        "/data/a",
        json!("2"),
    )
    .await;
    crud::<Secret>(
        &c,
        json!({"metadata": {"name": "sec"}, "data": {"pw": "aHVudGVyMg=="}}),
        "/data/pw",
        json!("c2VjcmV0"),
    )
    .await;
    let ev = json!({"metadata": {"name": "ev1"}, "involvedObject": {"kind": "Pod", "name": "p", "namespace": "default"},
        "reason": "Started", "message": "hello", "type": "Normal"});
    crud::<Event>(&c, ev, "/message", json!("bye")).await;
    let ep = json!({"metadata": {"name": "s"}, "subsets": [{"addresses": [{"ip": "127.0.0.2"}], "ports": [{"port": 5432}]}]});
    crud::<Endpoints>(&c, ep, "/subsets/0/addresses/0/ip", json!("127.0.0.3")).await;
    let pvc = json!({"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": "1Gi"}}}});
    crud::<PersistentVolumeClaim>(&c, pvc, "/spec/resources/requests/storage", json!("2Gi")).await;
    let slice = json!({"metadata": {"name": "s-abc", "labels": {"kubernetes.io/service-name": "s"}}, "addressType": "IPv4",
        "endpoints": [{"addresses": ["127.0.0.2"], "conditions": {"ready": true}}], "ports": [{"port": 5432}]});
    crud::<EndpointSlice>(&c, slice, "/endpoints/0/addresses/0", json!("127.0.0.9")).await;
    let pdb = json!({"metadata": {"name": "pdb"}, "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "x"}}}});
    crud::<PodDisruptionBudget>(&c, pdb, "/spec/minAvailable", json!(2)).await;
    let lease = json!({"metadata": {"name": "leader"}, "spec": {"holderIdentity": "a", "leaseDurationSeconds": 15}});
    crud::<Lease>(&c, lease, "/spec/holderIdentity", json!("b")).await;
    let job = json!({"metadata": {"name": "j"}, "spec": {"template": {"spec": {"restartPolicy": "Never",
        "containers": [{"name": "main", "image": "busybox", "command": ["true"]}]}}}});
    crud::<Job>(
        &c,
        job,
        "/spec/template/spec/containers/0/image",
        json!("busybox:2"),
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn services_get_a_cluster_ip_and_secrets_fold_string_data() {
    let s = start("defaults").await;
    let c = s.client().await;
    let svcs: Api<Service> = Api::default_namespaced(c.clone());
    let svc: Service = serde_json::from_value(
        json!({"metadata": {"name": "db"}, "spec": {"ports": [{"port": 5432}]}}),
    )
    .unwrap();
    let svc = svcs.create(&Default::default(), &svc).await.unwrap();
    let spec = svc.spec.unwrap();
    let ip: std::net::Ipv4Addr = spec.cluster_ip.unwrap().parse().unwrap();
    assert!(ip.is_loopback());
    assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));

    let secrets: Api<Secret> = Api::default_namespaced(c.clone());
    let sec: Secret = serde_json::from_value(
        json!({"metadata": {"name": "pw"}, "stringData": {"password": "hunter2"}}),
    )
    .unwrap();
    let sec = secrets.create(&Default::default(), &sec).await.unwrap();
    assert!(sec.string_data.is_none(), "stringData is write-only");
    assert_eq!(sec.data.unwrap()["password"].0, b"hunter2");
    assert_eq!(sec.type_.as_deref(), Some("Opaque"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lists_paginate_with_limit_and_continue() {
    let s = start("paging").await;
    let c = s.client().await;
    let api: Api<ConfigMap> = Api::default_namespaced(c.clone());
    let mut want = vec![];
    for i in 0..7 {
        let name = format!("cm-{i}");
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": {"batch": "one"}}}))
                .unwrap();
        api.create(&Default::default(), &cm).await.unwrap();
        want.push(name);
    }
    let mut got = vec![];
    let mut lp = ListParams::default().labels("batch=one").limit(3);
    let mut revisions = vec![];
    let mut first_token = None;
    loop {
        let page = api.list(&lp).await.unwrap();
        assert!(page.items.len() <= 3);
        revisions.push(page.metadata.resource_version.clone().unwrap());
        got.extend(page.items.iter().map(|o| o.name_any()));
        if revisions.len() == 1 {
            // A change to an object already returned, while paging.
            api.patch(
                "cm-0",
                &Default::default(),
                &Patch::Merge(json!({"data": {"k": "changed"}})),
            )
            .await
            .unwrap();
        }
        match page.metadata.continue_.filter(|t| !t.is_empty()) {
            Some(t) => {
                first_token.get_or_insert(t.clone());
                lp = lp.continue_token(&t)
            }
            None => break,
        }
    }
    assert_eq!(revisions.len(), 3, "7 objects in pages of 3");
    got.sort();
    assert_eq!(got, want, "every object exactly once");
    // Every page carries the first page's revision, so a watch from the last
    // page's revision replays the change made while paging.
    assert!(
        revisions.iter().all(|r| *r == revisions[0]),
        "{revisions:?}"
    );
    let mut w = api
        .watch(&Default::default(), revisions.last().unwrap())
        .await
        .unwrap()
        .boxed();
    let ev = tokio::time::timeout(PATIENCE, w.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    match ev {
        kube::api::WatchEvent::Modified(o) => assert_eq!(o.name_any(), "cm-0"),
        other => panic!("expected cm-0 MODIFIED, got {other:?}"),
    }

    let bad = api
        .list(&ListParams::default().limit(2).continue_token("garbage!"))
        .await;
    assert_eq!(api_err(bad).code, 400);
    // Once the first page's revision is compacted away, its token expires.
    s.cluster().cluster.store.compact();
    let expired = api
        .list(
            &ListParams::default()
                .limit(3)
                .continue_token(&first_token.unwrap()),
        )
        .await;
    let st = api_err(expired);
    assert_eq!((st.code, st.reason.as_str()), (410, "Expired"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn label_and_field_selectors() {
    let s = start("selectors").await;
    let c = s.client().await;
    let nss: Api<Namespace> = Api::all(c.clone());
    nss.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": "other"}})).unwrap(),
    )
    .await
    .unwrap();
    let api: Api<ConfigMap> = Api::default_namespaced(c.clone());
    for (name, labels) in [
        ("a", json!({"env": "prod", "tier": "web"})),
        ("b", json!({"env": "dev", "tier": "db"})),
        ("c", json!({"env": "prod"})),
        ("d", json!({})),
    ] {
        let cm: ConfigMap =
            serde_json::from_value(json!({"metadata": {"name": name, "labels": labels}})).unwrap();
        api.create(&Default::default(), &cm).await.unwrap();
    }
    let other: Api<ConfigMap> = Api::namespaced(c.clone(), "other");
    other
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "a", "labels": {"env": "prod"}}}))
                .unwrap(),
        )
        .await
        .unwrap();

    let names = |api: Api<ConfigMap>, lp: ListParams| async move {
        let mut v: Vec<String> = api
            .list(&lp)
            .await
            .unwrap()
            .iter()
            .map(|o| o.name_any())
            .collect();
        v.sort();
        v.join(",")
    };
    for (sel, want) in [
        ("env=prod", "a,c"),
        ("env==prod", "a,c"),
        ("env!=prod", "b,d"),
        ("env in (prod,dev)", "a,b,c"),
        ("env notin (prod)", "b,d"),
        ("tier", "a,b"),
        ("!tier", "c,d"),
        ("env=prod,tier", "a"),
    ] {
        assert_eq!(
            names(api.clone(), ListParams::default().labels(sel)).await,
            want,
            "labels {sel}"
        );
    }
    assert_eq!(
        names(api.clone(), ListParams::default().fields("metadata.name=b")).await,
        "b"
    );
    assert_eq!(
        names(
            api.clone(),
            ListParams::default().fields("metadata.name!=b")
        )
        .await,
        "a,c,d"
    );
    let all: Api<ConfigMap> = Api::all(c.clone());
    let ns_of = |lp: ListParams| {
        let all = all.clone();
        async move {
            let mut v: Vec<String> = all
                .list(&lp)
                .await
                .unwrap()
                .iter()
                .map(|o| format!("{}/{}", o.namespace().unwrap(), o.name_any()))
                .collect();
            v.sort();
            v.join(",")
        }
    };
    assert_eq!(
        ns_of(ListParams::default().fields("metadata.namespace=other")).await,
        "other/a"
    );
    assert_eq!(
        ns_of(ListParams::default().fields("metadata.name=a")).await,
        "default/a,other/a"
    );
    assert_eq!(
        ns_of(ListParams::default().fields("metadata.name=a,metadata.namespace=other")).await,
        "other/a"
    );
    assert_eq!(
        ns_of(
            ListParams::default()
                .fields("metadata.namespace!=default")
                .labels("env=prod")
        )
        .await,
        "other/a"
    );
    let bad = api
        .list(&ListParams::default().labels("env in (prod"))
        .await;
    assert_eq!(api_err(bad).code, 400);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bearer_token_is_required() {
    let s = start("auth").await;
    let good = s.client().await;
    let pods: Api<Pod> = Api::default_namespaced(good.clone());
    pods.list(&Default::default()).await.unwrap();

    let text = std::fs::read_to_string(s.kubeconfig()).unwrap();
    let wrong = text.replace(&s.cluster().token, "not-the-token");
    assert_ne!(wrong, text);
    let path = s.dir.join("wrong.kubeconfig");
    std::fs::write(&path, wrong).unwrap();
    let bad = client_from(&path).await;
    let st = api_err(
        Api::<Pod>::default_namespaced(bad.clone())
            .list(&Default::default())
            .await,
    );
    assert_eq!(st.code, 401);
    assert_eq!(
        api_code(&bad.apiserver_version().await.unwrap_err()),
        Some(401)
    );

    let none = text.replace(&format!("token: {}", s.cluster().token), "{}");
    assert_ne!(none, text);
    let path = s.dir.join("anonymous.kubeconfig");
    std::fs::write(&path, none).unwrap();
    let anon = client_from(&path).await;
    let st = api_err(
        Api::<Pod>::default_namespaced(anon)
            .list(&Default::default())
            .await,
    );
    assert_eq!(st.code, 401);
}
