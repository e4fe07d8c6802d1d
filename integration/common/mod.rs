//! The integration tests' one support module. Every test binary includes it
//! with `mod common;` and uses the subset it needs:
//! - here: temp dirs, clients from kubeconfigs, `eventually` (one way of
//!   waiting), and a sim on its own Tokio runtime for the API server tests;
//! - [`fleet`]: a whole manager over embedded members (controller tests);
//! - [`process`]: one member with real PostgreSQL (failover, backup tests);
//! - [`bin`]: the `pgfleet` binary as a child process (API, dashboard);
//! - [`manager_process`]: a manager that can be killed and restarted;
//! - [`s3`], [`otlp`]: an object store and a trace receiver on loopback.
//!
//! The environments themselves live in the library (`pgfleet::testkit`,
//! feature `testkit`), shared with the benchmarks; this module turns their
//! errors into test failures.
#![allow(dead_code, clippy::unwrap_used)]

pub mod bin;
pub mod fleet;
pub mod manager_process;
pub mod otlp;
pub mod process;
pub mod s3;
pub mod spans;
pub mod upgrade_kills;

use pgfleet::sim::{self, RuntimeKind, Sim, SimOptions};
use serde_json::{Value, json};
use std::future::Future;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub use pgfleet::testkit::Outcome;

/// How long `eventually` waits before it gives up. Generous: the machines are
/// shared 2-core boxes and the tests never assert on how fast something is.
pub const PATIENCE: Duration = Duration::from_secs(90);

/// A fresh directory under the system temp dir, unique per process and call.
pub fn temp_dir(tag: &str) -> PathBuf {
    pgfleet::testkit::temp_dir(tag).unwrap_or_else(|e| panic!("{e}"))
}

/// Logs to the test output when `RUST_LOG` is set (e.g. `pgfleet=debug`).
pub fn init_tracing() {
    if std::env::var_os("RUST_LOG").is_some() {
        let _ = tracing_subscriber::fmt()
            .with_test_writer()
            .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
            .try_init();
    }
}

/// Options for a one-cluster sim named "a" with the host runtime.
pub fn options(dir: &Path, persist: bool) -> SimOptions {
    SimOptions {
        dir: dir.to_path_buf(),
        names: vec!["a".into()],
        runtime: RuntimeKind::Host,
        persist,
        history: 10_000,
        admin: true,
        images: pgfleet::emulated::images::rules(),
        run_as: Some(pgfleet::emulated::RUN_AS.into()),
        nodes: Default::default(),
    }
}

/// A running sim on a runtime of its own. Dropping it stops every task of the
/// sim (listeners, watches, GC, persistence) as a killed process would, and
/// removes the directory unless `keep_dir` is set.
pub struct TestSim {
    rt: Option<tokio::runtime::Runtime>,
    pub sim: Sim,
    pub dir: PathBuf,
    pub keep_dir: bool,
}

fn server_runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("sim-server")
        .enable_all()
        .build()
        .unwrap()
}

impl TestSim {
    /// Starts a sim from async test code.
    pub async fn start(opts: SimOptions) -> TestSim {
        let rt = server_runtime();
        let dir = opts.dir.clone();
        let sim = rt
            .spawn(async move { sim::start(&opts).await })
            .await
            .expect("the sim start task panicked")
            .expect("starting the sim");
        TestSim {
            rt: Some(rt),
            sim,
            dir,
            keep_dir: false,
        }
    }

    /// Starts a sim from synchronous test code (the kubectl tests).
    pub fn start_blocking(opts: SimOptions) -> TestSim {
        let rt = server_runtime();
        let dir = opts.dir.clone();
        let sim = rt.block_on(sim::start(&opts)).expect("starting the sim");
        TestSim {
            rt: Some(rt),
            sim,
            dir,
            keep_dir: false,
        }
    }

    /// The first (only) cluster.
    pub fn cluster(&self) -> &sim::SimCluster {
        &self.sim.clusters[0]
    }

    pub fn kubeconfig(&self) -> &Path {
        &self.cluster().kubeconfig
    }

    pub async fn client(&self) -> kube::Client {
        client_from(self.kubeconfig()).await
    }

    /// Stops every task of the sim now.
    pub fn stop(&mut self) {
        if let Some(rt) = self.rt.take() {
            rt.shutdown_background();
        }
    }
}

impl Drop for TestSim {
    fn drop(&mut self) {
        self.stop();
        if !self.keep_dir {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// A sim with one cluster "a", no persistence, in a fresh directory.
pub async fn start(tag: &str) -> TestSim {
    TestSim::start(options(&temp_dir(tag), false)).await
}

/// A `kube::Client` built from a kubeconfig file, the same path a user takes.
pub async fn client_from(kubeconfig: &Path) -> kube::Client {
    pgfleet::testkit::client_from(kubeconfig)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Like [`client_from`], without kube's default retrying of 429/503/504
/// answers (which would otherwise hide an injected 429 for minutes).
pub async fn client_without_retries(kubeconfig: &Path) -> kube::Client {
    pgfleet::testkit::client_without_retries(kubeconfig)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Polls `check` until it holds (`Some`, `Ok` or `true`), for up to
/// [`PATIENCE`]; then fails naming `what` and the last state observed (the
/// `Err`). The one way tests wait: never a timed assertion.
pub async fn eventually<O, F, Fut>(what: &str, check: F) -> O::Value
where
    O: Outcome,
    F: FnMut() -> Fut,
    Fut: Future<Output = O>,
{
    eventually_within(PATIENCE, what, check).await
}

/// [`eventually`] with an explicit patience.
pub async fn eventually_within<O, F, Fut>(patience: Duration, what: &str, check: F) -> O::Value
where
    O: Outcome,
    F: FnMut() -> Fut,
    Fut: Future<Output = O>,
{
    pgfleet::testkit::until(patience, what, check)
        .await
        .unwrap_or_else(|e| panic!("{e}"))
}

/// Blocking twin of [`eventually`] for synchronous tests.
pub fn eventually_blocking<T>(what: &str, mut f: impl FnMut() -> Option<T>) -> T {
    let deadline = Instant::now() + PATIENCE;
    loop {
        if let Some(v) = f() {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {PATIENCE:?} waiting for {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The HTTP status code of a kube API error, if it is one.
pub fn api_code(e: &kube::Error) -> Option<u16> {
    match e {
        kube::Error::Api(s) => Some(s.code),
        _ => None,
    }
}

/// Unwraps the API error of a result that must have failed.
pub fn api_err<T: std::fmt::Debug>(r: Result<T, kube::Error>) -> Box<kube::core::Status> {
    match r {
        Err(kube::Error::Api(s)) => s,
        other => panic!("expected an API error, got {other:?}"),
    }
}

/// A CRD `widgets.example.com` (kind Widget, namespaced) exercising what the
/// server implements: required fields, bounds, enums, defaults, pruning,
/// status and scale subresources, printer columns, short names, categories.
pub fn widget_crd() -> Value {
    json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": "Namespaced",
            "names": {
                "plural": "widgets", "singular": "widget", "kind": "Widget",
                "listKind": "WidgetList", "shortNames": ["wg"], "categories": ["gadgets"]
            },
            "versions": [{
                "name": "v1", "served": true, "storage": true,
                "subresources": {
                    "status": {},
                    "scale": {
                        "specReplicasPath": ".spec.replicas",
                        "statusReplicasPath": ".status.replicas",
                        "labelSelectorPath": ".status.selector"
                    }
                },
                "additionalPrinterColumns": [
                    {"name": "Replicas", "type": "integer", "jsonPath": ".spec.replicas"},
                    {"name": "Color", "type": "string", "jsonPath": ".spec.color"},
                    {"name": "Phase", "type": "string", "jsonPath": ".status.phase"}
                ],
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {
                        "spec": {
                            "type": "object",
                            "required": ["size"],
                            "properties": {
                                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                                "replicas": {"type": "integer", "default": 1},
                                "color": {"type": "string", "enum": ["red", "green", "blue"], "default": "red"},
                                "extra": {"type": "object", "x-kubernetes-preserve-unknown-fields": true}
                            }
                        },
                        "status": {
                            "type": "object",
                            "properties": {
                                "phase": {"type": "string"},
                                "replicas": {"type": "integer"},
                                "selector": {"type": "string"},
                                "conditions": {"type": "array", "items": {
                                    "type": "object",
                                    "properties": {
                                        "type": {"type": "string"},
                                        "status": {"type": "string"}
                                    }
                                }}
                            }
                        }
                    }
                }}
            }]
        }
    })
}

/// The API resource of the Widget kind, for `Api<DynamicObject>`.
pub fn widget_resource() -> kube::api::ApiResource {
    kube::api::ApiResource {
        group: "example.com".into(),
        version: "v1".into(),
        api_version: "example.com/v1".into(),
        kind: "Widget".into(),
        plural: "widgets".into(),
    }
}

/// Registers the Widget CRD and waits until the server serves its kind.
pub async fn register_widgets(client: &kube::Client) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let crds: kube::Api<CustomResourceDefinition> = kube::Api::all(client.clone());
    let crd: CustomResourceDefinition = serde_json::from_value(widget_crd()).unwrap();
    crds.create(&Default::default(), &crd).await.unwrap();
    let widgets: kube::Api<kube::api::DynamicObject> =
        kube::Api::namespaced_with(client.clone(), "default", &widget_resource());
    eventually("the widgets resource to be served", || {
        let widgets = widgets.clone();
        async move { widgets.list(&Default::default()).await.ok() }
    })
    .await;
}

/// A Widget object.
pub fn widget(name: &str, spec: Value) -> kube::api::DynamicObject {
    serde_json::from_value(json!({
        "apiVersion": "example.com/v1", "kind": "Widget",
        "metadata": {"name": name}, "spec": spec
    }))
    .unwrap()
}

/// One HTTP/1.1 request to the sim's admin endpoint (plain HTTP on loopback);
/// returns the status code and body.
pub async fn admin_request(
    addr: std::net::SocketAddr,
    method: &str,
    path: &str,
    token: &str,
    body: Option<&Value>,
) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let body = body.map(Value::to_string).unwrap_or_default();
    let req = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(req.as_bytes()).await.unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).await.unwrap();
    let code = out
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = out
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    (code, body)
}
