//! The one way environments wait: poll a check until it succeeds or the
//! patience runs out, then fail naming what was awaited and the last state
//! observed. Never a timed assertion: patience is generous on purpose
//! (shared 2-core machines), and only bounds how long a broken run hangs.

use super::{Error, Result};
use std::fmt::Display;
use std::future::Future;
use std::time::{Duration, Instant};

/// How often a check is repeated.
const POLL: Duration = Duration::from_millis(100);

/// What a check yields: a value when the condition holds, otherwise a
/// description of the state observed (shown when the wait gives up).
pub trait Outcome {
    type Value;
    fn into_result(self) -> std::result::Result<Self::Value, String>;
}

impl<T> Outcome for Option<T> {
    type Value = T;
    fn into_result(self) -> std::result::Result<T, String> {
        self.ok_or_else(|| "no value yet".to_string())
    }
}

impl<T, E: Display> Outcome for std::result::Result<T, E> {
    type Value = T;
    fn into_result(self) -> std::result::Result<T, String> {
        self.map_err(|e| e.to_string())
    }
}

impl Outcome for bool {
    type Value = ();
    fn into_result(self) -> std::result::Result<(), String> {
        if self {
            Ok(())
        } else {
            Err("the condition is false".to_string())
        }
    }
}

/// Polls `check` until its outcome holds, for up to `patience`.
pub async fn until<O, F, Fut>(patience: Duration, what: &str, mut check: F) -> Result<O::Value>
where
    O: Outcome,
    F: FnMut() -> Fut,
    Fut: Future<Output = O>,
{
    let deadline = Instant::now() + patience;
    loop {
        match check().await.into_result() {
            Ok(v) => return Ok(v),
            Err(last) if Instant::now() >= deadline => {
                return Err(Error::Timeout {
                    what: what.to_string(),
                    patience,
                    last,
                });
            }
            Err(_) => tokio::time::sleep(POLL).await,
        }
    }
}
