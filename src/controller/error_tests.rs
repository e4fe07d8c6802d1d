use super::*;
use std::time::Duration;

fn api_error(code: u16) -> kube::Error {
    kube::Error::Api(
        kube::core::Status::failure("refused", "Test")
            .with_code(code)
            .boxed(),
    )
}

#[test]
fn http_statuses_map_to_categories() {
    let cases = [
        (409, Category::Conflict),
        (404, Category::Conflict),
        (403, Category::Forbidden),
        (401, Category::Forbidden),
        (422, Category::InvalidSpec),
        (400, Category::InvalidSpec),
        (504, Category::Timeout),
        (500, Category::ServerError),
        (503, Category::ServerError),
        (429, Category::ServerError),
        (418, Category::Internal),
    ];
    for (code, want) in cases {
        assert_eq!(Category::of_kube(&api_error(code)), want, "HTTP {code}");
    }
}

#[test]
fn transport_failures_are_unreachable_and_local_failures_internal() {
    let refused = kube::Error::Service(Box::new(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "connection refused",
    )));
    assert_eq!(Category::of_kube(&refused), Category::Unreachable);
    let bad_json = serde_json::from_str::<u8>("x").err();
    let Some(bad_json) = bad_json else {
        panic!("\"x\" parsed as a number")
    };
    assert_eq!(
        Category::of_kube(&kube::Error::SerdeError(bad_json)),
        Category::Internal
    );
}

#[test]
fn every_step_takes_the_category_of_the_failure_underneath() {
    let conflict = kerr("apply", "Service", "orders-rw")(api_error(409));
    assert!(matches!(conflict, Error::Apply(_)));
    assert_eq!(conflict.category(), Category::Conflict);
    let observe = kerr("get", "PostgresCluster", "orders")(api_error(503));
    assert!(matches!(observe, Error::Observe(_)));
    assert_eq!(observe.category(), Category::ServerError);
    let status = kerr("status", "PostgresCluster", "orders")(api_error(403));
    assert!(matches!(status, Error::Status(_)));
    assert_eq!(status.category(), Category::Forbidden);
    let primary = Error::Primary(api("relabel", "Pod", "orders-1", api_error(422)));
    assert_eq!(primary.category(), Category::InvalidSpec);
    let slow = Error::Instance(ExecError::Timeout {
        pod: "orders-0".into(),
        verb: "status".into(),
        timeout: Duration::from_secs(5),
    });
    assert_eq!(slow.category(), Category::Timeout);
    let missing = Error::Missing {
        kind: "PostgresCluster",
        name: "orders".into(),
        field: "metadata.uid",
    };
    assert_eq!(missing.category(), Category::Internal);
    assert_eq!(
        missing.to_string(),
        "PostgresCluster orders: metadata.uid is missing"
    );
    assert_eq!(
        Error::Validate("unknown member cluster eu".into()).category(),
        Category::InvalidSpec
    );
}

#[test]
fn messages_name_the_step_and_the_object() {
    let e = kerr("delete", "Pod", "orders-2")(api_error(500));
    let msg = e.to_string();
    assert!(msg.starts_with("apply: delete Pod orders-2: "), "{msg}");
}

#[test]
fn categories_have_distinct_labels_and_reasons() {
    let labels: std::collections::HashSet<_> = Category::ALL.iter().map(|c| c.label()).collect();
    let reasons: std::collections::HashSet<_> = Category::ALL.iter().map(|c| c.reason()).collect();
    assert_eq!(labels.len(), Category::ALL.len());
    assert_eq!(reasons.len(), Category::ALL.len());
}
