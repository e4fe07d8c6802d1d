//! API errors as kube-apiserver returns them: a `Status` object with code,
//! reason and message, which kube-rs and kubectl both decode and print.

use serde_json::{Value, json};

#[derive(Debug, Clone)]
pub struct ApiError {
    pub code: u16,
    pub reason: &'static str,
    pub message: String,
    pub details: Option<Value>,
}

impl ApiError {
    pub fn new(code: u16, reason: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            code,
            reason,
            message: message.into(),
            details: None,
        }
    }

    pub fn not_found(qualified: &str, name: &str) -> Self {
        ApiError::new(404, "NotFound", format!("{qualified} \"{name}\" not found")).with_details(
            json!({"name": name, "kind": qualified.split('.').next().unwrap_or(qualified)}),
        )
    }

    pub fn already_exists(qualified: &str, name: &str) -> Self {
        ApiError::new(
            409,
            "AlreadyExists",
            format!("{qualified} \"{name}\" already exists"),
        )
        .with_details(json!({"name": name, "kind": qualified}))
    }

    pub fn conflict(qualified: &str, name: &str) -> Self {
        ApiError::new(
            409,
            "Conflict",
            format!(
                "Operation cannot be fulfilled on {qualified} \"{name}\": the object has been modified; please apply your changes to the latest version and try again"
            ),
        )
        .with_details(json!({"name": name, "kind": qualified}))
    }

    pub fn bad_request(message: impl Into<String>) -> Self {
        ApiError::new(400, "BadRequest", message)
    }

    pub fn invalid(kind: &str, name: &str, causes: Vec<(String, String, String)>) -> Self {
        let summary: Vec<String> = causes.iter().map(|(_, _, m)| m.clone()).collect();
        let msg = if summary.len() == 1 {
            summary[0].clone()
        } else {
            format!("[{}]", summary.join(", "))
        };
        ApiError::new(
            422,
            "Invalid",
            format!("{kind} \"{name}\" is invalid: {msg}"),
        )
        .with_details(json!({
            "name": name,
            "kind": kind,
            "causes": causes.iter().map(|(field, reason, message)| json!({
                "field": field, "reason": reason,
                "message": message.strip_prefix(&format!("{field}: ")).unwrap_or(message)
            })).collect::<Vec<_>>()
        }))
    }

    pub fn method_not_allowed() -> Self {
        ApiError::new(
            405,
            "MethodNotAllowed",
            "the server does not allow this method on the requested resource",
        )
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.details = Some(details);
        self
    }

    pub fn status(&self) -> Value {
        let mut s = json!({
            "kind": "Status",
            "apiVersion": "v1",
            "metadata": {},
            "status": "Failure",
            "message": self.message,
            "reason": self.reason,
            "code": self.code,
        });
        if let Some(d) = &self.details {
            s["details"] = d.clone();
        }
        s
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({}): {}", self.code, self.reason, self.message)
    }
}

impl std::error::Error for ApiError {}
