use super::*;

fn pod(name: &str, role: &str, hash: &str, ready: bool) -> PodInfo {
    PodInfo {
        name: name.into(),
        role: Some(crate::crd::Role::from_label(role)),
        ready,
        hash: Some(hash.into()),
        ..Default::default()
    }
}

fn pods(list: &[PodInfo]) -> SmallMap<String, PodInfo> {
    list.iter().map(|p| (p.name.clone(), p.clone())).collect()
}

fn step(pods: &SmallMap<String, PodInfo>, method: PrimaryUpdateMethod) -> Step {
    step_with(pods, method, PrimaryUpdateStrategy::Unsupervised, &|_| None)
}

fn step_with(
    pods: &SmallMap<String, PodInfo>,
    method: PrimaryUpdateMethod,
    strategy: PrimaryUpdateStrategy,
    not_ready_for: &dyn Fn(&PodInfo) -> Option<Duration>,
) -> Step {
    next_step(&Input {
        cluster: "pg",
        pods,
        size: pods.len() as u32,
        desired: "new",
        primary: "pg-1",
        method,
        strategy,
        start_timeout: Duration::from_secs(600),
        not_ready_for,
    })
}

const SW: PrimaryUpdateMethod = PrimaryUpdateMethod::Switchover;

#[test]
fn nothing_outdated_is_idle() {
    let p = pods(&[
        pod("pg-1", "primary", "new", true),
        pod("pg-2", "replica", "new", false),
    ]);
    assert_eq!(step(&p, SW), Step::Idle);
}

#[test]
fn replicas_go_first_highest_ordinal_first_then_switchover_then_old_primary() {
    let mut p = pods(&[
        pod("pg-1", "primary", "old", true),
        pod("pg-2", "replica", "old", true),
        pod("pg-3", "replica", "old", true),
    ]);
    assert_eq!(step(&p, SW), Step::RestartReplica("pg-3".into()));
    // Restarting: the next one waits until it is back and ready.
    p.get_mut("pg-3").unwrap().deleting = true;
    assert!(matches!(step(&p, SW), Step::Wait(_)));
    *p.get_mut("pg-3").unwrap() = pod("pg-3", "replica", "new", false);
    assert_eq!(step(&p, SW), Step::Wait("pg-3".into()));
    p.get_mut("pg-3").unwrap().ready = true;
    assert_eq!(step(&p, SW), Step::RestartReplica("pg-2".into()));
    *p.get_mut("pg-2").unwrap() = pod("pg-2", "replica", "new", true);
    assert_eq!(
        step(&p, SW),
        Step::Switchover(vec!["pg-2".into(), "pg-3".into()])
    );
}

#[test]
fn after_the_switchover_the_old_primary_is_restarted_as_a_replica_never_switched_again() {
    // pg-2 became primary; the decision input names it as the primary now.
    let p = pods(&[
        pod("pg-1", "replica", "old", true),
        pod("pg-2", "primary", "new", true),
    ]);
    let s = next_step(&Input {
        cluster: "pg",
        pods: &p,
        size: 2,
        desired: "new",
        primary: "pg-2",
        method: SW,
        strategy: PrimaryUpdateStrategy::Unsupervised,
        start_timeout: Duration::from_secs(600),
        not_ready_for: &|_| None,
    });
    assert_eq!(s, Step::RestartReplica("pg-1".into()));
}

#[test]
fn restart_method_and_single_instances_restart_the_primary_in_place() {
    let p = pods(&[
        pod("pg-1", "primary", "old", true),
        pod("pg-2", "replica", "new", true),
    ]);
    assert_eq!(
        step(&p, PrimaryUpdateMethod::Restart),
        Step::RestartPrimary("pg-1".into())
    );
    let single = pods(&[pod("pg-1", "primary", "old", true)]);
    assert_eq!(step(&single, SW), Step::RestartPrimary("pg-1".into()));
}

#[test]
fn supervised_waits_for_an_operator() {
    let p = pods(&[
        pod("pg-1", "primary", "old", true),
        pod("pg-2", "replica", "new", true),
    ]);
    assert_eq!(
        step_with(&p, SW, PrimaryUpdateStrategy::Supervised, &|_| None),
        Step::AwaitSwitchover
    );
}

#[test]
fn an_updated_instance_that_cannot_start_fails_the_update_with_the_reason() {
    let mut p = pods(&[
        pod("pg-1", "primary", "old", true),
        pod("pg-2", "replica", "new", false),
        pod("pg-3", "replica", "old", true),
    ]);
    p.get_mut("pg-2").unwrap().waiting = Some("ImagePullBackOff: no such image".into());
    match step(&p, SW) {
        Step::Failed { instance, reason } => {
            assert_eq!(instance, "pg-2");
            assert!(reason.contains("ImagePullBackOff"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    // Not ready for too long fails too; briefly not ready only waits.
    p.get_mut("pg-2").unwrap().waiting = None;
    let slow = |_: &PodInfo| Some(Duration::from_secs(700));
    assert!(matches!(
        step_with(&p, SW, PrimaryUpdateStrategy::Unsupervised, &slow),
        Step::Failed { .. }
    ));
    let brief = |_: &PodInfo| Some(Duration::from_secs(5));
    assert_eq!(
        step_with(&p, SW, PrimaryUpdateStrategy::Unsupervised, &brief),
        Step::Wait("pg-2".into())
    );
}

#[test]
fn a_broken_outdated_replica_is_replaced_first() {
    // After a revert the broken instance is the outdated one: it goes first
    // even though it is not ready.
    let p = pods(&[
        pod("pg-1", "primary", "new", true),
        pod("pg-2", "replica", "old", false),
        pod("pg-3", "replica", "new", true),
    ]);
    assert_eq!(step(&p, SW), Step::RestartReplica("pg-2".into()));
}
