//! Closed sets of words in the config (`on_failure = "pause"` and the like).
//!
//! Each parses through [`Checked`](super::values::Checked) rather than a
//! serde enum, so a misspelt word is reported together with every other
//! problem instead of aborting deserialization.

use std::fmt;

use super::values::CheckedValue;

/// Defines a closed set of words with a default, parsed through [`Checked`]
/// so that a misspelt choice is reported together with every other problem.
macro_rules! choice {
    ($(#[$doc:meta])* $name:ident { $($(#[$vdoc:meta])* $variant:ident => $text:literal),+ $(,)? } default $default:ident) => {
        $(#[$doc])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vdoc])* $variant),+ }

        impl Default for $name {
            fn default() -> Self { Self::$default }
        }

        impl $name {
            /// The word used in the config file.
            pub fn as_str(self) -> &'static str {
                match self { $(Self::$variant => $text),+ }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl CheckedValue for $name {
            const EXPECTED: &'static str = concat!("one of:", $(" \"", $text, "\""),+);
            fn parse_raw(raw: &str) -> Result<Self, String> {
                match raw {
                    $($text => Ok(Self::$variant),)+
                    _ => {
                        let words = [$(concat!("\"", $text, "\"")),+];
                        Err(format!("unknown value {raw:?}, expected one of {}", words.join(", ")))
                    }
                }
            }
        }
    };
}

choice!(
    /// How embedded member clusters run their pods.
    EmbeddedRuntime {
        /// Pods are simulated in memory: fast, for scale tests and demos.
        Virtual => "virtual",
        /// Each container is a real local process (PostgreSQL from OS packages).
        Process => "process",
    } default Virtual
);

choice!(
    /// The OTLP transport for traces.
    OtlpProtocol { HttpProtobuf => "http/protobuf", Grpc => "grpc" } default HttpProtobuf
);

choice!(
    /// The format of log lines on stderr.
    LogFormat { Text => "text", Json => "json" } default Text
);

choice!(
    /// How S3 object URLs are formed.
    UriStyle {
        /// `https://bucket.endpoint/key` (AWS style).
        Host => "host",
        /// `https://endpoint/bucket/key` (MinIO and most self-hosted stores).
        Path => "path",
    } default Host
);

choice!(
    /// What a rollout does when a cluster fails to update.
    OnFailure {
        /// Stop starting new updates and wait for an operator.
        Pause => "pause",
        /// Stop the rollout for good; already updated clusters stay updated.
        Abort => "abort",
        /// Stop and move updated clusters back to their previous version.
        Rollback => "rollback",
    } default Pause
);

choice!(
    /// How a rollout treats a member cluster that cannot be reached.
    UnreachablePolicy {
        /// Treat it as a failed update (counts towards `max_failures`).
        CountAsFailure => "count_as_failure",
        /// Leave it for later and carry on with the others.
        SkipAndRequeue => "skip_and_requeue",
    } default SkipAndRequeue
);

choice!(
    /// Whether a PostgresCluster may restore from another namespace's or
    /// another member cluster's source (`[tenancy]`).
    CrossNamespaceRestore {
        /// Only when the source PostgresCluster lists the restoring
        /// namespace in `pgfleet.io/restore-allowed-namespaces`.
        Consent => "consent",
        /// Always (a fleet with no tenants to keep apart).
        Allow => "allow",
    } default Consent
);

choice!(
    /// How a rollout whose target crosses a major version upgrades each
    /// PostgresCluster (written to its `spec.majorUpgrade.method`).
    MajorMethod {
        /// Offline `pg_upgrade --link` on the primary's volume
        /// (docs/major-upgrades.md).
        InPlace => "inPlace",
        /// A new instance set kept in sync by logical replication and
        /// switched to through the pooler (docs/major-upgrades.md,
        /// "Blue/green").
        BlueGreen => "blueGreen",
    } default InPlace
);
