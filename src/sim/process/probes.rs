//! Readiness, liveness and startup probes. Exec probes run inside the
//! container's namespaces as its user with its environment (the same path as
//! `pods/exec`); tcpSocket and httpGet probes connect to the Pod's address.

use super::sandbox::Entry;
use crate::json_ptr::Ptr;
use crate::store::str_at;
use serde_json::Value;
use std::collections::HashMap;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

#[derive(Debug, Clone, PartialEq)]
pub enum PortRef {
    Num(u16),
    Name(String),
}

impl PortRef {
    pub fn from_value(v: Option<&Value>) -> Option<PortRef> {
        match v? {
            Value::Number(n) => n
                .as_u64()
                .and_then(|n| u16::try_from(n).ok())
                .map(PortRef::Num),
            Value::String(s) => Some(match s.parse() {
                Ok(n) => PortRef::Num(n),
                Err(_) => PortRef::Name(s.clone()),
            }),
            _ => None,
        }
    }

    pub fn resolve(&self, ports: &HashMap<String, u16>) -> Option<u16> {
        match self {
            PortRef::Num(n) => Some(*n),
            PortRef::Name(n) => ports.get(n).copied(),
        }
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Action {
    Exec(Vec<String>),
    Tcp {
        host: String,
        port: PortRef,
    },
    Http {
        host: String,
        port: PortRef,
        path: String,
    },
}

#[derive(Debug, Clone, PartialEq)]
pub struct Probe {
    pub action: Action,
    pub initial_delay: Duration,
    pub period: Duration,
    pub timeout: Duration,
    pub success_threshold: u32,
    pub failure_threshold: u32,
}

fn secs(v: &Value, field: &str, default: u64) -> Duration {
    Duration::from_secs(v.get(field).and_then(Value::as_u64).unwrap_or(default))
}

fn count(v: &Value, field: &str, default: u32) -> u32 {
    v.get(field)
        .and_then(Value::as_u64)
        .and_then(|n| u32::try_from(n).ok())
        .unwrap_or(default)
        .max(1)
}

impl Probe {
    /// Parses a probe; None for probes without a supported action (grpc).
    pub fn from_spec(v: &Value) -> Option<Probe> {
        let action = if let Some(cmd) = v.ptr("/exec/command").and_then(Value::as_array) {
            Action::Exec(
                cmd.iter()
                    .filter_map(|s| s.as_str().map(String::from))
                    .collect(),
            )
        } else if let Some(t) = v.get("tcpSocket") {
            Action::Tcp {
                host: str_at(t, "/host").to_string(),
                port: PortRef::from_value(t.get("port"))?,
            }
        } else if let Some(h) = v.get("httpGet") {
            Action::Http {
                host: str_at(h, "/host").to_string(),
                port: PortRef::from_value(h.get("port"))?,
                path: match str_at(h, "/path") {
                    "" => "/".to_string(),
                    p => p.to_string(),
                },
            }
        } else {
            return None;
        };
        Some(Probe {
            action,
            initial_delay: secs(v, "initialDelaySeconds", 0),
            period: secs(v, "periodSeconds", 10).max(Duration::from_secs(1)),
            timeout: secs(v, "timeoutSeconds", 1).max(Duration::from_secs(1)),
            success_threshold: count(v, "successThreshold", 1),
            failure_threshold: count(v, "failureThreshold", 3),
        })
    }

    /// One probe attempt.
    pub async fn check(&self, entry: &Entry, pod_ip: &str, ports: &HashMap<String, u16>) -> bool {
        let attempt = async {
            match &self.action {
                Action::Exec(argv) => {
                    let mut cmd = entry.command(argv);
                    cmd.stdout(std::process::Stdio::null())
                        .stderr(std::process::Stdio::null());
                    match cmd.status().await {
                        Ok(st) => st.success(),
                        Err(_) => false,
                    }
                }
                Action::Tcp { host, port } => {
                    let Some(p) = port.resolve(ports) else {
                        return false;
                    };
                    let h = if host.is_empty() { pod_ip } else { host };
                    tokio::net::TcpStream::connect((h, p)).await.is_ok()
                }
                Action::Http { host, port, path } => {
                    let Some(p) = port.resolve(ports) else {
                        return false;
                    };
                    let h = if host.is_empty() { pod_ip } else { host };
                    http_ok(h, p, path).await
                }
            }
        };
        tokio::time::timeout(self.timeout, attempt)
            .await
            .unwrap_or(false)
    }

    /// Probes until dropped, reporting the verdict after each attempt once a
    /// threshold was crossed (`true` healthy, `false` failed).
    pub async fn run(
        &self,
        entry: &Entry,
        pod_ip: &str,
        ports: &HashMap<String, u16>,
        mut report: impl FnMut(bool),
    ) {
        tokio::time::sleep(self.initial_delay).await;
        let (mut ok, mut bad) = (0u32, 0u32);
        loop {
            if self.check(entry, pod_ip, ports).await {
                ok += 1;
                bad = 0;
                if ok >= self.success_threshold {
                    report(true);
                }
            } else {
                bad += 1;
                ok = 0;
                if bad >= self.failure_threshold {
                    report(false);
                }
            }
            tokio::time::sleep(self.period).await;
        }
    }
}

/// A minimal HTTP/1.0 GET: 200–399 is healthy, as kubelet counts it.
async fn http_ok(host: &str, port: u16, path: &str) -> bool {
    let Ok(mut s) = tokio::net::TcpStream::connect((host, port)).await else {
        return false;
    };
    let req = format!(
        "GET {path} HTTP/1.0\r\nHost: {host}:{port}\r\nUser-Agent: kube-probe/1.29\r\n\r\n"
    );
    if s.write_all(req.as_bytes()).await.is_err() {
        return false;
    }
    let mut buf = [0u8; 64];
    let mut n = 0;
    while n < 12 {
        match s.read(&mut buf[n..]).await {
            Ok(0) | Err(_) => break,
            Ok(k) => n += k,
        }
    }
    let line = String::from_utf8_lossy(&buf[..n]);
    line.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse::<u16>().ok())
        .is_some_and(|c| (200..400).contains(&c))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn probes_parse_with_kubernetes_defaults() {
        let p =
            Probe::from_spec(&json!({"exec": {"command": ["true"]}, "periodSeconds": 2})).unwrap();
        assert_eq!(p.action, Action::Exec(vec!["true".into()]));
        assert_eq!(p.period, Duration::from_secs(2));
        assert_eq!(p.failure_threshold, 3);
        let t = Probe::from_spec(&json!({"tcpSocket": {"port": "pg"}})).unwrap();
        assert_eq!(
            t.action,
            Action::Tcp {
                host: String::new(),
                port: PortRef::Name("pg".into())
            }
        );
        assert!(Probe::from_spec(&json!({"grpc": {"port": 1}})).is_none());
    }
}
