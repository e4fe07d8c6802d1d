//! The first pass of the permission check: one SelfSubjectRulesReview per
//! namespace the grants live in, instead of one SelfSubjectAccessReview per
//! grant. deploy/member grants some sixty permissions; asked one by one
//! that was ~57 requests per member at every connect (1.9 per
//! PostgresCluster in `pgfleet bench fleet` at 30 clusters per member,
//! 5.7 at 10), all of it at the fleet's start.
//!
//! A rules review lists the rules that apply to the caller in one
//! namespace: the ClusterRoleBindings' and that namespace's RoleBindings'.
//! Kubernetes warns against *authorizing* with it (the list may be
//! `incomplete` under webhook authorizers, and a namespace's RoleBindings
//! would pass for cluster-wide grants). Here it is only a shortcut that
//! can say "granted":
//! - cluster-wide grants are reviewed in a namespace that does not exist
//!   ([`NO_NAMESPACE`]), so only ClusterRoleBindings can contribute;
//!   a Role's grants in the namespace the Role names;
//! - everything the listed rules do not grant (a missing grant, an
//!   incomplete list, a server that refuses the review) is asked with a
//!   SelfSubjectAccessReview, as before, which decides. A grant is never
//!   reported missing on the review's word alone.
//!
//! The matching is RBAC's own (`ResourceMatches`, `VerbMatches`, …):
//! `*` for verbs, groups and resources, `*/sub` for a subresource of any
//! resource, and `resourceNames` only for a request that names an object.

use super::permissions::Permission;
use k8s_openapi::api::authorization::v1::{
    ResourceRule, SelfSubjectRulesReview, SelfSubjectRulesReviewSpec,
};
use kube::api::{Api, PostParams};

/// Where cluster-wide grants are reviewed: a namespace nobody creates, so
/// no RoleBinding can be mistaken for a ClusterRoleBinding. (Were it
/// created, with a RoleBinding granting the manager something it lacks
/// cluster-wide, that grant would go unreported until the first refused
/// call, which names it too.)
pub const NO_NAMESPACE: &str = "pgfleet-no-such-namespace-rules-review";

/// Of `needed`, the permissions a rules review did not show granted, in
/// their order; all of them when the review could not be made.
pub async fn unconfirmed(client: &kube::Client, needed: &[Permission]) -> Vec<Permission> {
    let api: Api<SelfSubjectRulesReview> = Api::all(client.clone());
    let mut namespaces: Vec<&str> = needed.iter().map(|p| p.namespace.as_str()).collect();
    namespaces.sort_unstable();
    namespaces.dedup();
    let mut rules: Vec<(&str, Vec<ResourceRule>)> = vec![];
    for ns in namespaces {
        let review_in = if ns.is_empty() { NO_NAMESPACE } else { ns };
        let review = SelfSubjectRulesReview {
            spec: SelfSubjectRulesReviewSpec {
                namespace: Some(review_in.to_string()),
            },
            ..Default::default()
        };
        match api.create(&PostParams::default(), &review).await {
            Ok(answer) => {
                let listed = answer.status.map(|s| s.resource_rules).unwrap_or_default();
                rules.push((ns, listed));
            }
            // The access reviews decide instead.
            Err(e) => {
                let error = super::redact(&e.to_string());
                tracing::debug!(namespace = review_in, %error, "no rules review");
            }
        }
    }
    needed
        .iter()
        .filter(|p| {
            !rules
                .iter()
                .any(|(ns, rs)| *ns == p.namespace && rs.iter().any(|r| grants(r, p)))
        })
        .cloned()
        .collect()
}

/// Whether `rule` grants `p`, as Kubernetes RBAC matches a request.
pub fn grants(rule: &ResourceRule, p: &Permission) -> bool {
    let has = |list: &[String], v: &str| list.iter().any(|x| x == "*" || x == v);
    let resource_matches = |r: &String| {
        r == "*"
            || match p.subresource.is_empty() {
                true => *r == p.resource,
                false => {
                    r.split_once('/') == Some((p.resource.as_str(), p.subresource.as_str()))
                        || r.strip_prefix("*/") == Some(p.subresource.as_str())
                }
            }
    };
    let names_match = match rule.resource_names.as_deref() {
        None | Some([]) => true,
        Some(names) => !p.name.is_empty() && names.contains(&p.name),
    };
    has(&rule.verbs, &p.verb)
        && has(rule.api_groups.as_deref().unwrap_or_default(), &p.group)
        && rule
            .resources
            .as_deref()
            .unwrap_or_default()
            .iter()
            .any(resource_matches)
        && names_match
}

#[cfg(test)]
mod tests {
    use super::*;

    fn perm(verb: &str, group: &str, resource: &str, name: &str) -> Permission {
        let (resource, subresource) = resource.split_once('/').unwrap_or((resource, ""));
        Permission {
            verb: verb.into(),
            group: group.into(),
            resource: resource.into(),
            subresource: subresource.into(),
            name: name.into(),
            namespace: String::new(),
        }
    }

    fn rule(verbs: &[&str], groups: &[&str], resources: &[&str], names: &[&str]) -> ResourceRule {
        let v = |l: &[&str]| l.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        ResourceRule {
            verbs: v(verbs),
            api_groups: Some(v(groups)),
            resources: Some(v(resources)),
            resource_names: (!names.is_empty()).then(|| v(names)),
        }
    }

    #[test]
    fn rules_match_as_rbac_matches_requests() {
        let pods = rule(&["create", "list"], &[""], &["pods"], &[]);
        assert!(grants(&pods, &perm("create", "", "pods", "")));
        assert!(!grants(&pods, &perm("delete", "", "pods", "")));
        assert!(!grants(&pods, &perm("create", "apps", "pods", "")));
        // A resource's grant is not its subresource's, and back.
        assert!(!grants(&pods, &perm("create", "", "pods/exec", "")));
        let exec = rule(&["create"], &[""], &["pods/exec"], &[]);
        assert!(grants(&exec, &perm("create", "", "pods/exec", "")));
        assert!(!grants(&exec, &perm("create", "", "pods", "")));
        // Wildcards: verbs, groups, resources; `*/sub` for any resource's sub.
        let all = rule(&["*"], &["*"], &["*"], &[]);
        assert!(grants(
            &all,
            &perm("patch", "pgfleet.io", "postgresclusters/status", "")
        ));
        let status = rule(&["patch"], &["pgfleet.io"], &["*/status"], &[]);
        assert!(grants(
            &status,
            &perm("patch", "pgfleet.io", "postgresclusters/status", "")
        ));
        assert!(!grants(
            &status,
            &perm("patch", "pgfleet.io", "postgresclusters", "")
        ));
        assert!(!grants(
            &status,
            &perm("patch", "pgfleet.io", "postgresclusters/scale", "")
        ));
        // resourceNames: only a request for a named object of the list.
        let named = rule(&["patch"], &[""], &["namespaces"], &["pgfleet-system"]);
        assert!(grants(
            &named,
            &perm("patch", "", "namespaces", "pgfleet-system")
        ));
        assert!(!grants(&named, &perm("patch", "", "namespaces", "other")));
        assert!(!grants(&named, &perm("patch", "", "namespaces", "")));
        let unnamed = rule(&["patch"], &[""], &["namespaces"], &[]);
        assert!(grants(
            &unnamed,
            &perm("patch", "", "namespaces", "pgfleet-system")
        ));
    }

    #[test]
    fn every_grant_of_deploy_member_is_matched_by_its_own_rules() {
        // The manifest's rules, listed back by a rules review, grant every
        // permission read from the same manifest: a member installed from
        // deploy/member needs no access review at all.
        let text = include_str!("../../deploy/member/rbac.yaml");
        let mut rules: Vec<(String, ResourceRule)> = vec![];
        for doc in serde_yaml::Deserializer::from_str(text) {
            let v: serde_json::Value = serde::Deserialize::deserialize(doc).expect("yaml");
            let ns = v
                .pointer("/metadata/namespace")
                .and_then(serde_json::Value::as_str)
                .filter(|_| v["kind"] == "Role")
                .unwrap_or_default()
                .to_string();
            for r in v["rules"].as_array().into_iter().flatten() {
                rules.push((ns.clone(), serde_json::from_value(r.clone()).expect("rule")));
            }
        }
        let needed = super::super::permissions::required().expect("manifest");
        for p in needed {
            assert!(
                rules
                    .iter()
                    .any(|(ns, r)| *ns == p.namespace && grants(r, p)),
                "{p} is not matched by deploy/member's rules"
            );
        }
    }
}
