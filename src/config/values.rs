//! Value types that deserialize leniently and are checked afterwards.
//!
//! A serde error stops deserialization at the first bad value, but an operator
//! fixing a config file wants every problem in one pass. So durations, cron
//! expressions, enums and the like deserialize from any scalar into a
//! [`Checked`] that keeps the raw text and the parse outcome; the validation
//! pass then reports every failed parse with its key path at once.

use std::collections::BTreeMap;
use std::fmt;
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use croner::Cron;
use croner::parser::{CronParser, Seconds, Year};
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::{Deserialize, Serialize, Serializer};

/// A type that can be parsed from the raw text of a config value.
pub trait CheckedValue: Sized {
    /// A short description of what is expected, used in error messages.
    const EXPECTED: &'static str;
    /// Whether a bare TOML number or boolean is acceptable. Values whose text
    /// matters (versions: `15.20` as a float would become `15.2`) say no.
    const ALLOW_NON_STRING: bool = true;
    /// Parses the raw text; the error message may quote the raw text.
    fn parse_raw(raw: &str) -> Result<Self, String>;
}

/// A config value kept as written, together with its parse result.
///
/// Settings returned by [`crate::config::load`] have been validated, so every
/// `Checked` in them parsed successfully; [`Checked::get`] and
/// [`Checked::parsed`] then never fall back.
#[derive(Clone)]
pub struct Checked<T> {
    raw: String,
    parsed: Result<T, String>,
}

impl<T: CheckedValue> Checked<T> {
    /// Parses `raw` now (used for defaults and by tests).
    pub fn new(raw: &str) -> Self {
        Self {
            raw: raw.to_string(),
            parsed: T::parse_raw(raw.trim()),
        }
    }

    fn from_scalar(raw: String, was_string: bool) -> Self {
        let parsed = if !was_string && !T::ALLOW_NON_STRING {
            Err(format!("must be a quoted string, like {}", T::EXPECTED))
        } else {
            T::parse_raw(raw.trim())
        };
        Self { raw, parsed }
    }
}

impl<T> Checked<T> {
    /// The value as written in the file or environment.
    pub fn raw(&self) -> &str {
        &self.raw
    }

    /// The parsed value; `None` only for settings that skipped validation.
    pub fn parsed(&self) -> Option<&T> {
        self.parsed.as_ref().ok()
    }

    /// True when the key was left empty (required keys default to empty).
    pub(crate) fn is_missing(&self) -> bool {
        self.raw.trim().is_empty()
    }

    /// The parse error, for the validation pass.
    pub(crate) fn error(&self) -> Option<&str> {
        self.parsed.as_ref().err().map(String::as_str)
    }
}

impl<T: Clone + Default> Checked<T> {
    /// The parsed value. Falls back to `T::default()` only if validation was
    /// skipped, which `load` never does.
    pub fn get(&self) -> T {
        self.parsed.clone().unwrap_or_default()
    }
}

/// Required keys default to an empty, unparsed value that validation reports.
impl<T> Default for Checked<T> {
    fn default() -> Self {
        Self {
            raw: String::new(),
            parsed: Err(String::from("is required")),
        }
    }
}

impl<T> fmt::Debug for Checked<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.raw)
    }
}

/// Two values are equal when written the same way.
impl<T> PartialEq for Checked<T> {
    fn eq(&self, other: &Self) -> bool {
        self.raw == other.raw
    }
}

impl<T> fmt::Display for Checked<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.raw)
    }
}

impl<T> Serialize for Checked<T> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.raw)
    }
}

/// Accepts any scalar and renders it as text; `bool` says whether it was a string.
struct ScalarVisitor;

impl Visitor<'_> for ScalarVisitor {
    type Value = (String, bool);
    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a string, number or boolean")
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        Ok((v.to_string(), true))
    }
    fn visit_string<E: de::Error>(self, v: String) -> Result<Self::Value, E> {
        Ok((v, true))
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        Ok((v.to_string(), false))
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok((v.to_string(), false))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Ok((v.to_string(), false))
    }
    fn visit_bool<E: de::Error>(self, v: bool) -> Result<Self::Value, E> {
        Ok((v.to_string(), false))
    }
    fn visit_char<E: de::Error>(self, v: char) -> Result<Self::Value, E> {
        Ok((v.to_string(), true))
    }
}

impl<'de, T: CheckedValue> Deserialize<'de> for Checked<T> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (raw, was_string) = d.deserialize_any(ScalarVisitor)?;
        Ok(Self::from_scalar(raw, was_string))
    }
}

/// A human duration such as `"30m"`, `"2h"` or `"14d"` (humantime syntax).
pub type HumanDuration = Checked<Duration>;
/// A cron expression: 5 fields, or 6 with leading seconds.
pub type CronSchedule = Checked<Cron>;

impl CheckedValue for Duration {
    const EXPECTED: &'static str = "a duration such as \"30s\", \"5m\", \"2h\" or \"14d\"";
    fn parse_raw(raw: &str) -> Result<Self, String> {
        humantime::parse_duration(raw)
            .map_err(|e| format!("{raw:?} is not {}: {e}", Self::EXPECTED))
    }
}

impl CheckedValue for Cron {
    const EXPECTED: &'static str = "a cron expression with 5 fields (minute hour day-of-month month day-of-week), \
         or 6 with leading seconds";
    const ALLOW_NON_STRING: bool = false;
    fn parse_raw(raw: &str) -> Result<Self, String> {
        // Years are disallowed so a 7th field is a mistake, not a silent year filter.
        let parser = CronParser::builder()
            .seconds(Seconds::Optional)
            .year(Year::Disallowed)
            .build();
        parser
            .parse(raw)
            .map_err(|e| format!("{raw:?} is not {}: {e}", Self::EXPECTED))
    }
}

impl CheckedValue for SocketAddr {
    const EXPECTED: &'static str = "an IP address and port such as \"127.0.0.1:8080\"";
    fn parse_raw(raw: &str) -> Result<Self, String> {
        raw.parse()
            .map_err(|_| format!("{raw:?} is not {}", Self::EXPECTED))
    }
}

/// The address `manager.listen` falls back to (its documented default).
pub(crate) const DEFAULT_LISTEN: SocketAddr =
    SocketAddr::new(std::net::IpAddr::V4(Ipv4Addr::LOCALHOST), 8080);

/// A PostgreSQL version as used by `target_version`: `MAJOR.MINOR`, or a
/// bare `MAJOR` (a major target whose catalog entry names the image, as
/// `spec.version` may).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct PgVersion {
    pub major: u32,
    pub minor: Option<u32>,
}

impl fmt::Display for PgVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.minor {
            Some(minor) => write!(f, "{}.{minor}", self.major),
            None => write!(f, "{}", self.major),
        }
    }
}

impl CheckedValue for PgVersion {
    const EXPECTED: &'static str =
        "a PostgreSQL version \"MAJOR.MINOR\" or \"MAJOR\" such as \"15.20\" or \"18\"";
    const ALLOW_NON_STRING: bool = false;
    fn parse_raw(raw: &str) -> Result<Self, String> {
        let bad = || format!("{raw:?} is not {}", Self::EXPECTED);
        let (major, minor) = match raw.split_once('.') {
            Some((major, minor)) => (major, Some(minor)),
            None => (raw, None),
        };
        let num = |s: &str| -> Result<u32, String> {
            if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
                return Err(bad());
            }
            s.parse().map_err(|_| bad())
        };
        Ok(Self {
            major: num(major)?,
            minor: minor.map(num).transpose()?,
        })
    }
}

/// How many clusters of a rollout stage may be updated at the same time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Concurrency {
    /// An absolute number of clusters.
    Count(u32),
    /// A percentage (1..=100) of the clusters the stage selects.
    Percent(u32),
}

impl Default for Concurrency {
    fn default() -> Self {
        Self::Count(1)
    }
}

impl Concurrency {
    /// The number of clusters that may be in flight out of `total` candidates.
    ///
    /// Percentages round down, like Kubernetes' `maxUnavailable`, because a
    /// rollout should err on the side of fewer parallel changes — but never
    /// below 1, or a small stage with "10%" would never progress.
    pub fn limit(self, total: usize) -> usize {
        if total == 0 {
            return 0;
        }
        let n = match self {
            Self::Count(n) => n as usize,
            Self::Percent(p) => total.saturating_mul(p as usize) / 100,
        };
        n.clamp(1, total)
    }
}

impl CheckedValue for Concurrency {
    const EXPECTED: &'static str = "a count such as 2 or a percentage such as \"25%\"";
    fn parse_raw(raw: &str) -> Result<Self, String> {
        let bad = || format!("{raw:?} is not {}", Self::EXPECTED);
        if let Some(p) = raw.strip_suffix('%') {
            let p: u32 = p.trim().parse().map_err(|_| bad())?;
            if !(1..=100).contains(&p) {
                return Err(format!("{raw:?}: a percentage must be between 1% and 100%"));
            }
            return Ok(Self::Percent(p));
        }
        let n: u32 = raw.parse().map_err(|_| bad())?;
        if n == 0 {
            return Err("must be at least 1 (0 would never update anything)".into());
        }
        Ok(Self::Count(n))
    }
}

/// A credential read from the config. Its `Debug` never shows the value, so
/// a settings dump in a log or panic message cannot leak it.
#[derive(Clone, PartialEq, Eq)]
pub struct Secret(String);

impl Secret {
    pub fn new(value: impl Into<String>) -> Self {
        Self(value.into())
    }
    /// The credential itself; call only where it is sent, never to log it.
    pub fn expose(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("Secret(<redacted>)")
    }
}

/// Environment values that look numeric arrive as numbers (a token such as
/// `123456`), so any scalar is accepted and kept as text.
impl<'de> Deserialize<'de> for Secret {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (raw, _) = d.deserialize_any(ScalarVisitor)?;
        Ok(Self(raw))
    }
}

/// Deserializes a string map whose values may be written as TOML numbers or
/// booleans (`wave = 2`): label values are strings in Kubernetes, and
/// rejecting `2` would only annoy.
pub(crate) fn lenient_string_map<'de, D: Deserializer<'de>>(
    d: D,
) -> Result<BTreeMap<String, String>, D::Error> {
    struct MapVisitor;
    impl<'de> Visitor<'de> for MapVisitor {
        type Value = BTreeMap<String, String>;
        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("a table of string values")
        }
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut out = BTreeMap::new();
            while let Some(key) = map.next_key::<String>()? {
                let value: LabelValue = map.next_value()?;
                out.insert(key, value.0);
            }
            Ok(out)
        }
    }
    d.deserialize_map(MapVisitor)
}

struct LabelValue(String);

impl<'de> Deserialize<'de> for LabelValue {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let (raw, _) = d.deserialize_any(ScalarVisitor)?;
        Ok(Self(raw))
    }
}
