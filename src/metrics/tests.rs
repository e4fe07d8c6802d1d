use super::pgc::Obs;
use super::*;
use crate::crd::PostgresClusterStatus;

fn sample<'a>(page: &'a str, prefix: &str) -> Option<&'a str> {
    page.lines()
        .find(|l| l.starts_with(prefix))
        .and_then(|l| l.rsplit(' ').next())
}

#[test]
fn reconcile_series_count_errors_and_drain_the_queue() {
    let t = reconcile::start("enc-a");
    let page = encode();
    assert_eq!(
        sample(&page, "pgfleet_reconcile_queue_depth{cluster=\"enc-a\"}"),
        Some("1")
    );
    t.finish(Some("conflict"));
    reconcile::start("enc-a").finish(None);
    drop(reconcile::start("enc-a")); // cancelled: leaves the queue, not timed
    let page = encode();
    assert_eq!(
        sample(
            &page,
            "pgfleet_reconcile_errors_total{cluster=\"enc-a\",category=\"conflict\"}"
        ),
        Some("1")
    );
    assert_eq!(
        sample(
            &page,
            "pgfleet_reconcile_duration_seconds_count{cluster=\"enc-a\"}"
        ),
        Some("2")
    );
    assert_eq!(
        sample(&page, "pgfleet_reconcile_queue_depth{cluster=\"enc-a\"}"),
        Some("0")
    );
    assert!(page.contains("# TYPE pgfleet_reconcile_duration_seconds histogram"));
    assert!(page.trim_end().ends_with("# EOF"));
}

#[test]
fn connectivity_has_one_current_state() {
    cluster_state("enc-b", "Ready");
    cluster_state("enc-b", "Unreachable");
    let page = encode();
    assert_eq!(
        sample(&page, "pgfleet_cluster_up{cluster=\"enc-b\"}"),
        Some("0")
    );
    assert_eq!(
        sample(
            &page,
            "pgfleet_cluster_state{cluster=\"enc-b\",state=\"Unreachable\"}"
        ),
        Some("1")
    );
    assert_eq!(
        sample(
            &page,
            "pgfleet_cluster_state{cluster=\"enc-b\",state=\"Ready\"}"
        ),
        Some("0")
    );
    // The reason (free text from the API error) is never a label.
    assert!(!page.contains("timeout"));
}

#[test]
fn status_is_read_into_timestamps() {
    let st: PostgresClusterStatus = serde_json::from_value(serde_json::json!({
        "backup": {"lastSuccessAt": "2026-01-02T03:04:05Z", "lastFailureAt": "2026-01-01T00:00:00Z"},
        "archive": {"lastArchivedAt": "2026-01-02T03:05:05Z", "failing": true, "checkedAt": "2026-01-02T03:06:00Z"},
        "lastRestoreDrill": {"at": "2026-01-02T00:00:00Z", "passed": false},
    }))
    .expect("a status");
    let o = Obs::from_status(&st);
    assert_eq!(o.backup_success, Some(1_767_323_045));
    assert_eq!(o.wal_archived, Some(1_767_323_105));
    assert_eq!(o.archive_failing, Some(true));
    assert_eq!(o.drill_passed, Some(false));
    assert_eq!(
        Obs::from_status(&PostgresClusterStatus::default()),
        Obs::default()
    );
}

#[test]
fn per_postgrescluster_series_render_ages_and_go_away_with_it() {
    let now = chrono::Utc::now().timestamp();
    get().pgcs.set(
        "enc-c",
        "db",
        "orders",
        Obs {
            backup_success: Some(now - 120),
            wal_archived: Some(now - 30),
            archive_failing: Some(false),
            drill_passed: Some(true),
            ..Obs::default()
        },
    );
    let labels = "{cluster=\"enc-c\",namespace=\"db\",name=\"orders\"}";
    let page = encode();
    let age: f64 = sample(&page, &format!("pgfleet_backup_age_seconds{labels}"))
        .and_then(|v| v.parse().ok())
        .expect("a backup age");
    assert!(age >= 120.0, "{age}");
    let rpo: f64 = sample(&page, &format!("pgfleet_archive_wal_age_seconds{labels}"))
        .and_then(|v| v.parse().ok())
        .expect("a WAL age");
    assert!(rpo >= 30.0, "{rpo}");
    assert!(sample(&page, &format!("pgfleet_restore_drill_last_result{labels}")).is_some());
    // Never failed: no failure sample at all.
    assert!(
        sample(
            &page,
            &format!("pgfleet_backup_last_failure_timestamp_seconds{labels}")
        )
        .is_none()
    );
    forget_postgrescluster("enc-c", "db", "orders");
    assert!(!encode().contains("cluster=\"enc-c\""));
}

/// Fills every metric with a sample for the dashboard test.
fn populate(cluster: &str) {
    cluster_state(cluster, "Ready");
    reconcile::start(cluster).finish(Some("unreachable"));
    ops::failover_completed(cluster, Some(4200));
    ops::switchover_completed(cluster, Some("2026-01-01T00:00:00Z"));
    let now = chrono::Utc::now().timestamp();
    get().pgcs.set(
        cluster,
        "db",
        "pg",
        Obs {
            backup_success: Some(now - 60),
            backup_failure: Some(now - 600),
            wal_archived: Some(now - 5),
            archive_failing: Some(false),
            drill_at: Some(now - 3600),
            drill_passed: Some(true),
        },
    );
    rollout_state("dash", &["running"], "running");
    rollout_stage("dash", "canary", &[("total", 4), ("done", 1)]);
}

static METRIC: std::sync::LazyLock<regex::Regex> =
    std::sync::LazyLock::new(|| regex::Regex::new(r"pgfleet_[a-z_]+").expect("a regex"));

/// Metric names in PromQL expressions (`pgfleet_…`).
fn queried_names(dashboard: &serde_json::Value, out: &mut Vec<String>) {
    match dashboard {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                if k == "expr"
                    && let Some(expr) = v.as_str()
                {
                    out.extend(METRIC.find_iter(expr).map(|m| m.as_str().to_string()));
                }
                queried_names(v, out);
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| queried_names(v, out)),
        _ => {}
    }
}

#[test]
fn every_metric_the_dashboard_queries_is_exported() {
    populate("dash-a");
    let page = encode();
    let dashboard: serde_json::Value =
        serde_json::from_str(include_str!("../../deploy/grafana/pgfleet-dashboard.json"))
            .expect("the dashboard is JSON");
    let mut names = vec![];
    queried_names(&dashboard, &mut names);
    assert!(
        names.len() >= 10,
        "the dashboard queries pgfleet metrics: {names:?}"
    );
    for name in names {
        assert!(
            page.lines()
                .any(|l| l.starts_with(&format!("{name}{{")) || l.starts_with(&format!("{name} "))),
            "the dashboard queries {name}, which /metrics does not export"
        );
    }
}
