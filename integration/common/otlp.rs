//! An OTLP/HTTP trace receiver for tests: `POST /v1/traces` on loopback,
//! bodies decoded as `ExportTraceServiceRequest` (opentelemetry-proto) and
//! kept; helpers to read the spans back.
#![allow(dead_code, clippy::unwrap_used)]

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::routing::post;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use opentelemetry_proto::tonic::common::v1::{AnyValue, KeyValue, any_value};
use opentelemetry_proto::tonic::trace::v1::Span;
use prost::Message;
use std::sync::{Arc, Mutex};

/// Starts the receiver; returns its port and what it receives.
pub async fn start() -> (u16, Received) {
    let store: Received = Arc::default();
    let app = Router::new()
        .route("/v1/traces", post(receive))
        .with_state(store.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    tokio::spawn(async move { axum::serve(listener, app).await });
    (port, store)
}

/// Every export request the receiver got.
pub type Received = Arc<Mutex<Vec<ExportTraceServiceRequest>>>;

pub async fn receive(
    State(store): State<Received>,
    body: Bytes,
) -> impl axum::response::IntoResponse {
    match ExportTraceServiceRequest::decode(body) {
        Ok(req) => {
            store.lock().unwrap().push(req);
            (
                axum::http::StatusCode::OK,
                [("content-type", "application/x-protobuf")],
                Vec::new(),
            )
        }
        Err(_) => (
            axum::http::StatusCode::BAD_REQUEST,
            [("content-type", "text/plain")],
            b"not an ExportTraceServiceRequest".to_vec(),
        ),
    }
}

/// A span with its resource attributes, flattened.
#[derive(Clone, Debug)]
pub struct Flat {
    pub span: Span,
    pub resource: Vec<KeyValue>,
}

pub fn spans(store: &Received) -> Vec<Flat> {
    let mut out = vec![];
    for req in store.lock().unwrap().iter() {
        for rs in &req.resource_spans {
            let resource = rs
                .resource
                .as_ref()
                .map(|r| r.attributes.clone())
                .unwrap_or_default();
            for ss in &rs.scope_spans {
                for s in &ss.spans {
                    out.push(Flat {
                        span: s.clone(),
                        resource: resource.clone(),
                    });
                }
            }
        }
    }
    out
}

pub fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

pub fn attr(s: &Span, key: &str) -> Option<String> {
    s.attributes
        .iter()
        .find(|kv| kv.key == key)
        .map(|kv| text(&kv.value))
}

/// Every attribute value of a span: its own, its events', its links' and
/// its resource's.
pub fn all_values(f: &Flat) -> Vec<String> {
    let s = &f.span;
    let mut kvs: Vec<&KeyValue> = s.attributes.iter().chain(f.resource.iter()).collect();
    for e in &s.events {
        kvs.extend(e.attributes.iter());
    }
    for l in &s.links {
        kvs.extend(l.attributes.iter());
    }
    let mut out: Vec<String> = kvs
        .iter()
        .flat_map(|kv| [kv.key.clone(), text(&kv.value)])
        .collect();
    out.push(s.name.clone());
    out.extend(s.events.iter().map(|e| e.name.clone()));
    out
}
