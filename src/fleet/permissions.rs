//! The permissions the manager needs in a member cluster, and a check of
//! them at connect time (a rules review per namespace, then one
//! SelfSubjectAccessReview per permission it did not show granted,
//! `rules_review.rs`), so a member whose RBAC lacks a grant is reported
//! with that grant by name
//! (member status, `pgfleet status`, the dashboard) instead of failing
//! later on the first forbidden call.
//!
//! One source of truth: the list is read from `deploy/member/rbac.yaml`
//! (embedded at build time), the manifest the member is installed with.

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use kube::api::{Api, PostParams};
use serde_json::Value;
use std::fmt;

/// The member RBAC manifest the permissions are derived from.
const MEMBER_RBAC: &str = include_str!("../../deploy/member/rbac.yaml");

/// One thing the manager must be allowed to do in a member cluster.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Permission {
    pub verb: String,
    pub group: String,
    pub resource: String,
    pub subresource: String,
    /// A single object the grant is limited to (`resourceNames`), or empty.
    pub name: String,
    /// The namespace a Role grants it in; empty for a ClusterRole.
    pub namespace: String,
}

impl fmt::Display for Permission {
    /// `create pods`, `patch postgresclusters.pgfleet.io/status`,
    /// `patch namespaces "pgfleet-system"`, `get leases.coordination.k8s.io
    /// in namespace pgfleet-system` — how an operator greps a Role for it.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.verb, self.resource)?;
        if !self.group.is_empty() {
            write!(f, ".{}", self.group)?;
        }
        if !self.subresource.is_empty() {
            write!(f, "/{}", self.subresource)?;
        }
        if !self.name.is_empty() {
            write!(f, " \"{}\"", self.name)?;
        }
        if !self.namespace.is_empty() {
            write!(f, " in namespace {}", self.namespace)?;
        }
        Ok(())
    }
}

#[derive(Debug, Clone, thiserror::Error)]
pub enum PermissionsError {
    #[error("deploy/member/rbac.yaml (embedded): {0}")]
    Manifest(String),
}

fn strings(v: &Value, key: &str) -> Vec<String> {
    v.get(key)
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

/// Every permission the ClusterRoles and Roles of an RBAC manifest grant,
/// one per verb, group, resource and resource name.
pub fn from_manifest(yaml: &str) -> Result<Vec<Permission>, PermissionsError> {
    let mut out = vec![];
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let v: Value = serde::Deserialize::deserialize(doc)
            .map_err(|e| PermissionsError::Manifest(format!("not valid YAML: {e}")))?;
        let namespace = match v.get("kind").and_then(Value::as_str) {
            Some("ClusterRole") => String::new(),
            Some("Role") => v
                .pointer("/metadata/namespace")
                .and_then(Value::as_str)
                .ok_or_else(|| PermissionsError::Manifest("a Role has no namespace".into()))?
                .to_string(),
            _ => continue,
        };
        let rules = v
            .get("rules")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        for rule in &rules {
            out.extend(rule_permissions(rule, &namespace));
        }
    }
    out.sort();
    out.dedup();
    Ok(out)
}

fn rule_permissions(rule: &Value, namespace: &str) -> Vec<Permission> {
    let mut names = strings(rule, "resourceNames");
    if names.is_empty() {
        names.push(String::new());
    }
    let mut out = vec![];
    for group in strings(rule, "apiGroups") {
        for qualified in strings(rule, "resources") {
            let (resource, subresource) = match qualified.split_once('/') {
                Some((r, s)) => (r.to_string(), s.to_string()),
                None => (qualified.clone(), String::new()),
            };
            for verb in strings(rule, "verbs") {
                for name in &names {
                    out.push(Permission {
                        verb: verb.clone(),
                        group: group.clone(),
                        resource: resource.clone(),
                        subresource: subresource.clone(),
                        name: name.clone(),
                        namespace: namespace.to_string(),
                    });
                }
            }
        }
    }
    out
}

/// What the manager needs in every member: deploy/member's grants, parsed
/// once per process (each member's checks used to parse the manifest
/// again, a few MB of YAML values at a fleet's start).
pub fn required() -> Result<&'static [Permission], PermissionsError> {
    static REQUIRED: std::sync::OnceLock<Result<Vec<Permission>, PermissionsError>> =
        std::sync::OnceLock::new();
    match REQUIRED.get_or_init(|| from_manifest(MEMBER_RBAC)) {
        Ok(p) => Ok(p),
        Err(e) => Err(e.clone()),
    }
}

/// How many reviews are in flight at once per member.
const CONCURRENCY: usize = 8;

/// The permissions of `needed` the client's user lacks in the member: a
/// rules review per namespace first (`rules_review`: what it shows
/// granted is done), then one SelfSubjectAccessReview for each of the
/// rest, which decides. An error means the check itself could not be made
/// (the member is unreachable, or too old to answer).
pub async fn missing(
    client: &kube::Client,
    needed: &[Permission],
) -> Result<Vec<Permission>, kube::Error> {
    use futures::StreamExt as _;
    let unconfirmed = super::rules_review::unconfirmed(client, needed).await;
    let api: Api<SelfSubjectAccessReview> = Api::all(client.clone());
    let answers: Vec<Result<Option<Permission>, kube::Error>> = futures::stream::iter(unconfirmed)
        .map(|p| {
            let api = api.clone();
            async move {
                let allowed = review(&api, &p).await?;
                Ok((!allowed).then_some(p))
            }
        })
        .buffer_unordered(CONCURRENCY)
        .collect()
        .await;
    let mut out = vec![];
    for a in answers {
        if let Some(p) = a? {
            out.push(p);
        }
    }
    out.sort();
    Ok(out)
}

async fn review(api: &Api<SelfSubjectAccessReview>, p: &Permission) -> Result<bool, kube::Error> {
    let opt = |s: &str| (!s.is_empty()).then(|| s.to_string());
    let ssar = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(p.verb.clone()),
                group: Some(p.group.clone()),
                resource: Some(p.resource.clone()),
                subresource: opt(&p.subresource),
                name: opt(&p.name),
                namespace: opt(&p.namespace),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    let answer = api.create(&PostParams::default(), &ssar).await?;
    Ok(answer.status.is_some_and(|s| s.allowed))
}

/// The outcome of a member's last permission check, as status shows it.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Check {
    /// Whether a check has completed since the member connected.
    pub checked: bool,
    /// What the manager lacks, by name ([`Permission`]'s display form).
    pub missing: Vec<String>,
    /// Why the check itself failed, if it did (no credentials in it).
    pub error: Option<String>,
}

/// When a member's permissions are checked again: soon while something is
/// missing (an operator fixing RBAC sees it clear), rarely once all is
/// granted, and at once after the member (re)connects.
pub struct Schedule {
    next: std::time::Instant,
}

impl Schedule {
    const WHILE_MISSING: std::time::Duration = std::time::Duration::from_secs(15);
    const WHILE_GRANTED: std::time::Duration = std::time::Duration::from_secs(600);

    pub fn new() -> Self {
        Schedule {
            next: std::time::Instant::now(),
        }
    }

    /// The first check of one of `members` starting together, spread over
    /// up to 20 ms per member (at most 30 s): a thousand members each
    /// sending twenty reviews at once was a storm their API servers (and a
    /// single machine emulating them) answered Lease renewals behind.
    pub fn spread(members: usize) -> Self {
        let span = (members as f64 * 0.020).min(30.0);
        Schedule {
            next: std::time::Instant::now()
                + std::time::Duration::from_secs_f64(rand::random::<f64>() * span),
        }
    }

    pub fn due(&self) -> bool {
        std::time::Instant::now() >= self.next
    }

    /// Check at the next successful probe (reconnected, new kubeconfig).
    pub fn now(&mut self) {
        self.next = std::time::Instant::now();
    }

    pub fn done(&mut self, check: &Check) {
        let wait = if check.missing.is_empty() && check.error.is_none() {
            Self::WHILE_GRANTED
        } else {
            Self::WHILE_MISSING
        };
        self.next = std::time::Instant::now() + wait;
    }
}

impl Default for Schedule {
    fn default() -> Self {
        Self::new()
    }
}

/// Runs one check of everything deploy/member grants.
pub async fn check(client: &kube::Client) -> Check {
    let needed = match required() {
        Ok(n) => n,
        Err(e) => {
            return Check {
                checked: false,
                missing: vec![],
                error: Some(e.to_string()),
            };
        }
    };
    match missing(client, needed).await {
        Ok(m) => Check {
            checked: true,
            missing: m.iter().map(ToString::to_string).collect(),
            error: None,
        },
        Err(e) => Check {
            checked: false,
            missing: vec![],
            error: Some(format!(
                "checking permissions: {}",
                super::redact(&e.to_string())
            )),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deploy_member_rbac_yields_every_grant_by_name() {
        let all = required().expect("the embedded manifest parses");
        let shown: Vec<String> = all.iter().map(ToString::to_string).collect();
        for want in [
            "create pods",
            "get pods/exec",
            "create pods/exec",
            "patch postgresclusters.pgfleet.io/status",
            "patch customresourcedefinitions.apiextensions.k8s.io \"postgresclusters.pgfleet.io\"",
            "patch namespaces \"pgfleet-system\"",
            "update leases.coordination.k8s.io in namespace pgfleet-system",
            "create events.events.k8s.io",
        ] {
            assert!(shown.iter().any(|s| s == want), "{want} not in {shown:?}");
        }
        assert!(!shown.iter().any(|s| s == "update pods"), "{shown:?}");
    }

    #[test]
    fn a_role_without_a_namespace_is_refused() {
        let e = from_manifest("kind: Role\nmetadata:\n  name: x\nrules: []\n").expect_err("no ns");
        assert!(e.to_string().contains("namespace"), "{e}");
    }
}
