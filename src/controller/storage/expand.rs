//! Volume expansion, pure: given the size every instance claim should have
//! and the claims as observed, which claim to raise now and what the
//! status says.
//!
//! - **One claim at a time**: the next claim is raised only once every
//!   claim's capacity has reached its request (a real resize goes through
//!   the CSI driver and then the node, and a failing driver should stop the
//!   rollout at one volume, not all of them). The primary goes first: it
//!   is the one writing, so it fills first.
//! - **Never shrink**: a claim bigger than the target is left alone
//!   (Kubernetes refuses a smaller request anyway, and data does not fit a
//!   smaller volume); the `VolumeShrinkRefused` condition names both sizes.
//! - **A class that cannot expand** is found out by the API server's answer
//!   (the manager has no read access to StorageClasses): the condition
//!   `VolumeExpansionUnsupported` is kept and the patch is not sent again
//!   for the same size before [`UNSUPPORTED_RETRY`] has passed, so an
//!   administrator who enables `allowVolumeExpansion` is noticed without
//!   the manager hammering the API meanwhile.

use super::quantity::format;
use crate::crd::storage::ClaimStatus;
use std::time::Duration;

/// How long a refused expansion waits before it is tried again.
pub const UNSUPPORTED_RETRY: Duration = Duration::from_secs(300);

/// One instance claim, sizes in bytes.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Claim {
    pub name: String,
    pub request: Option<u64>,
    pub capacity: Option<u64>,
    /// `FileSystemResizePending`: the node has yet to grow it.
    pub fs_pending: bool,
}

/// A condition: (type, reason, message).
pub type Notice = (&'static str, &'static str, String);

/// What to do this round.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Expansion {
    /// The claim to raise now, and to how many bytes.
    pub patch: Option<(String, u64)>,
    /// Conditions to show (none when every claim has the target size).
    pub notices: Vec<Notice>,
    pub claims: Vec<ClaimStatus>,
    /// A claim is being resized: look again soon.
    pub in_progress: bool,
}

fn state(c: &Claim) -> &'static str {
    match (c.request, c.capacity) {
        (Some(r), Some(cap)) if cap >= r => "Bound",
        // Not bound yet (e.g. `WaitForFirstConsumer` before its Pod is
        // scheduled): nothing is resizing, and it cannot be resized.
        (_, None) => "Pending",
        _ if c.fs_pending => "FileSystemResizePending",
        _ => "Resizing",
    }
}

/// The plan for `claims` (primary first) towards `target` bytes;
/// `refused`: the API server refused this very size within
/// [`UNSUPPORTED_RETRY`] (its message, to keep showing).
pub fn plan(target: u64, claims: &[Claim], refused: Option<&str>) -> Expansion {
    let mut out = Expansion {
        claims: claims
            .iter()
            .map(|c| ClaimStatus {
                name: c.name.clone(),
                request: c.request.map(format),
                capacity: c.capacity.map(format),
                state: state(c).into(),
            })
            .collect(),
        ..Expansion::default()
    };
    let bigger: Vec<String> = claims
        .iter()
        .filter(|c| c.request.is_some_and(|r| r > target))
        .map(|c| format!("{} ({})", c.name, format(c.request.unwrap_or(0))))
        .collect();
    if !bigger.is_empty() {
        let msg = format!(
            "spec.storage.size {} is smaller than the claims of {}: volumes cannot shrink, nothing was changed",
            format(target),
            bigger.join(", ")
        );
        out.notices
            .push(("VolumeShrinkRefused", "ShrinkRefused", msg));
    }
    let resizing: Vec<String> = claims
        .iter()
        .filter(|c| !matches!(state(c), "Bound" | "Pending"))
        .map(|c| {
            format!(
                "{} {} → {} ({})",
                c.name,
                c.capacity.map(format).unwrap_or_else(|| "?".into()),
                c.request.map(format).unwrap_or_else(|| "?".into()),
                state(c)
            )
        })
        .collect();
    let next = claims
        .iter()
        .find(|c| c.capacity.is_some() && c.request.is_some_and(|r| r < target));
    if !resizing.is_empty() {
        out.in_progress = true;
        out.notices
            .push(("VolumeResizing", "Resizing", resizing.join("; ")));
        return out;
    }
    let Some(next) = next else {
        return out;
    };
    if let Some(why) = refused {
        out.notices.push((
            "VolumeExpansionUnsupported",
            "StorageClassCannotExpand",
            why.to_string(),
        ));
        return out;
    }
    out.in_progress = true;
    let msg = format!(
        "{} {} → {}",
        next.name,
        format(next.request.unwrap_or(0)),
        format(target)
    );
    out.notices.push(("VolumeResizing", "Resizing", msg));
    out.patch = Some((next.name.clone(), target));
    out
}

/// Whether an earlier refusal still holds: the condition names the same
/// size and the refusal is `age` old, less than [`UNSUPPORTED_RETRY`] (the
/// condition's transition time cannot say: it stays while the refusals
/// go on).
pub fn still_refused(message: &str, age: Duration, target: u64) -> bool {
    let size = format!(" to {} ", format(target));
    message.contains(&size) && age < UNSUPPORTED_RETRY
}

/// The condition message for a refused expansion (parsed back by
/// [`still_refused`]: it names the size).
pub fn refused_message(claim: &str, target: u64, why: &str) -> String {
    format!(
        "the StorageClass of {claim} does not allow expansion: raising it to {} was refused ({why}); nothing was changed",
        format(target)
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    const GI: u64 = 1 << 30;

    fn claim(name: &str, req: u64, cap: u64, pending: bool) -> Claim {
        Claim {
            name: name.into(),
            request: Some(req),
            capacity: Some(cap),
            fs_pending: pending,
        }
    }

    #[test]
    fn claims_grow_one_at_a_time_primary_first() {
        let claims = [claim("pg-2", GI, GI, false), claim("pg-1", GI, GI, false)];
        let p = plan(2 * GI, &claims, None);
        assert_eq!(p.patch, Some(("pg-2".into(), 2 * GI)));
        assert!(p.in_progress);
        // pg-2 on its way: nothing else is patched until it is done.
        let claims = [
            claim("pg-2", 2 * GI, GI, true),
            claim("pg-1", GI, GI, false),
        ];
        let p = plan(2 * GI, &claims, None);
        assert_eq!(p.patch, None);
        assert_eq!(p.claims[0].state, "FileSystemResizePending");
        assert!(
            p.notices[0]
                .2
                .contains("pg-2 1Gi → 2Gi (FileSystemResizePending)")
        );
        let claims = [
            claim("pg-2", 2 * GI, 2 * GI, false),
            claim("pg-1", GI, GI, false),
        ];
        assert_eq!(
            plan(2 * GI, &claims, None).patch,
            Some(("pg-1".into(), 2 * GI))
        );
        let done = [
            claim("pg-2", 2 * GI, 2 * GI, false),
            claim("pg-1", 2 * GI, 2 * GI, false),
        ];
        let p = plan(2 * GI, &done, None);
        assert_eq!((p.patch, p.notices.len(), p.in_progress), (None, 0, false));
        // An unbound claim is neither resizing nor resized.
        let unbound = Claim {
            capacity: None,
            ..claim("pg-3", GI, 0, false)
        };
        let p = plan(GI, std::slice::from_ref(&unbound), None);
        assert_eq!(
            (p.claims[0].state.as_str(), p.in_progress),
            ("Pending", false)
        );
        assert_eq!(plan(2 * GI, &[unbound], None).patch, None);
    }

    #[test]
    fn a_shrink_is_refused_naming_both_sizes_and_touches_nothing() {
        let claims = [claim("pg-1", 2 * GI, 2 * GI, false)];
        let p = plan(GI, &claims, None);
        assert_eq!(p.patch, None);
        assert_eq!(p.notices[0].0, "VolumeShrinkRefused");
        assert!(
            p.notices[0]
                .2
                .contains("1Gi is smaller than the claims of pg-1 (2Gi)")
        );
    }

    #[test]
    fn a_refusal_is_kept_for_a_while_for_the_same_size() {
        let claims = [claim("pg-1", GI, GI, false)];
        let msg = refused_message("pg-1", 2 * GI, "forbidden");
        let p = plan(2 * GI, &claims, Some(&msg));
        assert_eq!(p.patch, None);
        assert_eq!(p.notices[0].0, "VolumeExpansionUnsupported");
        let min = |m: u64| Duration::from_secs(60 * m);
        assert!(still_refused(&msg, min(4), 2 * GI));
        assert!(!still_refused(&msg, min(6), 2 * GI));
        assert!(!still_refused(&msg, min(1), 3 * GI));
    }
}
