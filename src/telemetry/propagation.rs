//! W3C trace context as text: how an operation that outlives a process
//! (a rollout, a major upgrade) keeps one trace — its root span's
//! `traceparent` is stored with the operation and every later span is
//! parented on it.

use opentelemetry::propagation::TextMapPropagator;
use opentelemetry::trace::TraceContextExt;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use std::collections::HashMap;

/// The carrier key, and the name operations store the value under.
pub const KEY: &str = "traceparent";

/// The context a `traceparent` value names (`None` when it is not one).
pub fn extract(traceparent: &str) -> Option<opentelemetry::Context> {
    let carrier = HashMap::from([(KEY.to_string(), traceparent.to_string())]);
    let cx = TraceContextPropagator::new().extract(&carrier);
    cx.span().span_context().is_valid().then_some(cx)
}

/// The `traceparent` of a context (`None` when it holds no valid span).
pub fn inject(cx: &opentelemetry::Context) -> Option<String> {
    let mut carrier: HashMap<String, String> = HashMap::new();
    TraceContextPropagator::new().inject_context(cx, &mut carrier);
    carrier.remove(KEY)
}
