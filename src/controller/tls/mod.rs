//! TLS for PostgreSQL and PgBouncer, on by default (docs/security.md).
//!
//! Per PostgresCluster three Secrets the manager owns:
//! - `<name>-ca-key` (`ca.key`, `ca.crt`): the cluster CA, made once. Only
//!   the manager reads it, to sign renewals; no Pod mounts it.
//! - `<name>-ca` (`ca.crt`): the CA certificate, published for
//!   applications (`sslrootcert`, `sslmode=verify-full`).
//! - `<name>-server-tls` (`tls.crt`, `tls.key`, `ca.crt`, type
//!   `kubernetes.io/tls`): the server certificate for every Service name,
//!   mounted into instances and poolers. Its annotations say when it ends
//!   and which certificate the running servers have loaded.
//!
//! Renewal replaces the server Secret (server-side apply) `renew_before`
//! its end; every instance then waits until the kubelet shows the new
//! files, copies them and reloads PostgreSQL, and every pooler RELOADs:
//! no restart, open sessions keep their TLS session. Until all have
//! reloaded the Secret's `reloaded` mark differs from its fingerprint and
//! each round tries again, so a manager restarted in between finishes it.

pub mod issue;
pub mod provided;

use super::Ctx;
use super::build::Owner;
use super::plan::Observed;
use super::reconcile::{Error, create_child, event, kerr, ssa_with};
use crate::crd::PostgresCluster;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::Api;
use kube::api::{Patch, PatchParams};
use kube::runtime::events::EventType;
use std::collections::BTreeMap;
use std::time::{Duration, SystemTime};

/// Where instances and poolers see `<name>-server-tls`.
pub const MOUNT: &str = "/etc/pgfleet/server-tls";
/// When the server certificate ends (seconds since the epoch).
const ANN_NOT_AFTER: &str = "pgfleet.io/tls-not-after";
/// [`issue::fingerprint`] of the certificate in the Secret.
const ANN_FINGERPRINT: &str = "pgfleet.io/tls-fingerprint";
/// The fingerprint every running server has loaded.
const ANN_RELOADED: &str = "pgfleet.io/tls-reloaded";

/// The annotations [`ensure`] decides by, read with `ann` (the index's
/// accessor of a Secret's metadata).
pub fn observed_meta(
    ann: &dyn Fn(&str) -> Option<String>,
) -> crate::controller::plan::ServerTlsMeta {
    crate::controller::plan::ServerTlsMeta {
        not_after: ann(ANN_NOT_AFTER),
        fingerprint: ann(ANN_FINGERPRINT),
        reloaded: ann(ANN_RELOADED),
    }
}

pub fn server_secret(cluster: &str) -> String {
    format!("{cluster}-server-tls")
}

/// The Secret applications read `ca.crt` from.
pub fn ca_secret(cluster: &str) -> String {
    format!("{cluster}-ca")
}

fn ca_key_secret(cluster: &str) -> String {
    format!("{cluster}-ca-key")
}

/// How long server certificates live and when they are renewed (`[tls]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Policy {
    pub validity: Duration,
    pub renew_before: Duration,
}

impl Default for Policy {
    /// 90 days, renewed 30 days before the end (as cert-manager does).
    fn default() -> Self {
        Policy {
            validity: Duration::from_secs(90 * 24 * 3600),
            renew_before: Duration::from_secs(30 * 24 * 3600),
        }
    }
}

/// What a round learnt about the server certificate.
#[derive(Debug, Default)]
pub struct State {
    /// When renewal becomes due.
    pub within: Option<Duration>,
    /// A certificate the running servers have not all loaded yet.
    pub pending: Option<String>,
    /// Why the certificate of `spec.tls` is not used (condition
    /// `TLSCertificateInvalid`).
    pub problem: Option<String>,
}

/// How often a provided certificate is read again (cert-manager renews it
/// in place; pgfleet does not watch the tenant's Secrets).
const PROVIDED_RECHECK: Duration = Duration::from_secs(60);

fn failed(what: &str) -> impl FnOnce(anyhow::Error) -> Error + '_ {
    move |e| Error::Build {
        what: what.into(),
        message: e.to_string(),
    }
}

fn text(s: &Secret, key: &str) -> Option<String> {
    String::from_utf8(s.data.as_ref()?.get(key)?.0.clone()).ok()
}

fn ann<'a>(s: &'a Secret, key: &str) -> Option<&'a str> {
    s.metadata
        .annotations
        .as_ref()?
        .get(key)
        .map(String::as_str)
}

/// Makes sure the CA and a current server certificate exist (before any
/// Pod mounts them): the tenant's own when `spec.tls` names a valid one,
/// else pgfleet's, renewed when it is due.
pub async fn ensure(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
) -> Result<State, Error> {
    let now = SystemTime::now();
    if let Some(state) = not_due(pg, ctx, obs, owner, now) {
        return Ok(state);
    }
    let api = Api::<Secret>::namespaced(ctx.client.clone(), &owner.namespace);
    let sname = server_secret(&owner.name);
    // A cluster with nothing yet whose index has no server Secret: none to
    // read (were the index behind, the certificate is issued again, before
    // any server used it).
    let current = match obs.pods.is_empty() && obs.pvcs.is_empty() && !obs.secrets.contains(&sname)
    {
        true => None,
        false => api
            .get_opt(&sname)
            .await
            .map_err(kerr("get", "Secret", &sname))?,
    };
    let problem = match provided_state(pg, ctx, &api, owner, current.as_ref(), now).await? {
        Ok(state) => return Ok(state),
        Err(problem) => problem,
    };
    let ca = ca(pg, ctx, &api, owner, now, obs).await?;
    let published = !obs.secrets.contains(&ca_secret(&owner.name));
    if published {
        publish_ca(&ctx.client, owner, &ca.cert).await?;
    }
    let not_after = current
        .as_ref()
        .and_then(|s| ann(s, ANN_NOT_AFTER)?.parse::<u64>().ok())
        .map(|t| SystemTime::UNIX_EPOCH + Duration::from_secs(t));
    let policy = ctx.tls;
    if let Some(end) = not_after
        && !issue::renewal_due(Some(end), now, policy.renew_before)
    {
        return Ok(State {
            within: Some(issue::next_check(end, now, policy.renew_before)),
            pending: unloaded(current.as_ref()),
            problem,
        });
    }
    let (pair, end) = issue::server(&owner.name, &owner.namespace, &ca.key, now, policy.validity)
        .map_err(failed("the server certificate"))?;
    // The first certificate of a cluster without servers is the one every
    // server starts with (a Pod waits for its Secret volume): loaded
    // everywhere from the start, no reload round to record.
    let first = current.is_none() && obs.pods.is_empty();
    let fp = issue::fingerprint(&pair);
    let loaded = first.then_some(fp.as_str());
    apply_server(&ctx.client, owner, &pair, &ca.cert, Some(end), loaded).await?;
    // The CA clients trust is pgfleet's again (after a provided one);
    // a new cluster's was published just above.
    if !published {
        publish_ca(&ctx.client, owner, &ca.cert).await?;
    }
    let (verb, reason) = match current {
        Some(_) => ("renewed", "RenewedCertificate"),
        None => ("issued", "IssuedCertificate"),
    };
    let valid = humantime::format_duration(policy.validity);
    let note = format!("{verb} the server certificate in Secret {sname} (valid {valid})");
    event(ctx, pg, EventType::Normal, reason, note).await;
    Ok(State {
        within: Some(issue::next_check(end, now, policy.renew_before)),
        pending: (!first).then_some(fp),
        problem,
    })
}

/// The round's state from the metadata watch alone, when pgfleet's own
/// certificate is in place, its CA published and renewal not due: the
/// usual round, which then reads no Secret. None: read and decide.
fn not_due(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    now: SystemTime,
) -> Option<State> {
    if pg.spec.tls.is_some() || !obs.secrets.contains(&ca_secret(&owner.name)) {
        return None;
    }
    let meta = obs.server_tls.as_ref()?;
    let end = SystemTime::UNIX_EPOCH
        + Duration::from_secs(meta.not_after.as_deref()?.parse::<u64>().ok()?);
    let renew_before = ctx.tls.renew_before;
    if issue::renewal_due(Some(end), now, renew_before) {
        return None;
    }
    let fp = meta.fingerprint.clone();
    Some(State {
        within: Some(issue::next_check(end, now, renew_before)),
        pending: fp.filter(|f| meta.reloaded.as_ref() != Some(f)),
        problem: None,
    })
}

/// With `spec.tls`: `Ok` with the round's state when the tenant's
/// certificate is used (or kept while a new one is refused); otherwise
/// `Err` with why it is not (None without `spec.tls`), and pgfleet's own
/// certificate goes on.
async fn provided_state(
    pg: &PostgresCluster,
    ctx: &Ctx,
    api: &Api<Secret>,
    owner: &Owner,
    current: Option<&Secret>,
    now: SystemTime,
) -> Result<Result<State, Option<String>>, Error> {
    let Some(spec) = &pg.spec.tls else {
        return Ok(Err(None));
    };
    let pooler = pg.spec.pooler.as_ref().is_some_and(|p| p.enabled);
    let names = provided::required_names(&owner.name, &owner.namespace, pooler);
    let got = provided::read(api, spec, &names, now).await.map_err(kerr(
        "get",
        "Secret",
        &spec.server_secret,
    ))?;
    match got {
        Ok(p) => use_provided(pg, ctx, owner, current, p).await.map(Ok),
        // Keep a provided certificate the servers have; pgfleet's own goes
        // on being renewed (and is issued so a new cluster starts).
        Err(why) if current.is_some_and(|s| ann(s, ANN_NOT_AFTER).is_none()) => Ok(Ok(State {
            within: Some(PROVIDED_RECHECK),
            pending: unloaded(current),
            problem: Some(why),
        })),
        Err(why) => Ok(Err(Some(why))),
    }
}

/// The fingerprint in the server Secret when not every server loaded it.
fn unloaded(current: Option<&Secret>) -> Option<String> {
    let s = current?;
    let fp = ann(s, ANN_FINGERPRINT)?;
    (ann(s, ANN_RELOADED) != Some(fp)).then(|| fp.to_string())
}

/// Copies a checked certificate of the tenant's into the mounted Secret
/// (when it changed) and publishes its CA.
async fn use_provided(
    pg: &PostgresCluster,
    ctx: &Ctx,
    owner: &Owner,
    current: Option<&Secret>,
    p: provided::Provided,
) -> Result<State, Error> {
    let fp = issue::fingerprint(&p.pair);
    let same = current.and_then(|s| ann(s, ANN_FINGERPRINT)) == Some(fp.as_str());
    if same {
        return Ok(State {
            within: Some(PROVIDED_RECHECK),
            pending: unloaded(current),
            problem: None,
        });
    }
    apply_server(&ctx.client, owner, &p.pair, &p.ca, None, None).await?;
    publish_ca(&ctx.client, owner, &p.ca).await?;
    let note = format!(
        "the servers use the certificate of Secret {} (spec.tls); applications trust ca.crt of {}",
        pg.spec
            .tls
            .as_ref()
            .map(|t| t.server_secret.as_str())
            .unwrap_or_default(),
        ca_secret(&owner.name)
    );
    event(ctx, pg, EventType::Normal, "UsingProvidedCertificate", note).await;
    Ok(State {
        within: Some(PROVIDED_RECHECK),
        pending: Some(fp),
        problem: None,
    })
}

/// Server-side applies `<name>-ca` (the CA certificate applications trust).
async fn publish_ca(client: &kube::Client, owner: &Owner, ca: &str) -> Result<(), Error> {
    let name = ca_secret(&owner.name);
    let s = secret(owner, &name, "Opaque", &[("ca.crt", ca)]);
    ssa_with(client, &owner.namespace, "Secret", &s).await
}

/// The cluster CA: read from `<name>-ca-key`, or made and stored there.
async fn ca(
    pg: &PostgresCluster,
    ctx: &Ctx,
    api: &Api<Secret>,
    owner: &Owner,
    now: SystemTime,
    obs: &Observed,
) -> Result<issue::Pair, Error> {
    let name = ca_key_secret(&owner.name);
    // Not in the index: create first (a conflict means it exists after
    // all, and it is read then); a new cluster saves the read.
    let mut absent = !obs.secrets.contains(&name);
    for _ in 0..2 {
        let got = match std::mem::take(&mut absent) {
            true => None,
            false => api
                .get_opt(&name)
                .await
                .map_err(kerr("get", "Secret", &name))?,
        };
        if let Some(s) = got {
            return match (text(&s, "ca.crt"), text(&s, "ca.key")) {
                (Some(cert), Some(key)) => Ok(issue::Pair { cert, key }),
                _ => Err(Error::Build {
                    what: format!("Secret {name}"),
                    message: "has no ca.crt or ca.key; delete it to make a new CA (clients must then trust the new ca.crt)".into(),
                }),
            };
        }
        let pair =
            issue::ca(&owner.name, &owner.namespace, now).map_err(failed("the cluster CA"))?;
        let s = secret(
            owner,
            &name,
            "Opaque",
            &[("ca.crt", &pair.cert), ("ca.key", &pair.key)],
        );
        if create_child(&ctx.client, &owner.namespace, "Secret", &s).await? {
            event(
                ctx,
                pg,
                EventType::Normal,
                "CreatedSecret",
                format!(
                    "made the cluster CA; applications trust ca.crt from Secret {}",
                    ca_secret(&owner.name)
                ),
            )
            .await;
            return Ok(pair);
        }
    }
    Err(Error::Build {
        what: format!("Secret {name}"),
        message: "was created and deleted concurrently; trying again".into(),
    })
}

fn secret(owner: &Owner, name: &str, type_: &str, data: &[(&str, &str)]) -> Secret {
    Secret {
        metadata: owner.meta(name, &[], true),
        type_: Some(type_.into()),
        string_data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_string(), (*v).to_string()))
                .collect(),
        ),
        ..Secret::default()
    }
}

/// Server-side applies the server Secret: the pair, its end, its
/// fingerprint and, for a first certificate, the `reloaded` mark (later
/// marks are `mark_reloaded`'s).
async fn apply_server(
    client: &kube::Client,
    owner: &Owner,
    pair: &issue::Pair,
    ca: &str,
    end: Option<SystemTime>,
    reloaded: Option<&str>,
) -> Result<(), Error> {
    let name = server_secret(&owner.name);
    let mut s = secret(
        owner,
        &name,
        "kubernetes.io/tls",
        &[
            ("tls.crt", &pair.cert),
            ("tls.key", &pair.key),
            ("ca.crt", ca),
        ],
    );
    let fp = issue::fingerprint(pair);
    // No end for a provided certificate: its owner renews it.
    let mut anns = BTreeMap::from([(ANN_FINGERPRINT.to_string(), fp)]);
    if let Some(end) = end {
        let secs = end
            .duration_since(SystemTime::UNIX_EPOCH)
            .unwrap_or_default();
        anns.insert(ANN_NOT_AFTER.to_string(), secs.as_secs().to_string());
    }
    if let Some(r) = reloaded {
        anns.insert(ANN_RELOADED.to_string(), r.to_string());
    }
    s.metadata = ObjectMeta {
        annotations: Some(anns),
        ..s.metadata
    };
    ssa_with(client, &owner.namespace, "Secret", &s).await
}

/// Has every live instance and pooler load the certificate `fp`; marks it
/// loaded when all did. None when done, else when to try again.
pub async fn reload(
    pg: &PostgresCluster,
    ctx: &Ctx,
    obs: &Observed,
    owner: &Owner,
    fp: &str,
) -> Option<Duration> {
    let ns = &owner.namespace;
    let mut failures = vec![];
    for p in obs
        .pods
        .values()
        .filter(|p| !p.deleting && p.waiting.is_none())
    {
        let r = crate::postgres::exec::run_verb(
            &ctx.client,
            ns,
            &p.name,
            &["reload-tls", fp],
            Duration::from_secs(150),
        )
        .await;
        if let Err(e) = r {
            failures.push(format!("{}: {e}", p.name));
        }
    }
    for p in obs
        .pooler_pods
        .values()
        .filter(|p| !p.deleting && p.waiting.is_none())
    {
        let argv = super::pooler::reload_tls_command(fp);
        let r = crate::postgres::exec::run_command(
            &ctx.client,
            ns,
            &p.name,
            "pgbouncer",
            argv,
            "pgbouncer RELOAD",
            Duration::from_secs(150),
        )
        .await;
        if let Err(e) = r {
            failures.push(format!("{}: {e}", p.name));
        }
    }
    if failures.is_empty() {
        match mark_reloaded(ctx, owner, fp).await {
            Ok(()) => return None,
            Err(e) => failures.push(e.to_string()),
        }
    }
    event(
        ctx,
        pg,
        EventType::Warning,
        "CertificateReloadFailed",
        format!(
            "the renewed server certificate is not loaded everywhere yet: {}",
            failures.join("; ")
        ),
    )
    .await;
    Some(Duration::from_secs(5))
}

/// Records that the running servers have loaded `fp`: one merge patch of
/// the mark alone, no read. Safe whatever the Secret holds by now: the
/// mark names the fingerprint that was loaded, and a newer certificate
/// (another fingerprint) still reads as not loaded (`unloaded`).
async fn mark_reloaded(ctx: &Ctx, owner: &Owner, fp: &str) -> Result<(), Error> {
    let api = Api::<Secret>::namespaced(ctx.client.clone(), &owner.namespace);
    let name = server_secret(&owner.name);
    let patch = serde_json::json!({"metadata": {"annotations": {ANN_RELOADED: fp}}});
    match api
        .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
    {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(e)) if e.code == 404 => Ok(()),
        Err(e) => Err(kerr("patch", "Secret", &name)(e)),
    }
}
