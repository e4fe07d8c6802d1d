//! Value-level tests: concurrency, selectors, windows, durations, crons,
//! versions, line lookup and key suggestions.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::time::{Duration, UNIX_EPOCH};

use super::error::Seg;
use super::lines::LineIndex;
use super::report::check_report_with_env;
use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect()
}

#[test]
fn max_concurrency_counts_and_percentages() {
    let c = |raw: &str| Checked::<Concurrency>::new(raw);
    assert_eq!(c("2").get(), Concurrency::Count(2));
    assert_eq!(c("25%").get(), Concurrency::Percent(25));
    assert_eq!(c(" 100% ").get(), Concurrency::Percent(100));
    for bad in ["0", "0%", "101%", "-1", "two", "25 %%", "1.5", ""] {
        assert!(c(bad).error().is_some(), "{bad:?} should be rejected");
    }
    // Integers and strings both work in TOML.
    let toml = "[[clusters]]\nname = \"a\"\nembedded = true\n[rollouts.r]\ntarget_version = \"15.2\"\n\
                [[rollouts.r.stages]]\nname = \"s1\"\nclusters = \"\"\nmax_concurrency = 3\n\
                [[rollouts.r.stages]]\nname = \"s2\"\nclusters = \"\"\nmax_concurrency = \"50%\"\n";
    let s = load_str(toml, "t").unwrap();
    let stages = &s.rollouts["r"].stages;
    assert_eq!(stages[0].max_concurrency.get(), Concurrency::Count(3));
    assert_eq!(stages[1].max_concurrency.get(), Concurrency::Percent(50));
    // Limits: percentages round down but never below 1, never above the total.
    assert_eq!(Concurrency::Percent(25).limit(10), 2);
    assert_eq!(Concurrency::Percent(25).limit(3), 1);
    assert_eq!(Concurrency::Percent(100).limit(7), 7);
    assert_eq!(Concurrency::Count(5).limit(3), 3);
    assert_eq!(Concurrency::Count(5).limit(0), 0);
}

#[test]
fn label_selectors() {
    let sel = |raw: &str| Checked::<LabelSelector>::new(raw).parsed().cloned();
    let prod_eu = labels(&[("env", "prod"), ("region", "eu"), ("wave", "2")]);
    let staging = labels(&[("env", "staging")]);
    let s = sel("env=prod,region=eu").unwrap();
    assert!(s.matches(&prod_eu) && !s.matches(&staging));
    let s = sel("region in (eu, us), wave!=3, !legacy").unwrap();
    assert!(s.matches(&prod_eu) && !s.matches(&staging));
    let s = sel("env notin (prod),region").unwrap();
    assert!(!s.matches(&prod_eu) && !s.matches(&staging));
    assert!(sel("env==staging").unwrap().matches(&staging));
    assert!(sel("").unwrap().matches(&staging) && sel("").unwrap().is_empty());
    for bad in [
        "env=prod,",
        "env in (a",
        "env in ()",
        "=x",
        "env=pr od",
        "a b",
        "env ~ x",
    ] {
        assert!(sel(bad).is_none(), "{bad:?} should be rejected");
    }
}

#[test]
fn maintenance_windows() {
    let w = |raw: &str| Checked::<MaintenanceWindow>::new(raw).parsed().copied();
    let sat = w("Sat 02:00-06:00").unwrap();
    assert!(sat.contains_at(5, 120) && sat.contains_at(5, 359));
    assert!(!sat.contains_at(5, 360) && !sat.contains_at(4, 180));
    assert_eq!(sat.length(), Duration::from_secs(4 * 3600));
    // Crossing midnight: opens Sunday 22:00, closes Monday 02:00.
    let night = w("sun 22:00-02:00").unwrap();
    assert!(night.contains_at(6, 23 * 60) && night.contains_at(0, 60));
    assert!(!night.contains_at(0, 23 * 60));
    let weekdays = w("Mon-Fri,Sun 01:00-03:00").unwrap();
    assert!(
        weekdays.contains_at(4, 90) && weekdays.contains_at(6, 90) && !weekdays.contains_at(5, 90)
    );
    assert!(w("* 00:00-24:00").unwrap().contains_at(3, 1439));
    // 2024-01-06 was a Saturday; 03:00 UTC is inside the window.
    let at = UNIX_EPOCH + Duration::from_secs(1_704_510_000);
    assert!(sat.contains(at));
    for bad in [
        "Sat",
        "Sat 2:00-06:00",
        "Sat 02:00-02:00",
        "Caturday 01:00-02:00",
        "Sat 24:00-02:00",
        "Sat 01:00-02:60",
        "Sat 01:00 02:00",
    ] {
        assert!(w(bad).is_none(), "{bad:?} should be rejected");
    }
    let toml = "[[clusters]]\nname = \"a\"\nembedded = true\nmaintenance_window = \"Sat 7\"\n";
    let errs = load_str(toml, "t").unwrap_err();
    assert_eq!(errs.errors[0].key, "clusters[0].maintenance_window");
    assert_eq!(errs.errors[0].line, Some(4));
}

#[test]
fn durations_crons_and_versions() {
    assert_eq!(
        HumanDuration::new("14d").get(),
        Duration::from_secs(14 * 86_400)
    );
    assert_eq!(
        HumanDuration::new("1h 30m").get(),
        Duration::from_secs(5400)
    );
    assert!(HumanDuration::new("30").error().unwrap().contains("\"30\""));
    for ok in [
        "0 2 * * *",
        "@daily",
        "0 3 L * *",
        "0 4 * * FRI#2",
        "*/15 * * * SUN",
    ] {
        assert!(CronSchedule::new(ok).parsed().is_some(), "{ok:?}");
    }
    assert!(
        CronSchedule::new("30 0 2 * * MON-FRI").parsed().is_some(),
        "6 fields: seconds"
    );
    assert!(
        CronSchedule::new("0 0 2 * * * 2030").error().is_some(),
        "years are not allowed"
    );
    assert!(CronSchedule::new("0 2 * *").error().is_some());
    assert!(CronSchedule::new("61 2 * * *").error().is_some());
    assert_eq!(
        Checked::<PgVersion>::new("15.20").get(),
        PgVersion {
            major: 15,
            minor: Some(20)
        }
    );
    assert_eq!(Checked::<PgVersion>::new("18").get().to_string(), "18");
    for bad in ["15.", "15.2.1", "v15.2", ".2", "", "x"] {
        assert!(Checked::<PgVersion>::new(bad).error().is_some(), "{bad:?}");
    }
    assert_eq!(
        Checked::<OnFailure>::new("rollback").get(),
        OnFailure::Rollback
    );
    assert!(Checked::<OnFailure>::new("Rollback").error().is_some());
}

#[test]
fn backup_schedule_overrides_pick_the_first_match() {
    let toml = "[[clusters]]\nname = \"a\"\nembedded = true\n[backups]\ndefault_schedule = \"0 2 * * *\"\n\
                [[backups.overrides]]\nselector = \"env=prod,region=eu\"\nschedule = \"0 3 * * *\"\n\
                [[backups.overrides]]\nselector = \"env=prod\"\nschedule = \"0 4 * * *\"\n";
    let b = load_str(&format!("{toml}[backups.retention]\ncount = 7\n"), "t")
        .unwrap()
        .backups;
    // A given retention table replaces the default: no age limit now.
    assert_eq!(
        (b.retention.count, b.retention.age.is_none()),
        (Some(7), true)
    );
    let sched = |pairs: &[(&str, &str)]| b.schedule_for(&labels(pairs)).raw().to_string();
    assert_eq!(sched(&[("env", "prod"), ("region", "eu")]), "0 3 * * *");
    assert_eq!(sched(&[("env", "prod"), ("region", "us")]), "0 4 * * *");
    assert_eq!(sched(&[("env", "staging")]), "0 2 * * *");
}

#[test]
fn line_index_handles_tables_arrays_and_strings() {
    let src = r#"
top = """
[not.a.header]
fake = 1
"""
[a]
"quoted.key" = 1
b.c = { d = 1, e = [1, 2] }
[[x.y]]
z = 1
[[x.y]]
[x.y.w]
v = 'lit'
list = [
  { k = 1 },  # comment ] }
  { k = 2 },
]
"#;
    let idx = LineIndex::build(src);
    let p = |segs: &[&str]| -> Vec<Seg> {
        segs.iter()
            .map(|s| s.parse::<usize>().map_or_else(|_| Seg::key(s), Seg::Index))
            .collect()
    };
    assert_eq!(idx.line_of(&p(&["top"])), Some(2));
    assert_eq!(idx.line_of(&p(&["not"])), None);
    assert_eq!(idx.line_of(&p(&["a", "quoted.key"])), Some(7));
    assert_eq!(idx.line_of(&p(&["a", "b", "c", "e", "1"])), Some(8));
    assert_eq!(idx.line_of(&p(&["a", "missing"])), Some(6));
    assert_eq!(idx.line_of(&p(&["x", "y", "0", "z"])), Some(10));
    assert_eq!(idx.line_of(&p(&["x", "y", "1"])), Some(11));
    assert_eq!(idx.line_of(&p(&["x", "y", "1", "w", "v"])), Some(13));
    assert_eq!(
        idx.line_of(&p(&["x", "y", "1", "w", "list", "1", "k"])),
        Some(16)
    );
}

#[test]
fn check_report_summarises_or_lists_problems() {
    let dir = std::env::temp_dir().join(format!("pgfleet-config-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let good = dir.join("good.toml");
    std::fs::write(&good, EMBEDDED_DEFAULTS).unwrap();
    let (text, code) = check_report_with_env(Some(&good), Vec::new(), |_, _, _| Ok(()));
    assert_eq!(code, 0, "{text}");
    assert!(
        text.contains(
            "3 member clusters (3 embedded, 0 kubeconfig): sim-eu-1, sim-us-1, sim-staging-1"
        ),
        "{text}"
    );
    assert!(
        text.contains("rollout minor-15-19: to 15.19 in 2 stage(s): canary → prod"),
        "{text}"
    );
    let bad = dir.join("bad.toml");
    std::fs::write(&bad, "[manager]\nlisten = 1\n").unwrap();
    let (text, code) = check_report_with_env(Some(&bad), Vec::new(), |_, _, _| Ok(()));
    assert_eq!(code, 2);
    assert!(
        text.contains(&format!("{}:2: manager.listen: ", bad.display())),
        "{text}"
    );
    assert!(text.contains("clusters: at least one"), "{text}");
    std::fs::remove_dir_all(&dir).unwrap();
}
