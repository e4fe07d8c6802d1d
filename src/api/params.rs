//! The path parameters `{cluster}/{namespace}/{name}`, checked before they
//! reach anything. axum percent-decodes path segments, and kube-core puts
//! names into request URLs unescaped, so `x%2F..%2Fsecrets` or `x%3F` would
//! otherwise steer a request to another object of the member cluster. Every
//! parameter must be a DNS-1123 name (what Kubernetes itself accepts for
//! these objects); anything else is a JSON 400 naming the parameter.

use super::error::ApiError;
use crate::config::selector::is_dns_label;
use axum::extract::{FromRequestParts, Path};
use axum::http::request::Parts;

/// `{cluster}/{namespace}/{name}` of a PostgresCluster route, validated.
#[derive(Debug, Clone)]
pub struct PgcPath {
    pub cluster: String,
    pub namespace: String,
    pub name: String,
}

/// A DNS-1123 subdomain: dot-separated labels, at most 253 characters.
pub fn is_dns_subdomain(s: &str) -> bool {
    s.len() <= 253 && s.split('.').all(is_dns_label)
}

/// Checks one decoded parameter; the error names the parameter and shows
/// the value escaped and cut short (it is attacker-chosen).
pub fn check(param: &str, value: &str, subdomain: bool) -> Result<(), ApiError> {
    let ok = if subdomain {
        is_dns_subdomain(value)
    } else {
        is_dns_label(value)
    };
    if ok {
        return Ok(());
    }
    let shown: String = value.escape_default().take(80).collect();
    let rule = if subdomain {
        "a DNS-1123 subdomain: lowercase letters, digits, '-' and '.', at most 253 characters"
    } else {
        "a DNS-1123 label: lowercase letters, digits and '-', at most 63 characters"
    };
    Err(ApiError::bad_request(format!(
        "path parameter {param} = \"{shown}\" is not {rule}"
    )))
}

impl PgcPath {
    /// Pure validation of the three decoded values.
    pub fn parse(cluster: String, namespace: String, name: String) -> Result<PgcPath, ApiError> {
        check("cluster", &cluster, false)?;
        check("namespace", &namespace, false)?;
        check("name", &name, true)?;
        Ok(PgcPath {
            cluster,
            namespace,
            name,
        })
    }
}

impl<S: Send + Sync> FromRequestParts<S> for PgcPath {
    type Rejection = ApiError;

    async fn from_request_parts(parts: &mut Parts, state: &S) -> Result<Self, Self::Rejection> {
        let Path((cluster, namespace, name)) =
            Path::<(String, String, String)>::from_request_parts(parts, state)
                .await
                .map_err(|e| ApiError::bad_request(format!("bad path: {}", e.body_text())))?;
        PgcPath::parse(cluster, namespace, name)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_pass_and_url_tricks_are_refused() {
        assert!(PgcPath::parse("eu-1".into(), "shop".into(), "orders".into()).is_ok());
        assert!(PgcPath::parse("eu-1".into(), "shop".into(), "orders.v2".into()).is_ok());
        for (c, ns, n, param) in [
            ("eu-1", "shop", "x/../y", "name"),
            ("eu-1", "shop", "x?", "name"),
            ("eu-1", "shop", "..", "name"),
            ("eu-1", "a/b", "x", "namespace"),
            ("eu-1", "Shop", "x", "namespace"),
            ("eu 1", "shop", "x", "cluster"),
            ("eu-1", "shop", "x\r\nHost: evil", "name"),
        ] {
            let e = PgcPath::parse(c.into(), ns.into(), n.into())
                .err()
                .map(|e| (e.status, e.message));
            let (status, message) = e.unwrap_or_else(|| panic!("{c}/{ns}/{n} accepted"));
            assert_eq!(status, axum::http::StatusCode::BAD_REQUEST);
            assert!(
                message.starts_with(&format!("path parameter {param} ")),
                "{message}"
            );
            assert!(!message.contains('\n'), "{message}");
        }
    }
}
