//! RBAC for the embedded API server, the way kube-apiserver decides it: a
//! request becomes authorization attributes (verb, API group, resource,
//! subresource, namespace, name — or a non-resource path), and a user is
//! allowed when one rule of a role bound to it matches them.
//!
//! Pure: no store, no HTTP. `server::auth` feeds it the request and the
//! bound roles. It exists so `deploy/member`'s ClusterRole can be proven
//! sufficient (the manager works under it) and minimal (the audit log of a
//! run uses every rule) against the embedded cluster, not only by reading.

use serde_json::Value;

/// What a request asks to do, as the authorizer sees it.
#[derive(Debug, Clone, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Attributes {
    pub verb: String,
    /// API group (`""` for core); empty for non-resource requests.
    pub group: String,
    /// Plural resource; empty for non-resource requests.
    pub resource: String,
    pub subresource: String,
    pub namespace: String,
    pub name: String,
    /// The URL path of a non-resource request (`/version`); empty otherwise.
    pub path: String,
}

impl Attributes {
    pub fn is_resource(&self) -> bool {
        !self.resource.is_empty()
    }

    /// `resource` or `resource/subresource`, as RBAC rules name them.
    pub fn qualified_resource(&self) -> String {
        if self.subresource.is_empty() {
            self.resource.clone()
        } else {
            format!("{}/{}", self.resource, self.subresource)
        }
    }

    /// The sentence kube-apiserver answers a denied request with.
    pub fn forbidden_message(&self, user: &str) -> String {
        if !self.is_resource() {
            return format!(
                "forbidden: User \"{user}\" cannot {} path \"{}\"",
                self.verb, self.path
            );
        }
        let what = if self.name.is_empty() {
            self.qualified_resource()
        } else {
            format!("{} \"{}\"", self.qualified_resource(), self.name)
        };
        let scope = if self.namespace.is_empty() {
            "at the cluster scope".to_string()
        } else {
            format!("in the namespace \"{}\"", self.namespace)
        };
        format!(
            "{what} is forbidden: User \"{user}\" cannot {} resource \"{}\" in API group \"{}\" {scope}",
            self.verb,
            self.qualified_resource(),
            self.group
        )
    }
}

/// Subresources of a namespace object (`/api/v1/namespaces/x/status`), which
/// kube does not read as "resource `status` in namespace x".
const NAMESPACE_SUBRESOURCES: &[&str] = &["status", "finalize"];

/// The attributes of one request. An exec/attach/portforward GET (a
/// websocket upgrade) yields two: since Kubernetes 1.30 it is checked for
/// `create` as well as `get`, and both must be allowed.
pub fn attributes(method: &str, path: &str, query: &super::server::Query) -> Vec<Attributes> {
    let segs: Vec<&str> = path
        .trim_end_matches('/')
        .split('/')
        .filter(|s| !s.is_empty())
        .collect();
    let (group, rest) = match segs.as_slice() {
        ["api", _version, rest @ ..] if !rest.is_empty() => ("", rest),
        ["apis", group, _version, rest @ ..] if !rest.is_empty() => (*group, rest),
        _ => return vec![non_resource(method, path)],
    };
    let mut a = Attributes {
        group: group.to_string(),
        ..Default::default()
    };
    let mut parts: &[&str] = rest;
    if parts.first() == Some(&"namespaces") && parts.len() > 1 {
        a.namespace = parts[1].to_string();
        if parts.len() > 2 && !NAMESPACE_SUBRESOURCES.contains(&parts[2]) {
            parts = &parts[2..];
        }
    }
    a.resource = parts[0].to_string();
    a.name = parts.get(1).map(|s| s.to_string()).unwrap_or_default();
    a.subresource = parts.get(2).map(|s| s.to_string()).unwrap_or_default();
    if a.name.is_empty()
        && let Some(name) = pinned_name(query.get("fieldSelector").unwrap_or_default())
    {
        a.name = name;
    }
    let collection = parts.len() == 1;
    a.verb = match (method, collection) {
        ("GET" | "HEAD", true) if query.flag("watch") => "watch",
        ("GET" | "HEAD", true) => "list",
        ("GET" | "HEAD", false) => "get",
        ("POST", _) => "create",
        ("PUT", _) => "update",
        ("PATCH", _) => "patch",
        ("DELETE", true) => "deletecollection",
        ("DELETE", false) => "delete",
        (other, _) => return vec![non_resource(other, path)],
    }
    .to_string();
    let streaming = matches!(a.subresource.as_str(), "exec" | "attach" | "portforward");
    if streaming && a.verb == "get" {
        let create = Attributes {
            verb: "create".into(),
            ..a.clone()
        };
        return vec![a, create];
    }
    vec![a]
}

fn non_resource(method: &str, path: &str) -> Attributes {
    Attributes {
        verb: method.to_ascii_lowercase(),
        path: path.to_string(),
        ..Default::default()
    }
}

/// kube authorizes a list or watch pinned to one name (`metadata.name=x`) as
/// a request for that name, so `resourceNames` rules can allow it.
fn pinned_name(selector: &str) -> Option<String> {
    let mut it = selector.split(',').filter(|s| !s.is_empty());
    let one = it.next()?;
    if it.next().is_some() {
        return None;
    }
    let v = one
        .strip_prefix("metadata.name==")
        .or_else(|| one.strip_prefix("metadata.name="))?;
    Some(v.to_string())
}

/// Paths every authenticated user may read on a real cluster (the default
/// `system:discovery` and `system:public-info-viewer` bindings), so roles do
/// not need to grant them.
pub fn is_public_discovery(a: &Attributes) -> bool {
    if a.is_resource() || a.verb != "get" {
        return false;
    }
    let p = a.path.trim_end_matches('/');
    matches!(
        p,
        "/api" | "/apis" | "/version" | "/healthz" | "/livez" | "/readyz" | "/openapi/v2"
    ) || p.starts_with("/api/")
        || p.starts_with("/apis/")
        || p.starts_with("/openapi/v3")
}

fn has(list: Option<&Value>, want: &str) -> bool {
    list.and_then(Value::as_array)
        .is_some_and(|l| l.iter().filter_map(Value::as_str).any(|s| s == want))
}

fn has_or_star(list: Option<&Value>, want: &str) -> bool {
    has(list, "*") || has(list, want)
}

/// Whether one PolicyRule (JSON, as in a Role) matches.
pub fn rule_allows(rule: &Value, a: &Attributes) -> bool {
    if !has_or_star(rule.get("verbs"), &a.verb) {
        return false;
    }
    if !a.is_resource() {
        return rule
            .get("nonResourceURLs")
            .and_then(Value::as_array)
            .is_some_and(|urls| {
                urls.iter().filter_map(Value::as_str).any(|u| {
                    u == "*"
                        || u == a.path
                        || u.strip_suffix('*').is_some_and(|p| a.path.starts_with(p))
                })
            });
    }
    if !has_or_star(rule.get("apiGroups"), &a.group) {
        return false;
    }
    let resources = rule.get("resources");
    let resource_ok = if a.subresource.is_empty() {
        has_or_star(resources, &a.resource)
    } else {
        has(resources, "*")
            || has(resources, &a.qualified_resource())
            || has(resources, &format!("*/{}", a.subresource))
            || has(resources, &format!("{}/*", a.resource))
    };
    if !resource_ok {
        return false;
    }
    match rule.get("resourceNames").and_then(Value::as_array) {
        Some(names) if !names.is_empty() => {
            !a.name.is_empty() && names.iter().filter_map(Value::as_str).any(|n| n == a.name)
        }
        _ => true,
    }
}

/// Whether any rule of a role (its `rules` array) matches.
pub fn role_allows(role: &Value, a: &Attributes) -> bool {
    role.get("rules")
        .and_then(Value::as_array)
        .is_some_and(|rules| rules.iter().any(|r| rule_allows(r, a)))
}

/// Who is asking, as RBAC bindings name users: a user name and its groups.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Subject {
    pub user: String,
    pub groups: Vec<String>,
}

impl Subject {
    /// A service account's user name and the groups kube gives it.
    pub fn service_account(ns: &str, name: &str) -> Subject {
        Subject {
            user: format!("system:serviceaccount:{ns}:{name}"),
            groups: vec![
                "system:serviceaccounts".to_string(),
                format!("system:serviceaccounts:{ns}"),
                "system:authenticated".to_string(),
            ],
        }
    }

    /// Members of `system:masters` pass every check (kube's privileged
    /// group authorizer runs before RBAC).
    pub fn is_master(&self) -> bool {
        self.groups.iter().any(|g| g == "system:masters")
    }
}

/// The subject of a binding that names `who`, if any — the binding's
/// `subjects` entry, for the reason an allowed review gives.
pub fn bound_subject<'a>(binding: &'a Value, who: &Subject) -> Option<&'a Value> {
    binding
        .get("subjects")
        .and_then(Value::as_array)?
        .iter()
        .find(|s| {
            let field = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or_default();
            match field("kind") {
                "ServiceAccount" => {
                    who.user
                        == format!(
                            "system:serviceaccount:{}:{}",
                            field("namespace"),
                            field("name")
                        )
                }
                "User" => field("name") == who.user,
                "Group" => who.groups.iter().any(|g| g == field("name")),
                _ => false,
            }
        })
}

/// Whether a binding's subjects include the service account `ns/name`.
pub fn binds_service_account(binding: &Value, ns: &str, name: &str) -> bool {
    bound_subject(binding, &Subject::service_account(ns, name)).is_some()
}

/// The ClusterRoles every authenticated user holds on a real cluster
/// (bootstrap policy): `system:basic-user` (the self reviews) and
/// `system:discovery` / `system:public-info-viewer` (discovery paths).
pub fn default_roles() -> Vec<(&'static str, Value)> {
    let discovery = serde_json::json!([{"verbs": ["get"], "nonResourceURLs": [
        "/api", "/api/*", "/apis", "/apis/*", "/healthz", "/livez", "/openapi", "/openapi/*",
        "/readyz", "/version", "/version/"]}]);
    let basic = serde_json::json!([
        {"verbs": ["create"], "apiGroups": ["authorization.k8s.io"],
         "resources": ["selfsubjectaccessreviews", "selfsubjectrulesreviews"]},
        {"verbs": ["create"], "apiGroups": ["authentication.k8s.io"],
         "resources": ["selfsubjectreviews"]}
    ]);
    vec![
        ("system:basic-user", serde_json::json!({"rules": basic})),
        ("system:discovery", serde_json::json!({"rules": discovery})),
    ]
}

#[cfg(test)]
#[path = "rbac_tests.rs"]
mod tests;
