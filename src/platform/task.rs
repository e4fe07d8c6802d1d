//! The background-task guard shared by the manager, the API server, the
//! rollout engines and the backup dispatcher.

/// A background task that ends when its owner is dropped.
pub struct AbortOnDrop(pub tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}
