//! `pgfleet_replica_streaming{cluster,namespace,name,instance}`: 1 while a
//! replica's WAL receiver streams, 0 when the controller's last sample found
//! it not streaming (`controller::streaming`). Kept as one small map per
//! PostgresCluster and rendered at scrape time, like [`super::pgc`], so a
//! deleted PostgresCluster or a promoted replica leaves no stale series.

use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, MetricEncoder};
use prometheus_client::metrics::MetricType;
use std::collections::BTreeMap;
use std::sync::Mutex;

/// Member cluster, namespace, name.
type Key = (String, String, String);

pub const NAME: &str = "pgfleet_replica_streaming";

#[derive(Debug, Default)]
pub struct Store {
    records: Mutex<BTreeMap<Key, Vec<(String, bool)>>>,
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<Key, Vec<(String, bool)>>> {
        self.records.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Replaces what is known about one PostgresCluster's replicas (empty:
    /// forget it).
    pub fn set(&self, cluster: &str, namespace: &str, name: &str, replicas: &[(String, bool)]) {
        let key = (cluster.to_string(), namespace.to_string(), name.to_string());
        let mut r = self.lock();
        if replicas.is_empty() {
            r.remove(&key);
        } else {
            r.insert(key, replicas.to_vec());
        }
    }
}

impl Collector for Store {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let records = self.lock();
        let mut family: MetricEncoder = encoder.encode_descriptor(
            NAME,
            "1 while the replica's WAL receiver is streaming, 0 when the last sample found it not streaming",
            None,
            MetricType::Gauge,
        )?;
        for ((cluster, namespace, name), replicas) in records.iter() {
            for (instance, streaming) in replicas {
                let labels = [
                    ("cluster", cluster.as_str()),
                    ("namespace", namespace.as_str()),
                    ("name", name.as_str()),
                    ("instance", instance.as_str()),
                ];
                family
                    .encode_family(&labels)?
                    .encode_gauge(&i64::from(*streaming))?;
            }
        }
        Ok(())
    }
}

/// Records one sample of a PostgresCluster's replicas.
pub fn set(cluster: &str, namespace: &str, name: &str, replicas: &[(String, bool)]) {
    super::get()
        .replicas
        .set(cluster, namespace, name, replicas);
}
