//! Turning a Pod's container spec into what the process runtime runs: the
//! local program an image stands for, the argv (`command` + `args` with
//! `$(VAR)` expansion), the environment (`value`, `fieldRef`,
//! `secretKeyRef`, `configMapKeyRef`, `envFrom`) and the bind mounts.
//!
//! Images are not pulled: the image table ([`super::images`], supplied by
//! the embedding program in `SimOptions::images`) says which local program an
//! image stands for (its `bin` directory goes first on PATH); every other
//! image runs its command as given with the host's tools.

use super::images::{self, ImageRule, ResolvedImage};
use super::probes::Probe;
use super::volumes;
use crate::cluster::Cluster;
use crate::json_ptr::Ptr;
use crate::resources::ResKey;
use crate::store::str_at;
use anyhow::{Context, bail};
use serde_json::Value;
use std::collections::HashMap;
use std::path::PathBuf;

const BASE_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// One bind mount inside a container's mount namespace.
#[derive(Debug, Clone, PartialEq)]
pub struct Mount {
    pub source: PathBuf,
    pub target: String,
    pub read_only: bool,
}

/// A container, resolved to what runs on this machine.
#[derive(Debug, Clone)]
pub struct ContainerSpec {
    pub name: String,
    pub image: String,
    pub argv: Vec<String>,
    pub env: Vec<(String, String)>,
    pub working_dir: String,
    pub mounts: Vec<Mount>,
    /// Named container ports (for named targetPorts and probes).
    pub ports: HashMap<String, u16>,
    pub readiness: Option<Probe>,
    pub liveness: Option<Probe>,
    pub startup: Option<Probe>,
}

/// Expands kubelet-style `$(VAR)` references; `$$(` is a literal `$(`, and
/// unknown variables stay as written.
pub fn expand(s: &str, env: &HashMap<String, String>) -> String {
    let mut out = String::with_capacity(s.len());
    let mut rest = s;
    while let Some(i) = rest.find('$') {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(after) = tail.strip_prefix("$$") {
            out.push('$');
            rest = after;
        } else if let Some(body) = tail.strip_prefix("$(")
            && let Some(end) = body.find(')')
        {
            let name = &body[..end];
            match env.get(name) {
                Some(v) => out.push_str(v),
                None => out.push_str(&tail[..end + 3]),
            }
            rest = &body[end + 1..];
        } else {
            out.push('$');
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

fn key(plural: &str) -> ResKey {
    ResKey {
        group: String::new(),
        plural: plural.into(),
    }
}

/// One key of a ConfigMap or Secret (decoded), None when absent.
fn object_key(c: &Cluster, plural: &str, ns: &str, name: &str, k: &str) -> Option<String> {
    let obj = c.store.get(&key(plural), ns, name)?;
    volumes::object_data(&obj.value(), plural == "secrets")
        .remove(k)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
}

/// Resolves one `env` entry; `Ok(None)` for an optional reference that is absent.
fn env_value(
    c: &Cluster,
    pod: &Value,
    e: &Value,
    env: &HashMap<String, String>,
) -> anyhow::Result<Option<String>> {
    let name = str_at(e, "/name");
    if let Some(v) = e.get("value").and_then(Value::as_str) {
        return Ok(Some(expand(v, env)));
    }
    let Some(from) = e.get("valueFrom") else {
        return Ok(Some(String::new()));
    };
    let ns = str_at(pod, "/metadata/namespace");
    if let Some(path) = from.ptr("/fieldRef/fieldPath").and_then(Value::as_str) {
        return volumes::field_value(pod, path)
            .map(Some)
            .with_context(|| format!("env {name}: unsupported fieldPath {path}"));
    }
    for (field, plural) in [
        ("secretKeyRef", "secrets"),
        ("configMapKeyRef", "configmaps"),
    ] {
        if let Some(r) = from.get(field) {
            let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
            let (obj, k) = (str_at(r, "/name"), str_at(r, "/key"));
            return match object_key(c, plural, ns, obj, k) {
                Some(v) => Ok(Some(v)),
                None if optional => Ok(None),
                None => bail!("env {name}: key {k} of {plural}/{obj} not found"),
            };
        }
    }
    if from.get("resourceFieldRef").is_some() {
        // No resource accounting here: report "unlimited" as kubelet does
        // without limits (the node's allocatable), approximated by 0.
        return Ok(Some("0".into()));
    }
    bail!("env {name}: unsupported valueFrom {from}")
}

/// The environment of a container: image defaults, then `envFrom`, then `env`.
fn environment(
    c: &Cluster,
    pod: &Value,
    ct: &Value,
    kind: &ResolvedImage,
    home: &str,
) -> anyhow::Result<Vec<(String, String)>> {
    let mut order: Vec<String> = vec![];
    let mut map: HashMap<String, String> = HashMap::new();
    let set = |order: &mut Vec<String>, map: &mut HashMap<String, String>, k: &str, v| {
        if map.insert(k.to_string(), v).is_none() {
            order.push(k.to_string());
        }
    };
    let path = match &kind.bin_dir {
        Some(bin) => format!("{}:{BASE_PATH}", bin.display()),
        None => BASE_PATH.to_string(),
    };
    let hostname = match str_at(pod, "/spec/hostname") {
        "" => str_at(pod, "/metadata/name"),
        h => h,
    };
    set(&mut order, &mut map, "PATH", path);
    set(&mut order, &mut map, "HOME", home.to_string());
    set(&mut order, &mut map, "HOSTNAME", hostname.to_string());
    set(&mut order, &mut map, "LANG", "C.UTF-8".into());
    for (k, v) in &kind.env {
        set(&mut order, &mut map, k, v.clone());
    }
    let ns = str_at(pod, "/metadata/namespace");
    for src in ct
        .get("envFrom")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let prefix = str_at(src, "/prefix");
        for (field, plural) in [("secretRef", "secrets"), ("configMapRef", "configmaps")] {
            let Some(r) = src.get(field) else { continue };
            let optional = r.get("optional").and_then(Value::as_bool).unwrap_or(false);
            let obj_name = str_at(r, "/name");
            match c.store.get(&key(plural), ns, obj_name) {
                Some(obj) => {
                    for (k, v) in volumes::object_data(&obj.value(), plural == "secrets") {
                        let v = String::from_utf8_lossy(&v).into_owned();
                        set(&mut order, &mut map, &format!("{prefix}{k}"), v);
                    }
                }
                None if optional => {}
                None => bail!("envFrom: {plural}/{obj_name} not found"),
            }
        }
    }
    for e in ct
        .get("env")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        if let Some(v) = env_value(c, pod, e, &map)? {
            set(&mut order, &mut map, str_at(e, "/name"), v);
        }
    }
    Ok(order
        .into_iter()
        .map(|k| {
            let v = map.remove(&k).unwrap_or_default();
            (k, v)
        })
        .collect())
}

fn strings(v: Option<&Value>) -> Vec<String> {
    v.and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}

/// The argv: `command` + `args`, or the image's default program.
fn argv(
    ct: &Value,
    kind: &ResolvedImage,
    env: &HashMap<String, String>,
) -> anyhow::Result<Vec<String>> {
    let mut command = strings(ct.get("command"));
    let args = strings(ct.get("args"));
    let program = kind.program.as_deref();
    if command.is_empty() {
        let Some(program) = program else {
            bail!(
                "image {} has no local entrypoint: give the container a command",
                str_at(ct, "/image")
            )
        };
        command = vec![program.to_string()];
        if args.is_empty() {
            command.extend(kind.default_args.iter().cloned());
        }
    } else if let Some(p) = program.filter(|p| p.starts_with('/')) {
        // The image's program by name or by its in-image path runs the local one.
        let file = p.rsplit('/').next().unwrap_or(p);
        if command
            .first()
            .is_some_and(|c| c == file || c.ends_with(&format!("/{file}")))
        {
            command[0] = p.to_string();
        }
    }
    Ok(command
        .into_iter()
        .chain(args)
        .map(|a| expand(&a, env))
        .collect())
}

/// Resolves one container of `pod` (whose `status.podIP` is already the
/// address the runtime gave it). `volume_dirs` maps volume names to their
/// directories on this machine.
pub fn resolve(
    c: &Cluster,
    pod: &Value,
    ct: &Value,
    volume_dirs: &HashMap<String, PathBuf>,
    home: &str,
    rules: &[ImageRule],
) -> anyhow::Result<ContainerSpec> {
    let name = str_at(ct, "/name").to_string();
    let image = str_at(ct, "/image").to_string();
    let kind = images::resolve(rules, &image);
    let env = environment(c, pod, ct, &kind, home)?;
    let env_map: HashMap<String, String> = env.iter().cloned().collect();
    let argv = argv(ct, &kind, &env_map)?;
    let mut mounts = vec![];
    for m in ct
        .get("volumeMounts")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let vol = str_at(m, "/name");
        let dir = volume_dirs
            .get(vol)
            .with_context(|| format!("container {name}: volume {vol} is not defined"))?;
        let sub = match str_at(m, "/subPathExpr") {
            "" => str_at(m, "/subPath").to_string(),
            e => expand(e, &env_map),
        };
        if sub.split('/').any(|p| p == "..") {
            bail!("container {name}: subPath {sub} may not contain '..'");
        }
        let source = if sub.is_empty() {
            dir.clone()
        } else {
            dir.join(sub.trim_start_matches('/'))
        };
        let target = str_at(m, "/mountPath").to_string();
        if !target.starts_with('/') {
            bail!("container {name}: mountPath {target} is not absolute");
        }
        mounts.push(Mount {
            source,
            target,
            read_only: m.get("readOnly").and_then(Value::as_bool).unwrap_or(false),
        });
    }
    // Parents first, so a mount below another mount stays visible.
    mounts.sort_by_key(|m| m.target.matches('/').count());
    let ports = ct
        .get("ports")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|p| {
            let n = p.get("containerPort")?.as_u64()?;
            Some((str_at(p, "/name").to_string(), u16::try_from(n).ok()?))
        })
        .collect();
    let probe = |field: &str| ct.get(field).and_then(Probe::from_spec);
    Ok(ContainerSpec {
        working_dir: match str_at(ct, "/workingDir") {
            "" => "/".into(),
            w => w.into(),
        },
        readiness: probe("readinessProbe"),
        liveness: probe("livenessProbe"),
        startup: probe("startupProbe"),
        name,
        image,
        argv,
        env,
        mounts,
        ports,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn an_image_program_replaces_the_command_of_the_same_name() {
        let kind = ResolvedImage {
            program: Some("/usr/sbin/proxy".into()),
            default_args: vec!["/etc/proxy.ini".into()],
            ..Default::default()
        };
        let env = HashMap::new();
        let argv = |ct: Value| argv(&ct, &kind, &env).unwrap();
        use serde_json::json;
        assert_eq!(argv(json!({})), ["/usr/sbin/proxy", "/etc/proxy.ini"]);
        assert_eq!(argv(json!({"args": ["-v"]})), ["/usr/sbin/proxy", "-v"]);
        assert_eq!(
            argv(json!({"command": ["/opt/proxy", "x"]})),
            ["/usr/sbin/proxy", "x"]
        );
        assert_eq!(argv(json!({"command": ["sh"]})), ["sh"]);
        let none = ResolvedImage::default();
        assert!(super::argv(&json!({"image": "x"}), &none, &env).is_err());
    }

    #[test]
    fn expansion_follows_kubelet_rules() {
        let env = HashMap::from([("A".to_string(), "x".to_string())]);
        assert_eq!(expand("$(A)-$(B)-$$(A)-$", &env), "x-$(B)-$(A)-$");
        assert_eq!(expand("plain", &env), "plain");
    }
}

/// `runAsUser` of the Pod's security context, else of its first container
/// that sets one.
pub(super) fn run_as_uid(pod: &Value) -> Option<u32> {
    let uid = |sc: Option<&Value>| {
        sc.and_then(|s| s.get("runAsUser"))
            .and_then(Value::as_u64)
            .and_then(|u| u32::try_from(u).ok())
    };
    uid(pod.ptr("/spec/securityContext")).or_else(|| {
        pod.ptr("/spec/containers")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .find_map(|c| uid(c.get("securityContext")))
    })
}

#[cfg(test)]
mod uid_tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn the_uid_comes_from_the_pod_then_its_containers() {
        let pod = json!({"spec": {"securityContext": {"runAsUser": 999},
            "containers": [{"name": "a", "securityContext": {"runAsUser": 1000}}]}});
        assert_eq!(run_as_uid(&pod), Some(999));
        let pod = json!({"spec": {"containers": [{"name": "a"},
            {"name": "b", "securityContext": {"runAsUser": 1000}}]}});
        assert_eq!(run_as_uid(&pod), Some(1000));
        let pod = json!({"spec": {"securityContext": {"runAsUser": -1}, "containers": []}});
        assert_eq!(run_as_uid(&pod), None);
        assert_eq!(
            run_as_uid(&json!({"spec": {"containers": [{"name": "a"}]}})),
            None
        );
    }
}
