//! `spec.tls`: server certificates of the tenant's own instead of the
//! ones pgfleet issues (controller::tls). The Secrets follow cert-manager's
//! layout, so a `Certificate` resource can produce them and renew them:
//! pgfleet copies a valid certificate into `<name>-server-tls` and has
//! every server reload it whenever it changes.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

#[derive(Serialize, Deserialize, Debug, Clone, PartialEq, Default, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct TlsSpec {
    /// A Secret in this namespace with `tls.crt` (the server certificate,
    /// intermediates after it), `tls.key` and, unless `caSecret` is set,
    /// `ca.crt`. The certificate must name `<name>-rw`,
    /// `<name>-rw.<namespace>.svc`, `<name>-ro.<namespace>.svc` (and
    /// `<name>-pooler.<namespace>.svc` with a pooler) and chain to the CA.
    /// A certificate that does not is not used: condition
    /// `TLSCertificateInvalid` says why, and the servers keep theirs.
    #[schemars(length(min = 1, max = 253))]
    pub server_secret: String,
    /// A Secret in this namespace whose `ca.crt` is the CA applications and
    /// replicas trust (published in `<name>-ca`). Default: `ca.crt` of
    /// `serverSecret`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 253))]
    pub ca_secret: Option<String>,
}
