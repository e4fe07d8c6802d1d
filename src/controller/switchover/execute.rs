//! Carrying out a switchover (the decisions are in `decide.rs`): taking a
//! request from the annotation, recording its intent, and the protocol
//! itself (see `switchover/mod.rs`).

use super::ANNOTATION;
use super::decide;
use crate::controller::Ctx;
use crate::controller::build::Owner;
use crate::controller::failover::Candidate;
use crate::controller::instance::{label, report};
use crate::controller::plan::{Observed, ordinal};
use crate::controller::pooler;
use crate::controller::reconcile::{Error, event as publish, kerr};
use crate::controller::record::status_patch;
use crate::crd::{PostgresCluster, Role};
use crate::postgres::{exec::run_verb, parse_lsn};
use kube::api::{Patch, PatchParams};
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use kube::{Api, ResourceExt};
use serde_json::json;
use std::time::{Duration, Instant};

const EXEC_TIMEOUT: Duration = Duration::from_secs(10);
/// How long the target may take to receive the old primary's last WAL.
const CATCH_UP: Duration = Duration::from_secs(30);
/// How long a switchover waits, before touching anything, for the target's
/// WAL receiver to be streaming (see [`streaming`]).
const STREAMING: Duration = Duration::from_secs(30);

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// The instances in `names` with what each reports, for
/// [`decide::target`] (asked one after the other: a switchover is rare).
pub async fn candidates(
    ctx: &Ctx,
    owner: &Owner,
    obs: &Observed,
    names: &[String],
) -> Vec<Candidate> {
    let mut out = Vec::with_capacity(names.len());
    for name in names {
        out.push(Candidate {
            name: name.clone(),
            ordinal: ordinal(&owner.name, name).unwrap_or(u32::MAX),
            ready: obs.pods.get(name).is_some_and(|p| p.ready),
            report: report(ctx, &owner.namespace, name).await,
        });
    }
    out
}

/// Picks up a switchover request from the annotation; returns the action
/// when one was started or refused.
pub async fn take_request(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
) -> Result<Option<Action>, Error> {
    let Some(want) = pg.annotations().get(ANNOTATION).cloned() else {
        return Ok(None);
    };
    let st = pg.status.clone().unwrap_or_default();
    let Some(current) = st.current_primary.clone() else {
        return Ok(None);
    };
    let ns = owner.namespace.clone();
    let target = if want.is_empty() || want == "auto" {
        let names: Vec<String> = obs
            .pods
            .values()
            .filter(|p| p.name != current && p.ready)
            .map(|p| p.name.clone())
            .collect();
        decide::target(&current, &candidates(ctx, owner, obs, &names).await)
    } else {
        Some(want.clone())
    };
    let refusal = decide::refusal(target.as_deref(), &current, obs);
    let api: Api<PostgresCluster> = Api::namespaced(ctx.client.clone(), &ns);
    let clear = json!({"metadata": {"annotations": {ANNOTATION: null}}});
    if let Some(reason) = refusal {
        publish(ctx, pg, EventType::Warning, "SwitchoverRejected", reason).await;
        let written = api
            .patch(
                &pg.name_any(),
                &PatchParams::default(),
                &Patch::Merge(&clear),
            )
            .await
            .map_err(kerr("clear", "PostgresCluster", &pg.name_any()))?;
        ctx.written.saw(&written);
        return Ok(Some(Action::await_change()));
    }
    // decide::refusal refuses a missing target; should that ever change, a
    // switchover towards "" is an error, not an intent.
    let Some(target) = target else {
        return Err(Error::Missing {
            kind: "PostgresCluster",
            name: pg.name_any(),
            field: "switchover target",
        });
    };
    // Intent first, then consume the request.
    let action = begin(pg, ctx, &current, &target, json!({}), "requested").await?;
    let written = api
        .patch(
            &pg.name_any(),
            &PatchParams::default(),
            &Patch::Merge(&clear),
        )
        .await
        .map_err(kerr("clear", "PostgresCluster", &pg.name_any()))?;
    ctx.written.saw(&written);
    Ok(Some(action))
}

/// Records the intent of a switchover (plus `extra` status fields in the
/// same write) and announces it; `resume` carries it out from the next round.
pub async fn begin(
    pg: &PostgresCluster,
    ctx: &Ctx,
    current: &str,
    target: &str,
    mut extra: serde_json::Value,
    why: &str,
) -> Result<Action, Error> {
    extra["targetPrimary"] = json!(target);
    extra["switchover"] = json!({"from": current, "to": target, "requestedAt": now()});
    status_patch(ctx, pg, extra).await?;
    publish(
        ctx,
        pg,
        EventType::Normal,
        "SwitchoverStarted",
        format!("{current} → {target} ({why})"),
    )
    .await;
    Ok(Action::requeue(Duration::from_millis(10)))
}

/// Carries out (or resumes) a recorded switchover. Every step is idempotent.
/// `replica_side`: a DR replica cluster, whose designated primary is a
/// standby anyway.
pub async fn resume(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    (old, target): (&str, &str),
    replica_side: bool,
) -> Result<Action, Error> {
    let ns = owner.namespace.clone();
    let old_is_primary = obs
        .pods
        .get(old)
        .is_some_and(|p| p.role == Some(Role::Primary));
    // A manager that stopped between the demotion and the relabelling left
    // the label on a demoted instance, now a standby following -rw, i.e.
    // itself: the target cannot stream from it, and aborting would leave -rw
    // on an instance that takes no writes. The hand-over goes on instead (demote
    // is idempotent and reports the same shutdown checkpoint).
    let demoted = old_is_primary
        && !replica_side
        && report(ctx, &ns, old)
            .await
            .is_some_and(|r| r.role == "replica");
    if demoted {
        tracing::info!(%old, %target, "switchover: resuming after the old primary's demotion");
        return hand_over(pg, ctx, obs, &ns, old, target, true).await;
    }
    if old_is_primary && !streaming(ctx, &ns, target).await {
        // Nothing was demoted or paused yet: the old primary simply stays.
        keep_primary(ctx, pg, old).await?;
        publish(
            ctx,
            pg,
            EventType::Warning,
            "SwitchoverAborted",
            format!(
                "{target} was not streaming from {old} within {STREAMING:?}; {old} stays primary"
            ),
        )
        .await;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    if old_is_primary {
        // Before pausing: the shutdown checkpoint then has little left to
        // write, which shortens the stall clients see.
        let _ = run_verb(&ctx.client, &ns, old, &["checkpoint"], EXEC_TIMEOUT).await;
    }
    hand_over(pg, ctx, obs, &ns, old, target, old_is_primary).await
}

/// The part clients wait for: PAUSE, demote, catch-up and promote, rewire,
/// RESUME (see `switchover/mod.rs`).
async fn hand_over(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    ns: &str,
    old: &str,
    target: &str,
    old_is_primary: bool,
) -> Result<Action, Error> {
    let ns = ns.to_string();
    let paused_at = Instant::now();
    // From here every return (and a cancelled task) resumes the poolers.
    let paused = pooler::pause::Paused::pause(&ctx.client, &ns, pooler::live_pods(obs)).await?;
    let t_paused = paused_at.elapsed();
    let final_lsn = match old_is_primary {
        true => demote(ctx, &ns, old).await?,
        false => None,
    };
    let t_demoted = paused_at.elapsed();
    // The old primary leaves -rw while the target catches up and promotes
    // (one exec, see `promote_after`): both must be done before the target
    // is labelled, or -rw would select two primaries.
    let fence = async {
        match old_is_primary {
            true => label(ctx, &ns, old, Role::Fenced).await,
            false => Ok(()),
        }
    };
    let (fenced, promoted) = tokio::join!(fence, promote_after(ctx, &ns, target, final_lsn));
    fenced?;
    if !promoted? {
        // Do not promote a target that lacks commits: undo and say so.
        abort(pg, ctx, &ns, old).await?;
        paused.resume().await;
        publish(
            ctx,
            pg,
            EventType::Warning,
            "SwitchoverAborted",
            format!("{target} did not catch up within {CATCH_UP:?}; {old} stays primary"),
        )
        .await;
        return Ok(Action::requeue(Duration::from_secs(1)));
    }
    let t_promoted = paused_at.elapsed();
    label(ctx, &ns, target, Role::Primary).await?;
    let t_labelled = paused_at.elapsed();
    // Clients go on as soon as -rw has its primary; the old one's label
    // only decides -ro.
    paused.resume().await;
    let stall = paused_at.elapsed();
    // Where the stall went, for tuning and for a slow switchover's report.
    tracing::info!(cluster = %ctx.member, %old, %target,
        pause_ms = t_paused.as_millis(), demote_ms = (t_demoted - t_paused).as_millis(),
        promote_ms = (t_promoted - t_demoted).as_millis(), label_ms = (t_labelled - t_promoted).as_millis(),
        resume_ms = (stall - t_labelled).as_millis(), "switchover: writes held");
    if obs.pods.contains_key(old) {
        label(ctx, &ns, old, Role::Replica).await?;
    }
    completed(pg, ctx, obs, &ns, old, target, stall).await
}

/// Promotes the target once it received past `lsn` (the old primary's
/// shutdown checkpoint): false when it did not within [`CATCH_UP`], and
/// nothing changed. One exec (`promote-after`); an instance script without
/// that verb (a ConfigMap not yet refreshed after a manager upgrade) gets
/// the status polls and `promote` it understands.
async fn promote_after(ctx: &Ctx, ns: &str, target: &str, lsn: Option<u64>) -> Result<bool, Error> {
    let promote = Duration::from_secs(60);
    let Some(lsn) = lsn else {
        run_verb(&ctx.client, ns, target, &["promote"], promote).await?;
        return Ok(true);
    };
    let at = crate::postgres::format_lsn(lsn);
    let verb = ["promote-after", at.as_str()];
    match run_verb(&ctx.client, ns, target, &verb, CATCH_UP + promote).await {
        Ok(out) => Ok(!out.contains("\"behind\":true")),
        Err(crate::postgres::exec::ExecError::Verb {
            exit_code: Some(64),
            ..
        }) => {
            if !caught_up(ctx, ns, target, lsn).await {
                return Ok(false);
            }
            run_verb(&ctx.client, ns, target, &["promote"], promote).await?;
            Ok(true)
        }
        Err(e) => Err(e.into()),
    }
}

/// Demotes the old primary while still behind -rw: the replicas stream
/// through it and must receive the shutdown checkpoint. Once stopped it
/// takes no writes (it restarts as a standby); the caller then takes it
/// out of -rw. Returns where its shutdown checkpoint record starts.
async fn demote(ctx: &Ctx, ns: &str, old: &str) -> Result<Option<u64>, Error> {
    let out = run_verb(&ctx.client, ns, old, &["demote"], EXEC_TIMEOUT).await?;
    Ok(
        serde_json::from_str::<crate::postgres::contract::Demoted>(out.trim())
            .ok()
            .and_then(|d| d.lsn.as_deref().and_then(parse_lsn)),
    )
}

/// Whether the target's WAL receiver streams from the old primary, waiting
/// up to [`STREAMING`]. A target that is not streaming when the old primary
/// is demoted can never receive its last WAL: the demoted primary leaves
/// `-rw` (the only address a standby streams from) and no other primary
/// is there until the target is promoted, so the WAL receiver's every retry
/// finds `-rw` without an endpoint, and the switchover can only abort after
/// [`CATCH_UP`]. Right after a previous switchover the demoted primary is
/// Ready (it accepts read-only connections) but still waiting out
/// `wal_retrieve_retry_interval` after failing to connect while `-rw` had
/// no endpoint: that is the case this wait covers (issue 20).
async fn streaming(ctx: &Ctx, ns: &str, target: &str) -> bool {
    let deadline = Instant::now() + STREAMING;
    loop {
        let r = report(ctx, ns, target).await;
        if r.as_ref().is_some_and(|r| r.streaming()) {
            return true;
        }
        if Instant::now() > deadline {
            tracing::warn!(%target, report = ?r, "switchover target is not streaming");
            return false;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Whether the target received past `lsn` (the old primary's shutdown
/// checkpoint record, all of it) within [`CATCH_UP`]: otherwise the new
/// timeline would fork before the old primary's end and it could not
/// follow as a standby.
async fn caught_up(ctx: &Ctx, ns: &str, target: &str, lsn: u64) -> bool {
    let deadline = Instant::now() + CATCH_UP;
    loop {
        let r = report(ctx, ns, target).await;
        let at = r.as_ref().map(|r| {
            // The receive position restarts at a segment boundary when
            // the WAL receiver reconnects; what was replayed counts too.
            let rx = r.received_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
            let replay = r.replayed_lsn.as_deref().and_then(parse_lsn).unwrap_or(0);
            rx.max(replay)
        });
        if at.is_some_and(|a| a > lsn) || r.as_ref().is_some_and(|r| r.role == "primary") {
            return true;
        }
        if Instant::now() > deadline {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// The old primary goes back to being primary: with its label restored,
/// stopping it once more makes the run loop start it as primary again.
async fn abort(pg: &PostgresCluster, ctx: &Ctx, ns: &str, old: &str) -> Result<(), Error> {
    label(ctx, ns, old, Role::Primary).await?;
    let _ = run_verb(&ctx.client, ns, old, &["fence"], EXEC_TIMEOUT).await;
    let _ = run_verb(&ctx.client, ns, old, &["unfence"], EXEC_TIMEOUT).await;
    keep_primary(ctx, pg, old).await
}

/// Records that `old` stays primary and the request is consumed.
async fn keep_primary(ctx: &Ctx, pg: &PostgresCluster, old: &str) -> Result<(), Error> {
    status_patch(ctx, pg, json!({"targetPrimary": old, "switchover": null})).await
}

/// After the promotion: replication slots for the others on the new
/// primary, the record, counters and the Event.
async fn completed(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    ns: &str,
    old: &str,
    target: &str,
    stall: Duration,
) -> Result<Action, Error> {
    let mut args = vec!["slots"];
    args.extend(obs.pods.keys().map(String::as_str).filter(|n| *n != target));
    let _ = run_verb(&ctx.client, ns, target, &args, EXEC_TIMEOUT).await;
    status_patch(ctx, pg, json!({"currentPrimary": target, "targetPrimary": target, "switchover": null,
        "lastSwitchover": {"from": old, "to": target, "completedAt": now(), "stallMs": stall.as_millis() as i64}})).await?;
    ctx.stats
        .switchovers
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let requested = pg.status.as_ref().and_then(|s| s.switchover.as_ref());
    crate::metrics::ops::switchover_completed(
        &ctx.member,
        requested.and_then(|s| s.requested_at.as_deref()),
    );
    publish(
        ctx,
        pg,
        EventType::Normal,
        "SwitchedOver",
        format!(
            "{target} is primary (was {old}); writes paused {} ms",
            stall.as_millis()
        ),
    )
    .await;
    Ok(Action::requeue(Duration::from_millis(500)))
}
