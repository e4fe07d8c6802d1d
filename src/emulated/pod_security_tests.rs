//! pgfleet's own pods pass the emulator's `restricted` Pod Security level
//! (moved here from the emulator's tests: the emulator knows no pgfleet types).
#![allow(clippy::unwrap_used)]

use pgfleet_sim::pod_security::{Level, admit};
use serde_json::json;

#[test]
fn pgfleets_own_pods_pass_restricted() {
    use crate::controller::build::{Owner, pod};
    use crate::crd::PostgresCluster;
    let mut pg = PostgresCluster::new(
        "orders",
        serde_json::from_value(json!({"clusterSize": 2, "version": "15.20",
            "pooler": {"enabled": true}}))
        .unwrap(),
    );
    pg.metadata.namespace = Some("shop".into());
    pg.metadata.uid = Some("u-1".into());
    let o = Owner::of(&pg, 1);
    let instance = pod(&o, &pg, 1, "primary", "initdb", &[]);
    assert_eq!(admit(Level::Restricted, "orders-1", &instance), Ok(()));
    assert_eq!(instance["spec"]["automountServiceAccountToken"], false);
    let pooler = crate::controller::pooler::pod(&o, 1);
    assert_eq!(admit(Level::Restricted, "orders-pooler-1", &pooler), Ok(()));
    assert_eq!(pooler["spec"]["automountServiceAccountToken"], false);
}
