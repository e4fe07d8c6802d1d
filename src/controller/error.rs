//! Why a reconcile failed, by step, and what kind of failure it was.
//!
//! Every variant names the reconcile step that failed; [`Error::category`]
//! says what went wrong underneath (derived from the kube/HTTP error), so
//! the error metric, the Warning Event and the retry policy
//! ([`super::retry`]) can tell a conflict from an unreachable member or a
//! spec that can never work.

use crate::postgres::exec::ExecError;

/// One Kubernetes API call that failed: what it did to which object.
#[derive(Debug, thiserror::Error)]
#[error("{op} {kind} {name}: {source}")]
pub struct ApiFailure {
    pub op: &'static str,
    pub kind: &'static str,
    pub name: String,
    pub source: kube::Error,
}

/// A failed reconcile, one variant per step of the pipeline.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Reading the cluster or what it depends on (the fresh GET, a restore
    /// source, a backup record).
    #[error("observe: {0}")]
    Observe(ApiFailure),
    /// A restore or repository precondition that the API cannot express
    /// (backups not configured, unknown member, unreadable source).
    #[error("validate: {0}")]
    Validate(String),
    /// Deciding or moving the primary: failover, switchover, relabelling.
    #[error("primary: {0}")]
    Primary(ApiFailure),
    /// Asking an instance (exec into its Pod).
    #[error("instance: {0}")]
    Instance(#[from] ExecError),
    /// Building a child object from the spec.
    #[error("build {what}: {message}")]
    Build { what: String, message: String },
    /// Creating, applying or deleting children.
    #[error("apply: {0}")]
    Apply(ApiFailure),
    /// The rolling update's API calls.
    #[error("update: {0}")]
    Update(ApiFailure),
    /// Writing `.status`.
    #[error("status: {0}")]
    Status(ApiFailure),
    /// Adding or removing the finalizer.
    #[error("finalizer: {0}")]
    Finalizer(ApiFailure),
    /// The backup repository or its passphrase could not be prepared.
    #[error("repository: {0}")]
    Repository(String),
    /// Data that must be there is not (a PostgresCluster without a
    /// namespace or uid, a child without its name).
    #[error("{kind} {name}: {field} is missing")]
    Missing {
        kind: &'static str,
        name: String,
        field: &'static str,
    },
}

/// What kind of failure an [`Error`] is: the error metric's `category`
/// label, the Warning Event's reason, and the retry policy's input.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Category {
    /// Someone else changed the object first (409): retry soon.
    Conflict,
    /// The member cluster's API server could not be reached.
    Unreachable,
    /// A call or an instance did not answer in time.
    Timeout,
    /// pgfleet lacks a permission (401/403): retrying fast will not help.
    Forbidden,
    /// The spec (or what it produced) is refused: wait for a spec change.
    InvalidSpec,
    /// The server failed or throttled (5xx, 429): transient.
    ServerError,
    /// A bug or broken invariant on pgfleet's side.
    Internal,
}

impl Category {
    /// Every category, so metric series can start at zero.
    pub const ALL: [Category; 7] = [
        Category::Conflict,
        Category::Unreachable,
        Category::Timeout,
        Category::Forbidden,
        Category::InvalidSpec,
        Category::ServerError,
        Category::Internal,
    ];

    /// The metric label value.
    pub fn label(self) -> &'static str {
        match self {
            Category::Conflict => "conflict",
            Category::Unreachable => "unreachable",
            Category::Timeout => "timeout",
            Category::Forbidden => "forbidden",
            Category::InvalidSpec => "invalid",
            Category::ServerError => "server_error",
            Category::Internal => "internal",
        }
    }

    /// The reason of the Warning Event a failed reconcile records.
    pub fn reason(self) -> &'static str {
        match self {
            Category::Conflict => "ReconcileConflict",
            Category::Unreachable => "ReconcileUnreachable",
            Category::Timeout => "ReconcileTimeout",
            Category::Forbidden => "ReconcileForbidden",
            Category::InvalidSpec => "ReconcileInvalid",
            Category::ServerError => "ReconcileServerError",
            Category::Internal => "ReconcileInternalError",
        }
    }

    /// The category of a kube client error: the HTTP status for answers,
    /// the transport for everything that never got one.
    pub fn of_kube(e: &kube::Error) -> Category {
        match e {
            kube::Error::Api(s) => Category::of_status(s.code),
            kube::Error::HyperError(h) if h.is_timeout() => Category::Timeout,
            kube::Error::HyperError(_) | kube::Error::Service(_) => Category::Unreachable,
            kube::Error::ReadEvents(_) | kube::Error::UpgradeConnection(_) => Category::Unreachable,
            kube::Error::Auth(_) => Category::Forbidden,
            _ => Category::Internal,
        }
    }

    /// The category of an HTTP status code from the API server.
    pub fn of_status(code: u16) -> Category {
        match code {
            409 => Category::Conflict,
            // A child that vanished under us, or a stale cache: the next
            // reconcile sees the truth.
            404 | 410 => Category::Conflict,
            401 | 403 => Category::Forbidden,
            400 | 422 => Category::InvalidSpec,
            408 | 504 => Category::Timeout,
            429 | 500..=599 => Category::ServerError,
            _ => Category::Internal,
        }
    }
}

impl std::fmt::Display for Category {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

impl Error {
    /// What kind of failure this is (see [`Category`]).
    pub fn category(&self) -> Category {
        match self {
            Error::Observe(a)
            | Error::Primary(a)
            | Error::Apply(a)
            | Error::Update(a)
            | Error::Status(a)
            | Error::Finalizer(a) => Category::of_kube(&a.source),
            Error::Instance(ExecError::Start { source, .. }) => Category::of_kube(source),
            Error::Instance(ExecError::Timeout { .. }) => Category::Timeout,
            // The instance answered with a failure: its state may change.
            Error::Instance(ExecError::Verb { .. }) => Category::ServerError,
            Error::Validate(_) => Category::InvalidSpec,
            Error::Repository(_) => Category::ServerError,
            Error::Build { .. } | Error::Missing { .. } => Category::Internal,
        }
    }
}

/// A constructor for the [`Error`] of an API call `op` on `kind` `name`,
/// for `map_err`. The step follows from the operation: reads observe,
/// `status` writes the status, everything else applies children.
pub(crate) fn kerr<'a>(
    op: &'static str,
    kind: &'static str,
    name: &'a str,
) -> impl FnOnce(kube::Error) -> Error + 'a {
    move |source| {
        let a = ApiFailure {
            op,
            kind,
            name: name.to_string(),
            source,
        };
        match op {
            "get" | "list" => Error::Observe(a),
            "status" => Error::Status(a),
            _ => Error::Apply(a),
        }
    }
}

/// An [`ApiFailure`] for the constructors that pick their step themselves.
pub(crate) fn api(
    op: &'static str,
    kind: &'static str,
    name: &str,
    source: kube::Error,
) -> ApiFailure {
    ApiFailure {
        op,
        kind,
        name: name.to_string(),
        source,
    }
}

#[cfg(test)]
#[path = "error_tests.rs"]
mod tests;
