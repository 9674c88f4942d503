//! The sim's randomness and its injectable faults.

use std::collections::BTreeMap;

/// A small deterministic PRNG (splitmix64): the sim must not depend on the
/// process's randomness, so every run is replayable from its seed.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        self.next_u64() % n
    }

    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }

    /// True with probability `p` (0.0 never draws, so a fault-free run's
    /// sequence does not depend on which fault kinds exist).
    pub fn happens(&mut self, p: f64) -> bool {
        if p <= 0.0 {
            return false;
        }
        // 53 random bits: an exact f64 in [0, 1).
        ((self.next_u64() >> 11) as f64 / (1u64 << 53) as f64) < p
    }
}

/// Fault probabilities and the disk's size: properties of the simulated disk,
/// kept across [`super::SimBackend::reboot`]. Each probability is drawn per op
/// from the backend's seeded rng.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Faults {
    /// A read fails with EIO.
    pub read_eio: f64,
    /// A read succeeds but one bit of the returned buffer is flipped (the
    /// stored bytes stay intact).
    pub read_bit_flip: f64,
    /// A write fails with EIO; any subset of its sectors may have been
    /// written.
    pub write_eio: f64,
    /// An fdatasync or fsync fails with EIO. For a file, its unsynced writes
    /// are then lost for good (Linux drops the dirty pages' error state: a
    /// later sync succeeds without writing them); for a directory, its name
    /// changes stay unsynced.
    pub sync_eio: f64,
    /// Bytes of file data the disk holds. A write that extends a file and an
    /// `allocate` that grows one fail with ENOSPC when they would take the
    /// total past it. `None`: unlimited.
    pub space_bytes_max: Option<u64>,
}

/// The op kinds faults are counted and targeted on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum FaultOp {
    Read,
    Write,
    /// fdatasync or fsync, of a file or a directory.
    Sync,
}

/// A targeted fault (see [`super::SimBackend::inject`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fault {
    /// The op fails with this errno (with the side effects of its kind's EIO,
    /// see [`Faults`]).
    Errno(i32),
    /// Reads only: one bit of the returned buffer is flipped.
    BitFlip,
}

/// What was decided for one op.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Outcome {
    Normal,
    Fail(i32),
    BitFlip,
}

/// Per-kind op counters and the faults targeted at them.
#[derive(Clone, Debug, Default)]
pub(super) struct FaultPlan {
    pub faults: Faults,
    counts: [u64; 3],
    targeted: BTreeMap<(FaultOp, u64), Fault>,
}

impl FaultPlan {
    pub fn new(faults: Faults) -> Self {
        Self {
            faults,
            ..Self::default()
        }
    }

    pub fn count(&self, op: FaultOp) -> u64 {
        self.counts[op as usize]
    }

    pub fn inject(&mut self, op: FaultOp, nth: u64, fault: Fault) {
        assert!(
            fault != Fault::BitFlip || op == FaultOp::Read,
            "bit flips are injected on reads"
        );
        self.targeted.insert((op, nth), fault);
    }

    /// Counts one op of kind `op` and decides its fate: a targeted fault
    /// first, then the probabilities.
    pub fn next(&mut self, op: FaultOp, rng: &mut SimRng) -> Outcome {
        let nth = self.counts[op as usize];
        self.counts[op as usize] += 1;
        match self.targeted.remove(&(op, nth)) {
            Some(Fault::Errno(errno)) => return Outcome::Fail(errno),
            Some(Fault::BitFlip) => return Outcome::BitFlip,
            None => {}
        }
        let f = &self.faults;
        let (eio, flip) = match op {
            FaultOp::Read => (f.read_eio, f.read_bit_flip),
            FaultOp::Write => (f.write_eio, 0.0),
            FaultOp::Sync => (f.sync_eio, 0.0),
        };
        if rng.happens(eio) {
            Outcome::Fail(libc::EIO)
        } else if rng.happens(flip) {
            Outcome::BitFlip
        } else {
            Outcome::Normal
        }
    }
}
