//! Every error the API returns is JSON: `{"error": "<message>", "status": N}`
//! with a message that says what to do. Messages never carry credentials:
//! they are built from names and kube error summaries only.

use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;

#[derive(Debug)]
pub struct ApiError {
    pub status: StatusCode,
    pub message: String,
}

impl ApiError {
    pub fn new(status: StatusCode, message: impl Into<String>) -> Self {
        Self {
            status,
            message: message.into(),
        }
    }
    pub fn bad_request(m: impl Into<String>) -> Self {
        Self::new(StatusCode::BAD_REQUEST, m)
    }
    pub fn not_found(m: impl Into<String>) -> Self {
        Self::new(StatusCode::NOT_FOUND, m)
    }
    /// A member cluster call failed: 404 when the object is missing, 409 on
    /// a conflict, 502 otherwise (the member's API server answered badly or
    /// not at all).
    pub fn from_kube(what: &str, e: &kube::Error) -> Self {
        match e {
            kube::Error::Api(s) if s.code == 404 => Self::not_found(format!("{what}: not found")),
            kube::Error::Api(s) if s.code == 409 => Self::new(
                StatusCode::CONFLICT,
                format!("{what}: conflict ({})", s.message),
            ),
            kube::Error::Api(s) => Self::new(
                StatusCode::BAD_GATEWAY,
                format!(
                    "{what}: the member cluster answered {} ({})",
                    s.code, s.message
                ),
            ),
            _ => Self::new(
                StatusCode::BAD_GATEWAY,
                format!("{what}: the member cluster could not be reached"),
            ),
        }
    }
}

impl From<anyhow::Error> for ApiError {
    fn from(e: anyhow::Error) -> Self {
        // A kube error somewhere in the chain decides the status code.
        if let Some(k) = e.chain().find_map(|c| c.downcast_ref::<kube::Error>()) {
            return Self::from_kube(&e.to_string(), k);
        }
        Self::new(StatusCode::UNPROCESSABLE_ENTITY, format!("{e:#}"))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({"error": self.message, "status": self.status.as_u16()});
        (self.status, Json(body)).into_response()
    }
}
