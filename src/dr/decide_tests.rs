#![allow(clippy::unwrap_used)]

use super::*;

fn report(
    role: &str,
    cur: Option<&str>,
    received: Option<&str>,
    replayed: Option<&str>,
) -> InstanceReport {
    let mut r: InstanceReport = serde_json::from_value(serde_json::json!({
        "contract": 1, "role": role, "ready": true,
    }))
    .unwrap();
    r.current_lsn = cur.map(String::from);
    r.received_lsn = received.map(String::from);
    r.replayed_lsn = replayed.map(String::from);
    r
}

fn view(member: &str, r: Option<InstanceReport>) -> SideView {
    SideView {
        member: member.into(),
        reachable: true,
        copy: Some(state("a", false)),
        primary_pod: Some(format!("db-{member}")),
        report: r,
        endpoint: None,
    }
}

fn state(primary: &str, forced: bool) -> State {
    State {
        epoch: 2,
        primary: primary.into(),
        endpoint: Some("127.200.0.9:5432".into()),
        previous_endpoint: None,
        forced,
    }
}

fn members() -> Vec<String> {
    vec!["a".into(), "b".into()]
}

fn topo() -> Topology {
    Topology {
        namespace: "ns".into(),
        name: "db".into(),
        members: members(),
        ..Topology::default()
    }
}

#[test]
fn a_new_topology_starts_on_its_first_member_only_when_every_copy_was_read() {
    let mut views = vec![view("a", None), view("b", None)];
    views[0].copy = None;
    views[1].copy = None;
    let s = initial(&members(), &views).unwrap();
    assert_eq!((s.epoch, s.primary.as_str()), (1, "a"));
    views[1].reachable = false;
    assert_eq!(initial(&members(), &views), None);
}

#[test]
fn replica_sides_stream_from_the_primary_sides_address_or_wait_without_one() {
    let s = state("a", false);
    let got = sides("t", &s, &topo(), &[]);
    assert!(matches!(&got[0].1, Side::Primary { epoch: 2, .. }));
    let Side::Replica { source, member, .. } = &got[1].1 else {
        panic!("{got:?}")
    };
    assert_eq!(
        (source.host.as_str(), source.port, member.as_str()),
        ("127.200.0.9", 5432, "b")
    );
    let mut s = s;
    s.endpoint = None;
    assert_eq!(sides("t", &s, &topo(), &[])[1].1, Side::Unknown);
}

#[test]
fn the_new_primary_follows_the_old_one_until_it_has_everything() {
    let mut s = state("b", false);
    s.previous_endpoint = Some("127.200.0.1:5432".into());
    let views = vec![
        view("a", Some(report("replica", None, None, Some("0/5000028")))),
        view("b", Some(report("replica", None, Some("0/5000000"), None))),
    ];
    let got = sides("t", &s, &topo(), &views);
    let Side::Replica { source, .. } = &got[1].1 else {
        panic!("{got:?}")
    };
    assert_eq!(source.host, "127.200.0.1");
    // Everything received: b is the primary side, a follows b.
    let views = vec![
        view("a", Some(report("replica", None, None, Some("0/5000028")))),
        view("b", Some(report("replica", None, Some("0/5000028"), None))),
    ];
    let got = sides("t", &s, &topo(), &views);
    assert!(matches!(&got[1].1, Side::Primary { .. }), "{got:?}");
    assert!(matches!(&got[0].1, Side::Replica { source, .. } if source.host == "127.200.0.9"));
    // A forced promotion does not wait.
    s.forced = true;
    assert!(matches!(
        &sides("t", &s, &topo(), &[])[1].1,
        Side::Primary { .. }
    ));
}

#[test]
fn after_a_forced_promotion_only_a_streaming_side_is_synchronous() {
    let mut t = topo();
    t.synchronous = true;
    let sync_with = |s: &State, views: &[SideView]| match &sides("t", s, &t, views)[1].1 {
        Side::Primary {
            synchronous_with, ..
        } => synchronous_with.clone(),
        other => panic!("{other:?}"),
    };
    let mut s = state("b", false);
    assert_eq!(sync_with(&s, &[]), vec!["a".to_string()]);
    s.forced = true;
    assert!(sync_with(&s, &[]).is_empty());
    let mut back = report("replica", None, Some("0/1"), None);
    back.wal_receiver = Some("streaming".into());
    let views = vec![
        view("a", Some(back)),
        view("b", Some(report("primary", Some("0/2"), None, None))),
    ];
    assert_eq!(sync_with(&s, &views), vec!["a".to_string()]);
}

#[test]
fn a_switchover_demotes_first_and_promotes_only_after_the_hand_over() {
    // State says b; a still takes writes: demote a cleanly, do not promote b.
    let s = state("b", false);
    let views = vec![
        view("a", Some(report("primary", Some("0/5000000"), None, None))),
        view(
            "b",
            Some(report(
                "replica",
                None,
                Some("0/4000000"),
                Some("0/4000000"),
            )),
        ),
    ];
    assert_eq!(
        converge(&s, &views),
        vec![Step::Demote {
            member: "a".into(),
            pod: "db-a".into(),
            rewind: false
        }]
    );
    // a demoted, ended at 0/5000028; b has not received it yet.
    let views = vec![
        view("a", Some(report("replica", None, None, Some("0/5000028")))),
        view("b", Some(report("replica", None, Some("0/5000000"), None))),
    ];
    assert!(converge(&s, &views).is_empty());
    // A reconnected receiver reports its segment start; what it replayed
    // counts too.
    let views = vec![
        view("a", Some(report("replica", None, None, Some("0/60000A0")))),
        view(
            "b",
            Some(report(
                "replica",
                None,
                Some("0/6000000"),
                Some("0/60000A0"),
            )),
        ),
    ];
    assert_eq!(converge(&s, &views).len(), 1);
    // b has everything: promote.
    let views = vec![
        view("a", Some(report("replica", None, None, Some("0/5000028")))),
        view("b", Some(report("replica", None, Some("0/5000028"), None))),
    ];
    assert_eq!(
        converge(&s, &views),
        vec![Step::Promote {
            member: "b".into(),
            pod: "db-b".into()
        }]
    );
}

#[test]
fn a_switchover_never_promotes_while_the_old_side_is_silent() {
    let s = state("b", false);
    let views = vec![
        view("a", None),
        view("b", Some(report("replica", None, Some("0/9000000"), None))),
    ];
    assert!(converge(&s, &views).is_empty());
}

#[test]
fn a_forced_promotion_promotes_at_once_and_rewinds_the_returning_primary() {
    let s = state("b", true);
    let mut views = vec![
        view("a", None),
        view("b", Some(report("replica", None, Some("0/3000000"), None))),
    ];
    views[0].reachable = false;
    assert_eq!(
        converge(&s, &views),
        vec![Step::Promote {
            member: "b".into(),
            pod: "db-b".into()
        }]
    );
    let views = vec![
        view("a", Some(report("primary", Some("0/3100000"), None, None))),
        view("b", Some(report("primary", Some("0/3000100"), None, None))),
    ];
    assert_eq!(
        converge(&s, &views),
        vec![Step::Demote {
            member: "a".into(),
            pod: "db-a".into(),
            rewind: true
        }]
    );
}

#[test]
fn a_fenced_side_is_unfenced_only_once_every_copy_was_read() {
    let s = state("b", true);
    let mut fenced = report("stopped", None, None, None);
    fenced.fenced = true;
    let mut views = vec![
        view("a", Some(fenced)),
        view("b", Some(report("primary", Some("0/3000100"), None, None))),
    ];
    assert_eq!(
        converge(&s, &views),
        vec![Step::Unfence {
            member: "a".into(),
            pod: "db-a".into(),
            replica: true,
        }]
    );
    views[1].copy = None;
    assert!(converge(&s, &views).is_empty());
}

#[test]
fn a_primary_side_that_fenced_itself_while_nobody_was_promoted_comes_back() {
    let s = state("a", false);
    let mut fenced = report("stopped", None, None, None);
    fenced.fenced = true;
    let views = vec![
        view("a", Some(fenced)),
        view("b", Some(report("replica", None, Some("0/3000100"), None))),
    ];
    assert_eq!(
        converge(&s, &views),
        vec![Step::Unfence {
            member: "a".into(),
            pod: "db-a".into(),
            replica: false,
        }]
    );
}

#[test]
fn lag_is_the_primary_position_minus_what_the_replica_received() {
    let p = view("a", Some(report("primary", Some("0/5000000"), None, None)));
    let r = view("b", Some(report("replica", None, Some("0/4FFF000"), None)));
    assert_eq!(lag_bytes(&p, &r), Some(0x1000));
    assert_eq!(lag_bytes(&p, &view("b", None)), None);
}
