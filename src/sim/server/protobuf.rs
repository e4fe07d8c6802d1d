//! Decoding of the protobuf request bodies client-go sends for built-in
//! kinds (`application/vnd.kubernetes.protobuf`), for the kinds kubectl's
//! generators commonly create: `kubectl create namespace|configmap|secret|
//! serviceaccount`. The body is a `k8s\0` magic, then a `runtime.Unknown`
//! envelope (type meta, raw object bytes); the object is decoded with a small
//! table of field numbers from `k8s.io/api`'s `generated.proto` into the JSON
//! the store keeps (the workload, RBAC and quota tables are in
//! `protobuf_kinds`). Other kinds are refused (the caller answers 415), and
//! responses are always JSON, which client-go accepts.

use base64::Engine;
use serde_json::{Map, Value, json};

/// How one protobuf field maps to JSON.
#[derive(Clone, Copy)]
pub(super) enum Ty {
    Str,
    /// A `*bool`: present means set, false included.
    Bool,
    /// A plain `bool` (`omitempty` in JSON): gogo-protobuf always writes it,
    /// so false means absent.
    Flag,
    /// A pointer integer (`*int32`, `*int64`): present means set.
    Int,
    /// A plain integer (`omitempty` in JSON): zero means absent.
    Num,
    /// `intstr.IntOrString` (type = 1, intVal = 2, strVal = 3).
    IntOrStr,
    /// `map<string, resource.Quantity>` (a Quantity is `string = 1`).
    MapQty,
    /// `metav1.Time` (seconds, nanos) as RFC 3339.
    Time,
    MapStr,
    MapBytes,
    RepStr,
    Msg(&'static Schema),
    RepMsg(&'static Schema),
}

pub(super) type Schema = [(u64, &'static str, Ty)];

const OWNER_REF: &Schema = &[
    (1, "kind", Ty::Str),
    (3, "name", Ty::Str),
    (4, "uid", Ty::Str),
    (5, "apiVersion", Ty::Str),
    (6, "controller", Ty::Bool),
    (7, "blockOwnerDeletion", Ty::Bool),
];

pub(super) const OBJECT_META: &Schema = &[
    (1, "name", Ty::Str),
    (2, "generateName", Ty::Str),
    (3, "namespace", Ty::Str),
    (5, "uid", Ty::Str),
    (6, "resourceVersion", Ty::Str),
    (7, "generation", Ty::Int),
    (8, "creationTimestamp", Ty::Time),
    (9, "deletionTimestamp", Ty::Time),
    (10, "deletionGracePeriodSeconds", Ty::Int),
    (11, "labels", Ty::MapStr),
    (12, "annotations", Ty::MapStr),
    (13, "ownerReferences", Ty::RepMsg(OWNER_REF)),
    (14, "finalizers", Ty::RepStr),
];

const NAMESPACE_SPEC: &Schema = &[(1, "finalizers", Ty::RepStr)];

const NAMESPACE: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "spec", Ty::Msg(NAMESPACE_SPEC)),
];

const CONFIG_MAP: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "data", Ty::MapStr),
    (3, "binaryData", Ty::MapBytes),
    (4, "immutable", Ty::Bool),
];

const SECRET: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "data", Ty::MapBytes),
    (3, "type", Ty::Str),
    (4, "stringData", Ty::MapStr),
    (5, "immutable", Ty::Bool),
];

const OBJECT_REF: &Schema = &[
    (1, "kind", Ty::Str),
    (2, "namespace", Ty::Str),
    (3, "name", Ty::Str),
    (4, "uid", Ty::Str),
    (5, "apiVersion", Ty::Str),
    (6, "resourceVersion", Ty::Str),
    (7, "fieldPath", Ty::Str),
];

const LOCAL_REF: &Schema = &[(1, "name", Ty::Str)];

const SERVICE_ACCOUNT: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "secrets", Ty::RepMsg(OBJECT_REF)),
    (3, "imagePullSecrets", Ty::RepMsg(LOCAL_REF)),
    (4, "automountServiceAccountToken", Ty::Bool),
];

/// `authorization/v1` ResourceAttributes and NonResourceAttributes.
const RESOURCE_ATTRIBUTES: &Schema = &[
    (1, "namespace", Ty::Str),
    (2, "verb", Ty::Str),
    (3, "group", Ty::Str),
    (4, "version", Ty::Str),
    (5, "resource", Ty::Str),
    (6, "subresource", Ty::Str),
    (7, "name", Ty::Str),
];

const NON_RESOURCE_ATTRIBUTES: &Schema = &[(1, "path", Ty::Str), (2, "verb", Ty::Str)];

/// The specs of the access reviews (self, subject and local ones share
/// the field numbers of the attributes).
const ACCESS_REVIEW_SPEC: &Schema = &[
    (1, "resourceAttributes", Ty::Msg(RESOURCE_ATTRIBUTES)),
    (2, "nonResourceAttributes", Ty::Msg(NON_RESOURCE_ATTRIBUTES)),
    (3, "user", Ty::Str),
    (4, "groups", Ty::RepStr),
    (6, "uid", Ty::Str),
];

const ACCESS_REVIEW: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "spec", Ty::Msg(ACCESS_REVIEW_SPEC)),
];

const RULES_REVIEW_SPEC: &Schema = &[(1, "namespace", Ty::Str)];

const RULES_REVIEW: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "spec", Ty::Msg(RULES_REVIEW_SPEC)),
];

const SELF_SUBJECT_REVIEW: &Schema = &[(1, "metadata", Ty::Msg(OBJECT_META))];

const TYPE_META: &Schema = &[(1, "apiVersion", Ty::Str), (2, "kind", Ty::Str)];

/// The kinds with a decoder, by (apiVersion, kind).
fn schema_for(api_version: &str, kind: &str) -> Option<&'static Schema> {
    match (api_version, kind) {
        ("v1", "Namespace") => Some(NAMESPACE),
        ("v1", "ConfigMap") => Some(CONFIG_MAP),
        ("v1", "Secret") => Some(SECRET),
        ("v1", "ServiceAccount") => Some(SERVICE_ACCOUNT),
        (
            "authorization.k8s.io/v1",
            "SelfSubjectAccessReview" | "SubjectAccessReview" | "LocalSubjectAccessReview",
        ) => Some(ACCESS_REVIEW),
        ("authorization.k8s.io/v1", "SelfSubjectRulesReview") => Some(RULES_REVIEW),
        ("authentication.k8s.io/v1", "SelfSubjectReview") => Some(SELF_SUBJECT_REVIEW),
        _ => super::protobuf_kinds::schema_for(api_version, kind),
    }
}

/// Decodes a Kubernetes protobuf body into the object's JSON.
pub fn decode(body: &[u8]) -> Result<Value, String> {
    let rest = body
        .strip_prefix(b"k8s\x00")
        .ok_or("the body lacks the k8s protobuf magic")?;
    let mut type_meta = None;
    let mut raw: &[u8] = &[];
    let mut r = Reader(rest);
    while let Some((field, wire)) = r.key()? {
        match (field, wire) {
            (1, 2) => type_meta = Some(message(r.bytes()?, TYPE_META)?),
            (2, 2) => raw = r.bytes()?,
            (3 | 4, 2) => {
                let v = r.bytes()?;
                if !v.is_empty() {
                    return Err("encoded or nested content types are not supported".into());
                }
            }
            _ => r.skip(wire)?,
        }
    }
    let tm = type_meta.unwrap_or_else(|| json!({}));
    let api_version = tm["apiVersion"].as_str().unwrap_or_default().to_string();
    let kind = tm["kind"].as_str().unwrap_or_default().to_string();
    let schema = schema_for(&api_version, &kind).ok_or_else(|| {
        format!("no protobuf decoder for {api_version} {kind} (only the kinds kubectl create generates: Namespace, ConfigMap, Secret, ServiceAccount, Service, ResourceQuota, Deployment and RBAC roles and bindings); send JSON, e.g. with kubectl apply -f")
    })?;
    let mut obj = message(raw, schema)?;
    obj["apiVersion"] = json!(api_version);
    obj["kind"] = json!(kind);
    Ok(obj)
}

fn message(b: &[u8], schema: &Schema) -> Result<Value, String> {
    let mut out = Map::new();
    let mut r = Reader(b);
    while let Some((field, wire)) = r.key()? {
        let Some(&(_, name, ty)) = schema.iter().find(|(n, _, _)| *n == field) else {
            r.skip(wire)?;
            continue;
        };
        let b64 = |b: &[u8]| json!(base64::engine::general_purpose::STANDARD.encode(b));
        match ty {
            Ty::Str => {
                let s = string(r.bytes()?)?;
                if !s.is_empty() {
                    out.insert(name.into(), json!(s));
                }
            }
            Ty::Bool => {
                out.insert(name.into(), json!(r.varint()? != 0));
            }
            Ty::Flag => {
                if r.varint()? != 0 {
                    out.insert(name.into(), json!(true));
                }
            }
            Ty::Int | Ty::Num => {
                // int64 fields are two's complement varints; int32 ones are
                // sign-extended to 64 bits, so the cast is right for both.
                let n = r.varint()? as i64;
                let omit = matches!(ty, Ty::Num) || name == "generation";
                if n != 0 || !omit {
                    out.insert(name.into(), json!(n));
                }
            }
            Ty::IntOrStr => {
                out.insert(name.into(), int_or_string(r.bytes()?)?);
            }
            Ty::Time => {
                let t = time(r.bytes()?)?;
                if let Some(t) = t {
                    out.insert(name.into(), json!(t));
                }
            }
            Ty::MapStr | Ty::MapBytes | Ty::MapQty => {
                let (k, v) = entry(r.bytes()?)?;
                let v = match ty {
                    Ty::MapBytes => b64(&v),
                    Ty::MapQty => quantity(&v)?,
                    _ => json!(string(&v)?),
                };
                let m = out.entry(name).or_insert_with(|| json!({}));
                if let Some(m) = m.as_object_mut() {
                    m.insert(k, v);
                }
            }
            Ty::RepStr | Ty::RepMsg(_) => {
                let b = r.bytes()?;
                let v = match ty {
                    Ty::RepMsg(s) => message(b, s)?,
                    _ => json!(string(b)?),
                };
                let a = out.entry(name).or_insert_with(|| json!([]));
                if let Some(a) = a.as_array_mut() {
                    a.push(v);
                }
            }
            Ty::Msg(s) => {
                let v = message(r.bytes()?, s)?;
                if v.as_object().is_some_and(|m| !m.is_empty()) {
                    out.insert(name.into(), v);
                }
            }
        }
    }
    Ok(Value::Object(out))
}

fn string(b: &[u8]) -> Result<String, String> {
    String::from_utf8(b.to_vec()).map_err(|_| "a string field is not UTF-8".to_string())
}

/// A map entry message: key = 1, value = 2.
fn entry(b: &[u8]) -> Result<(String, Vec<u8>), String> {
    let (mut k, mut v) = (String::new(), Vec::new());
    let mut r = Reader(b);
    while let Some((field, wire)) = r.key()? {
        match (field, wire) {
            (1, 2) => k = string(r.bytes()?)?,
            (2, 2) => v = r.bytes()?.to_vec(),
            _ => r.skip(wire)?,
        }
    }
    Ok((k, v))
}

/// `intstr.IntOrString` as JSON's number or string.
fn int_or_string(b: &[u8]) -> Result<Value, String> {
    let (mut kind, mut int, mut text) = (0u64, 0i64, String::new());
    let mut r = Reader(b);
    while let Some((field, wire)) = r.key()? {
        match (field, wire) {
            (1, 0) => kind = r.varint()?,
            (2, 0) => int = r.varint()? as i64,
            (3, 2) => text = string(r.bytes()?)?,
            _ => r.skip(wire)?,
        }
    }
    Ok(if kind == 1 { json!(text) } else { json!(int) })
}

/// `resource.Quantity` (its canonical string, field 1).
fn quantity(b: &[u8]) -> Result<Value, String> {
    let mut q = String::new();
    let mut r = Reader(b);
    while let Some((field, wire)) = r.key()? {
        match (field, wire) {
            (1, 2) => q = string(r.bytes()?)?,
            _ => r.skip(wire)?,
        }
    }
    Ok(json!(q))
}

/// `metav1.Time`; the zero time (an empty message) is absent.
fn time(b: &[u8]) -> Result<Option<String>, String> {
    let mut secs = 0i64;
    let mut r = Reader(b);
    while let Some((field, wire)) = r.key()? {
        match (field, wire) {
            (1, 0) => secs = r.varint()? as i64,
            _ => r.skip(wire)?,
        }
    }
    if secs == 0 {
        return Ok(None);
    }
    Ok(chrono::DateTime::from_timestamp(secs, 0)
        .map(|t| t.to_rfc3339_opts(chrono::SecondsFormat::Secs, true)))
}

/// A cursor over protobuf wire format.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn varint(&mut self) -> Result<u64, String> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first().ok_or("truncated varint")?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b & 0x80 == 0 {
                return Ok(v);
            }
        }
        Err("varint too long".into())
    }

    /// The next field number and wire type, or None at the end.
    fn key(&mut self) -> Result<Option<(u64, u8)>, String> {
        if self.0.is_empty() {
            return Ok(None);
        }
        let k = self.varint()?;
        Ok(Some((k >> 3, (k & 7) as u8)))
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], String> {
        if n > self.0.len() {
            return Err("truncated field".into());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn bytes(&mut self) -> Result<&'a [u8], String> {
        let n = usize::try_from(self.varint()?).map_err(|_| "field too long")?;
        self.take(n)
    }

    fn skip(&mut self, wire: u8) -> Result<(), String> {
        match wire {
            0 => self.varint().map(drop),
            1 => self.take(8).map(drop),
            2 => self.bytes().map(drop),
            5 => self.take(4).map(drop),
            w => Err(format!("unsupported wire type {w}")),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn decodes_what_kubectl_create_configmap_sends() {
        // Captured from `kubectl create configmap cfg --from-literal=a=1 --from-literal=bb=22 -v=9`.
        let body: &[u8] = &[
            0x6b, 0x38, 0x73, 0x00, 0x0a, 0x0f, 0x0a, 0x02, 0x76, 0x31, 0x12, 0x09, 0x43, 0x6f,
            0x6e, 0x66, 0x69, 0x67, 0x4d, 0x61, 0x70, 0x12, 0x27, 0x0a, 0x13, 0x0a, 0x03, 0x63,
            0x66, 0x67, 0x12, 0x00, 0x1a, 0x00, 0x22, 0x00, 0x2a, 0x00, 0x32, 0x00, 0x38, 0x00,
            0x42, 0x00, 0x12, 0x06, 0x0a, 0x01, 0x61, 0x12, 0x01, 0x31, 0x12, 0x08, 0x0a, 0x02,
            0x62, 0x62, 0x12, 0x02, 0x32, 0x32, 0x1a, 0x00, 0x22, 0x00,
        ];
        let v = decode(body).unwrap();
        assert_eq!(
            v,
            json!({"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "cfg"}, "data": {"a": "1", "bb": "22"}})
        );
    }

    #[test]
    fn refuses_kinds_without_a_table_and_garbage() {
        // runtime.Unknown with TypeMeta apps/v1 DaemonSet and an empty raw.
        let mut body = b"k8s\x00".to_vec();
        let tm = [&[0x0a, 7][..], b"apps/v1", &[0x12, 9], b"DaemonSet"].concat();
        body.extend([0x0a, tm.len() as u8]);
        body.extend(tm);
        assert!(decode(&body).unwrap_err().contains("DaemonSet"));
        assert!(decode(b"{}").is_err());
        assert!(decode(b"k8s\x00\x0a\x05ab").is_err());
    }
}
