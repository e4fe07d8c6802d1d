//! Who a request comes from and whether RBAC lets it through.
//!
//! The cluster's own token (the one in the kubeconfig the sim writes) is an
//! administrator, as before. Any other bearer token is looked up among the
//! `kubernetes.io/service-account-token` Secrets (filled by `kinds`, as the
//! token controller does); its service account is then held to the
//! Roles/ClusterRoles bound to it, so a manager run with a kubeconfig from
//! `deploy/member/make-kubeconfig.sh` is refused what the role does not grant.

use crate::audit::AuditRecord;
use crate::cluster::Cluster;
use crate::error::ApiError;
use crate::json_ptr::Ptr;
use crate::rbac::{self, Attributes, Subject};
use crate::resources::ResKey;
use crate::store::str_at;
use base64::Engine;
use serde_json::Value;

pub const SA_TOKEN_TYPE: &str = "kubernetes.io/service-account-token";
pub const SA_NAME_ANNOTATION: &str = "kubernetes.io/service-account.name";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum User {
    Admin,
    ServiceAccount { namespace: String, name: String },
}

impl User {
    pub fn username(&self) -> String {
        match self {
            User::Admin => "admin".into(),
            User::ServiceAccount { namespace, name } => {
                format!("system:serviceaccount:{namespace}:{name}")
            }
        }
    }

    /// The user name and groups RBAC sees. The cluster token is an
    /// administrator, in `system:masters` as a kubeadm admin is.
    pub fn subject(&self) -> Subject {
        match self {
            User::Admin => Subject {
                user: self.username(),
                groups: vec!["system:masters".into(), "system:authenticated".into()],
            },
            User::ServiceAccount { namespace, name } => Subject::service_account(namespace, name),
        }
    }
}

fn key(group: &str, plural: &str) -> ResKey {
    ResKey {
        group: group.into(),
        plural: plural.into(),
    }
}

/// The service account whose token Secret holds `token`, if it still exists.
pub fn service_account_for(cluster: &Cluster, token: &str) -> Option<User> {
    let b64 = base64::engine::general_purpose::STANDARD.encode(token);
    let (secrets, _) = cluster.store.list(&key("", "secrets"), None, None);
    // Only a Secret whose JSON holds the encoded token is parsed.
    let secret = secrets
        .into_iter()
        .filter(|s| s.json.windows(b64.len()).any(|w| w == b64.as_bytes()))
        .map(|s| s.value())
        .find(|s| str_at(s, "/type") == SA_TOKEN_TYPE && str_at(s, "/data/token") == b64)?;
    let ns = str_at(&secret, "/metadata/namespace").to_string();
    let name = secret
        .ptr("/metadata/annotations")
        .and_then(|a| a.get(SA_NAME_ANNOTATION))
        .and_then(Value::as_str)?
        .to_string();
    cluster.store.get(&key("", "serviceaccounts"), &ns, &name)?;
    Some(User::ServiceAccount {
        namespace: ns,
        name,
    })
}

/// Whether RBAC (the bound roles in the store) allows `a` for `user`.
pub fn allowed(cluster: &Cluster, user: &User, a: &Attributes) -> bool {
    *user == User::Admin || decide(cluster, &user.subject(), a).is_some()
}

const RBAC_GROUP: &str = "rbac.authorization.k8s.io";

/// The role a binding's `roleRef` names (a Role in `binding_ns`, or a
/// ClusterRole), if it exists.
fn role_of(cluster: &Cluster, binding: &Value, binding_ns: &str) -> Option<Value> {
    let (plural, ns) = match str_at(binding, "/roleRef/kind") {
        "ClusterRole" => ("clusterroles", ""),
        _ => ("roles", binding_ns),
    };
    cluster
        .store
        .get(
            &key(RBAC_GROUP, plural),
            ns,
            str_at(binding, "/roleRef/name"),
        )
        .map(|o| o.value())
}

/// The bindings that could grant `subject` something in `ns` (all
/// ClusterRoleBindings, then the namespace's RoleBindings), with the
/// namespace of each and its role.
pub fn bound_roles(cluster: &Cluster, subject: &Subject, ns: &str) -> Vec<(Value, String, Value)> {
    let (crbs, _) = cluster
        .store
        .list(&key(RBAC_GROUP, "clusterrolebindings"), None, None);
    let mut all: Vec<(Value, String)> = crbs.iter().map(|b| (b.value(), String::new())).collect();
    if !ns.is_empty() {
        let (rbs, _) = cluster
            .store
            .list(&key(RBAC_GROUP, "rolebindings"), Some(ns), None);
        all.extend(rbs.iter().map(|b| (b.value(), ns.to_string())));
    }
    all.into_iter()
        .filter(|(b, _)| rbac::bound_subject(b, subject).is_some())
        .filter_map(|(b, bns)| role_of(cluster, &b, &bns).map(|r| (b, bns, r)))
        .collect()
}

/// Whether `subject` may do `a`, and if so the reason kube's authorizer
/// gives (`RBAC: allowed by ClusterRoleBinding "x" of ClusterRole "y" to
/// ServiceAccount "name/ns"`); None when denied.
pub fn decide(cluster: &Cluster, subject: &Subject, a: &Attributes) -> Option<String> {
    if subject.is_master() {
        return Some(String::new());
    }
    for (name, role) in rbac::default_roles() {
        if rbac::role_allows(&role, a) {
            return Some(format!(
                "RBAC: allowed by ClusterRoleBinding \"{name}\" of ClusterRole \"{name}\" to Group \"system:authenticated\""
            ));
        }
    }
    if rbac::is_public_discovery(a) {
        return Some(String::new());
    }
    bound_roles(cluster, subject, &a.namespace)
        .into_iter()
        .find(|(_, _, role)| rbac::role_allows(role, a))
        .map(|(binding, ns, _)| allow_reason(&binding, &ns, subject))
}

fn allow_reason(binding: &Value, ns: &str, subject: &Subject) -> String {
    let kind = if ns.is_empty() {
        "ClusterRoleBinding".to_string()
    } else {
        format!("RoleBinding \"{}/{ns}\"", str_at(binding, "/metadata/name"))
    };
    let binding_name = if ns.is_empty() {
        format!("{kind} \"{}\"", str_at(binding, "/metadata/name"))
    } else {
        kind
    };
    let who = rbac::bound_subject(binding, subject)
        .map(|s| {
            let f = |k: &str| s.get(k).and_then(Value::as_str).unwrap_or_default();
            match f("kind") {
                "ServiceAccount" => format!("ServiceAccount \"{}/{}\"", f("name"), f("namespace")),
                k => format!("{k} \"{}\"", f("name")),
            }
        })
        .unwrap_or_default();
    format!(
        "RBAC: allowed by {binding_name} of {} \"{}\" to {who}",
        str_at(binding, "/roleRef/kind"),
        str_at(binding, "/roleRef/name")
    )
}

/// Authorizes every attribute of a request, recording each in the audit log
/// (when on); the first denied one is the 403 kube would answer.
pub fn authorize(cluster: &Cluster, user: &User, attrs: &[Attributes]) -> Result<(), ApiError> {
    let mut denied = None;
    for a in attrs {
        let ok = allowed(cluster, user, a);
        cluster.audit.record(AuditRecord {
            user: user.username(),
            attributes: a.clone(),
            allowed: ok,
        });
        if !ok && denied.is_none() {
            denied = Some(a.forbidden_message(&user.username()));
        }
    }
    match denied {
        Some(msg) => Err(ApiError::new(403, "Forbidden", msg)),
        None => Ok(()),
    }
}

/// A server-side apply to an object that does not exist yet creates it, and
/// kube then also checks `create` (the handler's create validation).
pub fn apply_creates(cluster: &Cluster, path: &str, a: &Attributes, content_type: &str) -> bool {
    if a.verb != "patch"
        || a.name.is_empty()
        || !a.subresource.is_empty()
        || !content_type.contains("apply-patch")
    {
        return false;
    }
    let version = path
        .split('/')
        .filter(|s| !s.is_empty())
        .nth(if a.group.is_empty() { 1 } else { 2 })
        .unwrap_or_default();
    let reg = cluster.registry();
    let Some(rt) = reg.get(&a.group, version, &a.resource) else {
        return false;
    };
    let ns = if rt.namespaced {
        a.namespace.as_str()
    } else {
        ""
    };
    cluster.store.get(&rt.key(), ns, &a.name).is_none()
}
