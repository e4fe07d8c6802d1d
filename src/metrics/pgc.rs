//! Per-PostgresCluster series: backup freshness, the live RPO (age of the
//! newest archived WAL) and the last restore drill.
//!
//! A fleet may hold 10,000 PostgresClusters. Each is one small record here
//! (three label strings and a few timestamps), rendered into all of its
//! series at scrape time, so ages are exact when Prometheus reads them and
//! a deleted PostgresCluster disappears from every series with one removal
//! ([`forget_postgrescluster`], called by the controller's finalizer).

use crate::crd::{PostgresCluster, PostgresClusterStatus};
use kube::ResourceExt;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Member cluster, namespace, name.
type Key = (String, String, String);

/// What the metrics need from one PostgresCluster's status (Unix seconds).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Obs {
    pub backup_success: Option<i64>,
    pub backup_failure: Option<i64>,
    pub wal_archived: Option<i64>,
    pub archive_failing: Option<bool>,
    pub drill_at: Option<i64>,
    pub drill_passed: Option<bool>,
}

fn unix(ts: Option<&String>) -> Option<i64> {
    ts.and_then(|t| chrono::DateTime::parse_from_rfc3339(t).ok())
        .map(|t| t.timestamp())
}

impl Obs {
    /// Reads the status the backup dispatcher and drills write.
    pub fn from_status(st: &PostgresClusterStatus) -> Obs {
        let backup = st.backup.as_ref();
        let archive = st.archive.as_ref();
        let drill = st.last_restore_drill.as_ref();
        Obs {
            backup_success: unix(backup.and_then(|b| b.last_success_at.as_ref())),
            backup_failure: unix(backup.and_then(|b| b.last_failure_at.as_ref())),
            wal_archived: unix(archive.and_then(|a| a.last_archived_at.as_ref())),
            archive_failing: archive
                .filter(|a| a.checked_at.is_some() || a.last_archived_at.is_some())
                .map(|a| a.failing),
            drill_at: unix(drill.and_then(|d| d.at.as_ref())),
            drill_passed: drill.and_then(|d| d.passed),
        }
    }

    fn is_empty(&self) -> bool {
        *self == Obs::default()
    }
}

/// The records, as a prometheus-client collector.
#[derive(Debug, Default)]
pub struct Store {
    records: Mutex<BTreeMap<Key, Obs>>,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Obs>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn set(&self, cluster: &str, namespace: &str, name: &str, obs: Obs) {
        let key = (cluster.to_string(), namespace.to_string(), name.to_string());
        let mut r = self.lock();
        if obs.is_empty() {
            r.remove(&key);
        } else {
            r.insert(key, obs);
        }
    }

    pub fn remove(&self, cluster: &str, namespace: &str, name: &str) {
        self.lock()
            .remove(&(cluster.to_string(), namespace.to_string(), name.to_string()));
    }

    pub fn len(&self) -> usize {
        self.lock().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One rendered family: name, help, and how to get a value from a record.
struct Series {
    name: &'static str,
    help: &'static str,
    value: fn(&Obs, i64) -> Option<f64>,
}

fn age(ts: Option<i64>, now: i64) -> Option<f64> {
    ts.map(|t| (now - t).max(0) as f64)
}

const SERIES: &[Series] = &[
    Series {
        name: "pgfleet_backup_last_success_timestamp_seconds",
        help: "When the newest successful backup finished (Unix time)",
        value: |o, _| o.backup_success.map(|t| t as f64),
    },
    Series {
        name: "pgfleet_backup_age_seconds",
        help: "Seconds since the newest successful backup finished",
        value: |o, now| age(o.backup_success, now),
    },
    Series {
        name: "pgfleet_backup_last_failure_timestamp_seconds",
        help: "When the newest failed backup attempt ended (Unix time)",
        value: |o, _| o.backup_failure.map(|t| t as f64),
    },
    Series {
        name: "pgfleet_archive_wal_age_seconds",
        help: "Seconds since the newest WAL segment was archived: the live RPO",
        value: |o, now| age(o.wal_archived, now),
    },
    Series {
        name: "pgfleet_archive_failing",
        help: "1 while the newest WAL archive attempt failed",
        value: |o, _| o.archive_failing.map(|f| f64::from(u8::from(f))),
    },
    Series {
        name: "pgfleet_restore_drill_last_result",
        help: "1 if the last restore drill passed, 0 if it failed",
        value: |o, _| o.drill_passed.map(|p| f64::from(u8::from(p))),
    },
    Series {
        name: "pgfleet_restore_drill_last_timestamp_seconds",
        help: "When the last restore drill finished (Unix time)",
        value: |o, _| o.drill_at.map(|t| t as f64),
    },
];

/// Every per-PostgresCluster metric name (docs and dashboard tests).
pub fn names() -> impl Iterator<Item = &'static str> {
    SERIES.iter().map(|s| s.name)
}

impl Collector for Store {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let now = chrono::Utc::now().timestamp();
        let records = self.lock();
        for s in SERIES {
            let mut family: MetricEncoder =
                encoder.encode_descriptor(s.name, s.help, None, MetricType::Gauge)?;
            for ((cluster, namespace, name), obs) in records.iter() {
                let Some(v) = (s.value)(obs, now) else {
                    continue;
                };
                let labels = [
                    ("cluster", cluster.as_str()),
                    ("namespace", namespace.as_str()),
                    ("name", name.as_str()),
                ];
                family.encode_family(&labels)?.encode_gauge(&v)?;
            }
        }
        Ok(())
    }
}

/// Records what one backup-dispatcher round saw (`(member, cluster)` pairs).
pub fn observe<'a>(seen: impl IntoIterator<Item = (&'a str, &'a PostgresCluster)>) {
    let store = &super::get().pgcs;
    for (member, pg) in seen {
        let obs = pg.status.as_ref().map(Obs::from_status).unwrap_or_default();
        store.set(
            member,
            &pg.namespace().unwrap_or_default(),
            &pg.name_any(),
            obs,
        );
    }
}

/// Drops every series of a deleted PostgresCluster.
pub fn forget_postgrescluster(cluster: &str, namespace: &str, name: &str) {
    super::get().pgcs.remove(cluster, namespace, name);
    super::get().replicas.set(cluster, namespace, name, &[]);
}
