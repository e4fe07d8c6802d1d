#![allow(clippy::unwrap_used)]

use super::*;

const S: fn(u64) -> Duration = Duration::from_secs;

fn limits() -> Limits {
    Limits {
        failover_after: S(30),
        automatic: true,
        max_rpo_bytes: 1000,
        max_rpo_lag: S(10),
    }
}

fn cand(member: &str, silent: u64, lag_bytes: u64, lag: u64, received: u64) -> Candidate {
    Candidate {
        member: member.into(),
        silent: S(silent),
        lag_bytes: Some(lag_bytes),
        lag: Some(S(lag)),
        received,
    }
}

fn witness(primary_silent: u64, replicas: Vec<Candidate>) -> Witness {
    Witness {
        primary_silent: S(primary_silent),
        replicas,
    }
}

#[test]
fn promotes_only_when_the_manager_and_the_replica_side_both_lost_the_primary() {
    let l = limits();
    assert_eq!(
        decide(&witness(29, vec![cand("b", 40, 0, 0, 9)]), &l),
        Verdict::Keep
    );
    // Manager <-> primary cut only: the replica side still streams.
    assert_eq!(
        decide(&witness(40, vec![cand("b", 1, 0, 0, 9)]), &l),
        Verdict::Keep
    );
    assert_eq!(
        decide(&witness(30, vec![cand("b", 30, 10, 1, 9)]), &l),
        Verdict::Promote("b".into())
    );
    // No replica side answers: nobody to promote.
    assert_eq!(decide(&witness(40, vec![]), &l), Verdict::Keep);
}

#[test]
fn the_most_advanced_lost_side_is_chosen() {
    let w = witness(
        40,
        vec![
            cand("b", 40, 10, 1, 5),
            cand("c", 40, 5, 1, 7),
            cand("d", 2, 0, 0, 9),
        ],
    );
    assert_eq!(decide(&w, &limits()), Verdict::Promote("c".into()));
}

#[test]
fn lag_above_max_rpo_or_unmeasured_or_automatic_off_blocks_and_says_why() {
    let l = limits();
    let Verdict::Blocked(why) = decide(&witness(40, vec![cand("b", 40, 5000, 1, 9)]), &l) else {
        panic!()
    };
    assert!(
        why.contains("5000 bytes") && why.contains("--accept-data-loss"),
        "{why}"
    );
    let Verdict::Blocked(why) = decide(&witness(40, vec![cand("b", 40, 10, 11, 9)]), &l) else {
        panic!()
    };
    assert!(why.contains("11000 ms"), "{why}");
    let mut c = cand("b", 40, 0, 0, 9);
    c.lag = None;
    assert!(
        matches!(decide(&witness(40, vec![c]), &l), Verdict::Blocked(w) if w.contains("never measured"))
    );
    let off = Limits {
        automatic: false,
        ..limits()
    };
    assert!(
        matches!(decide(&witness(40, vec![cand("b", 40, 0, 0, 9)]), &off), Verdict::Blocked(w) if w.contains("automatic failover is off"))
    );
}

#[test]
fn lag_in_time_is_the_age_of_the_oldest_write_the_replica_lacks() {
    // Newest first: 0 s ago at 300, 2 s ago at 200, 5 s ago at 100.
    let samples = [(S(0), 300), (S(2), 200), (S(5), 100)];
    assert_eq!(lag_in_time(&samples, 300), Some(S(0)));
    assert_eq!(lag_in_time(&samples, 150), Some(S(2)));
    assert_eq!(lag_in_time(&samples, 50), Some(S(5)));
    assert_eq!(lag_in_time(&[], 50), None);
}
