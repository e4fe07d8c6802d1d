//! Talking to a running manager's HTTP API: where it is (`--server`,
//! `PGFLEET_SERVER`, else the config's `manager.listen`), the bearer token
//! for state-changing calls (`--token`, `PGFLEET_API_TOKEN`, a token file,
//! else the config's own token), and a small HTTP/1.1 client (hyper) —
//! plain HTTP, as the manager serves it; put TLS in front of it remotely.

use crate::config::Secret;
use anyhow::{Context, bail};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use serde_json::Value;
use std::path::{Path, PathBuf};

/// How to print answers.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Output {
    #[default]
    Table,
    Json,
}

/// Options of every command that goes through the API.
#[derive(clap::Args, Debug, Clone, Default)]
pub struct ApiArgs {
    /// Manager API URL, e.g. http://127.0.0.1:8080 (default: the config's
    /// manager.listen). For switchover/backup/rollout commands, setting it
    /// sends them through the API instead of straight to the member cluster.
    #[arg(long, env = "PGFLEET_SERVER", global = true)]
    pub server: Option<String>,
    /// Bearer token for state-changing calls (prefer --token-file).
    #[arg(long, env = "PGFLEET_API_TOKEN", global = true, hide_env_values = true)]
    pub token: Option<String>,
    /// File holding the bearer token.
    #[arg(long, env = "PGFLEET_API_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// table or json.
    #[arg(long, short = 'o', value_enum, default_value = "table", global = true)]
    pub output: Output,
}

/// A client of one manager's API.
pub struct Client {
    /// `host:port`.
    authority: String,
    token: Option<Secret>,
}

/// The `host:port` of `http://host:port[/]` or `host:port`.
pub fn authority_of(server: &str) -> anyhow::Result<String> {
    let rest = match server.split_once("://") {
        Some(("http", rest)) => rest,
        Some(_) => {
            bail!("--server {server}: only http:// is supported (the manager serves plain HTTP)")
        }
        None => server,
    };
    let auth = rest.trim_end_matches('/');
    if auth.is_empty() || auth.contains('/') || !auth.contains(':') {
        bail!("--server {server}: expected http://HOST:PORT");
    }
    Ok(auth.to_string())
}

/// The manager's address from the fleet config: a wildcard listen address
/// is reached on loopback.
fn from_config(config: Option<&Path>) -> anyhow::Result<(String, Option<Secret>)> {
    let settings = crate::config::load(config)
        .map_err(|e| anyhow::anyhow!("the configuration is invalid:\n{e}"))?;
    let mut addr = settings.manager.listen_addr();
    if addr.port() == 0 {
        bail!(
            "manager.listen uses port 0 (any free port): pass --server with the address `pgfleet run` printed"
        );
    }
    if addr.ip().is_unspecified() {
        addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
    }
    // A token the config names is ours to use on this machine; errors (an
    // unreadable file) only matter for writes and are reported there.
    let token = settings.manager.resolve_api_token().ok().flatten();
    Ok((addr.to_string(), token))
}

impl Client {
    pub fn new(args: &ApiArgs, config: Option<&Path>) -> anyhow::Result<Client> {
        let explicit = match (&args.token, &args.token_file) {
            (Some(t), _) => Some(Secret::new(t.trim())),
            (None, Some(p)) => {
                let t = std::fs::read_to_string(p)
                    .with_context(|| format!("reading the token file {}", p.display()))?;
                Some(Secret::new(t.trim()))
            }
            (None, None) => None,
        };
        let (authority, token) = match &args.server {
            Some(s) => (authority_of(s)?, None),
            None => from_config(config)?,
        };
        Ok(Client {
            authority,
            token: explicit.or(token),
        })
    }

    pub fn url(&self) -> String {
        format!("http://{}", self.authority)
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(http::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.call(http::Method::POST, path, Some(body)).await
    }

    /// One request; a non-2xx answer becomes an error with the API's message.
    async fn call(
        &self,
        method: http::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let stream = tokio::net::TcpStream::connect(&self.authority)
            .await
            .with_context(|| {
                format!(
                    "cannot reach the pgfleet API at {} — is `pgfleet run` running there? (--server or PGFLEET_SERVER)",
                    self.url()
                )
            })?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io)
            .await
            .context("HTTP handshake with the pgfleet API")?;
        tokio::spawn(conn);
        let mut req = http::Request::builder()
            .method(method.clone())
            .uri(path)
            .header(http::header::HOST, &self.authority)
            .header(http::header::ACCEPT, "application/json");
        let payload = match body {
            Some(b) => {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
                if let Some(t) = &self.token {
                    req = req.header(
                        http::header::AUTHORIZATION,
                        format!("Bearer {}", t.expose()),
                    );
                }
                Bytes::from(serde_json::to_vec(&b)?)
            }
            None => Bytes::new(),
        };
        let resp = sender
            .send_request(req.body(Full::new(payload))?)
            .await
            .with_context(|| format!("{method} {path}"))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let msg = value
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no error message");
        let hint = match status.as_u16() {
            401 => " (pass --token, --token-file or PGFLEET_API_TOKEN)",
            _ => "",
        };
        bail!("{method} {path}: {status}: {msg}{hint}")
    }
}

/// Prints a JSON answer as `--output json` wants it.
pub fn print_json(v: &Value) -> anyhow::Result<()> {
    println!("{}", serde_json::to_string_pretty(v)?);
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn server_urls() {
        assert_eq!(
            authority_of("http://127.0.0.1:8080/").unwrap(),
            "127.0.0.1:8080"
        );
        assert_eq!(authority_of("localhost:9000").unwrap(), "localhost:9000");
        assert!(authority_of("https://x:1").is_err());
        assert!(authority_of("http://x").is_err());
        assert!(authority_of("http://x:1/api").is_err());
    }
}
