//! The spans a test process opens, as a tree: a `tracing` layer that
//! records each span's name, parent and recorded fields. The OTLP test
//! (`otlp.rs`) proves the export of such trees; this lets an in-process
//! test check which spans an operation produced and how they nest.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, OnceLock};
use tracing::span::{Attributes, Id};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::util::SubscriberInitExt;

/// One span; `id` and `parent` are positions in [`recorded`] (the
/// subscriber reuses its own ids once a span closed).
#[derive(Debug, Clone)]
pub struct Recorded {
    pub id: usize,
    pub name: &'static str,
    pub parent: Option<usize>,
    pub fields: BTreeMap<String, String>,
}

#[derive(Default)]
struct Log {
    spans: Vec<Recorded>,
    /// Subscriber id of each open span → its position.
    open: std::collections::HashMap<u64, usize>,
}

struct Capture(Arc<Mutex<Log>>);

struct Fields<'a>(&'a mut BTreeMap<String, String>);

impl tracing::field::Visit for Fields<'_> {
    fn record_debug(&mut self, f: &tracing::field::Field, v: &dyn std::fmt::Debug) {
        self.0.insert(f.name().to_string(), format!("{v:?}"));
    }
    fn record_str(&mut self, f: &tracing::field::Field, v: &str) {
        self.0.insert(f.name().to_string(), v.to_string());
    }
}

impl<S> tracing_subscriber::Layer<S> for Capture
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let parent = if attrs.is_root() {
            None
        } else if let Some(p) = attrs.parent() {
            Some(p.into_u64())
        } else {
            ctx.current_span().id().map(Id::into_u64)
        };
        let mut fields = BTreeMap::new();
        attrs.record(&mut Fields(&mut fields));
        let mut log = self.0.lock().unwrap();
        let parent = parent.and_then(|p| log.open.get(&p).copied());
        let at = log.spans.len();
        log.open.insert(id.into_u64(), at);
        log.spans.push(Recorded {
            id: at,
            name: attrs.metadata().name(),
            parent,
            fields,
        });
    }

    fn on_close(&self, id: Id, _: Context<'_, S>) {
        self.0.lock().unwrap().open.remove(&id.into_u64());
    }
}

static SPANS: OnceLock<Arc<Mutex<Log>>> = OnceLock::new();

/// Installs the capture as this process's subscriber (once). nextest runs
/// every test in a process of its own, so no other subscriber competes.
pub fn capture() {
    SPANS.get_or_init(|| {
        let spans = Arc::new(Mutex::new(Log::default()));
        tracing_subscriber::registry()
            .with(Capture(spans.clone()))
            .try_init()
            .expect("a tracing subscriber is installed already: run this test alone (nextest)");
        spans
    });
}

/// Every span opened since [`capture`].
pub fn recorded() -> Vec<Recorded> {
    SPANS
        .get()
        .expect("spans::capture() first")
        .lock()
        .unwrap()
        .spans
        .clone()
}
