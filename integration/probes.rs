//! The reachability probe asks a member only what its Lease traffic has
//! not already answered: while the elector's renewals on the control lane
//! succeed, no `/version` probe is sent and the member stays Ready.
//! (That an unreachable member is still noticed is what
//! `controller_fleet::an_unreachable_member_…` and `sim_network` show.)

use crate::common::{PATIENCE, eventually, temp_dir};
use pgfleet::fleet::ConnState;
use pgfleet::testkit::fleet as kit;

const M: &str = "probed";

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn answered_lease_renewals_make_probes_unneeded() {
    let dir = temp_dir("probes");
    // Renewals every 100 ms; the probe interval is 500 ms (embedded_toml).
    let toml = kit::embedded_toml(&dir, "virtual", &[M], "retry_period = \"100ms\"\n");
    let mgr = kit::start_manager(&toml, PATIENCE)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    let member = mgr.fleet.get(M).unwrap().clone();
    let requests = || {
        let r = &pgfleet::metrics::get().requests;
        (r.of(M, "update", "leases"), r.of(M, "get", "discovery"))
    };
    eventually("the member Ready and its Lease renewed", || {
        let (member, (renewals, _)) = (member.clone(), requests());
        async move {
            match member.state() {
                ConnState::Ready if renewals > 0 => Ok(()),
                s => Err(format!("{s:?}, {renewals} renewals")),
            }
        }
    })
    .await;
    let (renewals_before, probes_before) = requests();
    eventually("forty more renewals", || {
        let (renewals, _) = requests();
        async move {
            match renewals - renewals_before {
                n if n >= 40 => Ok(()),
                n => Err(format!("{n} renewals")),
            }
        }
    })
    .await;
    let (renewals, probes) = requests();
    let (renewals, probes) = (renewals - renewals_before, probes - probes_before);
    // A probe every 500 ms would be one per five renewals; a renewal that
    // came late may let one through.
    assert!(
        probes * 10 <= renewals,
        "{probes} probes during {renewals} renewals"
    );
    assert_eq!(member.state(), ConnState::Ready);
    drop(mgr);
    let _ = std::fs::remove_dir_all(&dir);
}
