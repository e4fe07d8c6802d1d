//! Publishing Kubernetes Events (`events.k8s.io/v1`) without a cache.
//!
//! kube-runtime's `Recorder` keeps every event it published for six minutes
//! (to fold repeats into a series), about 1.3 KB each; with an Event for
//! every action that is ~9 KB per PostgresCluster during a cold start, twice
//! everything else the manager keeps per object (`pgfleet bench fleet`).
//! pgfleet's events are one per action, not repeats, so this recorder only
//! creates them. Same call shape as kube's, so call sites do not change.

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::Event as K8sEvent;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::Resource;
use kube::api::PostParams;
use kube::runtime::events::{Event, EventType, Reporter};

#[derive(Clone)]
pub struct Recorder {
    client: kube::Client,
    reporter: Reporter,
}

impl Recorder {
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Recorder { client, reporter }
    }

    /// Creates one Event about `reference` (in its namespace, or `default`).
    /// The created Event in the answer is skipped while parsed, not built
    /// (nothing reads it; its managedFields alone are most of it).
    pub async fn publish(&self, ev: &Event, reference: &ObjectReference) -> kube::Result<()> {
        let event = self.build(ev, reference, Timestamp::now());
        let ns = reference.namespace.as_deref().unwrap_or("default");
        let body = serde_json::to_vec(&event).map_err(kube::Error::SerdeError)?;
        let req = kube::core::Request::new(K8sEvent::url_path(&(), Some(ns)))
            .create(&PostParams::default(), body)
            .map_err(kube::Error::BuildRequest)?;
        self.client.request::<serde::de::IgnoredAny>(req).await?;
        Ok(())
    }

    fn build(&self, ev: &Event, reference: &ObjectReference, now: Timestamp) -> K8sEvent {
        let controller = &self.reporter.controller;
        K8sEvent {
            action: Some(ev.action.clone()),
            reason: Some(ev.reason.clone()),
            event_time: Some(MicroTime(now)),
            regarding: Some(reference.clone()),
            related: ev.secondary.clone(),
            note: ev.note.clone(),
            metadata: ObjectMeta {
                namespace: reference.namespace.clone(),
                name: Some(format!(
                    "{}.{:x}",
                    reference.name.as_deref().unwrap_or(controller),
                    now.as_nanosecond()
                )),
                ..Default::default()
            },
            reporting_controller: Some(controller.clone()),
            reporting_instance: Some(
                self.reporter
                    .instance
                    .clone()
                    .unwrap_or_else(|| controller.clone()),
            ),
            type_: Some(
                match ev.type_ {
                    EventType::Normal => "Normal",
                    EventType::Warning => "Warning",
                }
                .into(),
            ),
            ..Default::default()
        }
    }
}

/// An Event about a PostgresCluster known by name only (fleet operations:
/// backups, drills, rollouts), from `controller`; best effort, a failure is
/// logged at debug level and otherwise ignored.
pub async fn on_postgres_cluster(
    client: kube::Client,
    controller: &str,
    ns: &str,
    name: &str,
    type_: EventType,
    reason: &str,
    note: String,
) {
    use kube::Resource;
    let recorder = Recorder::new(
        client,
        Reporter {
            controller: controller.into(),
            instance: None,
        },
    );
    let reference = ObjectReference {
        api_version: Some(crate::crd::PostgresCluster::api_version(&()).to_string()),
        kind: Some(crate::crd::PostgresCluster::kind(&()).to_string()),
        name: Some(name.to_string()),
        namespace: Some(ns.to_string()),
        ..Default::default()
    };
    let ev = Event {
        type_,
        reason: reason.into(),
        note: Some(note),
        action: reason.into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&ev, &reference).await {
        tracing::debug!(error = %e, controller, reason, "could not publish an event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn events_name_their_object_and_reporter() {
        let Ok(client) = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:1".parse().unwrap_or_default(),
        )) else {
            return;
        };
        let rec = Recorder::new(
            client,
            Reporter {
                controller: "pgfleet".into(),
                instance: None,
            },
        );
        let reference = ObjectReference {
            name: Some("orders".into()),
            namespace: Some("shop".into()),
            ..Default::default()
        };
        let ev = Event {
            type_: EventType::Warning,
            reason: "InvalidSpec".into(),
            note: Some("bad".into()),
            action: "InvalidSpec".into(),
            secondary: None,
        };
        let e = rec.build(&ev, &reference, Timestamp::UNIX_EPOCH);
        assert_eq!(e.metadata.name.as_deref(), Some("orders.0"));
        assert_eq!(e.metadata.namespace.as_deref(), Some("shop"));
        assert_eq!(e.type_.as_deref(), Some("Warning"));
        assert_eq!(e.reporting_instance.as_deref(), Some("pgfleet"));
        assert_eq!(e.regarding, Some(reference));
    }
}
