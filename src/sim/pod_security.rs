//! Pod Security admission, as kube-apiserver enforces it: a namespace labelled
//! `pod-security.kubernetes.io/enforce: baseline|restricted` refuses Pods that
//! break that level with a 403 naming every violated check. The emulator
//! enforces it so that "pgfleet's Pods pass restricted" stays a tested fact
//! instead of a claim (a platform team hands tenants namespaces labelled
//! restricted). Only Pod creation is checked; warn/audit labels and the
//! version label are accepted and ignored (always `latest`).
//!
//! Pure functions of the namespace and the Pod, no I/O: `cluster` reads the
//! namespace and calls [`admit`].

use crate::json_ptr::Ptr;
use serde_json::Value;

pub const ENFORCE_LABEL: &str = "pod-security.kubernetes.io/enforce";

/// A Pod Security Standards level.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Level {
    Privileged,
    Baseline,
    Restricted,
}

impl Level {
    /// The level a namespace enforces; None when it enforces nothing. An
    /// unknown value counts as restricted, as kube does (fail closed).
    pub fn of_namespace(ns: &Value) -> Option<Level> {
        let v = ns
            .ptr("/metadata/labels")
            .and_then(|l| l.get(ENFORCE_LABEL))
            .and_then(Value::as_str)?;
        Some(match v {
            "privileged" => Level::Privileged,
            "baseline" => Level::Baseline,
            _ => Level::Restricted,
        })
    }

    fn name(self) -> &'static str {
        match self {
            Level::Privileged => "privileged",
            Level::Baseline => "baseline",
            Level::Restricted => "restricted",
        }
    }
}

/// Capabilities baseline lets a container add (kube's default set).
const BASELINE_CAPS: &[&str] = &[
    "AUDIT_WRITE",
    "CHOWN",
    "DAC_OVERRIDE",
    "FOWNER",
    "FSETID",
    "KILL",
    "MKNOD",
    "NET_BIND_SERVICE",
    "SETFCAP",
    "SETGID",
    "SETPCAP",
    "SETUID",
    "SYS_CHROOT",
];

/// Volume types restricted allows.
const RESTRICTED_VOLUMES: &[&str] = &[
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
];

/// Checks `pod` against `level`; the error is the message of kube's 403,
/// `pods "x" is forbidden: violates PodSecurity "restricted:latest": ...`.
pub fn admit(level: Level, name: &str, pod: &Value) -> Result<(), String> {
    let v = violations(level, pod);
    if v.is_empty() {
        return Ok(());
    }
    Err(format!(
        "pods \"{name}\" is forbidden: violates PodSecurity \"{}:latest\": {}",
        level.name(),
        v.join(", ")
    ))
}

/// Every container of the Pod (init, regular, ephemeral) with its name.
fn containers(pod: &Value) -> Vec<(&str, &Value)> {
    ["initContainers", "containers", "ephemeralContainers"]
        .iter()
        .filter_map(|k| pod.ptr(&format!("/spec/{k}")).and_then(Value::as_array))
        .flatten()
        .map(|c| (c.get("name").and_then(Value::as_str).unwrap_or(""), c))
        .collect()
}

/// `container "a"` or `containers "a", "b"`.
fn named(what: &str, names: &[&str]) -> String {
    let list = names
        .iter()
        .map(|n| format!("{n:?}"))
        .collect::<Vec<_>>()
        .join(", ");
    let plural = if names.len() == 1 { "" } else { "s" };
    format!("{what}{plural} {list}")
}

fn flag(v: &Value, ptr: &str) -> Option<bool> {
    v.ptr(ptr).and_then(Value::as_bool)
}

fn str_list<'a>(v: &'a Value, ptr: &str) -> Vec<&'a str> {
    v.ptr(ptr)
        .and_then(Value::as_array)
        .map(|a| a.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default()
}

/// The violated checks, each as kube words it, in kube's order.
pub fn violations(level: Level, pod: &Value) -> Vec<String> {
    if level == Level::Privileged {
        return vec![];
    }
    let mut out = baseline(pod);
    if level == Level::Restricted {
        out.extend(restricted(pod));
    }
    out
}

fn baseline(pod: &Value) -> Vec<String> {
    let cs = containers(pod);
    let mut out = vec![];
    let hosts: Vec<String> = ["hostNetwork", "hostPID", "hostIPC"]
        .iter()
        .filter(|k| flag(pod, &format!("/spec/{k}")) == Some(true))
        .map(|k| format!("{k}=true"))
        .collect();
    if !hosts.is_empty() {
        out.push(format!("host namespaces ({})", hosts.join(", ")));
    }
    let privileged: Vec<&str> = cs
        .iter()
        .filter(|(_, c)| flag(c, "/securityContext/privileged") == Some(true))
        .map(|(n, _)| *n)
        .collect();
    if !privileged.is_empty() {
        out.push(format!(
            "privileged ({} must not set securityContext.privileged=true)",
            named("container", &privileged)
        ));
    }
    let mut bad_caps = vec![];
    for (n, c) in &cs {
        let added: Vec<&str> = str_list(c, "/securityContext/capabilities/add")
            .into_iter()
            .filter(|cap| !BASELINE_CAPS.contains(cap))
            .collect();
        if !added.is_empty() {
            bad_caps.push(format!(
                "container {n:?} must not include {} in securityContext.capabilities.add",
                quoted(&added)
            ));
        }
    }
    if !bad_caps.is_empty() {
        out.push(format!(
            "non-default capabilities ({})",
            bad_caps.join("; ")
        ));
    }
    let host_paths: Vec<&str> = volumes(pod)
        .into_iter()
        .filter(|(_, t)| *t == "hostPath")
        .map(|(n, _)| n)
        .collect();
    if !host_paths.is_empty() {
        out.push(format!(
            "hostPath volumes ({})",
            named("volume", &host_paths)
        ));
    }
    let mut ports = vec![];
    for (n, c) in &cs {
        let used: Vec<String> = c
            .get("ports")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|p| p.get("hostPort").and_then(Value::as_i64))
            .filter(|p| *p != 0)
            .map(|p| p.to_string())
            .collect();
        if !used.is_empty() {
            ports.push(format!("container {n:?} uses hostPort {}", used.join(", ")));
        }
    }
    if !ports.is_empty() {
        out.push(format!("hostPort ({})", ports.join("; ")));
    }
    let unconfined =
        |sc: &Value| sc.ptr("/seccompProfile/type").and_then(Value::as_str) == Some("Unconfined");
    if pod.ptr("/spec/securityContext").is_some_and(unconfined)
        || cs
            .iter()
            .any(|(_, c)| c.get("securityContext").is_some_and(unconfined))
    {
        out.push("seccompProfile (seccompProfile.type \"Unconfined\" is forbidden)".into());
    }
    out
}

/// `"A", "B"`.
fn quoted(items: &[&str]) -> String {
    items
        .iter()
        .map(|i| format!("{i:?}"))
        .collect::<Vec<_>>()
        .join(", ")
}

/// (volume name, type) for each volume: the one key besides `name`.
fn volumes(pod: &Value) -> Vec<(&str, &str)> {
    pod.ptr("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|v| {
            let name = v.get("name").and_then(Value::as_str).unwrap_or("");
            let ty = v.as_object()?.keys().find(|k| k.as_str() != "name")?;
            Some((name, ty.as_str()))
        })
        .collect()
}

fn restricted(pod: &Value) -> Vec<String> {
    let cs = containers(pod);
    let psc = pod.ptr("/spec/securityContext");
    let mut out = vec![];
    let bad_vols: Vec<String> = volumes(pod)
        .into_iter()
        .filter(|(_, t)| !RESTRICTED_VOLUMES.contains(t))
        .map(|(n, t)| format!("volume {n:?} uses restricted volume type {t:?}"))
        .collect();
    if !bad_vols.is_empty() {
        out.push(format!("restricted volume types ({})", bad_vols.join("; ")));
    }
    let escalating: Vec<&str> = cs
        .iter()
        .filter(|(_, c)| flag(c, "/securityContext/allowPrivilegeEscalation") != Some(false))
        .map(|(n, _)| *n)
        .collect();
    if !escalating.is_empty() {
        out.push(format!(
            "allowPrivilegeEscalation != false ({} must set securityContext.allowPrivilegeEscalation=false)",
            named("container", &escalating)
        ));
    }
    let mut caps = vec![];
    let no_drop: Vec<&str> = cs
        .iter()
        .filter(|(_, c)| !str_list(c, "/securityContext/capabilities/drop").contains(&"ALL"))
        .map(|(n, _)| *n)
        .collect();
    if !no_drop.is_empty() {
        caps.push(format!(
            "{} must set securityContext.capabilities.drop=[\"ALL\"]",
            named("container", &no_drop)
        ));
    }
    for (n, c) in &cs {
        let added: Vec<&str> = str_list(c, "/securityContext/capabilities/add")
            .into_iter()
            .filter(|cap| *cap != "NET_BIND_SERVICE")
            .collect();
        if !added.is_empty() {
            caps.push(format!(
                "container {n:?} must not include {} in securityContext.capabilities.add",
                quoted(&added)
            ));
        }
    }
    if !caps.is_empty() {
        out.push(format!("unrestricted capabilities ({})", caps.join("; ")));
    }
    out.extend(run_as_non_root(psc, &cs));
    let root_uid: Vec<&str> = cs
        .iter()
        .filter(|(_, c)| c.ptr("/securityContext/runAsUser").and_then(Value::as_i64) == Some(0))
        .map(|(n, _)| *n)
        .collect();
    let pod_root = psc.and_then(|s| s.get("runAsUser")).and_then(Value::as_i64) == Some(0);
    if pod_root || !root_uid.is_empty() {
        let mut who = vec![];
        if pod_root {
            who.push("pod must not set runAsUser=0".to_string());
        }
        if !root_uid.is_empty() {
            who.push(format!(
                "{} must not set runAsUser=0",
                named("container", &root_uid)
            ));
        }
        out.push(format!("runAsUser=0 ({})", who.join("; ")));
    }
    out.extend(seccomp(psc, &cs));
    out
}

/// runAsNonRoot must be true for every container, set on the Pod (and not
/// overridden to false) or on the container itself.
fn run_as_non_root(psc: Option<&Value>, cs: &[(&str, &Value)]) -> Option<String> {
    let pod_level = psc
        .and_then(|s| s.get("runAsNonRoot"))
        .and_then(Value::as_bool);
    let explicit_false: Vec<&str> = cs
        .iter()
        .filter(|(_, c)| flag(c, "/securityContext/runAsNonRoot") == Some(false))
        .map(|(n, _)| *n)
        .collect();
    let unset: Vec<&str> = cs
        .iter()
        .filter(|(_, c)| flag(c, "/securityContext/runAsNonRoot").is_none())
        .map(|(n, _)| *n)
        .collect();
    let mut why = vec![];
    if pod_level == Some(false) {
        why.push("pod must not set securityContext.runAsNonRoot=false".to_string());
    }
    if !explicit_false.is_empty() {
        why.push(format!(
            "{} must not set securityContext.runAsNonRoot=false",
            named("container", &explicit_false)
        ));
    }
    if pod_level != Some(true) && !unset.is_empty() {
        why.push(format!(
            "pod or {} must set securityContext.runAsNonRoot=true",
            named("container", &unset)
        ));
    }
    (!why.is_empty()).then(|| format!("runAsNonRoot != true ({})", why.join("; ")))
}

fn seccomp_type(sc: Option<&Value>) -> Option<&str> {
    sc.and_then(|s| s.ptr("/seccompProfile/type"))
        .and_then(Value::as_str)
}

/// seccompProfile.type must be RuntimeDefault or Localhost, on the Pod or
/// on every container.
fn seccomp(psc: Option<&Value>, cs: &[(&str, &Value)]) -> Option<String> {
    let ok = |t: &str| t == "RuntimeDefault" || t == "Localhost";
    let pod_ty = seccomp_type(psc);
    let mut why = vec![];
    if let Some(t) = pod_ty.filter(|t| !ok(t)) {
        why.push(format!(
            "pod must not set securityContext.seccompProfile.type to {t:?}"
        ));
    }
    let wrong: Vec<&str> = cs
        .iter()
        .filter(|(_, c)| seccomp_type(c.get("securityContext")).is_some_and(|t| !ok(t)))
        .map(|(n, _)| *n)
        .collect();
    if !wrong.is_empty() {
        why.push(format!(
            "{} must not set securityContext.seccompProfile.type to a value other than \"RuntimeDefault\" or \"Localhost\"",
            named("container", &wrong)
        ));
    }
    if !pod_ty.is_some_and(ok) {
        let unset: Vec<&str> = cs
            .iter()
            .filter(|(_, c)| seccomp_type(c.get("securityContext")).is_none())
            .map(|(n, _)| *n)
            .collect();
        if !unset.is_empty() {
            why.push(format!(
                "pod or {} must set securityContext.seccompProfile.type to \"RuntimeDefault\" or \"Localhost\"",
                named("container", &unset)
            ));
        }
    }
    (!why.is_empty()).then(|| format!("seccompProfile ({})", why.join("; ")))
}

#[cfg(test)]
#[path = "pod_security_tests.rs"]
mod tests;
