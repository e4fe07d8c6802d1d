//! Validation half of [`super`]: kube-openapi's checks over one schema node, with errors rendered the way
//! apiextensions-apiserver converts them into apimachinery field errors.

use std::cell::RefCell;
use std::collections::HashMap;

use regex::Regex;
use serde_json::{Map, Number, Value};

use super::{EMBEDDED, FieldError, INT_OR_STRING, META, child_schema, flag, join};

/// OpenAPI validation of `x` against schema node `s` at `path` (`""` for the object root), as kube-openapi does it.
pub(super) fn validate(s: &Value, x: &Value, path: &str, root: bool, errs: &mut Vec<FieldError>) {
    if !s.is_object() {
        return;
    }
    // kube turns x-kubernetes-int-or-string into `type: [integer, string]` before validating.
    let ty = if flag(s, INT_OR_STRING) {
        Some("integer,string")
    } else {
        s.get("type").and_then(Value::as_str)
    };
    if let Some(t) = ty
        && !(x.is_null() && flag(s, "nullable"))
        && !t.split(',').any(|t| type_ok(t, x))
    {
        type_invalid(errs, path, t, json_type(x));
    }
    if x.is_null() {
        return;
    }
    compositions(s, x, path, errs);
    match x {
        Value::String(st) => check_string(s, st, path, errs),
        Value::Number(n) => check_number(s, n, path, errs),
        Value::Array(items) => check_array(s, items, path, errs),
        _ => {}
    }
    if let Some(allowed) = s.get("enum").and_then(Value::as_array)
        && !allowed.iter().any(|e| same(e, x))
    {
        let quoted: Vec<String> = allowed
            .iter()
            .map(|e| quote(&e.as_str().map_or_else(|| e.to_string(), str::to_owned)))
            .collect();
        let detail = if quoted.is_empty() {
            String::new()
        } else {
            format!(": supported values: {}", quoted.join(", "))
        };
        push(
            errs,
            path,
            "FieldValueNotSupported",
            format!("Unsupported value: {}{detail}", render(x)),
        );
    }
    if let Value::Object(m) = x {
        check_object(s, m, path, root, errs);
    }
}

fn json_type(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_f64() => "number",
        Value::Number(_) => "integer",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    }
}

/// JSON has one number type: `integer` accepts any number without a fraction (`3.0` too), like kube.
fn type_ok(want: &str, v: &Value) -> bool {
    match (want, v) {
        ("number", Value::Number(_)) => true,
        ("integer", Value::Number(n)) => n.as_f64().is_some_and(|f| f.fract() == 0.0),
        _ => json_type(v) == want,
    }
}

/// Enum membership; numbers compare by value so `1` matches an enum entry written as `1.0`.
fn same(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) if x.is_f64() || y.is_f64() => {
            x.as_f64() == y.as_f64()
        }
        _ => a == b,
    }
}

fn compositions(s: &Value, x: &Value, path: &str, errs: &mut Vec<FieldError>) {
    let branches = |key: &str| -> Vec<Vec<FieldError>> {
        let all = s
            .get(key)
            .and_then(Value::as_array)
            .map(Vec::as_slice)
            .unwrap_or_default();
        all.iter()
            .map(|b| {
                let mut e = Vec::new();
                validate(b, x, path, false, &mut e);
                e
            })
            .collect()
    };
    // Like kube, a failed anyOf/oneOf also reports why its closest branch failed.
    let closest = |results: Vec<Vec<FieldError>>| {
        results.into_iter().min_by_key(Vec::len).unwrap_or_default()
    };
    let any = branches("anyOf");
    if !any.is_empty() && !any.iter().any(Vec::is_empty) {
        composite(errs, path, "must validate at least one schema (anyOf)");
        errs.extend(closest(any));
    }
    let one = branches("oneOf");
    let valid = one.iter().filter(|r| r.is_empty()).count();
    if !one.is_empty() && valid != 1 {
        let found = if valid == 0 {
            "Found none valid".to_owned()
        } else {
            format!("Found {valid} valid alternatives")
        };
        composite(
            errs,
            path,
            &format!("must validate one and only one schema (oneOf). {found}"),
        );
        if valid == 0 {
            errs.extend(closest(one));
        }
    }
    let all = branches("allOf");
    let valid = all.iter().filter(|r| r.is_empty()).count();
    if valid < all.len() {
        errs.extend(all.into_iter().flatten());
        let none = if valid == 0 { ". None validated" } else { "" };
        composite(
            errs,
            path,
            &format!("must validate all the schemas (allOf){none}"),
        );
    }
    if let Some(not) = s.get("not").filter(|n| n.is_object()) {
        let mut e = Vec::new();
        validate(not, x, path, false, &mut e);
        if e.is_empty() {
            composite(errs, path, "must not validate the schema (not)");
        }
    }
}

fn check_string(s: &Value, st: &str, path: &str, errs: &mut Vec<FieldError>) {
    check_string_value(s, st, path, errs);
    format_check(s, st, path, errs);
}

/// maxLength, minLength, pattern: like go-openapi's string validator, the
/// first failure is the only one reported, so a value over maxLength is
/// never echoed back by a pattern error.
fn check_string_value(s: &Value, st: &str, path: &str, errs: &mut Vec<FieldError>) {
    // kube counts characters (runes) here, even though its message says bytes.
    let len = st.chars().count() as u64;
    if let Some(max) = count(s, "maxLength")
        && len > max
    {
        let unit = if max == 1 { "byte" } else { "bytes" };
        push(
            errs,
            path,
            "FieldValueTooLong",
            format!("Too long: may not be more than {max} {unit}"),
        );
        return;
    }
    if let Some(min) = count(s, "minLength")
        && len < min
    {
        invalid(
            errs,
            path,
            &quote(st),
            format!("{path} in body should be at least {min} chars long"),
        );
        return;
    }
    if let Some(pat) = s.get("pattern").and_then(Value::as_str) {
        let extra = match pattern_matches(pat, st) {
            Ok(true) => None,
            Ok(false) => Some(String::new()),
            Err(e) => Some(format!(", but pattern is invalid: {e}")),
        };
        if let Some(extra) = extra {
            invalid(
                errs,
                path,
                &quote(st),
                format!("{path} in body should match '{pat}{extra}'"),
            );
        }
    }
}

/// `format` (a validator of its own in kube-openapi, so it runs whatever
/// the length checks said).
fn format_check(s: &Value, st: &str, path: &str, errs: &mut Vec<FieldError>) {
    if let Some(f) = s.get("format").and_then(Value::as_str) {
        let re = match f {
            "date-time" | "datetime" => {
                r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$"
            }
            "date" => r"^\d{4}-\d{2}-\d{2}$",
            _ => "",
        };
        if !re.is_empty() && pattern_matches(re, st) == Ok(false) {
            type_invalid(errs, path, f, st);
        }
    }
}

fn check_number(s: &Value, n: &Number, path: &str, errs: &mut Vec<FieldError>) {
    let Some(v) = n.as_f64() else { return };
    // For integer data kube converts every bound to int64 first (truncating), and prints it that way.
    let int = !n.is_f64();
    let bad = num_str(n);
    if let Some(f) = s.get("multipleOf").and_then(Value::as_f64)
        && f > 0.0
    {
        let (ok, shown) = if int {
            let fi = f as i64;
            (
                fi == 0 || n.as_i64().is_none_or(|i| i % fi == 0),
                fi.to_string(),
            )
        } else {
            let q = if f < 1.0 { 1.0 / f * v } else { v / f };
            let r = q.round();
            (
                q == r || (q - r).abs() / (q.abs() + r.abs()) < 1e-9,
                go_float(f),
            )
        };
        if !ok {
            invalid(
                errs,
                path,
                &bad,
                format!("{path} in body should be a multiple of {shown}"),
            );
        }
    }
    for (key, excl, upper) in [
        ("maximum", "exclusiveMaximum", true),
        ("minimum", "exclusiveMinimum", false),
    ] {
        let Some(b) = s.get(key).and_then(Value::as_f64) else {
            continue;
        };
        let b = if int { b.trunc() } else { b };
        let excl = flag(s, excl);
        let rel = match (upper, excl) {
            (true, false) if v > b => "less than or equal to",
            (true, true) if v >= b => "less than",
            (false, false) if v < b => "greater than or equal to",
            (false, true) if v <= b => "greater than",
            _ => continue,
        };
        invalid(
            errs,
            path,
            &bad,
            format!("{path} in body should be {rel} {}", go_float(b)),
        );
    }
}

fn check_array(s: &Value, items: &[Value], path: &str, errs: &mut Vec<FieldError>) {
    if let Some(is) = s.get("items") {
        for (i, v) in items.iter().enumerate() {
            validate(is, v, &format!("{path}[{i}]"), false, errs);
        }
    }
    let len = items.len() as u64;
    if let Some(min) = count(s, "minItems")
        && len < min
    {
        invalid(
            errs,
            path,
            &len.to_string(),
            format!("{path} in body should have at least {min} items"),
        );
    }
    if let Some(max) = count(s, "maxItems")
        && len > max
    {
        too_many(errs, path, len, max);
    }
    if flag(s, "uniqueItems")
        && items
            .iter()
            .enumerate()
            .any(|(i, v)| items.iter().take(i).any(|u| u == v))
    {
        invalid(
            errs,
            path,
            "\"\"",
            format!("{path} in body shouldn't contain duplicates"),
        );
    }
}

fn check_object(
    s: &Value,
    m: &Map<String, Value>,
    path: &str,
    root: bool,
    errs: &mut Vec<FieldError>,
) {
    let n = m.len() as u64;
    // kube-openapi stops checking an object whose property count is out of bounds.
    if let Some(min) = count(s, "minProperties")
        && n < min
    {
        return invalid(
            errs,
            path,
            &n.to_string(),
            format!("{path} in body should have at least {min} properties"),
        );
    }
    if let Some(max) = count(s, "maxProperties")
        && n > max
    {
        return too_many(errs, path, n, max);
    }
    let embedded = !root && flag(s, EMBEDDED);
    let mut entries: Vec<(&String, &Value)> = m.iter().collect();
    entries.sort_by_key(|(k, _)| *k);
    for (k, v) in entries {
        if (root || embedded) && META.contains(&k.as_str()) {
            if root && k == "metadata" && !v.is_object() {
                type_invalid(errs, "metadata", "object", json_type(v));
            }
            continue;
        }
        if let Some(c) = child_schema(s, k) {
            validate(c, v, &join(path, k), false, errs);
        }
    }
    for r in s
        .get("required")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
    {
        if !m.contains_key(r) {
            push(
                errs,
                &join(path, r),
                "FieldValueRequired",
                "Required value".to_owned(),
            );
        }
    }
    if embedded {
        // An embedded resource needs apiVersion and kind, but not metadata (kube `validateEmbeddedResource`).
        for k in ["apiVersion", "kind"] {
            let p = join(path, k);
            match m.get(k) {
                Some(Value::String(v)) if !v.is_empty() => {}
                None | Some(Value::Null | Value::String(_)) => {
                    let body = "Required value: must not be empty".to_owned();
                    push(errs, &p, "FieldValueRequired", body);
                }
                Some(other) => invalid(errs, &p, &render(other), "must be a string".into()),
            }
        }
    }
}

/// `maxLength`/`minItems`... bounds; tolerates `3.0` since YAML tooling sometimes writes integers that way.
fn count(s: &Value, key: &str) -> Option<u64> {
    let v = s.get(key)?;
    v.as_u64().or_else(|| {
        v.as_f64()
            .filter(|f| *f >= 0.0 && f.fract() == 0.0)
            .map(|f| f as u64)
    })
}

thread_local! {
    /// Compiled `pattern`s (or their compile error). A CRD's patterns are checked on every write, so compile once.
    static REGEXES: RefCell<HashMap<String, Result<Regex, String>>> = RefCell::new(HashMap::new());
}

/// Unanchored search, like Go's `MatchString`. A pattern that does not compile yields its error (one line)
/// instead of a panic; the `regex` crate runs in linear time, so hostile patterns cannot stall the server.
/// One known gap with Go's RE2: `\d`, `\w`, `\s` also match non-ASCII digits/letters/spaces here.
fn pattern_matches(pat: &str, text: &str) -> Result<bool, String> {
    REGEXES.with(|cache| {
        let mut cache = cache.borrow_mut();
        if cache.len() > 512 {
            cache.clear();
        }
        let compiled = cache.entry(pat.to_owned()).or_insert_with(|| {
            Regex::new(pat).map_err(|e| {
                e.to_string()
                    .lines()
                    .last()
                    .unwrap_or_default()
                    .trim()
                    .to_owned()
            })
        });
        compiled
            .as_ref()
            .map(|re| re.is_match(text))
            .map_err(Clone::clone)
    })
}

// ------------------------------------------------------------------------------------------------ messages

fn push(errs: &mut Vec<FieldError>, field: &str, reason: &'static str, body: String) {
    // Only a non-object root has an empty path; don't print a dangling ": " for it.
    let message = if field.is_empty() {
        body
    } else {
        format!("{field}: {body}")
    };
    errs.push(FieldError {
        field: field.to_owned(),
        reason,
        message,
    });
}

fn invalid(errs: &mut Vec<FieldError>, field: &str, bad: &str, detail: String) {
    push(
        errs,
        field,
        "FieldValueInvalid",
        format!("Invalid value: {bad}: {detail}"),
    );
}

fn composite(errs: &mut Vec<FieldError>, path: &str, what: &str) {
    invalid(errs, path, "\"\"", format!("{path} {what}"));
}

/// kube reports the offending JSON type name (or string) as the bad value, not the value itself.
fn type_invalid(errs: &mut Vec<FieldError>, path: &str, want: &str, got: &str) {
    let got = quote(got);
    push(
        errs,
        path,
        "FieldValueTypeInvalid",
        format!("Invalid value: {got}: {path} in body must be of type {want}: {got}"),
    );
}

fn too_many(errs: &mut Vec<FieldError>, path: &str, n: u64, max: u64) {
    let unit = if max == 1 { "item" } else { "items" };
    push(
        errs,
        path,
        "FieldValueTooMany",
        format!("Too many: {n}: must have at most {max} {unit}"),
    );
}

/// A bad value printed like apimachinery does: numbers and booleans bare, strings Go-quoted, the rest as JSON.
fn render(v: &Value) -> String {
    match v {
        Value::String(s) => quote(s),
        Value::Number(n) => num_str(n),
        other => other.to_string(),
    }
}

fn num_str(n: &Number) -> String {
    match n.as_f64() {
        Some(f) if n.is_f64() => go_float(f),
        _ => n.to_string(),
    }
}

/// Go's `%v` for a float64: shortest digits, exponent form only below 1e-4 or from 1e21 (`1e-05`, `2e+21`).
pub(super) fn go_float(f: f64) -> String {
    let a = f.abs();
    if a == 0.0 || (1e-4..1e21).contains(&a) {
        return format!("{f}");
    }
    let s = format!("{f:e}");
    match s.split_once('e') {
        Some((mant, exp)) => {
            let (sign, digits) = exp.strip_prefix('-').map_or(("+", exp), |d| ("-", d));
            format!("{mant}e{sign}{digits:0>2}")
        }
        None => s,
    }
}

/// Go's `strconv.Quote`, which kube uses for string values.
pub(super) fn quote(s: &str) -> String {
    let mut out = String::with_capacity(s.len() + 2);
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{7}' => out.push_str("\\a"),
            '\u{8}' => out.push_str("\\b"),
            '\u{b}' => out.push_str("\\v"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || c == '\u{7f}' => {
                out.push_str(&format!("\\x{:02x}", c as u32))
            }
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
