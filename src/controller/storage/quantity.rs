//! Storage quantities as bytes, for comparing and raising claim sizes.
//! Only the forms a claim's size takes (`spec.storage.size`'s pattern:
//! digits, an optional fraction, a binary or decimal suffix); anything else
//! is `None`, never a guess.

const BINARY: [(&str, u32); 5] = [("Ki", 10), ("Mi", 20), ("Gi", 30), ("Ti", 40), ("Pi", 50)];
const DECIMAL: [(&str, u32); 5] = [("k", 3), ("M", 6), ("G", 9), ("T", 12), ("P", 15)];
const MI: u64 = 1 << 20;

/// Bytes of a quantity ("64Mi", "1.5Gi", "10G", "1000"), rounded up.
pub fn bytes(q: &str) -> Option<u64> {
    let (num, mult): (&str, u128) = BINARY
        .iter()
        .find_map(|(s, p)| Some((q.strip_suffix(s)?, 1u128 << p)))
        .or_else(|| {
            DECIMAL
                .iter()
                .find_map(|(s, p)| Some((q.strip_suffix(s)?, 10u128.pow(*p))))
        })
        .unwrap_or((q, 1));
    let digits = |s: &str| !s.is_empty() && s.len() <= 18 && s.bytes().all(|b| b.is_ascii_digit());
    let (int, frac) = match num.split_once('.') {
        Some((i, f)) if digits(f) => (i, f),
        Some(_) => return None,
        None => (num, ""),
    };
    if !digits(int) {
        return None;
    }
    let scale = 10u128.pow(frac.len() as u32);
    let whole: u128 = format!("{int}{frac}").parse().ok()?;
    let b = (whole * mult).div_ceil(scale);
    u64::try_from(b).ok()
}

/// A size as a quantity: whole GiB or MiB when it is one, else bytes.
pub fn format(b: u64) -> String {
    match b {
        0 => "0".into(),
        b if b % (1 << 30) == 0 => format!("{}Gi", b >> 30),
        b if b % MI == 0 => format!("{}Mi", b >> 20),
        b => b.to_string(),
    }
}

/// Rounded up to whole MiB (claims grow in MiB steps).
pub fn round_mi(b: u64) -> u64 {
    b.div_ceil(MI).saturating_mul(MI)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quantities_parse_and_print() {
        assert_eq!(bytes("64Mi"), Some(64 * MI));
        assert_eq!(bytes("1.5Gi"), Some(1536 * MI));
        assert_eq!(bytes("10G"), Some(10_000_000_000));
        assert_eq!(bytes("1000"), Some(1000));
        for bad in [
            "",
            "Gi",
            "1.Gi",
            "-1Gi",
            "1e9",
            "1 Gi",
            "99999999999999999999Gi",
        ] {
            assert_eq!(bytes(bad), None, "{bad}");
        }
        assert_eq!(format(2 << 30), "2Gi");
        assert_eq!(format(96 * MI), "96Mi");
        assert_eq!(format(1000), "1000");
        assert_eq!(round_mi(MI + 1), 2 * MI);
        assert_eq!(format(bytes("1Gi").unwrap_or(0)), "1Gi");
    }
}
