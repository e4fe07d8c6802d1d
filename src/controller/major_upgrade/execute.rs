//! Carrying out an in-place major upgrade (the decisions, the steps and why
//! they are safe are in `decide.rs`). Each step is recorded in
//! `status.majorUpgrade` before it acts; every verb it runs in a Pod is
//! idempotent, so a step repeated after a killed manager does no harm.

use super::backups;
use super::decide::{self, Next};
use crate::controller::Ctx;
use crate::controller::image_policy::Effective;
use crate::controller::plan::Observed;
use crate::controller::reconcile::{Error, event};
use crate::controller::record::status_patch;
use crate::crd::PostgresCluster;
use crate::crd::major_upgrade::{MajorUpgradeMethod, MajorUpgradeStatus, PreFlightStatus};
use crate::postgres::exec::run_verb;
use kube::runtime::controller::Action;
use kube::runtime::events::EventType;
use serde_json::json;
use std::time::Duration;

#[path = "execute_in_place.rs"]
mod in_place;
use in_place::{reason, replica_volumes};

/// pg_upgrade of a large catalog, vacuumdb of many databases: minutes.
const LONG_VERB: Duration = Duration::from_secs(1800);
const SHORT_VERB: Duration = Duration::from_secs(60);

/// What the rest of the round does, after the upgrade's step.
#[derive(Default)]
pub struct Round {
    /// Build Pods for this version and image instead of `spec.version`'s.
    pub builds_for: Option<(String, Effective)>,
    /// Failover and switchover stay out (instances stopped on purpose).
    pub hold_primary: bool,
    /// The step acted and ends the round.
    pub done: Option<Action>,
    /// Conditions for the status: (type, reason, message).
    pub notices: Vec<(&'static str, &'static str, String)>,
    /// The record as it is now (for the round's status write): Some(None)
    /// when it was removed.
    pub record: Option<Option<MajorUpgradeStatus>>,
    /// Instances the rest of the round leaves alone (a blue/green
    /// upgrade's other side).
    pub hide: Vec<String>,
    /// Build with `wal_level = logical` (a blue/green upgrade's blue: a
    /// restart parameter, so the rolling update restarts blue for it).
    pub wal_logical: bool,
    /// `wal_level = logical` in the configuration only (green while blue
    /// follows it: green started with it, and must not restart for it).
    pub wal_logical_config_only: bool,
    /// pg_hba rules the round adds in front of the spec's.
    pub hba: Vec<String>,
    /// Look again within this long.
    pub within: Option<Duration>,
    /// A blue/green upgrade's green instance to create with the round's
    /// other new instances (its repository, configuration and TLS mounts).
    pub green: Option<Box<GreenInstance>>,
}

/// Green's first instance: built from `pg` (the new version's image), at
/// `ordinal`, initdb, labelled `pgfleet.io/kind=green`.
pub struct GreenInstance {
    pub pg: PostgresCluster,
    pub ordinal: u32,
    /// Whether it gets the backup repository (the new version's image has
    /// a pgBackRest for it).
    pub repository: bool,
}

/// One round of the major upgrade, if any; a recorded upgrade's round is a
/// span of the upgrade's own trace (`status.majorUpgrade.traceparent`).
pub async fn round(
    pg: &PostgresCluster,
    ctx: &Ctx,
    ns: &str,
    obs: &Observed,
    owner: &crate::controller::build::Owner,
) -> Result<Round, Error> {
    use tracing::Instrument;
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    let record = pg.status.as_ref().and_then(|s| s.major_upgrade.as_ref());
    let Some((step, cx)) = record.and_then(|r| {
        let cx = crate::telemetry::propagation::extract(r.traceparent.as_deref()?)?;
        Some((r.step.clone(), cx))
    }) else {
        return steps(pg, ctx, ns, obs, owner).await;
    };
    let span = tracing::info_span!("major_upgrade.step", %step, cluster = %ctx.member);
    let _ = span.set_parent(cx);
    steps(pg, ctx, ns, obs, owner).instrument(span).await
}

/// The root span of a new upgrade's trace, as a `traceparent` (None
/// while traces are not exported).
fn new_trace(name: &str, from: &str, to: &str, method: &str) -> Option<String> {
    use tracing_opentelemetry::OpenTelemetrySpanExt;
    if !crate::telemetry::tracing_enabled() {
        return None;
    }
    let span = tracing::info_span!(parent: None, "major_upgrade", postgrescluster = %name, %from, %to, %method);
    crate::telemetry::propagation::inject(&span.context())
}

async fn steps(
    pg: &PostgresCluster,
    ctx: &Ctx,
    ns: &str,
    obs: &Observed,
    owner: &crate::controller::build::Owner,
) -> Result<Round, Error> {
    let status = pg.status.clone().unwrap_or_default();
    let record = status.major_upgrade.clone().map(|b| *b);
    if let Some(m) = record.clone().filter(|m| m.blue_green.is_some()) {
        return super::blue_green_exec::round(pg, ctx, ns, obs, owner, m).await;
    }
    let target = record.as_ref().map(|r| r.to_version.as_str());
    let on_target = |p: &&crate::controller::plan::PodInfo| {
        p.ready && !p.deleting && p.version.as_deref() == target
    };
    let input = decide::Input {
        spec_version: &pg.spec.version,
        method: pg.spec.major_upgrade.as_ref().map(|m| m.method),
        running: status.current_version.as_deref(),
        record: record.as_ref(),
        ready_on_target: obs.pods.values().filter(on_target).count() as u32,
        primary_on_target: record
            .as_ref()
            .and_then(|r| obs.pods.get(&r.primary))
            .is_some_and(|p| on_target(&p)),
        old_left: record.as_ref().is_some_and(|r| old_left(obs, r)),
        size: pg.spec.cluster_size.max(1) as u32,
    };
    let next = decide::next(&input);
    let mut round = Round {
        hold_primary: next.holds_primary(),
        ..Round::default()
    };
    if let Some(v) = next.builds_for(record.as_ref()) {
        let run = ctx.images.resolve(v).map_err(Error::Validate)?;
        let eff = Effective {
            image: run.image.clone(),
            pgbackrest: run.pgbackrest,
            tls: run.tls,
            entry: run,
        };
        round.builds_for = Some((v.to_string(), eff));
    }
    let step = Step {
        pg,
        ctx,
        ns,
        obs,
        record,
        primary: status.current_primary.clone(),
    };
    step.carry_out(next, round).await
}

struct Step<'a> {
    pg: &'a PostgresCluster,
    ctx: &'a Ctx,
    ns: &'a str,
    obs: &'a Observed,
    record: Option<MajorUpgradeStatus>,
    primary: Option<String>,
}

fn now() -> String {
    chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Millis, true)
}

/// A step done and the next one recorded: go on at once, not after a
/// pause — from `Stopping` to the new primary's start every second is
/// downtime (`pgfleet bench major-upgrade`).
fn at_once(round: Round) -> Round {
    soon_ms(round, 50)
}

fn soon_ms(mut round: Round, ms: u64) -> Round {
    round.done = Some(Action::requeue(Duration::from_millis(ms)));
    round
}

fn soon(mut round: Round, secs: u64) -> Round {
    round.done = Some(Action::requeue(Duration::from_secs(secs)));
    round
}

impl Step<'_> {
    async fn carry_out(&self, next: Next, mut round: Round) -> Result<Round, Error> {
        match next {
            Next::Idle => self.check_only(round).await,
            Next::Clear => {
                status_patch(self.ctx, self.pg, json!({"majorUpgrade": null})).await?;
                round.record = Some(None);
                Ok(round)
            }
            Next::Refuse { why, .. } => {
                round.notices.push(("MajorUpgradeBlocked", "Refused", why));
                Ok(round)
            }
            Next::Blocked { why, .. } => {
                round
                    .notices
                    .push(("MajorUpgradeBlocked", "UpgradeFailed", why));
                Ok(round)
            }
            Next::PreFlight { from, to } => self.pre_flight(&from, &to, round).await,
            Next::Stop => self.stop(round).await,
            Next::Upgrade | Next::Replace => {
                let Some(r) = self.record.clone() else {
                    return Ok(round);
                };
                match next {
                    Next::Upgrade => self.upgrade(r, round).await,
                    _ => self.replace(&r, round).await,
                }
            }
            Next::Start => {
                self.advance(decide::STARTING, decide::REPLACING).await?;
                let mut r = self.record.clone();
                if let Some(r) = r.as_mut() {
                    r.step = decide::STARTING.into();
                }
                round.record = Some(r);
                Ok(round)
            }
            Next::Analyze => self.analyze(round).await,
            Next::Rebuild => Ok(round),
            Next::Done => self.done(round).await,
        }
    }

    /// Writes `step` into the record (when it is at `from`).
    async fn advance(&self, step: &str, from: &str) -> Result<(), Error> {
        match &self.record {
            Some(r) if r.step == from => {
                status_patch(self.ctx, self.pg, json!({"majorUpgrade": {"step": step}})).await
            }
            _ => Ok(()),
        }
    }

    async fn record(&self, r: &MajorUpgradeStatus) -> Result<(), Error> {
        status_patch(self.ctx, self.pg, json!({ "majorUpgrade": r })).await
    }

    fn pg_name(&self) -> String {
        kube::ResourceExt::name_any(self.pg)
    }

    fn bin_dir(&self, version: &str) -> String {
        let run = self.ctx.images.resolve(version).ok();
        run.and_then(|r| r.bin_dir).unwrap_or_default()
    }

    /// A pre-flight asked for by the annotation (`check.rs`): recorded in
    /// `status.preFlight`, nothing else changes. The round ends here so its
    /// status write cannot put back the previous result.
    async fn check_only(&self, round: Round) -> Result<Round, Error> {
        use kube::ResourceExt;
        let status = self.pg.status.clone().unwrap_or_default();
        let requested = self.pg.annotations().get(super::check::ANNOTATION);
        let running = status.current_version.as_deref();
        let Some(to) = super::check::wanted(
            requested.map(String::as_str),
            running,
            status.pre_flight.as_deref(),
        ) else {
            return Ok(round);
        };
        let ready = |p: &String| self.obs.pods.get(p).is_some_and(|i| i.ready && !i.deleting);
        let Some(primary) = self.primary.clone().filter(ready) else {
            return Ok(round);
        };
        let outcome = match self.ctx.images.resolve(&to) {
            Err(e) => Err(format!("{to} is not in the image catalog: {e}")),
            Ok(run) => {
                let bin = run.bin_dir.unwrap_or_default();
                let verb = ["upgrade-check", bin.as_str()];
                let ran = run_verb(&self.ctx.client, self.ns, &primary, &verb, LONG_VERB).await;
                ran.map(|_| ()).map_err(|e| reason(&e))
            }
        };
        if outcome
            .as_ref()
            .is_err_and(|why| why.starts_with("upgrade-check: already running"))
        {
            return Ok(soon(round, 2));
        }
        let result = PreFlightStatus {
            version: to,
            from_version: running.unwrap_or_default().to_string(),
            ok: outcome.is_ok(),
            reason: outcome.err(),
            checked_at: Some(now()),
        };
        status_patch(self.ctx, self.pg, json!({ "preFlight": result })).await?;
        Ok(soon(round, 1))
    }

    fn blue_green(&self) -> bool {
        self.pg.spec.major_upgrade.as_ref().map(|m| m.method) == Some(MajorUpgradeMethod::BlueGreen)
    }

    async fn pre_flight(&self, from: &str, to: &str, round: Round) -> Result<Round, Error> {
        let Some(primary) = self.primary.clone() else {
            return Ok(round);
        };
        let mut r = self.record.clone().unwrap_or_else(|| MajorUpgradeStatus {
            from_version: from.into(),
            to_version: to.into(),
            step: decide::PRE_FLIGHT.into(),
            primary: primary.clone(),
            started_at: Some(now()),
            traceparent: new_trace(
                &self.pg_name(),
                from,
                to,
                if self.blue_green() {
                    "blueGreen"
                } else {
                    "inPlace"
                },
            ),
            ..MajorUpgradeStatus::default()
        });
        let blue_green = self.blue_green();
        if self.record.is_none() {
            self.record(&r).await?;
            let method = if blue_green { "blueGreen" } else { "inPlace" };
            let note = format!("major upgrade {from} → {to} ({method}): pre-flight on {primary}");
            let reason = "MajorUpgradeStarted";
            event(self.ctx, self.pg, EventType::Normal, reason, note).await;
        }
        let new_bin = self.bin_dir(to);
        // `keep`: the checked new cluster is the one `upgrade` links into,
        // so its initdb happens now, not while the instances are down (a
        // blue/green upgrade links nothing).
        let mut verb = vec!["upgrade-check", new_bin.as_str(), "256"];
        if !blue_green {
            verb.push("keep");
        }
        let (reason, note) =
            match run_verb(&self.ctx.client, self.ns, &primary, &verb, LONG_VERB).await {
                Ok(_) if blue_green => {
                    r.step = super::blue_green::PREPARING_BLUE.into();
                    r.blue_green = Some(super::blue_green_exec::start(&self.pg_name(), self.obs));
                    let note = "blue/green: restarting blue with wal_level = logical";
                    ("MajorUpgradeBlueGreen", note)
                }
                Ok(_) => {
                    r.step = decide::STOPPING.into();
                    ("MajorUpgradeStopping", "stopping every instance")
                }
                // A run from before a restart is still checking: wait for it.
                Err(e) if reason(&e).starts_with("upgrade-check: already running") => {
                    return Ok(soon(round, 2));
                }
                Err(e) => return self.pre_flight_failed(r, from, to, &e, round).await,
            };
        self.record(&r).await?;
        let note = format!("pre-flight passed on {primary}; {note}");
        event(self.ctx, self.pg, EventType::Normal, reason, note).await;
        Ok(at_once(round))
    }

    async fn pre_flight_failed(
        &self,
        mut r: MajorUpgradeStatus,
        from: &str,
        to: &str,
        e: &crate::postgres::exec::ExecError,
        mut round: Round,
    ) -> Result<Round, Error> {
        let why = format!(
            "pre-flight for {from} → {to} failed, still on {from}: {}",
            reason(e)
        );
        r.step = decide::PRE_FLIGHT_FAILED.into();
        r.failure = Some(why.clone());
        self.record(&r).await?;
        let reason = "MajorUpgradePreFlightFailed";
        event(self.ctx, self.pg, EventType::Warning, reason, why.clone()).await;
        round
            .notices
            .push(("MajorUpgradeBlocked", "PreFlightFailed", why));
        round.record = Some(Some(r));
        Ok(round)
    }
}

/// A Pod of another version, or a replica's volume, is still there.
fn old_left(obs: &Observed, r: &MajorUpgradeStatus) -> bool {
    let pod = obs
        .pods
        .values()
        .any(|p| p.version.as_deref() != Some(r.to_version.as_str()));
    pod || replica_volumes(obs, r).next().is_some()
}
