//! Semantic checks for the fleet operations: `[backups]` and `[rollouts]`.

use std::collections::BTreeMap;

use super::bounds;
use super::error::{Seg, format_path};
use super::selector::is_dns_label;
use super::validate::{Checker, at, idx, is_bucket_name, is_http_url};
use super::{Backups, Rollout};

impl Checker {
    pub(super) fn backups(&mut self, b: &Backups) {
        let base = [Seg::key("backups")];
        self.checked(at(&base, "default_schedule"), &b.default_schedule);
        self.duration(at(&base, "window"), &b.window, bounds::BACKUP_WINDOW);
        self.duration(
            at(&base, "start_deadline"),
            &b.start_deadline,
            bounds::BACKUP_START_DEADLINE,
        );
        self.at_least_one(at(&base, "max_concurrent"), b.max_concurrent);
        self.at_least_one(
            at(&base, "max_concurrent_per_cluster"),
            b.max_concurrent_per_cluster,
        );
        if let Some(n) = b.max_concurrent_per_repository {
            self.at_least_one(at(&base, "max_concurrent_per_repository"), n);
        }
        let ret = at(&base, "retention");
        if b.retention.count == Some(0) {
            self.err(
                at(&ret, "count"),
                "must be at least 1 (leave it out for no count limit)",
            );
        }
        if let Some(age) = &b.retention.age {
            self.duration(at(&ret, "age"), age, bounds::RETENTION_AGE);
        }
        if let Some(repo) = &b.repository {
            let rbase = at(&base, "repository");
            match (&repo.s3, &repo.filesystem) {
                (Some(_), Some(_)) => {
                    self.err(rbase.clone(), "set either s3 or filesystem, not both")
                }
                (None, None) => self.err(
                    rbase.clone(),
                    "needs s3 = { … } or filesystem = { path = … }",
                ),
                _ => {}
            }
            if let Some(s3) = &repo.s3 {
                let sb = at(&rbase, "s3");
                if s3.bucket.is_empty() {
                    self.err(at(&sb, "bucket"), "is required");
                } else if !is_bucket_name(&s3.bucket) {
                    self.err(
                        at(&sb, "bucket"),
                        format!("{:?} is not a valid bucket name (3-63 lowercase letters, digits, '.', '-')", s3.bucket),
                    );
                }
                if s3.endpoint.is_empty() {
                    self.err(at(&sb, "endpoint"), "is required");
                } else if !is_http_url(&s3.endpoint) || !s3.endpoint.starts_with("https://") {
                    self.err(
                        at(&sb, "endpoint"),
                        "must be an https:// URL (pgBackRest talks to S3 over TLS only)",
                    );
                }
                if s3.region.trim().is_empty() {
                    self.err(at(&sb, "region"), "is required");
                }
                self.checked(at(&sb, "uri_style"), &s3.uri_style);
                if let Some(secret) = &s3.credentials_secret
                    && !secret.split('.').all(is_dns_label)
                {
                    self.err(
                        at(&sb, "credentials_secret"),
                        "must be a Kubernetes Secret name",
                    );
                }
            }
            if let Some(fs) = &repo.filesystem
                && fs.path.as_os_str().is_empty()
            {
                self.err(at(&at(&rbase, "filesystem"), "path"), "is required");
            }
        }
        for (i, o) in b.overrides.iter().enumerate() {
            let ob = idx(&base, "overrides", i);
            self.checked(at(&ob, "selector"), &o.selector);
            self.checked(at(&ob, "schedule"), &o.schedule);
        }
        let db = at(&base, "drills");
        self.opt_checked(at(&db, "schedule"), b.drills.schedule.as_ref());
        self.opt_checked(at(&db, "selector"), b.drills.selector.as_ref());
        if b.drills.query.trim().is_empty() {
            self.err(at(&db, "query"), "must not be empty");
        }
    }

    pub(super) fn rollout(
        &mut self,
        name: &str,
        r: &Rollout,
        sets: &BTreeMap<String, super::roles::RoleSet>,
    ) {
        let base = vec![Seg::key("rollouts"), Seg::key(name)];
        if !is_dns_label(name) {
            self.err(
                base.clone(),
                format!("rollout name {name:?} must be a DNS-1123 label (lowercase letters, digits and '-')"),
            );
        }
        self.rollout_target(&base, r, sets);
        self.checked(at(&base, "on_failure"), &r.on_failure);
        self.opt_checked(at(&base, "method"), r.method.as_ref());
        self.duration(
            at(&base, "progress_deadline"),
            &r.progress_deadline,
            bounds::PROGRESS_DEADLINE,
        );
        self.checked(at(&base, "unreachable"), &r.unreachable);
        if r.stages.is_empty() {
            self.err(
                at(&base, "stages"),
                format!("needs at least one [[rollouts.{name}.stages]] entry"),
            );
        }
        let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
        for (i, s) in r.stages.iter().enumerate() {
            let sb = idx(&base, "stages", i);
            self.name(at(&sb, "name"), &s.name, "stage");
            if !s.name.is_empty() {
                if let Some(first) = seen.get(s.name.as_str()) {
                    let path = format_path(&idx(&base, "stages", *first));
                    self.err(
                        at(&sb, "name"),
                        format!("duplicate stage name {:?} (also {path})", s.name),
                    );
                } else {
                    seen.insert(&s.name, i);
                }
            }
            match &s.clusters {
                None => self.err(
                    at(&sb, "clusters"),
                    "is required (a label selector over member-cluster labels; \"\" selects all)",
                ),
                Some(sel) => self.checked(at(&sb, "clusters"), sel),
            }
            self.opt_checked(at(&sb, "postgresclusters"), s.postgresclusters.as_ref());
            self.checked(at(&sb, "max_concurrency"), &s.max_concurrency);
            self.duration(at(&sb, "soak"), &s.soak, bounds::SOAK);
        }
    }

    /// A rollout moves either a version or a role set's password
    /// generation, never both.
    fn rollout_target(
        &mut self,
        base: &[Seg],
        r: &Rollout,
        sets: &BTreeMap<String, super::roles::RoleSet>,
    ) {
        let Some(set) = &r.role_set else {
            self.checked(at(base, "target_version"), &r.target_version);
            if r.generation.is_some() {
                self.err(at(base, "generation"), "is only meaningful with role_set");
            }
            return;
        };
        if !r.target_version.is_missing() {
            self.err(
                at(base, "target_version"),
                "a rollout has either target_version or role_set, not both",
            );
        }
        if !sets.contains_key(set) {
            self.err(
                at(base, "role_set"),
                format!("names no [roles.<set>] section ({set:?})"),
            );
        }
        match r.generation {
            None => self.err(
                at(base, "generation"),
                "is required with role_set (the password generation to reach, at least 1)",
            ),
            Some(0) => self.err(at(base, "generation"), "must be at least 1"),
            Some(_) => {}
        }
    }
}
