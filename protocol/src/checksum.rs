//! The one checksum used everywhere in ringlog (batch headers, batch bodies,
//! the hash chain, and anything storage wants to protect).
//!
//! Keeping it in one place means the algorithm can only change together with
//! [`crate::batch::FORMAT_VERSION`], never silently in one component.

use xxhash_rust::xxh3::{xxh3_64, Xxh3};

/// xxh3-64 (seed 0) of `bytes`.
#[inline]
pub fn checksum(bytes: &[u8]) -> u64 {
    xxh3_64(bytes)
}

/// Streaming form of [`checksum`]: feeding the same bytes in any split
/// produces the same value as one `checksum` call over their concatenation.
#[derive(Clone)]
pub struct Hasher {
    inner: Xxh3,
}

impl Hasher {
    pub fn new() -> Self {
        Self { inner: Xxh3::new() }
    }

    #[inline]
    pub fn update(&mut self, bytes: &[u8]) {
        self.inner.update(bytes);
    }

    /// Value for all bytes fed so far; does not reset the state.
    pub fn finish(&self) -> u64 {
        self.inner.digest()
    }
}

impl Default for Hasher {
    fn default() -> Self {
        Self::new()
    }
}

impl std::fmt::Debug for Hasher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Hasher").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn streaming_matches_one_shot() {
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7 + 3) as u8).collect();
        for split in [0usize, 1, 15, 16, 17, 240, 999, 1000] {
            let mut h = Hasher::new();
            h.update(&data[..split]);
            h.update(&data[split..]);
            assert_eq!(h.finish(), checksum(&data), "split {split}");
        }
    }

    #[test]
    fn empty_is_stable() {
        assert_eq!(Hasher::default().finish(), checksum(&[]));
    }
}
