//! The valid keys at each place in the config, for "did you mean" hints.
//!
//! The field lists come from the serde derives themselves (a probing
//! deserializer captures the `fields` argument of `deserialize_struct`), so
//! the hints cannot drift from the structs.

use std::fmt;

use serde::Deserialize;
use serde::de::{self, Deserializer, Visitor};

use super::error::Seg;
use super::{
    BackupOverride, Backups, ClusterEntry, Drills, Embedded, FilesystemRepository, Manager,
    RepositoryConfig, Retention, Rollout, S3Repository, Settings, Stage, Telemetry, Tenancy,
};

/// The keys a table at `parent` accepts; empty for free-form maps.
pub(crate) fn known_keys(parent: &[Seg]) -> &'static [&'static str] {
    use Seg::{Index as I, Key as K};
    let keys: Vec<&str> = parent
        .iter()
        .map(|s| match s {
            K(k) => k.as_str(),
            I(_) => "[]",
        })
        .collect();
    match keys.as_slice() {
        [] => fields_of::<Settings>(),
        ["manager"] => fields_of::<Manager>(),
        ["manager", "embedded"] => fields_of::<Embedded>(),
        ["telemetry"] => fields_of::<Telemetry>(),
        ["clusters", "[]"] => fields_of::<ClusterEntry>(),
        ["backups"] => fields_of::<Backups>(),
        ["images"] => fields_of::<super::images::Images>(),
        ["images", "catalog", _] => fields_of::<super::catalog::CatalogEntry>(),
        ["backups", "retention"] => fields_of::<Retention>(),
        ["backups", "repository"] => fields_of::<RepositoryConfig>(),
        ["backups", "repository", "s3"] => fields_of::<S3Repository>(),
        ["backups", "repository", "filesystem"] => fields_of::<FilesystemRepository>(),
        ["backups", "overrides", "[]"] => fields_of::<BackupOverride>(),
        ["backups", "drills"] => fields_of::<Drills>(),
        ["tenancy"] => fields_of::<Tenancy>(),
        ["tls"] => fields_of::<super::tls::Tls>(),
        ["rollouts", _] => fields_of::<Rollout>(),
        ["rollouts", _, "stages", "[]"] => fields_of::<Stage>(),
        ["roles", _] => fields_of::<super::roles::RoleSet>(),
        ["dr", _] => fields_of::<super::dr::Topology>(),
        _ => &[],
    }
}

/// The closest known key to a misspelt one, if it is close enough to be a typo.
pub(crate) fn suggest(unknown: &str, known: &[&'static str]) -> Option<&'static str> {
    let limit = (unknown.len() / 3).clamp(1, 3);
    known
        .iter()
        .map(|k| (edit_distance(unknown, k), *k))
        .filter(|(d, _)| *d <= limit)
        .min_by_key(|(d, _)| *d)
        .map(|(_, k)| k)
}

fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut prev: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut cur = vec![i + 1; b.len() + 1];
        for (j, cb) in b.iter().enumerate() {
            let subst = prev[j] + usize::from(ca != *cb);
            cur[j + 1] = subst.min(prev[j + 1] + 1).min(cur[j] + 1);
        }
        prev = cur;
    }
    prev[b.len()]
}

fn fields_of<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    match T::deserialize(FieldsProbe) {
        Err(Probed(Some(fields))) => fields,
        _ => &[],
    }
}

/// A deserializer that only answers "which fields does this struct have?".
struct FieldsProbe;

#[derive(Debug)]
struct Probed(Option<&'static [&'static str]>);

impl fmt::Display for Probed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("field probe")
    }
}

impl std::error::Error for Probed {}

impl de::Error for Probed {
    fn custom<M: fmt::Display>(_: M) -> Self {
        Self(None)
    }
}

impl<'de> Deserializer<'de> for FieldsProbe {
    type Error = Probed;

    fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Probed> {
        Err(Probed(None))
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _: &'static str,
        fields: &'static [&'static str],
        _: V,
    ) -> Result<V::Value, Probed> {
        Err(Probed(Some(fields)))
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf option unit unit_struct newtype_struct seq tuple
        tuple_struct map enum identifier ignored_any
    }
}
