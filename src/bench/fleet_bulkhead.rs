//! The fleet benchmark's bulkhead figure: a tenth of the member clusters is
//! cut off from the manager (the emulator's network fault: their API
//! servers stop answering the manager's address, open connections are cut,
//! as a lost link does), and the same change rate is offered to the rest.
//! Their change→status p99 next to the p99 the same rate had with every
//! member reachable says whether the unreachable members slow the others.
//! The benchmark's own clients use the clusters' observer addresses, which
//! the fault leaves alone.

use super::load::{Driver, Step};
use anyhow::{Context, Result};
use std::path::Path;
use std::time::{Duration, Instant};

/// The admin endpoint of the child emulator and the clusters' tokens.
pub struct Admin {
    url: String,
    http: reqwest::Client,
}

/// Every tenth cluster (sim-10, sim-20, …; at least one): indices into the
/// benchmark's cluster list.
pub fn tenth(clusters: usize) -> Vec<usize> {
    let mut out: Vec<usize> = (1..=clusters)
        .filter(|i| i % 10 == 0)
        .map(|i| i - 1)
        .collect();
    if out.is_empty() && clusters > 1 {
        out.push(clusters - 1);
    }
    out
}

impl Admin {
    pub fn new(url: &str) -> Result<Admin> {
        let http = crate::http_client::build(&Default::default())?;
        Ok(Admin {
            url: url.trim_end_matches('/').to_string(),
            http,
        })
    }

    /// Cuts (`true`) or heals the manager's link to cluster `name`, whose
    /// kubeconfig holds the token the admin endpoint wants.
    pub async fn manager_link(&self, name: &str, kubeconfig: &Path, cut: bool) -> Result<()> {
        let token = token_of(kubeconfig)?;
        let url = format!("{}/clusters/{name}/network", self.url);
        let req = if cut {
            self.http
                .put(url)
                .header("content-type", "application/json")
                .body(r#"{"manager": true, "members": []}"#)
        } else {
            self.http.delete(url)
        };
        let resp = req
            .bearer_auth(token)
            .send()
            .await
            .with_context(|| format!("network fault on {name}"))?;
        anyhow::ensure!(
            resp.status().is_success(),
            "network fault on {name}: the emulator answered {}",
            resp.status()
        );
        Ok(())
    }
}

/// The bearer token of a kubeconfig the emulator wrote (never printed).
fn token_of(kubeconfig: &Path) -> Result<String> {
    let text = std::fs::read_to_string(kubeconfig)
        .with_context(|| format!("reading {}", kubeconfig.display()))?;
    let v: serde_yaml::Value =
        serde_yaml::from_str(&text).with_context(|| format!("parsing {}", kubeconfig.display()))?;
    v["users"][0]["user"]["token"]
        .as_str()
        .map(String::from)
        .with_context(|| format!("{} has no token", kubeconfig.display()))
}

/// What the bulkhead step measured.
pub struct Figure {
    pub cut: usize,
    /// How long until the manager marked every cut member Unreachable.
    pub noticed: Option<Duration>,
    pub step: Step,
}

/// Waits (at most a minute) until `progress` — the manager's reconcile
/// count — stands still for a second: the step before may have left a
/// backlog, and the figure compares against a step that started quiet.
async fn settle(progress: impl Fn() -> u64) {
    let t = Instant::now();
    let mut last = progress();
    while t.elapsed() < Duration::from_secs(60) {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = progress();
        if now == last {
            return;
        }
        last = now;
    }
}

/// Waits for the manager to settle, cuts `cut` off, waits (bounded) until
/// `unreachable` counts them all, offers `rate` to the other members,
/// heals, and returns the figure.
pub async fn measure(
    admin: &Admin,
    kubeconfigs: &[(String, std::path::PathBuf)],
    cut: &[usize],
    driver: &mut Driver,
    (rate, secs): (u32, u64),
    unreachable: impl Fn() -> usize,
    progress: impl Fn() -> u64,
) -> Result<Figure> {
    settle(progress).await;
    for &i in cut {
        let (name, path) = &kubeconfigs[i];
        admin.manager_link(name, path, true).await?;
    }
    let t = Instant::now();
    let mut noticed = None;
    while t.elapsed() < Duration::from_secs(120) {
        if unreachable() >= cut.len() {
            noticed = Some(t.elapsed());
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    driver.skip(cut);
    let step = driver.step(rate, secs).await;
    driver.skip(&[]);
    for &i in cut {
        let (name, path) = &kubeconfigs[i];
        admin.manager_link(name, path, false).await?;
    }
    Ok(Figure {
        cut: cut.len(),
        noticed,
        step,
    })
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_tenth_is_every_tenth_and_never_none_of_several() {
        assert_eq!(super::tenth(1000).len(), 100);
        assert_eq!(super::tenth(1000)[0], 9);
        assert_eq!(super::tenth(3), vec![2]);
        assert!(super::tenth(1).is_empty());
    }
}
