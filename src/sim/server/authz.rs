//! The review APIs of a real API server, answered from the emulator's RBAC:
//! `authorization.k8s.io/v1` SelfSubjectAccessReview, SubjectAccessReview,
//! LocalSubjectAccessReview and SelfSubjectRulesReview, and
//! `authentication.k8s.io/v1` SelfSubjectReview. Create-only: the answer is
//! the request with `status` filled in, and nothing is stored (kubectl `auth
//! can-i`, `auth can-i --list` and `auth whoami` read them; the manager
//! checks its permissions with them).
//!
//! The request itself was authorized like any other (`create
//! selfsubjectaccessreviews` is granted to every authenticated user by the
//! default `system:basic-user` role; SubjectAccessReview needs a grant).

use super::super::cluster::Cluster;
use super::super::error::ApiError;
use super::super::rbac::{self, Attributes, Subject};
use super::auth::{self, User};
use crate::json_ptr::Ptr;
use serde_json::{Value, json};

/// Whether a path (split into segments) names a review resource.
pub fn is_review_path(segs: &[&str]) -> bool {
    match segs {
        [
            "apis",
            "authorization.k8s.io" | "authentication.k8s.io",
            "v1",
            rest @ ..,
        ] => rest
            .last()
            .is_some_and(|r| r.ends_with("reviews") && matches!(rest.len(), 1 | 3)),
        _ => false,
    }
}

/// Answers a review request: `segs` is the path after `/apis/<group>/v1`.
pub fn answer(
    cluster: &Cluster,
    user: &User,
    method: &str,
    segs: &[&str],
    body: Value,
) -> Result<Value, ApiError> {
    if method != "POST" {
        return Err(ApiError::method_not_allowed());
    }
    let (ns, resource) = match segs {
        [resource] => ("", *resource),
        ["namespaces", ns, resource] => (*ns, *resource),
        _ => return Err(not_found()),
    };
    let mut review = body;
    if !review.is_object() {
        return Err(ApiError::bad_request("the body is not a JSON object"));
    }
    let spec = review.get("spec").cloned().unwrap_or_else(|| json!({}));
    let status = match resource {
        "selfsubjectaccessreviews" => {
            access(cluster, &user.subject(), &spec, "SelfSubjectAccessReview")?
        }
        "subjectaccessreviews" => {
            access(cluster, &spec_subject(&spec)?, &spec, "SubjectAccessReview")?
        }
        "localsubjectaccessreviews" => {
            let asked = spec
                .ptr("/resourceAttributes/namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            if asked != ns {
                return Err(invalid(
                    "LocalSubjectAccessReview",
                    "spec.resourceAttributes.namespace",
                    asked,
                    "must match metadata.namespace",
                ));
            }
            access(
                cluster,
                &spec_subject(&spec)?,
                &spec,
                "LocalSubjectAccessReview",
            )?
        }
        "selfsubjectrulesreviews" => {
            let ns = spec
                .get("namespace")
                .and_then(Value::as_str)
                .unwrap_or_default();
            rules_status(cluster, &user.subject(), ns)
        }
        "selfsubjectreviews" => json!({"userInfo": user_info(cluster, user)}),
        _ => return Err(not_found()),
    };
    review["status"] = status;
    let meta = review
        .as_object_mut()
        .map(|o| o.entry("metadata").or_insert_with(|| json!({})));
    if let Some(m) = meta.and_then(Value::as_object_mut) {
        m.insert("creationTimestamp".into(), Value::Null);
    }
    Ok(review)
}

fn not_found() -> ApiError {
    ApiError::new(
        404,
        "NotFound",
        "the server could not find the requested resource",
    )
}

fn invalid(kind: &str, field: &str, value: &str, why: &str) -> ApiError {
    ApiError::invalid(
        kind,
        "",
        vec![(
            field.to_string(),
            "FieldValueInvalid".into(),
            format!("{field}: Invalid value: \"{value}\": {why}"),
        )],
    )
}

/// The user and groups a SubjectAccessReview asks about.
fn spec_subject(spec: &Value) -> Result<Subject, ApiError> {
    let user = spec.get("user").and_then(Value::as_str).unwrap_or_default();
    let groups: Vec<String> = spec
        .get("groups")
        .and_then(Value::as_array)
        .map(|g| {
            g.iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    if user.is_empty() && groups.is_empty() {
        return Err(invalid(
            "SubjectAccessReview",
            "spec.user",
            "",
            "at least one of user or group must be specified",
        ));
    }
    Ok(Subject {
        user: user.to_string(),
        groups,
    })
}

/// The status of an access review: allowed (with the authorizer's reason)
/// or not.
fn access(cluster: &Cluster, who: &Subject, spec: &Value, kind: &str) -> Result<Value, ApiError> {
    let a = attributes(spec, kind)?;
    Ok(match auth::decide(cluster, who, &a) {
        Some(reason) if reason.is_empty() => json!({"allowed": true}),
        Some(reason) => json!({"allowed": true, "reason": reason}),
        None => json!({"allowed": false}),
    })
}

/// The attributes a review spec asks about: exactly one of
/// `resourceAttributes` and `nonResourceAttributes`.
fn attributes(spec: &Value, kind: &str) -> Result<Attributes, ApiError> {
    let s = |v: &Value, k: &str| {
        v.get(k)
            .and_then(Value::as_str)
            .unwrap_or_default()
            .to_string()
    };
    match (
        spec.get("resourceAttributes"),
        spec.get("nonResourceAttributes"),
    ) {
        (Some(r), None) => Ok(Attributes {
            verb: s(r, "verb"),
            group: s(r, "group"),
            resource: s(r, "resource"),
            subresource: s(r, "subresource"),
            namespace: s(r, "namespace"),
            name: s(r, "name"),
            path: String::new(),
        }),
        (None, Some(n)) => Ok(Attributes {
            verb: s(n, "verb"),
            path: s(n, "path"),
            ..Default::default()
        }),
        _ => Err(invalid(
            kind,
            "spec.resourceAttributes",
            "",
            "exactly one of nonResourceAttributes or resourceAttributes must be specified",
        )),
    }
}

/// A SelfSubjectRulesReview status: every rule of the subject's roles that
/// applies in `ns` (cluster-wide bindings and the namespace's), split into
/// resource and non-resource rules as kube lists them.
fn rules_status(cluster: &Cluster, who: &Subject, ns: &str) -> Value {
    let mut roles: Vec<Value> = vec![];
    if who.is_master() {
        roles.push(json!({"rules": [
            {"verbs": ["*"], "apiGroups": ["*"], "resources": ["*"]},
            {"verbs": ["*"], "nonResourceURLs": ["*"]}
        ]}));
    }
    roles.extend(rbac::default_roles().into_iter().map(|(_, r)| r));
    roles.extend(
        auth::bound_roles(cluster, who, ns)
            .into_iter()
            .map(|(_, _, r)| r),
    );
    let (mut resource_rules, mut non_resource_rules) = (vec![], vec![]);
    for rule in roles
        .iter()
        .filter_map(|r| r.get("rules").and_then(Value::as_array))
        .flatten()
    {
        let verbs = rule.get("verbs").cloned().unwrap_or_else(|| json!([]));
        if let Some(urls) = rule.get("nonResourceURLs") {
            non_resource_rules.push(json!({"verbs": verbs, "nonResourceURLs": urls}));
            continue;
        }
        let mut r = json!({"verbs": verbs});
        for k in ["apiGroups", "resources", "resourceNames"] {
            if let Some(v) = rule
                .get(k)
                .filter(|v| v.as_array().is_some_and(|a| !a.is_empty()))
            {
                r[k] = v.clone();
            }
        }
        resource_rules.push(r);
    }
    json!({
        "resourceRules": resource_rules,
        "nonResourceRules": non_resource_rules,
        "incomplete": false,
    })
}

/// The `userInfo` of a SelfSubjectReview: user name, uid (a service
/// account's uid) and groups.
fn user_info(cluster: &Cluster, user: &User) -> Value {
    let subject = user.subject();
    let mut info = json!({"username": subject.user, "groups": subject.groups});
    if let User::ServiceAccount { namespace, name } = user {
        let sa = cluster.store.get(
            &super::super::resources::ResKey {
                group: String::new(),
                plural: "serviceaccounts".into(),
            },
            namespace,
            name,
        );
        if let Some(uid) = sa.as_ref().map(|o| o.uid()).filter(|u| !u.is_empty()) {
            info["uid"] = json!(uid);
        }
    }
    info
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn review_paths_are_recognized() {
        assert!(is_review_path(&[
            "apis",
            "authorization.k8s.io",
            "v1",
            "selfsubjectaccessreviews"
        ]));
        assert!(is_review_path(&[
            "apis",
            "authorization.k8s.io",
            "v1",
            "namespaces",
            "x",
            "localsubjectaccessreviews"
        ]));
        assert!(is_review_path(&[
            "apis",
            "authentication.k8s.io",
            "v1",
            "selfsubjectreviews"
        ]));
        assert!(!is_review_path(&[
            "apis",
            "pgfleet.io",
            "v1",
            "postgresclusters"
        ]));
        assert!(!is_review_path(&["apis", "authorization.k8s.io", "v1"]));
    }

    #[test]
    fn a_review_names_exactly_one_kind_of_attributes() {
        let e = attributes(&json!({}), "SelfSubjectAccessReview").expect_err("empty");
        assert_eq!(e.code, 422);
        let a = attributes(
            &json!({"resourceAttributes": {"verb": "create", "resource": "pods", "namespace": "x"}}),
            "SelfSubjectAccessReview",
        )
        .expect("resource");
        assert_eq!((a.verb.as_str(), a.resource.as_str()), ("create", "pods"));
    }
}
