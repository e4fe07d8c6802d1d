//! Label and field selectors, parsed the way kube-apiserver parses the `labelSelector` and
//! `fieldSelector` query parameters.
//!
//! kubectl (`get -l app=pg`, `--field-selector status.phase=Running`) and kube-rs informers
//! (scoped by `metadata.name=`) rely on the server filtering exactly like a real cluster,
//! including the easy-to-miss rule that `!=` / `notin` also match objects lacking the label.
//! Everything is pure over `serde_json` values so the store can call it while holding locks.

use serde_json::{Map, Value};
use std::borrow::Cow;

/// Label selector operators, as in `k8s.io/apimachinery/pkg/selection` (minus `>`/`<`,
/// which nothing in the fleet uses).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Equals,
    NotEquals,
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// One comma-separated clause of a label selector; all clauses must match (logical AND).
#[derive(Debug, Clone, PartialEq)]
pub struct Requirement {
    pub key: String,
    pub op: Op,
    /// One value for `=`/`!=`, a non-empty set for `in`/`notin`, none for (`!`)exists.
    pub values: Vec<String>,
}

impl Requirement {
    fn new(key: &str, op: Op, values: Vec<String>) -> Self {
        Self {
            key: key.to_owned(),
            op,
            values,
        }
    }

    fn matches<'a>(&self, label: impl Fn(&str) -> Option<Cow<'a, str>>) -> bool {
        let actual = label(&self.key);
        let in_set = actual
            .as_ref()
            .is_some_and(|a| self.values.iter().any(|v| v == a));
        match self.op {
            Op::Equals | Op::In => in_set,
            Op::NotEquals | Op::NotIn => !in_set,
            Op::Exists => actual.is_some(),
            Op::DoesNotExist => actual.is_none(),
        }
    }
}

/// A parsed label selector. The empty selector matches everything (kube semantics for
/// `labelSelector=` and for an empty `metav1.LabelSelector`).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LabelSelector {
    /// Sorted by key (as kube does) so equal selectors compare equal regardless of order.
    requirements: Vec<Requirement>,
}

impl LabelSelector {
    /// Parses `app=pg,tier!=db,env in (prod,staging),env notin (dev),has-key,!no-key` (also
    /// `==`). Empty string = everything. Errors quote the offending requirement.
    pub fn parse(s: &str) -> Result<Self, String> {
        if s.trim().is_empty() {
            return Ok(Self::default());
        }
        let reqs = split_top_level(s)?.into_iter().map(parse_term);
        Ok(Self::sorted(reqs.collect::<Result<_, _>>()?))
    }

    pub fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches(|k| labels.and_then(|m| m.get(k)).map(|v| text(v).into())))
    }

    /// [`LabelSelector::matches`] over a stored object's label index.
    pub fn matches_object(&self, o: &crate::store::StoredObject) -> bool {
        self.requirements
            .iter()
            .all(|r| r.matches(|k| o.label(k).map(Cow::Borrowed)))
    }

    /// Builds one from a `metav1.LabelSelector` object (`matchLabels` + `matchExpressions` with
    /// In/NotIn/Exists/DoesNotExist), as PDBs and StatefulSets carry. `null`/`{}` yield the
    /// empty selector; callers for which a *missing* selector means "nothing" check first.
    pub fn from_label_selector_json(v: &Value) -> Result<Self, String> {
        let obj = match v {
            Value::Null => return Ok(Self::default()),
            Value::Object(o) => o,
            other => return Err(format!("label selector must be an object, got {other}")),
        };
        let mut reqs = Vec::new();
        match obj.get("matchLabels") {
            None | Some(Value::Null) => {}
            Some(Value::Object(m)) => {
                for (k, v) in m {
                    let v = v
                        .as_str()
                        .ok_or(format!("matchLabels[{k:?}] must be a string"))?;
                    validate_key(k).and(validate_value(v))?;
                    reqs.push(Requirement::new(k, Op::Equals, vec![v.to_owned()]));
                }
            }
            Some(other) => return Err(format!("matchLabels must be an object, got {other}")),
        }
        match obj.get("matchExpressions") {
            None | Some(Value::Null) => {}
            Some(Value::Array(exprs)) => reqs.extend(
                exprs
                    .iter()
                    .map(parse_match_expression)
                    .collect::<Result<Vec<_>, _>>()?,
            ),
            Some(other) => return Err(format!("matchExpressions must be an array, got {other}")),
        }
        Ok(Self::sorted(reqs))
    }

    /// A plain equality map such as a Service's `.spec.selector`. Not validated: it came from a
    /// stored object, and a selector that matches nothing is the right outcome for junk.
    pub fn from_map(m: &Map<String, Value>) -> Self {
        Self::sorted(
            m.iter()
                .map(|(k, v)| Requirement::new(k, Op::Equals, vec![text(v)]))
                .collect(),
        )
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }

    pub fn requirements(&self) -> &[Requirement] {
        &self.requirements
    }

    fn sorted(mut requirements: Vec<Requirement>) -> Self {
        requirements.sort_by(|a, b| a.key.cmp(&b.key));
        Self { requirements }
    }
}

fn parse_match_expression(e: &Value) -> Result<Requirement, String> {
    let key = e.get("key").and_then(Value::as_str);
    let key = key.ok_or(format!("matchExpressions entry {e} needs a string key"))?;
    validate_key(key)?;
    let ctx = |msg: &str| format!("matchExpressions[{key:?}]: {msg}");
    let values: Vec<String> = match e.get("values") {
        None | Some(Value::Null) => Vec::new(),
        Some(Value::Array(a)) => {
            let v = a.iter().map(|x| {
                x.as_str()
                    .map(str::to_owned)
                    .ok_or(ctx("values must be strings"))
            });
            v.collect::<Result<_, _>>()?
        }
        Some(_) => return Err(ctx("values must be an array")),
    };
    values.iter().try_for_each(|v| validate_value(v))?;
    let op = match e.get("operator").and_then(Value::as_str) {
        Some("In") => Op::In,
        Some("NotIn") => Op::NotIn,
        Some("Exists") => Op::Exists,
        Some("DoesNotExist") => Op::DoesNotExist,
        other => return Err(ctx(&format!("unsupported operator {other:?}"))),
    };
    match (matches!(op, Op::In | Op::NotIn), values.is_empty()) {
        (true, true) => Err(ctx("values must be non-empty for In/NotIn")),
        (false, false) => Err(ctx("values must be empty for Exists/DoesNotExist")),
        _ => Ok(Requirement::new(key, op, values)),
    }
}

/// Splits on commas that are not inside `( … )`, so set values stay with their clause.
fn split_top_level(s: &str) -> Result<Vec<&str>, String> {
    let (mut open, mut start, mut out) = (false, 0, Vec::new());
    for (i, c) in s.char_indices() {
        match c {
            '(' if open => return Err(format!("nested '(' in label selector {s:?}")),
            ')' if !open => return Err(format!("unbalanced ')' in label selector {s:?}")),
            '(' | ')' => open = !open,
            ',' if !open => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if open {
        return Err(format!("unclosed '(' in label selector {s:?}"));
    }
    out.push(&s[start..]);
    Ok(out)
}

fn parse_term(raw: &str) -> Result<Requirement, String> {
    let t = raw.trim();
    if t.is_empty() {
        return Err("empty requirement in label selector (stray comma?)".to_owned());
    }
    let ctx = |e: String| format!("invalid label selector requirement {t:?}: {e}");
    if let Some(rest) = t.strip_prefix('!') {
        validate_key(rest.trim()).map_err(ctx)?;
        return Ok(Requirement::new(rest.trim(), Op::DoesNotExist, Vec::new()));
    }
    // The key runs up to whitespace or the first operator character.
    let end = t
        .find(|c: char| c.is_whitespace() || "=!<>(),".contains(c))
        .unwrap_or(t.len());
    let (key, rest) = (&t[..end], t[end..].trim_start());
    validate_key(key).map_err(ctx)?;
    let values = |list: &str| -> Result<Vec<String>, String> {
        let list = list
            .split(',')
            .map(|v| validate_value(v.trim()).map(|()| v.trim().to_owned()));
        list.collect::<Result<_, _>>().map_err(ctx)
    };
    let set_op = rest.strip_prefix("notin").map(|l| (Op::NotIn, l));
    if rest.is_empty() {
        Ok(Requirement::new(key, Op::Exists, Vec::new()))
    } else if let Some(v) = rest.strip_prefix("==").or_else(|| rest.strip_prefix('=')) {
        Ok(Requirement::new(key, Op::Equals, values(v)?))
    } else if let Some(v) = rest.strip_prefix("!=") {
        Ok(Requirement::new(key, Op::NotEquals, values(v)?))
    } else if let Some((op, l)) = set_op.or_else(|| rest.strip_prefix("in").map(|l| (Op::In, l))) {
        let inner = l.trim().strip_prefix('(').and_then(|l| l.strip_suffix(')'));
        match inner.map(str::trim) {
            None => Err(ctx("expected '(value, ...)' after in/notin".to_owned())),
            Some("") => Err(ctx("values set for in/notin can't be empty".to_owned())),
            Some(inner) => Ok(Requirement::new(key, op, values(inner)?)),
        }
    } else {
        Err(ctx(format!(
            "unexpected {rest:?} after key {key:?}; expected =, ==, !=, in or notin"
        )))
    }
}

/// kube's qualified-name / label-value body: `[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?`, ≤63.
fn check_name(s: &str, what: &str) -> Result<(), String> {
    if s.len() > 63 {
        return Err(format!("{what} {s:?} must be no more than 63 characters"));
    }
    let alnum = |c: char| c.is_ascii_alphanumeric();
    if !s.starts_with(alnum)
        || !s.ends_with(alnum)
        || !s.chars().all(|c| alnum(c) || "-_.".contains(c))
    {
        return Err(format!(
            "{what} {s:?} is invalid: must consist of alphanumeric characters, '-', '_' or '.', \
             and must start and end with an alphanumeric character"
        ));
    }
    Ok(())
}

/// Label keys are `[prefix/]name`, prefix a lowercase DNS-1123 subdomain (≤253).
fn validate_key(k: &str) -> Result<(), String> {
    if k.is_empty() {
        return Err("label key must not be empty".to_owned());
    }
    let Some((prefix, name)) = k.split_once('/') else {
        return check_name(k, "label key");
    };
    let dns = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit();
    let ok = prefix.starts_with(dns) && prefix.ends_with(dns) && prefix.len() <= 253;
    if !ok || !prefix.chars().all(|c| dns(c) || c == '-' || c == '.') {
        return Err(format!(
            "label key prefix {prefix:?} must be a lowercase DNS-1123 subdomain"
        ));
    }
    check_name(name, "label key name")
}

fn validate_value(v: &str) -> Result<(), String> {
    if v.is_empty() {
        Ok(())
    } else {
        check_name(v, "label value")
    }
}

/// One `field=value` / `field!=value` clause of a field selector.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldRequirement {
    /// Dotted path such as `metadata.name` or `involvedObject.uid`.
    pub path: String,
    /// `true` for `=`/`==`, `false` for `!=`.
    pub equals: bool,
    /// Unescaped value (`\,`, `\=`, `\\` are decoded as kube does).
    pub value: String,
}

/// A parsed field selector. Unlike kube we accept any dotted path (the store has no per-kind
/// field-label tables); the value is the string form of whatever sits there, missing = "".
#[derive(Debug, Clone, Default, PartialEq)]
pub struct FieldSelector {
    requirements: Vec<FieldRequirement>,
}

impl FieldSelector {
    /// Parses `metadata.name=x,metadata.namespace!=y` (`=`, `==`, `!=`); empty = everything.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut requirements = Vec::new();
        // kube skips empty terms (e.g. a trailing comma) and takes the leftmost operator.
        for term in split_escaped(s).into_iter().filter(|t| !t.is_empty()) {
            let err = |e: &str| format!("invalid field selector {term:?}: {e}");
            let ops = ["!=", "==", "="]
                .into_iter()
                .filter_map(|op| term.find(op).map(|i| (i, op)));
            let (i, op) = ops
                .min_by_key(|&(i, op)| (i, usize::MAX - op.len()))
                .ok_or(err("expected field=value, field==value or field!=value"))?;
            let path = term[..i].trim();
            if path
                .split('.')
                .any(|seg| seg.is_empty() || seg.contains(char::is_whitespace))
            {
                return Err(err(&format!("bad field path {path:?}")));
            }
            let value = unescape(&term[i + op.len()..]).map_err(|e| err(&e))?;
            requirements.push(FieldRequirement {
                path: path.to_owned(),
                equals: op != "!=",
                value,
            });
        }
        Ok(Self { requirements })
    }

    pub fn matches(&self, obj: &Value) -> bool {
        self.requirements
            .iter()
            .all(|r| (field_string(obj, &r.path) == r.value) == r.equals)
    }

    /// If the selector pins `metadata.name=X`, returns X (lets the store avoid a scan).
    pub fn pinned_name(&self) -> Option<&str> {
        let mut pins = self
            .requirements
            .iter()
            .filter(|r| r.equals && r.path == "metadata.name");
        pins.next().map(|r| r.value.as_str())
    }

    pub fn is_empty(&self) -> bool {
        self.requirements.is_empty()
    }
}

/// Splits on commas not preceded by a backslash (escapes are decoded later by `unescape`).
fn split_escaped(s: &str) -> Vec<&str> {
    let (mut out, mut start, mut slash) = (Vec::new(), 0, false);
    for (i, c) in s.char_indices() {
        match c {
            _ if slash => slash = false,
            '\\' => slash = true,
            ',' => {
                out.push(&s[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&s[start..]);
    out
}

/// kube's `fields.UnescapeValue`: only `\\`, `\,`, `\=` are valid; bare `,`/`=` are errors.
fn unescape(s: &str) -> Result<String, String> {
    let (mut out, mut slash) = (String::with_capacity(s.len()), false);
    for c in s.chars() {
        match c {
            '\\' | ',' | '=' if slash => {
                out.push(c);
                slash = false;
            }
            _ if slash => return Err(format!("invalid escape sequence \"\\{c}\"")),
            '\\' => slash = true,
            ',' | '=' => return Err(format!("unescaped {c:?} in value {s:?}")),
            _ => out.push(c),
        }
    }
    if slash {
        Err(format!("value {s:?} ends with a lone backslash"))
    } else {
        Ok(out)
    }
}

/// String form used for comparisons: valid labels are strings, but stringifying anything else
/// (rather than calling it absent) keeps `Exists` truthful and lets `status.ready=true` work.
pub(crate) fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

fn field_string(obj: &Value, path: &str) -> String {
    let v = path.split('.').try_fold(obj, |v, seg| v.get(seg));
    v.filter(|v| !v.is_null()).map(text).unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
#[path = "selector_tests.rs"]
mod tests;
