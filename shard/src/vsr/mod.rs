//! Viewstamped Replication for one partition: a pure replica state machine
//! (DESIGN.md section 6), shaped like quinn-proto / raft-rs `RawNode`.
//!
//! ```text
//! Replica::step(&mut self, input: Input, out: &mut Outbox)
//! Input:  Message { from, msg } | Tick | ClientAppend { token, batch } | IoDone { id, result }
//! Output: Send { to, msg } | Io { id, op: StorageOp } | Reply { token, result } | Event
//! ```
//!
//! No clock, socket, thread, filesystem or hash-map iteration order in
//! here: time is [`Input::Tick`], storage is [`StorageOp`] answered by
//! [`Input::IoDone`], jitter comes from a caller-seeded [`timeout::Rng`].
//!
//! Durability gates live inside the machine (not in the driver, unlike
//! raft-rs `Ready`): a message carrying view v is held until v is durable;
//! DoViewChange, StartView and PrepareOk are held until the log_view they
//! vouch for is durable; PrepareOk(op) is only produced once the Flush
//! covering op completed. A failed Append, Flush, TruncateAbove or
//! PersistVsr fences the replica (fail-stop): nothing it held leaves.
//!
//! Not here yet (issue 9 item 2): repair across segment rolls of ops the
//! journal no longer holds in memory is answered through
//! [`StorageOp::ReadBatches`], but without a retry budget per peer; a
//! deposing guard against asymmetric partitions; nack-quorum drops.

mod log;
mod replica;
pub mod timeout;
mod types;
mod view_change;
mod wire;

#[cfg(test)]
mod tests;

pub use log::Anchor;
pub use replica::{Config, ConfigError, Replica};
pub use types::{
    AppendError, Appended, BatchBytes, Body, Event, Input, IoFailure, IoId, IoOutcome, Message,
    Outbox, Output, Prepare, Prepares, Status, StorageOp, Token, VsrState,
};
