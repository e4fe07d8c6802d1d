//! A backup is recorded `Completed` only after it has been read back from
//! the repository by an instance other than the one that took it (issue 19,
//! finding 12): `pgfleet-instance backup-info` (pgBackRest `info`) there
//! must list its label. That catches a repository that is not really
//! shared storage (a path inside the taking container, gone with it) and an
//! instance that cannot read the cluster's repository (wrong passphrase).
//! A one-instance cluster has no other instance: it verifies on itself,
//! which still proves the backup is in the repository its pods mount.

use super::run::Job;
use crate::postgres::exec::run_verb;
use k8s_openapi::api::core::v1::Pod;
use kube::api::ListParams;
use kube::{Api, ResourceExt};
use serde_json::Value;
use std::time::Duration;

const TIMEOUT: Duration = Duration::from_secs(300);

/// Which instances to ask, in order (pure): the others (the primary first),
/// else the one that took the backup.
pub fn verifiers(took: &str, primary: &str, ready: &[String]) -> Vec<String> {
    let mut out: Vec<String> = ready
        .iter()
        .filter(|p| p.as_str() != took)
        .cloned()
        .collect();
    out.sort_by_key(|p| p.as_str() != primary);
    if out.is_empty() {
        out.push(took.to_string());
    }
    out
}

/// Whether `backup-info` output lists `label`.
pub fn lists(out: &str, label: &str) -> bool {
    serde_json::from_str::<Value>(out.trim())
        .ok()
        .and_then(|v| v["backups"].as_array().cloned())
        .is_some_and(|bs| bs.iter().any(|b| b["label"].as_str() == Some(label)))
}

/// The instance that saw the backup, or why none did.
pub async fn verify(job: &Job, took: &str, label: &str) -> Result<String, String> {
    let client = job.member.client();
    let selector = format!(
        "{}={},{}=instance",
        crate::platform::labels::LABEL_CLUSTER,
        job.cluster,
        crate::platform::labels::LABEL_KIND
    );
    let ready: Vec<String> = Api::<Pod>::namespaced(client.clone(), &job.namespace)
        .list(&ListParams::default().labels(&selector))
        .await
        .map_err(|e| format!("verifying {label}: listing the instances: {e}"))?
        .items
        .iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none() && ready(p))
        .map(|p| p.name_any())
        .collect();
    let mut why = vec![];
    for pod in verifiers(took, &job.primary, &ready) {
        match run_verb(&client, &job.namespace, &pod, &["backup-info"], TIMEOUT).await {
            Ok(out) if lists(&out, label) => return Ok(pod),
            Ok(_) => why.push(format!("{pod} does not see it in the repository")),
            Err(e) => why.push(format!("{pod}: {e}")),
        }
    }
    Err(format!(
        "backup {label} could not be verified from another instance: {}",
        why.join("; ")
    ))
}

fn ready(p: &Pod) -> bool {
    p.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn another_instance_verifies_when_there_is_one() {
        let r = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            verifiers("a-1", "a-0", &r(&["a-1", "a-2", "a-0"])),
            r(&["a-0", "a-2"])
        );
        assert_eq!(verifiers("a-0", "a-0", &r(&["a-0"])), r(&["a-0"]));
        assert!(lists(r#"{"backups":[{"label":"L1"}]}"#, "L1"));
        assert!(!lists(r#"{"backups":[]}"#, "L1"));
        assert!(!lists("garbage", "L1"));
    }
}
