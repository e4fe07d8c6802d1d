//! `pgfleet status` and `pgfleet get clusters|pgc`: tables rendered from the
//! manager's API answers. Rendering is pure (answer → text) and unit-tested.

use super::remote::{ApiArgs, Client, Output, print_json};
use crate::ops::view::{ClusterView, PgcView};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::Path;

/// What `pgfleet get` lists.
#[derive(clap::Subcommand, Debug)]
pub enum GetWhat {
    /// Member clusters: connectivity, owner, labels, PostgresClusters.
    #[command(alias = "cluster")]
    Clusters,
    /// PostgresClusters (all member clusters and namespaces unless filtered).
    #[command(alias = "pgc", alias = "postgresclusters", alias = "postgrescluster")]
    Pgcs {
        /// Only this namespace.
        #[arg(long, short = 'n', conflicts_with = "all_namespaces")]
        namespace: Option<String>,
        /// Every namespace (the default; accepted for kubectl habits).
        #[arg(long, short = 'A')]
        all_namespaces: bool,
        /// Only this member cluster.
        #[arg(long)]
        cluster: Option<String>,
        /// Only this phase (Healthy, Degraded, …).
        #[arg(long)]
        phase: Option<String>,
        /// Only the ones that are not Healthy or report a problem.
        #[arg(long)]
        unhealthy: bool,
    },
}

/// Left-aligned columns separated by two spaces.
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            if let Some(w) = widths.get_mut(i) {
                *w = (*w).max(c.chars().count());
            }
        }
    }
    let line = |cells: Vec<String>| {
        let n = cells.len();
        cells
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                if i + 1 == n {
                    c
                } else {
                    format!("{c:<w$}", w = widths[i])
                }
            })
            .collect::<Vec<_>>()
            .join("  ")
            .trim_end()
            .to_string()
    };
    let mut out = line(header.iter().map(|h| h.to_string()).collect());
    out.push('\n');
    for r in rows {
        out.push_str(&line(r.clone()));
        out.push('\n');
    }
    out
}

fn dash(s: Option<&str>) -> String {
    s.filter(|s| !s.is_empty()).unwrap_or("-").to_string()
}

fn phases(p: &BTreeMap<String, usize>) -> String {
    if p.is_empty() {
        return "-".into();
    }
    p.iter()
        .map(|(k, v)| format!("{k} {v}"))
        .collect::<Vec<_>>()
        .join(", ")
}

fn clusters_table(clusters: &[ClusterView]) -> String {
    let rows: Vec<Vec<String>> = clusters
        .iter()
        .map(|c| {
            vec![
                c.name.clone(),
                c.connectivity.clone(),
                dash(c.owner.as_deref()),
                c.postgresclusters.to_string(),
                phases(&c.phases),
                c.labels
                    .iter()
                    .map(|(k, v)| format!("{k}={v}"))
                    .collect::<Vec<_>>()
                    .join(","),
            ]
        })
        .collect();
    table(
        &[
            "CLUSTER",
            "CONNECTIVITY",
            "OWNER",
            "PGCS",
            "PHASES",
            "LABELS",
        ],
        &rows,
    )
}

/// Members where the manager lacks permissions, each missing one by name
/// (empty when every member grants everything).
fn permission_problems(clusters: &[ClusterView]) -> String {
    let mut out = String::new();
    for c in clusters {
        if !c.missing_permissions.is_empty() {
            out.push_str(&format!(
                "\n{}: the manager lacks {} permission(s) (see deploy/member/rbac.yaml):\n",
                c.name,
                c.missing_permissions.len()
            ));
            for p in &c.missing_permissions {
                out.push_str(&format!("  - {p}\n"));
            }
        }
        if let Some(e) = &c.permission_check_error {
            out.push_str(&format!("\n{}: {e}\n", c.name));
        }
    }
    out
}

fn problem(p: &PgcView) -> String {
    p.conditions
        .first()
        .map(|c| {
            let what = if c.message.is_empty() {
                &c.reason
            } else {
                &c.message
            };
            format!("{} {}: {what}", c.type_, c.status)
        })
        .unwrap_or_else(|| "-".into())
}

fn pgcs_table(pgcs: &[PgcView]) -> String {
    let rows: Vec<Vec<String>> = pgcs
        .iter()
        .map(|p| {
            vec![
                p.member.clone(),
                p.namespace.clone(),
                p.name.clone(),
                p.phase.clone(),
                dash(p.primary.as_deref()),
                format!("{}/{}", p.instances.ready, p.instances.total),
                dash(p.current_version.as_deref().or(Some(&p.version))),
                dash(p.last_backup.as_ref().and_then(|b| b.at.as_deref())),
                dash(
                    p.last_failover
                        .as_ref()
                        .and_then(|f| f.promoted_at.as_deref()),
                ),
            ]
        })
        .collect();
    table(
        &[
            "CLUSTER",
            "NAMESPACE",
            "NAME",
            "PHASE",
            "PRIMARY",
            "READY",
            "VERSION",
            "LAST BACKUP",
            "LAST FAILOVER",
        ],
        &rows,
    )
}

/// The `pgfleet status` text of a `/api/v1/fleet` answer.
pub fn render_status(fleet: &Value) -> anyhow::Result<String> {
    let clusters: Vec<ClusterView> = serde_json::from_value(fleet["clusters"].clone())?;
    let pgcs: Vec<PgcView> = serde_json::from_value(fleet["postgresclusters"].clone())?;
    let all: BTreeMap<String, usize> =
        serde_json::from_value(fleet["phases"].clone()).unwrap_or_default();
    let total: usize = all.values().sum();
    let ready = clusters
        .iter()
        .filter(|c| c.connectivity == "Ready")
        .count();
    let mut out = format!(
        "fleet: {ready}/{} member clusters ready, {total} PostgresClusters ({})\n\n",
        clusters.len(),
        phases(&all)
    );
    out.push_str(&clusters_table(&clusters));
    out.push_str(&permission_problems(&clusters));
    let bad: Vec<&PgcView> = pgcs
        .iter()
        .filter(|p| !p.healthy || !p.conditions.is_empty())
        .collect();
    if bad.is_empty() {
        out.push_str("\nevery PostgresCluster is healthy\n");
    } else {
        out.push_str(&format!("\nneeding attention ({}):\n", bad.len()));
        let rows: Vec<Vec<String>> = bad
            .iter()
            .map(|p| {
                vec![
                    format!("{}/{}/{}", p.member, p.namespace, p.name),
                    p.phase.clone(),
                    dash(p.primary.as_deref()),
                    format!("{}/{}", p.instances.ready, p.instances.total),
                    problem(p),
                ]
            })
            .collect();
        out.push_str(&table(
            &["POSTGRESCLUSTER", "PHASE", "PRIMARY", "READY", "PROBLEM"],
            &rows,
        ));
    }
    Ok(out)
}

/// `pgfleet status`
pub async fn status(args: &ApiArgs, config: Option<&Path>) -> anyhow::Result<i32> {
    let client = Client::new(args, config)?;
    // Only the unhealthy ones travel: the table shows counts for the rest.
    let fleet = client.get("/api/v1/fleet?unhealthy=true").await?;
    match args.output {
        Output::Json => print_json(&fleet)?,
        Output::Table => print!("{}", render_status(&fleet)?),
    }
    Ok(0)
}

/// `pgfleet get clusters|pgc`
pub async fn get(what: &GetWhat, args: &ApiArgs, config: Option<&Path>) -> anyhow::Result<i32> {
    let client = Client::new(args, config)?;
    match what {
        GetWhat::Clusters => {
            let v = client.get("/api/v1/clusters").await?;
            match args.output {
                Output::Json => print_json(&v)?,
                Output::Table => {
                    let c: Vec<ClusterView> = serde_json::from_value(v["clusters"].clone())?;
                    print!("{}", clusters_table(&c));
                }
            }
        }
        GetWhat::Pgcs {
            namespace,
            cluster,
            phase,
            unhealthy,
            ..
        } => {
            let mut q = form_urlencoded::Serializer::new(String::new());
            for (k, v) in [
                ("namespace", namespace),
                ("cluster", cluster),
                ("phase", phase),
            ] {
                if let Some(v) = v {
                    q.append_pair(k, v);
                }
            }
            if *unhealthy {
                q.append_pair("unhealthy", "true");
            }
            let v = client
                .get(&format!("/api/v1/postgresclusters?{}", q.finish()))
                .await?;
            match args.output {
                Output::Json => print_json(&v)?,
                Output::Table => {
                    let p: Vec<PgcView> = serde_json::from_value(v["postgresclusters"].clone())?;
                    print!("{}", pgcs_table(&p));
                }
            }
        }
    }
    Ok(0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn table_aligns_columns() {
        let t = table(&["A", "BB"], &[vec!["xxx".into(), "y".into()]]);
        assert_eq!(t, "A    BB\nxxx  y\n");
    }

    #[test]
    fn status_lists_members_and_problems() {
        let fleet = json!({
            "clusters": [
                {"name": "sim-eu-1", "labels": {"env": "prod"}, "connectivity": "Ready",
                 "reason": null, "owner": "host-a", "phases": {"Healthy": 2}, "postgresclusters": 2,
                 "missingPermissions": ["create pods", "patch postgresclusters.pgfleet.io/status"]},
                {"name": "sim-us-1", "labels": {}, "connectivity": "Unreachable",
                 "reason": "timeout", "owner": null, "phases": {"Degraded": 1}, "postgresclusters": 1}
            ],
            "phases": {"Healthy": 2, "Degraded": 1},
            "postgresclusters": [
                {"member": "sim-us-1", "namespace": "shop", "name": "orders", "phase": "Degraded",
                 "healthy": false, "primary": "orders-1", "version": "15.20", "currentVersion": null,
                 "instances": {"ready": 1, "total": 3}, "lastBackup": null, "lastFailover": null,
                 "lastSwitchover": null, "switchoverInProgress": false, "rollingUpdate": null,
                 "conditions": [{"type": "Ready", "status": "False", "reason": "NotAllInstancesReady", "message": "1/3 instances ready"}]}
            ]
        });
        let out = render_status(&fleet).unwrap();
        assert!(
            out.contains("sim-eu-1: the manager lacks 2 permission(s)")
                && out.contains("  - create pods\n")
                && out.contains("  - patch postgresclusters.pgfleet.io/status\n"),
            "{out}"
        );
        assert!(
            out.contains("1/2 member clusters ready, 3 PostgresClusters"),
            "{out}"
        );
        assert!(out.contains("sim-eu-1") && out.contains("host-a") && out.contains("Healthy 2"));
        assert!(out.contains("sim-us-1/shop/orders") && out.contains("1/3 instances ready"));
    }
}
