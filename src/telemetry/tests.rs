use super::export::traces_url;

#[test]
fn traces_url_appends_the_standard_path_to_a_base_url() {
    assert_eq!(traces_url("http://otel:4318"), "http://otel:4318/v1/traces");
    assert_eq!(
        traces_url("http://otel:4318/"),
        "http://otel:4318/v1/traces"
    );
    assert_eq!(
        traces_url("https://collector.example/otlp/v1/traces"),
        "https://collector.example/otlp/v1/traces"
    );
}

/// Log lines written by `format` while inside a span of an OpenTelemetry
/// layer (no exporter: ids are generated all the same).
fn logged<F>(format: F) -> String
where
    F: tracing_subscriber::fmt::FormatEvent<
            tracing_subscriber::Registry,
            tracing_subscriber::fmt::format::DefaultFields,
        > + Send
        + Sync
        + 'static,
{
    use opentelemetry::trace::TracerProvider as _;
    use std::sync::{Arc, Mutex};
    use tracing_subscriber::layer::SubscriberExt;
    let buf: Arc<Mutex<Vec<u8>>> = Arc::default();
    let writer = {
        let buf = buf.clone();
        move || Capture(buf.clone())
    };
    let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder().build();
    let subscriber = tracing_subscriber::registry()
        .with(
            tracing_subscriber::fmt::layer()
                .with_writer(writer)
                .with_ansi(false)
                .event_format(format),
        )
        .with(tracing_opentelemetry::layer().with_tracer(provider.tracer("test")));
    tracing::subscriber::with_default(subscriber, || {
        tracing::info!("outside");
        let span = super::spans::reconcile("east", "db", "pg0", 3);
        let _in = span.enter();
        tracing::info!(answer = 42, "inside");
    });
    let out = buf.lock().expect("the buffer").clone();
    String::from_utf8(out).expect("utf-8 logs")
}

struct Capture(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);

impl std::io::Write for Capture {
    fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
        self.0.lock().expect("the buffer").extend_from_slice(b);
        Ok(b.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn is_trace_id(s: &str) -> bool {
    s.len() == 32 && s.chars().all(|c| c.is_ascii_hexdigit()) && s != "0".repeat(32)
}

#[test]
fn text_lines_inside_a_span_end_with_the_trace_id() {
    let out = logged(super::format::Text::new());
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(!lines[0].contains("trace_id="), "{}", lines[0]);
    let inside = lines[1];
    assert!(
        inside.contains("inside") && inside.contains("answer=42"),
        "{inside}"
    );
    assert!(
        inside.contains("cluster=\"east\"") || inside.contains("cluster=east"),
        "{inside}"
    );
    let id = inside
        .rsplit("trace_id=")
        .next()
        .expect("a trace id at the end");
    assert!(is_trace_id(id), "{inside}");
}

#[test]
fn json_lines_carry_trace_and_span_ids() {
    let out = logged(super::format::Json);
    let lines: Vec<serde_json::Value> = out
        .lines()
        .map(|l| serde_json::from_str(l).expect("one JSON object per line"))
        .collect();
    assert_eq!(lines.len(), 2, "{out}");
    assert!(lines[0].get("trace_id").is_none());
    let inside = &lines[1];
    assert_eq!(inside["fields"]["message"], "inside");
    assert_eq!(inside["fields"]["answer"], 42);
    assert_eq!(inside["level"], "INFO");
    assert_eq!(inside["spans"][0]["name"], "reconcile");
    assert!(
        is_trace_id(inside["trace_id"].as_str().unwrap_or_default()),
        "{inside}"
    );
    assert_eq!(inside["span_id"].as_str().map(str::len), Some(16));
}

#[test]
fn grpc_is_rejected_with_the_reason() {
    let toml = "[telemetry]\nprotocol = \"grpc\"\n[[clusters]]\nname = \"a\"\nembedded = true\n";
    let errs = match crate::config::load_str(toml, "test") {
        Ok(_) => panic!("grpc is refused"),
        Err(e) => e.to_string(),
    };
    assert!(errs.contains("telemetry.protocol"), "{errs}");
    assert!(errs.contains("http/protobuf"), "{errs}");
    let ok =
        "[telemetry]\nprotocol = \"http/protobuf\"\n[[clusters]]\nname = \"a\"\nembedded = true\n";
    assert!(crate::config::load_str(ok, "test").is_ok());
}
