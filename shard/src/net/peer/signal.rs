//! Single-thread wake-ups for the transport's tasks (all on one shard's
//! runtime): a set-once broadcast [`Signal`] (stop; a session replaced) and
//! a one-waiter [`Pulse`] (frames queued).

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

/// Set once; every task waiting on it wakes. Waiters are deduplicated, so a
/// task polled again and again keeps one entry: at most one per task.
#[derive(Default)]
pub(crate) struct Signal {
    set: Cell<bool>,
    waiters: RefCell<Vec<Waker>>,
}

impl Signal {
    pub(crate) fn fire(&self) {
        self.set.set(true);
        let waiters = std::mem::take(&mut *self.waiters.borrow_mut());
        for w in waiters {
            w.wake();
        }
    }

    pub(crate) fn is_set(&self) -> bool {
        self.set.get()
    }

    pub(crate) fn wait(&self) -> SignalWait<'_> {
        SignalWait { signal: self }
    }
}

pub(crate) struct SignalWait<'a> {
    signal: &'a Signal,
}

impl Future for SignalWait<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.set.get() {
            return Poll::Ready(());
        }
        let mut waiters = self.signal.waiters.borrow_mut();
        if !waiters.iter().any(|w| w.will_wake(cx.waker())) {
            waiters.push(cx.waker().clone());
        }
        Poll::Pending
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
