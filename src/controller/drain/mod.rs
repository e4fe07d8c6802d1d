//! Draining the primary's node: the manager watches which Nodes are
//! cordoned (`spec.unschedulable`) and, when one holds a primary, moves the
//! primary by a planned switchover (`switchover`, zero failed transactions
//! through the pooler) to a ready replica on a schedulable node. The
//! primary's own disruption budget (`build::pdbs`) refuses its eviction in
//! the meantime, so `kubectl drain` retries until the Pod is a replica.
//! This is CloudNativePG's mechanism; it needs `list`/`watch` on Nodes.
//!
//! `decide` holds the pure choice; here are the watch and the I/O.

pub mod decide;

use crate::controller::build::Owner;
use crate::controller::plan::Observed;
use crate::controller::reconcile::{Error, event};
use crate::controller::{Ctx, index, switchover};
use crate::crd::PostgresCluster;
use decide::Drain;
use futures::StreamExt;
use k8s_openapi::api::core::v1::Node;
use kube::ResourceExt;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher::{self, Event};
use std::collections::{BTreeSet, HashSet};
use std::sync::RwLock;
use std::time::Duration;

/// How soon a cluster whose drain is stuck looks again (a replica may turn
/// ready without any change that triggers a reconcile of the cluster).
const STUCK_RETRY: Duration = Duration::from_secs(10);

/// The cordoned Nodes of one member cluster, and the clusters already told
/// that their drain is stuck (one Event per episode, not per round).
#[derive(Default)]
pub struct Cordoned {
    nodes: RwLock<BTreeSet<String>>,
    warned: RwLock<HashSet<(String, String)>>,
}

impl Cordoned {
    pub fn nodes(&self) -> BTreeSet<String> {
        self.nodes.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Records `node`'s state; true when it changed.
    fn set(&self, node: &str, cordoned: bool) -> bool {
        let mut nodes = self.nodes.write().unwrap_or_else(|e| e.into_inner());
        match cordoned {
            true => nodes.insert(node.to_string()),
            false => nodes.remove(node),
        }
    }

    /// Whether this is the first stuck round of the episode (then it is
    /// remembered); `stuck: false` ends the episode.
    fn first_warning(&self, key: (String, String), stuck: bool) -> bool {
        let mut warned = self.warned.write().unwrap_or_else(|e| e.into_inner());
        match stuck {
            true => warned.insert(key),
            false => {
                warned.remove(&key);
                false
            }
        }
    }
}

/// What the primary step should do after looking at the nodes.
pub enum Step {
    Nothing,
    /// A switchover was started: end the round with this action.
    Started(Action),
    /// Go on, but look again within this long.
    LookAgain(Duration),
}

/// Moves the primary `current` off a cordoned node, if it is on one.
pub async fn check(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    current: &str,
) -> Result<Step, Error> {
    let key = (owner.namespace.clone(), owner.name.clone());
    let (node, why) = match decide::decide(current, obs, &ctx.cordoned.nodes()) {
        Drain::Stay => {
            ctx.cordoned.first_warning(key, false);
            return Ok(Step::Nothing);
        }
        Drain::Stuck { node, reason } => (node, reason),
        Drain::SwitchOver { node, candidates } => {
            let cands = switchover::execute::candidates(ctx, owner, obs, &candidates).await;
            if let Some(target) = switchover::decide::target(current, &cands) {
                ctx.cordoned.first_warning(key, false);
                let why = format!("node {node} is cordoned");
                let action =
                    switchover::begin(pg, ctx, current, &target, serde_json::json!({}), &why)
                        .await?;
                return Ok(Step::Started(action));
            }
            let why = format!(
                "node {node} of primary {current} is cordoned and no replica on a schedulable \
                 node reports itself ready to take over"
            );
            (node, why)
        }
    };
    tracing::info!(cluster = %owner.name, %node, reason = %why, "drain of the primary's node waits");
    if ctx.cordoned.first_warning(key, true) {
        event(ctx, pg, EventType::Warning, "DrainBlocked", why).await;
    }
    Ok(Step::LookAgain(STUCK_RETRY))
}

/// Watches Nodes until the client's cluster goes away; a node that gets
/// cordoned or uncordoned triggers the clusters with an instance on it.
pub async fn watch(
    client: kube::Client,
    cordoned: std::sync::Arc<Cordoned>,
    idx: std::sync::Arc<index::ChildIndex>,
    trigger: index::Trigger,
) {
    let stream =
        watcher::watcher(Api::<Node>::all(client), watcher::Config::default()).default_backoff();
    futures::pin_mut!(stream);
    let mut listed: Option<BTreeSet<String>> = None;
    while let Some(ev) = stream.next().await {
        let changed = match ev {
            Err(e) => {
                tracing::debug!(error = %e, "node watch error (retrying with backoff)");
                continue;
            }
            Ok(Event::Init) => {
                listed = Some(BTreeSet::new());
                vec![]
            }
            Ok(Event::InitApply(n)) | Ok(Event::Apply(n)) => {
                if let Some(l) = listed.as_mut() {
                    l.insert(n.name_any());
                }
                update(&cordoned, &n.name_any(), unschedulable(&n))
            }
            Ok(Event::Delete(n)) => update(&cordoned, &n.name_any(), false),
            Ok(Event::InitDone) => {
                // Nodes gone while the watch was down are not cordoned any more.
                let seen = listed.take().unwrap_or_default();
                let gone: Vec<String> = cordoned.nodes().difference(&seen).cloned().collect();
                gone.iter()
                    .flat_map(|n| update(&cordoned, n, false))
                    .collect()
            }
        };
        for node in changed {
            for (ns, name) in idx.owners_on_node(&node) {
                trigger(ObjectRef::new(&name).within(&ns));
            }
        }
    }
}

fn unschedulable(n: &Node) -> bool {
    n.spec
        .as_ref()
        .and_then(|s| s.unschedulable)
        .unwrap_or(false)
}

fn update(c: &Cordoned, node: &str, cordoned: bool) -> Vec<String> {
    match c.set(node, cordoned) {
        true => vec![node.to_string()],
        false => vec![],
    }
}
