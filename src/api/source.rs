//! Where the API reads each member's PostgresClusters from: the cache of
//! this replica's controller for that member when it has one, else (an HA
//! replica that does not own the member) one LIST, reused for a few seconds
//! so polling dashboards do not multiply it, and one at a time per member
//! (single flight, `flight.rs`) so concurrent callers do not either. Any replica behind a Service
//! thus answers for the whole fleet.

use super::ApiState;
use crate::crd::PostgresCluster;
use crate::fleet::{ConnState, Member};
use crate::ops::view::{PgcView, Source};
use kube::Api;
use kube::api::ListParams;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// How long a listed member's PostgresClusters are reused.
const LIST_TTL: Duration = Duration::from_secs(5);
/// A LIST slower than this is given up (the member counts as unknown).
const LIST_TIMEOUT: Duration = Duration::from_secs(5);

/// Recent LISTs by member.
#[derive(Default)]
pub struct ListCache(Mutex<BTreeMap<String, (Instant, Vec<PgcView>)>>);

impl ListCache {
    fn fresh(&self, member: &str, ttl: Duration) -> Option<Vec<PgcView>> {
        let map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.get(member)
            .filter(|(at, _)| at.elapsed() < ttl)
            .map(|(_, v)| v.clone())
    }
    fn put(&self, member: &str, v: Vec<PgcView>) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.insert(member.to_string(), (Instant::now(), v));
    }
}

async fn list(state: &ApiState, m: &Member) -> (Vec<PgcView>, Source) {
    if let Some(v) = state.lists.fresh(&m.name, LIST_TTL) {
        return (v, Source::List);
    }
    // Single flight: concurrent callers wait for one LIST and share it.
    let _flight = state.flights.enter(&format!("list/{}", m.name)).await;
    if let Some(v) = state.lists.fresh(&m.name, LIST_TTL) {
        return (v, Source::List);
    }
    let stale = || state.lists.fresh(&m.name, Duration::MAX);
    if matches!(m.state(), ConnState::Unreachable { .. }) {
        return stale().map_or((vec![], Source::Unknown), |v| (v, Source::List));
    }
    let api: Api<PostgresCluster> = Api::all(m.client());
    match tokio::time::timeout(LIST_TIMEOUT, api.list(&ListParams::default())).await {
        Ok(Ok(l)) => {
            let v: Vec<PgcView> = l.items.iter().map(|pg| PgcView::of(&m.name, pg)).collect();
            state.lists.put(&m.name, v.clone());
            (v, Source::List)
        }
        Ok(Err(e)) => {
            tracing::debug!(cluster = %m.name, error = %e, "listing PostgresClusters for the API");
            stale().map_or((vec![], Source::Unknown), |v| (v, Source::List))
        }
        Err(_) => stale().map_or((vec![], Source::Unknown), |v| (v, Source::List)),
    }
}

/// Every member's PostgresClusters (sorted by member, namespace, name) and
/// where each member's came from.
pub async fn pgcs(state: &ApiState) -> (Vec<PgcView>, BTreeMap<String, Source>) {
    let handles = (state.hooks.controllers)();
    let mut out = vec![];
    let mut sources = BTreeMap::new();
    for m in &state.fleet.members {
        let (views, source) = match handles.iter().find(|h| h.member.name == m.name) {
            Some(h) => (
                h.store
                    .state()
                    .iter()
                    // Parsed for the view (`controller::cached`); a copy
                    // that cannot be is left out (its rounds say why).
                    .filter_map(|pg| pg.typed().ok())
                    .map(|pg| PgcView::of(&m.name, &pg))
                    .collect(),
                Source::Cache,
            ),
            None => list(state, m).await,
        };
        out.extend(views);
        sources.insert(m.name.clone(), source);
    }
    out.sort_by(|a, b| (&a.member, &a.namespace, &a.name).cmp(&(&b.member, &b.namespace, &b.name)));
    (out, sources)
}
