//! Unit tests of `selector.rs`.

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
    let sel = LabelSelector::from_map(json!({"app": "pg", "role": "primary"}).as_object().unwrap());
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
