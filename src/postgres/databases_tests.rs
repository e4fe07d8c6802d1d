#![allow(clippy::unwrap_used)]

use super::*;
use crate::postgres::catalog::{ActualDatabase, AvailableExtension, InstalledExtension};

fn spec(v: serde_json::Value) -> DatabaseSpec {
    serde_json::from_value(v).unwrap()
}

fn catalog(dbs: Vec<ActualDatabase>) -> Catalog {
    Catalog {
        contract: 1,
        databases: dbs,
        available: vec![AvailableExtension {
            name: "hstore".into(),
            versions: vec!["1.7".into(), "1.8".into()],
        }],
        ..Default::default()
    }
}

fn sql(p: &DatabasePlan) -> Vec<(Option<&str>, &str)> {
    p.stmts
        .iter()
        .map(|s| (s.db.as_deref(), s.sql.as_str()))
        .collect()
}

#[test]
fn a_missing_database_is_created_with_its_contents() {
    let s = spec(serde_json::json!({"name": "shop", "owner": "app",
        "schemas": ["sales"], "extensions": [{"name": "hstore", "version": "1.8"}]}));
    let opts = CreateOptions {
        encoding: Some("UTF8".into()),
        locale: Some("C".into()),
    };
    let p = plan(&s, &opts, &catalog(vec![]));
    assert_eq!(p.action, Action::Create);
    assert_eq!(
        sql(&p),
        [
            (
                None,
                "CREATE DATABASE \"shop\" OWNER \"app\" TEMPLATE template0 ENCODING 'UTF8' LOCALE 'C'"
            ),
            (
                Some("shop"),
                "CREATE SCHEMA IF NOT EXISTS \"sales\" AUTHORIZATION \"app\""
            ),
            (
                Some("shop"),
                "CREATE EXTENSION IF NOT EXISTS \"hstore\" VERSION '1.8'"
            ),
        ]
    );
}

#[test]
fn an_existing_database_gets_only_what_it_lacks() {
    let s = spec(serde_json::json!({"name": "shop", "owner": "app",
        "schemas": ["sales"], "extensions": [{"name": "hstore", "version": "1.8"}]}));
    let have = ActualDatabase {
        name: "shop".into(),
        owner: "someone".into(),
        inspected: true,
        schemas: vec!["sales".into()],
        extensions: vec![InstalledExtension {
            name: "hstore".into(),
            version: "1.7".into(),
        }],
        pooler_lookup: None,
    };
    let p = plan(&s, &CreateOptions::default(), &catalog(vec![have.clone()]));
    assert_eq!(p.action, Action::Alter);
    assert_eq!(
        sql(&p),
        [
            (None, "ALTER DATABASE \"shop\" OWNER TO \"app\""),
            (Some("shop"), "ALTER EXTENSION \"hstore\" UPDATE TO '1.8'"),
        ]
    );
    let mut done = have;
    done.owner = "app".into();
    done.extensions[0].version = "1.8".into();
    let p = plan(&s, &CreateOptions::default(), &catalog(vec![done]));
    assert_eq!((p.action, p.stmts.len()), (Action::None, 0));
}

/// An extension the image lacks is reported; the rest still happens.
#[test]
fn unavailable_extensions_are_reported_not_fatal() {
    let s = spec(serde_json::json!({"name": "geo", "schemas": ["s"],
        "extensions": [{"name": "postgis"}, {"name": "hstore", "version": "9.9"}]}));
    let p = plan(&s, &CreateOptions::default(), &catalog(vec![]));
    assert_eq!(p.unavailable, ["postgis", "hstore 9.9"]);
    assert_eq!(p.action, Action::Create);
    assert_eq!(p.stmts.len(), 2);
}

#[test]
fn reserved_hostile_and_absent_databases() {
    for n in ["postgres", "template1", "a\nb", ""] {
        let p = plan(
            &spec(serde_json::json!({"name": n})),
            &CreateOptions::default(),
            &catalog(vec![]),
        );
        assert_eq!(p.action, Action::Refused, "{n}");
    }
    let evil = spec(serde_json::json!({"name": "d\"; DROP DATABASE x; --", "owner": "o'\""}));
    let p = plan(&evil, &CreateOptions::default(), &catalog(vec![]));
    assert_eq!(
        p.stmts[0].sql,
        "CREATE DATABASE \"d\"\"; DROP DATABASE x; --\" OWNER \"o'\"\"\""
    );
    let gone = spec(serde_json::json!({"name": "old", "ensure": "absent"}));
    let have = ActualDatabase {
        name: "old".into(),
        owner: "postgres".into(),
        ..Default::default()
    };
    let p = plan(&gone, &CreateOptions::default(), &catalog(vec![have]));
    assert_eq!(sql(&p), [(None, "DROP DATABASE IF EXISTS \"old\"")]);
    let p = plan(&gone, &CreateOptions::default(), &catalog(vec![]));
    assert_eq!(p.action, Action::None);
}
