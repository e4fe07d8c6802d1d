//! The labels, annotations and names pgfleet stamps on the objects it
//! writes. They are a contract with kubectl users, dashboards and the
//! objects already in member clusters: changing one orphans what carries the
//! old value, so they live together here, each once.

/// The field manager of every server-side apply and patch pgfleet makes.
pub const FIELD_MANAGER: &str = "pgfleet";
/// The finalizer on every PostgresCluster the controller manages.
pub const FINALIZER: &str = "pgfleet.io/cleanup";
/// On a PostgresCluster: `"true"` stops its reconciliation.
pub const PAUSED: &str = "pgfleet.io/paused";

pub const LABEL_CLUSTER: &str = "pgfleet.io/cluster";
pub const LABEL_INSTANCE: &str = "pgfleet.io/instance";
pub const LABEL_ROLE: &str = "pgfleet.io/role";
pub const LABEL_SHARD: &str = "pgfleet.io/shard";
/// `instance` or `pooler`: what a pgfleet Pod is.
pub const LABEL_KIND: &str = "pgfleet.io/kind";
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
/// On the pooler's children: which pooler (`<cluster>-pooler`).
pub const LABEL_POOLER: &str = "pgfleet.io/pooler";

pub const ANN_HASH: &str = "pgfleet.io/hash";
pub const ANN_VERSION: &str = "pgfleet.io/version";
pub const ANN_PARAMETERS: &str = "pgfleet.io/parameters";
/// On instance pods: the configuration hash the instance last loaded.
pub const ANN_CONFIG: &str = "pgfleet.io/config-hash";

/// On a PostgresCluster: a requested switchover (`auto` or an instance);
/// written by the API and the CLI, consumed and cleared by the controller.
pub const SWITCHOVER_TO: &str = "pgfleet.io/switchover-to";

/// The annotation on a source PostgresCluster listing who may restore from
/// it: comma-separated `<namespace>` (a namespace of the source's own member
/// cluster) or `<member>/<namespace>` (a namespace of that member cluster).
pub const ANN_RESTORE_ALLOWED: &str = "pgfleet.io/restore-allowed-namespaces";

/// A label on throwaway drill clusters: they are never backed up.
pub const DRILL_OF: &str = "pgfleet.io/drill-of";
