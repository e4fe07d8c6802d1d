//! Which postgresql.conf parameters a tenant may set, and how a value is
//! rendered so that it can never leave its line.
//!
//! An allowlist, not a denylist: every spec field is untrusted input
//! (docs/security.md), and PostgreSQL grows new parameters that run
//! commands, load libraries or read files with every release
//! (`archive_library` in 15, `include_*` directives). A parameter that is
//! not listed here is `Invalid`; docs/operations.md carries the list.

use std::collections::BTreeMap;

/// At most this many entries in `spec.postgresql.parameters` (CRD
/// `maxProperties`, checked again here).
pub const MAX_PARAMETERS: usize = 64;
/// Longest parameter value (CRD `maxLength`, checked again here).
pub const MAX_VALUE_LEN: usize = 1024;

/// What a tenant may tune: memory, planner, autovacuum, checkpoints and WAL
/// volume, logging to the server log, timeouts, locale and client defaults,
/// connection limits. Sorted (binary search; a unit test keeps it sorted).
///
/// Left out on purpose: anything naming a file, directory, command or
/// library (`*_command`, `*_library`, `*_preload_libraries`,
/// `dynamic_library_path`, `*_file`, `*_directory`, `log_directory`,
/// `ssl*`), the `include*` directives, what the instance contract sets
/// (`listen_addresses`, `port`, `unix_socket_*`, `archive_*`,
/// `primary_*`, `recovery_*`, `restore_command`, `wal_level`,
/// `hot_standby`, `wal_log_hints`, `synchronous_standby_names`), what
/// makes crash recovery or pg_rewind unsafe (`fsync`, `full_page_writes`),
/// and what could lock the manager out (`superuser_reserved_connections`,
/// `reserved_connections`, `default_transaction_read_only`).
pub const TENANT_PARAMETERS: &[&str] = &[
    "application_name",
    "archive_timeout",
    "array_nulls",
    "authentication_timeout",
    "autovacuum",
    "autovacuum_analyze_scale_factor",
    "autovacuum_analyze_threshold",
    "autovacuum_freeze_max_age",
    "autovacuum_max_workers",
    "autovacuum_multixact_freeze_max_age",
    "autovacuum_naptime",
    "autovacuum_vacuum_cost_delay",
    "autovacuum_vacuum_cost_limit",
    "autovacuum_vacuum_insert_scale_factor",
    "autovacuum_vacuum_insert_threshold",
    "autovacuum_vacuum_scale_factor",
    "autovacuum_vacuum_threshold",
    "autovacuum_work_mem",
    "backend_flush_after",
    "bgwriter_delay",
    "bgwriter_flush_after",
    "bgwriter_lru_maxpages",
    "bgwriter_lru_multiplier",
    "bytea_output",
    "checkpoint_completion_target",
    "checkpoint_flush_after",
    "checkpoint_timeout",
    "checkpoint_warning",
    "client_connection_check_interval",
    "client_encoding",
    "client_min_messages",
    "commit_delay",
    "commit_siblings",
    "compute_query_id",
    "constraint_exclusion",
    "cpu_index_tuple_cost",
    "cpu_operator_cost",
    "cpu_tuple_cost",
    "cursor_tuple_fraction",
    "datestyle",
    "deadlock_timeout",
    "default_statistics_target",
    "default_text_search_config",
    "default_toast_compression",
    "default_transaction_deferrable",
    "default_transaction_isolation",
    "effective_cache_size",
    "effective_io_concurrency",
    "enable_async_append",
    "enable_bitmapscan",
    "enable_gathermerge",
    "enable_group_by_reordering",
    "enable_hashagg",
    "enable_hashjoin",
    "enable_incremental_sort",
    "enable_indexonlyscan",
    "enable_indexscan",
    "enable_material",
    "enable_memoize",
    "enable_mergejoin",
    "enable_nestloop",
    "enable_parallel_append",
    "enable_parallel_hash",
    "enable_partition_pruning",
    "enable_partitionwise_aggregate",
    "enable_partitionwise_join",
    "enable_presorted_aggregate",
    "enable_seqscan",
    "enable_sort",
    "enable_tidscan",
    "extra_float_digits",
    "from_collapse_limit",
    "geqo",
    "geqo_effort",
    "geqo_generations",
    "geqo_pool_size",
    "geqo_seed",
    "geqo_selection_bias",
    "geqo_threshold",
    "gin_fuzzy_search_limit",
    "gin_pending_list_limit",
    "hash_mem_multiplier",
    "hot_standby_feedback",
    "huge_pages",
    "idle_in_transaction_session_timeout",
    "idle_session_timeout",
    "intervalstyle",
    "jit",
    "jit_above_cost",
    "jit_inline_above_cost",
    "jit_optimize_above_cost",
    "join_collapse_limit",
    "lc_messages",
    "lc_monetary",
    "lc_numeric",
    "lc_time",
    "lock_timeout",
    "log_autovacuum_min_duration",
    "log_checkpoints",
    "log_connections",
    "log_disconnections",
    "log_duration",
    "log_error_verbosity",
    "log_line_prefix",
    "log_lock_waits",
    "log_min_duration_sample",
    "log_min_duration_statement",
    "log_min_error_statement",
    "log_min_messages",
    "log_parameter_max_length",
    "log_parameter_max_length_on_error",
    "log_recovery_conflict_waits",
    "log_replication_commands",
    "log_statement",
    "log_statement_sample_rate",
    "log_temp_files",
    "log_timezone",
    "log_transaction_sample_rate",
    "logical_decoding_work_mem",
    "maintenance_io_concurrency",
    "maintenance_work_mem",
    "max_connections",
    "max_locks_per_transaction",
    "max_logical_replication_workers",
    "max_parallel_apply_workers_per_subscription",
    "max_parallel_maintenance_workers",
    "max_parallel_workers",
    "max_parallel_workers_per_gather",
    "max_pred_locks_per_page",
    "max_pred_locks_per_relation",
    "max_pred_locks_per_transaction",
    "max_prepared_transactions",
    "max_replication_slots",
    "max_slot_wal_keep_size",
    "max_stack_depth",
    "max_standby_archive_delay",
    "max_standby_streaming_delay",
    "max_sync_workers_per_subscription",
    "max_wal_senders",
    "max_wal_size",
    "max_worker_processes",
    "min_parallel_index_scan_size",
    "min_parallel_table_scan_size",
    "min_wal_size",
    "parallel_leader_participation",
    "parallel_setup_cost",
    "parallel_tuple_cost",
    "password_encryption",
    "plan_cache_mode",
    "random_page_cost",
    "search_path",
    "seq_page_cost",
    "shared_buffers",
    "statement_timeout",
    "synchronous_commit",
    "tcp_keepalives_count",
    "tcp_keepalives_idle",
    "tcp_keepalives_interval",
    "tcp_user_timeout",
    "temp_buffers",
    "temp_file_limit",
    "timezone",
    "track_activities",
    "track_activity_query_size",
    "track_commit_timestamp",
    "track_counts",
    "track_functions",
    "track_io_timing",
    "track_wal_io_timing",
    "vacuum_cost_delay",
    "vacuum_cost_limit",
    "vacuum_cost_page_dirty",
    "vacuum_cost_page_hit",
    "vacuum_cost_page_miss",
    "vacuum_failsafe_age",
    "vacuum_freeze_min_age",
    "vacuum_freeze_table_age",
    "vacuum_multixact_failsafe_age",
    "vacuum_multixact_freeze_min_age",
    "vacuum_multixact_freeze_table_age",
    "wal_buffers",
    "wal_compression",
    "wal_keep_size",
    "wal_receiver_status_interval",
    "wal_receiver_timeout",
    "wal_sender_timeout",
    "wal_writer_delay",
    "wal_writer_flush_after",
    "work_mem",
];

/// Whether a tenant may set `name` (names are case-insensitive in
/// PostgreSQL; the spec must use the lower-case spelling).
pub fn tenant_may_set(name: &str) -> bool {
    TENANT_PARAMETERS.binary_search(&name).is_ok()
}

/// Why one `spec.postgresql.parameters` entry is refused, or `None`.
/// The reason never repeats the value (it may be megabytes long, or a
/// secret pasted in the wrong place).
pub fn refusal(name: &str, value: &str) -> Option<String> {
    if !tenant_may_set(name) {
        return Some(if super::MANAGED_PARAMETERS.contains(&name) {
            "is managed by pgfleet and cannot be set".into()
        } else {
            "is not a parameter a PostgresCluster may set (see the allowed list in docs/operations.md)".into()
        });
    }
    let len = value.chars().count();
    if len > MAX_VALUE_LEN {
        return Some(format!(
            "value is {len} characters long, at most {MAX_VALUE_LEN} are allowed"
        ));
    }
    if let Some((i, c)) = value.char_indices().find(|(_, c)| c.is_control()) {
        return Some(format!(
            "value contains a control character ({}) at byte {i}",
            c.escape_unicode()
        ));
    }
    None
}

/// How much of a tenant's text a message repeats.
pub const SHOWN_CHARS: usize = 64;

/// Tenant text for a condition, event or log line: at most
/// [`SHOWN_CHARS`] characters, control characters escaped, and how long it
/// really was when cut (a 5 MB value must not travel into every Event).
pub fn shown(s: &str) -> String {
    let n = s.chars().count();
    let head: String = s
        .chars()
        .take(SHOWN_CHARS)
        .flat_map(char::escape_debug)
        .collect();
    if n > SHOWN_CHARS {
        format!("{head}… ({n} characters)")
    } else {
        head
    }
}

/// A valid postgresql.conf parameter name (what the renderer accepts even
/// from pgfleet itself).
fn is_name(k: &str) -> bool {
    let mut chars = k.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c == '_')
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_' || c == '.')
}

/// Quotes a value for postgresql.conf: a single-quoted string in which
/// PostgreSQL reads `''` as a quote and backslash escapes (`\\`, `\n`,
/// octal). Control characters are escaped too, so the value stays on its
/// line whatever it holds (validation refuses them before this; NUL cannot
/// be represented and is dropped).
pub fn conf_value(v: &str) -> String {
    let mut out = String::with_capacity(v.len() + 2);
    out.push('\'');
    for c in v.chars() {
        match c {
            '\'' => out.push_str("''"),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\0' => {}
            c if (c as u32) < 0x20 || c as u32 == 0x7f => {
                out.push_str(&format!("\\{:03o}", c as u32));
            }
            c => out.push(c),
        }
    }
    out.push('\'');
    out
}

/// postgresql.conf from the effective parameters, one `name = 'value'`
/// line each. A name that is not a parameter name is left out rather than
/// rendered (validation reports it; the file must stay loadable).
pub fn render_postgresql_conf(params: &BTreeMap<String, String>) -> String {
    let mut out =
        String::from("# Rendered by pgfleet from the PostgresCluster spec; do not edit.\n");
    for (k, v) in params.iter().filter(|(k, _)| is_name(k)) {
        out.push_str(&format!("{k} = {}\n", conf_value(v)));
    }
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn the_allowlist_is_sorted_unique_and_excludes_what_pgfleet_sets() {
        assert!(TENANT_PARAMETERS.windows(2).all(|w| w[0] < w[1]));
        for m in super::super::MANAGED_PARAMETERS {
            assert!(!tenant_may_set(m), "{m}");
        }
    }

    #[test]
    fn dangerous_parameters_are_refused() {
        for p in [
            "archive_cleanup_command",
            "archive_library",
            "include",
            "include_if_exists",
            "include_dir",
            "shared_preload_libraries",
            "session_preload_libraries",
            "local_preload_libraries",
            "dynamic_library_path",
            "ssl_passphrase_command",
            "ssl_key_file",
            "log_directory",
            "config_file",
            "hba_file",
            "recovery_end_command",
            "primary_conninfo",
            "data_directory",
            "fsync",
            "synchronous_standby_names",
            "Work_Mem",
        ] {
            assert!(refusal(p, "x").is_some(), "{p} must be refused");
        }
        assert!(refusal("work_mem", "8MB").is_none());
        let reason = refusal("work_mem", "8MB\nshared_preload_libraries = 'x'").unwrap();
        assert!(reason.contains("control character"), "{reason}");
        assert!(!reason.contains("shared_preload"), "{reason}");
        let huge = "a".repeat(5 << 20);
        let reason = refusal("search_path", &huge).unwrap();
        assert!(reason.len() < 100, "{reason}");
    }

    #[test]
    fn values_are_quoted_on_one_line() {
        assert_eq!(conf_value(r"a'b\c"), r"'a''b\\c'");
        assert_eq!(conf_value("a\nb\u{1}"), r"'a\nb\001'");
        let mut p = BTreeMap::new();
        p.insert("bad name".to_string(), "x".to_string());
        p.insert("work_mem".to_string(), "4MB".to_string());
        let conf = render_postgresql_conf(&p);
        assert_eq!(conf.lines().count(), 2, "{conf}");
        assert!(conf.contains("work_mem = '4MB'\n"));
    }
}
