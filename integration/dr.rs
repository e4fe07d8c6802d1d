//! Cross-cluster disaster recovery (issue 15), process runtime, real
//! PostgreSQL: a `[dr.orders]` topology over two member clusters. The
//! tenant creates `orders` on `dr-a`; pgfleet creates its replica cluster
//! on `dr-b`, which streams from `dr-a`'s `orders-dr` LoadBalancer
//! address. A planned switchover moves the primary side to `dr-b` and back:
//! every acknowledged row is on the new primary side, the old one follows
//! it again without a new copy, and writes made on each side reach the
//! other.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use crate::common;
use common::process::{Writer, connect};
use k8s_openapi::api::core::v1::{Secret, Service};
use kube::Api;
use pgfleet::crd::PostgresCluster;
use pgfleet::testkit::fleet as kit;
use std::collections::BTreeSet;
use std::time::Duration;

pub(crate) const NS: &str = "app";
const MEMBERS: [&str; 2] = ["dr-a", "dr-b"];
const LIMIT: Duration = Duration::from_secs(240);

const TOPOLOGY: &str = r#"
[dr.orders]
namespace = "app"
name = "orders"
members = ["dr-a", "dr-b"]
"#;

pub(crate) struct World {
    pub mgr: pgfleet::manager::Manager,
    dir: std::path::PathBuf,
}

impl World {
    async fn start(tag: &str) -> World {
        Self::start_with(tag, TOPOLOGY).await
    }

    /// Two process-runtime members with `topology` (a `[dr.orders]` table).
    pub(crate) async fn start_with(tag: &str, topology: &str) -> World {
        common::init_tracing();
        let dir = common::temp_dir(tag);
        let toml = format!(
            "{}{topology}",
            kit::embedded_toml(&dir, "process", &MEMBERS, "")
        );
        let mgr = kit::start_manager(&toml, Duration::from_secs(120))
            .await
            .unwrap_or_else(|e| panic!("{e}"));
        World { mgr, dir }
    }

    pub(crate) fn client(&self, m: &str) -> kube::Client {
        self.mgr.fleet.get(m).unwrap().client()
    }

    pub(crate) fn engine(&self) -> &pgfleet::dr::Engine {
        &self.mgr.dr[0]
    }

    pub(crate) async fn ip(&self, m: &str, svc: &str) -> String {
        let s = Api::<Service>::namespaced(self.client(m), NS)
            .get(svc)
            .await
            .unwrap();
        s.spec.unwrap().cluster_ip.unwrap()
    }

    pub(crate) async fn password(&self, m: &str) -> String {
        let s = Api::<Secret>::namespaced(self.client(m), NS)
            .get("orders-superuser")
            .await
            .unwrap();
        String::from_utf8(s.data.unwrap()["password"].0.clone()).unwrap()
    }

    /// The rows `marks` holds on member `m`, read through its `-rw`
    /// (a replica side's designated primary answers reads too).
    pub(crate) async fn rows(&self, m: &str) -> Result<BTreeSet<i64>, String> {
        self.rows_via(m, "orders-rw").await
    }

    /// The rows `marks` holds behind Service `svc` of member `m`.
    pub(crate) async fn rows_via(&self, m: &str, svc: &str) -> Result<BTreeSet<i64>, String> {
        let (rw, pw) = (self.ip(m, svc).await, self.password(m).await);
        let c = connect(&rw, 5432, &pw).await.map_err(|e| e.to_string())?;
        let rows = c
            .query("SELECT id FROM marks", &[])
            .await
            .map_err(|e| e.to_string())?;
        Ok(rows.iter().map(|r| r.get::<_, i64>(0)).collect())
    }

    /// Whether `m`'s `-rw` commits a write (within 5 s: a synchronous
    /// primary whose standby is gone would wait).
    pub(crate) async fn writable(&self, m: &str) -> Result<(), String> {
        let (rw, pw) = (self.ip(m, "orders-rw").await, self.password(m).await);
        let c = connect(&rw, 5432, &pw).await.map_err(|e| e.to_string())?;
        let w = c.batch_execute(
            "CREATE TABLE IF NOT EXISTS dr_probe (at timestamptz); INSERT INTO dr_probe VALUES (now())",
        );
        match tokio::time::timeout(Duration::from_secs(5), w).await {
            Ok(Ok(())) => Ok(()),
            Ok(Err(e)) => Err(format!("{m}: {e}")),
            Err(_) => Err(format!("{m}: the commit did not return in 5 s")),
        }
    }

    pub(crate) async fn healthy(&self, m: &str) -> Result<String, String> {
        let pg = Api::<PostgresCluster>::namespaced(self.client(m), NS)
            .get_opt("orders")
            .await
            .map_err(|e| e.to_string())?
            .ok_or("no PostgresCluster yet")?;
        let st = pg.status.unwrap_or_default();
        match (st.phase, st.ready_instances, st.current_primary) {
            (Some(pgfleet::crd::Phase::Healthy), 2, Some(p)) => Ok(p),
            other => Err(format!("{other:?}; DR {:?}", self.engine().status())),
        }
    }

    /// The log of `pod` on member `m` (with `previous`, of its container's
    /// previous instance); the error as text when there is none.
    pub(crate) async fn logs_of(&self, m: &str, pod: &str, previous: bool) -> String {
        let lp = kube::api::LogParams {
            previous,
            ..kube::api::LogParams::default()
        };
        Api::<k8s_openapi::api::core::v1::Pod>::namespaced(self.client(m), NS)
            .logs(pod, &lp)
            .await
            .unwrap_or_else(|e| format!("(no log: {e})"))
    }

    pub(crate) async fn logs(&self, m: &str, pod: &str) -> String {
        self.logs_of(m, pod, false).await
    }

    /// The tenant's `orders` on dr-a (2 instances, PostgreSQL 15, the
    /// superuser reachable for the test's clients, optionally a pooler);
    /// waits until both sides are Healthy and creates the table `marks`.
    /// Returns the two primaries.
    pub(crate) async fn setup(&self, pooler: bool) -> (String, String) {
        let w = self;
        kit::apply_namespace(&w.client("dr-a"), NS).await.unwrap();
        let mut spec =
            serde_json::json!({"clusterSize": 2, "version": "15", "enableSuperuserAccess": true});
        if pooler {
            spec["pooler"] = serde_json::json!({"enabled": true, "instances": 1});
        }
        let pgc: PostgresCluster = serde_json::from_value(serde_json::json!({
            "apiVersion": "pgfleet.io/v1", "kind": "PostgresCluster",
            "metadata": {"name": "orders", "namespace": NS},
            "spec": spec,
        }))
        .unwrap();
        Api::<PostgresCluster>::namespaced(w.client("dr-a"), NS)
            .create(&Default::default(), &pgc)
            .await
            .unwrap();
        let a_primary = until("orders Healthy on dr-a", || w.healthy("dr-a")).await;
        // pgfleet made the replica cluster on dr-b, with dr-a's credentials.
        let b_primary = until("the replica cluster Healthy on dr-b", || w.healthy("dr-b")).await;
        assert_eq!(w.password("dr-a").await, w.password("dr-b").await);
        until("the table on dr-a", || async {
            let (rw, pw) = (w.ip("dr-a", "orders-rw").await, w.password("dr-a").await);
            let c = connect(&rw, 5432, &pw).await.map_err(|e| e.to_string())?;
            c.batch_execute("CREATE TABLE IF NOT EXISTS marks (id bigint PRIMARY KEY)")
                .await
                .map_err(|e| e.to_string())
        })
        .await;
        (a_primary, b_primary)
    }

    /// Writes `n` rows through `m`'s `-rw` and returns the acknowledged ones.
    pub(crate) async fn write(&self, m: &str, n: usize) -> BTreeSet<i64> {
        let (rw, pw) = (self.ip(m, "orders-rw").await, self.password(m).await);
        let w = Writer::start(rw, 5432, pw);
        common::eventually_within(LIMIT, &format!("{n} rows written on {m}"), || async {
            (w.acked_count() >= n).then_some(()).ok_or(w.acked_count())
        })
        .await;
        w.stop().await.0
    }
}

impl Drop for World {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

pub(crate) async fn until<T, F, Fut>(what: &str, f: F) -> T
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<T, String>>,
{
    common::eventually_within(LIMIT, what, f).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_replica_cluster_streams_and_a_planned_switchover_goes_there_and_back() {
    common::spans::capture();
    let w = World::start("dr-switchover").await;
    let (a_primary, b_primary) = w.setup(false).await;
    let acked = w.write("dr-a", 50).await;
    until("dr-b holds every row acknowledged on dr-a", || async {
        let got = w.rows("dr-b").await?;
        acked
            .is_subset(&got)
            .then_some(())
            .ok_or(format!("{} of {}", got.len(), acked.len()))
    })
    .await;
    assert!(
        w.writable("dr-b").await.is_err(),
        "a replica cluster took writes"
    );

    // Planned switchover to dr-b.
    let next = w.engine().switchover("dr-b").await.unwrap();
    assert_eq!(next.primary, "dr-b");
    until("dr-b takes writes", || w.writable("dr-b")).await;
    let got = w.rows("dr-b").await.unwrap();
    assert!(acked.is_subset(&got), "rows lost in the switchover");
    let on_b = w.write("dr-b", 30).await;
    until("dr-a follows dr-b", || async {
        let got = w.rows("dr-a").await?;
        on_b.is_subset(&got)
            .then_some(())
            .ok_or(format!("{} rows", got.len()))
    })
    .await;
    assert!(w.writable("dr-a").await.is_err(), "two primary sides");
    let logs = w.logs("dr-a", &a_primary).await;
    assert!(
        !logs.contains("re-cloning") && logs.matches("cloning from").count() == 0,
        "dr-a's primary was copied again:\n{logs}"
    );

    // And back.
    w.engine().switchover("dr-a").await.unwrap();
    until("dr-a takes writes again", || w.writable("dr-a")).await;
    let got = w.rows("dr-a").await.unwrap();
    assert!(on_b.is_subset(&got) && acked.is_subset(&got), "rows lost");
    let on_a = w.write("dr-a", 20).await;
    until("dr-b follows dr-a again", || async {
        let got = w.rows("dr-b").await?;
        on_a.is_subset(&got)
            .then_some(())
            .ok_or(format!("{} rows", got.len()))
    })
    .await;
    let logs = w.logs("dr-b", &b_primary).await;
    assert!(
        !logs.contains("re-cloning"),
        "dr-b's designated primary was copied again:\n{logs}"
    );
    assert!(w.writable("dr-b").await.is_err(), "two primary sides");

    // One trace per switchover, holding its steps on both member clusters.
    let spans = common::spans::recorded();
    let ops: Vec<_> = spans.iter().filter(|s| s.name == "dr.switchover").collect();
    assert_eq!(ops.len(), 2, "{ops:?}");
    for op in ops {
        assert_eq!(op.parent, None, "not a trace of its own: {op:?}");
        let on: BTreeSet<&str> = spans
            .iter()
            .filter(|s| s.name == "dr.step" && s.parent == Some(op.id))
            .filter_map(|s| s.fields.get("cluster").map(String::as_str))
            .collect();
        assert_eq!(on, BTreeSet::from(["dr-a", "dr-b"]), "steps of {op:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_planned_switchover_through_the_pooler_fails_no_transaction() {
    let w = World::start("dr-pooled").await;
    w.setup(true).await;
    let secrets = Api::<Secret>::namespaced(w.client("dr-a"), NS);
    let app_pw = until("the app Secret on dr-a", || async {
        let s = secrets
            .get_opt("orders-app")
            .await
            .map_err(|e| e.to_string())?;
        s.and_then(|s| s.data)
            .and_then(|d| String::from_utf8(d.get("password")?.0.clone()).ok())
            .ok_or("not yet".to_string())
    })
    .await;
    until("marks granted to app", || async {
        let (rw, pw) = (w.ip("dr-a", "orders-rw").await, w.password("dr-a").await);
        let c = connect(&rw, 5432, &pw).await.map_err(|e| e.to_string())?;
        c.batch_execute("GRANT ALL ON marks TO app")
            .await
            .map_err(|e| e.to_string())
    })
    .await;
    let pooler = w.ip("dr-a", "orders-pooler").await;
    until("the pooler logs app in", || async {
        pgfleet::testkit::pg::connect_as(&pooler, 6432, "app", &app_pw, Duration::from_secs(2))
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    })
    .await;
    let writer = Writer::start_as(pooler, 6432, "app", app_pw);
    let more = |n: usize| {
        let target = writer.acked_count() + n;
        let writer = &writer;
        async move {
            until("commits through dr-a's pooler", || async {
                (writer.acked_count() >= target)
                    .then_some(())
                    .ok_or(format!("{} acknowledged", writer.acked_count()))
            })
            .await
        }
    };
    more(50).await;
    w.engine().switchover("dr-b").await.unwrap();
    until("dr-b takes writes", || w.writable("dr-b")).await;
    more(50).await;
    // The switchover back needs dr-a's designated primary streaming from
    // dr-b (the engine refuses otherwise, rightly): wait until it holds
    // what went through the pooler so far, as an operator would check.
    let so_far = writer.acked();
    until("dr-a follows dr-b", || async {
        let got = w.rows("dr-a").await?;
        so_far.is_subset(&got).then_some(()).ok_or(format!(
            "{} of {} rows",
            got.len(),
            so_far.len()
        ))
    })
    .await;
    w.engine().switchover("dr-a").await.unwrap();
    until("dr-a takes writes again", || w.writable("dr-a")).await;
    more(50).await;
    let (acked, failed) = writer.stop().await;
    assert_eq!(failed, 0, "transactions failed through the pooler");
    let rows = w.rows("dr-a").await.unwrap();
    assert!(acked.is_subset(&rows), "acknowledged rows lost");
}
