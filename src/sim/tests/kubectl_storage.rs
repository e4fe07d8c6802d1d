//! Storage through `/usr/bin/kubectl`: the default StorageClass, a claim
//! bound with its capacity, online expansion in a real cluster's steps
//! (`FileSystemResizePending` until a running pod mounts the volume, then
//! the new `status.capacity`), and the API server's refusals: a smaller
//! request, and a bigger one where the class does not allow expansion.
#![allow(clippy::unwrap_used)]

mod support;

use support::kubectl::Kubectl;
use support::*;

fn claim_yaml(name: &str, class: Option<&str>, size: &str) -> String {
    let class = class
        .map(|c| format!("  storageClassName: {c}\n"))
        .unwrap_or_default();
    format!(
        "apiVersion: v1\nkind: PersistentVolumeClaim\nmetadata:\n  name: {name}\nspec:\n{class}  \
         accessModes: [ReadWriteOnce]\n  resources:\n    requests:\n      storage: {size}\n"
    )
}

fn capacity(k: &Kubectl, claim: &str) -> String {
    k.ok(&[
        "get",
        "pvc",
        claim,
        "-o",
        "jsonpath={.status.capacity.storage}",
    ])
}

fn resize(k: &Kubectl, claim: &str, size: &str) -> std::process::Output {
    let patch =
        format!("{{\"spec\":{{\"resources\":{{\"requests\":{{\"storage\":\"{size}\"}}}}}}}}");
    k.run(&["patch", "pvc", claim, "--type=merge", "-p", &patch])
}

#[test]
fn claims_bind_and_grow_online_and_refusals_name_the_rule() {
    let s = TestSim::start_blocking(options(&temp_dir("k-storage"), false));
    let k = Kubectl::new(&s);
    let classes = k.ok(&["get", "storageclass"]);
    assert!(classes.contains("standard (default)"), "{classes}");
    k.apply("data.yaml", &claim_yaml("data", None, "1Gi"));
    assert_eq!(
        k.ok(&[
            "get",
            "pvc",
            "data",
            "-o",
            "jsonpath={.spec.storageClassName}"
        ]),
        "standard"
    );
    eventually_blocking("bound", || (capacity(&k, "data") == "1Gi").then_some(()));

    // Not mounted: the volume grows, the file system waits for a pod.
    assert!(resize(&k, "data", "2Gi").status.success());
    eventually_blocking("FileSystemResizePending", || {
        let c = k.ok(&[
            "get",
            "pvc",
            "data",
            "-o",
            "jsonpath={.status.conditions[*].type}",
        ]);
        (c == "FileSystemResizePending").then_some(())
    });
    assert_eq!(capacity(&k, "data"), "1Gi");
    k.apply(
        "pod.yaml",
        "apiVersion: v1\nkind: Pod\nmetadata:\n  name: user\nspec:\n  containers:\n  - name: c\n    \
         image: busybox\n  volumes:\n  - name: d\n    persistentVolumeClaim: {claimName: data}\n",
    );
    eventually_blocking("capacity 2Gi once mounted", || {
        (capacity(&k, "data") == "2Gi").then_some(())
    });
    let conds = k.ok(&["get", "pvc", "data", "-o", "jsonpath={.status.conditions}"]);
    assert!(conds.is_empty(), "{conds}");

    let out = resize(&k, "data", "1Gi");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains(
            "spec.resources.requests.storage: Forbidden: field can not be less than previous value"
        ),
        "{err}"
    );

    k.apply(
        "fixed.yaml",
        "apiVersion: storage.k8s.io/v1\nkind: StorageClass\nmetadata:\n  name: fixed\n\
         provisioner: pgfleet.io/sim\nallowVolumeExpansion: false\n",
    );
    k.apply("f.yaml", &claim_yaml("f", Some("fixed"), "1Gi"));
    eventually_blocking("bound", || (capacity(&k, "f") == "1Gi").then_some(()));
    let out = resize(&k, "f", "2Gi");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        err.contains("only dynamically provisioned pvc can be resized and the storageclass that provisions the pvc must support resize"),
        "{err}"
    );
}
