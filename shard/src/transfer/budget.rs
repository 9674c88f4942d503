//! Budgets as data (issue 10 item 3): how much a broken or hostile peer
//! may cost, and the per-peer charges, quarantine and rotation.

use crate::vsr::timeout::Rng;

/// Largest backoff exponent: a failed attempt waits at most
/// `backoff_base_ticks * 2^BACKOFF_EXPONENT_MAX` plus as much jitter.
pub const BACKOFF_EXPONENT_MAX: u32 = 6;

/// The receiver's bounds. Every field is a hard bound with a test that
/// hits it (shard/src/transfer/tests.rs).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budgets {
    /// Chunk requests in flight (and chunks parked by storage ahead of its
    /// cursor): at most this many, never one at a time. At most the
    /// store's `transfer_window_chunks` and the codec's `chunk_keys_max`.
    pub window_chunks: usize,
    /// Ticks a requested chunk may take before it is requested again.
    pub chunk_timeout_ticks: u64,
    /// Ticks an offer may take to arrive.
    pub offer_timeout_ticks: u64,
    /// Ticks without progress (an offer taken, a chunk accepted) before
    /// the attempt fails and the receiver rotates to another peer.
    pub stall_ticks_max: u64,
    /// First backoff after a failed attempt; doubles per consecutive
    /// failure up to [`BACKOFF_EXPONENT_MAX`], plus seeded jitter.
    pub backoff_base_ticks: u64,
    /// Flat wait after a transient refusal (never backed off: transient
    /// refusals must not pin the backoff at its ceiling).
    pub retry_ticks: u64,
    /// Transient refusals in a row from one peer before rotating.
    pub transient_retries_max: u32,
    /// Charges (decode failures, unsolicited offers, unrequested or
    /// garbage chunks, stale offers) a peer may take before quarantine.
    pub charges_max: u32,
    /// How long a quarantined peer is not asked.
    pub quarantine_ticks: u64,
    /// Offer caps, checked before anything is staged.
    pub artifacts_max: u64,
    pub artifact_bytes_max: u64,
    pub total_bytes_max: u64,
    /// Ours; an offer with another chunk size is refused.
    pub chunk_size_bytes: u32,
}

impl Default for Budgets {
    fn default() -> Self {
        Self {
            window_chunks: 8,
            chunk_timeout_ticks: 10,
            offer_timeout_ticks: 20,
            stall_ticks_max: 50,
            backoff_base_ticks: 10,
            retry_ticks: 10,
            transient_retries_max: 5,
            charges_max: 8,
            quarantine_ticks: 1000,
            artifacts_max: 1024,
            artifact_bytes_max: 1 << 30,
            total_bytes_max: 1 << 40,
            chunk_size_bytes: 256 * 1024,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid transfer budgets: {0}")]
pub struct BudgetsError(pub &'static str);

impl Budgets {
    pub fn validate(&self) -> Result<(), BudgetsError> {
        let positive = [
            self.chunk_timeout_ticks,
            self.offer_timeout_ticks,
            self.stall_ticks_max,
            self.backoff_base_ticks,
            self.retry_ticks,
            self.quarantine_ticks,
        ];
        if positive.contains(&0) || self.charges_max == 0 {
            return Err(BudgetsError("timeouts and charges_max must be positive"));
        }
        if self.window_chunks < 2 || self.window_chunks > 256 {
            return Err(BudgetsError(
                "window_chunks must be in 2..=256 (never lockstep; chunk_keys_max)",
            ));
        }
        if self.stall_ticks_max <= self.chunk_timeout_ticks {
            return Err(BudgetsError(
                "stall_ticks_max must exceed chunk_timeout_ticks (a lost chunk is asked again first)",
            ));
        }
        Ok(())
    }

    /// The wait after `failures` consecutive failed attempts (at least 1).
    pub fn backoff_ticks(&self, failures: u32, rng: &mut Rng) -> u64 {
        debug_assert!(failures > 0);
        let exponent = failures.saturating_sub(1).min(BACKOFF_EXPONENT_MAX);
        let base = self.backoff_base_ticks << exponent;
        base + rng.below(base)
    }

    /// The longest wait [`Self::backoff_ticks`] can give.
    pub fn backoff_ticks_max(&self) -> u64 {
        (self.backoff_base_ticks << BACKOFF_EXPONENT_MAX) * 2 - 1
    }
}

#[derive(Debug, Clone, Copy, Default)]
struct PeerState {
    charges: u32,
    quarantined_until_tick: u64,
}

/// The peers a receiver may ask, in replica order, with their charges.
#[derive(Debug, Clone)]
pub struct Peers {
    ids: Vec<u8>,
    state: Vec<PeerState>,
    /// Index into `ids` of the peer asked now or next.
    current: usize,
}

impl Peers {
    /// Every replica of `replica_count` but `me`.
    pub fn new(replica_count: u8, me: u8) -> Self {
        let ids: Vec<u8> = (0..replica_count).filter(|&r| r != me).collect();
        let state = vec![PeerState::default(); ids.len()];
        Self {
            ids,
            state,
            current: 0,
        }
    }

    pub fn is_empty(&self) -> bool {
        self.ids.is_empty()
    }

    pub fn current(&self) -> Option<u8> {
        self.ids.get(self.current).copied()
    }

    fn index(&self, peer: u8) -> Option<usize> {
        self.ids.iter().position(|&p| p == peer)
    }

    pub fn is_quarantined(&self, peer: u8, now_tick: u64) -> bool {
        self.index(peer)
            .is_some_and(|i| self.state[i].quarantined_until_tick > now_tick)
    }

    pub fn charges(&self, peer: u8) -> u32 {
        self.index(peer).map_or(0, |i| self.state[i].charges)
    }

    /// Charges `peer` once; returns the tick its quarantine ends if this
    /// charge put it over `charges_max`. Unknown peers (not replicas of
    /// this partition) are ignored: the driver drops their messages.
    pub fn charge(&mut self, peer: u8, now_tick: u64, budgets: &Budgets) -> Option<u64> {
        let i = self.index(peer)?;
        let s = &mut self.state[i];
        s.charges += 1;
        if s.charges < budgets.charges_max {
            return None;
        }
        s.charges = 0;
        s.quarantined_until_tick = now_tick + budgets.quarantine_ticks;
        Some(s.quarantined_until_tick)
    }

    /// Moves to the next peer not quarantined at `now_tick` (possibly the
    /// same one, if it is the only one). None when all are quarantined.
    pub fn rotate(&mut self, now_tick: u64) -> Option<u8> {
        let n = self.ids.len();
        for step in 1..=n {
            let i = (self.current + step) % n;
            if self.state[i].quarantined_until_tick <= now_tick {
                self.current = i;
                return Some(self.ids[i]);
            }
        }
        None
    }

    /// The first tick at which some peer is out of quarantine.
    pub fn next_free_tick(&self) -> u64 {
        self.state
            .iter()
            .map(|s| s.quarantined_until_tick)
            .min()
            .unwrap_or(0)
    }
}
