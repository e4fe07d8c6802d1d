//! The blue/green major upgrade (`method: blueGreen`) as a pure state
//! machine (issue 17; docs/major-upgrades.md, "Blue/green"): the decision
//! the executor (`blue_green_exec.rs`) follows, with the record it keeps,
//! pure so that its crash-safety is reviewed and tested on its own.
//!
//! Shape (like RDS blue/green and CloudNativePG's import + logical
//! replication): the running instances are *blue*; *green* is a second
//! instance set of the same PostgresCluster on the new major, at the
//! ordinals after blue's (`orders-1,2` blue → `orders-3,4` green). Same
//! object, so green shares what clients and the pooler depend on — the
//! superuser and application Secrets, the cluster CA and the server
//! certificate whose names `-rw`/`-ro` are — and after the cutover the
//! cluster simply goes on with the higher ordinals (instance names are
//! never reused, as in CloudNativePG). A separate PostgresCluster would
//! have its own CA and Secrets, and the tenant's object would end up a
//! shell pointing at someone else's Pods.
//!
//! Steps, each written to the record *before* it acts (a killed manager
//! resumes it; every step is idempotent):
//!
//! 1. `PreparingBlue` — blue needs `wal_level = logical` (pgfleet runs
//!    `replica`): a restart, done by the rolling update (replicas first,
//!    a switchover, the old primary last), so no client transaction fails.
//! 2. `CreatingGreen` — green's Pods and volumes on the new version; its
//!    first instance with initdb (the old cluster's checksum setting),
//!    the others cloned from it. No Service selects green.
//! 3. `Seeding` — roles (`pg_dumpall --roles-only`), then per database the
//!    schema (`pg_dump --schema-only`), `CREATE PUBLICATION … FOR ALL
//!    TABLES` on blue and `CREATE SUBSCRIPTION … copy_data` on green;
//!    from here DDL is frozen (condition `DDLFrozen`).
//! 4. `CatchingUp` — until every table is synchronised and the guardrails
//!    hold: every published table has a replica identity, the lag is
//!    under a bound, no transaction on blue is older than a bound.
//! 5. `Switching` — the cutover, timed from `switchStartedAt`: pooler
//!    PAUSE, blue made read-only, its current LSN recorded as
//!    `targetLsn`, wait until green confirmed it, sequences copied
//!    (logical replication does not carry them). A switch that does not
//!    reach the LSN within the timeout is undone with no change (blue
//!    writable, RESUME) and tried again from `CatchingUp`, at most
//!    [`Limits::max_switch_attempts`] times (RDS's switchover timeout).
//! 6. `Switched` — the point of no return is writing this step (blue
//!    frozen, green confirmed its last position, sequences copied): then
//!    the subscriptions go, `-rw`/`-ro`/the pooler select green, RESUME;
//!    blue is fenced and kept for the retention window (or until an
//!    explicit finish).
//! 7. `RemovingBlue` — blue's Pods and volumes go; then the record.
//!
//! Rollback: before `Switched`, a failure (or a request) rolls back with
//! no change for clients: subscriptions dropped on green (which drops
//! their slots on blue), the publications and the non-TLS rule on blue
//! removed, green's Pods and volumes deleted (`RollingBack`), ending in
//! `RolledBack` with the reason. After `Switched`, blue follows green by
//! logical replication (green publishes; blue, still read-only for
//! clients, subscribes with the slots made on green under the switch's
//! PAUSE, so no write of green is missed) for as long as blue is kept: a
//! rollback then is a switch back (`SwitchingBack`, the switch mirrored,
//! ending in `RollingBack`). Without that path (a manager stopped between
//! the point of no return and RESUME, or blue too far behind) blue is a
//! fenced copy as of the switch and a rollback is a restore.

use crate::crd::major_upgrade::BlueGreenStatus;

pub const PREPARING_BLUE: &str = "PreparingBlue";
pub const CREATING_GREEN: &str = "CreatingGreen";
pub const SEEDING: &str = "Seeding";
pub const CATCHING_UP: &str = "CatchingUp";
pub const SWITCHING: &str = "Switching";
pub const SWITCHED: &str = "Switched";
pub const SWITCHING_BACK: &str = "SwitchingBack";
pub const REMOVING_BLUE: &str = "RemovingBlue";
pub const ROLLING_BACK: &str = "RollingBack";
pub const ROLLED_BACK: &str = "RolledBack";

/// The blue/green upgrade's record as the decision reads it: the step,
/// versions and failure of `status.majorUpgrade` with its `blueGreen` part
/// (blue's and green's names, the switch attempt).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Record {
    pub step: String,
    pub from_version: String,
    pub to_version: String,
    pub bg: BlueGreenStatus,
    pub failure: Option<String>,
}

impl Record {
    pub fn of(m: &crate::crd::major_upgrade::MajorUpgradeStatus) -> Record {
        Record {
            step: m.step.clone(),
            from_version: m.from_version.clone(),
            to_version: m.to_version.clone(),
            bg: m.blue_green.clone().unwrap_or_default(),
            failure: m.failure.clone(),
        }
    }
}

/// Bounds a platform team sets (defaults as RDS's blue/green guardrails).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limits {
    /// The switch is undone when green has not confirmed blue's final LSN
    /// this long after the PAUSE.
    pub switch_timeout_ms: i64,
    /// Lag (bytes of WAL green has not confirmed) under which a switch may
    /// start: the final wait is then short.
    pub max_lag_bytes: u64,
    /// A transaction older than this on blue holds the PAUSE: wait.
    pub max_transaction_secs: u64,
    /// Switches undone before the upgrade rolls back.
    pub max_switch_attempts: u32,
    /// How long blue is kept after the switch.
    pub retention_ms: i64,
    /// WAL green keeps for blue's reverse replication, at most: beyond it
    /// (a schema change on green stops blue's apply, for example) the
    /// rollback path is given up rather than green's disk filled.
    pub max_reverse_lag_bytes: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            switch_timeout_ms: 30_000,
            max_lag_bytes: 16 * 1024 * 1024,
            max_transaction_secs: 10,
            max_switch_attempts: 3,
            retention_ms: 24 * 3600 * 1000,
            max_reverse_lag_bytes: 256 * 1024 * 1024,
        }
    }
}

/// What the manager saw this round (from the Pods and from SQL on both
/// sides; `None` where it could not be read).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Seen {
    pub now_ms: i64,
    /// Every blue instance runs with `wal_level = logical`.
    pub blue_logical: bool,
    /// Green instances ready on the new version.
    pub green_ready: u32,
    pub size: u32,
    /// Every database has its schema, publication and subscription.
    pub seeded: bool,
    /// Tables not yet in state `r` (ready) on green.
    pub tables_syncing: Option<u32>,
    pub lag_bytes: Option<u64>,
    /// Published tables without a replica identity (UPDATE/DELETE on them
    /// would fail on blue once published).
    pub without_identity: Vec<String>,
    pub oldest_transaction_secs: Option<u64>,
    /// Green confirmed `targetLsn` (every subscription's slot on blue).
    pub target_confirmed: bool,
    /// A blue Pod or volume still exists.
    pub blue_left: bool,
    /// A green Pod or volume still exists.
    pub green_left: bool,
    /// The annotation asking to finish (remove blue now) or to roll back.
    pub finish_requested: bool,
    pub rollback_requested: bool,
    /// Blue confirmed `backLsn` (every reverse slot on green).
    pub back_confirmed: bool,
    /// WAL green keeps for blue's reverse replication (the largest slot).
    pub reverse_lag_bytes: Option<u64>,
}

#[derive(Debug, Clone, PartialEq)]
pub enum Next {
    /// Restart blue with `wal_level = logical` (the rolling update).
    PrepareBlue,
    /// Build green's Pods; wait until they are ready.
    CreateGreen,
    Seed,
    /// Not yet: the reason is shown in the `Progressing` condition.
    Wait(String),
    /// PAUSE (again), blue read-only, record the LSN; idempotent.
    Switch,
    /// Green confirmed the LSN: copy the sequences, then write `Switched`
    /// (blue is frozen, green has all of it: the point of no return), then
    /// as [`Next::Retain`].
    Cutover,
    /// Timed out: blue writable again, RESUME, back to `CatchingUp`.
    UndoSwitch(String),
    /// `Switched`, each part idempotent (a manager killed right after
    /// writing it left them half-way): the subscriptions dropped (`IF
    /// EXISTS`; blue still answers, so their slots go too — and they
    /// connect through `-rw`, which is about to select green itself), the
    /// Services on green, the poolers resumed, blue fenced; blue kept
    /// until the retention ends or a finish is asked for. Dropping the
    /// subscriptions only after `Switched` is written means a restart
    /// in between never finds a switch that can neither finish nor catch
    /// up again.
    Retain,
    RemoveBlue,
    Done,
    /// After the switch, on request, while blue follows green: PAUSE,
    /// green read-only, its LSN recorded, blue confirms it — the switch
    /// mirrored. Idempotent.
    SwitchBack,
    /// Blue confirmed green's last position: sequences copied back, then
    /// `RollingBack` with blue's primary as the cluster's (the point of no
    /// return of the switch back), the Services and poolers on blue,
    /// RESUME; green goes as in a rollback.
    CutBack,
    /// The switch back timed out: green writable again, RESUME, back to
    /// `Switched` (blue still follows).
    UndoSwitchBack(String),
    /// Blue no longer follows green (reverse lag over the bound): its
    /// subscriptions and green's slots go, blue is fenced as a cold copy.
    GiveUpReverse(String),
    /// Undo a switch first if one may be under way (blue writable,
    /// RESUME: both idempotent), then drop what green and the upgrade
    /// made; the reason is recorded.
    RollBack(String),
    /// Rolled back: blue runs as before; the reason stays shown.
    Blocked(String),
}

/// The pure decision for a recorded blue/green upgrade.
pub fn next(r: &Record, s: &Seen, l: &Limits) -> Next {
    let before_switch = matches!(
        r.step.as_str(),
        PREPARING_BLUE | CREATING_GREEN | SEEDING | CATCHING_UP | SWITCHING
    );
    if before_switch && s.rollback_requested && r.step != SWITCHING {
        return Next::RollBack("a rollback was requested".into());
    }
    match r.step.as_str() {
        PREPARING_BLUE if s.blue_logical => Next::CreateGreen,
        PREPARING_BLUE => Next::PrepareBlue,
        CREATING_GREEN if s.green_ready >= s.size.max(1) => Next::Seed,
        CREATING_GREEN => Next::CreateGreen,
        SEEDING if s.seeded => catch_up(s, l),
        SEEDING => Next::Seed,
        CATCHING_UP => catch_up(s, l),
        SWITCHING => switching(r, s, l),
        SWITCHED if s.finish_requested => Next::RemoveBlue,
        SWITCHED if s.rollback_requested && can_switch_back(r, l) => Next::SwitchBack,
        SWITCHED
            if r.bg.reverse == Some(true)
                && s.reverse_lag_bytes
                    .is_some_and(|b| b > l.max_reverse_lag_bytes) =>
        {
            Next::GiveUpReverse(format!(
                "blue is {} bytes behind green (bound {}): a schema change on green, or blue stopped",
                s.reverse_lag_bytes.unwrap_or_default(),
                l.max_reverse_lag_bytes
            ))
        }
        SWITCHING_BACK => switching_back(r, s, l),
        SWITCHED => match r.bg.switched_at_ms {
            Some(t) if s.now_ms - t >= l.retention_ms => Next::RemoveBlue,
            _ => Next::Retain,
        },
        REMOVING_BLUE if s.blue_left => Next::RemoveBlue,
        REMOVING_BLUE => Next::Done,
        ROLLING_BACK if s.green_left => Next::RollBack(failure(r)),
        ROLLING_BACK | ROLLED_BACK => Next::Blocked(failure(r)),
        // A step this manager does not know: touch nothing.
        other => Next::Blocked(format!("unknown blue/green step {other:?}")),
    }
}

fn failure(r: &Record) -> String {
    r.failure.clone().unwrap_or_else(|| "rolled back".into())
}

/// Guardrails before a switch may start. A table without a replica
/// identity is not a wait but a rollback: it would never change by itself
/// and UPDATE/DELETE on it fail on blue while it is published.
fn catch_up(s: &Seen, l: &Limits) -> Next {
    if let Some(t) = s.without_identity.first() {
        let more = match s.without_identity.len() - 1 {
            0 => String::new(),
            n => format!(" (and {n} more)"),
        };
        return Next::RollBack(format!(
            "table {t}{more} has no replica identity (no primary key): add one, or use method inPlace"
        ));
    }
    match (s.tables_syncing, s.lag_bytes, s.oldest_transaction_secs) {
        (Some(0), Some(lag), Some(age))
            if lag <= l.max_lag_bytes && age <= l.max_transaction_secs =>
        {
            Next::Switch
        }
        (Some(n), _, _) if n > 0 => Next::Wait(format!("{n} tables still copying to green")),
        (Some(_), Some(lag), _) if lag > l.max_lag_bytes => Next::Wait(format!(
            "green is {lag} bytes behind (bound {})",
            l.max_lag_bytes
        )),
        (_, _, Some(age)) if age > l.max_transaction_secs => Next::Wait(format!(
            "a transaction on blue has run {age} s (bound {} s): the switch would hold it",
            l.max_transaction_secs
        )),
        _ => Next::Wait("green's progress could not be read".into()),
    }
}

/// A switch in progress (also right after a restart: the pooler may still
/// be paused and blue read-only; both are idempotent to repeat). The
/// timeout counts from the recorded PAUSE, across restarts.
fn switching(r: &Record, s: &Seen, l: &Limits) -> Next {
    let started = r.bg.switch_started_at_ms.unwrap_or(s.now_ms);
    if r.bg.target_lsn.is_some() && s.target_confirmed {
        return Next::Cutover;
    }
    if s.now_ms - started >= l.switch_timeout_ms {
        let why = format!(
            "green did not confirm blue's final position within {} ms",
            l.switch_timeout_ms
        );
        if r.bg.switch_attempts + 1 >= l.max_switch_attempts {
            return Next::RollBack(format!(
                "{why} ({} attempts): switch undone",
                r.bg.switch_attempts + 1
            ));
        }
        return Next::UndoSwitch(why);
    }
    Next::Switch
}

/// A switch back is possible while blue follows green, a few times.
pub fn can_switch_back(r: &Record, l: &Limits) -> bool {
    r.bg.reverse == Some(true) && r.bg.back_attempts < l.max_switch_attempts
}

/// A switch back in progress: [`switching`] mirrored; a timeout goes back
/// to `Switched` (green keeps serving) — never a rollback of green.
fn switching_back(r: &Record, s: &Seen, l: &Limits) -> Next {
    let started = r.bg.back_started_at_ms.unwrap_or(s.now_ms);
    if r.bg.back_lsn.is_some() && s.back_confirmed {
        return Next::CutBack;
    }
    if s.now_ms - started >= l.switch_timeout_ms {
        return Next::UndoSwitchBack(format!(
            "blue did not confirm green's final position within {} ms",
            l.switch_timeout_ms
        ));
    }
    Next::SwitchBack
}

/// Green's instance names: `size` ordinals after the highest blue uses
/// (by Pod or volume), so no name of blue is ever reused — a volume of
/// the old version can never be mistaken for green's.
pub fn green_instances(cluster: &str, blue: &[String], size: u32) -> Vec<String> {
    let top = blue
        .iter()
        .filter_map(|n| crate::controller::plan::ordinal(cluster, n))
        .max()
        .unwrap_or(0);
    (1..=size.max(1))
        .map(|i| format!("{cluster}-{}", top + i))
        .collect()
}

impl Next {
    /// Clients are held (the pooler paused) while this is acted on: the
    /// executor must finish it, or undo it, within the round.
    pub fn holds_clients(&self) -> bool {
        matches!(
            self,
            Next::Switch | Next::Cutover | Next::SwitchBack | Next::CutBack
        )
    }

    /// Which side the `-rw`/`-ro` Services and the pooler select.
    pub fn serves_green(&self, r: &Record) -> bool {
        matches!(r.step.as_str(), SWITCHED | SWITCHING_BACK | REMOVING_BLUE)
            || matches!(self, Next::Retain | Next::RemoveBlue | Next::Done)
    }
}

#[cfg(test)]
#[path = "blue_green_tests.rs"]
mod tests;
