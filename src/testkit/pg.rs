//! PostgreSQL sessions the way an application opens them: superuser over
//! TCP to an address (usually a Service's ClusterIP), over TLS when the server offers it (instances
//! refuse plain text; the certificate is not checked here, see testkit::tls).

use super::{Error, Result};
use std::time::Duration;

/// Opens a session as `postgres` to database `postgres` at `host:port`;
/// the connection task runs until the client is dropped.
pub async fn connect(
    host: &str,
    port: u16,
    password: &str,
    timeout: Duration,
) -> Result<tokio_postgres::Client> {
    connect_as(host, port, "postgres", password, timeout).await
}

/// [`connect`] as `user` (to database `postgres`): what a client of the
/// pooler does, which logs no superuser in.
pub async fn connect_as(
    host: &str,
    port: u16,
    user: &str,
    password: &str,
    timeout: Duration,
) -> Result<tokio_postgres::Client> {
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(host)
        .port(port)
        .user(user)
        .password(password)
        .dbname("postgres")
        .ssl_mode(tokio_postgres::config::SslMode::Prefer)
        .connect_timeout(timeout);
    let tls = super::tls::encrypted().map_err(|e| Error::Config(format!("TLS client: {e}")))?;
    let (client, conn) = cfg.connect(tls).await.map_err(|source| Error::Postgres {
        what: format!("connecting to {host}:{port}"),
        source,
    })?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}
