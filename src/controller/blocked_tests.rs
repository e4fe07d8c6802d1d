use super::*;

fn forbidden(message: &str) -> Error {
    let status = kube::core::Status::failure(message, "Forbidden")
        .with_code(403)
        .boxed();
    Error::Apply(crate::controller::error::api(
        "create",
        "PersistentVolumeClaim",
        "data-orders-1",
        kube::Error::Api(status),
    ))
}

fn exec_failed(message: &str, exit_code: Option<i32>) -> Error {
    Error::Instance(ExecError::Verb {
        pod: "orders-0".into(),
        verb: "pgfleet-instance status".into(),
        message: message.into(),
        exit_code,
    })
}

#[test]
fn a_quota_refusal_names_the_quota_and_the_resource() {
    let e = forbidden(
        "persistentvolumeclaims \"data-orders-1\" is forbidden: exceeded quota: tenant-storage, \
         requested: requests.storage=1Gi, used: requests.storage=1Gi, limited: requests.storage=1Gi",
    );
    let b = classify(&e).unwrap();
    assert_eq!((b.condition, b.reason), (QUOTA_EXCEEDED, "ExceededQuota"));
    assert!(
        b.message.starts_with("ResourceQuota tenant-storage refuses requests.storage: PersistentVolumeClaim data-orders-1"),
        "{}",
        b.message
    );
    let two = forbidden(
        "pods \"x\" is forbidden: exceeded quota: q, requested: cpu=1,pods=1, used: cpu=1,pods=3, limited: cpu=1,pods=3",
    );
    assert!(
        classify(&two)
            .unwrap()
            .message
            .contains("refuses cpu, pods:")
    );
}

#[test]
fn other_refusals_are_not_blocking() {
    assert_eq!(
        classify(&forbidden("pods is forbidden: User cannot create")),
        None
    );
    assert_eq!(
        classify(&forbidden(
            "pods \"x\" is forbidden: failed quota: q: must specify cpu"
        )),
        None
    );
    assert_eq!(classify(&exec_failed("exit status 1", Some(1))), None);
    assert_eq!(classify(&Error::Validate("x".into())), None);
}

#[test]
fn a_missing_or_unrunnable_instance_script_is_named_with_pod_and_code() {
    let b = classify(&exec_failed("sh: not found", Some(127))).unwrap();
    assert_eq!(
        (b.condition, b.reason),
        (CONTRACT_MISSING, "ScriptNotFound")
    );
    assert!(
        b.message.contains("pod orders-0") && b.message.contains("exited 127"),
        "{}",
        b.message
    );
    let b = classify(&exec_failed("permission denied", Some(126))).unwrap();
    assert_eq!(b.reason, "ScriptNotExecutable");
    // dash: "sh: 0: cannot open /etc/...: No such file", exit 2.
    let dash = format!("exit status 2 sh: 0: cannot open {SCRIPT_PATH}: No such file");
    let b = classify(&exec_failed(&dash, Some(2))).unwrap();
    assert!(b.message.contains("exited 2"), "{}", b.message);
}

#[test]
fn the_condition_keeps_its_transition_time_while_it_holds() {
    let b = Blocked {
        condition: QUOTA_EXCEEDED,
        reason: "ExceededQuota",
        message: "m".into(),
    };
    let ready = Condition {
        type_: "Ready".into(),
        status: "False".into(),
        ..Default::default()
    };
    let first = with_condition(std::slice::from_ref(&ready), &b, "t1");
    assert_eq!(first.len(), 2);
    assert_eq!(first[1].last_transition_time.as_deref(), Some("t1"));
    let again = with_condition(&first, &b, "t2");
    assert_eq!(again, first);
}
