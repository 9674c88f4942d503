//! Reconnect delays: exponential from `min` to `max`, each with "equal
//! jitter" (a uniform pick in the upper half of the step), so nodes that
//! lost a peer at the same moment do not redial in lockstep, and the delay
//! still grows with every failure and never exceeds `max`.

use std::time::Duration;

#[derive(Clone, Debug)]
pub(crate) struct Backoff {
    min: Duration,
    max: Duration,
    /// The un-jittered step of the next delay.
    step: Duration,
}

impl Backoff {
    pub(crate) fn new(min: Duration, max: Duration) -> Backoff {
        assert!(
            !min.is_zero() && min <= max,
            "backoff bounds {min:?}..{max:?}"
        );
        Backoff {
            min,
            max,
            step: min,
        }
    }

    /// The delay before the next attempt, given a random word; the step
    /// doubles (up to `max`).
    pub(crate) fn next_delay(&mut self, random: u64) -> Duration {
        let step = self.step;
        self.step = (self.step * 2).min(self.max);
        let half = step / 2;
        let span_ns = u64::try_from((step - half).as_nanos()).unwrap_or(u64::MAX);
        let jitter = Duration::from_nanos(if span_ns == 0 {
            0
        } else {
            random % (span_ns + 1)
        });
        let delay = half + jitter;
        debug_assert!(delay <= self.max && delay >= half);
        delay
    }

    /// After a session was established: start again from `min`.
    pub(crate) fn reset(&mut self) {
        self.step = self.min;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_with_jitter_and_cap() {
        let ms = Duration::from_millis;
        let mut b = Backoff::new(ms(10), ms(640));
        let mut steps = Vec::new();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for _ in 0..12 {
            seed = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
            steps.push(b.next_delay(seed));
        }
        // Step k is 10 ms * 2^k capped at 640 ms; the delay lies in its
        // upper half.
        for (k, d) in steps.iter().enumerate() {
            let step = ms(10 * (1u64 << k.min(6)));
            assert!(
                *d >= step / 2 && *d <= step,
                "attempt {k}: {d:?} vs step {step:?}"
            );
        }
        assert!(steps[11] <= ms(640) && steps[11] >= ms(320));
        // The extremes of the random word reach both ends of the step.
        let mut lo = Backoff::new(ms(100), ms(100));
        assert_eq!(lo.next_delay(0), ms(50));
        let mut hi = Backoff::new(ms(100), ms(100));
        assert_eq!(hi.next_delay(50_000_000), ms(100));
        b.reset();
        assert!(b.next_delay(u64::MAX) <= ms(10));
    }
}
