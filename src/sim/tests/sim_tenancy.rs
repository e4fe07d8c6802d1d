//! The emulator holds the lines a real API server holds against a tenant
//! (issue 19): a service-account token is issued by the token controller
//! only, the admin endpoint answers nobody without a token, names and labels
//! a real cluster refuses are refused here with kube's 422 text, Pod
//! Security `enforce` labels are enforced with kube's 403, and the process
//! runtime writes Secret files owner-only (honouring `defaultMode`).
#![allow(clippy::unwrap_used)]

mod support;

use base64::Engine;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Secret, Service, ServiceAccount};
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde::de::DeserializeOwned;
use serde_json::{Value, json};
use support::*;

fn obj<T: DeserializeOwned>(v: Value) -> T {
    serde_json::from_value(v).unwrap()
}

/// A client of cluster "a" that presents `token` instead of the admin one.
async fn client_with_token(s: &TestSim, token: &str) -> kube::Client {
    let c = s.cluster();
    let ca = c.cluster.ca_pem.get().unwrap();
    let path = s
        .dir
        .join(format!("token-{}.kubeconfig", &token[..4.min(token.len())]));
    std::fs::write(
        &path,
        pgfleet_sim::kubeconfig_yaml(&c.name, c.addr, token, ca),
    )
    .unwrap();
    client_without_retries(&path).await
}

fn b64(s: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(s)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_secret_creator_cannot_choose_a_service_account_token() {
    let s = start("tenancy-token").await;
    let client = s.client().await;
    let pp = PostParams::default();
    let sas: Api<ServiceAccount> = Api::default_namespaced(client.clone());
    sas.create(&pp, &obj(json!({"metadata": {"name": "robot"}})))
        .await
        .unwrap();
    let secrets: Api<Secret> = Api::default_namespaced(client.clone());
    let chosen = "chosen-by-the-tenant-0123456789";
    let created = secrets
        .create(
            &pp,
            &obj(json!({
                "metadata": {"name": "robot-token",
                    "annotations": {"kubernetes.io/service-account.name": "robot"}},
                "type": "kubernetes.io/service-account-token",
                "data": {"token": b64(chosen), "namespace": b64("kube-system")},
            })),
        )
        .await
        .unwrap();
    let data = created.data.unwrap();
    let issued = String::from_utf8(data["token"].0.clone()).unwrap();
    assert_ne!(issued, chosen, "the creator's token was kept");
    assert_eq!(
        data["namespace"].0, b"default",
        "the namespace is the controller's"
    );

    // The chosen token authenticates nobody; the issued one is the robot.
    let forged = client_with_token(&s, chosen).await;
    let err = api_err(
        Api::<ConfigMap>::default_namespaced(forged)
            .list(&Default::default())
            .await,
    );
    assert_eq!(err.code, 401, "{err:?}");
    let robot = client_with_token(&s, &issued).await;
    let err = api_err(
        Api::<ConfigMap>::default_namespaced(robot)
            .list(&Default::default())
            .await,
    );
    assert_eq!(err.code, 403, "authenticated, no role bound: {err:?}");
    assert!(
        err.message.contains("system:serviceaccount:default:robot"),
        "{err:?}"
    );

    // A later write cannot swap the token either.
    let patched = secrets
        .patch(
            "robot-token",
            &PatchParams::default(),
            &Patch::Merge(json!({"data": {"token": b64(chosen)}})),
        )
        .await
        .unwrap();
    assert_eq!(patched.data.unwrap()["token"].0, issued.as_bytes());

    // Nor can an Opaque Secret holding a chosen token become a token Secret.
    secrets
        .create(
            &pp,
            &obj(json!({"metadata": {"name": "sneaky",
                "annotations": {"kubernetes.io/service-account.name": "robot"}},
                "data": {"token": b64(chosen)}})),
        )
        .await
        .unwrap();
    let err = api_err(
        secrets
            .patch(
                "sneaky",
                &PatchParams::default(),
                &Patch::Merge(json!({"type": "kubernetes.io/service-account-token"})),
            )
            .await,
    );
    assert_eq!(err.code, 422, "{err:?}");
    assert!(err.message.contains("field is immutable"), "{err:?}");
    let forged = client_with_token(&s, chosen).await;
    let err = api_err(
        Api::<ConfigMap>::default_namespaced(forged)
            .list(&Default::default())
            .await,
    );
    assert_eq!(err.code, 401, "{err:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_endpoint_lists_clusters_only_for_their_token() {
    let s = start("tenancy-admin").await;
    let admin = s.sim.admin_addr.unwrap();
    let token = s.cluster().token.clone();
    let (code, body) = admin_request(admin, "GET", "/clusters", "", None).await;
    assert_eq!(code, 401);
    assert!(!body.contains(&s.cluster().addr.to_string()), "{body}");
    let (code, _) = admin_request(admin, "GET", "/clusters", "not-the-token", None).await;
    assert_eq!(code, 401);
    let (code, body) = admin_request(admin, "GET", "/clusters", &token, None).await;
    assert_eq!(code, 200);
    let v: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(v["clusters"][0]["name"], "a");
    let (code, _) = admin_request(admin, "GET", "/clusters/nope/faults", &token, None).await;
    assert_eq!(code, 401, "an unknown cluster is not confirmed either");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn names_and_labels_a_real_api_server_refuses_are_refused() {
    let s = start("tenancy-names").await;
    let client = s.client().await;
    let pp = PostParams::default();
    let svcs: Api<Service> = Api::default_namespaced(client.clone());
    let svc = |name: &str| -> Service {
        obj(json!({"metadata": {"name": name},
            "spec": {"ports": [{"port": 5432}]}}))
    };
    // A Service name must start with a letter (DNS-1035), a Pod's need not.
    let err = api_err(svcs.create(&pp, &svc("1orders-rw")).await);
    assert_eq!(err.code, 422);
    assert_eq!(
        err.message,
        "Service \"1orders-rw\" is invalid: metadata.name: Invalid value: \"1orders-rw\": a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
    );
    // What a 70-character PostgresCluster name makes: `<name>-rw`.
    let long = format!("{}-rw", "a".repeat(70));
    let err = api_err(svcs.create(&pp, &svc(&long)).await);
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("must be no more than 63 characters"),
        "{err:?}"
    );
    svcs.create(&pp, &svc(&"a".repeat(63))).await.unwrap();

    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let cm = |name: &str, labels: Value| -> ConfigMap {
        obj(json!({"metadata": {"name": name, "labels": labels}}))
    };
    for bad in ["a..b", "a.-b", "Upper", &"a".repeat(254)] {
        let err = api_err(cms.create(&pp, &cm(bad, json!({}))).await);
        assert_eq!(err.code, 422, "{bad}: {err:?}");
        assert!(
            err.message.contains("metadata.name: Invalid value"),
            "{err:?}"
        );
    }
    cms.create(&pp, &cm("a.b-c.1", json!({}))).await.unwrap();
    cms.create(&pp, &cm(&"a".repeat(253), json!({})))
        .await
        .unwrap();
    // A label value over 63 characters (a long name copied into a label).
    let err = api_err(
        cms.create(
            &pp,
            &cm("labelled", json!({"pgfleet.io/cluster": "x".repeat(64)})),
        )
        .await,
    );
    assert_eq!(err.code, 422);
    assert!(
        err.message.contains("metadata.labels: Invalid value")
            && err.message.contains("must be no more than 63 characters"),
        "{err:?}"
    );
    // RBAC names are path segments: kube's own `system:` roles are valid.
    let roles: Api<k8s_openapi::api::rbac::v1::ClusterRole> = Api::all(client.clone());
    roles
        .create(
            &pp,
            &obj(json!({"metadata": {"name": "system:tenant-reader"}, "rules": []})),
        )
        .await
        .unwrap();
}

fn restricted_ns(name: &str) -> Namespace {
    obj(json!({"metadata": {"name": name,
        "labels": {"pod-security.kubernetes.io/enforce": "restricted"}}}))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restricted_namespace_refuses_a_violating_pod_like_kube() {
    let s = start("tenancy-psa").await;
    let client = s.client().await;
    let pp = PostParams::default();
    Api::<Namespace>::all(client.clone())
        .create(&pp, &restricted_ns("tenant"))
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "tenant");
    let bad: Pod = obj(json!({"metadata": {"name": "root-shell"},
        "spec": {"hostPID": true, "containers": [{"name": "sh", "image": "busybox",
            "securityContext": {"privileged": true}}],
            "volumes": [{"name": "host", "hostPath": {"path": "/"}}]}}));
    let err = api_err(pods.create(&pp, &bad).await);
    assert_eq!(err.code, 403, "{err:?}");
    assert_eq!(err.reason, "Forbidden");
    assert!(
        err.message.starts_with(
            "pods \"root-shell\" is forbidden: violates PodSecurity \"restricted:latest\": host namespaces (hostPID=true), privileged (container \"sh\" must not set securityContext.privileged=true)"
        ),
        "{err:?}"
    );
    for part in [
        "hostPath volumes (volume \"host\")",
        "allowPrivilegeEscalation != false",
        "unrestricted capabilities",
        "runAsNonRoot != true",
        "seccompProfile",
    ] {
        assert!(err.message.contains(part), "{part}: {err:?}");
    }
    assert!(pods.get_opt("root-shell").await.unwrap().is_none());
    // Server-side apply creating a Pod is admitted the same way.
    let err = api_err(
        pods.patch(
            "applied",
            &PatchParams::apply("tenant"),
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": "applied"},
                "spec": {"containers": [{"name": "c", "image": "x"}]}})),
        )
        .await,
    );
    assert_eq!(err.code, 403, "{err:?}");

    // Baseline allows what restricted refuses; no label enforces nothing.
    Api::<Namespace>::all(client.clone())
        .patch(
            "tenant",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "baseline"}}}),
            ),
        )
        .await
        .unwrap();
    let plain: Pod = obj(json!({"metadata": {"name": "plain"},
        "spec": {"containers": [{"name": "c", "image": "x"}]}}));
    pods.create(&pp, &plain).await.unwrap();
    let err = api_err(pods.create(&pp, &bad).await);
    assert!(
        err.message
            .contains("violates PodSecurity \"baseline:latest\""),
        "{err:?}"
    );
    Api::<Pod>::default_namespaced(client)
        .create(&pp, &bad)
        .await
        .unwrap();
}

/// Octal permission bits of a file inside a pod, via exec.
async fn mode_in_pod(pods: &Api<Pod>, pod: &str, path: &str) -> String {
    let (out, err, status) = exec_in(pods, pod, &["stat", "-L", "-c", "%a", path]).await;
    assert!(
        !out.trim().is_empty(),
        "stat {path} in {pod} printed nothing: stderr {err:?}, status {status:?}"
    );
    out.trim().to_string()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn process_runtime_writes_secret_files_owner_only_under_restricted() {
    // Address index 40: no other process-runtime test uses it.
    let opts = process_options("tenancy-modes", 40);
    let sim = TestSim::start(opts).await;
    let client = client_from(&sim.sim.clusters[40].kubeconfig).await;
    let pp = PostParams::default();
    Api::<Namespace>::all(client.clone())
        .create(&pp, &restricted_ns("tenant"))
        .await
        .unwrap();
    Api::<Secret>::namespaced(client.clone(), "tenant")
        .create(
            &pp,
            &obj(json!({"metadata": {"name": "pw"}, "stringData": {"password": "s3cret"}})),
        )
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(client.clone(), "tenant")
        .create(
            &pp,
            &obj(json!({"metadata": {"name": "cfg"}, "data": {"a": "1"}})),
        )
        .await
        .unwrap();
    let pods: Api<Pod> = Api::namespaced(client.clone(), "tenant");
    let pod: Pod = obj(json!({"metadata": {"name": "reader"}, "spec": {
        "securityContext": {"runAsUser": 999, "runAsNonRoot": true,
                            "seccompProfile": {"type": "RuntimeDefault"}},
        "automountServiceAccountToken": false,
        "terminationGracePeriodSeconds": 1,
        "containers": [{"name": "c", "image": "x", "command": ["/bin/sh", "-c", "exec sleep 3600"],
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}},
            "volumeMounts": [
                {"name": "plain", "mountPath": "/etc/plain"},
                {"name": "moded", "mountPath": "/etc/moded"},
                {"name": "proj", "mountPath": "/etc/proj"},
                {"name": "cfg", "mountPath": "/etc/cfg"}]}],
        "volumes": [
            {"name": "plain", "secret": {"secretName": "pw"}},
            {"name": "moded", "secret": {"secretName": "pw", "defaultMode": 0o440}},
            {"name": "proj", "projected": {"sources": [{"secret": {"name": "pw"}}]}},
            {"name": "cfg", "configMap": {"name": "cfg"}}],
    }}));
    pods.create(&pp, &pod).await.unwrap();
    eventually("the reader pod running", || async {
        let p = pods.get("reader").await.ok()?;
        (p.status?.phase.as_deref() == Some("Running")).then_some(())
    })
    .await;
    assert_eq!(
        mode_in_pod(&pods, "reader", "/etc/plain/password").await,
        "600"
    );
    assert_eq!(
        mode_in_pod(&pods, "reader", "/etc/moded/password").await,
        "440"
    );
    assert_eq!(
        mode_in_pod(&pods, "reader", "/etc/proj/password").await,
        "600"
    );
    assert_eq!(mode_in_pod(&pods, "reader", "/etc/cfg/a").await, "644");
}
