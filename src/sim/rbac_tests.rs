use super::*;
use crate::server::Query;
use serde_json::json;

fn attrs(method: &str, url: &str) -> Vec<Attributes> {
    let (path, q) = url.split_once('?').unwrap_or((url, ""));
    attributes(method, path, &Query::parse(Some(q)))
}

fn one(method: &str, url: &str) -> Attributes {
    let mut v = attrs(method, url);
    assert_eq!(v.len(), 1, "{v:?}");
    v.remove(0)
}

#[test]
fn requests_become_kube_attributes() {
    let a = one("GET", "/apis/pgfleet.io/v1/postgresclusters?watch=true");
    assert_eq!(
        (
            a.verb.as_str(),
            a.group.as_str(),
            a.resource.as_str(),
            a.namespace.as_str()
        ),
        ("watch", "pgfleet.io", "postgresclusters", "")
    );
    let a = one(
        "PATCH",
        "/apis/pgfleet.io/v1/namespaces/db/postgresclusters/orders/status",
    );
    assert_eq!(a.qualified_resource(), "postgresclusters/status");
    assert_eq!((a.namespace.as_str(), a.name.as_str()), ("db", "orders"));
    assert_eq!(
        one(
            "DELETE",
            "/api/v1/namespaces/db/persistentvolumeclaims?labelSelector=a"
        )
        .verb,
        "deletecollection"
    );
    assert_eq!(one("GET", "/api/v1/namespaces/db/pods").verb, "list");
    // A namespace object is named by its own namespace, as kube does.
    let a = one("PATCH", "/api/v1/namespaces/pgfleet-system");
    assert_eq!(
        (a.resource.as_str(), a.name.as_str(), a.namespace.as_str()),
        ("namespaces", "pgfleet-system", "pgfleet-system")
    );
    let a = one(
        "GET",
        "/api/v1/namespaces/x/configmaps?fieldSelector=metadata.name%3Dc&watch=1",
    );
    assert_eq!((a.verb.as_str(), a.name.as_str()), ("watch", "c"));
    let a = one("GET", "/version");
    assert!(!a.is_resource() && is_public_discovery(&a));
}

#[test]
fn exec_needs_get_and_create() {
    let v = attrs("GET", "/api/v1/namespaces/db/pods/orders-1/exec?command=sh");
    let verbs: Vec<&str> = v.iter().map(|a| a.verb.as_str()).collect();
    assert_eq!(verbs, ["get", "create"]);
    assert!(v.iter().all(|a| a.qualified_resource() == "pods/exec"));
}

#[test]
fn rules_match_like_kube() {
    let rule =
        json!({"apiGroups": [""], "resources": ["pods", "pods/exec"], "verbs": ["get", "create"]});
    assert!(rule_allows(
        &rule,
        &one("GET", "/api/v1/namespaces/a/pods/p")
    ));
    assert!(!rule_allows(
        &rule,
        &one("DELETE", "/api/v1/namespaces/a/pods/p")
    ));
    assert!(!rule_allows(
        &rule,
        &one("GET", "/api/v1/namespaces/a/pods/p/log")
    ));
    assert!(!rule_allows(
        &rule,
        &one("GET", "/apis/apps/v1/namespaces/a/pods/p")
    ));
    let named = json!({"apiGroups": [""], "resources": ["namespaces"], "verbs": ["patch"], "resourceNames": ["pgfleet-system"]});
    assert!(rule_allows(
        &named,
        &one("PATCH", "/api/v1/namespaces/pgfleet-system")
    ));
    assert!(!rule_allows(
        &named,
        &one("PATCH", "/api/v1/namespaces/other")
    ));
    let star = json!({"apiGroups": ["*"], "resources": ["*"], "verbs": ["*"]});
    assert!(rule_allows(
        &star,
        &one("PATCH", "/apis/x.io/v1/things/t/status")
    ));
    let url = json!({"nonResourceURLs": ["/metrics*"], "verbs": ["get"]});
    assert!(rule_allows(&url, &one("GET", "/metrics/x")));
    assert!(!rule_allows(&url, &one("GET", "/api/v1/pods")));
}

#[test]
fn bindings_name_service_accounts() {
    let b = json!({"subjects": [{"kind": "ServiceAccount", "name": "pgfleet", "namespace": "pgfleet-system"}]});
    assert!(binds_service_account(&b, "pgfleet-system", "pgfleet"));
    assert!(!binds_service_account(&b, "default", "pgfleet"));
    let g =
        json!({"subjects": [{"kind": "Group", "name": "system:serviceaccounts:pgfleet-system"}]});
    assert!(binds_service_account(&g, "pgfleet-system", "anyone"));
}
