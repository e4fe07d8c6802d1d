//! What kube-apiserver does with a CustomResourceDefinition version's `openAPIV3Schema` when a custom object
//! is written or read back: structural defaulting, structural pruning and OpenAPI validation.
//!
//! The simulator keeps custom objects as plain `serde_json::Value`, so this works on JSON directly instead of
//! building a typed structural schema first. Error texts copy apimachinery's `field.Error` rendering of the
//! errors kube-openapi produces (as converted by apiextensions-apiserver), because clients and tests match on
//! them. Deliberate differences from kube:
//! - kube prunes before it defaults; we default first. Both agree for every CRD kube accepts (kube rejects
//!   defaults that are not already pruned), and this order also drops unknown fields from sloppy defaults.
//! - `x-kubernetes-validations` (CEL rules) are NOT evaluated, so they never fail; neither are list-type/map-key
//!   uniqueness, update ratcheting, nor ObjectMeta rules (the caller validates `metadata` itself).
//! - Only the `date-time` and `date` formats are checked; other formats are accepted as-is.
//! - anyOf/oneOf/allOf/not failures are reported on the node's own path, where kube reports them as `<nil>`.
//! - Maps are visited in key order so the error list is deterministic.
//!
//! Wording follows current kube (1.32+), not kube-openapi's internal texts: `maxLength` gives
//! `FieldValueTooLong` "Too long: may not be more than N bytes" (kube counts characters all the same),
//! `maxItems`/`maxProperties` give `FieldValueTooMany` "Too many: 4: must have at most 3 items"; the min*
//! checks keep kube-openapi's "in body should be at least N chars long / have at least N items".

use serde_json::Value;

/// Validation and kube-style messages, kept in a sibling file so each file stays readable.
#[path = "schema_validate.rs"]
mod validate;

const PRESERVE: &str = "x-kubernetes-preserve-unknown-fields";
const EMBEDDED: &str = "x-kubernetes-embedded-resource";
const INT_OR_STRING: &str = "x-kubernetes-int-or-string";
/// Fields of a resource (the root, or an embedded resource) that kube handles itself, outside the schema.
const META: [&str; 3] = ["apiVersion", "kind", "metadata"];

/// One problem with one field, shaped like a kube-apiserver StatusCause.
#[derive(Debug, Clone, PartialEq)]
pub struct FieldError {
    /// dotted path as kube prints it, e.g. `spec.clusterSize`, `spec.items[2].name`, `metadata.labels`
    pub field: String,
    /// kube's cause type: "FieldValueInvalid", "FieldValueRequired", "FieldValueNotSupported", "FieldValueTypeInvalid", "FieldValueTooLong", "FieldValueTooMany" ...
    pub reason: &'static str,
    /// full message like kube: `spec.clusterSize: Invalid value: 20: spec.clusterSize in body should be less than or equal to 16`
    pub message: String,
}

/// Defaults, then prunes, then validates `obj` (a whole object with apiVersion/kind/metadata/spec/status) against the
/// version's `openAPIV3Schema`. Returns every field error found (not just the first).
pub fn prepare(schema: &Value, obj: &mut Value) -> Result<(), Vec<FieldError>> {
    default_and_prune(schema, obj);
    let mut errs = Vec::new();
    validate::validate(schema, obj, "", true, &mut errs);
    if errs.is_empty() { Ok(()) } else { Err(errs) }
}

/// Only defaulting + pruning (used when reading objects stored before a schema change).
pub fn default_and_prune(schema: &Value, obj: &mut Value) {
    apply_defaults(schema, obj, true);
    prune(Some(schema), obj, true, false);
}

fn flag(s: &Value, key: &str) -> bool {
    s.get(key).and_then(Value::as_bool) == Some(true)
}

/// The schema for key `k` of an object: its declared property, else the `additionalProperties` schema.
fn child_schema<'a>(s: &'a Value, k: &str) -> Option<&'a Value> {
    s.get("properties")
        .and_then(|p| p.get(k))
        .or_else(|| s.get("additionalProperties").filter(|a| a.is_object()))
}

fn join(path: &str, key: &str) -> String {
    if path.is_empty() {
        key.to_owned()
    } else {
        format!("{path}.{key}")
    }
}

// ---------------------------------------------------------------------------------------------- defaulting

/// Structural defaulting (kube `structuraldefaulting.Default`): fills missing properties, and nulls where null
/// is not allowed, then recurses into every value, so defaults inside a freshly defaulted object apply too.
fn apply_defaults(s: &Value, x: &mut Value, root: bool) {
    match x {
        Value::Object(m) => {
            if let Some(props) = s.get("properties").and_then(Value::as_object) {
                for (k, p) in props {
                    if let Some(d) = p.get("default")
                        && !(root && META.contains(&k.as_str()))
                        && !m.contains_key(k)
                    {
                        m.insert(k.clone(), d.clone());
                    }
                }
            }
            for (k, v) in m.iter_mut() {
                if let Some(c) = child_schema(s, k)
                    && !(root && META.contains(&k.as_str()))
                {
                    default_value(c, v);
                }
            }
        }
        Value::Array(items) => {
            if let Some(is) = s.get("items") {
                items.iter_mut().for_each(|v| default_value(is, v));
            }
        }
        _ => {}
    }
}

fn default_value(s: &Value, v: &mut Value) {
    if v.is_null()
        && !flag(s, "nullable")
        && let Some(d) = s.get("default")
    {
        *v = d.clone();
    }
    apply_defaults(s, v, false);
}

// ------------------------------------------------------------------------------------------------- pruning

/// Structural pruning (kube `structuralpruning.Prune` plus `PruneNonNullableNullsWithoutDefaults`).
/// `s == None` means no schema covers `x`: objects in it lose every field, as in kube. `inherited` carries
/// `x-kubernetes-preserve-unknown-fields` one level into array items, as kube's `skipPrune` does.
fn prune(s: Option<&Value>, x: &mut Value, root: bool, inherited: bool) {
    let Some(s) = s.filter(|s| s.is_object()) else {
        if !inherited {
            strip(x);
        }
        return;
    };
    let preserve = inherited || flag(s, PRESERVE);
    match x {
        Value::Object(m) => {
            let keep_meta = root || flag(s, EMBEDDED);
            let open =
                preserve || s.get("additionalProperties").and_then(Value::as_bool) == Some(true);
            m.retain(|k, v| {
                if keep_meta && META.contains(&k.as_str()) {
                    return true;
                }
                match child_schema(s, k) {
                    // A null the schema does not allow and cannot default is dropped, not rejected.
                    Some(c) if v.is_null() => flag(c, "nullable") || c.get("default").is_some(),
                    Some(c) => {
                        prune(Some(c), v, false, false);
                        true
                    }
                    None => open,
                }
            });
        }
        Value::Array(items) => items
            .iter_mut()
            .for_each(|v| prune(s.get("items"), v, false, preserve)),
        _ => {}
    }
}

fn strip(x: &mut Value) {
    match x {
        Value::Object(m) => m.clear(),
        Value::Array(items) => items.iter_mut().for_each(strip),
        _ => {}
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::validate::{go_float, quote};
    use super::*;
    use serde_json::json;

    fn pg_schema() -> Value {
        json!({"type": "object", "required": ["spec"], "properties": {
            "apiVersion": {"type": "string"}, "kind": {"type": "string"}, "metadata": {"type": "object"},
            "spec": {"type": "object", "required": ["version"], "properties": {
                "clusterSize": {"type": "integer", "minimum": 1, "maximum": 16, "default": 1},
                "version": {"type": "string", "pattern": r"^\d+\.\d+$", "maxLength": 8},
                "mode": {"type": "string", "enum": ["async", "sync"], "default": "async"},
                "maxUnavailable": {"x-kubernetes-int-or-string": true},
                "postgresql": {"type": "object", "default": {}, "properties": {
                    "parameters": {"type": "object", "maxProperties": 3, "additionalProperties": {"type": "string"}},
                    "sharedBuffers": {"type": "string", "default": "128MB"}}},
                "backup": {"type": "object",
                    "anyOf": [{"required": ["bucket"]}, {"required": ["endpoint"]}],
                    "properties": {"bucket": {"type": "string", "minLength": 3}, "endpoint": {"type": "string"},
                        "schedule": {"type": "string", "nullable": true}}},
                "users": {"type": "array", "maxItems": 3, "items": {"type": "object", "required": ["name"],
                    "properties": {"name": {"type": "string"}, "superuser": {"type": "boolean", "default": false},
                        "roles": {"type": "array", "items": {"type": "string"}}}}},
                "template": {"type": "object", "x-kubernetes-embedded-resource": true,
                    "x-kubernetes-preserve-unknown-fields": true}}},
            "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": true,
                "properties": {"readyReplicas": {"type": "integer"}}}}})
    }

    fn obj(spec: Value) -> Value {
        json!({"apiVersion": "pg.example.com/v1", "kind": "PostgresCluster", "metadata": {"name": "db"}, "spec": spec})
    }

    /// `(field, reason, message)` of every error, for compact exact assertions.
    fn errors(schema: &Value, mut o: Value) -> Vec<(String, &'static str, String)> {
        match prepare(schema, &mut o) {
            Ok(()) => vec![],
            Err(errs) => errs
                .into_iter()
                .map(|e| (e.field, e.reason, e.message))
                .collect(),
        }
    }

    fn e(field: &str, reason: &'static str, message: &str) -> (String, &'static str, String) {
        (field.to_owned(), reason, message.to_owned())
    }

    #[test]
    fn defaults_apply_recursively() {
        let mut o = obj(
            json!({"version": "16.2", "users": [{"name": "app"}, {"name": "root", "superuser": true}]}),
        );
        prepare(&pg_schema(), &mut o).unwrap();
        assert_eq!(o["spec"]["clusterSize"], json!(1));
        assert_eq!(o["spec"]["mode"], json!("async"));
        // `postgresql` defaults to {}, and the default inside it then applies too.
        assert_eq!(o["spec"]["postgresql"], json!({"sharedBuffers": "128MB"}));
        assert_eq!(
            o["spec"]["users"][0],
            json!({"name": "app", "superuser": false})
        );
        assert_eq!(o["spec"]["users"][1]["superuser"], json!(true));
        assert!(
            o["spec"].get("backup").is_none(),
            "objects without a default are not created"
        );
    }

    #[test]
    fn unknown_fields_pruned_except_where_preserved() {
        let mut o = obj(json!({"version": "16.2", "bogus": 1,
            "postgresql": {"parameters": {"work_mem": "4MB"}, "junk": true},
            "users": [{"name": "a", "password": "x"}],
            "template": {"apiVersion": "v1", "kind": "Pod", "metadata": {"labels": {"a": "b"}}, "spec": {"x": 1}}}));
        o["metadata"]["labels"] = json!({"team": "db"});
        o["status"] = json!({"readyReplicas": 2, "conditions": [{"type": "Ready"}]});
        o["extra"] = json!("dropped");
        prepare(&pg_schema(), &mut o).unwrap();
        let spec = &o["spec"];
        assert!(spec.get("bogus").is_none() && o.get("extra").is_none());
        assert_eq!(
            spec["postgresql"],
            json!({"parameters": {"work_mem": "4MB"}, "sharedBuffers": "128MB"})
        );
        assert_eq!(spec["users"][0], json!({"name": "a", "superuser": false}));
        assert_eq!(spec["template"]["spec"], json!({"x": 1}));
        assert_eq!(spec["template"]["metadata"], json!({"labels": {"a": "b"}}));
        assert_eq!(o["status"]["conditions"], json!([{"type": "Ready"}]));
        assert_eq!(
            o["metadata"],
            json!({"name": "db", "labels": {"team": "db"}})
        );
        assert_eq!(o["kind"], json!("PostgresCluster"));
    }

    #[test]
    fn collects_every_error_with_kube_messages() {
        let mut o = obj(
            json!({"clusterSize": 20, "version": "abc", "mode": "fast", "maxUnavailable": true,
            "backup": {"schedule": "@daily"},
            "postgresql": {"parameters": {"max_connections": 100, "work_mem": "4MB"}},
            "users": [{"superuser": "yes"}, {"name": "b"}, {"name": "c"}, {"name": "d"}],
            "template": {"kind": "Pod"}}),
        );
        o["status"] = json!({"readyReplicas": "three"});
        assert_eq!(
            errors(&pg_schema(), o),
            vec![
                e(
                    "spec.backup",
                    "FieldValueInvalid",
                    r#"spec.backup: Invalid value: "": spec.backup must validate at least one schema (anyOf)"#
                ),
                e(
                    "spec.backup.bucket",
                    "FieldValueRequired",
                    "spec.backup.bucket: Required value"
                ),
                e(
                    "spec.clusterSize",
                    "FieldValueInvalid",
                    "spec.clusterSize: Invalid value: 20: spec.clusterSize in body should be less than or equal to 16"
                ),
                e(
                    "spec.maxUnavailable",
                    "FieldValueTypeInvalid",
                    r#"spec.maxUnavailable: Invalid value: "boolean": spec.maxUnavailable in body must be of type integer,string: "boolean""#
                ),
                e(
                    "spec.mode",
                    "FieldValueNotSupported",
                    r#"spec.mode: Unsupported value: "fast": supported values: "async", "sync""#
                ),
                e(
                    "spec.postgresql.parameters.max_connections",
                    "FieldValueTypeInvalid",
                    r#"spec.postgresql.parameters.max_connections: Invalid value: "integer": spec.postgresql.parameters.max_connections in body must be of type string: "integer""#
                ),
                e(
                    "spec.template.apiVersion",
                    "FieldValueRequired",
                    "spec.template.apiVersion: Required value: must not be empty"
                ),
                e(
                    "spec.users[0].superuser",
                    "FieldValueTypeInvalid",
                    r#"spec.users[0].superuser: Invalid value: "string": spec.users[0].superuser in body must be of type boolean: "string""#
                ),
                e(
                    "spec.users[0].name",
                    "FieldValueRequired",
                    "spec.users[0].name: Required value"
                ),
                e(
                    "spec.users",
                    "FieldValueTooMany",
                    "spec.users: Too many: 4: must have at most 3 items"
                ),
                e(
                    "spec.version",
                    "FieldValueInvalid",
                    r#"spec.version: Invalid value: "abc": spec.version in body should match '^\d+\.\d+$'"#
                ),
                e(
                    "status.readyReplicas",
                    "FieldValueTypeInvalid",
                    r#"status.readyReplicas: Invalid value: "string": status.readyReplicas in body must be of type integer: "string""#
                ),
            ]
        );
        let missing =
            json!({"apiVersion": "pg.example.com/v1", "kind": "PostgresCluster", "metadata": "x"});
        assert_eq!(
            errors(&pg_schema(), missing),
            vec![
                e(
                    "metadata",
                    "FieldValueTypeInvalid",
                    r#"metadata: Invalid value: "string": metadata in body must be of type object: "string""#
                ),
                e("spec", "FieldValueRequired", "spec: Required value"),
            ]
        );
        assert_eq!(
            errors(&pg_schema(), obj(json!({}))),
            vec![e(
                "spec.version",
                "FieldValueRequired",
                "spec.version: Required value"
            )]
        );
    }

    #[test]
    fn int_or_string() {
        for ok in [json!(1), json!("25%")] {
            assert_eq!(
                errors(
                    &pg_schema(),
                    obj(json!({"version": "1.2", "maxUnavailable": ok}))
                ),
                vec![]
            );
        }
        assert_eq!(
            errors(
                &pg_schema(),
                obj(json!({"version": "1.2", "maxUnavailable": 1.5}))
            ),
            vec![e(
                "spec.maxUnavailable",
                "FieldValueTypeInvalid",
                r#"spec.maxUnavailable: Invalid value: "number": spec.maxUnavailable in body must be of type integer,string: "number""#
            )]
        );
    }

    #[test]
    fn nullable_and_nulls() {
        let mut o = obj(json!({"version": null, "mode": null, "clusterSize": null,
            "backup": {"bucket": "b-1", "schedule": null}, "users": [{"name": "a", "roles": [null]}]}));
        let errs = prepare(&pg_schema(), &mut o).unwrap_err();
        let got: Vec<&str> = errs.iter().map(|e| e.message.as_str()).collect();
        assert_eq!(
            got,
            vec![
                r#"spec.users[0].roles[0]: Invalid value: "null": spec.users[0].roles[0] in body must be of type string: "null""#,
                "spec.version: Required value",
            ]
        );
        // Non-nullable nulls are defaulted when possible, dropped otherwise; nullable ones stay.
        assert_eq!(
            (&o["spec"]["mode"], &o["spec"]["clusterSize"]),
            (&json!("async"), &json!(1))
        );
        assert!(o["spec"].get("version").is_none());
        assert_eq!(
            o["spec"]["backup"],
            json!({"bucket": "b-1", "schedule": null})
        );
    }

    #[test]
    fn any_of_branches() {
        assert_eq!(
            errors(
                &pg_schema(),
                obj(json!({"version": "1.2", "backup": {"endpoint": "s3"}}))
            ),
            vec![]
        );
        assert_eq!(
            errors(
                &pg_schema(),
                obj(json!({"version": "1.2", "backup": {"bucket": "ab"}}))
            ),
            vec![e(
                "spec.backup.bucket",
                "FieldValueInvalid",
                r#"spec.backup.bucket: Invalid value: "ab": spec.backup.bucket in body should be at least 3 chars long"#
            )]
        );
    }

    #[test]
    fn other_keywords() {
        let schema = json!({"type": "object", "properties": {
            "ratio": {"type": "number", "minimum": 0, "exclusiveMinimum": true, "maximum": 1, "multipleOf": 0.25},
            "step": {"type": "integer", "multipleOf": 5, "format": "int32"},
            "tags": {"type": "array", "minItems": 1, "uniqueItems": true, "items": {"type": "string", "maxLength": 1}},
            "labels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}},
            "at": {"type": "string", "format": "date-time"},
            "odd": {"type": "integer", "enum": [1, 3], "not": {"minimum": 3}},
            "pick": {"oneOf": [{"minLength": 1}, {"maxLength": 3}], "allOf": [{"maxLength": 5}]}}});
        let mut o = json!({"ratio": 0, "step": 7, "tags": ["a", "bb", "a"], "labels": {},
            "at": "2024-01-01T00:00:00Z", "odd": 3, "pick": "ab"});
        let msgs: Vec<String> = prepare(&schema, &mut o)
            .unwrap_err()
            .into_iter()
            .map(|e| e.message)
            .collect();
        assert_eq!(
            msgs,
            vec![
                r#"labels: Invalid value: 0: labels in body should have at least 1 properties"#,
                r#"odd: Invalid value: "": odd must not validate the schema (not)"#,
                r#"pick: Invalid value: "": pick must validate one and only one schema (oneOf). Found 2 valid alternatives"#,
                "ratio: Invalid value: 0: ratio in body should be greater than 0",
                "step: Invalid value: 7: step in body should be a multiple of 5",
                "tags[1]: Too long: may not be more than 1 byte",
                r#"tags: Invalid value: "": tags in body shouldn't contain duplicates"#,
            ]
        );
        let mut o =
            json!({"ratio": 0.6, "tags": [], "at": "yesterday", "odd": 2, "pick": "toolong"});
        let msgs: Vec<String> = prepare(&schema, &mut o)
            .unwrap_err()
            .into_iter()
            .map(|e| e.message)
            .collect();
        assert_eq!(
            msgs,
            vec![
                r#"at: Invalid value: "yesterday": at in body must be of type date-time: "yesterday""#,
                r#"odd: Unsupported value: 2: supported values: "1", "3""#,
                "pick: Too long: may not be more than 5 bytes",
                r#"pick: Invalid value: "": pick must validate all the schemas (allOf). None validated"#,
                "ratio: Invalid value: 0.6: ratio in body should be a multiple of 0.25",
                "tags: Invalid value: 0: tags in body should have at least 1 items",
            ]
        );
    }

    #[test]
    fn bad_pattern_is_a_field_error_not_a_panic() {
        let schema =
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "(abc"}}});
        let errs = prepare(&schema, &mut json!({"a": "x\n\"y\""})).unwrap_err();
        assert_eq!(errs.len(), 1);
        assert_eq!(
            (errs[0].field.as_str(), errs[0].reason),
            ("a", "FieldValueInvalid")
        );
        assert!(errs[0].message.starts_with(r#"a: Invalid value: "x\n\"y\"": a in body should match '(abc, but pattern is invalid: "#),
            "{}", errs[0].message);
        // Garbage schemas and values degrade quietly.
        assert!(prepare(&json!("nonsense"), &mut json!({"a": 1})).is_ok());
        assert!(
            prepare(
                &json!({"type": "object", "properties": []}),
                &mut json!([1, {"b": null}])
            )
            .is_err()
        );
    }

    #[test]
    fn default_and_prune_does_not_validate() {
        let mut stored = obj(json!({"version": "bad", "clusterSize": 99, "removedField": "x"}));
        default_and_prune(&pg_schema(), &mut stored);
        assert_eq!(
            stored["spec"],
            json!({"version": "bad", "clusterSize": 99, "mode": "async",
            "postgresql": {"sharedBuffers": "128MB"}})
        );
    }

    #[test]
    fn go_style_rendering() {
        assert_eq!(go_float(16.0), "16");
        assert_eq!(go_float(0.00001), "1e-05");
        assert_eq!(go_float(2e21), "2e+21");
        assert_eq!(quote("tab\tq\"\u{1}é"), r#""tab\tq\"\x01é""#);
    }
}
