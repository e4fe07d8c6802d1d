//! The real `pgfleet run` binary as a child process (for the API, dashboard
//! and credential-leak tests): a fresh directory as its working directory,
//! stdout and stderr captured to files (so a test can search everything it
//! printed), the API address read from its startup line, and a small HTTP
//! client for loopback requests. Killed (by its own pid) when dropped.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The shared helpers, for tests that `use bin::*`.
#[allow(unused_imports)]
pub use super::{PATIENCE, client_from, eventually, temp_dir};

/// A config with embedded (virtual) members, any free port, a token file.
pub fn config(dir: &Path, members: &[&str], token_file: Option<&Path>, extra: &str) -> PathBuf {
    let mut toml = format!(
        "[manager]\nlisten = \"127.0.0.1:0\"\nstate_dir = \"{}\"\nprobe_interval = \"1s\"\nprobe_timeout = \"1s\"\nqps = 500.0\nburst = 1000\n",
        dir.join("state").display()
    );
    if let Some(t) = token_file {
        toml.push_str(&format!("api_token_file = \"{}\"\n", t.display()));
    }
    for (i, m) in members.iter().enumerate() {
        toml.push_str(&format!(
            "\n[[clusters]]\nname = \"{m}\"\nembedded = true\nlabels = {{ env = \"test\", wave = \"{i}\" }}\n"
        ));
    }
    toml.push_str(extra);
    let path = dir.join("fleet.toml");
    std::fs::write(&path, toml).unwrap();
    path
}

pub struct ManagerBin {
    child: Child,
    pub dir: PathBuf,
    /// `http://127.0.0.1:PORT` (`https://` when the manager serves TLS)
    pub url: String,
    /// `127.0.0.1:PORT`
    pub addr: String,
}

impl ManagerBin {
    /// `pgfleet run [-c config]` in `dir` with extra environment variables;
    /// returns once it printed the API address.
    pub fn start(dir: &Path, config: Option<&Path>, env: &[(&str, &str)]) -> ManagerBin {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_pgfleet"));
        cmd.arg("run").current_dir(dir);
        if let Some(c) = config {
            cmd.arg("--config").arg(c);
        }
        cmd.env_remove("PGFLEET_CONFIG")
            .env_remove("PGFLEET_SERVER")
            .env_remove("PGFLEET_API_TOKEN")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(std::fs::File::create(dir.join("stdout.log")).unwrap())
            .stderr(std::fs::File::create(dir.join("stderr.log")).unwrap());
        let child = cmd.spawn().expect("starting pgfleet run");
        let mut m = ManagerBin {
            child,
            dir: dir.to_path_buf(),
            url: String::new(),
            addr: String::new(),
        };
        let deadline = Instant::now() + PATIENCE;
        loop {
            let out = std::fs::read_to_string(dir.join("stdout.log")).unwrap_or_default();
            if let Some(rest) = out.split("pgfleet API and dashboard on ").nth(1) {
                let (scheme, rest) = rest.split_once("://").unwrap();
                m.addr = rest.split('/').next().unwrap().trim().to_string();
                m.url = format!("{scheme}://{}", m.addr);
                return m;
            }
            if let Ok(Some(status)) = m.child.try_wait() {
                panic!(
                    "pgfleet run exited ({status}) before serving:\n{}",
                    m.output()
                );
            }
            assert!(
                Instant::now() < deadline,
                "pgfleet run printed no API address:\n{}",
                m.output()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }

    /// Everything the manager printed so far (stdout, then stderr).
    pub fn output(&self) -> String {
        let read = |f: &str| std::fs::read_to_string(self.dir.join(f)).unwrap_or_default();
        format!("{}{}", read("stdout.log"), read("stderr.log"))
    }

    /// The kubeconfig the embedded member `name` was given.
    pub fn kubeconfig(&self, state_dir: &Path, name: &str) -> PathBuf {
        state_dir
            .join("embedded")
            .join(format!("{name}.kubeconfig"))
    }

    pub async fn get(&self, path: &str) -> (u16, String) {
        http(&self.addr, "GET", path, None, None).await
    }

    pub async fn post(&self, path: &str, token: Option<&str>, body: &str) -> (u16, String) {
        http(&self.addr, "POST", path, token, Some(body)).await
    }

    /// GET that must answer 200 with JSON.
    pub async fn json(&self, path: &str) -> serde_json::Value {
        let (code, body) = self.get(path).await;
        assert_eq!(code, 200, "GET {path}: {body}");
        serde_json::from_str(&body).unwrap_or_else(|e| panic!("GET {path}: not JSON ({e}): {body}"))
    }
}

impl Drop for ManagerBin {
    /// Stops the manager; its directory (state, logs) stays only when the
    /// test failed, for the post-mortem.
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        if std::thread::panicking() {
            eprintln!("manager output and state kept in {}", self.dir.display());
        } else {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

/// One HTTP/1.1 request on loopback; (status, body).
pub async fn http(
    addr: &str,
    method: &str,
    path: &str,
    token: Option<&str>,
    body: Option<&str>,
) -> (u16, String) {
    use http_body_util::{BodyExt, Full};
    let stream = tokio::net::TcpStream::connect(addr).await.unwrap();
    let (mut sender, conn) =
        hyper::client::conn::http1::handshake(hyper_util::rt::TokioIo::new(stream))
            .await
            .unwrap();
    tokio::spawn(conn);
    let mut req = http::Request::builder()
        .method(method)
        .uri(path)
        .header(http::header::HOST, addr);
    if let Some(t) = token {
        req = req.header(http::header::AUTHORIZATION, t);
    }
    if body.is_some() {
        req = req.header(http::header::CONTENT_TYPE, "application/json");
    }
    let req = req
        .body(Full::new(bytes::Bytes::from(
            body.unwrap_or_default().to_string(),
        )))
        .unwrap();
    let resp = sender.send_request(req).await.unwrap();
    let code = resp.status().as_u16();
    let bytes = resp.into_body().collect().await.unwrap().to_bytes();
    (code, String::from_utf8_lossy(&bytes).into_owned())
}

/// Runs the pgfleet CLI (e.g. `status --server …`); (exit code, stdout, stderr).
pub fn cli(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_pgfleet"))
        .args(args)
        .current_dir(dir)
        .env_remove("PGFLEET_CONFIG")
        .env_remove("PGFLEET_SERVER")
        .env_remove("PGFLEET_API_TOKEN")
        .envs(env.iter().copied())
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}
