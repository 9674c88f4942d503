//! Byte sizes on the command line: `4096`, `64k`, `1m`, `1g`, `256MiB`;
//! and durations: `10` (seconds), `5s`, `500ms`, `2m`.
//!
//! Size suffixes are binary (k = 1024), as in fio with its default
//! `kb_base`, so `--batch-size 64k` here and `--bs=64k` in fio mean the same
//! bytes. Durations take fio's time suffixes; a bare number is seconds, as
//! in fio's `runtime`.

use std::fmt;
use std::time::Duration;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SizeError {
    #[error("empty size")]
    Empty,
    #[error("invalid size {input:?}: expected a number with an optional k/m/g/t suffix, e.g. 64k")]
    BadNumber { input: String },
    #[error("invalid size {input:?}: unknown suffix {suffix:?} (use k, m, g or t)")]
    BadSuffix { input: String, suffix: String },
    #[error("size {input:?} does not fit in 64 bits")]
    Overflow { input: String },
}

/// Parses a size in bytes. Accepts an optional binary suffix, any case:
/// `k`/`kb`/`kib`, `m`/`mb`/`mib`, `g`/`gb`/`gib`, `t`/`tb`/`tib`, or `b`.
pub fn parse_size(input: &str) -> Result<u64, SizeError> {
    let trimmed = input.trim();
    if trimmed.is_empty() {
        return Err(SizeError::Empty);
    }
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, suffix) = trimmed.split_at(digits_end);
    if digits.is_empty() {
        return Err(SizeError::BadNumber {
            input: input.to_owned(),
        });
    }
    let number: u64 = digits.parse().map_err(|_| SizeError::Overflow {
        input: input.to_owned(),
    })?;
    let shift = match suffix.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(SizeError::BadSuffix {
                input: input.to_owned(),
                suffix: other.to_owned(),
            })
        }
    };
    number
        .checked_mul(1u64 << shift)
        .ok_or_else(|| SizeError::Overflow {
            input: input.to_owned(),
        })
}

/// A byte count printed with the largest binary unit that divides it exactly
/// (`65536` -> `64KiB`), or in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Bytes(pub u64);

impl fmt::Display for Bytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const UNITS: [(u32, &str); 4] = [(40, "TiB"), (30, "GiB"), (20, "MiB"), (10, "KiB")];
        let n = self.0;
        for (shift, unit) in UNITS {
            let scale = 1u64 << shift;
            if n >= scale && n & (scale - 1) == 0 {
                return write!(f, "{}{unit}", n / scale);
            }
        }
        write!(f, "{n}B")
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    #[error(
        "invalid duration {input:?}: expected a whole number with an optional unit \
         (us, ms, s, m, h), e.g. 5s or 500ms; a bare number is seconds"
    )]
    Bad { input: String },
    #[error("duration {input:?} is too long")]
    Overflow { input: String },
    #[error("duration {input:?} must be positive")]
    Zero { input: String },
}

/// Parses a duration: a whole number and an optional unit (`us`, `ms`, `s`,
/// `m`, `h`; any case); a bare number is seconds.
pub fn parse_duration(input: &str) -> Result<Duration, DurationError> {
    let bad = || DurationError::Bad {
        input: input.to_owned(),
    };
    let trimmed = input.trim();
    let digits_end = trimmed
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(trimmed.len());
    let (digits, unit) = trimmed.split_at(digits_end);
    let n: u64 = digits.parse().map_err(|_| bad())?;
    let us_per_unit: u64 = match unit.trim().to_ascii_lowercase().as_str() {
        "us" => 1,
        "ms" => 1_000,
        "" | "s" => 1_000_000,
        "m" => 60_000_000,
        "h" => 3_600_000_000,
        _ => return Err(bad()),
    };
    n.checked_mul(us_per_unit)
        .map(Duration::from_micros)
        .ok_or_else(|| DurationError::Overflow {
            input: input.to_owned(),
        })
}

/// [`parse_duration`], refusing zero: for run lengths.
pub fn parse_positive_duration(input: &str) -> Result<Duration, DurationError> {
    match parse_duration(input)? {
        d if d.is_zero() => Err(DurationError::Zero {
            input: input.to_owned(),
        }),
        d => Ok(d),
    }
}

/// A duration printed in its largest whole unit of s, ms, us: `5s`,
/// `500ms`; the way it is given on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Secs(pub Duration);

impl fmt::Display for Secs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let us = self.0.as_micros();
        if us.is_multiple_of(1_000_000) {
            write!(f, "{}s", us / 1_000_000)
        } else if us.is_multiple_of(1_000) {
            write!(f, "{}ms", us / 1_000)
        } else {
            write!(f, "{us}us")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_plain_and_suffixed_sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64k"), Ok(64 * 1024));
        assert_eq!(parse_size("64K"), Ok(64 * 1024));
        assert_eq!(parse_size("1m"), Ok(1 << 20));
        assert_eq!(parse_size("1g"), Ok(1 << 30));
        assert_eq!(parse_size("2t"), Ok(2 << 40));
        assert_eq!(parse_size("256MiB"), Ok(256 << 20));
        assert_eq!(parse_size("1kb"), Ok(1024));
        assert_eq!(parse_size(" 8b "), Ok(8));
        assert_eq!(parse_size("0"), Ok(0));
    }

    #[test]
    fn rejects_bad_input_with_typed_errors() {
        assert_eq!(parse_size(""), Err(SizeError::Empty));
        assert_eq!(parse_size("   "), Err(SizeError::Empty));
        assert!(matches!(parse_size("k"), Err(SizeError::BadNumber { .. })));
        assert!(matches!(
            parse_size("-1k"),
            Err(SizeError::BadNumber { .. })
        ));
        assert!(matches!(
            parse_size("1.5m"),
            Err(SizeError::BadSuffix { .. })
        ));
        assert!(matches!(
            parse_size("64x"),
            Err(SizeError::BadSuffix { suffix, .. }) if suffix == "x"
        ));
        assert!(matches!(parse_size("1p"), Err(SizeError::BadSuffix { .. })));
        assert!(matches!(
            parse_size("99999999999999999999"),
            Err(SizeError::Overflow { .. })
        ));
        assert!(matches!(
            parse_size("17179869184g"),
            Err(SizeError::Overflow { .. })
        ));
    }

    #[test]
    fn displays_exact_binary_units() {
        assert_eq!(Bytes(65536).to_string(), "64KiB");
        assert_eq!(Bytes(1 << 20).to_string(), "1MiB");
        assert_eq!(Bytes(256 << 20).to_string(), "256MiB");
        assert_eq!(Bytes(1000).to_string(), "1000B");
        assert_eq!(Bytes(1536).to_string(), "1536B");
    }

    #[test]
    fn durations_take_units_and_bare_numbers_are_seconds() {
        let d = |s: &str| parse_duration(s).unwrap();
        assert_eq!(d("10"), Duration::from_secs(10));
        assert_eq!(d("5s"), Duration::from_secs(5));
        assert_eq!(d("500ms"), Duration::from_millis(500));
        assert_eq!(d("2m"), Duration::from_secs(120));
        assert_eq!(d("1h"), Duration::from_secs(3600));
        assert_eq!(d("250us"), Duration::from_micros(250));
        assert_eq!(d(" 3S "), Duration::from_secs(3));
        assert_eq!(d("0"), Duration::ZERO);
        for bad in ["", "s", "1.5s", "-1", "5x", "5 sec", "1d"] {
            let err = parse_duration(bad).unwrap_err();
            assert!(matches!(err, DurationError::Bad { .. }), "{bad}: {err}");
            assert!(err.to_string().contains("bare number is seconds"));
        }
        let huge = parse_duration("99999999999999h").unwrap_err();
        assert!(matches!(huge, DurationError::Overflow { .. }));
        assert!(matches!(
            parse_positive_duration("0ms"),
            Err(DurationError::Zero { .. })
        ));
        assert_eq!(Secs(d("2m")).to_string(), "120s");
        assert_eq!(Secs(d("500ms")).to_string(), "500ms");
        assert_eq!(Secs(d("1500us")).to_string(), "1500us");
    }
}
