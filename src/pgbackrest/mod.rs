//! What one PostgreSQL instance needs of pgBackRest, whoever drives it:
//! the rendered configuration and credentials (`repo`), the repository of
//! each incarnation (`incarnation`), its encryption passphrase
//! (`encryption`) and the TLS pair a standby's backup reaches the primary
//! with (`tls`). The controller wires these into every cluster; the fleet's
//! backup dispatcher (`backup`) builds on them. Nothing here knows the
//! controller or the dispatcher (docs/architecture.md, "Layers").

pub mod encryption;
pub mod incarnation;
pub mod repo;
#[cfg(test)]
mod repo_props;
pub mod tls;
