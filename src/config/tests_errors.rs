//! Error-reporting tests: type errors, credentials, unreadable files and
//! semantic checks.

#![allow(clippy::unwrap_used)]

use super::load::load_text_with_env;
use super::tests_load::{BASE, errors, find, ln};
use super::*;

#[test]
fn type_errors_name_key_and_line() {
    let toml = BASE.replace(
        "listen = \"127.0.0.1:8080\"",
        "listen = \"x\"\nworkers_per_cluster = \"eight\"\nqps_typo = 1",
    );
    let errs = errors(&toml);
    let e = find(&errs, "manager.workers_per_cluster");
    assert_eq!(e.line, ln(&toml, "eight"));
    assert!(e.message.contains("invalid type"), "{}", e.message);
    // Unknown keys seen before the type error are still reported.
    assert_eq!(find(&errs, "manager.qps_typo").line, ln(&toml, "qps_typo"));
}

#[test]
fn secrets_are_never_echoed() {
    let toml = format!(
        "{BASE}\n[backups.repository.s3]\nbucket = \"bkt\"\nendpoint = \"https://m:9000\"\n\
         region = \"r\"\ncredentials_secret = 987654321\n"
    );
    let errs = errors(&toml);
    let e = find(&errs, "backups.repository.s3.credentials_secret");
    assert_eq!(e.line, ln(&toml, "987654321"));
    assert!(!errs.to_string().contains("987654321"), "{errs}");

    let toml = BASE.replace(
        "[manager]\n",
        "[manager]\napi_token = \"hunter2-very-secret\n",
    );
    let errs = errors(&toml);
    assert_eq!(errs.errors[0].line, ln(&toml, "hunter2"), "{errs}");
    assert!(!errs.to_string().contains("hunter2"), "{errs}");

    // A numeric-looking token from the environment is kept verbatim and never shown.
    // (Long enough to be accepted as a token: short ones are refused.)
    for token in [
        "01234567890123456789012345678901",
        "123456789e123456789e123456789e1234",
        "\"quoted-0123456789abcdef0123456789\"",
    ] {
        let env = [("PGFLEET_MANAGER__API_TOKEN", token)];
        let s = load_text_with_env(EMBEDDED_DEFAULTS, "fleet.toml", env).unwrap();
        assert_eq!(s.manager.api_token.as_ref().unwrap().expose(), token);
    }
    let env = [(
        "PGFLEET_MANAGER__API_TOKEN",
        "01234567890123456789012345678901",
    )];
    let s = load_with_env(None, env).unwrap();
    assert!(!format!("{s:?}").contains("0123456"));
    assert!(!s.summary().contains("0123456"));
}

#[test]
fn missing_file_is_reported() {
    let errs = load_with_env(
        Some(std::path::Path::new("/nonexistent/fleet.toml")),
        Vec::<(String, String)>::new(),
    )
    .unwrap_err();
    assert_eq!(errs.len(), 1);
    assert!(
        errs.to_string()
            .starts_with("/nonexistent/fleet.toml: cannot read the config file")
    );
}

#[test]
fn semantic_checks() {
    let toml = format!(
        "{BASE}\n[manager.extra]\n\n[backups]\nretention = {{ count = 0 }}\nrepository = {{}}\n\n\
         [rollouts.Bad]\ntarget_version = \"15.1.2\"\nstages = [{{ name = \"x\", clusters = \"env in (a\" }}, {{ name = \"x\", clusters = \"\" }}]\n"
    );
    let errs = errors(&toml);
    for key in [
        "manager.extra",
        "backups.retention.count",
        "backups.repository",
        "rollouts.Bad",
        "rollouts.Bad.target_version",
        "rollouts.Bad.stages[0].clusters",
        "rollouts.Bad.stages[1].name",
    ] {
        find(&errs, key);
    }
    assert_eq!(errs.len(), 7, "{errs}");
}

#[test]
fn lease_timings_must_let_a_holder_stop_before_a_takeover() {
    let toml = BASE.replace(
        "[manager]\n",
        "[manager]\nidentity = \" \"\nlease_duration = \"3s\"\nrenew_deadline = \"3s\"\nretry_period = \"5s\"\n",
    );
    let errs = errors(&toml);
    assert!(
        find(&errs, "manager.renew_deadline")
            .message
            .contains("lease_duration")
    );
    assert!(
        find(&errs, "manager.retry_period")
            .message
            .contains("renew_deadline")
    );
    assert_eq!(find(&errs, "manager.identity").line, ln(&toml, "identity"));
    let ok = BASE.replace(
        "[manager]\n",
        "[manager]\nidentity = \"m1\"\nlease_duration = \"3s\"\nrenew_deadline = \"2s\"\nretry_period = \"500ms\"\n",
    );
    let s = load_str(&ok, "t.toml").unwrap();
    assert_eq!(s.manager.identity.as_deref(), Some("m1"));
}

#[test]
fn a_major_rollout_method_is_checked() {
    let rollout = |method: &str| {
        format!(
            "{BASE}\n[rollouts.major]\ntarget_version = \"18\"\nmethod = \"{method}\"\n\
             stages = [{{ name = \"all\", clusters = \"\" }}]\n"
        )
    };
    let s = crate::config::load_str(&rollout("inPlace"), "t").unwrap();
    let r = &s.rollouts["major"];
    assert_eq!(r.version().to_string(), "18");
    assert_eq!(r.major_method(), Some(choices::MajorMethod::InPlace));
    let s = crate::config::load_str(&rollout("blueGreen"), "t").unwrap();
    let r = &s.rollouts["major"];
    assert_eq!(r.major_method(), Some(choices::MajorMethod::BlueGreen));
    let errs = errors(&rollout("offline"));
    let e = find(&errs, "rollouts.major.method");
    assert!(e.message.contains("inPlace"), "{}", e.message);
}
