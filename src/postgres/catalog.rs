//! What `pgfleet-instance catalog` reports about a primary: its roles
//! (attributes, memberships, comment, password verifier), its databases
//! (with the extensions and schemas of those asked about) and the
//! extensions the image offers. `postgres::roles` and
//! `postgres::databases` compare it with the spec.

use serde::{Deserialize, Serialize};

/// The JSON line of `pgfleet-instance catalog DB...` (serialized too: the
/// virtual runtime answers with it).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Catalog {
    pub contract: u32,
    #[serde(default)]
    pub roles: Vec<ActualRole>,
    #[serde(default)]
    pub databases: Vec<ActualDatabase>,
    /// `pg_available_extension_versions`, by extension.
    #[serde(default)]
    pub available: Vec<AvailableExtension>,
    /// The virtual runtime (src/emulated), which has no SQL: nothing is
    /// compared or applied.
    #[serde(default)]
    pub emulated: bool,
}

/// One row of `pg_authid` (roles whose name starts with `pg_` are left out).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActualRole {
    pub name: String,
    #[serde(default)]
    pub superuser: bool,
    #[serde(default)]
    pub inherit: bool,
    #[serde(default)]
    pub createrole: bool,
    #[serde(default)]
    pub createdb: bool,
    #[serde(default)]
    pub login: bool,
    #[serde(default)]
    pub replication: bool,
    #[serde(default)]
    pub bypassrls: bool,
    #[serde(default)]
    pub connection_limit: i32,
    /// `YYYY-MM-DDTHH:MM:SSZ` (UTC), none for no limit or `infinity`.
    #[serde(default)]
    pub valid_until: Option<String>,
    #[serde(default)]
    pub member_of: Vec<String>,
    #[serde(default)]
    pub comment: Option<String>,
    /// The stored SCRAM verifier (or md5 hash), to tell whether the
    /// password is the one of the Secret without keeping either.
    #[serde(default)]
    pub verifier: Option<String>,
}

/// One database; `extensions` and `schemas` only for databases asked about.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActualDatabase {
    pub name: String,
    pub owner: String,
    #[serde(default)]
    pub extensions: Vec<InstalledExtension>,
    #[serde(default)]
    pub schemas: Vec<String>,
    /// Whether `extensions`/`schemas` were read (the database was asked
    /// about and accepted a connection).
    #[serde(default)]
    pub inspected: bool,
    /// The pooler's lookup (controller::pooler::auth): schema `pgfleet`
    /// and its functions, when the schema exists (inspected databases only).
    #[serde(default)]
    pub pooler_lookup: Option<PoolerLookup>,
}

/// Schema `pgfleet` of one database, as the pooler's lookup check needs it.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PoolerLookup {
    pub schema_owner: String,
    /// `grantee:PRIVILEGE` (`PUBLIC` for everyone), in any order.
    #[serde(default)]
    pub schema_grants: Vec<String>,
    /// Every function of the schema named like the lookup (overloads too).
    #[serde(default)]
    pub functions: Vec<LookupFunction>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LookupFunction {
    pub owner: String,
    #[serde(default)]
    pub security_definer: bool,
    /// `proconfig` (`search_path=…`).
    #[serde(default)]
    pub config: Vec<String>,
    pub source: String,
    pub arguments: String,
    pub result: String,
    #[serde(default)]
    pub grants: Vec<String>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct InstalledExtension {
    pub name: String,
    pub version: String,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct AvailableExtension {
    pub name: String,
    #[serde(default)]
    pub versions: Vec<String>,
}

impl Catalog {
    pub fn parse(line: &str) -> Result<Self, String> {
        serde_json::from_str(line.trim())
            .map_err(|e| format!("pgfleet-instance catalog printed something unexpected: {e}"))
    }

    pub fn role(&self, name: &str) -> Option<&ActualRole> {
        self.roles.iter().find(|r| r.name == name)
    }

    pub fn database(&self, name: &str) -> Option<&ActualDatabase> {
        self.databases.iter().find(|d| d.name == name)
    }

    pub fn available(&self, name: &str) -> Option<&AvailableExtension> {
        self.available.iter().find(|e| e.name == name)
    }
}

/// Whether `verifier` (as stored in pg_authid) was derived from
/// `password`: its salt and iteration count are reused to derive it again.
pub fn verifier_matches(verifier: &str, password: &str) -> bool {
    use base64::Engine as _;
    let Some(rest) = verifier.strip_prefix("SCRAM-SHA-256$4096:") else {
        // md5 or another iteration count: treated as different, and set
        // again as a SCRAM verifier.
        return false;
    };
    let Some((salt_b64, _)) = rest.split_once('$') else {
        return false;
    };
    let Ok(salt) = base64::engine::general_purpose::STANDARD.decode(salt_b64) else {
        return false;
    };
    super::sql::scram_verifier(password, &salt) == verifier
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_verb_output() {
        let line = r#"{"contract":1,"roles":[{"name":"app","login":true,"inherit":true,"connectionLimit":-1,"validUntil":null,"memberOf":["readers"],"comment":null,"verifier":null}],
            "databases":[{"name":"app","owner":"app","inspected":true,"extensions":[{"name":"plpgsql","version":"1.0"}],"schemas":["public"]}],
            "available":[{"name":"hstore","versions":["1.7","1.8"]}]}"#;
        let c = Catalog::parse(&line.replace('\n', " ")).unwrap();
        assert!(c.role("app").unwrap().login);
        assert_eq!(c.database("app").unwrap().schemas, ["public"]);
        assert!(c.available("hstore").is_some());
        assert!(Catalog::parse("psql: error").is_err());
    }

    #[test]
    fn verifiers_are_recognised() {
        let v = super::super::sql::scram_verifier("s3cret", &[1u8; 16]);
        assert!(verifier_matches(&v, "s3cret"));
        assert!(!verifier_matches(&v, "other"));
        assert!(!verifier_matches("md5abc", "s3cret"));
        assert!(!verifier_matches("SCRAM-SHA-256$4096:!!$x:y", "s3cret"));
    }
}
