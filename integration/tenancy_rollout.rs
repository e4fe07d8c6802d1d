//! Rollout controls have one trusted home (issue 19, finding 2): a control
//! ConfigMap forged on another member — approving every stage with the
//! highest revision there is — changes nothing and panics nothing; on the
//! home, approvals of stages the rollout does not have and acknowledgements
//! beyond the observed failures are not acted on. Outcomes are checked on
//! the PostgresClusters and the stored ConfigMaps; nothing is timed.
#![allow(clippy::unwrap_used)]

use crate::common::fleet;

use fleet::*;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::Api;
use kube::api::{Patch, PatchParams};
use pgfleet::ops::actions;
use pgfleet::platform::clock::ManualClock;
use pgfleet::rollout::engine::Engine;
use pgfleet::rollout::plan::RolloutState;
use pgfleet::rollout::{control, marks};
use serde_json::json;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

const MEMBERS: [&str; 2] = ["member-1", "member-2"];

const GATED: &str = r#"
[rollouts.r]
target_version = "15.20"
progress_deadline = "24h"
[[rollouts.r.stages]]
name = "canary"
clusters = "wave=0"
requires_approval = true
[[rollouts.r.stages]]
name = "rest"
clusters = "wave!=0"
requires_approval = true
"#;

/// Stores a control ConfigMap on `member` the way anyone with write access
/// to its `pgfleet-system` namespace could.
async fn forge(f: &TestFleet, member: &str, data: serde_json::Value) {
    let client = f.client(member);
    let pp = PatchParams::apply("forger").force();
    Api::<Namespace>::all(client.clone())
        .patch(
            control::NAMESPACE,
            &pp,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "Namespace",
                "metadata": {"name": control::NAMESPACE}})),
        )
        .await
        .unwrap();
    Api::<ConfigMap>::namespaced(client, control::NAMESPACE)
        .patch(
            &control::object_name("r"),
            &pp,
            &Patch::Apply(json!({"apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"name": control::object_name("r"), "namespace": control::NAMESPACE},
                "data": data})),
        )
        .await
        .unwrap();
}

async fn stored_data(
    f: &TestFleet,
    member: &str,
) -> Option<std::collections::BTreeMap<String, String>> {
    Api::<ConfigMap>::namespaced(f.client(member), control::NAMESPACE)
        .get_opt(&control::object_name("r"))
        .await
        .unwrap()
        .and_then(|cm| cm.data)
}

/// No PostgresCluster has been touched by the rollout.
async fn untouched(f: &TestFleet) {
    for m in MEMBERS {
        let pg = f.pgc(m, "db").get("pg0").await.unwrap();
        assert_eq!(pg.spec.version, "15.18", "{m}");
        let anns = pg.metadata.annotations.unwrap_or_default();
        assert!(!anns.contains_key(marks::ROLLOUT), "{m}: {anns:?}");
    }
}

async fn command(e: &Engine, f: &TestFleet, word: &str, stage: Option<&str>) -> anyhow::Result<()> {
    let obs = e.observe().await;
    actions::rollout_command(e, &f.mgr.fleet, &obs, word, stage, "test")
        .await
        .map(|_| ())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_forged_control_on_another_member_changes_nothing() {
    let f = TestFleet::start("tenancy-rollout", &MEMBERS).await;
    for m in MEMBERS {
        let spec = json!({"clusterSize": 1, "version": "15.18", "storage": {"size": "1Gi"}});
        f.create(m, "db", "pg0", spec).await;
    }
    for m in MEMBERS {
        f.wait_healthy(m, "db", "pg0", 1).await;
    }
    let toml = format!("{}\n{GATED}", settings_toml(&f.dir, &MEMBERS));
    let settings = pgfleet::config::load_str(&toml, "test").unwrap();
    let clock = Arc::new(ManualClock::new(SystemTime::now()));
    let mut e = Engine::new("r", &settings, f.mgr.fleet.clone(), clock).unwrap();
    e.tick = Duration::from_millis(100);
    assert_eq!(e.control_home().name, "member-1", "the lowest-named member");

    // The staging member (not the home) carries a forged control.
    let max = u64::MAX.to_string();
    forge(
        &f,
        "member-2",
        json!({"state": "active", "approved": "canary,rest", "acknowledged": "4294967295",
               "revision": max}),
    )
    .await;
    for _ in 0..3 {
        let d = e.round().await.unwrap();
        assert!(d.start.is_empty(), "started {:?}", d.start);
        assert!(
            matches!(&d.status.state, RolloutState::WaitingApproval { stage } if stage == "canary"),
            "{}",
            d.status
        );
    }
    let obs = e.observe().await;
    assert!(obs.stored.control.approved.is_empty(), "{:?}", obs.stored);
    assert_eq!(obs.stored.acknowledged, 0);
    untouched(&f).await;

    // A command next to the forged u64::MAX revision neither panics nor
    // wraps: it is stored on the home with its own revision.
    command(&e, &f, "pause", None).await.unwrap();
    let home = stored_data(&f, "member-1").await.unwrap();
    assert_eq!(home["state"], "paused");
    assert_eq!(home["revision"], "1");
    let forged = stored_data(&f, "member-2").await.unwrap();
    assert_eq!(
        forged["revision"], max,
        "the forged copy is neither read nor written"
    );
    command(&e, &f, "resume", None).await.unwrap();

    // On the home: approvals of stages the rollout lacks are refused when
    // asked for and ignored when stored; acknowledgements are clamped.
    let err = command(&e, &f, "approve", Some("bogus")).await.unwrap_err();
    assert!(err.to_string().contains("no stage \"bogus\""), "{err:#}");
    forge(
        &f,
        "member-1",
        json!({"state": "active", "approved": "bogus,Canary,canary ", "acknowledged": "4294967295",
               "revision": "7"}),
    )
    .await;
    let obs = e.observe().await;
    assert!(obs.stored.control.approved.is_empty(), "{:?}", obs.stored);
    assert_eq!(obs.stored.acknowledged, 0, "no failures observed");
    for _ in 0..3 {
        assert!(e.round().await.unwrap().start.is_empty());
    }
    untouched(&f).await;
    // A forged revision at the limit on the home is an error, not a panic.
    forge(
        &f,
        "member-1",
        json!({"state": "active", "approved": "", "revision": max}),
    )
    .await;
    let err = command(&e, &f, "pause", None).await.unwrap_err();
    assert!(err.to_string().contains("revision"), "{err:#}");
    forge(&f, "member-1", json!({"state": "active", "revision": "8"})).await;

    // The real approval, on the home, starts the canary (and only it).
    command(&e, &f, "approve", Some("canary")).await.unwrap();
    let d = e.round().await.unwrap();
    assert_eq!(d.start.len(), 1, "{:?}", d.start);
    assert_eq!(d.start[0].member, "member-1");
    let pg = f.pgc("member-2", "db").get("pg0").await.unwrap();
    assert_eq!(pg.spec.version, "15.18");
}
