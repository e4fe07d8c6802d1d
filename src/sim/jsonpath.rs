//! The JSONPath subset kubectl's printer columns use (CRD
//! `additionalPrinterColumns`, `kubectl get -o jsonpath`), evaluated over
//! stored JSON. Split from `table.rs`, which renders the Tables with it.

use serde_json::Value;

enum Seg {
    Key(String),
    Index(i64),
    All,
    /// `[?(@.path)]` (existence) or `[?(@.path==lit)]` / `!=`; the bool is "equals".
    Filter(Vec<Seg>, Option<(bool, Value)>),
}

/// JSONPath subset used by CRD printer columns (and elsewhere): `.a.b`, `['dotted.key']`,
/// `[0]`, `[-1]`, `[*]`/`.*`, `[?(@.type=="Ready")]`, optional `{…}` / `$` wrapper. Returns the
/// first match, as kube's tableconvertor does; `None` for no match or an unsupported path.
pub fn json_path(obj: &Value, path: &str) -> Option<Value> {
    json_path_all(obj, path).into_iter().next()
}

/// All matches, in document order (empty for no match or an unsupported path).
pub fn json_path_all(obj: &Value, path: &str) -> Vec<Value> {
    parse_path(path)
        .map(|segs| eval(obj, &segs).into_iter().cloned().collect())
        .unwrap_or_default()
}

fn eval<'a>(root: &'a Value, segs: &[Seg]) -> Vec<&'a Value> {
    segs.iter().fold(vec![root], |cur, seg| {
        cur.into_iter().flat_map(|v| step(v, seg)).collect()
    })
}

fn step<'a>(v: &'a Value, seg: &Seg) -> Vec<&'a Value> {
    match (seg, v) {
        (Seg::Key(k), _) => v.get(k.as_str()).into_iter().collect(),
        (Seg::Index(i), Value::Array(a)) => {
            let idx = if *i < 0 {
                i64::try_from(a.len()).unwrap_or(i64::MAX) + i
            } else {
                *i
            };
            usize::try_from(idx)
                .ok()
                .and_then(|i| a.get(i))
                .into_iter()
                .collect()
        }
        (Seg::All, Value::Array(a)) => a.iter().collect(),
        (Seg::All, Value::Object(m)) => m.values().collect(),
        (Seg::Filter(path, cond), Value::Array(a)) => {
            let keep = |item: &&Value| match (eval(item, path).first(), cond) {
                (found, None) => found.is_some(),
                (found, Some((eq, want))) => found.is_some_and(|f| loose_eq(f, want)) == *eq,
            };
            a.iter().filter(keep).collect()
        }
        _ => Vec::new(),
    }
}

fn loose_eq(a: &Value, b: &Value) -> bool {
    match (a, b) {
        (Value::Number(x), Value::Number(y)) => x.as_f64() == y.as_f64(),
        _ => a == b,
    }
}

fn parse_path(p: &str) -> Option<Vec<Seg>> {
    let p = p.trim();
    let p = p
        .strip_prefix('{')
        .and_then(|q| q.strip_suffix('}'))
        .unwrap_or(p)
        .trim();
    let p = p.strip_prefix('$').unwrap_or(p);
    // Be lenient about a missing leading dot (`spec.x`); `@`/`$` alone is the current node.
    let p = if p.is_empty() || p.starts_with(['.', '[']) {
        p.to_owned()
    } else {
        format!(".{p}")
    };
    let (mut rest, mut segs) = (p.as_str(), Vec::new());
    while !rest.is_empty() {
        if let Some(r) = rest.strip_prefix('[') {
            let end = close_bracket(r)?;
            segs.push(parse_bracket(r[..end].trim())?);
            rest = &r[end + 1..];
        } else {
            let r = rest.strip_prefix('.')?;
            let end = r.find(['.', '[']).unwrap_or(r.len());
            segs.push(match &r[..end] {
                "" => return None, // `..` (recursive descent) and trailing dots are unsupported
                "*" => Seg::All,
                key => Seg::Key(key.to_owned()),
            });
            rest = &r[end..];
        }
    }
    Some(segs)
}

/// Byte index of the `]` closing a bracket whose body starts `s`, skipping quoted strings and
/// nested brackets (`[?(@.a[0]==1)]`).
fn close_bracket(s: &str) -> Option<usize> {
    let (mut depth, mut quote) = (0usize, None);
    for (i, c) in s.char_indices() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '"' | '\'') => quote = Some(c),
            (None, '[') => depth += 1,
            (None, ']') if depth == 0 => return Some(i),
            (None, ']') => depth -= 1,
            _ => {}
        }
    }
    None
}

fn parse_bracket(inner: &str) -> Option<Seg> {
    if inner == "*" {
        return Some(Seg::All);
    }
    if let Some(expr) = inner.strip_prefix('?') {
        let expr = expr.trim().strip_prefix('(')?.strip_suffix(')')?.trim();
        let op = ["==", "!="]
            .iter()
            .filter_map(|op| Some((expr.find(op)?, *op)))
            .min();
        let (lhs, cond) = match op {
            Some((i, op)) => (
                &expr[..i],
                Some((op == "==", literal(expr[i + 2..].trim())?)),
            ),
            None => (expr, None),
        };
        return Some(Seg::Filter(
            parse_path(lhs.trim().strip_prefix('@')?)?,
            cond,
        ));
    }
    match literal(inner)? {
        Value::String(s) => Some(Seg::Key(s)),
        Value::Number(n) => n.as_i64().map(Seg::Index),
        _ => None,
    }
}

/// A filter/bracket literal: `'x'`, or JSON (`"x"`, number, `true`/`false`/`null`).
fn literal(s: &str) -> Option<Value> {
    let single = s.strip_prefix('\'').and_then(|r| r.strip_suffix('\''));
    single
        .map(|u| Value::String(u.into()))
        .or_else(|| serde_json::from_str(s).ok())
}
