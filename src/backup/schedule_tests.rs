use std::str::FromStr as _;
use std::time::Duration;

use chrono::{DateTime, TimeDelta, TimeZone as _, Utc};
use croner::Cron;

use super::*;

const MIN: Duration = Duration::from_secs(60);
const HOUR: Duration = Duration::from_secs(3600);

fn cron(expr: &str) -> Cron {
    Cron::from_str(expr).unwrap()
}

fn at(day: u32, h: u32, m: u32, s: u32) -> DateTime<Utc> {
    Utc.with_ymd_and_hms(2026, 3, day, h, m, s).unwrap()
}

fn caps(global: u32, per_member: u32, per_repository: Option<u32>) -> Caps {
    Caps {
        global,
        per_member,
        per_repository,
    }
}

fn start(slot: DateTime<Utc>) -> Due {
    Due::Start { slot }
}

fn idle(next: DateTime<Utc>) -> Due {
    Due::Idle { next: Some(next) }
}

fn plus(t: DateTime<Utc>, d: Duration) -> DateTime<Utc> {
    t + TimeDelta::from_std(d).unwrap()
}

/// 3 member clusters × 10 PostgresClusters: (member, cluster_key, offset).
fn fleet(window: Duration) -> Vec<(String, String, Duration)> {
    let mut out = Vec::new();
    for member in ["eu-west", "us-east", "ap-south"] {
        for i in 0..10 {
            let name = format!("pg-{i}");
            let key = format!("{member}/db/{name}");
            out.push((member.to_string(), key, offset(window, member, "db", &name)));
        }
    }
    out
}

#[test]
fn offset_is_stable_and_bounded() {
    let window = 2 * HOUR;
    let a = offset(window, "eu-west", "db", "pg-0");
    assert_eq!(a, offset(window, "eu-west", "db", "pg-0"));
    // Pinned: a change here would move every backup in the fleet.
    let key = fnv1a64(b"eu-west/db/pg-0");
    assert_eq!(a, Duration::from_secs(key % 7200));
    assert!(a < window);
    for tiny in [0, 900, 1000] {
        let window = Duration::from_millis(tiny);
        assert_eq!(offset(window, "m", "ns", "n"), Duration::ZERO);
    }
}

#[test]
fn thirty_clusters_spread_over_the_window() {
    let daily = cron("0 2 * * *");
    let now = at(15, 5, 0, 0);
    let slots: Vec<_> = fleet(2 * HOUR)
        .iter()
        .map(|(_, _, off)| last_slot(&daily, *off, now).unwrap())
        .collect();
    let mut buckets = [0u32; 12];
    let mut per_minute = std::collections::HashMap::new();
    for &slot in &slots {
        *per_minute
            .entry(slot.format("%H:%M").to_string())
            .or_insert(0) += 1;
        assert!(slot >= at(15, 2, 0, 0) && slot < at(15, 4, 0, 0), "{slot}");
        let minutes = (slot - at(15, 2, 0, 0)).num_minutes();
        buckets[usize::try_from(minutes / 10).unwrap()] += 1;
    }
    assert!(buckets.iter().all(|&n| n <= 8), "{buckets:?}");
    assert!(per_minute.values().all(|&n| n <= 3), "{per_minute:?}");
    let mut distinct = slots.clone();
    distinct.sort();
    distinct.dedup();
    assert!(distinct.len() >= 25, "{} distinct slots", distinct.len());
}

#[test]
fn slots_are_occurrences_shifted_by_offset() {
    let daily = cron("0 2 * * *");
    let last = |now| last_slot(&daily, 90 * MIN, now);
    let next = |now| next_slot(&daily, 90 * MIN, now);
    // 03:00: today's 02:00 occurrence has its slot at 03:30, still ahead.
    assert_eq!(last(at(15, 3, 0, 0)), Some(at(14, 3, 30, 0)));
    assert_eq!(next(at(15, 3, 0, 0)), Some(at(15, 3, 30, 0)));
    // A slot is its own last slot; the next one is strictly later.
    assert_eq!(last(at(15, 3, 30, 0)), Some(at(15, 3, 30, 0)));
    assert_eq!(next(at(15, 3, 30, 0)), Some(at(16, 3, 30, 0)));
    // Fractions of a second do not pull a slot past `now` or repeat one.
    let just_after = at(15, 3, 30, 0) + TimeDelta::milliseconds(500);
    assert_eq!(last(just_after), Some(at(15, 3, 30, 0)));
    assert_eq!(next(just_after), Some(at(16, 3, 30, 0)));
    // An offset longer than the period still lands on shifted occurrences.
    let hourly = cron("0 * * * *");
    let slot = last_slot(&hourly, 150 * MIN, at(15, 3, 10, 0));
    assert_eq!(slot, Some(at(15, 2, 30, 0)));
    // A schedule that never fires has no slots.
    let never = cron("0 0 30 2 *");
    assert_eq!(last_slot(&never, MIN, at(15, 3, 0, 0)), None);
    assert_eq!(next_slot(&never, MIN, at(15, 3, 0, 0)), None);
}

struct Sim {
    member: String,
    key: String,
    offset: Duration,
    handled: Option<DateTime<Utc>>,
    started: Vec<(DateTime<Utc>, DateTime<Utc>)>,
}

/// Peaks seen while simulating 01:00–05:00 in 1-minute ticks.
#[derive(Default)]
struct DayStats {
    peak_global: usize,
    peak_member: usize,
    longest_wait: TimeDelta,
}

/// Runs the 30-cluster fleet through a day's `0 2 * * *` backups, each
/// taking `took`, and checks every invariant on every tick.
fn simulate_day(limits: Caps, took: Duration) -> DayStats {
    let daily = cron("0 2 * * *");
    let deadline = HOUR;
    let created = at(1, 0, 0, 0);
    let start = at(15, 1, 0, 0);
    let mut sims: Vec<Sim> = fleet(2 * HOUR)
        .into_iter()
        .map(|(member, key, offset)| Sim {
            member,
            key,
            offset,
            // Yesterday's backups all ran.
            handled: last_slot(&daily, offset, start),
            started: Vec::new(),
        })
        .collect();
    // (finish time, Running)
    let mut running: Vec<(DateTime<Utc>, Running)> = Vec::new();
    let mut stats = DayStats::default();

    let mut now = start;
    while now <= at(15, 5, 0, 0) {
        running.retain(|(end, _)| *end > now);
        let mut candidates = Vec::new();
        let mut owner = Vec::new();
        for (i, sim) in sims.iter().enumerate() {
            match due(&daily, sim.offset, sim.handled, created, now, deadline) {
                Due::Idle { .. } => {}
                Due::Start { slot } => {
                    owner.push((i, slot));
                    candidates.push(Candidate {
                        member: sim.member.clone(),
                        repository: "s3://backups".to_string(),
                        cluster_key: sim.key.clone(),
                        priority: slot,
                        not_before: None,
                    });
                }
                Due::Skip { slot, .. } => panic!("{} skipped {slot} at {now}", sim.key),
            }
        }
        let current: Vec<Running> = running.iter().map(|(_, r)| r.clone()).collect();
        for c in select(&limits, &current, &candidates, now) {
            let (i, slot) = owner[c];
            let sim = &mut sims[i];
            sim.handled = Some(slot);
            sim.started.push((slot, now));
            stats.longest_wait = stats.longest_wait.max(now - slot);
            running.push((plus(now, took), run(&sim.member, "s3://backups", &sim.key)));
        }
        let global = running.len();
        assert!(
            global <= limits.global as usize,
            "{global} running at {now}"
        );
        stats.peak_global = stats.peak_global.max(global);
        for member in ["eu-west", "us-east", "ap-south"] {
            let n = running.iter().filter(|(_, r)| r.member == member).count();
            assert!(
                n <= limits.per_member as usize,
                "{n} running on {member} at {now}"
            );
            stats.peak_member = stats.peak_member.max(n);
        }
        now = plus(now, MIN);
    }

    for sim in &sims {
        let [(slot, started)] = sim.started[..] else {
            panic!("{} started {:?}", sim.key, sim.started);
        };
        assert_eq!(slot.date_naive(), start.date_naive());
        let (key, late) = (&sim.key, plus(slot, deadline));
        assert!(
            slot <= started && started <= late,
            "{key}: {slot} {started}"
        );
    }
    stats
}

#[test]
fn a_day_of_thirty_backups_respects_caps_and_deadlines() {
    let stats = simulate_day(caps(4, 2, None), 7 * MIN);
    // The global cap was reached and made backups queue (minute ticks alone
    // delay a start by under a minute), so the checks above mean something.
    assert_eq!(stats.peak_global, 4);
    assert!(stats.longest_wait >= TimeDelta::minutes(1));
}

#[test]
fn a_day_under_only_the_member_cap_still_meets_every_deadline() {
    // Longer backups, so that two at a time per member makes some wait.
    let stats = simulate_day(caps(30, 2, None), 20 * MIN);
    assert_eq!(stats.peak_member, 2);
    assert!(stats.longest_wait >= TimeDelta::minutes(1));
}

#[test]
fn manager_down_for_days_skips_once_and_never_storms() {
    let daily = cron("0 2 * * *");
    let created = at(1, 0, 0, 0);
    let back_up_at = at(15, 10, 0, 0);
    let mut starts = 0;
    let mut skips = 0;
    for (_, key, off) in fleet(2 * HOUR) {
        // The last backup ran three days before the manager came back.
        let yesterday = last_slot(&daily, off, at(12, 5, 0, 0)).unwrap();
        let today = plus(at(15, 2, 0, 0), off);
        let mut handled = Some(yesterday);
        let mut now = back_up_at;
        // Run the restarted manager until just before tomorrow's slot.
        while now < plus(at(16, 2, 0, 0), off) {
            match due(&daily, off, handled, created, now, HOUR) {
                Due::Idle { next } => assert_eq!(next, Some(plus(at(16, 2, 0, 0), off))),
                Due::Start { .. } => starts += 1,
                Due::Skip { slot, late_by } => {
                    assert_eq!(slot, today, "{key}");
                    assert_eq!(late_by, (now - today).to_std().unwrap());
                    skips += 1;
                    handled = Some(slot);
                }
            }
            now = plus(now, 15 * MIN);
        }
    }
    assert_eq!((skips, starts), (30, 0));
}

#[test]
fn a_slot_within_the_deadline_starts_after_downtime() {
    let daily = cron("0 2 * * *");
    let yesterday = Some(at(12, 2, 17, 0));
    let check = |now| due(&daily, 17 * MIN, yesterday, at(1, 0, 0, 0), now, HOUR);
    assert_eq!(check(at(15, 2, 40, 0)), start(at(15, 2, 17, 0)));
    // Exactly at the deadline still starts; a second later skips.
    assert_eq!(check(at(15, 3, 17, 0)), start(at(15, 2, 17, 0)));
    let late_by = HOUR + Duration::from_secs(1);
    let slot = at(15, 2, 17, 0);
    assert_eq!(check(at(15, 3, 17, 1)), Due::Skip { slot, late_by });
}

#[test]
fn no_slots_are_owed_before_creation_or_twice() {
    let daily = cron("0 2 * * *");
    let check = |handled, created, now| due(&daily, 17 * MIN, handled, created, now, HOUR);
    let now = at(15, 9, 0, 0);
    // Created after today's slot: nothing now, first backup tomorrow.
    assert_eq!(check(None, at(15, 8, 0, 0), now), idle(at(16, 2, 17, 0)));
    // Created in the future (clock skew): the first slot not before it.
    assert_eq!(check(None, at(17, 1, 0, 0), now), idle(at(17, 2, 17, 0)));
    // Created exactly on a slot: that slot is owed.
    let created = at(15, 2, 17, 0);
    assert_eq!(check(None, created, at(15, 2, 30, 0)), start(created));
    // Already handled: idle until tomorrow's slot.
    let handled = Some(at(15, 2, 17, 0));
    assert_eq!(check(handled, at(1, 0, 0, 0), now), idle(at(16, 2, 17, 0)));
    let never = cron("0 0 30 2 *");
    let no_next = due(&never, MIN, None, at(1, 0, 0, 0), now, HOUR);
    assert_eq!(no_next, Due::Idle { next: None });
}

fn cand(member: &str, repo: &str, key: &str, minute: u32) -> Candidate {
    Candidate {
        member: member.to_string(),
        repository: repo.to_string(),
        cluster_key: key.to_string(),
        priority: at(15, 2, minute, 0),
        not_before: None,
    }
}

fn run(member: &str, repo: &str, key: &str) -> Running {
    Running {
        member: member.to_string(),
        repository: repo.to_string(),
        cluster_key: key.to_string(),
    }
}

const WIDE: Caps = Caps {
    global: 100,
    per_member: 100,
    per_repository: None,
};

#[test]
fn select_starts_one_backup_per_cluster_earliest_first() {
    let now = at(15, 3, 0, 0);
    let candidates = [
        cand("a", "r", "a/db/x", 5),
        cand("a", "r", "a/db/x", 1), // e.g. an on-demand request, older
        cand("a", "r", "a/db/y", 9),
        cand("a", "r", "a/db/z", 2),
    ];
    assert_eq!(select(&WIDE, &[], &candidates, now), vec![1, 3, 2]);
    // Already running: no second backup of the same cluster.
    let running = [run("a", "r", "a/db/z")];
    assert_eq!(select(&WIDE, &running, &candidates, now), vec![1, 2]);
    // Ties on priority break by cluster key, not input order.
    let tied = [cand("a", "r", "a/db/b", 1), cand("a", "r", "a/db/a", 1)];
    assert_eq!(select(&WIDE, &[], &tied, now), vec![1, 0]);
}

#[test]
fn select_respects_global_and_repository_caps() {
    let now = at(15, 3, 0, 0);
    let candidates = [
        cand("a", "r1", "a/db/1", 1),
        cand("b", "r1", "b/db/2", 2),
        cand("c", "r1", "c/db/3", 3),
        cand("c", "r2", "c/db/4", 4),
    ];
    let limits = caps(10, 10, Some(2));
    let running = [run("z", "r1", "z/db/0")];
    // r1 has one running, so only one more; r2 is free.
    assert_eq!(select(&limits, &running, &candidates, now), vec![0, 3]);
    let limits = caps(3, 10, None);
    assert_eq!(select(&limits, &running, &candidates, now), vec![0, 1]);
    let limits = caps(0, 10, None);
    assert!(select(&limits, &[], &candidates, now).is_empty());
}

#[test]
fn a_capped_member_does_not_block_other_members() {
    let now = at(15, 3, 0, 0);
    let limits = caps(10, 1, None);
    let candidates = [
        cand("busy", "r", "busy/db/1", 1),
        cand("busy", "r", "busy/db/2", 2),
        cand("idle", "r", "idle/db/3", 3),
    ];
    let running = [run("busy", "r", "busy/db/0")];
    assert_eq!(select(&limits, &running, &candidates, now), vec![2]);
    assert_eq!(select(&limits, &[], &candidates, now), vec![0, 2]);
}

#[test]
fn select_waits_out_retry_backoff_without_blocking() {
    let now = at(15, 3, 0, 0);
    let limits = caps(1, 1, None);
    let mut failed = cand("a", "r", "a/db/failed", 0);
    failed.not_before = Some(plus(now, retry_after(2)));
    let candidates = [failed, cand("a", "r", "a/db/ok", 30)];
    // The older failed backup is backing off: the other one takes the slot.
    assert_eq!(select(&limits, &[], &candidates, now), vec![1]);
    // Once the backoff has passed it goes first again.
    assert_eq!(
        select(&limits, &[], &candidates, plus(now, 2 * MIN)),
        vec![0]
    );
}

#[test]
fn retry_after_doubles_from_a_minute_up_to_an_hour() {
    let minutes: Vec<u64> = (0..=9).map(|n| retry_after(n).as_secs() / 60).collect();
    assert_eq!(minutes, vec![0, 1, 2, 4, 8, 16, 32, 60, 60, 60]);
    assert_eq!(retry_after(u32::MAX), HOUR);
    // Every retry within MAX_ATTEMPTS waits less than the cap.
    assert!((1..MAX_ATTEMPTS).all(|n| retry_after(n) < HOUR));
}
