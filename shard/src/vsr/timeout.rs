//! Timeouts as data: a counter of ticks, a deadline, and a seeded jitter.
//! The replica owns a fixed array of them; `Tick` advances all, then the
//! replica handles each that fired (TigerBeetle's shape). No clock here.

/// splitmix64: tiny, seedable, good enough for jitter. Never for keys.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform-ish in `0..bound_exclusive` (0 when the bound is 0).
    pub fn below(&mut self, bound_exclusive: u64) -> u64 {
        if bound_exclusive == 0 {
            return 0;
        }
        self.next_u64() % bound_exclusive
    }
}

/// Largest backoff exponent: a retried timeout waits at most
/// `after_ticks * 2^BACKOFF_EXPONENT_MAX` plus jitter.
const BACKOFF_EXPONENT_MAX: u32 = 4;

/// One timeout. While armed it fires once `ticks` reaches the deadline
/// (`after_ticks`, doubled per attempt, plus jitter when `jittered`).
#[derive(Debug, Clone)]
pub struct Timeout {
    pub name: &'static str,
    after_ticks: u64,
    jittered: bool,
    ticks: u64,
    deadline_ticks: u64,
    attempts: u32,
    armed: bool,
}

impl Timeout {
    pub fn new(name: &'static str, after_ticks: u64, jittered: bool) -> Self {
        assert!(after_ticks > 0, "timeout {name} must be at least one tick");
        Self {
            name,
            after_ticks,
            jittered,
            ticks: 0,
            deadline_ticks: after_ticks,
            attempts: 0,
            armed: false,
        }
    }

    /// Arms from zero with no backoff.
    pub fn start(&mut self, rng: &mut Rng) {
        self.attempts = 0;
        self.armed = true;
        self.rearm(rng);
    }

    pub fn stop(&mut self) {
        self.armed = false;
        self.ticks = 0;
        self.attempts = 0;
    }

    /// Starts it unless it is already running (keeps the deadline).
    pub fn ensure(&mut self, rng: &mut Rng) {
        if !self.armed {
            self.start(rng);
        }
    }

    /// After a fire that will be retried: wait longer next time.
    pub fn backoff(&mut self, rng: &mut Rng) {
        debug_assert!(self.armed, "backoff on a stopped timeout {}", self.name);
        self.attempts = self.attempts.saturating_add(1);
        self.rearm(rng);
    }

    fn rearm(&mut self, rng: &mut Rng) {
        let base = self.after_ticks << self.attempts.min(BACKOFF_EXPONENT_MAX);
        let jitter = if self.jittered { rng.below(base) } else { 0 };
        self.ticks = 0;
        self.deadline_ticks = base + jitter;
        debug_assert!(self.deadline_ticks >= self.after_ticks);
    }

    pub fn tick(&mut self) {
        if self.armed {
            self.ticks = self.ticks.saturating_add(1);
        }
    }

    pub fn fired(&self) -> bool {
        self.armed && self.ticks >= self.deadline_ticks
    }

    pub fn armed(&self) -> bool {
        self.armed
    }

    /// Ticks since it was last (re)armed; 0 while stopped.
    pub fn elapsed_ticks(&self) -> u64 {
        self.ticks
    }

    pub fn attempts(&self) -> u32 {
        self.attempts
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn timeout_fires_at_deadline_and_backs_off() {
        let mut rng = Rng::new(1);
        let mut t = Timeout::new("t", 4, false);
        t.tick();
        assert!(!t.fired(), "a stopped timeout never fires");
        t.start(&mut rng);
        for _ in 0..3 {
            t.tick();
        }
        assert!(!t.fired());
        t.tick();
        assert!(t.fired());
        t.backoff(&mut rng);
        for _ in 0..7 {
            t.tick();
        }
        assert!(!t.fired(), "one backoff doubles the wait");
        t.tick();
        assert!(t.fired());
    }

    #[test]
    fn jitter_is_seeded_and_bounded() {
        let deadline = |seed| {
            let mut rng = Rng::new(seed);
            let mut t = Timeout::new("t", 10, true);
            t.start(&mut rng);
            let mut n = 0;
            while !t.fired() {
                t.tick();
                n += 1;
            }
            n
        };
        assert_eq!(deadline(7), deadline(7), "same seed, same deadline");
        let all: Vec<u64> = (0..32).map(deadline).collect();
        assert!(all.iter().all(|&n| (10..20).contains(&n)), "{all:?}");
        assert!(all.iter().any(|&n| n != all[0]), "jitter varies by seed");
    }
}
