//! What a DR round does to instances: the steps on a side's primary
//! (demote, promote, unfence), the standbys of a lost side told to rewind,
//! the marks that keep the controllers from failing over around them, and
//! the watchdog's heartbeat that runs beside slow steps.

use super::decide::{SideView, Step};
use super::state::State;
use super::{Engine, observe};
use anyhow::Context;
use std::time::Duration;

impl Engine {
    /// Beats the primary side's watchdog (`status dr` on its primary)
    /// every tick, forever: runs beside the steps of a round, which
    /// otherwise hold the next round's observation — the usual beat.
    pub(super) async fn heartbeat(&self, state: &State, views: &[SideView]) {
        let target = views
            .iter()
            .find(|v| v.member == state.primary && v.reachable)
            .and_then(|v| Some((self.member(&v.member).ok()?, v.primary_pod.clone()?)));
        let Some((m, pod)) = target else {
            return std::future::pending().await;
        };
        loop {
            tokio::time::sleep(self.tick).await;
            if observe::report(&m.client(), &self.topology.namespace, &pod)
                .await
                .is_none()
            {
                tracing::debug!(topology = %self.name, member = %m.name, %pod, "DR heartbeat unanswered");
            }
        }
    }

    pub(super) async fn take(&self, step: &Step) -> anyhow::Result<()> {
        let ns = &self.topology.namespace;
        let (member, pod, verb): (&str, &str, &[&str]) = match step {
            Step::Demote {
                member,
                pod,
                rewind,
            } => {
                let v: &[&str] = if *rewind {
                    &["demote", "dr-rewind"]
                } else {
                    &["demote", "dr"]
                };
                (member, pod, v)
            }
            Step::Promote { member, pod } => (member, pod, &["promote"]),
            Step::Unfence {
                member,
                pod,
                replica,
            } => {
                let v: &[&str] = if *replica {
                    &["unfence", "dr"]
                } else {
                    &["unfence"]
                };
                (member, pod, v)
            }
        };
        let m = self.member(member)?;
        if !matches!(step, Step::Promote { .. }) {
            // Demoted, rewound or unfenced: the engine's until it is back.
            let t = &self.topology;
            self.registry
                .hold(member, &t.namespace, &t.name, pod, Duration::from_secs(300));
        }
        // A side that lost the primary to a forced promotion: demoted
        // with a rewind while running, or unfenced as a replica after its
        // watchdog fenced it (the run loop rewinds it then).
        if matches!(
            step,
            Step::Demote { rewind: true, .. } | Step::Unfence { replica: true, .. }
        ) {
            self.rewind_standbys(&m, pod).await;
        }
        let out =
            crate::postgres::exec::run_verb(&m.client(), ns, pod, verb, Duration::from_secs(90))
                .await
                .with_context(|| format!("{} on {member}/{pod}", verb.join(" ")))?;
        tracing::info!(topology = %self.name, %member, %pod, verb = verb.join(" "), %out, "DR step");
        Ok(())
    }

    /// Marks every primary that reports itself fenced or rewinding as the
    /// engine's for two minutes (renewed each round it still does), so
    /// its controller does not fail over around it. The controller releases
    /// the mark once the Pod is Ready (the instance answering is not
    /// enough: the Pod's readiness follows a probe period later).
    pub(super) fn hold_fenced(&self, views: &[SideView]) {
        let t = &self.topology;
        for v in views {
            let (Some(r), Some(pod)) = (v.report.as_ref(), v.primary_pod.as_deref()) else {
                continue;
            };
            let (m, ns, name) = (&v.member, &t.namespace, &t.name);
            if r.fenced || r.rewinding {
                let two_minutes = Duration::from_secs(120);
                self.registry.hold(m, ns, name, pod, two_minutes);
            }
        }
    }

    /// After a forced promotion the lost side's standbys may hold its
    /// primary's last WAL (its shutdown checkpoint) past the point the new
    /// primary side forked off: each rewinds too (`demote dr-rewind` on a
    /// standby), before its primary is demoted. Best effort: a standby
    /// that cannot be reached must not keep the primary from being demoted
    /// (docs/disaster-recovery.md, runbook "a standby of the old side does
    /// not stream").
    async fn rewind_standbys(&self, m: &crate::fleet::Member, primary: &str) {
        let (ns, name) = (&self.topology.namespace, &self.topology.name);
        let pods = match observe::other_instances(&m.client(), ns, name, primary).await {
            Ok(p) => p,
            Err(e) => {
                tracing::warn!(topology = %self.name, member = %m.name, error = format!("{e:#}"), "DR: standbys of the demoted side not listed");
                return;
            }
        };
        for pod in pods {
            let verb = &["demote", "dr-rewind"];
            match crate::postgres::exec::run_verb(
                &m.client(),
                ns,
                &pod,
                verb,
                Duration::from_secs(30),
            )
            .await
            {
                Ok(out) => {
                    tracing::info!(topology = %self.name, member = %m.name, %pod, %out, "DR step: standby rewinds")
                }
                Err(e) => {
                    tracing::warn!(topology = %self.name, member = %m.name, %pod, error = format!("{e:#}"), "DR: a standby of the demoted side was not told to rewind")
                }
            }
        }
    }
}
