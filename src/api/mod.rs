//! The HTTP API, `/metrics` and the dashboard of `pgfleet run` (axum).
//!
//! Reads are served from the controllers' caches and the fleet registry
//! (`read.rs`); writes only record intent through the same functions the
//! direct CLI commands use (`ops::actions`), behind a bearer token
//! (`auth.rs`). Every error is JSON (`error.rs`). Two values come from
//! other parts of the manager through hooks, so this module depends on
//! neither: the metrics exposition and the owner of each member cluster.
//! See `docs/api.md`.

pub mod auth;
mod dr;
pub mod edge;
pub mod error;
mod flight;
pub mod params;
mod read;
pub mod rollouts;
mod source;
pub mod tls;
mod write;

pub use edge::Edge;

use crate::config::Settings;
use crate::controller;
use crate::fleet::Fleet;
use axum::Router;
use axum::extract::{Request, State};
use axum::http::{StatusCode, header};
use axum::middleware::{self, Next};
use axum::response::{Html, IntoResponse, Response};
use axum::routing::{get, post};
use error::ApiError;
use std::net::SocketAddr;
use std::sync::Arc;

/// Text of `/metrics`.
pub type MetricsHook = Arc<dyn Fn() -> String + Send + Sync>;
/// The manager replica that owns a member cluster (by name), if known.
pub type OwnerHook = Arc<dyn Fn(&str) -> Option<String> + Send + Sync>;
/// The controllers running on this replica now (HA: the owned members).
pub type ControllersHook = Arc<dyn Fn() -> Vec<controller::Handle> + Send + Sync>;

/// Values other parts of the manager provide.
#[derive(Clone)]
pub struct Hooks {
    pub metrics: MetricsHook,
    pub owner: OwnerHook,
    pub controllers: ControllersHook,
}

impl Hooks {
    /// An empty exposition; this manager owns every member (one replica)
    /// and runs `controllers` for good.
    pub fn single(identity: Option<String>, controllers: Vec<controller::Handle>) -> Hooks {
        Hooks {
            metrics: Arc::new(|| "# EOF\n".to_string()),
            owner: Arc::new(move |_| identity.clone()),
            controllers: Arc::new(move || controllers.clone()),
        }
    }
}

/// What every handler shares.
#[derive(Clone)]
pub struct ApiState {
    pub settings: Arc<Settings>,
    pub fleet: Arc<Fleet>,
    pub identity: Option<String>,
    pub hooks: Hooks,
    pub rollout_status: Arc<rollouts::StatusCache>,
    lists: Arc<source::ListCache>,
    flights: Arc<flight::Flights>,
    limits: Arc<edge::Limits>,
}

impl ApiState {
    pub fn new(
        settings: &Settings,
        fleet: Arc<Fleet>,
        identity: Option<String>,
        hooks: Hooks,
    ) -> ApiState {
        ApiState {
            settings: Arc::new(settings.clone()),
            fleet,
            identity,
            hooks,
            rollout_status: Arc::default(),
            lists: Arc::default(),
            flights: Arc::default(),
            limits: Arc::new(edge::Limits::of(&settings.manager)),
        }
    }
}

/// Every route.
pub fn router(state: ApiState) -> Router {
    let pgc = "/api/v1/postgresclusters/{cluster}/{namespace}/{name}";
    let writes = Router::new()
        .route(&format!("{pgc}/switchover"), post(write::switchover))
        .route(&format!("{pgc}/backup"), post(write::backup))
        .route("/api/v1/rollouts/{name}/{command}", post(rollouts::command))
        .route("/api/v1/dr/{name}/{command}", post(dr::command))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_token));
    Router::new()
        .route("/", get(dashboard))
        .route("/healthz", get(read::healthz))
        .route("/readyz", get(read::readyz))
        .route("/metrics", get(read::metrics))
        .route("/api/v1/fleet", get(read::fleet))
        .route("/api/v1/clusters", get(read::list_clusters))
        .route("/api/v1/postgresclusters", get(read::list_pgcs))
        .route(pgc, get(read::get_pgc))
        .route("/api/v1/rollouts", get(rollouts::list))
        .route("/api/v1/rollouts/{name}", get(rollouts::get))
        .route("/api/v1/dr", get(dr::list))
        .route("/api/v1/dr/{name}", get(dr::get))
        .merge(writes)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .layer(middleware::from_fn_with_state(
            state.limits.clone(),
            edge::limit,
        ))
        .with_state(state)
}

/// Binds `addr` (port 0: any free port) and serves until the task is
/// dropped, as `[manager]` says (TLS, timeouts); returns the bound address.
pub async fn spawn(
    addr: SocketAddr,
    state: ApiState,
) -> anyhow::Result<(SocketAddr, crate::platform::task::AbortOnDrop)> {
    let edge = Edge::of(&state.settings.manager)?;
    spawn_with(addr, state, edge).await
}

/// [`spawn`] with connection handling prepared before (`pgfleet run` loads
/// the TLS files before it starts anything else).
pub async fn spawn_with(
    addr: SocketAddr,
    state: ApiState,
    edge: Edge,
) -> anyhow::Result<(SocketAddr, crate::platform::task::AbortOnDrop)> {
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {addr} (manager.listen): {e}"))?;
    let bound = listener.local_addr()?;
    let app = router(state);
    let task = tokio::spawn(edge.serve(listener, app));
    Ok((bound, crate::platform::task::AbortOnDrop(task)))
}

/// What `pgfleet run` checks before it starts anything: the API token (a
/// weak or placeholder token in `api_token_file` is refused; an inline one
/// was refused by config validation) and the TLS files. Errors name the key
/// and file, never the token.
pub fn preflight(settings: &Settings) -> anyhow::Result<Edge> {
    settings.manager.resolve_api_token()?;
    Ok(Edge::of(&settings.manager)?)
}

/// The bearer-token gate of every state-changing route: nothing behind it
/// runs unless the token matches.
async fn require_token(State(state): State<ApiState>, req: Request, next: Next) -> Response {
    let header = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    match auth::check(header, state.settings.manager.resolve_api_token()) {
        auth::Verdict::Allowed => next.run(req).await,
        auth::Verdict::Unauthorized(why) => {
            let mut resp = ApiError::new(StatusCode::UNAUTHORIZED, why).into_response();
            resp.headers_mut().insert(
                header::WWW_AUTHENTICATE,
                header::HeaderValue::from_static("Bearer realm=\"pgfleet\""),
            );
            resp
        }
        auth::Verdict::WritesDisabled => ApiError::new(
            StatusCode::FORBIDDEN,
            "state-changing requests are disabled: no API token is configured \
             (set manager.api_token_file, manager.api_token or PGFLEET_MANAGER__API_TOKEN)",
        )
        .into_response(),
        auth::Verdict::Unavailable(why) => {
            tracing::warn!(error = %why, "the API token cannot be read");
            ApiError::new(StatusCode::SERVICE_UNAVAILABLE, why).into_response()
        }
    }
}

/// A JSON body, or the default when the body is empty.
fn parse_body<T: serde::de::DeserializeOwned + Default>(body: &[u8]) -> Result<T, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid: {e}")))
}

async fn dashboard() -> Html<&'static str> {
    Html(include_str!("dashboard.html"))
}

async fn not_found(req: Request) -> ApiError {
    ApiError::not_found(format!(
        "no endpoint {} {} (see docs/api.md)",
        req.method(),
        req.uri().path()
    ))
}

async fn method_not_allowed(req: Request) -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        format!("{} is not allowed on {}", req.method(), req.uri().path()),
    )
}
