//! Pod volumes as directories on this machine, bind-mounted into the
//! container's private mount namespace.
//!
//! - a PVC is `<runtime dir>/pvc/<namespace>/<claim>`: it outlives its Pods
//!   and goes away with the PVC; a claim of an enforced class is a tmpfs of
//!   its size there ([`super::capacity`]);
//! - configMap, secret, downwardAPI and projected volumes are materialised as
//!   files in a per-pod directory (each file replaced by rename, so readers
//!   never see half a file); downward API `labels`/`annotations` files are
//!   rewritten when the Pod's metadata changes, like kubelet does;
//! - emptyDir is a per-pod directory; hostPath is the host path itself.
//!
//! Everything a container may write is owned by the user containers run as.

use crate::cluster::Cluster;
use crate::json_ptr::Ptr;
use crate::resources::ResKey;
use crate::store::str_at;
use anyhow::{Context, bail};
use base64::Engine;
use serde_json::Value;
use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

/// The unprivileged user every container process runs as.
#[derive(Debug, Clone)]
pub struct RunUser {
    pub name: String,
    pub uid: u32,
    pub gid: u32,
    pub home: String,
}

/// Reads a user from /etc/passwd (no libc calls needed for this).
pub fn lookup_user(name: &str) -> anyhow::Result<RunUser> {
    let passwd = std::fs::read_to_string("/etc/passwd").context("reading /etc/passwd")?;
    match find_user(&passwd, |u| u.name == name)? {
        Some(u) => Ok(u),
        None => bail!("there is no user {name} on this machine"),
    }
}

/// The local user with this uid (`getpwuid` through /etc/passwd), if any.
pub fn lookup_uid(uid: u32) -> anyhow::Result<Option<RunUser>> {
    let passwd = std::fs::read_to_string("/etc/passwd").context("reading /etc/passwd")?;
    find_user(&passwd, |u| u.uid == uid)
}

/// The first entry of a passwd file that `pick` accepts.
fn find_user(passwd: &str, pick: impl Fn(&RunUser) -> bool) -> anyhow::Result<Option<RunUser>> {
    for line in passwd.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() < 6 {
            continue;
        }
        let (Ok(uid), Ok(gid)) = (f[2].parse(), f[3].parse()) else {
            continue;
        };
        let u = RunUser {
            name: f[0].to_string(),
            uid,
            gid,
            home: f[5].to_string(),
        };
        if pick(&u) {
            return Ok(Some(u));
        }
    }
    Ok(None)
}

impl RunUser {
    pub fn chown(&self, p: &Path) -> anyhow::Result<()> {
        std::os::unix::fs::chown(p, Some(self.uid), Some(self.gid))
            .with_context(|| format!("chown {} to {}", p.display(), self.name))
    }

    /// Creates a directory (and parents) owned by this user.
    pub fn dir(&self, p: &Path, mode: u32) -> anyhow::Result<()> {
        std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
            .with_context(|| format!("chmod {}", p.display()))?;
        self.chown(p)
    }
}

/// One file of a generated volume: path inside the volume, content, mode.
pub type File = (String, Vec<u8>, u32);

/// The decoded `data` (and `binaryData`) of a ConfigMap or Secret.
pub fn object_data(obj: &Value, base64_data: bool) -> BTreeMap<String, Vec<u8>> {
    let b64 = base64::engine::general_purpose::STANDARD;
    let mut out = BTreeMap::new();
    if let Some(m) = obj.get("data").and_then(Value::as_object) {
        for (k, v) in m {
            let s = v.as_str().unwrap_or_default();
            let bytes = if base64_data {
                b64.decode(s).unwrap_or_else(|_| s.as_bytes().to_vec())
            } else {
                s.as_bytes().to_vec()
            };
            out.insert(k.clone(), bytes);
        }
    }
    if let Some(m) = obj.get("binaryData").and_then(Value::as_object) {
        for (k, v) in m {
            if let Ok(b) = b64.decode(v.as_str().unwrap_or_default()) {
                out.insert(k.clone(), b);
            }
        }
    }
    out
}

/// `key="value"` lines, sorted, the way kubelet renders labels/annotations.
fn render_map(m: Option<&Value>) -> String {
    let mut out = String::new();
    for (k, v) in m.and_then(Value::as_object).into_iter().flatten() {
        let v = v.as_str().unwrap_or_default();
        let escaped = v
            .replace('\\', "\\\\")
            .replace('"', "\\\"")
            .replace('\n', "\\n");
        out.push_str(&format!("{k}=\"{escaped}\"\n"));
    }
    out.trim_end_matches('\n').to_string()
}

/// A downward API field of `pod` (status.podIP is already the runtime's).
pub fn field_value(pod: &Value, path: &str) -> Option<String> {
    let sub = |prefix: &str| {
        path.strip_prefix(prefix)?
            .strip_prefix("['")?
            .strip_suffix("']")
            .map(String::from)
    };
    if let Some(k) = sub("metadata.labels") {
        return Some(label(pod, "labels", &k));
    }
    if let Some(k) = sub("metadata.annotations") {
        return Some(label(pod, "annotations", &k));
    }
    Some(match path {
        "metadata.name" => str_at(pod, "/metadata/name").into(),
        "metadata.namespace" => str_at(pod, "/metadata/namespace").into(),
        "metadata.uid" => str_at(pod, "/metadata/uid").into(),
        "metadata.labels" => render_map(pod.ptr("/metadata/labels")),
        "metadata.annotations" => render_map(pod.ptr("/metadata/annotations")),
        "spec.nodeName" => str_at(pod, "/spec/nodeName").into(),
        "spec.serviceAccountName" => str_at(pod, "/spec/serviceAccountName").into(),
        "status.podIP" | "status.podIPs" => str_at(pod, "/status/podIP").into(),
        "status.hostIP" | "status.hostIPs" => "127.0.0.1".into(),
        _ => return None,
    })
}

fn label(pod: &Value, field: &str, k: &str) -> String {
    pod.ptr(&format!("/metadata/{field}"))
        .and_then(|m| m.get(k))
        .and_then(Value::as_str)
        .unwrap_or_default()
        .to_string()
}

/// Writes a file by rename (readers see the old or the new content). The
/// file is created with `mode` already (never briefly world-readable).
pub fn write_file(user: &RunUser, path: &Path, data: &[u8], mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::OpenOptionsExt;
    if let Some(parent) = path.parent() {
        user.dir(parent, 0o750)?;
    }
    let tmp = path.with_file_name(format!(
        ".{}.tmp",
        path.file_name().and_then(|n| n.to_str()).unwrap_or("file")
    ));
    let _ = std::fs::remove_file(&tmp);
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode & 0o777)
        .open(&tmp)
        .with_context(|| format!("writing {}", tmp.display()))?;
    f.write_all(data)
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode))?;
    user.chown(&tmp)?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))
}

fn mode_of(v: &Value, default: u32) -> u32 {
    v.get("mode")
        .and_then(Value::as_u64)
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(default)
}

/// The files one ConfigMap/Secret source contributes: (path, bytes, mode).
fn object_files(
    c: &Cluster,
    ns: &str,
    src: &Value,
    secret: bool,
    default_mode: u32,
) -> anyhow::Result<Vec<File>> {
    let plural = if secret { "secrets" } else { "configmaps" };
    let name = match str_at(src, "/secretName") {
        "" => str_at(src, "/name"),
        n => n,
    };
    let optional = src
        .get("optional")
        .and_then(Value::as_bool)
        .unwrap_or(false);
    let rk = ResKey {
        group: String::new(),
        plural: plural.into(),
    };
    let Some(obj) = c.store.get(&rk, ns, name) else {
        if optional {
            return Ok(vec![]);
        }
        bail!("{plural}/{name} not found");
    };
    let mut data = object_data(&obj.value(), secret);
    let mode = src
        .get("defaultMode")
        .and_then(Value::as_u64)
        .and_then(|m| u32::try_from(m).ok())
        .unwrap_or(default_mode);
    match src.get("items").and_then(Value::as_array) {
        Some(items) => items
            .iter()
            .filter_map(|it| {
                let k = str_at(it, "/key");
                match data.remove(k) {
                    Some(b) => Some(Ok((str_at(it, "/path").to_string(), b, mode_of(it, mode)))),
                    None if optional => None,
                    None => Some(Err(anyhow::anyhow!("key {k} not found in {plural}/{name}"))),
                }
            })
            .collect(),
        None => Ok(data.into_iter().map(|(k, b)| (k, b, mode)).collect()),
    }
}

/// The files of downward API items.
fn downward_files(pod: &Value, items: &[Value], mode: u32) -> anyhow::Result<Vec<File>> {
    items
        .iter()
        .map(|it| {
            let path = str_at(it, "/path").to_string();
            let value = match it.ptr("/fieldRef/fieldPath").and_then(Value::as_str) {
                Some(f) => {
                    field_value(pod, f).with_context(|| format!("unsupported fieldPath {f}"))?
                }
                None if it.get("resourceFieldRef").is_some() => "0".into(),
                None => bail!("downward API item {path} has no fieldRef"),
            };
            Ok((path, value.into_bytes(), mode_of(it, mode)))
        })
        .collect()
}

/// The mode of Secret files without `defaultMode`/`mode`: owner-only. Every
/// container of this runtime shares the host's filesystem, so a readable
/// file is readable by every other user of the machine (kubelet's 0644 is
/// safe only behind its own 0750 pod directories and mount namespaces).
/// The owner is the user containers run as, so the Pod still reads them.
pub const SECRET_MODE: u32 = 0o600;

/// The files a generated volume holds now; None for volumes that are plain
/// directories (PVC, emptyDir, hostPath).
pub fn generated_files(c: &Cluster, pod: &Value, vol: &Value) -> anyhow::Result<Option<Vec<File>>> {
    let ns = str_at(pod, "/metadata/namespace");
    let default_mode = |src: &Value, d: u32| {
        src.get("defaultMode")
            .and_then(Value::as_u64)
            .and_then(|m| u32::try_from(m).ok())
            .unwrap_or(d)
    };
    if let Some(src) = vol.get("configMap") {
        return object_files(c, ns, src, false, 0o644).map(Some);
    }
    if let Some(src) = vol.get("secret") {
        return object_files(c, ns, src, true, SECRET_MODE).map(Some);
    }
    if let Some(src) = vol.get("downwardAPI") {
        let items = src
            .get("items")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        return downward_files(pod, &items, default_mode(src, 0o644)).map(Some);
    }
    if let Some(src) = vol.get("projected") {
        let mode = default_mode(src, 0o644);
        // Credentials stay owner-only unless the Pod asks otherwise.
        let secret_mode = default_mode(src, SECRET_MODE);
        let mut files = vec![];
        for s in src
            .get("sources")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            if let Some(x) = s.get("secret") {
                files.extend(object_files(c, ns, x, true, secret_mode)?);
            } else if let Some(x) = s.get("configMap") {
                files.extend(object_files(c, ns, x, false, mode)?);
            } else if let Some(x) = s.get("downwardAPI") {
                let items = x
                    .get("items")
                    .and_then(Value::as_array)
                    .cloned()
                    .unwrap_or_default();
                files.extend(downward_files(pod, &items, mode)?);
            } else if let Some(x) = s.get("serviceAccountToken") {
                let path = match str_at(x, "/path") {
                    "" => "token",
                    p => p,
                };
                files.push((path.to_string(), b"sim-token".to_vec(), secret_mode));
            }
        }
        return Ok(Some(files));
    }
    Ok(None)
}

/// Where one Pod's generated volumes, /tmp, hosts file and logs live.
#[derive(Debug, Clone)]
pub struct PodDirs {
    pub root: PathBuf,
    pub pvc_root: PathBuf,
}

impl PodDirs {
    pub fn volume(&self, name: &str) -> PathBuf {
        self.root.join("volumes").join(name)
    }
    pub fn tmp(&self) -> PathBuf {
        self.root.join("tmp")
    }
    pub fn hosts(&self) -> PathBuf {
        self.root.join("hosts")
    }
    pub fn log(&self, container: &str) -> PathBuf {
        self.root.join("logs").join(format!("{container}.log"))
    }
    pub fn pvc(&self, ns: &str, claim: &str) -> PathBuf {
        self.pvc_root.join(ns).join(claim)
    }
}

/// Creates every volume of `pod` and returns volume name → directory.
/// Fails (to be retried) while a referenced PVC, ConfigMap or Secret is missing.
pub fn prepare(
    c: &Cluster,
    pod: &Value,
    dirs: &PodDirs,
    user: &RunUser,
) -> anyhow::Result<HashMap<String, PathBuf>> {
    let ns = str_at(pod, "/metadata/namespace");
    user.dir(&dirs.root, 0o755)?;
    user.dir(&dirs.tmp(), 0o1777)?;
    user.dir(&dirs.root.join("logs"), 0o755)?;
    let mut out = HashMap::new();
    for vol in pod
        .ptr("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = str_at(vol, "/name").to_string();
        let dir = if let Some(claim) = vol
            .ptr("/persistentVolumeClaim/claimName")
            .and_then(Value::as_str)
        {
            let rk = ResKey {
                group: String::new(),
                plural: "persistentvolumeclaims".into(),
            };
            let obj = match c.store.get(&rk, ns, claim) {
                Some(p) if !p.is_deleting() => p,
                _ => bail!("persistentvolumeclaim {claim} not found"),
            };
            let d = dirs.pvc(ns, claim);
            if let Some(size) = super::capacity::enforced_bytes(c, &obj.value()) {
                super::capacity::mount(&d, size);
            }
            user.dir(&d, 0o750)?;
            d
        } else if let Some(p) = vol.ptr("/hostPath/path").and_then(Value::as_str) {
            PathBuf::from(p)
        } else if vol.get("emptyDir").is_some() {
            let d = dirs.volume(&name);
            user.dir(&d, 0o777)?;
            d
        } else {
            let d = dirs.volume(&name);
            let files = generated_files(c, pod, vol)
                .with_context(|| format!("volume {name}"))?
                .with_context(|| format!("volume {name}: unsupported volume type"))?;
            // Not listable by other users of the machine (it may hold Secrets).
            user.dir(&d, 0o750)?;
            for (path, data, mode) in files {
                if path.split('/').any(|p| p == "..") || path.starts_with('/') {
                    bail!("volume {name}: bad item path {path}");
                }
                write_file(user, &d.join(&path), &data, mode)?;
            }
            d
        };
        out.insert(name, dir);
    }
    Ok(out)
}

/// Rewrites the generated volumes whose content depends on `pod` metadata or
/// on ConfigMaps/Secrets (called when those change). Files whose key left
/// the source are removed, as kubelet's atomic update does (a replica
/// cluster's `replica-source` going away is what lets it be promoted).
pub fn refresh(c: &Cluster, pod: &Value, dirs: &PodDirs, user: &RunUser) {
    for vol in pod
        .ptr("/spec/volumes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let name = str_at(vol, "/name");
        let Ok(Some(files)) = generated_files(c, pod, vol) else {
            continue;
        };
        let d = dirs.volume(name);
        let keep: std::collections::HashSet<PathBuf> = files.iter().map(|f| d.join(&f.0)).collect();
        remove_stale(&d, &keep);
        for (path, data, mode) in files {
            let p = d.join(&path);
            if std::fs::read(&p).is_ok_and(|cur| cur == data) {
                continue;
            }
            if let Err(e) = write_file(user, &p, &data, mode) {
                tracing::warn!(error = %format!("{e:#}"), volume = name, "refreshing a pod volume");
            }
        }
    }
}

/// Removes the files under `dir` not in `keep` (temporary files of a
/// write in progress excepted).
fn remove_stale(dir: &Path, keep: &std::collections::HashSet<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        let tmp = e.file_name().to_str().is_some_and(|n| n.ends_with(".tmp"));
        match e.file_type() {
            Ok(t) if t.is_dir() => remove_stale(&p, keep),
            Ok(_) if !tmp && !keep.contains(&p) => {
                if let Err(err) = std::fs::remove_file(&p) {
                    tracing::warn!(path = %p.display(), error = %err, "removing a stale volume file");
                }
            }
            _ => {}
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn files_whose_key_left_the_source_are_removed() {
        let d = std::env::temp_dir().join(format!("pgfleet-stale-{}", std::process::id()));
        std::fs::create_dir_all(d.join("sub")).unwrap();
        for f in ["a", "b", "sub/c", ".x.tmp"] {
            std::fs::write(d.join(f), "1").unwrap();
        }
        let keep = [d.join("a"), d.join("sub/c")].into_iter().collect();
        remove_stale(&d, &keep);
        assert!(d.join("a").exists() && d.join("sub/c").exists() && d.join(".x.tmp").exists());
        assert!(!d.join("b").exists());
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn users_are_found_by_name_or_uid_in_a_passwd_file() {
        let passwd = "root:x:0:0:root:/root:/bin/bash\nbroken line\npostgres:x:101:104:PostgreSQL:/var/lib/postgresql:/bin/bash\n";
        let by_uid = find_user(passwd, |u| u.uid == 101)
            .expect("parse")
            .expect("found");
        assert_eq!((by_uid.name.as_str(), by_uid.gid), ("postgres", 104));
        assert_eq!(by_uid.home, "/var/lib/postgresql");
        let by_name = find_user(passwd, |u| u.name == "root")
            .expect("parse")
            .expect("found");
        assert_eq!(by_name.uid, 0);
        assert!(
            find_user(passwd, |u| u.uid == 999)
                .expect("parse")
                .is_none()
        );
    }

    #[test]
    fn downward_fields_render_like_kubelet() {
        let pod = json!({"metadata": {"name": "p", "namespace": "n",
            "labels": {"b": "2", "a": "say \"hi\""}}, "status": {"podIP": "127.10.0.2"}});
        assert_eq!(
            field_value(&pod, "metadata.labels").unwrap(),
            "a=\"say \\\"hi\\\"\"\nb=\"2\""
        );
        assert_eq!(field_value(&pod, "metadata.labels['b']").unwrap(), "2");
        assert_eq!(field_value(&pod, "status.podIP").unwrap(), "127.10.0.2");
        assert!(field_value(&pod, "spec.bogus").is_none());
    }
}
