//! Single-thread async primitives for tasks of one shard (no locks, no
//! atomics): a oneshot reply slot and a notify flag.

use std::cell::RefCell;
use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::task::{Context, Poll, Waker};

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
            w.wake();
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
            w.wake();
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
            w.wake();
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
