//! One stored object: its serialized form plus the few fields the store and
//! the watch fan-out read on every write (revision, identity, labels,
//! owners, the deletion mark).
//!
//! Why bytes and not a parsed `serde_json::Value`: a `Value` costs about
//! sixteen times its JSON (a B-tree node per object, a heap string per key
//! and value), and an emulated fleet keeps hundreds of thousands of objects
//! and their recent versions. What reads an object whole parses it
//! ([`StoredObject::value`]) — a write parses the object it changes, a GET or
//! a plain watch sends the bytes as they are.
//!
//! A write is serialized before the store's lock is taken ([`Prepared`]),
//! with a placeholder where the resourceVersion goes; under the lock only
//! the revision's digits are put in its place.

use crate::json_ptr::Ptr;
use bytes::Bytes;
use serde_json::Value;
use std::sync::{Arc, OnceLock};

#[derive(Debug)]
pub struct StoredObject {
    pub json: Bytes,
    rv: u64,
    ix: Index,
}

/// What the store reads of an object without parsing it, packed in one
/// string (namespace, name, uid, each label's key and value sorted by key,
/// the owners' uids, the claims a Pod mounts) and the end of each piece:
/// two allocations per object instead of one per piece, since an emulated
/// fleet holds hundreds of thousands of them.
#[derive(Debug, Clone)]
struct Index {
    text: Box<str>,
    ends: Box<[u32]>,
    labels: u16,
    /// The last pieces: the claims a Pod mounts (`pvc_protection::claims_of`).
    /// The claim controllers ask which Pods of a namespace mount a claim on
    /// every write of a Pod or claim; with the names here that is a string
    /// compare per Pod, not a search through each Pod's JSON (which was a
    /// tenth of the emulator's CPU in a fleet's cold start, issue 16).
    claims: u16,
    deleting: bool,
    /// A Pod's lifecycle as the scheduler and the claim controllers read
    /// it ([`PodState`]); `None` for every other kind.
    pod: Option<PodState>,
}

/// Where a Pod is in its life, as the controllers that watch every Pod
/// write (the scheduler, the claim controllers) need it: most writes of a
/// Pod are its kubelet's status updates, which change none of this, and
/// with it in the index those controllers tell at once whether a write
/// concerns them instead of parsing the Pod (issue 16).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PodState {
    /// `spec.nodeName` is set.
    pub bound: bool,
    /// `status.phase`.
    pub phase: PodPhase,
}

/// `status.phase`, as far as the controllers above tell phases apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PodPhase {
    /// Pending, Unknown or not set.
    Other,
    Running,
    /// Succeeded or Failed: the Pod holds no node and no claim any more.
    Finished,
}

impl PodState {
    fn of(pod: &Value) -> PodState {
        PodState {
            bound: !str_at(pod, "/spec/nodeName").is_empty(),
            phase: match str_at(pod, "/status/phase") {
                "Running" => PodPhase::Running,
                "Succeeded" | "Failed" => PodPhase::Finished,
                _ => PodPhase::Other,
            },
        }
    }
}

/// The pieces before the labels.
const HEAD: usize = 3;

impl Index {
    fn of(value: &Value) -> Self {
        // Label values as selectors compare them (`selector::text`).
        let text = crate::selector::text;
        let mut labels: Vec<(&str, String)> = value
            .ptr("/metadata/labels")
            .and_then(Value::as_object)
            .map(|m| m.iter().map(|(k, v)| (k.as_str(), text(v))).collect())
            .unwrap_or_default();
        labels.sort_unstable();
        let owners = value
            .ptr("/metadata/ownerReferences")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|r| r.get("uid").and_then(Value::as_str));
        let mut pieces = vec![
            str_at(value, "/metadata/namespace"),
            str_at(value, "/metadata/name"),
            str_at(value, "/metadata/uid"),
        ];
        for (k, v) in &labels {
            pieces.extend([*k, v.as_str()]);
        }
        pieces.extend(owners);
        let is_pod = value.get("kind").and_then(Value::as_str) == Some("Pod");
        let claims = match is_pod {
            true => crate::pvc_protection::claims_of(value),
            false => vec![],
        };
        pieces.extend(claims.iter().map(String::as_str));
        let mut text = String::with_capacity(pieces.iter().map(|p| p.len()).sum());
        let mut ends = Vec::with_capacity(pieces.len());
        for p in pieces {
            text.push_str(p);
            ends.push(u32::try_from(text.len()).unwrap_or(u32::MAX));
        }
        Index {
            text: text.into_boxed_str(),
            ends: ends.into_boxed_slice(),
            labels: u16::try_from(labels.len()).unwrap_or(u16::MAX),
            claims: u16::try_from(claims.len()).unwrap_or(u16::MAX),
            deleting: value.ptr("/metadata/deletionTimestamp").is_some(),
            pod: is_pod.then(|| PodState::of(value)),
        }
    }

    fn piece(&self, i: usize) -> &str {
        let start = i
            .checked_sub(1)
            .and_then(|j| self.ends.get(j))
            .map_or(0, |e| *e as usize);
        let end = self.ends.get(i).map_or(start, |e| *e as usize);
        self.text.get(start..end).unwrap_or_default()
    }

    fn label_at(&self, i: usize) -> (&str, &str) {
        (self.piece(HEAD + 2 * i), self.piece(HEAD + 2 * i + 1))
    }

    fn owners(&self) -> impl Iterator<Item = &str> {
        (HEAD + 2 * self.labels as usize..self.claims_start()).map(|i| self.piece(i))
    }

    fn claims_start(&self) -> usize {
        self.ends.len().saturating_sub(self.claims as usize)
    }

    fn claims(&self) -> impl Iterator<Item = &str> {
        (self.claims_start()..self.ends.len()).map(|i| self.piece(i))
    }
}

impl StoredObject {
    /// Serializes and indexes an object as it is (a dry run's answer, a
    /// loaded snapshot).
    pub fn new(value: &Value) -> Arc<Self> {
        let json = Bytes::from(serde_json::to_vec(value).unwrap_or_default());
        Arc::new(StoredObject {
            json,
            rv: rv_of(value),
            ix: Index::of(value),
        })
    }

    /// A stored object again from its serialized form (tests).
    pub fn parse(json: Bytes) -> Option<Arc<Self>> {
        let value: Value = serde_json::from_slice(&json).ok()?;
        Some(Arc::new(StoredObject {
            json,
            rv: rv_of(&value),
            ix: Index::of(&value),
        }))
    }

    /// The object, parsed from its JSON. The store wrote that JSON itself,
    /// so it always parses; `Null` would mean a serializer bug.
    pub fn value(&self) -> Value {
        serde_json::from_slice(&self.json).unwrap_or(Value::Null)
    }

    /// Only `metadata`, parsed (the rest of the JSON is skipped, not built):
    /// what metadata-only reads and watches send.
    pub fn metadata(&self) -> Value {
        match self.pick(Pick(&[("metadata", ALL)])) {
            Value::Object(mut m) => m.remove("metadata").unwrap_or(Value::Null),
            _ => Value::Null,
        }
    }

    /// Only the parts `keep` names, parsed; everything else in the JSON is
    /// skipped without being built. `Null` if the object is not a map.
    pub fn pick(&self, keep: Pick<'_>) -> Value {
        use serde::de::DeserializeSeed;
        let mut de = serde_json::Deserializer::from_slice(&self.json);
        keep.deserialize(&mut de).unwrap_or(Value::Null)
    }

    pub fn rv(&self) -> u64 {
        self.rv
    }

    pub fn uid(&self) -> &str {
        self.ix.piece(2)
    }

    pub fn namespace(&self) -> &str {
        self.ix.piece(0)
    }

    pub fn name(&self) -> &str {
        self.ix.piece(1)
    }

    /// One label's value.
    pub fn label(&self, key: &str) -> Option<&str> {
        let (mut lo, mut hi) = (0, self.ix.labels as usize);
        while lo < hi {
            let mid = (lo + hi) / 2;
            let (k, v) = self.ix.label_at(mid);
            match k.cmp(key) {
                std::cmp::Ordering::Equal => return Some(v),
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
            }
        }
        None
    }

    /// The uids of its owner references.
    pub fn owner_uids(&self) -> impl Iterator<Item = &str> {
        self.ix.owners()
    }

    pub fn has_owners(&self) -> bool {
        self.ix.owners().next().is_some()
    }

    /// Whether the serialized object holds `needle`: a test before parsing
    /// for scans over many objects of which few match (which Pods mount a
    /// claim), where parsing each would make the scan cost its JSON's
    /// size many times over.
    pub fn json_contains(&self, needle: &[u8]) -> bool {
        !needle.is_empty() && memchr::memmem::find(&self.json, needle).is_some()
    }

    /// Whether this is a Pod that mounts `claim` (by name, or as one of
    /// its generic ephemeral volumes), as `pvc_protection::claims_of` reads it.
    pub fn mounts_claim(&self, claim: &str) -> bool {
        self.ix.claims().any(|c| c == claim)
    }

    /// `metadata.deletionTimestamp` is set.
    pub fn is_deleting(&self) -> bool {
        self.ix.deleting
    }

    /// A Pod's node binding and phase; `None` for other kinds.
    pub fn pod_state(&self) -> Option<PodState> {
        self.ix.pod
    }

    /// The claims a Pod mounts (`pvc_protection::claims_of`), kept in the
    /// index; none for other kinds.
    pub fn claims(&self) -> impl Iterator<Item = &str> {
        self.ix.claims()
    }
}

/// What [`StoredObject::pick`] keeps: the listed keys of a map, each with
/// what to keep of its value; an empty list keeps the whole value.
#[derive(Clone, Copy)]
pub struct Pick<'a>(pub &'a [(&'a str, Pick<'a>)]);

/// Keeps a whole value.
pub const ALL: Pick<'static> = Pick(&[]);

impl<'de> serde::de::DeserializeSeed<'de> for Pick<'_> {
    type Value = Value;

    fn deserialize<D: serde::Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        if self.0.is_empty() {
            return serde::Deserialize::deserialize(d);
        }
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for Pick<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a map")
    }

    fn visit_map<A: serde::de::MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = serde_json::Map::new();
        while let Some(key) = map.next_key::<std::borrow::Cow<'de, str>>()? {
            match self.0.iter().find(|(k, _)| *k == key) {
                Some((k, sub)) => {
                    out.insert((*k).to_string(), map.next_value_seed(*sub)?);
                }
                None => {
                    map.next_value::<serde::de::IgnoredAny>()?;
                }
            }
        }
        Ok(Value::Object(out))
    }
}

/// An object serialized and indexed outside the store's lock, waiting for
/// its revision.
pub struct Prepared {
    json: Vec<u8>,
    /// Where the placeholder's characters are (between its quotes).
    at: Option<usize>,
    ix: Index,
}

/// The resourceVersion written in place of the real one until commit:
/// random per process, so no object's content can contain it by chance or
/// by a tenant's design (the first occurrence is the one replaced).
fn placeholder() -> &'static str {
    static P: OnceLock<String> = OnceLock::new();
    P.get_or_init(|| format!("pgfleet-rv-{:032x}", rand::random::<u128>()))
}

impl Prepared {
    /// Serializes `v` with the placeholder as its resourceVersion.
    pub fn new(mut v: Value) -> Self {
        let p = placeholder();
        let stamped = match v.get_mut("metadata").and_then(Value::as_object_mut) {
            Some(meta) => {
                meta.insert("resourceVersion".into(), Value::String(p.to_string()));
                true
            }
            None => false,
        };
        let json = serde_json::to_vec(&v).unwrap_or_default();
        let at = stamped.then(|| find(&json, p)).flatten();
        Prepared {
            json,
            at,
            ix: Index::of(&v),
        }
    }

    /// The stored object at revision `rv`.
    pub fn commit(self, rv: u64) -> Arc<StoredObject> {
        let json = match self.at {
            Some(at) => {
                let digits = rv.to_string();
                let end = at + placeholder().len();
                let mut out = Vec::with_capacity(self.json.len());
                out.extend_from_slice(&self.json[..at]);
                out.extend_from_slice(digits.as_bytes());
                out.extend_from_slice(&self.json[end..]);
                out
            }
            None => self.json,
        };
        Arc::new(StoredObject {
            json: Bytes::from(json),
            rv,
            ix: self.ix,
        })
    }
}

/// The offset of `needle`'s characters in the JSON string `"needle"`.
fn find(hay: &[u8], needle: &str) -> Option<usize> {
    let quoted = format!("\"{needle}\"");
    memchr::memmem::find(hay, quoted.as_bytes()).map(|i| i + 1)
}

pub fn rv_of(v: &Value) -> u64 {
    v.ptr("/metadata/resourceVersion")
        .and_then(Value::as_str)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0)
}

pub fn str_at<'a>(v: &'a Value, ptr: &str) -> &'a str {
    v.ptr(ptr).and_then(Value::as_str).unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn a_prepared_object_gets_its_revision_and_keeps_everything_else() {
        let v = json!({"metadata": {"name": "a", "namespace": "n", "uid": "u",
            "labels": {"b": "2", "a": "1"}, "ownerReferences": [{"uid": "o1"}],
            "annotations": {"x": "pgfleet-rv-0"}}, "data": {"k": "v"}});
        let o = Prepared::new(v.clone()).commit(42);
        let mut want = v;
        want["metadata"]["resourceVersion"] = json!("42");
        assert_eq!(o.value(), want);
        assert_eq!(o.rv(), 42);
        assert_eq!((o.namespace(), o.name(), o.uid()), ("n", "a", "u"));
        assert_eq!(
            (o.label("a"), o.label("b"), o.label("c"), o.label("")),
            (Some("1"), Some("2"), None, None)
        );
        assert_eq!(o.owner_uids().collect::<Vec<_>>(), ["o1"]);
        assert!(!o.is_deleting());
        assert_eq!(o.metadata(), want["metadata"]);
        let owners = o.pick(Pick(&[("metadata", Pick(&[("ownerReferences", ALL)]))]));
        assert_eq!(
            owners,
            json!({"metadata": {"ownerReferences": [{"uid": "o1"}]}})
        );
        assert_eq!(o.pick(Pick(&[("spec", ALL)])), json!({}));
    }

    #[test]
    fn a_pod_knows_the_claims_it_mounts_and_its_owners_stay_apart() {
        let pod = json!({"kind": "Pod", "metadata": {"name": "p", "namespace": "n",
            "uid": "u", "ownerReferences": [{"uid": "o1"}]},
            "spec": {"volumes": [
                {"name": "data", "persistentVolumeClaim": {"claimName": "db-1"}},
                {"name": "scratch", "ephemeral": {}},
                {"name": "cfg", "configMap": {"name": "db-1x"}}]}});
        let o = StoredObject::new(&pod);
        assert!(o.mounts_claim("db-1") && o.mounts_claim("p-scratch"));
        assert!(!o.mounts_claim("db-1x") && !o.mounts_claim("db") && !o.mounts_claim("o1"));
        assert_eq!(o.owner_uids().collect::<Vec<_>>(), ["o1"]);
        // Only a Pod mounts: the same volumes in another kind name nothing.
        let mut other = pod;
        other["kind"] = json!("PodTemplate");
        assert!(!StoredObject::new(&other).mounts_claim("db-1"));
    }
}
