//! The dispatcher's side work in each round, next to the backups: asking
//! every primary how WAL archiving goes (the live RPO), and restore drills.

use super::{Dispatcher, Pgc};
use crate::backup::run;
use crate::platform::labels::DRILL_OF;
use chrono::{DateTime, Utc};
use kube::ResourceExt;

impl Dispatcher {
    /// Asks each primary how archiving goes (at most every
    /// `archive_interval`); creates the stanza the first time.
    pub(super) async fn check_archiving(&self, pgcs: &[Pgc], now: DateTime<Utc>) {
        for p in pgcs {
            let st = p.pg.status.clone().unwrap_or_default();
            let Some(primary) = st.current_primary.clone() else {
                continue;
            };
            if p.pg.labels().contains_key(DRILL_OF) {
                continue;
            }
            if st.phase != Some(crate::crd::Phase::Healthy)
                && st.phase != Some(crate::crd::Phase::Updating)
            {
                continue;
            }
            let key = p.key();
            let due = {
                let checked = self
                    .archive_checked
                    .lock()
                    .unwrap_or_else(|e| e.into_inner());
                checked.get(&key).is_none_or(|t| {
                    (now - *t).to_std().unwrap_or_default() >= self.archive_interval
                })
            };
            if !due {
                continue;
            }
            self.archive_checked
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .insert(key, now);
            // In the background, and never next to a backup of the same
            // cluster (pgBackRest holds one lock per stanza): skipped when
            // the cluster is busy, tried again next interval.
            let Ok(guard) = self.cluster_lock(&p.key()).try_lock_owned() else {
                continue;
            };
            // The stanza is (re)created until archiving works.
            let init = st
                .archive
                .as_ref()
                .is_none_or(|a| a.failing || a.last_archived_at.is_none());
            let (member, pg) = (p.member.clone(), p.pg.clone());
            tokio::spawn(async move {
                run::check_archive(&member, &pg, &primary, init, now).await;
                drop(guard);
            });
        }
    }

    /// Finishes drills in flight and starts due ones (one per cluster).
    pub(super) async fn drills(&self, pgcs: &[Pgc], now: DateTime<Utc>) {
        let query = &self.cfg.drills.query;
        for p in pgcs.iter().filter(|p| p.pg.labels().contains_key(DRILL_OF)) {
            crate::backup::drill::check(&p.member, &p.pg, query, now).await;
        }
        for p in pgcs {
            let st = p.pg.status.clone().unwrap_or_default();
            let busy = pgcs.iter().any(|d| {
                d.member.name == p.member.name
                    && d.pg.namespace() == p.pg.namespace()
                    && d.pg.labels().get(DRILL_OF) == Some(&p.pg.name_any())
            });
            if busy
                || p.pg.labels().contains_key(DRILL_OF)
                || st.current_primary.is_none()
                || p.pg.metadata.deletion_timestamp.is_some()
            {
                continue;
            }
            if let Err(e) = crate::backup::drill::maybe_start(
                &self.cfg.drills,
                self.cfg.window.get(),
                self.cfg.start_deadline.get(),
                &p.member,
                &p.pg,
                &p.backups,
                now,
            )
            .await
            {
                tracing::warn!(cluster = %p.key(), error = %e, "could not start a restore drill");
            }
        }
    }
}
