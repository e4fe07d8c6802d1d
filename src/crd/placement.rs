//! Where a PostgresCluster's instances run (`spec.affinity`,
//! `spec.topologySpreadConstraints`, `spec.priorityClassName`): the shape
//! CloudNativePG users know, with Kubernetes' own field names inside so
//! snippets can be pasted, and every list bounded (tenant input).
//! The controller renders them into pods in `controller::placement`.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// `spec.affinity`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct AffinitySpec {
    /// Keep instances of this cluster apart (default true): one node (or
    /// zone, per `topologyKey`) failing then takes at most one instance.
    #[serde(default = "yes")]
    pub enable_pod_anti_affinity: bool,
    /// `preferred` (default: spread when possible, still schedule when
    /// not) or `required` (an instance stays Pending rather than share).
    #[serde(default)]
    pub pod_anti_affinity_type: AntiAffinityType,
    /// The node label whose values the anti-affinity keeps apart
    /// (default `kubernetes.io/hostname`; `topology.kubernetes.io/zone`
    /// spreads over zones).
    #[serde(default = "hostname")]
    #[schemars(length(max = 317))]
    pub topology_key: String,
    /// Node labels an instance's node must have.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16, "additionalProperties" = {"type": "string", "maxLength": 63}))]
    pub node_selector: BTreeMap<String, String>,
    /// Taints instances tolerate (e.g. nodes dedicated to databases).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub tolerations: Vec<Toleration>,
    /// Pod affinity added to the instance pods (Kubernetes `PodAffinity`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_pod_affinity: Option<PodAffinityRules>,
    /// Pod anti-affinity added to the generated one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub additional_pod_anti_affinity: Option<PodAffinityRules>,
}

impl Default for AffinitySpec {
    fn default() -> Self {
        AffinitySpec {
            enable_pod_anti_affinity: true,
            pod_anti_affinity_type: AntiAffinityType::default(),
            topology_key: hostname(),
            node_selector: BTreeMap::new(),
            tolerations: vec![],
            additional_pod_affinity: None,
            additional_pod_anti_affinity: None,
        }
    }
}

fn yes() -> bool {
    true
}

pub fn hostname() -> String {
    "kubernetes.io/hostname".into()
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum AntiAffinityType {
    #[default]
    Preferred,
    Required,
}

/// A Kubernetes `Toleration`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Toleration {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 317))]
    pub key: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub operator: Option<TolerationOperator>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 63))]
    pub value: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<TaintEffect>,
    /// For NoExecute: how long the pod stays after the taint appears.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 0, max = 31536000))]
    pub toleration_seconds: Option<i64>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum TolerationOperator {
    Equal,
    Exists,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum TaintEffect {
    NoSchedule,
    PreferNoSchedule,
    NoExecute,
}

/// Kubernetes `PodAffinity` / `PodAntiAffinity` (field names as upstream).
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
pub struct PodAffinityRules {
    #[serde(
        default,
        rename = "requiredDuringSchedulingIgnoredDuringExecution",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 8))]
    pub required: Vec<PodAffinityTerm>,
    #[serde(
        default,
        rename = "preferredDuringSchedulingIgnoredDuringExecution",
        skip_serializing_if = "Vec::is_empty"
    )]
    #[schemars(length(max = 8))]
    pub preferred: Vec<WeightedPodAffinityTerm>,
}

/// Kubernetes `PodAffinityTerm`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PodAffinityTerm {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    #[schemars(length(max = 317))]
    pub topology_key: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16), inner(length(max = 63)))]
    pub namespaces: Vec<String>,
}

/// Kubernetes `WeightedPodAffinityTerm`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct WeightedPodAffinityTerm {
    #[schemars(range(min = 1, max = 100))]
    pub weight: i32,
    pub pod_affinity_term: PodAffinityTerm,
}

/// Kubernetes `LabelSelector`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct LabelSelector {
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    #[schemars(extend("maxProperties" = 16, "additionalProperties" = {"type": "string", "maxLength": 63}))]
    pub match_labels: BTreeMap<String, String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub match_expressions: Vec<LabelSelectorRequirement>,
}

/// Kubernetes `LabelSelectorRequirement`.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
pub struct LabelSelectorRequirement {
    #[schemars(length(max = 317))]
    pub key: String,
    pub operator: SelectorOperator,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 32), inner(length(max = 63)))]
    pub values: Vec<String>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, JsonSchema)]
pub enum SelectorOperator {
    In,
    NotIn,
    Exists,
    DoesNotExist,
}

/// Kubernetes `TopologySpreadConstraint`; without a `labelSelector` it
/// counts this cluster's instances.
#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TopologySpreadConstraint {
    #[schemars(range(min = 1, max = 16))]
    pub max_skew: i32,
    #[schemars(length(max = 317))]
    pub topology_key: String,
    #[serde(default)]
    pub when_unsatisfiable: WhenUnsatisfiable,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub label_selector: Option<LabelSelector>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = 16))]
    pub min_domains: Option<i32>,
}

#[derive(Serialize, Deserialize, Debug, Clone, Copy, PartialEq, Eq, Default, JsonSchema)]
pub enum WhenUnsatisfiable {
    #[default]
    DoNotSchedule,
    ScheduleAnyway,
}
