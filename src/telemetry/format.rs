//! Log line formats that carry the trace id, so a log line leads to its
//! trace (and a trace to its log lines) in whatever backend stores both.
//!
//! The trace id is read from the OpenTelemetry context that
//! tracing-opentelemetry activates when a span is entered; lines logged
//! outside any exported span have none.

use opentelemetry::trace::TraceContextExt;
use std::fmt;
use tracing::{Event, Subscriber};
use tracing_subscriber::fmt::format::{self, FormatEvent, FormatFields, Writer};
use tracing_subscriber::fmt::{FmtContext, FormattedFields};
use tracing_subscriber::registry::LookupSpan;

/// `(trace id, span id)` of the current span, as lowercase hex.
pub fn current_ids() -> Option<(String, String)> {
    let cx = opentelemetry::Context::current();
    let span = cx.span();
    let sc = span.span_context();
    sc.is_valid()
        .then(|| (sc.trace_id().to_string(), sc.span_id().to_string()))
}

/// The usual one-line text format, with ` trace_id=…` at the end.
pub struct Text {
    inner: format::Format<format::Full>,
}

impl Text {
    pub fn new() -> Self {
        Text {
            inner: format::Format::default()
                .with_target(false)
                .with_ansi(false),
        }
    }
}

impl Default for Text {
    fn default() -> Self {
        Self::new()
    }
}

impl<S, N> FormatEvent<S, N> for Text
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let Some((trace, _)) = current_ids() else {
            return self.inner.format_event(ctx, writer, event);
        };
        let mut line = String::new();
        self.inner
            .format_event(ctx, Writer::new(&mut line), event)?;
        let line = line.trim_end_matches('\n');
        writeln!(writer, "{line} trace_id={trace}")
    }
}

/// One JSON object per line: `timestamp`, `level`, `target`, `fields`
/// (the event's, `message` included), `spans` (names, outermost first, with
/// their fields as formatted text), `trace_id` and `span_id`.
pub struct Json;

/// Collects an event's fields as JSON values.
#[derive(Default)]
struct Fields(serde_json::Map<String, serde_json::Value>);

impl tracing::field::Visit for Fields {
    fn record_debug(&mut self, field: &tracing::field::Field, value: &dyn fmt::Debug) {
        self.0
            .insert(field.name().to_string(), format!("{value:?}").into());
    }
    fn record_str(&mut self, field: &tracing::field::Field, value: &str) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_i64(&mut self, field: &tracing::field::Field, value: i64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_u64(&mut self, field: &tracing::field::Field, value: u64) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_bool(&mut self, field: &tracing::field::Field, value: bool) {
        self.0.insert(field.name().to_string(), value.into());
    }
    fn record_f64(&mut self, field: &tracing::field::Field, value: f64) {
        self.0.insert(field.name().to_string(), value.into());
    }
}

impl<S, N> FormatEvent<S, N> for Json
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> fmt::Result {
        let meta = event.metadata();
        let mut fields = Fields::default();
        event.record(&mut fields);
        let mut spans = vec![];
        if let Some(scope) = ctx.event_scope() {
            for span in scope.from_root() {
                let ext = span.extensions();
                let text = ext
                    .get::<FormattedFields<N>>()
                    .map(|f| f.fields.clone())
                    .unwrap_or_default();
                spans.push(serde_json::json!({"name": span.name(), "fields": text}));
            }
        }
        let mut line = serde_json::json!({
            "timestamp": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
            "level": meta.level().as_str(),
            "target": meta.target(),
            "fields": fields.0,
            "spans": spans,
        });
        if let Some((trace, span)) = current_ids() {
            line["trace_id"] = trace.into();
            line["span_id"] = span.into();
        }
        writeln!(writer, "{line}")
    }
}
