//! Checks of the deploy test: the rendered kustomizations, their shape, and
//! the RBAC rules against the audit log.

use pgfleet::sim::audit::AuditRecord;
use pgfleet::sim::rbac::{self, Attributes};
use serde_json::{Value, json};
use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use super::kubectl::KUBECTL;

/// Granted (group, resource, verb) triples no scenario of this test reaches
/// yet, each with the code that needs it. The test fails when one of them
/// is used after all (then delete it here) or when an unused grant is not
/// listed (then remove the grant, or explain it here and in
/// docs/security.md).
pub const NOT_EXERCISED: &[(&str, &str, &str, &str)] = &[
    // Retention deletes the records of backups the instance's `expire` no
    // longer lists (backup/run.rs); the virtual runtime lists none.
    ("pgfleet.io", "postgresbackups", "delete", ""),
];

/// A minimal ServiceMonitor CRD (the Prometheus Operator's, schema elided).
pub const SERVICE_MONITOR_CRD: &str = r#"apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: servicemonitors.monitoring.coreos.com
spec:
  group: monitoring.coreos.com
  scope: Namespaced
  names: {kind: ServiceMonitor, listKind: ServiceMonitorList, plural: servicemonitors, singular: servicemonitor}
  versions:
  - name: v1
    served: true
    storage: true
    schema:
      openAPIV3Schema:
        type: object
        x-kubernetes-preserve-unknown-fields: true
"#;

/// The objects `kubectl kustomize <dir>` renders.
pub struct Rendered {
    pub objects: Vec<Value>,
}

impl Rendered {
    pub fn of(dir: &Path) -> Rendered {
        let out = Command::new(KUBECTL)
            .arg("kustomize")
            .arg(dir)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8(out.stdout).unwrap();
        let objects = serde_yaml::Deserializer::from_str(&text)
            .map(|d| {
                let v: serde_yaml::Value = serde::Deserialize::deserialize(d).unwrap();
                serde_json::to_value(v).unwrap()
            })
            .filter(|v: &Value| !v.is_null())
            .collect();
        Rendered { objects }
    }

    pub fn get(&self, kind: &str, name_prefix: &str) -> &Value {
        self.objects
            .iter()
            .find(|o| {
                o["kind"] == kind
                    && o["metadata"]["name"]
                        .as_str()
                        .unwrap_or_default()
                        .starts_with(name_prefix)
            })
            .unwrap_or_else(|| panic!("no {kind} {name_prefix}* rendered"))
    }

    /// Every rule of the ClusterRole and of the Role, with the Role's namespace.
    pub fn rules(&self) -> Vec<(Value, Option<String>)> {
        let mut out = vec![];
        for (kind, ns) in [
            ("ClusterRole", None),
            ("Role", Some("pgfleet-system".to_string())),
        ] {
            for r in self.get(kind, "pgfleet-manager")["rules"]
                .as_array()
                .unwrap()
            {
                out.push((r.clone(), ns.clone()));
            }
        }
        out
    }

    pub fn assert_member_shape(&self) {
        assert_eq!(
            self.get("Namespace", "pgfleet-system")["metadata"]["name"],
            "pgfleet-system"
        );
        let sa = self.get("ServiceAccount", "pgfleet-manager");
        assert_eq!(sa["automountServiceAccountToken"], false);
        let token = self.get("Secret", "pgfleet-manager-token");
        assert_eq!(token["type"], "kubernetes.io/service-account-token");
        assert_eq!(
            token["metadata"]["annotations"]["kubernetes.io/service-account.name"],
            "pgfleet-manager"
        );
        for kind in ["ClusterRoleBinding", "RoleBinding"] {
            let b = self.get(kind, "pgfleet-manager");
            assert_eq!(
                b["subjects"],
                json!([{"kind": "ServiceAccount", "name": "pgfleet-manager", "namespace": "pgfleet-system"}])
            );
        }
        for (rule, _) in self.rules() {
            for field in [
                "apiGroups",
                "resources",
                "verbs",
                "resourceNames",
                "nonResourceURLs",
            ] {
                let wild = rule[field].as_array().is_some_and(|l| {
                    l.iter()
                        .any(|s| s.as_str().is_some_and(|s| s.contains('*')))
                });
                assert!(!wild, "wildcard in {rule}");
            }
            assert!(
                rule.get("nonResourceURLs").is_none(),
                "non-resource rule {rule}: /version and discovery are public"
            );
        }
        let role_rules: Vec<Value> = self.get("Role", "pgfleet-manager")["rules"]
            .as_array()
            .unwrap()
            .clone();
        assert!(
            role_rules
                .iter()
                .any(|r| r["resources"] == json!(["leases"])
                    && r["verbs"] == json!(["get", "create", "update"]))
        );
    }

    /// Every (group, resource, verb) the roles grant was used by a request
    /// the audit log recorded, except the listed [`NOT_EXERCISED`] ones.
    pub fn assert_rules_all_used(&self, records: &[AuditRecord]) {
        let used: Vec<&Attributes> = records.iter().map(|r| &r.attributes).collect();
        let mut unused = BTreeSet::new();
        let mut seen = BTreeSet::new();
        for (rule, ns) in self.rules() {
            for g in strings(&rule["apiGroups"]) {
                for res in strings(&rule["resources"]) {
                    for verb in strings(&rule["verbs"]) {
                        let one = json!({"apiGroups": [g], "resources": [res], "verbs": [verb],
                                         "resourceNames": rule.get("resourceNames").cloned().unwrap_or(json!([]))});
                        let hit = used.iter().any(|a| {
                            rbac::rule_allows(&one, a)
                                && ns.as_deref().is_none_or(|n| a.namespace == n)
                        });
                        let scope = ns.clone().unwrap_or_default();
                        let key = (g.clone(), res.clone(), verb.clone(), scope);
                        if !hit {
                            unused.insert(key.clone());
                        }
                        seen.insert(key);
                    }
                }
            }
        }
        let expected: BTreeSet<(String, String, String, String)> = NOT_EXERCISED
            .iter()
            .map(|(g, r, v, n)| (g.to_string(), r.to_string(), v.to_string(), n.to_string()))
            .collect();
        let mut requested: Vec<String> = used
            .iter()
            .map(|a| {
                format!(
                    "{} {}/{} {}",
                    a.verb,
                    a.group,
                    a.qualified_resource(),
                    a.namespace
                )
            })
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect();
        requested.sort();
        assert_eq!(
            unused,
            expected,
            "granted but unused (group, resource, verb, namespace) differ from NOT_EXERCISED.\nrequests seen:\n{}",
            requested.join("\n")
        );
        assert!(
            expected.is_subset(&seen),
            "NOT_EXERCISED names grants the roles do not have"
        );
    }

    pub fn assert_manager_shape(&self) {
        let d = self.get("Deployment", "pgfleet");
        assert_eq!(d["metadata"]["namespace"], "pgfleet");
        let spec = &d["spec"]["template"]["spec"];
        assert_eq!(d["spec"]["replicas"], 2);
        let c = &spec["containers"][0];
        assert_eq!(
            c["args"],
            json!(["run", "--config", "/etc/pgfleet/fleet.toml"])
        );
        assert_eq!(c["ports"][0]["containerPort"], 8080);
        assert_eq!(c["livenessProbe"]["httpGet"]["path"], "/healthz");
        assert_eq!(c["readinessProbe"]["httpGet"]["path"], "/readyz");
        assert_eq!(c["securityContext"]["readOnlyRootFilesystem"], true);
        assert_eq!(c["securityContext"]["allowPrivilegeEscalation"], false);
        assert_eq!(spec["securityContext"]["runAsNonRoot"], true);
        assert_eq!(spec["automountServiceAccountToken"], false);
        for k in ["requests", "limits"] {
            assert!(
                c["resources"][k]["memory"].is_string() && c["resources"][k]["cpu"].is_string(),
                "{k}"
            );
        }
        let anti = &spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
            [0]["podAffinityTerm"];
        assert_eq!(anti["topologyKey"], "kubernetes.io/hostname");
        let pod_labels = &d["spec"]["template"]["metadata"]["labels"];
        assert_eq!(&anti["labelSelector"]["matchLabels"], pod_labels);
        assert_eq!(&d["spec"]["selector"]["matchLabels"], pod_labels);
        // Volumes name the generated ConfigMap and Secrets.
        let vols = spec["volumes"].as_array().unwrap();
        for (vol, kind, prefix) in [
            ("config", "ConfigMap", "pgfleet-config-"),
            ("members", "Secret", "pgfleet-members-"),
            ("api-token", "Secret", "pgfleet-api-token-"),
        ] {
            let v = vols.iter().find(|v| v["name"] == vol).unwrap();
            let named = v["configMap"]["name"]
                .as_str()
                .or(v["secret"]["secretName"].as_str())
                .unwrap();
            assert_eq!(self.get(kind, prefix)["metadata"]["name"], named);
        }
        let pdb = self.get("PodDisruptionBudget", "pgfleet");
        assert_eq!(&pdb["spec"]["selector"]["matchLabels"], pod_labels);
        let svc = self.get("Service", "pgfleet");
        assert_eq!(&svc["spec"]["selector"], pod_labels);
        assert_eq!(svc["spec"]["ports"][0]["name"], "https");
        assert_eq!(c["readinessProbe"]["httpGet"]["scheme"], "HTTPS");
        let sm = self.get("ServiceMonitor", "pgfleet");
        assert_eq!(sm["spec"]["endpoints"][0]["port"], "https");
        assert_eq!(sm["spec"]["endpoints"][0]["scheme"], "https");
        assert_eq!(sm["spec"]["endpoints"][0]["path"], "/metrics");
        for (k, v) in sm["spec"]["selector"]["matchLabels"].as_object().unwrap() {
            assert_eq!(
                &svc["metadata"]["labels"][k], v,
                "the ServiceMonitor does not select the Service"
            );
        }
        // The token file and the kubeconfigs the TOML names are where the
        // Deployment mounts them.
        let toml = self.fleet_toml();
        assert!(toml.contains("api_token_file = \"/etc/pgfleet/token/api-token\""));
        let mounts = c["volumeMounts"].as_array().unwrap();
        let at = |vol: &str| {
            mounts.iter().find(|m| m["name"] == vol).unwrap()["mountPath"]
                .as_str()
                .unwrap()
                .to_string()
        };
        assert_eq!(at("api-token"), "/etc/pgfleet/token");
        let members = self.get("Secret", "pgfleet-members-");
        for key in members["data"].as_object().unwrap().keys() {
            assert!(
                toml.contains(&format!("kubeconfig = \"{}/{key}\"", at("members"))),
                "{key} not named in fleet.toml"
            );
        }
    }

    pub fn fleet_toml(&self) -> String {
        self.get("ConfigMap", "pgfleet-config-")["data"]["fleet.toml"]
            .as_str()
            .unwrap()
            .to_string()
    }
}

fn strings(v: &Value) -> Vec<String> {
    v.as_array()
        .map(|l| {
            l.iter()
                .filter_map(|s| s.as_str().map(String::from))
                .collect()
        })
        .unwrap_or_default()
}
