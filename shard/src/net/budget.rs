//! A shard's byte budget for connection memory: request bodies while they
//! are read and handled, and the room a fetch reply may take. Taken before
//! anything is allocated; over it, the request is refused with a retryable
//! Backpressure error. Single-threaded (one per shard runtime).

use std::cell::Cell;
use std::rc::Rc;

#[derive(Debug)]
pub(crate) struct ByteBudget {
    used_bytes: Cell<u64>,
    max_bytes: u64,
}

/// Bytes taken from a [`ByteBudget`], given back on drop.
#[derive(Debug)]
pub(crate) struct Charge {
    budget: Rc<ByteBudget>,
    bytes: u64,
}

impl ByteBudget {
    pub(crate) fn new(max_bytes: u64) -> Rc<ByteBudget> {
        Rc::new(ByteBudget {
            used_bytes: Cell::new(0),
            max_bytes,
        })
    }

    /// Takes `bytes` if they fit, else None (nothing taken).
    pub(crate) fn try_charge(self: &Rc<Self>, bytes: u64) -> Option<Charge> {
        let used = self.used_bytes.get();
        if used.checked_add(bytes)? > self.max_bytes {
            return None;
        }
        self.used_bytes.set(used + bytes);
        Some(Charge {
            budget: self.clone(),
            bytes,
        })
    }

    #[cfg(test)]
    fn used_bytes(&self) -> u64 {
        self.used_bytes.get()
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        let used = self.budget.used_bytes.get();
        debug_assert!(used >= self.bytes, "budget released more than taken");
        self.budget.used_bytes.set(used.saturating_sub(self.bytes));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_fit_the_budget_and_return_on_drop() {
        let b = ByteBudget::new(100);
        let a = b.try_charge(60).unwrap();
        assert!(b.try_charge(41).is_none());
        let c = b.try_charge(40).unwrap();
        assert_eq!(b.used_bytes(), 100);
        assert!(b.try_charge(1).is_none());
        drop(a);
        assert_eq!(b.used_bytes(), 40);
        assert!(b.try_charge(u64::MAX).is_none());
        drop(c);
        assert_eq!(b.used_bytes(), 0);
    }
}
