//! Protobuf field tables (from `k8s.io/api`'s `generated.proto`) for the
//! workload, networking, RBAC and quota kinds kubectl's generators create:
//! `kubectl create deployment|service|role|rolebinding|clusterrole|
//! clusterrolebinding|quota`. Only the fields those generators (and
//! ordinary manifests of these kinds) carry are listed; an unknown field is
//! skipped, as a decoder of an older schema would.

use super::protobuf::{OBJECT_META, Schema, Ty};

const INT_OR_STRING: Ty = Ty::IntOrStr;

const LABEL_REQUIREMENT: &Schema = &[
    (1, "key", Ty::Str),
    (2, "operator", Ty::Str),
    (3, "values", Ty::RepStr),
];

const LABEL_SELECTOR: &Schema = &[
    (1, "matchLabels", Ty::MapStr),
    (2, "matchExpressions", Ty::RepMsg(LABEL_REQUIREMENT)),
];

const SERVICE_PORT: &Schema = &[
    (1, "name", Ty::Str),
    (2, "protocol", Ty::Str),
    (3, "port", Ty::Num),
    (4, "targetPort", INT_OR_STRING),
    (5, "nodePort", Ty::Num),
    (6, "appProtocol", Ty::Str),
];

const SERVICE_SPEC: &Schema = &[
    (1, "ports", Ty::RepMsg(SERVICE_PORT)),
    (2, "selector", Ty::MapStr),
    (3, "clusterIP", Ty::Str),
    (4, "type", Ty::Str),
    (5, "externalIPs", Ty::RepStr),
    (7, "sessionAffinity", Ty::Str),
    (10, "externalName", Ty::Str),
    (11, "externalTrafficPolicy", Ty::Str),
    (13, "publishNotReadyAddresses", Ty::Flag),
    (17, "ipFamilyPolicy", Ty::Str),
    (18, "clusterIPs", Ty::RepStr),
    (19, "ipFamilies", Ty::RepStr),
    (22, "internalTrafficPolicy", Ty::Str),
];

pub(super) const SERVICE: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "spec", Ty::Msg(SERVICE_SPEC)),
];

const CONTAINER_PORT: &Schema = &[
    (1, "name", Ty::Str),
    (2, "hostPort", Ty::Num),
    (3, "containerPort", Ty::Num),
    (4, "protocol", Ty::Str),
];

const ENV_VAR: &Schema = &[(1, "name", Ty::Str), (2, "value", Ty::Str)];

const RESOURCES: &Schema = &[(1, "limits", Ty::MapQty), (2, "requests", Ty::MapQty)];

const CONTAINER: &Schema = &[
    (1, "name", Ty::Str),
    (2, "image", Ty::Str),
    (3, "command", Ty::RepStr),
    (4, "args", Ty::RepStr),
    (5, "workingDir", Ty::Str),
    (6, "ports", Ty::RepMsg(CONTAINER_PORT)),
    (7, "env", Ty::RepMsg(ENV_VAR)),
    (8, "resources", Ty::Msg(RESOURCES)),
    (13, "terminationMessagePath", Ty::Str),
    (14, "imagePullPolicy", Ty::Str),
    (16, "stdin", Ty::Flag),
    (17, "stdinOnce", Ty::Flag),
    (18, "tty", Ty::Flag),
    (20, "terminationMessagePolicy", Ty::Str),
];

const POD_SPEC: &Schema = &[
    (2, "containers", Ty::RepMsg(CONTAINER)),
    (3, "restartPolicy", Ty::Str),
    (4, "terminationGracePeriodSeconds", Ty::Int),
    (6, "dnsPolicy", Ty::Str),
    (7, "nodeSelector", Ty::MapStr),
    (8, "serviceAccountName", Ty::Str),
    (19, "schedulerName", Ty::Str),
    (20, "initContainers", Ty::RepMsg(CONTAINER)),
];

const POD_TEMPLATE: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "spec", Ty::Msg(POD_SPEC)),
];

const DEPLOYMENT_STRATEGY: &Schema = &[(1, "type", Ty::Str)];

const DEPLOYMENT_SPEC: &Schema = &[
    (1, "replicas", Ty::Int),
    (2, "selector", Ty::Msg(LABEL_SELECTOR)),
    (3, "template", Ty::Msg(POD_TEMPLATE)),
    (4, "strategy", Ty::Msg(DEPLOYMENT_STRATEGY)),
    (5, "minReadySeconds", Ty::Num),
    (6, "revisionHistoryLimit", Ty::Int),
    (7, "paused", Ty::Flag),
    (9, "progressDeadlineSeconds", Ty::Int),
];

pub(super) const DEPLOYMENT: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "spec", Ty::Msg(DEPLOYMENT_SPEC)),
];

const POLICY_RULE: &Schema = &[
    (1, "verbs", Ty::RepStr),
    (2, "apiGroups", Ty::RepStr),
    (3, "resources", Ty::RepStr),
    (4, "resourceNames", Ty::RepStr),
    (5, "nonResourceURLs", Ty::RepStr),
];

pub(super) const ROLE: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "rules", Ty::RepMsg(POLICY_RULE)),
];

const SUBJECT: &Schema = &[
    (1, "kind", Ty::Str),
    (2, "apiGroup", Ty::Str),
    (3, "name", Ty::Str),
    (4, "namespace", Ty::Str),
];

const ROLE_REF: &Schema = &[
    (1, "apiGroup", Ty::Str),
    (2, "kind", Ty::Str),
    (3, "name", Ty::Str),
];

pub(super) const ROLE_BINDING: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "subjects", Ty::RepMsg(SUBJECT)),
    (3, "roleRef", Ty::Msg(ROLE_REF)),
];

const QUOTA_SPEC: &Schema = &[(1, "hard", Ty::MapQty), (2, "scopes", Ty::RepStr)];

pub(super) const RESOURCE_QUOTA: &Schema = &[
    (1, "metadata", Ty::Msg(OBJECT_META)),
    (2, "spec", Ty::Msg(QUOTA_SPEC)),
];

/// The tables of this file by (apiVersion, kind).
pub(super) fn schema_for(api_version: &str, kind: &str) -> Option<&'static Schema> {
    match (api_version, kind) {
        ("v1", "Service") => Some(SERVICE),
        ("v1", "ResourceQuota") => Some(RESOURCE_QUOTA),
        ("apps/v1", "Deployment") => Some(DEPLOYMENT),
        ("rbac.authorization.k8s.io/v1", "Role" | "ClusterRole") => Some(ROLE),
        ("rbac.authorization.k8s.io/v1", "RoleBinding" | "ClusterRoleBinding") => {
            Some(ROLE_BINDING)
        }
        _ => None,
    }
}
