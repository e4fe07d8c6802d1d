#![allow(clippy::unwrap_used)]
use super::*;
use serde_json::json;

/// The smallest Pod that passes restricted.
fn good() -> Value {
    json!({"spec": {
        "securityContext": {"runAsNonRoot": true, "seccompProfile": {"type": "RuntimeDefault"}},
        "containers": [{"name": "app", "image": "x",
            "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]}}}],
        "volumes": [{"name": "d", "emptyDir": {}}, {"name": "s", "secret": {"secretName": "s"}}],
    }})
}

#[test]
fn namespace_label_picks_the_level_and_unknown_is_restricted() {
    let ns = |v: &str| json!({"metadata": {"labels": {ENFORCE_LABEL: v}}});
    assert_eq!(Level::of_namespace(&ns("baseline")), Some(Level::Baseline));
    assert_eq!(
        Level::of_namespace(&ns("privileged")),
        Some(Level::Privileged)
    );
    assert_eq!(
        Level::of_namespace(&ns("restricted")),
        Some(Level::Restricted)
    );
    assert_eq!(Level::of_namespace(&ns("bogus")), Some(Level::Restricted));
    assert_eq!(Level::of_namespace(&json!({"metadata": {}})), None);
}

#[test]
fn a_compliant_pod_is_admitted_at_every_level() {
    for l in [Level::Privileged, Level::Baseline, Level::Restricted] {
        assert_eq!(admit(l, "p", &good()), Ok(()));
    }
}

#[test]
fn a_bare_pod_passes_baseline_but_not_restricted_with_kubes_message() {
    let bare = json!({"spec": {"containers": [{"name": "app", "image": "x"}]}});
    assert_eq!(admit(Level::Baseline, "p", &bare), Ok(()));
    let err = admit(Level::Restricted, "p", &bare).unwrap_err();
    assert_eq!(
        err,
        "pods \"p\" is forbidden: violates PodSecurity \"restricted:latest\": \
         allowPrivilegeEscalation != false (container \"app\" must set securityContext.allowPrivilegeEscalation=false), \
         unrestricted capabilities (container \"app\" must set securityContext.capabilities.drop=[\"ALL\"]), \
         runAsNonRoot != true (pod or container \"app\" must set securityContext.runAsNonRoot=true), \
         seccompProfile (pod or container \"app\" must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\")"
    );
}

#[test]
fn baseline_refuses_host_access_and_privilege() {
    let mut p = good();
    p["spec"]["hostNetwork"] = json!(true);
    p["spec"]["hostPID"] = json!(true);
    p["spec"]["containers"][0]["securityContext"]["privileged"] = json!(true);
    p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["SYS_ADMIN"]);
    p["spec"]["containers"][0]["ports"] = json!([{"containerPort": 80, "hostPort": 80}]);
    p["spec"]["volumes"] = json!([{"name": "root", "hostPath": {"path": "/"}}]);
    let v = violations(Level::Baseline, &p);
    assert_eq!(
        v,
        vec![
            "host namespaces (hostNetwork=true, hostPID=true)",
            "privileged (container \"app\" must not set securityContext.privileged=true)",
            "non-default capabilities (container \"app\" must not include \"SYS_ADMIN\" in securityContext.capabilities.add)",
            "hostPath volumes (volume \"root\")",
            "hostPort (container \"app\" uses hostPort 80)",
        ]
    );
    // Restricted adds the volume type and the capability again.
    let r = violations(Level::Restricted, &p).join(", ");
    assert!(r.contains(
        "restricted volume types (volume \"root\" uses restricted volume type \"hostPath\")"
    ));
    assert!(
        r.contains("unrestricted capabilities (container \"app\" must not include \"SYS_ADMIN\"")
    );
}

#[test]
fn restricted_allows_net_bind_service_only() {
    let mut p = good();
    p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] =
        json!(["NET_BIND_SERVICE"]);
    assert_eq!(admit(Level::Restricted, "p", &p), Ok(()));
    p["spec"]["containers"][0]["securityContext"]["capabilities"]["add"] = json!(["CHOWN"]);
    assert!(admit(Level::Baseline, "p", &p).is_ok());
    assert!(admit(Level::Restricted, "p", &p).is_err());
}

#[test]
fn container_settings_override_the_pod() {
    let mut p = good();
    p["spec"]["containers"][0]["securityContext"]["runAsNonRoot"] = json!(false);
    p["spec"]["initContainers"] = json!([{"name": "init",
        "securityContext": {"allowPrivilegeEscalation": false, "capabilities": {"drop": ["ALL"]},
                            "runAsUser": 0, "seccompProfile": {"type": "Unconfined"}}}]);
    let v = violations(Level::Restricted, &p).join(", ");
    assert!(
        v.contains("container \"app\" must not set securityContext.runAsNonRoot=false"),
        "{v}"
    );
    assert!(
        v.contains("runAsUser=0 (container \"init\" must not set runAsUser=0)"),
        "{v}"
    );
    assert!(
        v.contains("seccompProfile.type \"Unconfined\" is forbidden"),
        "{v}"
    );
    // Without the Pod-level settings every container must set them itself.
    let mut q = good();
    q["spec"]["securityContext"] = json!({});
    q["spec"]["containers"].as_array_mut().unwrap().push(
        json!({"name": "b", "securityContext": {"allowPrivilegeEscalation": false,
            "capabilities": {"drop": ["ALL"]}, "runAsNonRoot": true,
            "seccompProfile": {"type": "Localhost"}}}),
    );
    let v = violations(Level::Restricted, &q).join(", ");
    assert!(
        v.contains("pod or container \"app\" must set securityContext.runAsNonRoot=true"),
        "{v}"
    );
    assert!(!v.contains("\"b\""), "{v}");
}

#[test]
fn several_containers_are_named_together() {
    let p = json!({"spec": {"containers": [{"name": "a"}, {"name": "b"}]}});
    let v = violations(Level::Restricted, &p).join(", ");
    assert!(
        v.contains(
            "containers \"a\", \"b\" must set securityContext.allowPrivilegeEscalation=false"
        ),
        "{v}"
    );
}

#[test]
fn pgfleets_own_pods_pass_restricted() {
    use crate::controller::build::{Owner, pod};
    use crate::crd::PostgresCluster;
    let mut pg = PostgresCluster::new(
        "orders",
        serde_json::from_value(json!({"clusterSize": 2, "version": "15.20",
            "pooler": {"enabled": true}}))
        .unwrap(),
    );
    pg.metadata.namespace = Some("shop".into());
    pg.metadata.uid = Some("u-1".into());
    let o = Owner::of(&pg, 1).unwrap();
    let instance = pod(&o, &pg, 1, crate::crd::Role::Primary, "initdb", &[]);
    assert_eq!(admit(Level::Restricted, "orders-1", &instance), Ok(()));
    assert_eq!(instance["spec"]["automountServiceAccountToken"], false);
    let pooler = crate::controller::pooler::pod(&o, 1);
    assert_eq!(admit(Level::Restricted, "orders-pooler-1", &pooler), Ok(()));
    assert_eq!(pooler["spec"]["automountServiceAccountToken"], false);
}
