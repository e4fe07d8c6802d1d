//! Auto-grow, pure: from what each instance reports about its volume
//! (`pgfleet-instance usage`), whether to raise the claims and to what.
//!
//! The policy (`spec.storage.autoGrow`):
//!
//! - **Trigger**: the fullest instance volume is at least `threshold`
//!   percent used (`df`'s used / (used + available), so reserved blocks
//!   count as used as `df` shows them). The check runs every few seconds
//!   while auto-grow is on, and only while no claim is being resized: a
//!   reading taken before the file system grew would ask again.
//! - **Step**: `increment` bytes, or that percent of the current size,
//!   rounded up to whole MiB, never beyond `max`. At `max` nothing grows
//!   and `VolumeAutoGrowAtMax` says so.
//! - **WAL-aware**: when a replication slot that is not streaming keeps at
//!   least [`SLOT_SHARE`] of the volume's size in WAL, growing would only
//!   postpone the outage (the slot keeps WAL without bound), so the volume
//!   is not grown and `VolumeGrowthRefused` names the slot and the WAL it
//!   keeps; dropping the slot (or bringing its consumer back) is the fix.
//!   CloudNativePG issue #9928 asks for exactly this.
//! - **Full volumes**: a volume at 100 % (PostgreSQL PANICs, can no longer
//!   start) grows like any other — the `usage` verb needs neither a running
//!   server nor free space. Slots cannot be read from a stopped server; the
//!   storage step then keeps the slot the last reading saw (`round.rs`), so
//!   a slot that filled the volume is not "fixed" by growing it just
//!   because it can no longer be seen.

use super::quantity::{format, round_mi};

/// The share of the volume an inactive slot's WAL must reach to be the
/// cause of a full volume (a fifth: a slot that has kept that much is not
/// a consumer briefly behind; an active slot — a streaming replica — is
/// never blamed).
pub const SLOT_SHARE: f64 = 0.2;

/// `spec.storage.autoGrow`, parsed and validated.
#[derive(Debug, Clone, PartialEq)]
pub struct Policy {
    pub threshold: u32,
    pub increment: Increment,
    pub max: u64,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Increment {
    Bytes(u64),
    Percent(u32),
}

/// One instance's reading.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Reading {
    pub instance: String,
    pub used: u64,
    pub available: u64,
    /// Inactive slots and the WAL each keeps.
    pub inactive_slots: Vec<(String, u64)>,
}

impl Reading {
    fn percent(&self) -> f64 {
        let size = self.used.saturating_add(self.available);
        match size {
            0 => 0.0,
            s => self.used as f64 * 100.0 / s as f64,
        }
    }

    /// The inactive slot keeping the most WAL, if it keeps enough to be
    /// the cause.
    pub fn stuck_slot(&self) -> Option<(String, u64)> {
        let size = self.used.saturating_add(self.available) as f64;
        self.inactive_slots
            .iter()
            .filter(|(_, wal)| *wal as f64 >= size * SLOT_SHARE)
            .max_by_key(|(_, wal)| *wal)
            .cloned()
    }
}

#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// Below the threshold everywhere.
    Fine,
    /// Raise every claim to `to` bytes.
    Grow { to: u64, why: String },
    /// Full because a slot keeps WAL: not grown.
    SlotStuck {
        instance: String,
        slot: String,
        message: String,
    },
    /// Full, but already at `max`.
    AtMax { message: String },
}

/// The decision for volumes now `current` bytes big.
pub fn decide(p: &Policy, current: u64, readings: &[Reading]) -> Decision {
    let Some(fullest) = readings
        .iter()
        .max_by(|a, b| a.percent().total_cmp(&b.percent()))
    else {
        return Decision::Fine;
    };
    let pct = fullest.percent();
    if pct < f64::from(p.threshold) {
        return Decision::Fine;
    }
    if let Some((slot, wal)) = fullest.stuck_slot() {
        let message = format!(
            "{} is {pct:.0}% full and replication slot {slot:?} (not streaming) keeps {} of WAL: \
             growing would only postpone the outage; drop the slot or bring its consumer back",
            fullest.instance,
            format(round_mi(wal))
        );
        return Decision::SlotStuck {
            instance: fullest.instance.clone(),
            slot,
            message,
        };
    }
    if current >= p.max {
        let message = format!(
            "{} is {pct:.0}% full and the volumes are at autoGrow.max ({})",
            fullest.instance,
            format(p.max)
        );
        return Decision::AtMax { message };
    }
    let step = match p.increment {
        Increment::Bytes(b) => b,
        Increment::Percent(n) => current / 100 * u64::from(n),
    };
    let to = round_mi(current.saturating_add(step.max(1))).min(p.max);
    let why = format!(
        "{} is {pct:.0}% full (threshold {}%): {} → {}",
        fullest.instance,
        p.threshold,
        format(current),
        format(to)
    );
    Decision::Grow { to, why }
}

#[cfg(test)]
mod tests {
    use super::*;
    const MI: u64 = 1 << 20;

    fn policy() -> Policy {
        Policy {
            threshold: 80,
            increment: Increment::Bytes(32 * MI),
            max: 160 * MI,
        }
    }

    fn reading(used: u64, size: u64, slots: Option<Vec<(&str, u64)>>) -> Reading {
        Reading {
            instance: "pg-1".into(),
            used,
            available: size - used,
            inactive_slots: slots
                .unwrap_or_default()
                .into_iter()
                .map(|(n, w)| (n.into(), w))
                .collect(),
        }
    }

    #[test]
    fn below_the_threshold_nothing_happens() {
        let r = [reading(50 * MI, 64 * MI, Some(vec![]))];
        assert_eq!(decide(&policy(), 64 * MI, &r), Decision::Fine);
        assert_eq!(decide(&policy(), 64 * MI, &[]), Decision::Fine);
    }

    #[test]
    fn the_fullest_volume_triggers_growth_by_the_increment_up_to_max() {
        let r = [
            reading(10 * MI, 64 * MI, Some(vec![])),
            reading(60 * MI, 64 * MI, Some(vec![("pg_2", 10 * MI)])),
        ];
        let Decision::Grow { to, why } = decide(&policy(), 64 * MI, &r) else {
            panic!("should grow");
        };
        assert_eq!(to, 96 * MI);
        assert!(
            why.contains("94% full (threshold 80%): 64Mi → 96Mi"),
            "{why}"
        );
        let r = [reading(140 * MI, 144 * MI, Some(vec![]))];
        assert!(
            matches!(decide(&policy(), 144 * MI, &r), Decision::Grow { to, .. } if to == 160 * MI)
        );
        let p = Policy {
            increment: Increment::Percent(50),
            ..policy()
        };
        assert!(matches!(decide(&p, 64 * MI, &r), Decision::Grow { to, .. } if to == 96 * MI));
    }

    #[test]
    fn a_full_volume_at_max_is_reported_not_grown() {
        let r = [reading(160 * MI, 160 * MI, None)];
        let Decision::AtMax { message } = decide(&policy(), 160 * MI, &r) else {
            panic!("at max");
        };
        assert!(message.contains("100% full") && message.contains("autoGrow.max (160Mi)"));
    }

    #[test]
    fn a_stuck_slot_is_named_and_the_volume_not_grown() {
        let r = [reading(
            60 * MI,
            64 * MI,
            Some(vec![("old_reader", 30 * MI), ("small", MI)]),
        )];
        let Decision::SlotStuck { slot, message, .. } = decide(&policy(), 64 * MI, &r) else {
            panic!("stuck slot");
        };
        assert_eq!(slot, "old_reader");
        assert!(
            message.contains("\"old_reader\" (not streaming) keeps 30Mi of WAL"),
            "{message}"
        );
        // A slot keeping little is not the cause: grown.
        let r = [reading(60 * MI, 64 * MI, Some(vec![("small", 8 * MI)]))];
        assert!(matches!(
            decide(&policy(), 64 * MI, &r),
            Decision::Grow { .. }
        ));
        // Full, and no slot to blame: a full volume grows.
        let down = reading(64 * MI, 64 * MI, None);
        assert!(matches!(
            decide(&policy(), 64 * MI, &[down]),
            Decision::Grow { .. }
        ));
    }
}
