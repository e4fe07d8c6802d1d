use super::*;

fn pod(name: &str, role: &str, ready: bool) -> (String, PodInfo) {
    (
        name.to_string(),
        PodInfo {
            name: name.into(),
            role: Some(crate::crd::Role::from_label(role)),
            ready,
            version: Some("15.20".into()),
            ..Default::default()
        },
    )
}

fn observed(pods: &[(&str, &str, bool)], pvcs: &[&str]) -> Observed {
    Observed {
        pods: pods.iter().map(|(n, r, ok)| pod(n, r, *ok)).collect(),
        pvcs: pvcs.iter().map(|s| s.to_string()).collect(),
        ..Default::default()
    }
}

#[test]
fn a_new_cluster_bootstraps_instance_one_with_initdb() {
    let p = plan_instances("pg", 3, None, &Observed::default());
    assert_eq!(p.primary, Some(1));
    assert_eq!(p.create, vec![(1, "initdb"), (2, "clone"), (3, "clone")]);
    assert_eq!(p.keep, vec![1, 2, 3]);
    assert!(p.remove.is_empty());
}

#[test]
fn scale_up_clones_into_the_lowest_free_ordinals() {
    let obs = observed(
        &[("pg-1", "primary", true), ("pg-3", "replica", true)],
        &["pg-1", "pg-3"],
    );
    let p = plan_instances("pg", 5, Some("pg-1"), &obs);
    assert_eq!(p.create, vec![(2, "clone"), (4, "clone"), (5, "clone")]);
}

#[test]
fn scale_down_removes_highest_ordinals_but_never_the_primary() {
    let obs = observed(
        &[
            ("pg-1", "replica", true),
            ("pg-2", "replica", true),
            ("pg-3", "replica", true),
            ("pg-4", "replica", true),
            ("pg-5", "primary", true),
        ],
        &["pg-1", "pg-2", "pg-3", "pg-4", "pg-5"],
    );
    let p = plan_instances("pg", 2, Some("pg-5"), &obs);
    assert_eq!(p.remove, vec![4, 3, 2]);
    assert_eq!(p.keep, vec![1, 5]);
    assert_eq!(p.primary, Some(5));
}

#[test]
fn a_deleted_pod_with_its_volume_is_recreated() {
    let obs = observed(&[("pg-1", "primary", true)], &["pg-1", "pg-2"]);
    let p = plan_instances("pg", 2, Some("pg-1"), &obs);
    assert_eq!(p.recreate_pods, vec![2]);
    assert!(p.create.is_empty());
}

#[test]
fn status_reports_health_and_keeps_transition_times() {
    let obs = observed(
        &[("pg-1", "primary", true), ("pg-2", "replica", true)],
        &["pg-1", "pg-2"],
    );
    let inp = StatusInput {
        cluster: "pg",
        size: 2,
        version: "15.20",
        generation: Some(3),
        primary: Some("pg-1".into()),
        invalid: None,
        pending_restart: vec![],
        previous: None,
        rolling: None,
        streaming: None,
        now: "t1".into(),
    };
    let s = status(&inp, &obs);
    assert_eq!(s.phase, Some(crate::crd::Phase::Healthy));
    assert_eq!(s.ready_instances, 2);
    assert_eq!(s.current_primary.as_deref(), Some("pg-1"));
    assert_eq!(s.observed_generation, Some(3));
    let again = status(
        &StatusInput {
            previous: Some(&s),
            rolling: None,
            streaming: None,
            now: "t2".into(),
            ..inp
        },
        &obs,
    );
    assert!(!status_changed(&s, &again));
    assert_eq!(
        again.conditions[0].last_transition_time.as_deref(),
        Some("t1")
    );
}

#[test]
fn status_is_degraded_when_an_instance_is_not_ready() {
    let obs = observed(
        &[("pg-1", "primary", true), ("pg-2", "replica", false)],
        &["pg-1", "pg-2"],
    );
    let prev = PostgresClusterStatus {
        current_primary: Some("pg-1".into()),
        ..Default::default()
    };
    let inp = StatusInput {
        cluster: "pg",
        size: 2,
        version: "15.20",
        generation: Some(1),
        primary: Some("pg-1".into()),
        invalid: None,
        pending_restart: vec!["max_connections".into()],
        previous: Some(&prev),
        rolling: None,
        streaming: None,
        now: "t".into(),
    };
    let s = status(&inp, &obs);
    assert_eq!(s.phase, Some(crate::crd::Phase::Degraded));
    assert!(
        s.conditions
            .iter()
            .any(|c| c.type_ == "PendingRestart" && c.status == "True")
    );
}

#[test]
fn a_replica_without_its_volume_is_rebuilt_but_never_the_primary() {
    let obs = observed(
        &[
            ("pg-1", "primary", true),
            ("pg-2", "replica", true),
            ("pg-3", "replica", true),
        ],
        &["pg-2"],
    );
    let p = plan_instances("pg", 3, Some("pg-1"), &obs);
    assert_eq!(p.rebuild, vec![3]);
    assert_eq!(p.keep, vec![1, 2, 3]);
    assert!(p.create.is_empty() && p.remove.is_empty());
    // Once its Pod is gone the ordinal is free and is created again.
    let obs = observed(
        &[("pg-1", "primary", true), ("pg-2", "replica", true)],
        &["pg-2"],
    );
    let p = plan_instances("pg", 3, Some("pg-1"), &obs);
    assert_eq!(p.create, vec![(3, "clone")]);
    assert!(p.rebuild.is_empty());
}

#[test]
fn a_replica_not_streaming_shows_as_a_condition_naming_it() {
    let obs = observed(
        &[("pg-1", "primary", true), ("pg-2", "replica", true)],
        &["pg-1", "pg-2"],
    );
    let inp = StatusInput {
        cluster: "pg",
        size: 2,
        version: "15.20",
        generation: Some(1),
        primary: Some("pg-1".into()),
        invalid: None,
        pending_restart: vec![],
        previous: None,
        rolling: None,
        streaming: Some((false, "NotStreaming", "not streaming: pg-2".into())),
        now: "t".into(),
    };
    let s = status(&inp, &obs);
    let c = s
        .conditions
        .iter()
        .find(|c| c.type_ == "ReplicasStreaming")
        .unwrap();
    assert_eq!(
        (c.status.as_str(), c.reason.as_str()),
        ("False", "NotStreaming")
    );
    assert!(c.message.contains("pg-2"));
    // Streaming again: the condition turns True, and that is a change.
    let again = status(
        &StatusInput {
            previous: Some(&s),
            streaming: Some((true, "AllStreaming", String::new())),
            now: "t2".into(),
            ..inp
        },
        &obs,
    );
    assert!(status_changed(&s, &again));
}
