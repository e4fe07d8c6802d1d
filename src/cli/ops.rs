//! Operator commands that change intent (`pgfleet switchover`). They write
//! the request into the PostgresCluster (an annotation), where the manager
//! picks it up — durable, and visible to kubectl — and optionally wait for
//! the outcome.

use crate::config::ClusterSource;
use crate::crd::PostgresCluster;
use crate::platform::labels::SWITCHOVER_TO;
use anyhow::{Context, bail};
use kube::Api;
use std::path::Path;
use std::time::{Duration, Instant};

/// `member/namespace/name` → its parts.
pub fn parse_target(s: &str) -> anyhow::Result<(String, String, String)> {
    match s.split('/').collect::<Vec<_>>().as_slice() {
        [m, ns, n] if !m.is_empty() && !ns.is_empty() && !n.is_empty() => {
            Ok((m.to_string(), ns.to_string(), n.to_string()))
        }
        _ => bail!("expected <cluster>/<namespace>/<name>, got {s:?}"),
    }
}

/// A client for a member cluster named in the fleet config.
pub async fn member_client(config: Option<&Path>, member: &str) -> anyhow::Result<kube::Client> {
    let settings = crate::config::load(config)
        .map_err(|e| anyhow::anyhow!("the configuration is invalid:\n{e}"))?;
    let entry = settings
        .cluster(member)
        .with_context(|| format!("no member cluster named {member} in the fleet config"))?;
    let (path, context) = match entry.source() {
        ClusterSource::Kubeconfig { path, context } => {
            (path.to_path_buf(), context.map(String::from))
        }
        ClusterSource::Embedded => (
            settings
                .manager
                .state_dir
                .join("embedded")
                .join(format!("{member}.kubeconfig")),
            None,
        ),
    };
    let limit = crate::fleet::ratelimit::RateLimit::new(10.0, 20);
    crate::fleet::client_from_kubeconfig(
        &path,
        context.as_deref(),
        entry.insecure_skip_tls_verify,
        &limit,
    )
    .await
}

pub async fn switchover(
    config: Option<&Path>,
    target: &str,
    to: Option<&str>,
    wait: Duration,
) -> anyhow::Result<i32> {
    let (member, ns, name) = parse_target(target)?;
    let client = member_client(config, &member).await?;
    let req = crate::ops::actions::request_switchover(client.clone(), &ns, &name, to)
        .await
        .with_context(|| format!("switchover of {member}/{ns}/{name}"))?;
    let from = req.from;
    println!(
        "switchover of {member}/{ns}/{name} requested (primary now {from}, to {})",
        to.unwrap_or("the most advanced replica")
    );
    if wait.is_zero() {
        return Ok(0);
    }
    let api: Api<PostgresCluster> = Api::namespaced(client, &ns);
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(200)).await;
        let pg = api.get(&name).await?;
        let st = pg.status.unwrap_or_default();
        let pending = pg
            .metadata
            .annotations
            .as_ref()
            .is_some_and(|a| a.contains_key(SWITCHOVER_TO))
            || st.switchover.is_some();
        if !pending {
            let now = st.current_primary.unwrap_or_default();
            if now != from {
                let stall = st.last_switchover.and_then(|s| s.stall_ms).unwrap_or(0);
                println!("done: {now} is primary (writes paused {stall} ms)");
                return Ok(0);
            }
            println!(
                "the switchover was refused; see `kubectl describe pgc {name} -n {ns}` events"
            );
            return Ok(1);
        }
    }
    println!("not finished within {wait:?}; it continues in the manager");
    Ok(1)
}

/// `pgfleet backup now`: a PostgresBackup record the manager runs as soon as
/// the caps allow (optionally waiting for the outcome).
pub async fn backup_now(
    config: Option<&Path>,
    target: &str,
    wait: Duration,
) -> anyhow::Result<i32> {
    use crate::crd::PostgresBackup;
    let (member, ns, name) = parse_target(target)?;
    let client = member_client(config, &member).await?;
    let backup = crate::ops::actions::request_backup(client.clone(), &ns, &name)
        .await
        .with_context(|| format!("backup of {member}/{ns}/{name}"))?;
    let api: Api<PostgresBackup> = Api::namespaced(client, &ns);
    println!("backup {member}/{ns}/{backup} requested");
    if wait.is_zero() {
        return Ok(0);
    }
    let start = Instant::now();
    while start.elapsed() < wait {
        let st = api.get(&backup).await?.status.unwrap_or_default();
        match st.phase.as_deref() {
            Some("Completed") => {
                println!(
                    "completed: {} {}",
                    st.label.unwrap_or_default(),
                    st.size.unwrap_or_default()
                );
                return Ok(0);
            }
            Some("Failed") => {
                println!(
                    "failed (attempt {}): {}",
                    st.attempts,
                    st.failure_reason.unwrap_or_default()
                );
                return Ok(1);
            }
            _ => tokio::time::sleep(Duration::from_millis(500)).await,
        }
    }
    println!("still running after {wait:?}; see kubectl get pgb -n {ns} {backup}");
    Ok(1)
}

/// `pgfleet rotate-password`: see ops::rotate (the password is never printed).
pub async fn rotate_password(
    config: Option<&Path>,
    target: &str,
    role: &str,
) -> anyhow::Result<i32> {
    let (member, ns, name) = parse_target(target)?;
    let client = member_client(config, &member).await?;
    let r = crate::ops::rotate::rotate_password(client, &ns, &name, role)
        .await
        .with_context(|| format!("rotating the password of {role:?} in {member}/{ns}/{name}"))?;
    println!(
        "password of role {:?} rotated on {} and written to Secret {ns}/{}",
        r.role, r.primary, r.secret
    );
    Ok(0)
}
