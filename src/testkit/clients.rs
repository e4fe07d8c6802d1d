//! `kube::Client`s built from kubeconfig files, the path a user takes (so
//! the environment proves the written kubeconfigs work).

use super::{Error, Result};
use std::path::Path;

/// A client from the kubeconfig at `path`, with kube's default retries.
pub async fn client_from(path: &Path) -> Result<kube::Client> {
    build(path, true).await
}

/// Like [`client_from`], without kube's default retrying of 429/503/504
/// answers (which would otherwise hide an injected 429 for minutes).
pub async fn client_without_retries(path: &Path) -> Result<kube::Client> {
    build(path, false).await
}

async fn build(path: &Path, retry: bool) -> Result<kube::Client> {
    let kubeconfig = |source| Error::Kubeconfig {
        path: path.to_path_buf(),
        source,
    };
    let kc = kube::config::Kubeconfig::read_from(path).map_err(kubeconfig)?;
    let mut config = kube::Config::from_custom_kubeconfig(kc, &Default::default())
        .await
        .map_err(kubeconfig)?;
    config.default_retry = retry;
    kube::Client::try_from(config).map_err(|source| Error::Client {
        path: path.to_path_buf(),
        source,
    })
}
