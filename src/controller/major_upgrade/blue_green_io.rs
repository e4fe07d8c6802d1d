//! The blue/green upgrade's conversations with its instances
//! (`blue_green_exec.rs` decides when): SQL through the instance verbs
//! `json` (read-only, one JSON value back) and `apply-sql` (statements on
//! stdin), green seeded with what blue dumps (`bg-dump`), relayed by the
//! manager over the exec channel — green's PostgreSQL may have no SSL, and
//! the superuser never logs in over the pod network. Everything the SQL
//! names comes from `blue_green_sql.rs`, quoted there.

use super::blue_green_sql as bg;
use crate::controller::Ctx;
use crate::controller::reconcile::Error;
use crate::postgres::exec::{run_verb, run_verb_stdin};
use crate::postgres::sql::{ident, literal, scram_verifier_random};
use serde::de::DeserializeOwned;
use std::time::Duration;

/// A query or a short statement.
const SHORT: Duration = Duration::from_secs(30);
/// A dump or a schema applied: as long as the catalog is large.
const LONG: Duration = Duration::from_secs(600);

/// One instance of one side, in one namespace.
#[derive(Clone, Copy)]
pub struct On<'a> {
    pub ctx: &'a Ctx,
    pub ns: &'a str,
    pub pod: &'a str,
}

impl On<'_> {
    /// The JSON value of a read-only query in `db`.
    pub async fn json<T: DeserializeOwned>(&self, db: &str, query: &str) -> Result<T, Error> {
        let verb = ["json", "--db", db];
        let out = run_verb_stdin(
            &self.ctx.client,
            self.ns,
            self.pod,
            &verb,
            query.to_string(),
            SHORT,
        )
        .await?;
        serde_json::from_str(out.trim()).map_err(|e| {
            Error::Validate(format!(
                "blue/green: unexpected answer from {} ({e})",
                self.pod
            ))
        })
    }

    /// Statements in `db`, each in its own transaction (psql `-f`); the
    /// session may change schemas while blue's DDL is frozen.
    pub async fn apply(&self, db: &str, sql: String) -> Result<(), Error> {
        let verb = ["apply-sql", "--db", db];
        let sql = format!("SET {ALLOW_DDL} = 'on';\n{sql}");
        run_verb_stdin(&self.ctx.client, self.ns, self.pod, &verb, sql, LONG).await?;
        Ok(())
    }

    /// The instance verb `bg-dump` (`roles`, or `schema DB`): refused
    /// unless it ends with the verb's last line — the exec keeps at most
    /// `STDOUT_CAP` of output, and a cut dump must never be applied.
    async fn dump(&self, what: &[&str]) -> Result<String, Error> {
        let mut verb = vec!["bg-dump"];
        verb.extend_from_slice(what);
        let out = run_verb(&self.ctx.client, self.ns, self.pod, &verb, LONG).await?;
        match complete(&out) {
            true => Ok(out),
            false => Err(Error::Validate(format!(
                "blue/green: the dump of {} from {} is larger than the {} MiB an exec returns (or was cut short); use method inPlace",
                what.join(" "),
                self.pod,
                crate::postgres::exec::STDOUT_CAP >> 20
            ))),
        }
    }

    /// The databases clients can connect to.
    pub async fn databases(&self) -> Result<Vec<String>, Error> {
        let q = "SELECT coalesce(json_agg(datname ORDER BY datname), '[]') FROM pg_database \
                 WHERE datallowconn AND NOT datistemplate";
        self.json("postgres", q).await
    }
}

/// The last line `bg-dump` prints once the dump is whole.
const DUMP_END: &str = "-- pgfleet bg-dump complete";

fn complete(dump: &str) -> bool {
    dump.trim_end().ends_with(DUMP_END)
}

/// `wal_level` as the instance runs it.
pub async fn wal_level(on: On<'_>) -> Result<String, Error> {
    on.json("postgres", "SELECT to_json(current_setting('wal_level'))")
        .await
}

/// The setting a session of the upgrade itself carries past the freeze.
const ALLOW_DDL: &str = "pgfleet.bluegreen_ddl";
/// Where blue's freeze lives, per database (never copied to green: it is
/// made after the database's schema was).
const FREEZE_SCHEMA: &str = "pgfleet_bluegreen";

/// Schema changes on blue refused while green replicates it: logical
/// replication carries rows, not DDL, so a table changed on blue alone
/// would stop the subscription (or lose the change at the switch). An
/// event trigger, so the error names the reason; the upgrade's own
/// sessions set [`ALLOW_DDL`]. Idempotent.
fn freeze_ddl() -> String {
    let (s, allow) = (ident(FREEZE_SCHEMA), literal(ALLOW_DDL));
    format!(
        "CREATE SCHEMA IF NOT EXISTS {s};\n\
CREATE OR REPLACE FUNCTION {s}.ddl_frozen() RETURNS event_trigger LANGUAGE plpgsql AS $pgfleet$ BEGIN \
IF coalesce(current_setting({allow}, true), '') <> 'on' THEN RAISE EXCEPTION \
'schema changes are frozen during a blue/green major upgrade (condition DDLFrozen): run them after the switch'; \
END IF; END $pgfleet$;\n\
DO $pgfleet$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_event_trigger WHERE evtname = 'pgfleet_bluegreen_ddl') THEN \
CREATE EVENT TRIGGER pgfleet_bluegreen_ddl ON ddl_command_start EXECUTE FUNCTION {s}.ddl_frozen(); END IF; END $pgfleet$;\n"
    )
}

/// Undoes [`freeze_ddl`] (a rollback).
fn thaw_ddl() -> String {
    format!(
        "DROP EVENT TRIGGER IF EXISTS pgfleet_bluegreen_ddl;\nDROP SCHEMA IF EXISTS {} CASCADE;\n",
        ident(FREEZE_SCHEMA)
    )
}

/// Marks a database of green as seeded, in the transaction that applied
/// its schema (a repeated `Seeding` step does not apply it twice).
const SEEDED: &str = "pgfleet_bg_seeded";

/// `CREATE ROLE x;` lines of a roles dump made repeatable (a repeated
/// step, or a role green already has: `postgres`). The dump quotes every
/// name that needs it, so a line is one statement.
fn repeatable_roles(dump: &str) -> String {
    dump.lines()
        .map(|l| match l.strip_prefix("CREATE ROLE ") {
            Some(rest) if rest.ends_with(';') && !rest.contains("$pgfleet$") => format!(
                "DO $pgfleet$ BEGIN CREATE ROLE {rest} EXCEPTION WHEN duplicate_object THEN NULL; END $pgfleet$;"
            ),
            _ => l.to_string(),
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Seeds green from blue: the upgrade's role on blue (a fresh password,
/// sent to blue as a SCRAM verifier only), roles, then per database the
/// schema, blue's publication and green's subscription. Every part is
/// idempotent. Returns how many databases are subscribed.
pub async fn seed(blue: On<'_>, green: On<'_>, host: &str, plain: bool) -> Result<usize, Error> {
    let password = crate::postgres::sql::random_password();
    let passfile = passfile(green, &password).await?;
    let role = format!(
        "DO $pgfleet$ BEGIN CREATE ROLE {r}; EXCEPTION WHEN duplicate_object THEN NULL; END $pgfleet$;\n\
ALTER ROLE {r} WITH LOGIN REPLICATION PASSWORD {v};\nGRANT pg_read_all_data TO {r};\n",
        r = ident(bg::ROLE),
        v = literal(&scram_verifier_random(&password))
    );
    blue.apply("postgres", role).await?;
    let roles = blue.dump(&["roles"]).await?;
    green.apply("postgres", repeatable_roles(&roles)).await?;
    let databases = blue.databases().await?;
    let existing: Vec<String> = green.databases().await?;
    let transport = bg::transport(!plain);
    for db in &databases {
        if !existing.contains(db) {
            let owner: String = blue
                .json(db, "SELECT to_json(pg_get_userbyid(datdba)) FROM pg_database WHERE datname = current_database()")
                .await?;
            let create = format!("CREATE DATABASE {} OWNER {};", ident(db), ident(&owner));
            green.apply("postgres", create).await?;
        }
        let marked = format!(
            "SELECT to_json(count(*)) FROM pg_namespace WHERE nspname = {}",
            literal(SEEDED)
        );
        if green.json::<i64>(db, &marked).await? == 0 {
            let schema = blue.dump(&["schema", db]).await?;
            let sql = format!(
                "BEGIN;\n{schema}\nCREATE SCHEMA {};\nCOMMIT;\n",
                ident(SEEDED)
            );
            green.apply(db, sql).await?;
        }
        blue.apply(db, bg::create_publication()).await?;
        let exists: i64 = green
            .json(db, &to_json(&bg::subscription_exists(db)))
            .await?;
        if exists == 0 {
            let source = bg::Source {
                host,
                database: db,
                passfile: &passfile,
                ca_file: &format!("{}/ca.crt", crate::controller::tls::MOUNT),
            };
            green
                .apply(db, bg::create_subscription(&source, transport))
                .await?;
        }
    }
    // Last, once every schema is on green: a dump never carries it.
    for db in &databases {
        blue.apply(db, freeze_ddl()).await?;
    }
    Ok(databases.len())
}

/// `SELECT x …;` as `SELECT to_json(x) …` for the `json` verb.
fn to_json(select: &str) -> String {
    let body = select.trim().trim_end_matches(';');
    match body.strip_prefix("SELECT ") {
        Some(rest) => match rest.split_once(" FROM ") {
            Some((expr, from)) => format!("SELECT to_json({expr}) FROM {from}"),
            None => format!("SELECT to_json({rest})"),
        },
        None => body.to_string(),
    }
}

/// Green's and blue's progress, summed over the databases.
#[derive(Debug, Default)]
pub struct Progress {
    pub syncing: u32,
    pub lag: u64,
    pub oldest: u64,
    pub without_identity: Vec<String>,
}

pub async fn progress(blue: On<'_>, green: On<'_>, dbs: &[String]) -> Result<Progress, Error> {
    let mut p = Progress::default();
    for db in dbs {
        let g: serde_json::Value = green.json(db, bg::GREEN_PROGRESS).await?;
        p.syncing += g["syncing"].as_u64().unwrap_or(0) as u32;
        let b: serde_json::Value = blue.json(db, bg::BLUE_PROGRESS).await?;
        p.lag = p.lag.max(b["lag"].as_u64().unwrap_or(0));
        p.oldest = p.oldest.max(b["oldest"].as_u64().unwrap_or(0));
        let slots = b["slots"].as_u64().unwrap_or(0);
        if slots < dbs.len() as u64 {
            // A subscription's slot is missing: not caught up.
            p.syncing += 1;
        }
        if let Some(list) = b["noIdentity"].as_array() {
            let named = list.iter().filter_map(|v| v.as_str());
            p.without_identity
                .extend(named.map(|t| format!("{db}.{t}")));
        }
    }
    Ok(p)
}

/// Blue stops taking writes; returns the position green must confirm.
pub async fn freeze(blue: On<'_>) -> Result<String, Error> {
    let sql = bg::FREEZE_BLUE[..3].join(";\n") + ";\n";
    blue.apply("postgres", sql).await?;
    let lsn: String = blue
        .json("postgres", "SELECT to_json(pg_current_wal_lsn()::text)")
        .await?;
    bg::lsn(&lsn)
        .map(str::to_string)
        .ok_or_else(|| Error::Validate(format!("blue printed no LSN: {lsn:?}")))
}

pub async fn thaw(blue: On<'_>) -> Result<(), Error> {
    let sql = bg::THAW_BLUE.join(";\n") + ";\n";
    blue.apply("postgres", sql).await
}

/// Whether the publisher `on` saw its `slots` slots of one direction
/// (`prefix`) confirm `lsn`.
pub async fn confirmed(on: On<'_>, prefix: &str, lsn: &str, slots: usize) -> Result<bool, Error> {
    on.json("postgres", &bg::confirmed(prefix, lsn, slots))
        .await
}

/// The publisher's sequences set on the subscriber, per database (the
/// subscriber may be read-only for clients: blue, on a switch back).
pub async fn copy_sequences(from: On<'_>, to: On<'_>, dbs: &[String]) -> Result<(), Error> {
    for db in dbs {
        let rows: serde_json::Value = from.json(db, bg::SEQUENCES).await?;
        let seqs = bg::parse_sequences(&rows.to_string()).map_err(Error::Validate)?;
        let sql = bg::sync_sequences(&seqs);
        if !sql.is_empty() {
            let sql = format!("SET default_transaction_read_only = off;\n{sql}");
            to.apply(db, sql).await?;
        }
    }
    Ok(())
}

/// Under the switch's PAUSE, once green has all of blue: green's
/// publication and the slots of blue's reverse subscriptions, made before
/// green's first write.
pub async fn open_back(green: On<'_>, dbs: &[String]) -> Result<(), Error> {
    for db in dbs {
        green.apply(db, bg::create_publication()).await?;
        green.apply(db, bg::create_back_slot(db)).await?;
    }
    Ok(())
}

/// How many reverse slots green has.
pub async fn back_slots(green: On<'_>) -> Result<usize, Error> {
    green.json("postgres", bg::BACK_SLOTS).await
}

/// The WAL green keeps for blue.
pub async fn back_lag(green: On<'_>) -> Result<u64, Error> {
    green.json("postgres", bg::BACK_LAG).await
}

/// After the switch: blue subscribes to green on the slots made under the
/// PAUSE, as the upgrade's role (a fresh password: its verifier on green,
/// the passfile on blue); blue's own forward slots go (nothing reads them
/// any more, and they would keep blue's WAL). Idempotent.
pub async fn follow_green(
    blue: On<'_>,
    green: On<'_>,
    host: &str,
    plain: bool,
    dbs: &[String],
) -> Result<(), Error> {
    blue.apply("postgres", bg::drop_slots(bg::SLOT_PREFIX))
        .await?;
    let password = crate::postgres::sql::random_password();
    let passfile = passfile(blue, &password).await?;
    let role = format!(
        "ALTER ROLE {} WITH LOGIN REPLICATION PASSWORD {};\n",
        ident(bg::ROLE),
        literal(&scram_verifier_random(&password))
    );
    green.apply("postgres", role).await?;
    for db in dbs {
        if blue
            .json::<i64>(db, &bg::back_subscription_exists(db))
            .await?
            > 0
        {
            continue;
        }
        let source = bg::Source {
            host,
            database: db,
            passfile: &passfile,
            ca_file: &format!("{}/ca.crt", crate::controller::tls::MOUNT),
        };
        let sql = bg::create_back_subscription(&source, bg::transport(!plain));
        blue.apply(db, sql).await?;
    }
    Ok(())
}

/// Blue stops following green: its reverse subscriptions go (their slots
/// stay on green, dropped there by [`drop_back_slots`] or with green).
pub async fn unfollow(blue: On<'_>, dbs: &[String]) -> Result<(), Error> {
    for db in dbs {
        blue.apply(db, bg::detach_back(db)).await?;
    }
    Ok(())
}

/// Green's reverse slots, once blue no longer reads them.
pub async fn drop_back_slots(green: On<'_>) -> Result<(), Error> {
    green
        .apply("postgres", bg::drop_slots(bg::BACK_PREFIX))
        .await
}

/// The upgrade role's password in a passfile on `on` (instance verb
/// `bg-passfile`); its path.
async fn passfile(on: On<'_>, password: &str) -> Result<String, Error> {
    let out = run_verb_stdin(
        &on.ctx.client,
        on.ns,
        on.pod,
        &["bg-passfile"],
        password.to_string(),
        SHORT,
    )
    .await?;
    serde_json::from_str::<serde_json::Value>(out.trim())
        .ok()
        .and_then(|v| v["passfile"].as_str().map(str::to_string))
        .ok_or_else(|| Error::Validate("bg-passfile printed no path".into()))
}

/// Green's subscriptions go without touching blue (its slots stay with
/// blue's volume, which goes with blue): blue may be stopped already.
pub async fn detach(green: On<'_>, dbs: &[String]) -> Result<(), Error> {
    for db in dbs {
        let name = ident(&bg::subscription_name(db));
        let exists: i64 = green
            .json(db, &to_json(&bg::subscription_exists(db)))
            .await?;
        if exists > 0 {
            let sql = format!(
                "ALTER SUBSCRIPTION {name} DISABLE;\nALTER SUBSCRIPTION {name} SET (slot_name = NONE);\nDROP SUBSCRIPTION {name};\n"
            );
            green.apply(db, sql).await?;
        }
        let unmark = format!("DROP SCHEMA IF EXISTS {};\n", ident(SEEDED));
        green.apply(db, unmark).await?;
    }
    Ok(())
}

/// A rollback's cleanup of blue: the subscriptions' slots, the reverse
/// subscriptions (after a switch back), publications,
/// the DDL freeze and the upgrade's role.
pub async fn clean_blue(blue: On<'_>, dbs: &[String]) -> Result<(), Error> {
    blue.apply("postgres", bg::drop_slots(bg::SLOT_PREFIX))
        .await?;
    unfollow(blue, dbs).await?;
    for db in dbs {
        blue.apply(db, bg::drop_publication()).await?;
        blue.apply(db, thaw_ddl()).await?;
    }
    let role = format!("DROP ROLE IF EXISTS {};\n", ident(bg::ROLE));
    blue.apply("postgres", role).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn role_lines_become_repeatable_and_nothing_else_changes() {
        let dump =
            "CREATE ROLE postgres;\nALTER ROLE postgres WITH SUPERUSER;\nCREATE ROLE \"we;ird\";";
        let out = repeatable_roles(dump);
        let lines: Vec<&str> = out.lines().collect();
        assert!(lines[0].starts_with("DO $pgfleet$ BEGIN CREATE ROLE postgres; EXCEPTION"));
        assert_eq!(lines[1], "ALTER ROLE postgres WITH SUPERUSER;");
        assert!(lines[2].contains("CREATE ROLE \"we;ird\"; EXCEPTION"));
    }

    #[test]
    fn only_a_whole_dump_is_applied() {
        assert!(complete(
            "CREATE TABLE t ();\n-- pgfleet bg-dump complete\n"
        ));
        assert!(!complete("CREATE TABLE t ();\nCREATE TAB"));
        assert!(!complete(""));
    }

    #[test]
    fn selects_become_one_json_value() {
        assert_eq!(
            to_json("SELECT count(*) FROM pg_subscription WHERE subname = 'x';"),
            "SELECT to_json(count(*)) FROM pg_subscription WHERE subname = 'x'"
        );
        assert_eq!(to_json("SELECT 1"), "SELECT to_json(1)");
    }
}
