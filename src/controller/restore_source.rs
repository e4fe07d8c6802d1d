//! Whether a restore (`spec.bootstrap.fromBackup`) may read its source,
//! decided before anything is read. Pure.
//!
//! A tenant owns its namespace and nothing else, so the source of a
//! restore is checked in three steps, each before any request is made
//! with the names involved:
//!
//! 1. every name is a valid DNS name ([`super::names`]): kube-core does not
//!    escape names in URLs, so `cluster: "x?"` would otherwise read the
//!    Secret `x`;
//! 2. the member cluster is one of this fleet's, and `targetTime` is a time
//!    that has passed on the manager's clock;
//! 3. a source in another namespace or another member cluster consents:
//!    its PostgresCluster lists the restoring namespace in the annotation
//!    [`ANN_RESTORE_ALLOWED`], or the fleet allows it
//!    (`[tenancy] restore_across_namespaces = "allow"`).
//!
//! Only then are the source's Secrets, backup records and repository read
//! (controller::restore).

use super::names::{self, ObjectName};
use crate::config::CrossNamespaceRestore;
use crate::crd::cluster::FromBackup;
use chrono::{DateTime, Utc};

use crate::platform::labels::ANN_RESTORE_ALLOWED;

const FIELD: &str = "spec.bootstrap.fromBackup";

/// Where the restoring PostgresCluster lives.
#[derive(Debug, Clone, Copy)]
pub struct Target<'a> {
    pub member: &'a str,
    pub namespace: &'a str,
}

/// Which backup to start from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BackupRef {
    /// A PostgresBackup record of the source (read in the source's member
    /// cluster and namespace; it must exist).
    Record(ObjectName),
    /// A pgBackRest label given directly (`20261203-021712F`).
    Label(String),
}

/// A restore's source with every name validated, so it may be used in a
/// request path and a repository path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    pub member: String,
    pub namespace: ObjectName,
    pub cluster: ObjectName,
    pub backup: Option<BackupRef>,
    pub target_time: Option<String>,
}

impl Source {
    /// Whether the source is outside the restoring cluster's namespace
    /// (another namespace, or the same name in another member cluster,
    /// which may belong to another team).
    pub fn crosses(&self, target: Target<'_>) -> bool {
        self.member != target.member || self.namespace.as_str() != target.namespace
    }

    /// `<member>/<namespace>/<cluster>`, for messages.
    pub fn describe(&self) -> String {
        format!("{}/{}/{}", self.member, self.namespace, self.cluster)
    }
}

/// Problems visible in the spec alone: names and the time's syntax.
pub fn syntax(fb: &FromBackup) -> Vec<String> {
    let mut errs = vec![];
    let mut push = |r: Result<(), names::NameError>| {
        if let Err(e) = r {
            errs.push(e.to_string());
        }
    };
    push(names::dns1123_label(
        &format!("{FIELD}.cluster"),
        &fb.cluster,
    ));
    if let Some(ns) = &fb.namespace {
        push(names::dns1123_label(&format!("{FIELD}.namespace"), ns));
    }
    if let Some(m) = &fb.member_cluster {
        push(names::dns1123_label(&format!("{FIELD}.memberCluster"), m));
    }
    if let Some(b) = &fb.backup
        && !names::is_pgbackrest_label(b)
    {
        push(names::dns1123_subdomain(&format!("{FIELD}.backup"), b));
    }
    if let Some(t) = &fb.target_time
        && DateTime::parse_from_rfc3339(t).is_err()
    {
        errs.push(format!(
            "{FIELD}.targetTime: {} is not an RFC 3339 time such as 2026-12-02T10:15:00Z",
            names::shown(t)
        ));
    }
    errs
}

/// The validated source of a restore into `target`, given the fleet's
/// member clusters and the manager's clock; every problem otherwise.
pub fn resolve(
    fb: &FromBackup,
    target: Target<'_>,
    members: &[&str],
    now: DateTime<Utc>,
) -> Result<Source, Vec<String>> {
    let errs = syntax(fb);
    if !errs.is_empty() {
        return Err(errs);
    }
    let mut errs = vec![];
    let member = fb.member_cluster.as_deref().unwrap_or(target.member);
    if !members.contains(&member) {
        errs.push(format!(
            "{FIELD}.memberCluster: {member} is not a member cluster of this fleet"
        ));
    }
    if let Some(t) = &fb.target_time
        && let Ok(at) = DateTime::parse_from_rfc3339(t)
        && at.with_timezone(&Utc) > now
    {
        errs.push(format!(
            "{FIELD}.targetTime: {t} is in the future (the manager's clock reads {}); \
             a restore can only recover to a time that has passed",
            crate::platform::time::ts(now)
        ));
    }
    if !errs.is_empty() {
        return Err(errs);
    }
    // Checked by syntax() above; the constructors cannot fail here.
    let named =
        |field: &str, v: &str| names::validated_name(field, v).map_err(|e| vec![e.to_string()]);
    let namespace = fb.namespace.as_deref().unwrap_or(target.namespace);
    let backup = match &fb.backup {
        None => None,
        Some(b) if names::is_pgbackrest_label(b) => Some(BackupRef::Label(b.clone())),
        Some(b) => Some(BackupRef::Record(named(&format!("{FIELD}.backup"), b)?)),
    };
    Ok(Source {
        member: member.to_string(),
        namespace: names::validated_namespace(&format!("{FIELD}.namespace"), namespace)
            .map_err(|e| vec![e.to_string()])?,
        cluster: named(&format!("{FIELD}.cluster"), &fb.cluster)?,
        backup,
        target_time: fb.target_time.clone(),
    })
}

/// Whether the restore needs no consent: the source is in the restoring
/// cluster's own namespace, or the fleet allows crossing. Otherwise the
/// source's annotation decides ([`consents`]).
pub fn allowed_without_consent(
    source: &Source,
    target: Target<'_>,
    policy: CrossNamespaceRestore,
) -> bool {
    !source.crosses(target) || policy == CrossNamespaceRestore::Allow
}

/// Whether a source in `source_member` whose annotation
/// [`ANN_RESTORE_ALLOWED`] reads `annotation` lets `target` restore from it.
/// An unqualified entry means a namespace of the source's own member cluster
/// only: the same namespace name in another member cluster may belong to
/// another team.
pub fn consents(annotation: Option<&str>, source_member: &str, target: Target<'_>) -> bool {
    let Some(list) = annotation else {
        return false;
    };
    list.split(',')
        .map(str::trim)
        .filter(|e| !e.is_empty())
        .any(|entry| match entry.split_once('/') {
            Some((m, ns)) => m == target.member && ns == target.namespace,
            None => source_member == target.member && entry == target.namespace,
        })
}

/// The reason a restore without consent is refused: what to add where.
/// The same words whether or not the source exists, so a tenant learns
/// nothing about other namespaces from it.
pub fn refusal(source: &Source, target: Target<'_>) -> String {
    let entry = if source.member == target.member {
        target.namespace.to_string()
    } else {
        format!("{}/{}", target.member, target.namespace)
    };
    format!(
        "{FIELD}: the source {} is in another {} and has not allowed restores into {}/{}; \
         its PostgresCluster must list \"{entry}\" in the annotation {ANN_RESTORE_ALLOWED} \
         (or the fleet must set [tenancy] restore_across_namespaces = \"allow\"). \
         Nothing was read from the source",
        source.describe(),
        if source.member == target.member {
            "namespace"
        } else {
            "member cluster"
        },
        target.member,
        target.namespace,
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fb(v: serde_json::Value) -> FromBackup {
        serde_json::from_value(v).unwrap()
    }

    const HERE: Target<'static> = Target {
        member: "alpha",
        namespace: "evil",
    };
    const MEMBERS: &[&str] = &["alpha", "beta"];

    fn now() -> DateTime<Utc> {
        DateTime::parse_from_rfc3339("2026-12-03T12:00:00Z")
            .unwrap()
            .with_timezone(&Utc)
    }

    #[test]
    fn a_plain_source_defaults_to_the_restoring_namespace_and_member() {
        let s = resolve(&fb(json!({"cluster": "orders"})), HERE, MEMBERS, now()).unwrap();
        assert_eq!(s.describe(), "alpha/evil/orders");
        assert!(!s.crosses(HERE));
        assert!(allowed_without_consent(
            &s,
            HERE,
            CrossNamespaceRestore::Consent
        ));
    }

    #[test]
    fn names_that_would_change_a_url_are_refused() {
        for (field, v) in [
            ("cluster", "x?"),
            ("cluster", "x/../y"),
            ("cluster", "x%2Fy"),
            ("cluster", "X"),
            ("cluster", ""),
            ("namespace", "a.b"),
            ("namespace", "victim?x"),
            ("memberCluster", "beta/x"),
            ("backup", "b?c"),
            ("backup", "b/c"),
        ] {
            let mut spec = json!({"cluster": "orders"});
            spec[field] = json!(v);
            let errs = resolve(&fb(spec), HERE, MEMBERS, now()).unwrap_err();
            assert!(
                errs.iter()
                    .any(|e| e.starts_with(&format!("{FIELD}.{field}: "))),
                "{field}={v:?}: {errs:?}"
            );
        }
        let long = "a".repeat(64);
        let errs = syntax(&fb(json!({"cluster": long, "namespace": long})));
        assert_eq!(errs.len(), 2, "{errs:?}");
        assert!(errs[0].contains("at most 63"), "{errs:?}");
    }

    #[test]
    fn unknown_members_and_future_times_are_refused() {
        let errs = resolve(
            &fb(json!({"cluster": "o", "memberCluster": "nowhere"})),
            HERE,
            MEMBERS,
            now(),
        )
        .unwrap_err();
        assert!(
            errs[0].contains("nowhere is not a member cluster"),
            "{errs:?}"
        );
        let errs = resolve(
            &fb(json!({"cluster": "o", "targetTime": "2026-12-03T12:00:01Z"})),
            HERE,
            MEMBERS,
            now(),
        )
        .unwrap_err();
        assert!(errs[0].contains("is in the future"), "{errs:?}");
        assert!(
            resolve(
                &fb(json!({"cluster": "o", "targetTime": "2026-12-03T13:00:00+02:00"})),
                HERE,
                MEMBERS,
                now()
            )
            .is_ok()
        );
        let errs = syntax(&fb(json!({"cluster": "o", "targetTime": "yesterday"})));
        assert!(errs[0].contains("RFC 3339"), "{errs:?}");
    }

    #[test]
    fn backups_are_records_or_pgbackrest_labels() {
        let s = resolve(
            &fb(json!({"cluster": "o", "backup": "o-full"})),
            HERE,
            MEMBERS,
            now(),
        )
        .unwrap();
        assert!(matches!(s.backup, Some(BackupRef::Record(n)) if n.as_str() == "o-full"));
        let s = resolve(
            &fb(json!({"cluster": "o", "backup": "20261203-021712F"})),
            HERE,
            MEMBERS,
            now(),
        )
        .unwrap();
        assert_eq!(s.backup, Some(BackupRef::Label("20261203-021712F".into())));
    }

    #[test]
    fn crossing_needs_consent_unless_the_fleet_allows_it() {
        let other_ns = resolve(
            &fb(json!({"cluster": "o", "namespace": "victim"})),
            HERE,
            MEMBERS,
            now(),
        )
        .unwrap();
        let other_member = resolve(
            &fb(json!({"cluster": "o", "memberCluster": "beta"})),
            HERE,
            MEMBERS,
            now(),
        )
        .unwrap();
        for s in [&other_ns, &other_member] {
            assert!(s.crosses(HERE));
            assert!(!allowed_without_consent(
                s,
                HERE,
                CrossNamespaceRestore::Consent
            ));
            assert!(allowed_without_consent(
                s,
                HERE,
                CrossNamespaceRestore::Allow
            ));
        }
        let msg = refusal(&other_ns, HERE);
        assert!(
            msg.contains("alpha/victim/o")
                && msg.contains("\"evil\"")
                && msg.contains(ANN_RESTORE_ALLOWED),
            "{msg}"
        );
        assert!(refusal(&other_member, HERE).contains("\"alpha/evil\""));
    }

    #[test]
    fn consent_names_a_namespace_of_the_same_member_or_a_qualified_one() {
        // Source in alpha.
        assert!(consents(Some("evil"), "alpha", HERE));
        assert!(consents(Some(" a , evil ,b"), "alpha", HERE));
        assert!(consents(Some("alpha/evil"), "alpha", HERE));
        assert!(!consents(None, "alpha", HERE));
        assert!(!consents(Some(""), "alpha", HERE));
        assert!(!consents(Some("evil2,evi,*"), "alpha", HERE));
        // Source in beta: an unqualified name means beta's namespace.
        assert!(!consents(Some("evil"), "beta", HERE));
        assert!(consents(Some("alpha/evil"), "beta", HERE));
        assert!(!consents(Some("beta/evil"), "beta", HERE));
        assert!(!consents(Some("*/evil"), "beta", HERE));
    }
}
