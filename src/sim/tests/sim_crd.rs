//! Custom resources on the embedded API server through `kube::Client`:
//! openAPIV3Schema validation (422 naming the field), defaulting, pruning,
//! the status and scale subresources, generation, printer columns in Table
//! responses, and deregistration.
#![allow(clippy::unwrap_used)]

mod support;

use axum::http;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use serde_json::{Value, json};
use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn custom_resources_are_validated_defaulted_and_pruned() {
    let s = start("crd").await;
    let c = s.client().await;
    register_widgets(&c).await;
    let api: Api<DynamicObject> = Api::default_namespaced_with(c.clone(), &widget_resource());

    let w = api
        .create(
            &Default::default(),
            &widget(
                "w1",
                json!({"size": 3, "bogus": true, "extra": {"free": {"form": 1}}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(w.data["spec"]["replicas"], json!(1), "defaulted");
    assert_eq!(w.data["spec"]["color"], json!("red"), "defaulted");
    assert!(w.data["spec"].get("bogus").is_none(), "pruned: {}", w.data);
    assert_eq!(
        w.data["spec"]["extra"]["free"]["form"],
        json!(1),
        "preserved unknown fields"
    );
    assert_eq!(w.metadata.generation, Some(1));

    for (spec, field) in [
        (json!({"size": 20}), "spec.size"),
        (json!({}), "spec.size"),
        (json!({"size": 2, "color": "purple"}), "spec.color"),
        (json!({"size": "big"}), "spec.size"),
    ] {
        let st = api_err(
            api.create(&Default::default(), &widget("bad", spec.clone()))
                .await,
        );
        assert_eq!(st.code, 422, "{spec}: {st:?}");
        assert_eq!(st.reason, "Invalid");
        assert!(
            st.message.contains(field),
            "{spec}: message {:?} names {field}",
            st.message
        );
        let causes = st
            .details
            .as_ref()
            .map(|d| d.causes.clone())
            .unwrap_or_default();
        assert!(
            causes.iter().any(|c| c.field == field),
            "{spec}: causes {causes:?} name {field}"
        );
    }
    assert!(api.get_opt("bad").await.unwrap().is_none());

    // Deleting the CRD stops serving the kind.
    let crds: Api<CustomResourceDefinition> = Api::all(c.clone());
    crds.delete("widgets.example.com", &Default::default())
        .await
        .unwrap();
    eventually("widgets to stop being served", || {
        let api = api.clone();
        async move { (api_code(&api.list(&Default::default()).await.err()?) == Some(404)).then_some(()) }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_scale_subresources_and_generation() {
    let s = start("subresources").await;
    let c = s.client().await;
    register_widgets(&c).await;
    let api: Api<DynamicObject> = Api::default_namespaced_with(c.clone(), &widget_resource());
    let mut w = widget("w", json!({"size": 2}));
    w.data["status"] = json!({"phase": "Ignored"});
    let w = api.create(&Default::default(), &w).await.unwrap();
    assert!(
        w.data.get("status").is_none(),
        "status is not set on create: {}",
        w.data
    );

    // The status subresource writes status only.
    let pp = PatchParams::default();
    let st = api
        .patch_status(
            "w",
            &pp,
            &Patch::Merge(
                json!({"spec": {"size": 9}, "status": {"phase": "Ready", "replicas": 2}}),
            ),
        )
        .await
        .unwrap();
    assert_eq!(st.data["status"]["phase"], json!("Ready"));
    assert_eq!(
        st.data["spec"]["size"],
        json!(2),
        "/status cannot change spec"
    );
    assert_eq!(
        st.metadata.generation,
        Some(1),
        "status writes keep the generation"
    );

    // The main resource writes everything but status.
    let m = api
        .patch(
            "w",
            &pp,
            &Patch::Merge(json!({"spec": {"size": 4}, "status": {"phase": "Hacked"}})),
        )
        .await
        .unwrap();
    assert_eq!(m.data["spec"]["size"], json!(4));
    assert_eq!(
        m.data["status"]["phase"],
        json!("Ready"),
        "main writes cannot change status"
    );
    assert_eq!(
        m.metadata.generation,
        Some(2),
        "a spec change bumps the generation"
    );
    let l = api
        .patch(
            "w",
            &pp,
            &Patch::Merge(json!({"metadata": {"labels": {"x": "y"}}})),
        )
        .await
        .unwrap();
    assert_eq!(
        l.metadata.generation,
        Some(2),
        "a metadata change keeps the generation"
    );
    let mut whole = api.get_status("w").await.unwrap();
    whole.data["status"]["phase"] = json!("Degraded");
    let r = api
        .replace_status("w", &Default::default(), &whole)
        .await
        .unwrap();
    assert_eq!(r.data["status"]["phase"], json!("Degraded"));
    assert_eq!(r.metadata.generation, Some(2));

    // Scale reads spec.replicas and status.replicas and writes spec.replicas.
    let sc = api.get_scale("w").await.unwrap();
    assert_eq!(sc.spec.unwrap().replicas, Some(1));
    assert_eq!(sc.status.unwrap().replicas, 2);
    let sc = api
        .patch_scale("w", &pp, &Patch::Merge(json!({"spec": {"replicas": 5}})))
        .await
        .unwrap();
    assert_eq!(sc.spec.unwrap().replicas, Some(5));
    let w = api.get("w").await.unwrap();
    assert_eq!(w.data["spec"]["replicas"], json!(5));
    assert_eq!(w.metadata.generation, Some(3));
    let mut sc = api.get_scale("w").await.unwrap();
    sc.spec.as_mut().unwrap().replicas = Some(7);
    api.replace_scale("w", &Default::default(), &sc)
        .await
        .unwrap();
    assert_eq!(
        api.get("w").await.unwrap().data["spec"]["replicas"],
        json!(7)
    );
}

/// GET with `Accept: ...;as=Table`, as kubectl does.
async fn get_table(c: &kube::Client, path: &str) -> Value {
    let req = http::Request::get(path)
        .header(
            "Accept",
            "application/json;as=Table;v=v1;g=meta.k8s.io,application/json",
        )
        .body(vec![])
        .unwrap();
    c.request::<Value>(req).await.unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printer_columns_in_table_responses() {
    let s = start("table").await;
    let c = s.client().await;
    register_widgets(&c).await;
    let api: Api<DynamicObject> = Api::default_namespaced_with(c.clone(), &widget_resource());
    api.create(
        &Default::default(),
        &widget("w", json!({"size": 2, "replicas": 3, "color": "blue"})),
    )
    .await
    .unwrap();
    api.patch_status(
        "w",
        &Default::default(),
        &Patch::Merge(json!({"status": {"phase": "Ready"}})),
    )
    .await
    .unwrap();

    let t = get_table(&c, "/apis/example.com/v1/namespaces/default/widgets").await;
    assert_eq!(t["kind"], json!("Table"), "{t}");
    let names: Vec<&str> = t["columnDefinitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|c| c["name"].as_str().unwrap())
        .collect();
    for n in ["Name", "Replicas", "Color", "Phase"] {
        assert!(names.contains(&n), "{n} not in {names:?}");
    }
    let row = &t["rows"][0]["cells"];
    let cell = |n: &str| &row[names.iter().position(|x| *x == n).unwrap()];
    assert_eq!(cell("Name"), &json!("w"));
    assert_eq!(cell("Replicas"), &json!(3));
    assert_eq!(cell("Color"), &json!("blue"));
    assert_eq!(cell("Phase"), &json!("Ready"));
    let one = get_table(&c, "/apis/example.com/v1/namespaces/default/widgets/w").await;
    assert_eq!(one["rows"].as_array().unwrap().len(), 1);
}
