//! The run's trace: a running hash of everything that happened (so two
//! runs of one seed can be compared by one number) and the last lines of
//! it, printed when a check fails.

use std::collections::VecDeque;
use std::fmt::Write as _;

/// Trace lines kept for a failure report.
pub const RECENT_LINES_MAX: usize = 48;

#[derive(Debug, Clone)]
pub struct Trace {
    hash: u64,
    recent: VecDeque<String>,
    /// Lines kept: [`RECENT_LINES_MAX`], or every line of a replay asked
    /// for its whole trace (bounded by the run's length).
    lines_max: usize,
}

impl Default for Trace {
    fn default() -> Self {
        Self::new()
    }
}

impl Trace {
    pub fn new() -> Self {
        Self::keeping(RECENT_LINES_MAX)
    }

    /// A trace that keeps the last `lines_max` lines for the report.
    pub fn keeping(lines_max: usize) -> Self {
        Self {
            hash: FNV_OFFSET,
            recent: VecDeque::with_capacity(lines_max.min(RECENT_LINES_MAX)),
            lines_max: lines_max.max(1),
        }
    }

    /// The hash of every line and byte string recorded so far.
    pub fn hash(&self) -> u64 {
        self.hash
    }

    /// Records one line (hashed and kept among the recent ones).
    pub fn line(&mut self, tick: u64, line: impl std::fmt::Display) {
        let mut s = String::new();
        let _ = write!(s, "t{tick} {line}");
        self.bytes(s.as_bytes());
        if self.recent.len() == self.lines_max {
            self.recent.pop_front();
        }
        self.recent.push_back(s);
    }

    /// Hashes bytes without keeping them (encoded messages).
    pub fn bytes(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.hash = (self.hash ^ u64::from(b)).wrapping_mul(FNV_PRIME);
        }
        // Separates consecutive records.
        self.hash = (self.hash ^ 0xff).wrapping_mul(FNV_PRIME);
    }

    pub fn recent(&self) -> impl Iterator<Item = &String> {
        self.recent.iter()
    }
}

/// FNV-1a 64: tiny and deterministic; the trace hash is no security boundary.
const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hash_depends_on_content_and_order_and_recent_is_bounded() {
        let mut a = Trace::new();
        let mut b = Trace::new();
        a.line(1, "x");
        a.line(2, "y");
        b.line(2, "y");
        b.line(1, "x");
        assert_ne!(a.hash(), b.hash());
        let mut c = Trace::new();
        c.line(1, "x");
        c.line(2, "y");
        assert_eq!(a.hash(), c.hash());
        for i in 0..RECENT_LINES_MAX as u64 * 2 {
            c.line(i, "z");
        }
        assert_eq!(c.recent().count(), RECENT_LINES_MAX);
    }
}
