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
use crate::rbac::{self, Attributes};
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
    let secret = secrets.into_iter().find(|s| {
        str_at(&s.value, "/type") == SA_TOKEN_TYPE && str_at(&s.value, "/data/token") == b64
    })?;
    let ns = str_at(&secret.value, "/metadata/namespace").to_string();
    let name = secret
        .value
        .pointer("/metadata/annotations")
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
    let User::ServiceAccount { namespace, name } = user else {
        return true;
    };
    if rbac::is_public_discovery(a) {
        return true;
    }
    let rbac_group = "rbac.authorization.k8s.io";
    let role = |kind: &str, role_name: &str, ns: &str| -> Option<Value> {
        let plural = if kind == "ClusterRole" {
            "clusterroles"
        } else {
            "roles"
        };
        let ns = if kind == "ClusterRole" { "" } else { ns };
        cluster
            .store
            .get(&key(rbac_group, plural), ns, role_name)
            .map(|o| o.value.clone())
    };
    let grants = |binding: &Value, binding_ns: &str| {
        rbac::binds_service_account(binding, namespace, name)
            && role(
                str_at(binding, "/roleRef/kind"),
                str_at(binding, "/roleRef/name"),
                binding_ns,
            )
            .is_some_and(|r| rbac::role_allows(&r, a))
    };
    let (crbs, _) = cluster
        .store
        .list(&key(rbac_group, "clusterrolebindings"), None, None);
    if crbs.iter().any(|b| grants(&b.value, "")) {
        return true;
    }
    if a.namespace.is_empty() {
        return false;
    }
    let (rbs, _) = cluster
        .store
        .list(&key(rbac_group, "rolebindings"), Some(&a.namespace), None);
    rbs.iter().any(|b| grants(&b.value, &a.namespace))
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
