//! Byte sizes on the command line: `4096`, `64k`, `1m`, `1g`, `256MiB`.
//!
//! Suffixes are binary (k = 1024), as in fio with its default `kb_base`, so
//! `--batch-size 64k` here and `--bs=64k` in fio mean the same bytes.

use std::fmt;

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
}
