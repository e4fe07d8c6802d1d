//! Kubernetes-style label selectors over member-cluster labels.
//!
//! The same syntax as `kubectl -l` so that operators need to learn only one:
//! `env=prod,region in (eu,us),!legacy`. Parsing happens at load time so a
//! typo in a rollout stage is a config error, not a stage that silently
//! selects nothing.

use std::collections::BTreeMap;

use super::values::{Checked, CheckedValue};

/// A parsed label selector; the empty selector matches everything.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LabelSelector {
    requirements: Vec<Requirement>,
}

/// One comma-separated term of a selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Requirement {
    pub key: String,
    pub op: Operator,
    pub values: Vec<String>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Operator {
    /// `key=value` or `key==value`
    Equals,
    /// `key!=value` (also true when the label is absent, as in Kubernetes)
    NotEquals,
    /// `key in (a,b)`
    In,
    /// `key notin (a,b)` (also true when the label is absent)
    NotIn,
    /// `key`
    Exists,
    /// `!key`
    DoesNotExist,
}

/// A selector as written in the config, parsed at load time.
pub type Selector = Checked<LabelSelector>;

impl LabelSelector {
    /// Whether a set of labels satisfies every requirement.
    pub fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        self.requirements.iter().all(|r| r.matches(labels))
    }

    /// True for the empty selector, which selects everything.
    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }
}

impl Requirement {
    fn matches(&self, labels: &BTreeMap<String, String>) -> bool {
        let value = labels.get(&self.key);
        match self.op {
            Operator::Equals | Operator::In => value.is_some_and(|v| self.values.contains(v)),
            Operator::NotEquals | Operator::NotIn => {
                !value.is_some_and(|v| self.values.contains(v))
            }
            Operator::Exists => value.is_some(),
            Operator::DoesNotExist => value.is_none(),
        }
    }
}

impl CheckedValue for LabelSelector {
    const EXPECTED: &'static str =
        "a label selector such as \"env=prod,region in (eu,us),!legacy\"";
    const ALLOW_NON_STRING: bool = false;

    fn parse_raw(raw: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        if raw.trim().is_empty() {
            return Ok(Self { requirements });
        }
        for term in split_terms(raw)? {
            let req = parse_term(term.trim())
                .map_err(|e| format!("{raw:?} is not a valid label selector: {e}"))?;
            requirements.push(req);
        }
        Ok(Self { requirements })
    }
}

/// Splits on commas that are not inside `( … )`.
fn split_terms(raw: &str) -> Result<Vec<&str>, String> {
    let mut terms = Vec::new();
    let (mut depth, mut start) = (0usize, 0usize);
    for (i, c) in raw.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => {
                depth = depth
                    .checked_sub(1)
                    .ok_or_else(|| format!("{raw:?}: unbalanced ')'"))?;
            }
            ',' if depth == 0 => {
                terms.push(&raw[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if depth != 0 {
        return Err(format!("{raw:?}: unbalanced '('"));
    }
    terms.push(&raw[start..]);
    Ok(terms)
}

fn parse_term(term: &str) -> Result<Requirement, String> {
    if term.is_empty() {
        return Err("empty term (stray comma?)".into());
    }
    if let Some(key) = term.strip_prefix('!') {
        return requirement(key.trim(), Operator::DoesNotExist, Vec::new());
    }
    if let Some(open) = term.find('(') {
        let head: Vec<&str> = term[..open].split_whitespace().collect();
        let inner = term[open + 1..]
            .strip_suffix(')')
            .ok_or_else(|| format!("{term:?}: expected ')' at the end"))?;
        let (key, op) = match head.as_slice() {
            [key, "in"] => (*key, Operator::In),
            [key, "notin"] => (*key, Operator::NotIn),
            _ => {
                return Err(format!(
                    "{term:?}: expected \"key in (…)\" or \"key notin (…)\""
                ));
            }
        };
        let values: Vec<String> = inner.split(',').map(|v| v.trim().to_string()).collect();
        if values.iter().all(String::is_empty) {
            return Err(format!("{term:?}: the value list is empty"));
        }
        return requirement(key, op, values);
    }
    for (sym, op) in [
        ("!=", Operator::NotEquals),
        ("==", Operator::Equals),
        ("=", Operator::Equals),
    ] {
        if let Some((key, value)) = term.split_once(sym) {
            return requirement(key.trim(), op, vec![value.trim().to_string()]);
        }
    }
    requirement(term, Operator::Exists, Vec::new())
}

fn requirement(key: &str, op: Operator, values: Vec<String>) -> Result<Requirement, String> {
    check_label_key(key)?;
    for v in &values {
        check_label_value(v)?;
    }
    Ok(Requirement {
        key: key.to_string(),
        op,
        values,
    })
}

/// Checks a label key: optional DNS-subdomain prefix and `/`, then a name.
pub(crate) fn check_label_key(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix
        && (p.is_empty() || p.len() > 253 || !p.split('.').all(is_dns_label))
    {
        return Err(format!(
            "label key {key:?} has an invalid prefix (must be a DNS subdomain)"
        ));
    }
    if name.is_empty() || name.len() > 63 || !is_label_text(name) {
        return Err(format!(
            "label key {key:?} is invalid (at most 63 characters: letters, digits, '-', '_', '.', \
             starting and ending with a letter or digit)"
        ));
    }
    Ok(())
}

/// Checks a label value: empty, or up to 63 label characters.
pub(crate) fn check_label_value(value: &str) -> Result<(), String> {
    if value.is_empty() || (value.len() <= 63 && is_label_text(value)) {
        Ok(())
    } else {
        Err(format!(
            "label value {value:?} is invalid (at most 63 characters: letters, digits, '-', '_', \
             '.', starting and ending with a letter or digit)"
        ))
    }
}

fn is_label_text(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_alphanumeric();
    b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
}

/// A DNS-1123 label: 1–63 lowercase letters, digits or '-', alphanumeric at both ends.
pub fn is_dns_label(s: &str) -> bool {
    let b = s.as_bytes();
    let edge = |c: &u8| c.is_ascii_lowercase() || c.is_ascii_digit();
    !b.is_empty()
        && b.len() <= 63
        && b.first().is_some_and(edge)
        && b.last().is_some_and(edge)
        && b.iter().all(|c| edge(c) || *c == b'-')
}
