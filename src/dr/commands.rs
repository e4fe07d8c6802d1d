//! The operator's commands on a topology (`pgfleet dr switchover|promote`,
//! the API): each only writes the topology's next state — to the side it
//! promotes first — and the engine's rounds carry it out.

use super::state::{self, State};
use super::{Engine, decide::SideView};
use anyhow::Context;

impl Engine {
    /// Writes the forced state promoting `to`: to `to` first (must
    /// succeed), then to every other reachable member.
    pub(super) async fn write_forced(
        &self,
        state: &State,
        to: &str,
        views: &[SideView],
    ) -> anyhow::Result<State> {
        let next = state.promoted(to, true)?;
        let ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .ok();
        *self.forced_at_ms.lock().unwrap_or_else(|e| e.into_inner()) = ms;
        state::write(&*self.member(to)?, &self.name, &next).await?;
        for v in views.iter().filter(|v| v.reachable && v.member != to) {
            let m = self.member(&v.member)?;
            if let Err(e) = state::write(&m, &self.name, &next).await {
                tracing::warn!(topology = %self.name, member = %v.member, error = format!("{e:#}"), "DR state copy");
            }
        }
        Ok(next)
    }

    /// `pgfleet dr promote`: promotes `to` while the primary side is
    /// unreachable. Without `accept_data_loss` only what the witness would
    /// do itself (lag within max_rpo) is allowed.
    pub async fn promote(&self, to: &str, accept_data_loss: bool) -> anyhow::Result<State> {
        let views = self.observe().await;
        let state = state::newest(views.iter().filter_map(|v| v.copy.clone()))
            .context("the topology has no state yet")?;
        anyhow::ensure!(state.primary != to, "{to} is the primary side already");
        let primary_up = views
            .iter()
            .any(|v| v.member == state.primary && v.reachable && v.report.is_some());
        anyhow::ensure!(
            !primary_up,
            "the primary side {} answers: use a switchover (no data is lost)",
            state.primary
        );
        let target = views
            .iter()
            .find(|v| v.member == to && v.reachable)
            .with_context(|| format!("{to} is not a reachable member of topology {}", self.name))?;
        if !accept_data_loss {
            let lag = self.tracked().lag(to);
            let t = &self.topology;
            let within = lag.is_some_and(|(b, d)| b <= t.max_rpo_bytes && d <= t.max_rpo_lag());
            anyhow::ensure!(
                within,
                "{to}'s last measured lag {lag:?} is not within max_rpo: pass --accept-data-loss to promote anyway"
            );
        }
        anyhow::ensure!(
            target.report.is_some(),
            "{to}'s designated primary does not answer"
        );
        let next = self.write_forced(&state, to, &views).await?;
        crate::metrics::dr::promoted(&self.name, "manual");
        Ok(next)
    }

    /// A planned switchover to `to`: checks that `to` is a replica side
    /// that streams, then writes the next epoch with `to` as the primary
    /// side — first to `to`, then to the others. The rounds do the rest
    /// (demote, hand-over, promote); returns the state written.
    pub async fn switchover(&self, to: &str) -> anyhow::Result<State> {
        let views = self.observe().await;
        let current = state::newest(views.iter().filter_map(|v| v.copy.clone()))
            .context("the topology has no state yet")?;
        let target = views
            .iter()
            .find(|v| v.member == to)
            .with_context(|| format!("{to} is not a member of topology {}", self.name))?;
        anyhow::ensure!(current.primary != to, "{to} is the primary side already");
        anyhow::ensure!(
            views.iter().all(|v| v.reachable),
            "every member must be reachable for a switchover (use `dr promote` when one is lost)"
        );
        let streaming = target.report.as_ref().is_some_and(|r| r.streaming());
        anyhow::ensure!(streaming, "{to}'s designated primary is not streaming");
        let next = current.promoted(to, false)?;
        for name in std::iter::once(to).chain(
            self.topology
                .members
                .iter()
                .map(String::as_str)
                .filter(|m| *m != to),
        ) {
            let m = self.member(name)?;
            state::write(&m, &self.name, &next).await?;
        }
        crate::metrics::dr::promoted(&self.name, "switchover");
        Ok(next)
    }
}
