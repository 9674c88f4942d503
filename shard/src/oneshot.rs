//! Single-thread async primitives for tasks of one shard (no locks, no
//! atomics): a oneshot reply slot and a notify flag.
//!
//! Their wakes are skipped once the shard's runtime has ended
//! ([`RuntimeEnd`]): monoio drops the tasks still pending (connections,
//! waiting replies) outside its context, where waking one of its wakers
//! panics, and there is nothing left to run anyway.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

thread_local! {
    static ENDED: Cell<bool> = const { Cell::new(false) };
}

/// Marks this thread's runtime as ended when dropped: create it first
/// thing in the future given to `block_on`, so it drops as that future
/// finishes, before the runtime drops its remaining tasks.
pub struct RuntimeEnd(());

impl RuntimeEnd {
    pub fn arm() -> RuntimeEnd {
        ENDED.with(|e| e.set(false));
        RuntimeEnd(())
    }
}

impl Drop for RuntimeEnd {
    fn drop(&mut self) {
        ENDED.with(|e| e.set(true));
    }
}

fn wake(waker: Waker) {
    if !ENDED.with(Cell::get) {
        waker.wake();
    }
}

struct Slot<T> {
    value: Option<T>,
    waker: Option<Waker>,
    /// The sender was dropped without sending.
    closed: bool,
}

/// Creates a local oneshot channel.
pub fn oneshot<T>() -> (Sender<T>, Receiver<T>) {
    let slot = Rc::new(RefCell::new(Slot {
        value: None,
        waker: None,
        closed: false,
    }));
    (Sender { slot: slot.clone() }, Receiver { slot })
}

pub struct Sender<T> {
    slot: Rc<RefCell<Slot<T>>>,
}

impl<T> Sender<T> {
    pub fn send(self, value: T) {
        let waker = {
            let mut s = self.slot.borrow_mut();
            s.value = Some(value);
            s.waker.take()
        };
        if let Some(w) = waker {
            wake(w);
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.slot.borrow_mut();
            s.closed = true;
            s.waker.take()
        };
        if let Some(w) = waker {
            wake(w);
        }
    }
}

pub struct Receiver<T> {
    slot: Rc<RefCell<Slot<T>>>,
}

impl<T> Future for Receiver<T> {
    /// `None` if the sender was dropped without sending.
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = self.slot.borrow_mut();
        if let Some(v) = s.value.take() {
            return Poll::Ready(Some(v));
        }
        if s.closed {
            return Poll::Ready(None);
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}

/// A level-triggered wake-up flag with one waiting task.
#[derive(Default)]
pub struct Notify {
    state: RefCell<(bool, Option<Waker>)>,
}

impl Notify {
    pub fn notify(&self) {
        let waker = {
            let mut s = self.state.borrow_mut();
            s.0 = true;
            s.1.take()
        };
        if let Some(w) = waker {
            wake(w);
        }
    }

    /// Waits until notified (returns at once if a notification is pending),
    /// consuming the notification.
    pub fn notified(&self) -> Notified<'_> {
        Notified { notify: self }
    }
}

pub struct Notified<'a> {
    notify: &'a Notify,
}

impl Future for Notified<'_> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let mut s = self.notify.state.borrow_mut();
        if s.0 {
            s.0 = false;
            return Poll::Ready(());
        }
        s.1 = Some(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A task holding a sender is woken, so queued, when the runtime's
    /// main future returns (as at a shutdown with a request in flight);
    /// the runtime then drops it with its queue, outside its context, and
    /// the sender's drop wakes the task awaiting the receiver.
    fn teardown_with_a_queued_sender(arm: bool) {
        let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .build()
            .unwrap();
        rt.block_on(async move {
            let _end = arm.then(RuntimeEnd::arm);
            let (tx, rx) = oneshot::<u32>();
            let go = Rc::new(Notify::default());
            let woken = go.clone();
            let (polled_tx, polled) = oneshot::<()>();
            // Run in spawn order: the receiver's task registers its waker
            // before the sender's task says it waits.
            monoio::spawn(rx);
            monoio::spawn(async move {
                polled_tx.send(());
                woken.notified().await;
                tx.send(1);
            });
            assert_eq!(polled.await, Some(()));
            go.notify();
        });
        drop(rt);
    }

    #[test]
    fn tasks_dropped_after_the_runtime_ended_wake_nothing() {
        teardown_with_a_queued_sender(true);
    }

    #[test]
    fn without_the_end_mark_such_a_teardown_panics_in_monoio() {
        let caught = std::panic::catch_unwind(|| teardown_with_a_queued_sender(false));
        let message = caught
            .err()
            .and_then(|e| e.downcast_ref::<&str>().map(|s| s.to_string()))
            .unwrap_or_default();
        assert!(
            message.contains("waker can only be sent across threads"),
            "{message:?}"
        );
    }

    #[test]
    fn a_sent_value_and_a_dropped_sender_reach_the_receiver() {
        let mut rt = monoio::RuntimeBuilder::<monoio::IoUringDriver>::new()
            .build()
            .unwrap();
        rt.block_on(async {
            let _end = RuntimeEnd::arm();
            let (tx, rx) = oneshot::<u32>();
            let got = monoio::spawn(rx);
            tx.send(7);
            assert_eq!(got.await, Some(7));
            let (tx, rx) = oneshot::<u32>();
            let got = monoio::spawn(rx);
            drop(tx);
            assert_eq!(got.await, None);
        });
    }
}
