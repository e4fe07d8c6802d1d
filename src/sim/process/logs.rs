//! A container's captured stdout/stderr: the recent bytes in memory (for
//! `pods/log`, with `tailLines` and `follow`) and everything appended to a
//! file in the pod directory (for people debugging a run).

use bytes::Bytes;
use std::collections::VecDeque;
use std::io::Write;
use std::path::PathBuf;
use std::sync::Mutex;
use tokio::sync::{broadcast, mpsc};

/// Bytes kept in memory per container.
const KEEP: usize = 2 * 1024 * 1024;

pub struct LogBuf {
    inner: Mutex<Inner>,
}

struct Inner {
    buf: VecDeque<u8>,
    /// `Some` carries output, `None` marks the end of a container instance
    /// (where a follow stream ends).
    tx: broadcast::Sender<Option<Bytes>>,
    file: Option<std::fs::File>,
    path: PathBuf,
}

impl LogBuf {
    pub fn new(path: PathBuf) -> Self {
        LogBuf {
            inner: Mutex::new(Inner {
                buf: VecDeque::new(),
                tx: broadcast::channel(1024).0,
                file: None,
                path,
            }),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub fn append(&self, b: &[u8]) {
        let mut g = self.lock();
        g.buf.extend(b);
        let excess = g.buf.len().saturating_sub(KEEP);
        g.buf.drain(..excess);
        let _ = g.tx.send(Some(Bytes::copy_from_slice(b)));
        if g.file.is_none() {
            g.file = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&g.path)
                .ok();
        }
        if let Some(f) = g.file.as_mut() {
            let _ = f.write_all(b);
        }
    }

    /// Ends the follow streams of the instance that just stopped.
    pub fn end_instance(&self) {
        let _ = self.lock().tx.send(None);
    }

    /// The kept bytes (the last `tail` lines of them) and, with `follow`, what
    /// comes after until the running instance ends.
    pub fn reader(
        &self,
        tail: Option<usize>,
        follow: bool,
        running: bool,
    ) -> mpsc::Receiver<Bytes> {
        let (tx, rx) = mpsc::channel(64);
        let (snapshot, mut sub) = {
            let g = self.lock();
            let (a, b) = g.buf.as_slices();
            let mut all = Vec::with_capacity(a.len() + b.len());
            all.extend_from_slice(a);
            all.extend_from_slice(b);
            (all, g.tx.subscribe())
        };
        let start = match tail {
            Some(n) => tail_start(&snapshot, n),
            None => 0,
        };
        let first = Bytes::from(snapshot).slice(start..);
        tokio::spawn(async move {
            if !first.is_empty() && tx.send(first).await.is_err() {
                return;
            }
            if !(follow && running) {
                return;
            }
            loop {
                match sub.recv().await {
                    Ok(Some(b)) => {
                        if tx.send(b).await.is_err() {
                            return;
                        }
                    }
                    Ok(None) | Err(broadcast::error::RecvError::Closed) => return,
                    Err(broadcast::error::RecvError::Lagged(_)) => {}
                }
            }
        });
        rx
    }
}

/// Where the last `n` lines of `b` start.
fn tail_start(b: &[u8], n: usize) -> usize {
    if n == 0 {
        return b.len();
    }
    let body = b.strip_suffix(b"\n").unwrap_or(b);
    let mut seen = 0;
    for (i, c) in body.iter().enumerate().rev() {
        if *c == b'\n' {
            seen += 1;
            if seen == n {
                return i + 1;
            }
        }
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tail_counts_lines_from_the_end() {
        let b = b"a\nb\nc\n";
        assert_eq!(&b[tail_start(b, 2)..], b"b\nc\n");
        assert_eq!(&b[tail_start(b, 9)..], b"a\nb\nc\n");
        assert_eq!(tail_start(b, 0), b.len());
        assert_eq!(&b"x\ny"[tail_start(b"x\ny", 1)..], b"y");
    }
}
