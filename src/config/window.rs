//! Maintenance windows such as `"Sat 02:00-06:00"` or `"Mon-Fri,Sun 22:00-02:00"`.
//!
//! Windows are in UTC on purpose: a fleet spans time zones, and a window that
//! moves with daylight saving time would silently open an hour early twice a
//! year. Disruptive fleet work (rollout restarts) waits for a cluster's window.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use super::values::{Checked, CheckedValue};

/// A weekly window in UTC. When `end` is not after `start` the window runs
/// past midnight into the next day; the weekdays name the day it opens.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct MaintenanceWindow {
    /// Bit `d` set = the window opens on weekday `d` (0 = Monday … 6 = Sunday).
    days: u8,
    /// Minutes after midnight UTC, `0..1440`.
    start: u16,
    /// Minutes after midnight UTC, `1..=1440`.
    end: u16,
}

/// A window as written in the config, parsed at load time.
pub type Window = Checked<MaintenanceWindow>;

const DAY_NAMES: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];
const MINUTES_PER_DAY: u16 = 24 * 60;

impl MaintenanceWindow {
    /// Whether the window is open at `at`.
    pub fn contains(&self, at: SystemTime) -> bool {
        let secs = at.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs());
        let days_since_epoch = secs / 86_400;
        // 1970-01-01 was a Thursday (index 3 with Monday = 0).
        let weekday = ((days_since_epoch + 3) % 7) as u8;
        let minute = ((secs % 86_400) / 60) as u16;
        self.contains_at(weekday, minute)
    }

    /// Whether the window is open on `weekday` (0 = Monday) at `minute` after midnight UTC.
    pub fn contains_at(&self, weekday: u8, minute: u16) -> bool {
        let opens_on = |d: u8| self.days & (1 << (d % 7)) != 0;
        if self.start < self.end {
            opens_on(weekday) && (self.start..self.end).contains(&minute)
        } else {
            (opens_on(weekday) && minute >= self.start)
                || (opens_on((weekday + 6) % 7) && minute < self.end)
        }
    }

    /// How long the window stays open once it opens.
    pub fn length(&self) -> Duration {
        let minutes = if self.start < self.end {
            self.end - self.start
        } else {
            MINUTES_PER_DAY - self.start + self.end
        };
        Duration::from_secs(u64::from(minutes) * 60)
    }
}

impl CheckedValue for MaintenanceWindow {
    const EXPECTED: &'static str = "a UTC window such as \"Sat 02:00-06:00\", \"Mon-Fri,Sun 22:00-02:00\" or \"* 01:00-03:00\"";
    const ALLOW_NON_STRING: bool = false;

    fn parse_raw(raw: &str) -> Result<Self, String> {
        let bad = |why: &str| format!("{raw:?} is not {}: {why}", Self::EXPECTED);
        let mut parts = raw.split_whitespace();
        let (Some(days), Some(times), None) = (parts.next(), parts.next(), parts.next()) else {
            return Err(bad("expected \"<days> HH:MM-HH:MM\""));
        };
        let days = parse_days(days).map_err(|e| bad(&e))?;
        let (start, end) = times
            .split_once('-')
            .ok_or_else(|| bad("expected HH:MM-HH:MM"))?;
        let start = parse_time(start, false).map_err(|e| bad(&e))?;
        let end = parse_time(end, true).map_err(|e| bad(&e))?;
        if start == end {
            return Err(bad(
                "start and end are equal, so the window would never open",
            ));
        }
        Ok(Self { days, start, end })
    }
}

fn parse_days(spec: &str) -> Result<u8, String> {
    if spec == "*" {
        return Ok(0x7f);
    }
    let mut mask = 0u8;
    for item in spec.split(',') {
        let (from, to) = match item.split_once('-') {
            Some((a, b)) => (day_index(a)?, day_index(b)?),
            None => {
                let d = day_index(item)?;
                (d, d)
            }
        };
        // Ranges may wrap around the week: "Sat-Mon".
        let mut d = from;
        loop {
            mask |= 1 << d;
            if d == to {
                break;
            }
            d = (d + 1) % 7;
        }
    }
    Ok(mask)
}

fn day_index(name: &str) -> Result<u8, String> {
    let lower = name.to_ascii_lowercase();
    DAY_NAMES
        .iter()
        .position(|d| *d == lower)
        .map(|i| i as u8)
        .ok_or_else(|| format!("unknown weekday {name:?} (use Mon, Tue, …, Sun or *)"))
}

/// Parses `HH:MM` into minutes after midnight; `24:00` only as an end time.
fn parse_time(s: &str, is_end: bool) -> Result<u16, String> {
    let bad = || format!("{s:?} is not a time HH:MM");
    let (h, m) = s.split_once(':').ok_or_else(bad)?;
    if h.len() != 2 || m.len() != 2 {
        return Err(bad());
    }
    let h: u16 = h.parse().map_err(|_| bad())?;
    let m: u16 = m.parse().map_err(|_| bad())?;
    if m > 59 || h > 24 || (h == 24 && (m != 0 || !is_end)) {
        return Err(bad());
    }
    Ok(h * 60 + m)
}
