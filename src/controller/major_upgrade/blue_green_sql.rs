//! The SQL, connection strings and pg_hba rule of a blue/green upgrade
//! (`blue_green.rs`), built as text from names that may come from tenants
//! (databases, schemas, sequences): every identifier quoted, every value
//! read back as JSON rather than split on a separator a name could hold.
//!
//! Transport: green subscribes to blue as the role [`ROLE`] (REPLICATION
//! and `pg_read_all_data`, nothing else; its password only in a passfile
//! on green, never in the SQL, where a failing statement would print it
//! to the server log). When green's PostgreSQL has SSL, the connection is
//! `sslmode=verify-full` against the cluster CA, like every other
//! connection. Only when green reports no SSL support (the PostgreSQL 18
//! build available to the process runtime has none; `postgres:18` has)
//! does blue get one plain-text rule — this role, green's own addresses,
//! before the `hostnossl … reject` line — for the duration of the upgrade.

use crate::postgres::sql::{ident, literal};
use std::net::IpAddr;

/// The role green subscribes as.
pub const ROLE: &str = "pgfleet_bluegreen";
/// The publication on blue, one per database.
pub const PUBLICATION: &str = "pgfleet_bluegreen";
/// Prefix of the subscriptions and of their slots on blue.
pub const SLOT_PREFIX: &str = "pgfleet_bg_";
/// Prefix of blue's reverse subscriptions after the switch and of their
/// slots on green. Not a [`SLOT_PREFIX`] name: counting one direction's
/// slots never counts the other's.
pub const BACK_PREFIX: &str = "pgfleet_bgr_";

/// How green reaches blue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transport {
    VerifyFull,
    /// Green's image has no SSL: the scoped plain-text rule on blue.
    PlainTextScoped,
}

pub fn transport(green_has_ssl: bool) -> Transport {
    match green_has_ssl {
        true => Transport::VerifyFull,
        false => Transport::PlainTextScoped,
    }
}

/// The subscription (and slot) of one database: slot names are
/// cluster-wide on blue and take only `[a-z0-9_]`, so the database name
/// enters as a hash.
pub fn subscription_name(database: &str) -> String {
    let h = crate::platform::hash::fnv1a64(database.as_bytes());
    format!("{SLOT_PREFIX}{h:016x}")
}

/// Blue's reverse subscription of one database, and its slot on green.
pub fn back_name(database: &str) -> String {
    let h = crate::platform::hash::fnv1a64(database.as_bytes());
    format!("{BACK_PREFIX}{h:016x}")
}

/// On green, in `database`, after its publication and under the switch's
/// PAUSE: the slot blue's subscription will use, so that it starts before
/// green's first write. Idempotent (its own transaction: a slot cannot be
/// made in one that wrote).
pub fn create_back_slot(database: &str) -> String {
    let n = literal(&back_name(database));
    format!(
        "SELECT count(pg_create_logical_replication_slot(n, 'pgoutput')) FROM (SELECT {n}::name AS n) s \
WHERE NOT EXISTS (SELECT 1 FROM pg_replication_slots WHERE slot_name = {n});"
    )
}

/// On green: how many reverse slots there are, as JSON.
pub const BACK_SLOTS: &str = "SELECT to_json(count(*)) FROM pg_replication_slots \
WHERE starts_with(slot_name, 'pgfleet_bgr_')";

/// On green: the WAL its reverse slots keep (the largest), as JSON.
pub const BACK_LAG: &str = "SELECT to_json(coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), \
confirmed_flush_lsn)), 0)::bigint) FROM pg_replication_slots WHERE starts_with(slot_name, 'pgfleet_bgr_')";

/// On blue (read-only for clients: its own session allows the write), in
/// `database`: the subscription to green's publication on the slot made
/// at the switch, copying nothing (blue has every row up to the switch).
pub fn create_back_subscription(s: &Source, t: Transport) -> String {
    let name = back_name(s.database);
    format!(
        "SET default_transaction_read_only = off;\nCREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} \
WITH (copy_data = false, create_slot = false, slot_name = {});",
        ident(&name),
        literal(&conninfo(s, t)),
        ident(PUBLICATION),
        literal(&name)
    )
}

/// On blue: whether `database`'s reverse subscription exists, as JSON.
pub fn back_subscription_exists(database: &str) -> String {
    format!(
        "SELECT to_json(count(*)) FROM pg_subscription WHERE subname = {};",
        literal(&back_name(database))
    )
}

/// On blue: the reverse subscription goes without touching green (its
/// slot goes with green, or with [`drop_slots`]). Idempotent.
pub fn detach_back(database: &str) -> String {
    let n = literal(&back_name(database));
    let i = ident(&back_name(database));
    format!(
        "SET default_transaction_read_only = off;\n\
DO $pgfleet$ BEGIN IF EXISTS (SELECT 1 FROM pg_subscription WHERE subname = {n}) THEN \
ALTER SUBSCRIPTION {i} DISABLE; ALTER SUBSCRIPTION {i} SET (slot_name = NONE); END IF; END $pgfleet$;\n\
DROP SUBSCRIPTION IF EXISTS {i};"
    )
}

/// The upgrade's unused slots of one direction (`prefix`), dropped.
pub fn drop_slots(prefix: &str) -> String {
    format!(
        "SELECT count(pg_drop_replication_slot(slot_name)) FROM pg_replication_slots \
WHERE starts_with(slot_name, {}) AND NOT active;",
        literal(prefix)
    )
}

/// Idempotent: a repeated `Seeding` step finds the publication there.
pub fn create_publication() -> String {
    format!(
        "DO $$ BEGIN IF NOT EXISTS (SELECT 1 FROM pg_publication WHERE pubname = {p}) THEN \
CREATE PUBLICATION {i} FOR ALL TABLES; END IF; END $$;",
        p = literal(PUBLICATION),
        i = ident(PUBLICATION)
    )
}

pub fn drop_publication() -> String {
    format!("DROP PUBLICATION IF EXISTS {};", ident(PUBLICATION))
}

/// A libpq connection-string value: single-quoted, `\` and `'` escaped.
fn conninfo_value(v: &str) -> String {
    format!("'{}'", v.replace('\\', "\\\\").replace('\'', "\\'"))
}

/// Where green finds blue's primary, and its credentials and CA.
pub struct Source<'a> {
    /// `<name>-rw`: the name blue's server certificate carries (so
    /// verify-full holds), and it follows a failover of blue.
    pub host: &'a str,
    pub database: &'a str,
    pub passfile: &'a str,
    pub ca_file: &'a str,
}

pub fn conninfo(s: &Source, t: Transport) -> String {
    let tls = match t {
        Transport::VerifyFull => format!(
            "sslmode=verify-full sslrootcert={}",
            conninfo_value(s.ca_file)
        ),
        Transport::PlainTextScoped => "sslmode=disable".to_string(),
    };
    format!(
        "host={} port=5432 dbname={} user={ROLE} passfile={} {tls}",
        conninfo_value(s.host),
        conninfo_value(s.database),
        conninfo_value(s.passfile)
    )
}

/// Run on green in `database` (not in a transaction block: it creates the
/// slot on blue). The executor checks [`subscription_exists`] first.
pub fn create_subscription(s: &Source, t: Transport) -> String {
    let name = subscription_name(s.database);
    format!(
        "CREATE SUBSCRIPTION {} CONNECTION {} PUBLICATION {} WITH (copy_data = true, slot_name = {});",
        ident(&name),
        literal(&conninfo(s, t)),
        ident(PUBLICATION),
        literal(&name)
    )
}

pub fn subscription_exists(database: &str) -> String {
    format!(
        "SELECT count(*) FROM pg_subscription WHERE subname = {};",
        literal(&subscription_name(database))
    )
}

/// Dropping the subscription on green drops its slot on blue too.
pub fn drop_subscription(database: &str) -> String {
    format!(
        "DROP SUBSCRIPTION IF EXISTS {};",
        ident(&subscription_name(database))
    )
}

/// The rules blue gets when green has no SSL: only [`ROLE`], only from
/// green's addresses. An address that does not parse is refused (it
/// would become a hole or a broken file).
pub fn plain_text_rules(green_ips: &[String]) -> Result<Vec<String>, String> {
    green_ips
        .iter()
        .map(|ip| {
            let addr: IpAddr = ip
                .parse()
                .map_err(|_| format!("green pod address {ip:?} is not an IP address"))?;
            let bits = if addr.is_ipv4() { 32 } else { 128 };
            Ok(format!("host all {ROLE} {addr}/{bits} scram-sha-256"))
        })
        .collect()
}

/// Green's progress, as one JSON object, on green.
pub const GREEN_PROGRESS: &str = "SELECT json_build_object('syncing', \
(SELECT count(*) FROM pg_subscription_rel WHERE srsubstate <> 'r'))";

/// Blue's side, as one JSON object: lag of the upgrade's slots, the oldest
/// client transaction, published tables without a replica identity.
pub const BLUE_PROGRESS: &str = "SELECT json_build_object(\
'slots', (SELECT count(*) FROM pg_replication_slots WHERE starts_with(slot_name, 'pgfleet_bg_')), \
'lag', (SELECT coalesce(max(pg_wal_lsn_diff(pg_current_wal_lsn(), confirmed_flush_lsn)), 0)::bigint \
FROM pg_replication_slots WHERE starts_with(slot_name, 'pgfleet_bg_')), \
'oldest', (SELECT coalesce(max(extract(epoch FROM now() - xact_start)), 0)::bigint FROM pg_stat_activity \
WHERE backend_type = 'client backend' AND xact_start IS NOT NULL AND pid <> pg_backend_pid()), \
'noIdentity', (SELECT coalesce(json_agg(format('%I.%I', n.nspname, c.relname)), '[]') FROM pg_class c \
JOIN pg_namespace n ON n.oid = c.relnamespace WHERE c.relkind IN ('r', 'p') \
AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname NOT LIKE 'pg_toast%' \
AND (c.relreplident = 'n' OR (c.relreplident = 'd' AND NOT EXISTS \
(SELECT 1 FROM pg_index i WHERE i.indrelid = c.oid AND i.indisprimary)))))";

/// Blue stops taking writes for the switch (the pooler is paused first):
/// read-only by default, then every client backend ended — the poolers'
/// idle server connections too, so after RESUME they reconnect through
/// `-rw`, to green. Walsenders stay: green still has to confirm blue's
/// last position. A tenant is no superuser and cannot turn it back.
/// Each statement on its own (`psql -c … -c …`): ALTER SYSTEM cannot run
/// in the implicit transaction of a multi-statement string. The last one
/// prints the LSN green must confirm.
pub const FREEZE_BLUE: [&str; 4] = [
    "ALTER SYSTEM SET default_transaction_read_only = on",
    "SELECT pg_reload_conf()",
    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()",
    "SELECT pg_current_wal_lsn()",
];

/// Undoes [`FREEZE_BLUE`] (a switch undone, or rolled back).
pub const THAW_BLUE: [&str; 2] = [
    "ALTER SYSTEM RESET default_transaction_read_only",
    "SELECT pg_reload_conf()",
];

/// Whether every one of the upgrade's `slots` slots of one direction
/// (`prefix`: [`SLOT_PREFIX`] on blue, [`BACK_PREFIX`] on green) confirmed
/// `lsn` (checked by [`lsn`] first), as JSON.
pub fn confirmed(prefix: &str, lsn: &str, slots: usize) -> String {
    format!(
        "SELECT to_json(count(*) = {slots} AND coalesce(bool_and(confirmed_flush_lsn >= {}::pg_lsn), false)) \
FROM pg_replication_slots WHERE starts_with(slot_name, {})",
        literal(lsn),
        literal(prefix)
    )
}

/// An LSN as PostgreSQL prints it (`16/B374D848`), or None.
pub fn lsn(text: &str) -> Option<&str> {
    let t = text.trim();
    let (hi, lo) = t.split_once('/')?;
    let hex = |s: &str| !s.is_empty() && s.len() <= 8 && s.chars().all(|c| c.is_ascii_hexdigit());
    (hex(hi) && hex(lo)).then_some(t)
}

/// Every sequence's state on blue, as JSON `[[schema, name, last_value,
/// is_called], …]` (`last_value` null for one never used).
pub const SEQUENCES: &str = "SELECT coalesce(json_agg(json_build_array(\
schemaname, sequencename, last_value, last_value IS NOT NULL)), '[]') FROM pg_sequences";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Sequence {
    pub schema: String,
    pub name: String,
    pub last_value: Option<i64>,
}

pub fn parse_sequences(json: &str) -> Result<Vec<Sequence>, String> {
    type Row = (String, String, Option<i64>, bool);
    let rows: Vec<Row> =
        serde_json::from_str(json.trim()).map_err(|e| format!("sequence list from blue: {e}"))?;
    Ok(rows
        .into_iter()
        .map(|(schema, name, last_value, _)| Sequence {
            schema,
            name,
            last_value,
        })
        .collect())
}

/// Green's sequences set to blue's (logical replication does not carry
/// them): green's next value is the one blue would have given. A
/// sequence blue never used is left at its start. Idempotent.
pub fn sync_sequences(seqs: &[Sequence]) -> String {
    seqs.iter()
        .filter_map(|s| {
            let v = s.last_value?;
            let name = format!("{}.{}", ident(&s.schema), ident(&s.name));
            Some(format!(
                "SELECT setval({}::regclass, {v}, true);\n",
                literal(&name)
            ))
        })
        .collect()
}

#[cfg(test)]
#[path = "blue_green_sql_tests.rs"]
mod tests;
