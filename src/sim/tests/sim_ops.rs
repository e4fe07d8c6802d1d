//! The embedded API server's kubelet plumbing and operations through
//! `kube::Client`: `pods/exec` over WebSocket (`AttachedProcess`),
//! `pods/log`, fault injection (programmatic and through the admin endpoint)
//! and persistence across a restart.
#![allow(clippy::unwrap_used)]

mod support;

use k8s_openapi::api::core::v1::{ConfigMap, Pod};
use kube::ResourceExt;
use kube::api::{Api, AttachParams, DynamicObject, LogParams};
use pgfleet_sim::faults::FaultSpec;
use serde_json::json;
use std::time::{Duration, Instant};
use support::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

async fn running_pod(client: &kube::Client, name: &str) -> Api<Pod> {
    let pods: Api<Pod> = Api::default_namespaced(client.clone());
    let p: Pod = serde_json::from_value(json!({"metadata": {"name": name},
        "spec": {"containers": [{"name": "main", "image": "busybox"}, {"name": "side", "image": "busybox"}]}}))
    .unwrap();
    pods.create(&Default::default(), &p).await.unwrap();
    eventually("the pod to run", || {
        let pods = pods.clone();
        async move {
            let p = pods.get(name).await.ok()?;
            (p.status?.phase.as_deref() == Some("Running")).then_some(())
        }
    })
    .await;
    pods
}

async fn read_all(r: Option<impl tokio::io::AsyncRead + Unpin>) -> String {
    let mut s = String::new();
    r.unwrap().read_to_string(&mut s).await.unwrap();
    s
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_streams_stdout_stdin_and_exit_status() {
    let s = start("exec").await;
    let client = s.client().await;
    let pods = running_pod(&client, "p").await;

    // stdout and a zero exit.
    let mut proc = pods
        .exec(
            "p",
            ["sh", "-c", "echo hello from $POD_NAME"],
            &AttachParams::default().stderr(false),
        )
        .await
        .unwrap();
    let out = read_all(proc.stdout()).await;
    let status = proc.take_status().unwrap().await.unwrap();
    assert_eq!(out, "hello from p\n");
    assert_eq!(status.status.as_deref(), Some("Success"), "{status:?}");
    proc.join().await.unwrap();

    // stdin is piped to the command; stderr is separate; a non-zero exit.
    let ap = AttachParams::default()
        .stdin(true)
        .stderr(true)
        .container("side");
    let mut proc = pods
        .exec("p", ["sh", "-c", "tr a-z A-Z; echo oops >&2; exit 3"], &ap)
        .await
        .unwrap();
    let mut stdin = proc.stdin().unwrap();
    stdin.write_all(b"piped input\n").await.unwrap();
    stdin.shutdown().await.unwrap();
    drop(stdin);
    let (out, err) = tokio::join!(read_all(proc.stdout()), read_all(proc.stderr()));
    let status = proc.take_status().unwrap().await.unwrap();
    assert_eq!(out, "PIPED INPUT\n");
    assert_eq!(err, "oops\n");
    assert_eq!(status.status.as_deref(), Some("Failure"));
    assert_eq!(status.reason.as_deref(), Some("NonZeroExitCode"));
    let causes = status.details.unwrap().causes.unwrap_or_default();
    let code = causes
        .into_iter()
        .find(|c| c.reason.as_deref() == Some("ExitCode"))
        .unwrap();
    assert_eq!(code.message.as_deref(), Some("3"));

    // An unknown container is refused before the upgrade.
    let bad = pods
        .exec("p", ["true"], &AttachParams::default().container("nope"))
        .await;
    assert!(bad.is_err(), "exec into an unknown container fails");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pod_logs() {
    let s = start("logs").await;
    let client = s.client().await;
    let pods = running_pod(&client, "p").await;
    let log = pods.logs("p", &LogParams::default()).await.unwrap();
    assert!(log.contains("default/p container main"), "{log:?}");
    let log = pods
        .logs(
            "p",
            &LogParams {
                container: Some("side".into()),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    assert!(log.contains("container side"), "{log:?}");
    assert_eq!(
        api_code(
            &pods
                .logs("missing", &LogParams::default())
                .await
                .unwrap_err()
        ),
        Some(404)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn faults_latency_errors_and_refused_connections() {
    let s = start("faults").await;
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    cms.list(&Default::default()).await.unwrap();
    let faults = &s.cluster().cluster.faults;

    // Added latency: requests still succeed, and take at least that long (a
    // lower bound the server enforces by sleeping, not a timing guess).
    faults.set(FaultSpec {
        latency_ms: 400,
        ..Default::default()
    });
    let t = Instant::now();
    cms.list(&Default::default()).await.unwrap();
    assert!(t.elapsed() >= Duration::from_millis(400));
    faults.clear();

    // Error rates: every request answered 429, then 500; the client sees
    // them. This client has kube's default retries off: they back off on a
    // 429 for minutes before giving up.
    let plain: Api<ConfigMap> =
        Api::default_namespaced(client_without_retries(s.kubeconfig()).await);
    for code in [429u16, 500] {
        faults.set(FaultSpec {
            error_rate: 1.0,
            error_code: code,
            ..Default::default()
        });
        let st = api_err(plain.list(&Default::default()).await);
        assert_eq!(st.code, code);
    }
    // A client with the default retries rides out a partial 429 rate.
    faults.set(FaultSpec {
        error_rate: 0.5,
        error_code: 429,
        ..Default::default()
    });
    for _ in 0..5 {
        cms.list(&Default::default()).await.unwrap();
    }
    // A partial rate fails some requests and lets others through.
    faults.set(FaultSpec {
        error_rate: 0.5,
        error_code: 500,
        ..Default::default()
    });
    let (mut ok, mut failed) = (0, 0);
    while ok == 0 || failed == 0 {
        match cms.list(&Default::default()).await {
            Ok(_) => ok += 1,
            Err(e) => {
                assert_eq!(api_code(&e), Some(500));
                failed += 1;
            }
        }
        assert!(ok + failed < 200, "a 50% error rate gives both outcomes");
    }
    faults.clear();
    cms.list(&Default::default()).await.unwrap();

    // Refused connections: the cluster is unreachable, then back.
    faults.set(FaultSpec {
        refuse_connections: true,
        ..Default::default()
    });
    let e = eventually("requests to fail while connections are refused", || {
        let cms = cms.clone();
        async move { cms.list(&Default::default()).await.err() }
    })
    .await;
    assert_eq!(
        api_code(&e),
        None,
        "a transport error, not an API answer: {e}"
    );
    assert!(
        tokio::net::TcpStream::connect(s.cluster().addr)
            .await
            .is_err(),
        "the port is closed"
    );
    faults.clear();
    eventually("requests to succeed again", || {
        let cms = cms.clone();
        async move { cms.list(&Default::default()).await.ok() }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admin_endpoint_sets_faults() {
    let s = start("admin").await;
    let client = s.client().await;
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let admin = s.sim.admin_addr.unwrap();
    let token = s.cluster().token.clone();

    let (code, _) = admin_request(admin, "GET", "/clusters/a/faults", "wrong", None).await;
    assert_eq!(code, 401);
    // The listing needs a cluster's token too (it names servers).
    let (code, _) = admin_request(admin, "GET", "/clusters", "", None).await;
    assert_eq!(code, 401);
    let (code, body) = admin_request(admin, "GET", "/clusters", &token, None).await;
    assert_eq!(code, 200);
    assert!(body.contains(&format!("{}", s.cluster().addr)), "{body}");

    let spec = json!({"error_rate": 1.0, "error_code": 429});
    let (code, _) = admin_request(admin, "PUT", "/clusters/a/faults", &token, Some(&spec)).await;
    assert_eq!(code, 200);
    let plain: Api<ConfigMap> =
        Api::default_namespaced(client_without_retries(s.kubeconfig()).await);
    assert_eq!(api_err(plain.list(&Default::default()).await).code, 429);
    let (code, body) = admin_request(admin, "GET", "/clusters/a/faults", &token, None).await;
    assert_eq!(code, 200);
    assert!(body.contains("429"), "{body}");

    // Refusing connections leaves the admin endpoint reachable to undo it.
    let spec = json!({"refuse_connections": true});
    admin_request(admin, "PUT", "/clusters/a/faults", &token, Some(&spec)).await;
    eventually("the cluster to refuse connections", || {
        let cms = cms.clone();
        async move {
            cms.list(&Default::default())
                .await
                .err()
                .filter(|e| api_code(e).is_none())
        }
    })
    .await;
    let (code, _) =
        admin_request(admin, "PUT", "/clusters/a/faults", &token, Some(&json!({}))).await;
    assert_eq!(code, 200);
    eventually("the cluster to answer again", || {
        let cms = cms.clone();
        async move { cms.list(&Default::default()).await.ok() }
    })
    .await;

    // Compaction through the admin endpoint expires old revisions.
    let rv = cms
        .list(&Default::default())
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    cms.create(
        &Default::default(),
        &serde_json::from_value(json!({"metadata": {"name": "x"}})).unwrap(),
    )
    .await
    .unwrap();
    let (code, _) = admin_request(admin, "POST", "/clusters/a/compact", &token, None).await;
    assert_eq!(code, 204);
    use futures::StreamExt;
    let mut w = cms.watch(&Default::default(), &rv).await.unwrap().boxed();
    match w.next().await.unwrap().unwrap() {
        kube::api::WatchEvent::Error(e) => assert_eq!(e.code, 410),
        other => panic!("expected 410 Gone, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn objects_survive_a_restart_on_the_same_directory() {
    let dir = temp_dir("persist");
    let mut first = TestSim::start(options(&dir, true)).await;
    first.keep_dir = true;
    let client = first.client().await;
    register_widgets(&client).await;
    let widgets: Api<DynamicObject> =
        Api::default_namespaced_with(client.clone(), &widget_resource());
    let w = widgets
        .create(&Default::default(), &widget("kept", json!({"size": 3})))
        .await
        .unwrap();
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    let cm = cms
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "kept"}, "data": {"k": "v"}}))
                .unwrap(),
        )
        .await
        .unwrap();
    let last_rv: u64 = cm.resource_version().unwrap().parse().unwrap();
    let addr = first.cluster().addr;
    let kubeconfig = std::fs::read_to_string(first.kubeconfig()).unwrap();

    // Wait until the snapshot holds the last write, then stop everything.
    let state = dir.join("a.state.json");
    eventually_async_file(&state, "\"kept\"", 2).await;
    first.stop();
    drop(first);
    // The old listener is gone once the runtime is down.
    eventually("the first sim's port to close", || async move {
        tokio::net::TcpStream::connect(addr)
            .await
            .is_err()
            .then_some(())
    })
    .await;

    let second = TestSim::start(options(&dir, true)).await;
    assert_eq!(second.cluster().addr, addr, "the port is restored");
    assert_eq!(
        std::fs::read_to_string(second.kubeconfig()).unwrap(),
        kubeconfig,
        "the kubeconfig stays valid"
    );
    let client = client_from(&dir.join("a.kubeconfig")).await;
    let widgets: Api<DynamicObject> =
        Api::default_namespaced_with(client.clone(), &widget_resource());
    let back = widgets
        .get("kept")
        .await
        .expect("the custom object and its CRD survive");
    assert_eq!(back.uid(), w.uid());
    assert_eq!(back.data["spec"]["size"], json!(3));
    let cms: Api<ConfigMap> = Api::default_namespaced(client.clone());
    assert_eq!(cms.get("kept").await.unwrap().data.unwrap()["k"], "v");
    let next = cms
        .create(
            &Default::default(),
            &serde_json::from_value(json!({"metadata": {"name": "after"}})).unwrap(),
        )
        .await
        .unwrap();
    let next_rv: u64 = next.resource_version().unwrap().parse().unwrap();
    assert!(
        next_rv > last_rv,
        "revisions continue after a restart ({next_rv} > {last_rv})"
    );
}

/// Waits until `path` contains `needle` at least `times` times.
async fn eventually_async_file(path: &std::path::Path, needle: &str, times: usize) {
    eventually(
        &format!("{} to hold {needle} {times} times", path.display()),
        || async move {
            let s = std::fs::read_to_string(path).ok()?;
            (s.matches(needle).count() >= times).then_some(())
        },
    )
    .await;
}

/// A minimal WebSocket client over TLS, enough to speak one subprotocol the
/// kube client does not let us choose (it always offers v5 first).
mod rawws {
    use rustls::pki_types::{CertificateDer, ServerName, pem::PemObject};
    use std::sync::Arc;
    use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};

    pub type Tls = tokio_rustls::client::TlsStream<tokio::net::TcpStream>;

    /// Connects, sends the upgrade request for `path` offering `protocol`, and
    /// returns the response head and the stream.
    pub async fn connect(
        addr: std::net::SocketAddr,
        ca_pem: &[u8],
        token: &str,
        path: &str,
        protocol: &str,
    ) -> (String, Tls) {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from_pem_slice(ca_pem).unwrap())
            .unwrap();
        let config = rustls::ClientConfig::builder_with_provider(Arc::new(
            rustls::crypto::ring::default_provider(),
        ))
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let name = ServerName::try_from("127.0.0.1").unwrap();
        let mut s = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(name, tcp)
            .await
            .unwrap();
        let req = format!(
            "GET {path} HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n"
        );
        s.write_all(req.as_bytes()).await.unwrap();
        let mut head = Vec::new();
        while !head.ends_with(b"\r\n\r\n") {
            head.push(s.read_u8().await.unwrap());
        }
        (String::from_utf8(head).unwrap(), s)
    }

    /// Reads one frame: (opcode, payload). Server frames are never masked.
    pub async fn frame(s: &mut (impl AsyncRead + Unpin)) -> Option<(u8, Vec<u8>)> {
        let b0 = s.read_u8().await.ok()?;
        let b1 = s.read_u8().await.ok()?;
        let len = match b1 & 0x7f {
            126 => u64::from(s.read_u16().await.ok()?),
            127 => s.read_u64().await.ok()?,
            n => u64::from(n),
        };
        let mut payload = vec![0u8; len as usize];
        s.read_exact(&mut payload).await.ok()?;
        Some((b0 & 0x0f, payload))
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_speaks_the_v4_channel_protocol_too() {
    let s = start("exec-v4").await;
    let client = s.client().await;
    running_pod(&client, "p").await;
    let ca = std::fs::read(s.dir.join("ca.crt")).unwrap();
    let path = "/api/v1/namespaces/default/pods/p/exec?command=sh&command=-c&command=echo%20v4;%20exit%205&stdout=true&stderr=true";
    let (head, mut ws) = rawws::connect(
        s.cluster().addr,
        &ca,
        &s.cluster().token,
        path,
        "v4.channel.k8s.io",
    )
    .await;
    assert!(head.starts_with("HTTP/1.1 101"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("sec-websocket-protocol: v4.channel.k8s.io"),
        "{head}"
    );
    let (mut stdout, mut status) = (Vec::new(), None);
    while let Some((op, payload)) = tokio::time::timeout(PATIENCE, rawws::frame(&mut ws))
        .await
        .unwrap()
    {
        match (op, payload.first()) {
            (2, Some(1)) => stdout.extend_from_slice(&payload[1..]),
            (2, Some(3)) => {
                status = Some(serde_json::from_slice::<serde_json::Value>(&payload[1..]).unwrap())
            }
            (8, _) => break,
            _ => {}
        }
    }
    assert_eq!(String::from_utf8_lossy(&stdout), "v4\n");
    let status = status.expect("a Status on channel 3");
    assert_eq!(status["reason"], "NonZeroExitCode", "{status}");
    assert_eq!(status["details"]["causes"][0]["message"], "5");
}
