//! Label and field selectors, parsed the way kube-apiserver parses the `labelSelector` and
//! `fieldSelector` query parameters.
//!
//! kubectl (`get -l app=pg`, `--field-selector status.phase=Running`) and kube-rs informers
//! (scoped by `metadata.name=`) rely on the server filtering exactly like a real cluster,
//! including the easy-to-miss rule that `!=` / `notin` also match objects lacking the label.
//! Everything is pure over `serde_json` values so the store can call it while holding locks.

use serde_json::{Map, Value};

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

    fn matches(&self, labels: Option<&Map<String, Value>>) -> bool {
        let actual = labels.and_then(|m| m.get(&self.key)).map(text);
        let in_set = actual.as_ref().is_some_and(|a| self.values.contains(a));
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
        self.requirements.iter().all(|r| r.matches(labels))
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
fn text(v: &Value) -> String {
    v.as_str().map_or_else(|| v.to_string(), str::to_owned)
}

fn field_string(obj: &Value, path: &str) -> String {
    let v = path.split('.').try_fold(obj, |v, seg| v.get(seg));
    v.filter(|v| !v.is_null()).map(text).unwrap_or_default()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    fn m(sel: &str, labels: Value) -> bool {
        LabelSelector::parse(sel)
            .unwrap()
            .matches(labels.as_object())
    }

    #[test]
    fn empty_selector_matches_everything() {
        let s = LabelSelector::parse("  ").unwrap();
        assert!(s.is_empty() && s.matches(None) && m("", json!({"a": "b"})));
    }

    #[test]
    fn equality_operators() {
        for sel in ["app=pg", "app==pg", " app = pg "] {
            assert!(
                m(sel, json!({"app": "pg"})) && !m(sel, json!({"app": "x"})),
                "{sel}"
            );
            assert!(!m(sel, json!({})) && !m(sel, Value::Null), "{sel}");
        }
        assert!(!m("tier!=db", json!({"tier": "db"})) && m("tier!=db", json!({"tier": "web"})));
        assert!(
            m("tier!=db", json!({})),
            "!= matches an absent label, like kube"
        );
        assert!(m("a=", json!({"a": ""})) && !m("a=", json!({"a": "x"})));
        assert!(
            m("n=1", json!({"n": 1})),
            "non-string label values are compared as text"
        );
    }

    #[test]
    fn set_operators() {
        let sel = "env in (prod, staging)";
        assert!(m(sel, json!({"env": "prod"})) && m(sel, json!({"env": "staging"})));
        assert!(!m(sel, json!({"env": "dev"})) && !m(sel, json!({})));
        assert!(m("env in(prod)", json!({"env": "prod"})) && m("env in (a,)", json!({"env": ""})));
        assert!(!m("env notin (dev)", json!({"env": "dev"})) && m("env notin (dev)", json!({})));
        assert!(m("env notin (dev)", json!({"env": "prod"})));
    }

    #[test]
    fn existence_operators_and_combination() {
        assert!(m("has-key", json!({"has-key": ""})) && !m("has-key", json!({})));
        assert!(m("!no-key", json!({"x": "1"})) && !m("! no-key", json!({"no-key": "1"})));
        let sel = "app=pg,tier!=db,env in (prod,staging),env notin (dev),has-key,!no-key";
        let ok = json!({"app": "pg", "tier": "x", "env": "prod", "has-key": "y"});
        assert!(m(sel, ok.clone()));
        let mut bad = ok;
        bad["no-key"] = json!("z");
        assert!(!m(sel, bad));
        assert!(m(
            "app.kubernetes.io/name=pg",
            json!({"app.kubernetes.io/name": "pg"})
        ));
        let (a, b) = (
            LabelSelector::parse("a=1,b in (2)"),
            LabelSelector::parse("b in (2), a==1"),
        );
        assert_eq!(
            a.unwrap(),
            b.unwrap(),
            "requirements are kept in canonical key order"
        );
    }

    #[test]
    fn bad_label_selectors_name_the_problem() {
        let long = format!("a={}", "x".repeat(64));
        let cases = [
            ("app=p g", "p g"),
            ("=pg", "must not be empty"),
            ("app=pg,", "stray comma"),
            ("a b=c", "unexpected \"b=c\""),
            ("app=pg!", "pg!"),
            ("a$b=c", "a$b"),
            ("env in (prod", "unclosed"),
            ("env in prod)", "unbalanced"),
            ("env in ()", "can't be empty"),
            ("env in (a,(b))", "nested"),
            ("env in (a b)", "a b"),
            ("env notinx (a)", "expected '(value"),
            ("env>1", "unexpected \">1\""),
            ("Bad.Prefix/app=x", "DNS-1123"),
            ("app=-x", "-x"),
            ("app/=x", "label key name \"\""),
            ("!", "must not be empty"),
            (long.as_str(), "63"),
        ];
        for (input, needle) in cases {
            let err = LabelSelector::parse(input).unwrap_err();
            assert!(err.contains(needle), "{input}: {err}");
        }
    }

    #[test]
    fn metav1_label_selector_json() {
        let v = json!({"matchLabels": {"app": "pg"}, "matchExpressions": [
            {"key": "env", "operator": "In", "values": ["prod"]},
            {"key": "dev", "operator": "NotIn", "values": ["1"]},
            {"key": "role", "operator": "Exists"},
            {"key": "gone", "operator": "DoesNotExist", "values": []}]});
        let sel = LabelSelector::from_label_selector_json(&v).unwrap();
        assert_eq!(sel.requirements().len(), 5);
        assert!(sel.matches(json!({"app": "pg", "env": "prod", "role": "primary"}).as_object()));
        assert!(!sel.matches(json!({"app": "pg", "env": "prod"}).as_object()));
        assert!(
            LabelSelector::from_label_selector_json(&json!({}))
                .unwrap()
                .is_empty()
        );
        assert!(
            LabelSelector::from_label_selector_json(&Value::Null)
                .unwrap()
                .is_empty()
        );
        let bad = [
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Gt", "values": ["1"]}]}),
                "Gt",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In"}]}),
                "non-empty",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "Exists", "values": ["x"]}]}),
                "empty",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": "x"}]}),
                "array",
            ),
            (
                json!({"matchExpressions": [{"key": "a", "operator": "In", "values": [1]}]}),
                "strings",
            ),
            (
                json!({"matchExpressions": [{"operator": "Exists"}]}),
                "string key",
            ),
            (json!({"matchExpressions": {}}), "must be an array"),
            (json!({"matchLabels": {"a": 1}}), "must be a string"),
            (json!({"matchLabels": {"a b": "x"}}), "a b"),
            (json!({"matchLabels": {"a": "x y"}}), "x y"),
            (json!({"matchLabels": ["a"]}), "must be an object"),
            (json!("app=pg"), "must be an object"),
        ];
        for (v, needle) in bad {
            let err = LabelSelector::from_label_selector_json(&v).unwrap_err();
            assert!(err.contains(needle), "{v}: {err}");
        }
    }

    #[test]
    fn from_map_is_equality() {
        let sel =
            LabelSelector::from_map(json!({"app": "pg", "role": "primary"}).as_object().unwrap());
        assert!(sel.matches(json!({"app": "pg", "role": "primary", "x": "y"}).as_object()));
        assert!(!sel.matches(json!({"app": "pg"}).as_object()));
        assert!(LabelSelector::from_map(&Map::new()).matches(None));
    }

    #[test]
    fn field_selector_operators() {
        let pod = json!({"metadata": {"name": "pg-0", "namespace": "db"}, "spec": {"nodeName": "n1"},
                         "status": {"phase": "Running", "ready": true, "count": 3}});
        let f = |s: &str| FieldSelector::parse(s).unwrap().matches(&pod);
        assert!(f("metadata.name=pg-0") && f("metadata.name==pg-0") && !f("metadata.name!=pg-0"));
        assert!(f("metadata.name=pg-0,metadata.namespace!=kube-system"));
        assert!(!f("metadata.name=pg-0,metadata.namespace=x"));
        assert!(f("spec.nodeName=n1") && f("status.phase!=Pending") && f("status.ready=true"));
        assert!(f("status.count=3") && f("spec.missing=") && !f("spec.missing!=") && f("a.b!=x"));
        assert!(f("") && f("metadata.name=pg-0,") && FieldSelector::parse("").unwrap().is_empty());
    }

    #[test]
    fn field_selector_escapes_and_pinned_name() {
        let sel = FieldSelector::parse(r"metadata.name=a\,b\=c\\d").unwrap();
        assert!(sel.matches(&json!({"metadata": {"name": "a,b=c\\d"}})));
        assert_eq!(sel.pinned_name(), Some("a,b=c\\d"));
        let two = FieldSelector::parse("metadata.namespace=x,metadata.name==y").unwrap();
        assert_eq!(two.pinned_name(), Some("y"));
        assert_eq!(
            FieldSelector::parse("metadata.name!=y")
                .unwrap()
                .pinned_name(),
            None
        );
        assert_eq!(
            FieldSelector::parse("metadata.name=")
                .unwrap()
                .pinned_name(),
            Some("")
        );
    }

    #[test]
    fn bad_field_selectors() {
        for (input, needle) in [
            ("metadata.name", "expected field=value"),
            ("=x", "bad field path"),
            ("metadata..name=x", "bad field path"),
            ("metadata.name=a=b", "unescaped '='"),
            (r"metadata.name=a\x", "invalid escape"),
            (r"metadata.name=a\", "lone backslash"),
        ] {
            let err = FieldSelector::parse(input).unwrap_err();
            assert!(err.contains(needle), "{input}: {err}");
        }
    }
}
