//! Object names and labels as kube-apiserver validates them, with its error
//! texts, so that a name pgfleet derives from tenant input (a Service
//! `<cluster>-rw`, a label carrying the cluster name) is refused here exactly
//! where a real cluster would refuse it, instead of working only on the
//! emulator.
//!
//! - Services: DNS-1035 labels (start with a letter, ≤ 63);
//! - Namespaces: DNS-1123 labels (≤ 63);
//! - RBAC objects: path segments (`system:…` names are fine there);
//! - everything else: DNS-1123 subdomains (≤ 253, dot-separated labels);
//! - label values ≤ 63 and label keys `[prefix/]name` (name ≤ 63, prefix a
//!   DNS-1123 subdomain).

use super::error::ApiError;
use super::resources::ResourceType;
use crate::json_ptr::Ptr;
use serde_json::Value;

const LABEL_RE: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?";
const DNS1035_RE: &str = "[a-z]([-a-z0-9]*[a-z0-9])?";
const SUBDOMAIN_RE: &str = "[a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*";
const VALUE_RE: &str = "(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?";
const QUALIFIED_RE: &str = "([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]";

/// kube's `RegexError`: the message, the examples, the regex.
fn regex_error(msg: &str, re: &str, examples: &[&str]) -> String {
    let ex: String = examples
        .iter()
        .map(|e| format!("'{e}', "))
        .collect::<Vec<_>>()
        .join(" or ");
    format!("{msg} (e.g. {ex}regex used for validation is '{re}')")
}

fn max_len(n: usize) -> String {
    format!("must be no more than {n} characters")
}

fn alnum(c: char) -> bool {
    c.is_ascii_lowercase() || c.is_ascii_digit()
}

fn is_label(s: &str) -> bool {
    !s.is_empty()
        && s.chars().all(|c| alnum(c) || c == '-')
        && s.starts_with(alnum)
        && s.ends_with(alnum)
}

/// DNS-1123 label problems (empty when valid).
pub fn dns1123_label(s: &str) -> Vec<String> {
    let mut out = vec![];
    if s.len() > 63 {
        out.push(max_len(63));
    }
    if !is_label(s) {
        out.push(regex_error(
            "a lowercase RFC 1123 label must consist of lower case alphanumeric characters or '-', and must start and end with an alphanumeric character",
            LABEL_RE,
            &["my-name", "123-abc"],
        ));
    }
    out
}

/// DNS-1035 label problems (Service names).
pub fn dns1035_label(s: &str) -> Vec<String> {
    let mut out = vec![];
    if s.len() > 63 {
        out.push(max_len(63));
    }
    if !is_label(s) || !s.starts_with(|c: char| c.is_ascii_lowercase()) {
        out.push(regex_error(
            "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character",
            DNS1035_RE,
            &["my-name", "abc-123"],
        ));
    }
    out
}

/// DNS-1123 subdomain problems.
pub fn dns1123_subdomain(s: &str) -> Vec<String> {
    let mut out = vec![];
    if s.len() > 253 {
        out.push(max_len(253));
    }
    if !s.split('.').all(is_label) {
        out.push(regex_error(
            "a lowercase RFC 1123 subdomain must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character",
            SUBDOMAIN_RE,
            &["example.com"],
        ));
    }
    out
}

/// Path-segment names (RBAC objects): anything but `.`, `..`, `/`, `%`.
fn path_segment(s: &str) -> Vec<String> {
    if s == "." || s == ".." {
        return vec![format!("may not be '{s}'")];
    }
    ["/", "%"]
        .iter()
        .filter(|x| s.contains(*x))
        .map(|x| format!("may not contain '{x}'"))
        .collect()
}

/// The name check kube applies to `rt`'s objects.
pub fn validate_name(rt: &ResourceType, name: &str) -> Result<(), ApiError> {
    let problems = match (rt.group.as_str(), rt.plural.as_str()) {
        (_, "events") if rt.group.is_empty() || rt.group == "events.k8s.io" => vec![],
        ("", "services") => dns1035_label(name),
        ("", "namespaces") => dns1123_label(name),
        ("rbac.authorization.k8s.io", _) => path_segment(name),
        _ => dns1123_subdomain(name),
    };
    if problems.is_empty() {
        return Ok(());
    }
    let shown = serde_json::to_string(name).unwrap_or_default();
    Err(ApiError::invalid(
        &rt.kind,
        name,
        problems
            .into_iter()
            .map(|p| {
                (
                    "metadata.name".to_string(),
                    "FieldValueInvalid".to_string(),
                    format!("metadata.name: Invalid value: {shown}: {p}"),
                )
            })
            .collect(),
    ))
}

fn is_qualified_name_part(s: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric();
    !s.is_empty()
        && s.len() <= 63
        && s.chars().all(|c| ok(c) || c == '-' || c == '_' || c == '.')
        && s.starts_with(ok)
        && s.ends_with(ok)
}

/// Label key and value problems, as (field, message) pairs.
pub fn label_problems(labels: Option<&Value>) -> Vec<(String, String)> {
    let mut out = vec![];
    for (k, v) in labels.and_then(Value::as_object).into_iter().flatten() {
        let (prefix, name) = match k.split_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, k.as_str()),
        };
        let key_ok = is_qualified_name_part(name)
            && prefix.is_none_or(|p| !p.is_empty() && dns1123_subdomain(p).is_empty());
        if !key_ok {
            out.push((
                "metadata.labels".to_string(),
                format!(
                    "metadata.labels: Invalid value: {}: {}",
                    serde_json::to_string(k).unwrap_or_default(),
                    regex_error(
                        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                        QUALIFIED_RE,
                        &["MyName", "my.name", "123-abc"],
                    )
                ),
            ));
        }
        let val = v.as_str().unwrap_or_default();
        let shown = serde_json::to_string(val).unwrap_or_default();
        if val.len() > 63 {
            out.push((
                "metadata.labels".to_string(),
                format!("metadata.labels: Invalid value: {shown}: {}", max_len(63)),
            ));
        }
        let ok = |c: char| c.is_ascii_alphanumeric();
        let val_ok = val.is_empty()
            || (val
                .chars()
                .all(|c| ok(c) || c == '-' || c == '_' || c == '.')
                && val.starts_with(ok)
                && val.ends_with(ok));
        if !val_ok {
            out.push((
                "metadata.labels".to_string(),
                format!(
                    "metadata.labels: Invalid value: {shown}: {}",
                    regex_error(
                        "a valid label must be an empty string or consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                        VALUE_RE,
                        &["MyValue", "my_value", "12345"],
                    )
                ),
            ));
        }
    }
    out
}

/// Name, `generateName`, labels and annotations of an object being written
/// (422 Invalid like kube, every problem a cause with its field path).
pub fn validate_object(rt: &ResourceType, name: &str, v: &Value) -> Result<(), ApiError> {
    // kube reports every problem: generateName, then the name, labels, annotations.
    let mut causes = vec![];
    if let Some(prefix) = v.ptr("/metadata/generateName").and_then(Value::as_str) {
        causes.extend(generate_name_problems(rt, prefix));
    }
    if let Err(e) = validate_name(rt, name) {
        causes.extend(causes_of(&e));
    }
    causes.extend(
        label_problems(v.ptr("/metadata/labels"))
            .into_iter()
            .map(|(f, m)| (f, "FieldValueInvalid".to_string(), m)),
    );
    causes.extend(annotation_problems(v.ptr("/metadata/annotations")));
    if causes.is_empty() {
        return Ok(());
    }
    Err(ApiError::invalid(&rt.kind, name, causes))
}

/// The (field, reason, "field: message") causes of a 422.
fn causes_of(e: &ApiError) -> Vec<(String, String, String)> {
    let causes = e
        .details
        .as_ref()
        .and_then(|d| d.get("causes"))
        .and_then(Value::as_array);
    causes
        .into_iter()
        .flatten()
        .map(|c| {
            let s = |k: &str| {
                c.get(k)
                    .and_then(Value::as_str)
                    .unwrap_or_default()
                    .to_string()
            };
            let field = s("field");
            (
                field.clone(),
                s("reason"),
                format!("{field}: {}", s("message")),
            )
        })
        .collect()
}

/// kube's total size limit of an object's annotations (keys plus values).
const ANNOTATIONS_MAX_BYTES: usize = 256 * 1024;

/// Annotation keys are qualified names like label keys; together with their
/// values they may not exceed 256 KiB.
fn annotation_problems(annotations: Option<&Value>) -> Vec<(String, String, String)> {
    let Some(m) = annotations.and_then(Value::as_object) else {
        return vec![];
    };
    let mut out = vec![];
    for k in m.keys() {
        let (prefix, name) = match k.split_once('/') {
            Some((p, n)) => (Some(p), n),
            None => (None, k.as_str()),
        };
        let ok = is_qualified_name_part(name)
            && prefix.is_none_or(|p| !p.is_empty() && dns1123_subdomain(p).is_empty());
        if !ok {
            out.push((
                "metadata.annotations".to_string(),
                "FieldValueInvalid".to_string(),
                format!(
                    "metadata.annotations: Invalid value: {}: {}",
                    serde_json::to_string(k).unwrap_or_default(),
                    regex_error(
                        "name part must consist of alphanumeric characters, '-', '_' or '.', and must start and end with an alphanumeric character",
                        QUALIFIED_RE,
                        &["MyName", "my.name", "123-abc"],
                    )
                ),
            ));
        }
    }
    let total: usize = m
        .iter()
        .map(|(k, v)| k.len() + v.as_str().map_or(0, str::len))
        .sum();
    if total > ANNOTATIONS_MAX_BYTES {
        out.push((
            "metadata.annotations".to_string(),
            "FieldValueTooLong".to_string(),
            format!(
                "metadata.annotations: Too long: may not be more than {ANNOTATIONS_MAX_BYTES} bytes"
            ),
        ));
    }
    out
}

/// `generateName` is checked as a name prefix: kube masks a trailing `-`
/// (the random suffix follows it) and applies the kind's name rule.
fn generate_name_problems(rt: &ResourceType, prefix: &str) -> Vec<(String, String, String)> {
    let masked = match prefix.strip_suffix('-') {
        Some(p) => format!("{p}a"),
        None => prefix.to_string(),
    };
    let Err(e) = validate_name(rt, &masked) else {
        return vec![];
    };
    let shown = serde_json::to_string(prefix).unwrap_or_default();
    causes_of(&e)
        .into_iter()
        .map(|(_, reason, m)| {
            // "metadata.name: Invalid value: \"x\": why" → why
            let why = m.splitn(3, ": ").nth(2).unwrap_or(&m).to_string();
            (
                "metadata.generateName".to_string(),
                reason,
                format!("metadata.generateName: Invalid value: {shown}: {why}"),
            )
        })
        .collect()
}

/// The characters of generated name suffixes (kube's `utilrand.String`:
/// no vowels, no confusable digits).
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// A name from `generateName`: the prefix cut to 58 characters (so the
/// name fits a 63-character label) plus a random 5-character suffix.
pub fn generate_name(prefix: &str) -> String {
    let cut: String = prefix.chars().take(58).collect();
    let suffix: String = (0..5)
        .map(|_| {
            let i = rand::random::<u32>() as usize % SUFFIX_ALPHABET.len();
            char::from(SUFFIX_ALPHABET[i])
        })
        .collect();
    format!("{cut}{suffix}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn service_names_are_dns1035_labels() {
        assert!(dns1035_label("orders-rw").is_empty());
        let e = dns1035_label("1orders-rw");
        assert_eq!(
            e,
            vec![
                "a DNS-1035 label must consist of lower case alphanumeric characters or '-', start with an alphabetic character, and end with an alphanumeric character (e.g. 'my-name',  or 'abc-123', regex used for validation is '[a-z]([-a-z0-9]*[a-z0-9])?')"
            ]
        );
        let long = format!("a{}", "b".repeat(63));
        assert_eq!(
            dns1035_label(&long),
            vec!["must be no more than 63 characters"]
        );
    }

    #[test]
    fn subdomains_check_every_dot_separated_label() {
        assert!(dns1123_subdomain("a.b-c.d1").is_empty());
        assert!(!dns1123_subdomain("a..b").is_empty());
        assert!(!dns1123_subdomain("a.-b").is_empty());
        assert!(!dns1123_subdomain("A").is_empty());
        assert_eq!(
            dns1123_subdomain(&"a".repeat(254)),
            vec!["must be no more than 253 characters"]
        );
    }

    #[test]
    fn generated_names_fit_a_label_and_use_kubes_alphabet() {
        let n = generate_name(&"p".repeat(70));
        assert_eq!(n.len(), 63);
        assert!(n[58..].bytes().all(|b| SUFFIX_ALPHABET.contains(&b)), "{n}");
        assert_eq!(generate_name("web-").len(), 9);
    }

    #[test]
    fn annotations_are_limited_to_256_kib_in_total() {
        let big = serde_json::json!({"a": "x".repeat(200 * 1024), "b": "y".repeat(60 * 1024)});
        let p = annotation_problems(Some(&big));
        assert_eq!(p.len(), 1, "{p:?}");
        assert_eq!(
            p[0].2,
            "metadata.annotations: Too long: may not be more than 262144 bytes"
        );
        assert!(annotation_problems(Some(&serde_json::json!({"ok/x": "v"}))).is_empty());
    }

    #[test]
    fn labels_are_checked_like_kube() {
        let long = "x".repeat(64);
        let labels =
            serde_json::json!({"pgfleet.io/cluster": long, "ok": "", "bad key!": "v", "v": "-x"});
        let p = label_problems(Some(&labels));
        assert_eq!(p.len(), 3, "{p:?}");
        assert!(
            p.iter()
                .any(|(_, m)| m.ends_with("must be no more than 63 characters"))
        );
        assert!(path_segment("system:controller:x").is_empty());
        assert!(!path_segment("a/b").is_empty());
    }
}
