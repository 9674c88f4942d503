//! Single-thread wake-ups for the transport's tasks (all on one shard's
//! runtime): a set-once broadcast [`Signal`] (stop; a session replaced) and
//! a one-waiter [`Pulse`] (frames queued).

use std::cell::{Cell, RefCell};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Set once; every task waiting on it wakes. Each live [`SignalWait`]
/// holds one entry, under its own key, replaced in place when polled again
/// and removed when the wait is dropped: the entries are bounded by the
/// waits in progress. (Deduplicating by `Waker::will_wake` is not enough: a
/// spawned task's wakers are not `will_wake` of each other on this runtime.)
#[derive(Default)]
pub(crate) struct Signal {
    set: Cell<bool>,
    next_key: Cell<u64>,
    waiters: RefCell<BTreeMap<u64, Waker>>,
}

impl Signal {
    pub(crate) fn fire(&self) {
        self.set.set(true);
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in waiters.into_values() {
            w.wake();
        }
    }

    pub(crate) fn is_set(&self) -> bool {
        self.set.get()
    }

    pub(crate) fn wait(&self) -> SignalWait<'_> {
        SignalWait {
            signal: self,
            key: None,
        }
    }
}

pub(crate) struct SignalWait<'a> {
    signal: &'a Signal,
    /// Its entry in the signal's waiters, once polled.
    key: Option<u64>,
}

impl Future for SignalWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.get_mut();
        if this.signal.set.get() {
            return Poll::Ready(());
        }
        let key = *this.key.get_or_insert_with(|| {
            let k = this.signal.next_key.get();
            this.signal.next_key.set(k + 1);
            k
        });
        let mut waiters = this.signal.waiters.borrow_mut();
        match waiters.get_mut(&key) {
            Some(w) if w.will_wake(cx.waker()) => {}
            Some(w) => w.clone_from(cx.waker()),
            None => {
                waiters.insert(key, cx.waker().clone());
            }
        }
        debug_assert!(waiters.contains_key(&key));
        Poll::Pending
    }
}

impl Drop for SignalWait<'_> {
    fn drop(&mut self) {
        if let Some(key) = self.key {
            self.signal.waiters.borrow_mut().remove(&key);
        }
    }
}

/// A level-triggered wake-up for one waiting task, consumed by the wait.
#[derive(Default)]
pub(crate) struct Pulse {
    pending: Cell<bool>,
    waker: RefCell<Option<Waker>>,
}

impl Pulse {
    pub(crate) fn pulse(&self) {
        self.pending.set(true);
        if let Some(w) = self.waker.borrow_mut().take() {
            w.wake();
        }
    }

    pub(crate) fn wait(&self) -> PulseWait<'_> {
        PulseWait { pulse: self }
    }
}

pub(crate) struct PulseWait<'a> {
    pulse: &'a Pulse,
}

impl Future for PulseWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.pulse.pending.replace(false) {
            return Poll::Ready(());
        }
        *self.pulse.waker.borrow_mut() = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::rc::Rc;
    use std::time::Duration;

    fn runtime() -> monoio::Runtime<monoio::time::TimeDriver<monoio::IoUringDriver>> {
        monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .enable_timer()
            .build()
            .unwrap()
    }

    /// A session's read loop waits on the stop signal beside every frame
    /// read. A spawned task's waker is not `will_wake` of its earlier
    /// clones, so waiters deduplicated by it grew by one per wait (1491
    /// after 1000 here): unbounded memory, and every poll scanned them all.
    #[test]
    fn a_task_waiting_again_and_again_holds_at_most_its_live_waits() {
        let signal = Rc::new(Signal::default());
        let waiting = signal.clone();
        let peak = runtime().block_on(async move {
            monoio::spawn(async move {
                let mut peak = 0;
                for _ in 0..1000 {
                    monoio::select! {
                        _ = waiting.wait() => {},
                        _ = monoio::time::sleep(Duration::from_micros(1)) => {},
                    }
                    peak = peak.max(waiting.waiters.borrow().len());
                }
                peak
            })
            .await
        });
        assert!(peak <= 1, "{peak} waiters");
        assert_eq!(signal.waiters.borrow().len(), 0);
    }

    #[test]
    fn every_live_waiter_wakes_when_the_signal_fires() {
        let signal = Rc::new(Signal::default());
        let woken = runtime().block_on({
            let signal = signal.clone();
            async move {
                let tasks: Vec<_> = (0..3)
                    .map(|i| {
                        let s = signal.clone();
                        monoio::spawn(async move {
                            s.wait().await;
                            i
                        })
                    })
                    .collect();
                monoio::time::sleep(Duration::from_millis(1)).await;
                assert_eq!(signal.waiters.borrow().len(), 3);
                signal.fire();
                let mut woken = Vec::new();
                for t in tasks {
                    woken.push(t.await);
                }
                woken
            }
        });
        assert_eq!(woken, vec![0, 1, 2]);
        assert!(signal.is_set());
    }
}
