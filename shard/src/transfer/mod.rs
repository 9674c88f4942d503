//! State transfer between replicas (DESIGN.md section 7, issue 10 items 2
//! and 3): a pure receiver session and a pure serving side, shaped like the
//! replica ([`crate::vsr`]).
//!
//! ```text
//! Receiver::step(input: ReceiverInput, out: &mut Outbox)
//!   Start { trigger, local } | Message { from, msg } | Undecodable { from }
//!   | Tick | IoDone { id, result } | Cancel
//! Server::step(input: ServerInput, out: &mut Outbox)
//!   Message { from, msg, state } | Tick | IoDone { id, result }
//! Output: Send { to, msg } | Io { id, op: TransferOp } | Event
//! ```
//!
//! No clock, socket, thread, filesystem or hash-map iteration order in
//! here: time is a `Tick`, storage is a [`TransferOp`] answered by
//! `IoDone`, nonces and jitter come from a caller-seeded
//! [`crate::vsr::timeout::Rng`] (the driver seeds each boot differently, so
//! an offer made before a restart never echoes a nonce asked after it).
//! [`io`] runs the operations on a `PartitionStore`; the driver runs them
//! in emission order per partition.
//!
//! The receiver takes only the offer echoing its request's nonce, refuses
//! stale or oversized ones ([`Stale`]), pulls chunks with a window of
//! requests (never lockstep), matches each chunk to its request and checks
//! it against the manifest before it goes to storage, and reports the
//! frontier to repair from: the installed one ([`Event::Installed`]), or
//! after a failed attempt the one it had ([`Event::AttemptFailed`]), never
//! a zeroed one. Every retry is bounded by [`Budgets`]: a stall budget then
//! a peer rotation, exponential backoff over consecutive failures (reset
//! only by an install), flat retries after transient refusals, charges
//! per peer with quarantine. The server keeps at most
//! `snapshots_max` snapshots open per partition (leased in ticks) and
//! refuses Busy beyond; it offers only what is at or below its commit
//! (the executor cuts the active tail off the store's manifest).
//!
//! Wiring into the replica (the replica's side is done: it emits
//! `vsr::Event::TransferNeeded` naming the [`Trigger`] to start with,
//! RangeEvicted, RepairStuck, NewOrWiped or CorruptSegment, see the `vsr`
//! module docs; [`route`] splits decoded frames between
//! the replica and these machines; the simulator drives them,
//! `sim/transfer.rs`, and the server, `partition/transfer_host.rs`): on a trigger, step `Receiver` with
//! `Start { trigger, local }` (`local` from the superblock and durable
//! frontier) and keep stepping the replica (it still votes, see
//! `vsr::Replica::is_transferring`; once it is no longer transferring,
//! `Cancel` the receiver); when the receiver emits `BeginInstall`, stop
//! stepping the replica but for its storage completions, let its queued ops
//! drain, then run the install, its CommitInstall marking the superblock
//! wiped in the same write ([`io::Installs::mark_for_commit`]; a crash
//! before that reopens the old log unmarked, whole for the acks it sent;
//! an attempt that does not commit: step the replica again); route
//! SnapshotOffer and Chunk
//! to the receiver, RequestSnapshot, RequestChunks and ReleaseSnapshot to
//! the `Server` (with `ServingState` from the replica's status and
//! commit), a failed decode of either to `Undecodable { from }`, ticks to
//! both; run their `TransferOp`s through [`io::execute`] (one shard-wide
//! [`io::Installs`]) and feed back `IoDone`. On `Event::Installed`, reboot
//! the replica with `Replica::restart` on its frontier (converted with
//! `Anchor::from`): wiped, it repairs from there (its log's link check is
//! [`Frontier::closes_chain`]) and withholds PrepareOk and primaryship until
//! its log is whole; on `AttemptFailed` keep stamping from
//! [`Receiver::frontier`].

mod budget;
pub mod io;
mod receiver;
mod server;
mod types;
pub mod wire;

#[cfg(test)]
mod tests;

pub use budget::{Budgets, BudgetsError, Peers, BACKOFF_EXPONENT_MAX};
pub use receiver::{Receiver, ReceiverConfig, ReceiverInput};
pub use server::{Server, ServerConfig, ServerInput, ServingState};
pub use types::{
    ChunkData, Event, Fault, FaultKind, Frontier, IoId, IoOutcome, Local, Message, Outbox, Output,
    ReceiverCounters, ServerCounters, Stale, TransferOp, Trigger,
};
pub use wire::{route, Routed};
