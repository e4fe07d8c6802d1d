//! Property tests: random strings thrown at the name validators and the
//! restore-source checks that take tenant input. Whatever they accept is
//! safe in a URL path (no character that changes a request); nothing
//! panics; messages stay on one line and bounded.
#![allow(clippy::unwrap_used)]

use super::names::{self, MAX_CLUSTER_NAME};
use super::restore_source::{self, Target};
use crate::config::CrossNamespaceRestore;
use crate::crd::cluster::FromBackup;
use proptest::prelude::*;

fn url_safe(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.')
}

/// Mostly name-like strings, with the characters that rewrite URLs mixed in.
fn tricky() -> impl Strategy<Value = String> {
    prop_oneof![
        "[a-z0-9.-]{0,70}",
        "[a-z0-9?/%#&=. \\n\\r\"'-]{0,40}",
        any::<String>(),
        "[a-z]{1,10}(\\.\\.|/|\\?|%2F)[a-z]{0,10}",
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn accepted_names_need_no_escaping(s in tricky()) {
        if names::validated_name("f", &s).is_ok() {
            prop_assert!(url_safe(&s) && !s.is_empty() && s.len() <= 253, "{s:?}");
            prop_assert!(!s.contains(".."), "{s:?}");
        }
        if names::dns1123_label("f", &s).is_ok() {
            prop_assert!(url_safe(&s) && !s.contains('.') && s.len() <= 63, "{s:?}");
        }
        if names::cluster_name(&s, false).is_ok() {
            prop_assert!(s.len() <= MAX_CLUSTER_NAME);
            let child = format!("{s}-drill-pooler");
            prop_assert!(names::dns1035_label("c", &child).is_ok(), "{child}");
        }
    }

    #[test]
    fn messages_are_one_bounded_line(s in tricky()) {
        for e in [
            names::dns1123_subdomain("f", &s).err(),
            names::dns1123_label("f", &s).err(),
            names::cluster_name(&s, false).err(),
        ].into_iter().flatten() {
            let m = e.to_string();
            prop_assert!(!m.contains('\n') && !m.contains('\r'), "{m:?}");
            prop_assert!(m.len() < 600, "{}", m.len());
        }
    }

    #[test]
    fn a_resolved_source_is_url_safe(
        cluster in tricky(),
        namespace in proptest::option::of(tricky()),
        member in proptest::option::of(tricky()),
        backup in proptest::option::of(tricky()),
        time in proptest::option::of(tricky()),
    ) {
        let fb = FromBackup {
            cluster, namespace, member_cluster: member, backup, target_time: time, uid: None,
        };
        let target = Target { member: "alpha", namespace: "ns" };
        let members = ["alpha", "beta"];
        if let Ok(s) = restore_source::resolve(&fb, target, &members, chrono::Utc::now()) {
            prop_assert!(url_safe(s.cluster.as_str()) && url_safe(s.namespace.as_str()));
            prop_assert!(members.contains(&s.member.as_str()));
            if let Some(restore_source::BackupRef::Record(b)) = &s.backup {
                prop_assert!(url_safe(b.as_str()));
            }
            // Only the restoring namespace itself goes without consent.
            if restore_source::allowed_without_consent(&s, target, CrossNamespaceRestore::Consent) {
                prop_assert!(s.member == "alpha" && s.namespace.as_str() == "ns");
            }
        } else {
            let errs = restore_source::resolve(&fb, target, &members, chrono::Utc::now()).unwrap_err();
            prop_assert!(!errs.is_empty());
            for e in errs {
                prop_assert!(!e.contains('\n'), "{e:?}");
            }
        }
    }

    #[test]
    fn consent_never_comes_from_another_namespace(list in tricky(), ns in "[a-z]{1,8}") {
        let target = Target { member: "alpha", namespace: &ns };
        if restore_source::consents(Some(&list), "alpha", target) {
            prop_assert!(list.split(',').map(str::trim)
                .any(|e| e == ns || e == format!("alpha/{ns}")), "{list:?}");
        }
    }
}
