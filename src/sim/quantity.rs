//! Kubernetes resource quantities (`500m`, `1Gi`, `2`, `1e3`) as exact
//! milli-units, enough for quota sums and LimitRange comparisons.

/// A quantity in thousandths of its unit (cores, bytes, objects).
pub type Milli = i128;

/// Parses a quantity string; None when it is not one.
pub fn parse(s: &str) -> Option<Milli> {
    let s = s.trim();
    let split = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.' || c == '+' || c == '-'))
        .unwrap_or(s.len());
    let (num, suffix) = s.split_at(split);
    let mult: f64 = match suffix {
        "" => 1.0,
        "m" => 1e-3,
        "k" => 1e3,
        "M" => 1e6,
        "G" => 1e9,
        "T" => 1e12,
        "P" => 1e15,
        "E" => 1e18,
        "Ki" => 1024.0,
        "Mi" => 1024f64.powi(2),
        "Gi" => 1024f64.powi(3),
        "Ti" => 1024f64.powi(4),
        "Pi" => 1024f64.powi(5),
        "Ei" => 1024f64.powi(6),
        e if e.starts_with(['e', 'E']) => 10f64.powi(e[1..].parse::<i32>().ok()?),
        _ => return None,
    };
    let n: f64 = num.parse().ok()?;
    Some((n * mult * 1000.0).ceil() as Milli)
}

/// Formats a sum for messages, in the suffix family `like` uses (binary
/// suffixes stay binary, as kube keeps a quantity's format).
pub fn format(v: Milli, like: &str) -> String {
    if v % 1000 != 0 {
        return format!("{v}m");
    }
    let units = v / 1000;
    if like.ends_with('i') && units != 0 {
        for (suffix, pow) in [
            ("Ei", 6),
            ("Pi", 5),
            ("Ti", 4),
            ("Gi", 3),
            ("Mi", 2),
            ("Ki", 1),
        ] {
            let base = 1024i128.pow(pow);
            if units % base == 0 {
                return format!("{}{suffix}", units / base);
            }
        }
    }
    units.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_formats() {
        assert_eq!(parse("500m"), Some(500));
        assert_eq!(parse("2"), Some(2000));
        assert_eq!(parse("1Gi"), Some(1024 * 1024 * 1024 * 1000));
        assert_eq!(parse("1e3"), Some(1_000_000));
        assert_eq!(parse("x"), None);
        assert_eq!(format(1500, "1"), "1500m");
        assert_eq!(format(parse("2Gi").unwrap_or(0), "1Gi"), "2Gi");
        assert_eq!(format(0, "1Gi"), "0");
    }
}
