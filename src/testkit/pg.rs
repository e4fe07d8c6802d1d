//! PostgreSQL sessions the way an application opens them: superuser over
//! TCP to an address (usually a Service's ClusterIP), no TLS.

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
    let mut cfg = tokio_postgres::Config::new();
    cfg.host(host)
        .port(port)
        .user("postgres")
        .password(password)
        .dbname("postgres")
        .connect_timeout(timeout);
    let (client, conn) =
        cfg.connect(tokio_postgres::NoTls)
            .await
            .map_err(|source| Error::Postgres {
                what: format!("connecting to {host}:{port}"),
                source,
            })?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}
