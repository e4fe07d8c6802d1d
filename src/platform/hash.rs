//! The one hash pgfleet uses: FNV-1a, 64-bit. Its definition is published
//! and frozen, unlike `std`'s `DefaultHasher`, whose output may change
//! between Rust releases, so values computed by one manager build (content
//! hashes on children, backup schedule offsets) hold for the next.

use serde_json::Value;

/// FNV-1a, 64-bit: a tiny hash with a published, frozen definition.
pub fn fnv1a64(bytes: &[u8]) -> u64 {
    fnv1a64_on(FNV64_BASIS, bytes)
}

/// FNV-1a's 64-bit offset basis: the state before any byte.
pub const FNV64_BASIS: u64 = 0xcbf2_9ce4_8422_2325;

/// FNV-1a, 64-bit, going on from `state` (the hash of the bytes before):
/// `fnv1a64_on(fnv1a64(a), b) == fnv1a64(a ++ b)`.
pub fn fnv1a64_on(state: u64, bytes: &[u8]) -> u64 {
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    bytes
        .iter()
        .fold(state, |hash, &b| (hash ^ u64::from(b)).wrapping_mul(PRIME))
}

/// FNV-1a, 32-bit: the controller's shard of a PostgresCluster (its value
/// is a label on every PostgresCluster, so it must never change).
pub fn fnv1a32(bytes: impl IntoIterator<Item = u8>) -> u32 {
    const BASIS: u32 = 0x811c_9dc5;
    const PRIME: u32 = 0x0100_0193;
    bytes
        .into_iter()
        .fold(BASIS, |hash, b| (hash ^ u32::from(b)).wrapping_mul(PRIME))
}

/// A stable content hash (FNV-1a over canonical JSON): children carry the
/// hash of what they were built from, so an unchanged child costs no write.
pub fn content_hash(v: &Value) -> String {
    let bytes = serde_json::to_vec(v).unwrap_or_default();
    format!("{:016x}", fnv1a64(&bytes))
}

/// [`content_hash`] of a typed object. It goes through [`Value`] first:
/// serde_json's map is ordered by key, so the bytes hashed are the same
/// canonical JSON whether the object was built typed or as JSON (a struct
/// serialized straight to bytes would follow its field order instead, and
/// every hash stamped on a running child would move). Serializing a
/// k8s-openapi struct cannot fail (string keys only); if it ever did, the
/// hash of `null` would only cost one extra write.
pub fn content_hash_of<T: serde::Serialize>(obj: &T) -> String {
    content_hash(&serde_json::to_value(obj).unwrap_or(Value::Null))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fnv1a64_matches_published_vectors() {
        assert_eq!(fnv1a64(b""), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a64(b"a"), 0xaf63_dc4c_8601_ec8c);
        assert_eq!(fnv1a64(b"foobar"), 0x8594_4171_f739_67e8);
        assert_eq!(fnv1a32(*b""), 0x811c_9dc5);
        assert_eq!(fnv1a32(*b"a"), 0xe40c_292c);
        assert_eq!(fnv1a32(*b"foobar"), 0xbf9c_f968);
    }

    #[test]
    fn content_hash_is_sixteen_hex_digits_of_the_json() {
        let v = serde_json::json!({"a": 1});
        assert_eq!(content_hash(&v), format!("{:016x}", fnv1a64(br#"{"a":1}"#)));
    }
}
