//! Talking to a running manager's HTTP API: where it is (`--server`,
//! `PGFLEET_SERVER`, else the config's `manager.listen`), the bearer token
//! for state-changing calls (`--token-file`, `PGFLEET_API_TOKEN`, else the
//! config's own token — never a command-line argument, which every user of
//! the machine sees in `ps`), and the HTTP client (`crate::http_client`:
//! reqwest with timeouts, verified TLS, an optional private CA and the
//! usual proxy variables).

use crate::config::Secret;
use crate::http_client::{self, Options};
use anyhow::{Context, bail};
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
    /// Manager API URL, e.g. https://pgfleet.example:8443 (default: the
    /// config's manager.listen). For switchover/backup/rollout commands,
    /// setting it sends them through the API instead of straight to the
    /// member cluster.
    #[arg(long, env = "PGFLEET_SERVER", global = true)]
    pub server: Option<String>,
    /// Refused: a token on the command line is visible in `ps`.
    #[arg(long = "token", hide = true, global = true)]
    pub token_on_command_line: Option<String>,
    /// File holding the bearer token (or set PGFLEET_API_TOKEN).
    #[arg(long, env = "PGFLEET_API_TOKEN_FILE", global = true)]
    pub token_file: Option<PathBuf>,
    /// PEM CA bundle that signed the manager's certificate (a private CA),
    /// trusted in addition to the system's.
    #[arg(long, env = "PGFLEET_CA_FILE", global = true)]
    pub ca_file: Option<PathBuf>,
    /// PEM client certificate, for a manager that requires one.
    #[arg(
        long,
        env = "PGFLEET_CLIENT_CERT",
        global = true,
        requires = "client_key"
    )]
    pub client_cert: Option<PathBuf>,
    /// PEM private key of --client-cert.
    #[arg(
        long,
        env = "PGFLEET_CLIENT_KEY",
        global = true,
        requires = "client_cert"
    )]
    pub client_key: Option<PathBuf>,
    /// table or json.
    #[arg(long, short = 'o', value_enum, default_value = "table", global = true)]
    pub output: Output,
}

/// A client of one manager's API.
pub struct Client {
    /// `http(s)://host:port`, no trailing slash.
    base: String,
    token: Option<Secret>,
    http: reqwest::Client,
}

/// The base URL of `http(s)://host:port[/]` or `host:port` (plain HTTP).
pub fn base_of(server: &str) -> anyhow::Result<String> {
    let (scheme, rest) = match server.split_once("://") {
        Some((s @ ("http" | "https"), rest)) => (s, rest),
        Some(_) => bail!("--server {server}: expected https://HOST:PORT or http://HOST:PORT"),
        None => ("http", server),
    };
    let auth = rest.trim_end_matches('/');
    if auth.is_empty() || auth.contains('/') || !auth.contains(':') {
        bail!("--server {server}: expected https://HOST:PORT or http://HOST:PORT");
    }
    Ok(format!("{scheme}://{auth}"))
}

/// The manager's address from the fleet config (a wildcard listen address
/// is reached on loopback; https when the manager serves TLS) and the token
/// the config names, which is ours to use on this machine.
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
    let scheme = if settings.manager.tls_cert_file.is_some() {
        "https"
    } else {
        "http"
    };
    // Errors (an unreadable file) only matter for writes and are reported there.
    let token = settings.manager.resolve_api_token().ok().flatten();
    Ok((format!("{scheme}://{addr}"), token))
}

/// The token from `--token-file` or `PGFLEET_API_TOKEN` (never an argument).
fn explicit_token(args: &ApiArgs) -> anyhow::Result<Option<Secret>> {
    if args.token_on_command_line.is_some() {
        bail!(
            "--token is not accepted: a token on the command line is visible to every user \
             of this machine (ps, shell history); use --token-file FILE or the environment \
             variable PGFLEET_API_TOKEN"
        );
    }
    if let Some(p) = &args.token_file {
        let t = std::fs::read_to_string(p)
            .with_context(|| format!("reading the token file {}", p.display()))?;
        return Ok(Some(Secret::new(t.trim())));
    }
    Ok(std::env::var("PGFLEET_API_TOKEN")
        .ok()
        .map(|t| t.trim().to_string())
        .filter(|t| !t.is_empty())
        .map(Secret::new))
}

impl Client {
    pub fn new(args: &ApiArgs, config: Option<&Path>) -> anyhow::Result<Client> {
        let explicit = explicit_token(args)?;
        let (base, token) = match &args.server {
            Some(s) => (base_of(s)?, None),
            None => from_config(config)?,
        };
        let opts = Options {
            ca_file: args.ca_file.clone(),
            client_cert: args.client_cert.clone().zip(args.client_key.clone()),
            ..Options::default()
        };
        Ok(Client {
            base,
            token: explicit.or(token),
            http: http_client::build(&opts)?,
        })
    }

    pub fn url(&self) -> String {
        self.base.clone()
    }

    pub async fn get(&self, path: &str) -> anyhow::Result<Value> {
        self.call(reqwest::Method::GET, path, None).await
    }

    pub async fn post(&self, path: &str, body: Value) -> anyhow::Result<Value> {
        self.call(reqwest::Method::POST, path, Some(body)).await
    }

    /// One request; a non-2xx answer becomes an error with the API's message.
    async fn call(
        &self,
        method: reqwest::Method,
        path: &str,
        body: Option<Value>,
    ) -> anyhow::Result<Value> {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base))
            .header(reqwest::header::ACCEPT, "application/json");
        if let Some(b) = body {
            req = req
                .header(reqwest::header::CONTENT_TYPE, "application/json")
                .body(serde_json::to_vec(&b)?);
            if let Some(t) = &self.token {
                req = req.bearer_auth(t.expose());
            }
        }
        let resp = req.send().await.map_err(|e| {
            // reqwest's error names the URL; the chain says why (refused,
            // timed out, certificate not trusted).
            let why = std::iter::successors(std::error::Error::source(&e), |s| s.source())
                .map(ToString::to_string)
                .collect::<Vec<_>>()
                .join(": ");
            anyhow::anyhow!(
                "cannot reach the pgfleet API at {} ({why}) — is `pgfleet run` running there? \
                 (--server or PGFLEET_SERVER; --ca-file for a private CA)",
                self.url()
            )
        })?;
        let status = resp.status();
        let bytes = resp
            .bytes()
            .await
            .with_context(|| format!("{method} {path}: reading the answer"))?;
        let value: Value = serde_json::from_slice(&bytes).unwrap_or(Value::Null);
        if status.is_success() {
            return Ok(value);
        }
        let msg = value
            .get("error")
            .and_then(Value::as_str)
            .unwrap_or("no error message");
        let hint = match status.as_u16() {
            401 => " (pass --token-file or set PGFLEET_API_TOKEN)",
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
            base_of("http://127.0.0.1:8080/").unwrap(),
            "http://127.0.0.1:8080"
        );
        assert_eq!(base_of("https://x:8443").unwrap(), "https://x:8443");
        assert_eq!(base_of("localhost:9000").unwrap(), "http://localhost:9000");
        assert!(base_of("ftp://x:1").is_err());
        assert!(base_of("http://x").is_err());
        assert!(base_of("http://x:1/api").is_err());
    }

    #[test]
    fn a_token_on_the_command_line_is_refused() {
        let args = ApiArgs {
            token_on_command_line: Some("s3cret".into()),
            ..ApiArgs::default()
        };
        let e = explicit_token(&args).unwrap_err().to_string();
        assert!(e.contains("--token-file") && !e.contains("s3cret"), "{e}");
    }
}
