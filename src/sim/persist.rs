//! Persistence of an emulated cluster's objects in its directory, so killing
//! and restarting `pgfleet sim` on the same directory keeps them. A snapshot
//! is written (atomically, via rename) at most twice a second while the store
//! changes; a kill loses at most the last half second of writes, which is the
//! documented difference from etcd.

use super::cluster::Cluster;
use super::resources::ResKey;
use crate::json_ptr::Ptr;
use anyhow::Context;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::Duration;

#[derive(Serialize, Deserialize)]
struct Snapshot {
    port: u16,
    token: String,
    rv: u64,
    objects: Vec<Entry>,
}

#[derive(Serialize, Deserialize)]
struct Entry {
    group: String,
    plural: String,
    object: Value,
}

/// What a restart needs to look the same to clients.
pub struct Restored {
    pub port: u16,
    pub token: String,
}

/// Loads a snapshot if there is one: objects, CRD registrations and taken addresses.
pub fn load(c: &Arc<Cluster>, path: &Path) -> anyhow::Result<Option<Restored>> {
    let raw = match std::fs::read(path) {
        Ok(r) => r,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e).with_context(|| format!("reading {}", path.display())),
    };
    let snap: Snapshot = serde_json::from_slice(&raw)
        .with_context(|| format!("{} is not a sim snapshot", path.display()))?;
    let mut objects = vec![];
    for e in snap.objects {
        let key = ResKey {
            group: e.group,
            plural: e.plural,
        };
        if key.group == "apiextensions.k8s.io" && key.plural == "customresourcedefinitions" {
            c.registry
                .write()
                .unwrap_or_else(|p| p.into_inner())
                .register_crd(&e.object);
        }
        for ptr in ["/spec/clusterIP", "/status/podIP"] {
            if let Some(ip) = e.object.ptr(ptr).and_then(Value::as_str) {
                c.ipam.reserve(ip);
            }
        }
        objects.push((key, e.object));
    }
    c.store.load(snap.rv, objects);
    Ok(Some(Restored {
        port: snap.port,
        token: snap.token,
    }))
}

/// Writes a [`Snapshot`] with each object's stored JSON as it is (parsing
/// every object to serialize it again, twice a second, cost as much as the
/// writes themselves).
fn save(c: &Cluster, path: &Path, port: u16, token: &str) -> anyhow::Result<()> {
    let (rv, all) = c.store.dump();
    let size = all.iter().map(|(_, o)| o.json.len() + 64).sum::<usize>();
    let mut out = Vec::with_capacity(size + 128);
    out.extend_from_slice(
        format!(
            "{{\"port\":{port},\"token\":{},\"rv\":{rv},\"objects\":[",
            serde_json::to_string(token)?
        )
        .as_bytes(),
    );
    for (i, (k, o)) in all.iter().enumerate() {
        if i > 0 {
            out.push(b',');
        }
        let head = format!(
            "{{\"group\":{},\"plural\":{},\"object\":",
            serde_json::to_string(&k.group)?,
            serde_json::to_string(&k.plural)?
        );
        out.extend_from_slice(head.as_bytes());
        out.extend_from_slice(&o.json);
        out.push(b'}');
    }
    out.extend_from_slice(b"]}");
    super::write_private(path, &out)
}

/// Writes snapshots while the cluster lives.
pub async fn run(c: Weak<Cluster>, path: PathBuf, port: u16, token: String) {
    loop {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let Some(c) = c.upgrade() else { return };
        if c.store.take_dirty()
            && let Err(e) = save(&c, &path, port, &token)
        {
            tracing::warn!(cluster = %c.name, error = %format!("{e:#}"), "could not persist sim state");
        }
    }
}

/// Writes a snapshot now (on shutdown), whatever the dirty flag says.
pub fn save_now(c: &Cluster, dir: &Path, port: u16, token: &str) -> anyhow::Result<()> {
    save(c, &dir.join(format!("{}.state.json", c.name)), port, token)
}
