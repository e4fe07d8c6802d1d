//! One access round on the primary: the app Secret, the catalog, the
//! plans, the statements, the status. Failures are reported, not
//! returned (see the module above).

use super::app_secret::{self, AppLogin};
use super::status;
use crate::controller::Ctx;
use crate::crd::PostgresCluster;
use crate::crd::access::{
    AccessStatus, DatabaseSpec, DatabaseStatus, Ensure, InitdbSpec, RoleSpec, RoleStatus,
};
use crate::postgres::catalog::Catalog;
use crate::postgres::databases::{self, CreateOptions, DatabasePlan};
use crate::postgres::exec::{run_verb, run_verb_stdin};
use crate::postgres::roles::{self, Action, RolePlan, Stmt};
use crate::postgres::sql::{self, name_refusal, password_fingerprint};
use k8s_openapi::api::core::v1::Secret;
use kube::{Api, ResourceExt};
use std::time::Duration;

const EXEC_TIMEOUT: Duration = Duration::from_secs(30);

/// A role to manage and the password its Secret holds (or why not).
struct Wanted {
    spec: RoleSpec,
    password: Result<Option<String>, String>,
    /// The fleet role set declaring it (`None`: the spec).
    set: Option<String>,
    /// The fleet role's password generation.
    generation: Option<u64>,
    /// The fleet role's generation applied before this round: still the
    /// one in place when this round cannot apply `generation`.
    previous: Option<u64>,
}

/// How a round went.
pub(super) enum Outcome {
    Checked,
    /// The primary's catalog could not be read (reported in the status).
    Unreadable,
    /// The virtual runtime: no SQL, nothing to check again.
    Emulated,
}

/// Runs one round; `legacy` is the cluster's `legacySuperuserAccess`
/// (marked this round for a cluster without an access status yet). Also
/// returns the access status when it changed, for the round's status write.
pub(super) async fn run(
    pg: &PostgresCluster,
    ctx: &Ctx,
    primary: &str,
    legacy: bool,
    app_rv: Option<&str>,
) -> (Outcome, Option<AccessStatus>) {
    let ns = pg.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    let mut st = AccessStatus {
        observed_generation: pg.metadata.generation,
        primary: Some(primary.to_string()),
        legacy_superuser_access: legacy,
        ..Default::default()
    };
    let app = match app_login(pg, ctx, &secrets, app_rv).await {
        Ok(a) => Some(a),
        Err(msg) => {
            st.conditions
                .push(status::cond(pg, "AppDatabaseReady", false, "Invalid", msg));
            None
        }
    };
    let (wanted, conflicts) = merge_fleet(
        wanted_roles(pg, app.as_ref(), &secrets).await,
        super::fleet::roles_for(pg, &ctx.client, &ctx.role_sets).await,
    );
    let dbs = wanted_databases(pg, app.as_ref());
    let names: Vec<&str> = dbs
        .iter()
        .filter(|(d, _)| d.ensure == Ensure::Present && name_refusal(&d.name).is_none())
        .map(|(d, _)| d.name.as_str())
        .collect();
    // With a pooler, its lookup is checked in `postgres` too.
    let inspect = super::pooler::served(pg, &names);
    let catalog = match checked_catalog(pg, ctx, &ns, primary, &inspect, &mut st).await {
        Ok(c) => c,
        Err(outcome) => return (outcome, status::changed(pg, st)),
    };
    if let Err(msg) = super::superuser::ensure(pg, ctx, &secrets, primary, &catalog).await {
        st.conditions.push(status::cond(
            pg,
            "SuperuserPasswordSet",
            false,
            "Failed",
            msg,
        ));
    }
    let role_plans: Vec<(RolePlan, &Wanted)> = wanted
        .iter()
        .map(|w| {
            let pw = w.password.as_ref().ok().and_then(|p| p.as_deref());
            (roles::plan(&w.spec, pw, &catalog), w)
        })
        .collect();
    let db_plans: Vec<DatabasePlan> = dbs
        .iter()
        .map(|(d, o)| databases::plan(d, o, &catalog))
        .collect();
    let outcome = apply_all(pg, ctx, &ns, primary, &role_plans, &db_plans).await;
    // After the databases: the lookup goes into those just created.
    st.conditions
        .extend(super::pooler::ensure(pg, ctx, &secrets, primary, &catalog, &names).await);
    st.roles = role_plans
        .iter()
        .map(|(p, w)| role_status(p, w, outcome.role_error(&p.name)))
        .chain(conflicts)
        .collect();
    st.databases = db_plans
        .iter()
        .zip(&dbs)
        .map(|(p, (d, _))| db_status(p, d.ensure, outcome.db_error(&p.name)))
        .collect();
    (Outcome::Checked, status::conclude(pg, app.as_ref(), st))
}

/// The primary's catalog, or the outcome of a round that stops here (the
/// virtual runtime, an unreadable catalog) with its condition in `st`.
async fn checked_catalog(
    pg: &PostgresCluster,
    ctx: &Ctx,
    ns: &str,
    primary: &str,
    names: &[&str],
    st: &mut AccessStatus,
) -> Result<Catalog, Outcome> {
    match read_catalog(ctx, ns, primary, names).await {
        Ok(c) if c.emulated => {
            let msg = "the virtual runtime runs no SQL; roles and databases are not managed".into();
            st.conditions
                .push(status::cond(pg, "RolesReconciled", true, "Emulated", msg));
            Err(Outcome::Emulated)
        }
        Ok(c) => Ok(c),
        Err(msg) => {
            st.conditions.push(status::cond(
                pg,
                "RolesReconciled",
                false,
                "CatalogUnreadable",
                msg,
            ));
            // What was last seen stays (with the fleet generations that
            // pin clusters no rollout has moved yet).
            st.roles = previous_roles(pg);
            Err(Outcome::Unreadable)
        }
    }
}

/// The application owner's login: database and owner from
/// `spec.bootstrap.initdb` (defaults `app`/`app`), the password from the
/// named Secret, the existing `<name>-app` Secret, or a new one; the
/// `<name>-app` Secret is (re)written when any key differs. `app_rv`: its
/// resourceVersion as the Secret watch shows it (the early write's answer
/// is used instead of a read while it is that version).
async fn app_login(
    pg: &PostgresCluster,
    ctx: &Ctx,
    secrets: &Api<Secret>,
    app_rv: Option<&str>,
) -> Result<AppLogin, String> {
    let known = match app_secret::take_early(&super::cluster_key(ctx, pg), app_rv) {
        Some(s) => Known::Have(s),
        None => Known::Read,
    };
    app_login_known(pg, ctx, secrets, known).await
}

/// A brand-new cluster's `<name>-app` Secret, written before its first
/// instance starts (as CloudNativePG does), so an application deployed with
/// the cluster can mount it at once; its Event joins the round's `Created`.
/// Only when nothing can have read a Secret of that name: no instance, no
/// claim, none in the child index, the password generated (not from
/// `spec.bootstrap.initdb.secret`). Were the index behind, the Secret is
/// applied again with a new password before any server or role used it —
/// the same reasoning as the first server certificate (`tls::ensure`).
/// The access round on the ready primary takes what this write returned
/// (`app_secret::take_early`) or reads it.
pub(super) async fn early_app_secret(pg: &PostgresCluster, ctx: &Ctx) {
    if initdb(pg).secret.is_some() {
        return;
    }
    let ns = pg.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(ctx.client.clone(), &ns);
    if let Err(e) = app_login_known(pg, ctx, &secrets, Known::Absent).await {
        // The access round reports it (condition AppDatabaseReady).
        tracing::debug!(error = %e, "could not write the app Secret early");
    }
}

/// What is known of `<name>-app` before [`app_login_known`] runs.
enum Known {
    /// It does not exist (a brand-new cluster): nothing to read.
    Absent,
    /// Unknown: read it.
    Read,
    /// As the early write returned it, still the current version.
    Have(app_secret::Early),
}

async fn app_login_known(
    pg: &PostgresCluster,
    ctx: &Ctx,
    secrets: &Api<Secret>,
    known: Known,
) -> Result<AppLogin, String> {
    let init = initdb(pg);
    let dbname = init.database.clone().unwrap_or_else(|| "app".into());
    let username = init.owner.clone().unwrap_or_else(|| "app".into());
    if let Some(r) = name_refusal(&username).or(sql::reserved_role(&username).map(String::from)) {
        return Err(format!("spec.bootstrap.initdb.owner {username:?} {r}"));
    }
    if let Some(r) = name_refusal(&dbname).or(sql::reserved_database(&dbname).map(String::from)) {
        return Err(format!("spec.bootstrap.initdb.database {dbname:?} {r}"));
    }
    let cluster = pg.name_any();
    let early = matches!(known, Known::Absent);
    // The existing Secret's password and fingerprint.
    let (stored, existing) = match known {
        Known::Absent => (None, None),
        Known::Have(e) => (Some(e.password), Some(e.fingerprint)),
        Known::Read => match get(secrets, &app_secret::name(&cluster)).await? {
            Some(s) => (
                app_secret::key(&s, "password"),
                Some(app_secret::fingerprint(&s)),
            ),
            None => (None, None),
        },
    };
    let password = match &init.secret {
        Some(s) => secret_password(secrets, s, &username, "spec.bootstrap.initdb.secret").await?,
        None => stored
            .filter(|p| !p.is_empty())
            .unwrap_or_else(sql::random_password),
    };
    let login = AppLogin {
        cluster,
        namespace: pg.namespace().unwrap_or_default(),
        username,
        password,
        dbname,
        pooler: pg.spec.pooler.as_ref().is_some_and(|p| p.enabled),
    };
    match app_secret::ensure(&ctx.client, pg, &login, existing).await {
        Ok(Some(written)) => {
            if early {
                app_secret::keep_early(
                    super::cluster_key(ctx, pg),
                    &written,
                    login.password.clone(),
                );
            }
            let note = format!(
                "application credentials in Secret {}",
                app_secret::name(&login.cluster)
            );
            status::event(ctx, pg, "AppSecretWritten", note).await;
        }
        Ok(None) => {}
        Err(e) => return Err(e.to_string()),
    }
    Ok(login)
}

fn initdb(pg: &PostgresCluster) -> InitdbSpec {
    pg.spec
        .bootstrap
        .as_ref()
        .and_then(|b| b.initdb.clone())
        .unwrap_or_default()
}

async fn get(secrets: &Api<Secret>, name: &str) -> Result<Option<Secret>, String> {
    secrets
        .get_opt(name)
        .await
        .map_err(|e| format!("could not read Secret {name}: {e}"))
}

/// The `password` of Secret `name`, whose `username` (when present) must
/// be `role`: a Secret meant for another role is not used by mistake.
async fn secret_password(
    secrets: &Api<Secret>,
    name: &str,
    role: &str,
    field: &str,
) -> Result<String, String> {
    let s = get(secrets, name)
        .await?
        .ok_or_else(|| format!("{field}: Secret {name} does not exist"))?;
    if let Some(u) = app_secret::key(&s, "username")
        && u != role
    {
        return Err(format!(
            "{field}: Secret {name} is for user {u:?}, not {role:?}"
        ));
    }
    match app_secret::key(&s, "password") {
        Some(p) if !p.is_empty() && !p.contains(['\n', '\r', '\0']) => Ok(p),
        _ => Err(format!(
            "{field}: Secret {name} has no usable key \"password\" (one line, not empty)"
        )),
    }
}

/// The application owner first, then `spec.roles` (a spec entry for the
/// owner replaces the default one; a name declared twice is refused).
async fn wanted_roles(
    pg: &PostgresCluster,
    app: Option<&AppLogin>,
    secrets: &Api<Secret>,
) -> Vec<Wanted> {
    let mut out: Vec<Wanted> = vec![];
    let dup = roles::duplicates(&pg.spec.roles);
    for (i, spec) in pg.spec.roles.iter().enumerate() {
        if dup.contains(&spec.name) && out.iter().any(|w| w.spec.name == spec.name) {
            continue;
        }
        let field = format!("spec.roles[{i}].passwordSecret");
        let password = match (&spec.password_secret, app) {
            (Some(s), _) => secret_password(secrets, s, &spec.name, &field)
                .await
                .map(Some),
            (None, Some(a)) if a.username == spec.name => Ok(Some(a.password.clone())),
            (None, _) => Ok(None),
        };
        out.push(Wanted {
            spec: spec.clone(),
            password,
            set: None,
            generation: None,
            previous: None,
        });
    }
    if let Some(a) = app
        && !out.iter().any(|w| w.spec.name == a.username)
    {
        let spec = RoleSpec {
            name: a.username.clone(),
            login: true,
            inherit: true,
            connection_limit: -1,
            ..Default::default()
        };
        out.insert(
            0,
            Wanted {
                spec,
                password: Ok(Some(a.password.clone())),
                set: None,
                generation: None,
                previous: None,
            },
        );
    }
    out
}

/// The spec's roles without those a fleet role set declares (reported as
/// refused, see `fleet`), then the fleet roles.
fn merge_fleet(
    spec: Vec<Wanted>,
    fleet: Vec<super::fleet::FleetRole>,
) -> (Vec<Wanted>, Vec<RoleStatus>) {
    let mut conflicts = vec![];
    let mut out: Vec<Wanted> = vec![];
    for w in spec {
        match fleet.iter().find(|f| f.spec.name == w.spec.name) {
            Some(f) => conflicts.push(super::fleet::conflict(&w.spec.name, &f.set)),
            None => out.push(w),
        }
    }
    for f in fleet {
        if out.iter().any(|w| w.spec.name == f.spec.name) {
            continue; // two sets declaring one role: the first (by name) wins
        }
        let (generation, password) = match f.password {
            Ok((g, p)) => (Some(g), Ok(Some(p))),
            Err(e) => (None, Err(e)),
        };
        out.push(Wanted {
            spec: f.spec,
            password,
            set: Some(f.set),
            generation,
            previous: f.applied,
        });
    }
    (out, conflicts)
}

fn previous_roles(pg: &PostgresCluster) -> Vec<RoleStatus> {
    pg.status
        .as_ref()
        .and_then(|s| s.access.as_ref())
        .map(|a| a.roles.clone())
        .unwrap_or_default()
}

/// The application database first, then `spec.databases` (an entry for the
/// same name replaces the default).
fn wanted_databases(
    pg: &PostgresCluster,
    app: Option<&AppLogin>,
) -> Vec<(DatabaseSpec, CreateOptions)> {
    let mut out: Vec<(DatabaseSpec, CreateOptions)> = vec![];
    if let Some(a) = app
        && !pg.spec.databases.iter().any(|d| d.name == a.dbname)
    {
        let init = initdb(pg);
        let spec = DatabaseSpec {
            name: a.dbname.clone(),
            owner: Some(a.username.clone()),
            ..Default::default()
        };
        let opts = CreateOptions {
            encoding: init.encoding,
            locale: init.locale,
        };
        out.push((spec, opts));
    }
    for d in &pg.spec.databases {
        if !out.iter().any(|(o, _)| o.name == d.name) {
            out.push((d.clone(), CreateOptions::default()));
        }
    }
    out
}

async fn read_catalog(ctx: &Ctx, ns: &str, pod: &str, dbs: &[&str]) -> Result<Catalog, String> {
    let mut verb = vec!["catalog"];
    verb.extend_from_slice(dbs);
    let out = run_verb(&ctx.client, ns, pod, &verb, EXEC_TIMEOUT)
        .await
        .map_err(|e| format!("could not read the catalog of {pod}: {e}"))?;
    Catalog::parse(&out)
}

/// Errors of the plans that failed, by name.
#[derive(Default)]
struct Failures {
    roles: Vec<(String, String)>,
    dbs: Vec<(String, String)>,
}

impl Failures {
    fn role_error(&self, n: &str) -> Option<&str> {
        self.roles
            .iter()
            .find(|(r, _)| r == n)
            .map(|(_, e)| e.as_str())
    }
    fn db_error(&self, n: &str) -> Option<&str> {
        self.dbs
            .iter()
            .find(|(r, _)| r == n)
            .map(|(_, e)| e.as_str())
    }
}

/// Role creations and changes, then databases (their owners exist by
/// then), then role drops (a role is dropped after the databases it owned).
async fn apply_all(
    pg: &PostgresCluster,
    ctx: &Ctx,
    ns: &str,
    pod: &str,
    role_plans: &[(RolePlan, &Wanted)],
    db_plans: &[DatabasePlan],
) -> Failures {
    let mut out = Failures::default();
    let (drops, others): (Vec<_>, Vec<_>) = role_plans
        .iter()
        .partition(|(p, _)| p.action == Action::Drop);
    for (p, _) in others {
        if let Err(e) = apply(ctx, ns, pod, &p.stmts).await {
            out.roles.push((p.name.clone(), e));
        }
        status::role_event(ctx, pg, p, out.role_error(&p.name)).await;
    }
    for p in db_plans {
        if let Err(e) = apply(ctx, ns, pod, &p.stmts).await {
            out.dbs.push((p.name.clone(), e));
        }
        status::db_event(ctx, pg, p, out.db_error(&p.name)).await;
    }
    for (p, _) in drops {
        if let Err(e) = apply(ctx, ns, pod, &p.stmts).await {
            out.roles.push((p.name.clone(), e));
        }
        status::role_event(ctx, pg, p, out.role_error(&p.name)).await;
    }
    out
}

/// Runs statements in order, one `apply-sql` per run of statements in the
/// same database.
pub(super) async fn apply(ctx: &Ctx, ns: &str, pod: &str, stmts: &[Stmt]) -> Result<(), String> {
    let mut i = 0;
    while i < stmts.len() {
        let db = stmts[i].db.clone();
        let mut script = String::new();
        while i < stmts.len() && stmts[i].db == db {
            script.push_str(&stmts[i].sql);
            script.push_str(";\n");
            i += 1;
        }
        let db = db.unwrap_or_else(|| "postgres".into());
        run_verb_stdin(
            &ctx.client,
            ns,
            pod,
            &["apply-sql", "--db", &db],
            script,
            EXEC_TIMEOUT,
        )
        .await
        .map_err(|e| e.to_string())?;
    }
    Ok(())
}

fn role_status(p: &RolePlan, w: &Wanted, error: Option<&str>) -> RoleStatus {
    let (state, message) = match (&w.password, error, &p.refusal) {
        (_, _, Some(r)) => ("refused", Some(r.clone())),
        (Err(e), _, _) => ("failed", Some(e.clone())),
        (_, Some(e), _) => ("failed", Some(e.to_string())),
        _ => (p.action.state(w.spec.ensure), None),
    };
    let password_hash = match (&w.password, w.spec.ensure) {
        (Ok(Some(pw)), Ensure::Present) => Some(password_fingerprint(&p.name, pw)),
        _ => None,
    };
    let source = match &w.set {
        Some(set) => format!("fleet:{set}"),
        None => "spec".into(),
    };
    RoleStatus {
        name: p.name.clone(),
        state: state.into(),
        source: Some(source),
        // Only once applied: a rollout counts a cluster as moved when it is.
        generation: match state {
            "failed" | "refused" => w.previous,
            _ => w.generation,
        },
        drift: p.drift.clone(),
        password_hash,
        message,
    }
}

fn db_status(p: &DatabasePlan, ensure: Ensure, error: Option<&str>) -> DatabaseStatus {
    let (state, message) = match (error, &p.refusal) {
        (_, Some(r)) => ("refused", Some(r.clone())),
        (Some(e), _) => ("failed", Some(e.to_string())),
        (None, None) if !p.unavailable.is_empty() => (
            "failed",
            Some(format!(
                "extensions not available in the image: {}",
                p.unavailable.join(", ")
            )),
        ),
        (None, None) => (p.action.state(ensure), None),
    };
    DatabaseStatus {
        name: p.name.clone(),
        state: state.into(),
        message,
    }
}
