//! The operations (`switchover`, `backup now`, `rollout …`) sent through
//! a manager's HTTP API, used when `--server`/`PGFLEET_SERVER` is given.
//! Without it the commands talk to the member cluster directly
//! (`ops.rs`, `rollout.rs`); both paths write the same durable request
//! (`ops::actions`).

use super::ops::parse_target;
use super::remote::{ApiArgs, Client, Output, print_json};
use super::rollout::RolloutCommand;
use crate::ops::view::PgcView;
use serde_json::{Value, json};
use std::time::{Duration, Instant};

fn pgc_path(target: &str) -> anyhow::Result<String> {
    let (m, ns, n) = parse_target(target)?;
    let enc = |s: &str| form_urlencoded::byte_serialize(s.as_bytes()).collect::<String>();
    Ok(format!(
        "/api/v1/postgresclusters/{}/{}/{}",
        enc(&m),
        enc(&ns),
        enc(&n)
    ))
}

async fn pgc(client: &Client, path: &str) -> anyhow::Result<PgcView> {
    Ok(serde_json::from_value(client.get(path).await?)?)
}

pub async fn switchover(
    args: &ApiArgs,
    target: &str,
    to: Option<&str>,
    wait: Duration,
) -> anyhow::Result<i32> {
    let client = Client::new(args, None)?;
    let path = pgc_path(target)?;
    let body = to.map_or_else(|| json!({}), |t| json!({"to": t}));
    let answer = client.post(&format!("{path}/switchover"), body).await?;
    // Completion is "the primary is no longer `from`": without it, waiting
    // would report any primary as the outcome.
    let from = answer["from"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("the manager's answer names no current primary"))?
        .to_string();
    if args.output == Output::Json && wait.is_zero() {
        print_json(&answer)?;
        return Ok(0);
    }
    println!(
        "switchover of {target} requested through {} (primary now {from}, to {})",
        client.url(),
        to.unwrap_or("the most advanced replica")
    );
    if wait.is_zero() {
        return Ok(0);
    }
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let p = pgc(&client, &path).await?;
        if p.switchover_in_progress {
            continue;
        }
        let now = p.primary.clone().unwrap_or_default();
        if now != from {
            println!("done: {now} is primary");
            if args.output == Output::Json {
                print_json(&serde_json::to_value(&p)?)?;
            }
            return Ok(0);
        }
    }
    println!("not finished within {wait:?}; it continues in the manager");
    Ok(1)
}

pub async fn backup_now(args: &ApiArgs, target: &str, wait: Duration) -> anyhow::Result<i32> {
    let client = Client::new(args, None)?;
    let path = pgc_path(target)?;
    let answer = client.post(&format!("{path}/backup"), json!({})).await?;
    let backup = answer["backup"]
        .as_str()
        .ok_or_else(|| anyhow::anyhow!("the manager's answer names no backup"))?
        .to_string();
    match args.output {
        Output::Json => print_json(&answer)?,
        Output::Table => println!(
            "backup {backup} of {target} requested through {}",
            client.url()
        ),
    }
    if wait.is_zero() {
        return Ok(0);
    }
    let deadline = Instant::now() + wait;
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(500)).await;
        let p = pgc(&client, &path).await?;
        if let Some(b) = p.last_backup
            && b.name.as_deref() == Some(&backup)
        {
            println!("completed: {backup} at {}", b.at.unwrap_or_default());
            return Ok(0);
        }
    }
    println!("not finished within {wait:?}; see `kubectl get pgb` in the member cluster");
    Ok(1)
}

pub async fn rollout(args: &ApiArgs, cmd: &RolloutCommand) -> anyhow::Result<i32> {
    let client = Client::new(args, None)?;
    let (name, word, stage) = match cmd {
        RolloutCommand::Plan { .. } => {
            anyhow::bail!("rollout plan runs locally against the member clusters: drop --server")
        }
        RolloutCommand::Status { name } => (name, None, None),
        RolloutCommand::Pause { name } => (name, Some("pause"), None),
        RolloutCommand::Resume { name } => (name, Some("resume"), None),
        RolloutCommand::Abort { name } => (name, Some("abort"), None),
        RolloutCommand::Rollback { name } => (name, Some("rollback"), None),
        RolloutCommand::Approve { name, stage } => (name, Some("approve"), Some(stage)),
    };
    let enc: String = form_urlencoded::byte_serialize(name.as_bytes()).collect();
    let answer: Value = match word {
        None => client.get(&format!("/api/v1/rollouts/{enc}")).await?,
        Some(w) => {
            client
                .post(
                    &format!("/api/v1/rollouts/{enc}/{w}"),
                    json!({"stage": stage}),
                )
                .await?
        }
    };
    if args.output == Output::Json {
        print_json(&answer)?;
        return Ok(0);
    }
    match word {
        None => {
            println!(
                "rollout {name} → {}: {}",
                answer["targetVersion"].as_str().unwrap_or_default(),
                answer["summary"].as_str().unwrap_or_default()
            );
            for s in answer["stages"].as_array().into_iter().flatten() {
                println!(
                    "  stage {} {} {}/{} ({} in flight, {} failed)",
                    s["name"].as_str().unwrap_or_default(),
                    s["state"].as_str().unwrap_or_default(),
                    s["done"],
                    s["total"],
                    s["inFlight"],
                    s["failed"]
                );
            }
            println!(
                "control: {}{}",
                answer["control"]["state"].as_str().unwrap_or_default(),
                answer["control"]["reason"]
                    .as_str()
                    .map(|r| format!(" ({r})"))
                    .unwrap_or_default()
            );
        }
        Some(_) => println!(
            "rollout {name}: {}{} (stored in {} member cluster(s))",
            answer["control"]["state"].as_str().unwrap_or_default(),
            stage
                .map(|s| format!(", stage {s} approved"))
                .unwrap_or_default(),
            answer["storedIn"]
        ),
    }
    Ok(0)
}
