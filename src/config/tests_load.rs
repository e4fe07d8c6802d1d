//! Loading tests: defaults, environment overrides, error collection and lines.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use super::load::load_text_with_env;
use super::*;

/// A small valid config; tests append or replace lines to break it.
pub(super) const BASE: &str = r#"
[manager]
listen = "127.0.0.1:8080"

[[clusters]]
name = "a"
embedded = true
labels = { env = "prod" }

[[clusters]]
name = "b"
kubeconfig = "/etc/b.yaml"
"#;

pub(super) fn errors(toml: &str) -> ConfigErrors {
    load_str(toml, "t.toml").unwrap_err()
}

/// The 1-based line of the first line of `text` containing `needle`.
pub(super) fn ln(text: &str, needle: &str) -> Option<usize> {
    Some(text.lines().position(|l| l.contains(needle)).unwrap() + 1)
}

pub(super) fn find<'a>(errs: &'a ConfigErrors, key: &str) -> &'a ConfigError {
    errs.iter()
        .find(|e| e.key == key)
        .unwrap_or_else(|| panic!("no error for {key} in:\n{errs}"))
}

#[test]
fn the_role_set_example_is_accepted() {
    let example = include_str!("../../config/examples/role-sets.toml");
    let toml = format!("{EMBEDDED_DEFAULTS}\n{example}");
    let s = load_str(&toml, "fleet.toml").unwrap_or_else(|e| panic!("{e}"));
    let set = &s.roles["monitor"];
    assert_eq!(set.role, "monitor");
    assert_eq!(set.password_secret_namespace, "pgfleet-system");
    let r = &s.rollouts["rotate-monitor-2"];
    assert_eq!(
        (r.role_set.as_deref(), r.generation),
        (Some("monitor"), Some(2))
    );
    let summary = s.summary();
    assert!(
        summary.contains(
            "role set monitor: role \"monitor\" on PostgresClusters \"monitoring=on\", \
             password from Secret pgfleet-system/monitor-password (password-<N>)"
        ),
        "{summary}"
    );
    assert!(
        summary
            .contains("rollout rotate-monitor-2: to role set monitor generation 2 in 2 stage(s)"),
        "{summary}"
    );
}

#[test]
fn role_set_mistakes_name_their_keys() {
    let toml = format!(
        "{EMBEDDED_DEFAULTS}\n[roles.Bad_Set]\nrole = \"postgres\"\nconection_limit = 3\n\
         valid_until = \"tomorrow\"\n\n[rollouts.rot]\nrole_set = \"nope\"\n\
         target_version = \"15.19\"\n[[rollouts.rot.stages]]\nname = \"a\"\nclusters = \"\"\n"
    );
    let errs = load_str(&toml, "t.toml").unwrap_err();
    let text = errs.to_string();
    for part in [
        "roles.Bad_Set: role set name",
        "roles.Bad_Set.role: role \"postgres\" is reserved",
        "roles.Bad_Set.postgresclusters: is required",
        "roles.Bad_Set.password_secret: is required",
        "roles.Bad_Set.valid_until: must be an RFC 3339 time",
        "did you mean \"connection_limit\"",
        "rollouts.rot.target_version: a rollout has either target_version or role_set",
        "rollouts.rot.role_set: names no [roles.<set>] section",
        "rollouts.rot.generation: is required with role_set",
    ] {
        assert!(text.contains(part), "{part:?} missing in:\n{text}");
    }
}

#[test]
fn default_file_loads() {
    let s = load_str(EMBEDDED_DEFAULTS, "fleet.toml").unwrap();
    let names: Vec<&str> = s.clusters.iter().map(|c| c.name.as_str()).collect();
    assert_eq!(names, ["sim-eu-1", "sim-us-1", "sim-staging-1"]);
    assert!(
        s.clusters
            .iter()
            .all(|c| c.source() == ClusterSource::Embedded)
    );
    assert_eq!(s.cluster("sim-us-1").unwrap().labels["wave"], "3");
    assert_eq!(s.manager.listen_addr().to_string(), "127.0.0.1:8080");
    assert_eq!(s.manager.probe_interval.get(), Duration::from_secs(5));
    assert_eq!(s.backups.start_deadline.get(), Duration::from_secs(3600));
    assert!(matches!(
        s.backup_repository(),
        Repository::Filesystem { .. }
    ));
    let r = &s.rollouts["minor-15-19"];
    assert_eq!(
        r.version(),
        PgVersion {
            major: 15,
            minor: Some(19)
        }
    );
    assert_eq!(r.on_failure.get(), OnFailure::Pause);
    assert_eq!(r.stages[0].max_concurrency.get(), Concurrency::Count(1));
    assert_eq!(r.stages[1].max_concurrency.get(), Concurrency::Percent(25));
    assert_eq!(r.stages[1].soak.get(), Duration::from_secs(300));
    let staging = &s.cluster("sim-staging-1").unwrap().labels;
    assert!(r.stages[0].selects(staging) && !r.stages[1].selects(staging));
}

#[test]
fn defaults_apply_to_missing_keys() {
    let s = load_str(BASE, "t.toml").unwrap();
    assert_eq!(s.manager.shards_per_cluster, 4);
    assert_eq!(s.manager.embedded.runtime.get(), EmbeddedRuntime::Virtual);
    assert_eq!(s.telemetry.protocol.get(), OtlpProtocol::HttpProtobuf);
    assert_eq!(s.backups.retention.count, Some(14));
    assert_eq!(s.backups.drills.query, "SELECT 1");
    assert_eq!(
        s.backup_repository(),
        Repository::Filesystem {
            path: ".pgfleet/backups".into()
        }
    );
    let b = s.cluster("b").unwrap();
    assert_eq!(b.effective_qps(&s.manager), 50.0);
    assert!(matches!(
        b.source(),
        ClusterSource::Kubeconfig { context: None, .. }
    ));
}

#[test]
fn env_overrides_nested_keys() {
    let env = [
        ("PGFLEET_MANAGER__LISTEN", "0.0.0.0:9000"),
        ("PGFLEET_MANAGER__TLS_CERT_FILE", "/etc/pgfleet/tls/tls.crt"),
        ("PGFLEET_MANAGER__TLS_KEY_FILE", "/etc/pgfleet/tls/tls.key"),
        ("PGFLEET_TELEMETRY__OTLP_ENDPOINT", "http://collector:4318"),
        ("PGFLEET_MANAGER__EMBEDDED__RUNTIME", "process"),
        ("PGFLEET_ROLLOUTS__MINOR-15-19__TARGET_VERSION", "\"15.21\""),
        (
            "PGFLEET_CONFIG",
            "ignored: not a section, reserved for the CLI",
        ),
        (
            "PGFLEET_CLUSTERS",
            "[{ name = \"only\", embedded = true, labels = { env = \"dev\" } }]",
        ),
        ("OTHER__VAR", "ignored: no prefix"),
    ];
    let s = load_text_with_env(EMBEDDED_DEFAULTS, "fleet.toml", env).unwrap();
    assert_eq!(s.manager.listen_addr().to_string(), "0.0.0.0:9000");
    assert_eq!(
        s.telemetry.otlp_endpoint.as_deref(),
        Some("http://collector:4318")
    );
    assert_eq!(s.manager.embedded.runtime.get(), EmbeddedRuntime::Process);
    assert_eq!(s.rollouts["minor-15-19"].version().minor, Some(21));
    // Untouched keys keep the file's values; a whole array is replaced.
    assert_eq!(s.manager.workers_per_cluster, 8);
    assert_eq!(s.clusters.len(), 1);
    assert_eq!(s.clusters[0].labels["env"], "dev");
}

#[test]
fn env_errors_name_the_variable() {
    let env = [
        ("PGFLEET_MANAGER__PROBE_INTERVAL", "soon"),
        ("PGFLEET_MANAGER__LISTN", "0.0.0.0:1"),
        ("PGFLEET_ROLLOUTS__R__TARGET_VERSION", "15.20"),
    ];
    let errs = load_text_with_env(BASE, "t.toml", env).unwrap_err();
    let e = find(&errs, "manager.probe_interval");
    assert_eq!(e.source_name, "env PGFLEET_MANAGER__PROBE_INTERVAL");
    assert_eq!(e.line, None);
    assert!(
        e.to_string()
            .starts_with("env PGFLEET_MANAGER__PROBE_INTERVAL: manager.probe_interval: ")
    );
    let e = find(&errs, "manager.listn");
    assert_eq!(
        e.message,
        "unknown key \"listn\" (did you mean \"listen\"?)"
    );
    // An unquoted 15.20 arrives as the float 15.2; it must be rejected, not truncated.
    let e = find(&errs, "rollouts.r.target_version");
    assert!(e.message.contains("quoted string"), "{}", e.message);
    assert_eq!(e.source_name, "env PGFLEET_ROLLOUTS__R__TARGET_VERSION");
    // The rollout exists only in the environment: its missing stages are
    // attributed to the environment too, not to a line of the file.
    assert_eq!(
        find(&errs, "rollouts.r.stages").source_name,
        "env PGFLEET_ROLLOUTS__R__STAGES"
    );
    assert_eq!(errs.len(), 4, "{errs}");
}

#[test]
fn unknown_keys_at_all_depths_are_reported_at_once() {
    let toml = r#"
[manager]
listen = "127.0.0.1:8080"
shards = 4

[manager.embedded]
runtme = "virtual"

[[clusters]]
name = "a"
embedded = true

[[clusters]]
name = "b"
embedded = true
lables = { env = "prod" }

[backups]
repository = { s3 = { bucket = "bkt", endpoint = "https://minio:9000", region = "x", buckt = "y" } }

[rollouts.r1]
target_version = "15.20"
[[rollouts.r1.stages]]
name = "one"
clusters = ""
[[rollouts.r1.stages]]
name = "two"
clusters = "env=prod"
sok = "1m"

[bakups]
x = 1
"#;
    let errs = errors(toml);
    let expect = [
        ("manager.shards", "shards =", "unknown key \"shards\""),
        (
            "manager.embedded.runtme",
            "runtme",
            "unknown key \"runtme\" (did you mean \"runtime\"?)",
        ),
        (
            "clusters[1].lables",
            "lables",
            "unknown key \"lables\" (did you mean \"labels\"?)",
        ),
        (
            "backups.repository.s3.buckt",
            "buckt",
            "unknown key \"buckt\" (did you mean \"bucket\"?)",
        ),
        (
            "rollouts.r1.stages[1].sok",
            "sok =",
            "unknown key \"sok\" (did you mean \"soak\"?)",
        ),
        (
            "bakups",
            "[bakups]",
            "unknown key \"bakups\" (did you mean \"backups\"?)",
        ),
    ];
    assert_eq!(errs.len(), expect.len(), "{errs}");
    for (key, needle, message) in expect {
        let e = find(&errs, key);
        assert_eq!(
            (e.line, e.message.as_str()),
            (ln(toml, needle), message),
            "{key}"
        );
    }
    // Sorted by line, one per line, in the documented format.
    let text = errs.to_string();
    let first = text.lines().next().unwrap();
    assert_eq!(first, "t.toml:4: manager.shards: unknown key \"shards\"");
    assert_eq!(ln(toml, "shards ="), Some(4));
    assert_eq!(text.lines().count(), expect.len());
}

#[test]
fn bad_durations_crons_and_enums_are_named_with_lines() {
    let toml = format!(
        "{BASE}\n[backups]\ndefault_schedule = \"0 25 * * *\"\nwindow = \"2 hours-ish\"\n\
         overrides = [\n  {{ selector = \"env=prod\", schedule = \"* * *\" }},\n]\n\
         [telemetry]\nprotocol = \"udp\"\nsampling_ratio = 1.5\n"
    );
    let errs = errors(&toml);
    let cron = find(&errs, "backups.default_schedule");
    assert_eq!(cron.line, ln(&toml, "0 25"));
    assert!(
        cron.message
            .contains("\"0 25 * * *\" is not a cron expression"),
        "{}",
        cron.message
    );
    assert_eq!(find(&errs, "backups.window").line, ln(&toml, "2 hours"));
    // Inside a multi-line array of inline tables: the element's line.
    assert_eq!(
        find(&errs, "backups.overrides[0].schedule").line,
        ln(&toml, "schedule = \"* * *\"")
    );
    let proto = find(&errs, "telemetry.protocol");
    assert_eq!(proto.line, ln(&toml, "udp"));
    assert!(
        proto
            .message
            .ends_with("expected one of \"http/protobuf\", \"grpc\""),
        "{}",
        proto.message
    );
    assert_eq!(
        find(&errs, "telemetry.sampling_ratio").line,
        ln(&toml, "1.5")
    );
    assert_eq!(errs.len(), 5, "{errs}");
}

#[test]
fn duplicate_cluster_names() {
    let toml = format!("{BASE}\n[[clusters]]\nname = \"a\"\nembedded = true\n");
    let errs = errors(&toml);
    let e = find(&errs, "clusters[2].name");
    let lines: Vec<&str> = toml.lines().collect();
    let last_a = lines.iter().rposition(|l| *l == "name = \"a\"").unwrap() + 1;
    assert_eq!(e.line, Some(last_a));
    assert_eq!(
        e.message,
        "duplicate cluster name \"a\" (already used by clusters[0])"
    );
    assert_eq!(errs.len(), 1, "{errs}");
}

#[test]
fn kubeconfig_and_embedded_are_exclusive() {
    let toml = format!(
        "{BASE}\n[[clusters]]\nname = \"c\"\nembedded = true\nkubeconfig = \"/x\"\n\n\
         [[clusters]]\nname = \"Bad_Name\"\n"
    );
    let errs = errors(&toml);
    let both = find(&errs, "clusters[2]");
    assert_eq!(both.line, ln(&toml, "name = \"c\"").map(|l| l - 1));
    assert!(both.message.contains("both"), "{}", both.message);
    let neither = find(&errs, "clusters[3]");
    assert_eq!(neither.line, ln(&toml, "Bad_Name").map(|l| l - 1));
    assert!(
        neither.message.contains("exactly one"),
        "{}",
        neither.message
    );
    assert!(find(&errs, "clusters[3].name").message.contains("DNS-1123"));
    assert_eq!(errs.len(), 3, "{errs}");
}

#[test]
fn empty_cluster_list_and_missing_required_keys() {
    let errs = errors("[rollouts.r]\n[[rollouts.r.stages]]\nmax_concurrency = 0\n");
    assert_eq!(find(&errs, "clusters").line, None);
    assert_eq!(find(&errs, "rollouts.r.target_version").line, Some(1));
    assert_eq!(find(&errs, "rollouts.r.stages[0].name").line, Some(2));
    assert_eq!(find(&errs, "rollouts.r.stages[0].clusters").line, Some(2));
    assert_eq!(
        find(&errs, "rollouts.r.stages[0].max_concurrency").line,
        Some(3)
    );
    assert_eq!(errs.len(), 5, "{errs}");
    assert!(errs.to_string().ends_with("t.toml: clusters: at least one [[clusters]] entry is required (see config/fleet.toml for embedded ones)"));
}
