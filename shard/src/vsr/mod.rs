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
//! A backup persists log_view = v only once its log holds v's ops (cut,
//! repaired and flushed up to the StartView's op), and a DoViewChange
//! vouches only for the part of the log of views up to the durable
//! log_view. A wiped replica ([`Replica::wiped`]) never votes or leads
//! until its log is whole and its log_view durable, and the superblock
//! says so ([`VsrState::wiped`], so a crash mid-repair reboots it wiped);
//! one that lost its disk ([`VsrState::view_lost`]) may have promised a
//! view it no longer knows, so it also acks nothing, and ends its wipe only
//! once fresh answers to its RequestStartView (a ViewNotice from each
//! replica that is not the normal primary, the primary's StartView) from
//! `n - quorum + 1` peers name no view above its own: any view change
//! quorum holds one of them (Viewstamped Replication's recovery quorum);
//! a restarted one
//! ([`Replica::restart`]) asks for the view (RequestStartView) and joins a
//! view change itself only after `recovering_attempts_max` unanswered
//! rounds, so a cluster that restarted whole still comes back.
//!
//! A cluster of one is its own quorum: restarted with its disk intact and
//! log_view == view it resumes Normal at once with its whole durable log
//! committed (no view change, no superblock write; boot it with
//! `replica_io::recover_lone`), it writes no superblock while it commits,
//! keeps no batch bodies in its journal, arms no heartbeat (so
//! [`Replica::needs_tick`] is false while Normal) and its defaults
//! ([`LONE_PIPELINE_OPS_MAX`], [`LONE_CLIENT_QUEUE_MAX`]) do not cap the
//! shard's group commit.
//!
//! Check-quorum against an asymmetric partition: a Normal replica that is
//! the primary, or heard it within `primary_silent_ticks`, ignores a
//! StartViewChange for a newer view (unless the primary itself sent it),
//! so a view change needs a quorum that lost the primary. A replica left
//! in a newer view that hears the older view's primary again asks it
//! (RequestStartView) to move up: one view change per heal.
//!
//! Not here yet (rest of issue 9 item 2): a lossy (not cut) link from the
//! primary can still depose it each time a lone timeout is followed by
//! a heartbeat that gets through (no pre-vote); no nack quorum (an op
//! is never dropped for lack of a body: the view change waits for its
//! repair); repair has no
//! per-peer budget and always asks one peer; timestamps are the
//! producer's, not the primary's.
//!
//! State transfer's replica side: a replica that cannot catch up by repair
//! emits [`Event::TransferNeeded`] naming its [`Trigger`]:
//! - RangeEvicted: a repair read of ops the peer's store no longer holds
//!   answers RangeEvicted.
//! - RepairStuck: `repair_stuck_rounds_max` repair rounds in a row did
//!   not grow the log (its peers do not answer, or do not hold the ops);
//!   raised once, the count restarts only when the log moves.
//! - NewOrWiped: a wiped replica that holds nothing and whose superblock
//!   names no commit (never repaired or installed anything) is asked to
//!   repair more than `wiped_repair_ops_max` ops (default 256; a smaller
//!   gap is repaired, cheaper than a snapshot). Safe as its repair is: a
//!   wiped replica never votes, leads or acks until whole, whatever fills
//!   its log. It repairs nothing while it waits (a transfer that replaces
//!   the log, [`Trigger::repairs_meanwhile`]); the install writes the
//!   installed commit into the superblock, so the rebooted replica
//!   repairs onto it and never asks again for that log.
//!
//! The rest is the same for every trigger (for RangeEvicted and
//! RepairStuck, repair also goes on):
//! its driver runs the transfer module beside the replica (transfer messages
//! never reach [`Replica::step`]: [`Message::from_wire`] returns None for
//! them). The replica stays a voter meanwhile ([`Replica::is_transferring`]):
//! it keeps voting in view changes with the log it has, rotates its repair
//! peer (another may still hold the ops), and refuses primaryship (at its
//! turn it moves to the next view at once) and PrepareOk, until the next op
//! after its log is appended (the gap closed: the driver cancels the
//! transfer) or it reboots onto an install. One stuck on repair
//! (RepairStuck) stops transferring at its turn as primary instead and
//! leads: the stuck repair was of the old view's log, and the new one is
//! the DoViewChange quorum's, which may be its own. The driver steps it until an
//! offer is taken; from then to the install's end it is frozen: its storage
//! ops drain, the install runs, its commit marking the superblock wiped;
//! on `Installed` it reboots ([`Replica::restart`]) on the installed frontier,
//! wiped (never votes, leads or acks) until its log is whole, unless the
//! install covers its whole log from before (see below).
//!
//! Why its votes are safe (the view-change rule "a new primary holds every
//! committed op" rests on every DoViewChange being truthful): before the
//! install its log is an intact prefix, only shorter than its peers'. It
//! holds every op it ever acked (only a view change's cut of non-canonical
//! ops removed any), its durable log_view is persisted only once its log is
//! the whole log of that view, and its DoViewChange vouches for nothing
//! more (`own_dvc_fields`): the vote of an ordinary replica that is behind.
//! It never leads, so the canonical log of any view it votes in is a peer's
//! with the committed ops (quorum intersection as ever), and its missing
//! ops never become "canonical by absence". The install, the one step that
//! replaces its log (and could drop an acked op), is committed by the same
//! superblock write that marks the replica wiped: from there to a whole
//! log it is a non-voter, also across a crash, while a crash before it
//! reopens the old log unmarked (a mark written on its own, with a crash
//! between, left a voter's old log marked: sim seed 31001553). An install
//! whose last op is at or above the op the replica's log held when it was
//! frozen (a replica that was a voter) dropped nothing it acked: every op
//! it held is at or below the installed commit, so its commit does not
//! mark it and the replica votes again as one that is behind (its view
//! and log_view unchanged). Kept wiped, two such replicas beside one that
//! lost its disk would leave no quorum of voters, and nobody Normal to
//! make them whole. A repair from a rotated peer (not the primary, not
//! the canonical DoViewChange's sender) takes only ops whose canonical
//! header the StartView named: such a peer may hold uncommitted ops of an
//! older view that link all the same.

//!
//! A purge is an op in the log ([`Input::ClientPurge`]: a one-record batch
//! marked `ATTR_PURGE`; a producer's batch carrying the mark is refused).
//! The primary sequences nothing after an uncommitted purge op (client
//! appends wait in its bounded queue), so an uncommitted purge op is
//! always the log's head, and an op after one proves it committed: a
//! replica appending that op commits the purge first. Every replica, as it
//! commits the purge op, emits [`StorageOp::Purge`] before any later
//! storage op and drops its repair reads in flight; the executor applies
//! it once (a store that no longer holds the op has applied it), and store
//! recovery applies one committed but not run before a crash
//! (`replica_io::apply_committed_purge`). Open snapshots do not hold a
//! purge up: it invalidates them, and the transfers they serve end with a
//! final refusal (`UnknownSnapshot`).

/// Whether planted bug `$plant` is on: always false (and compiled out)
/// without the test-only `planted-bugs` feature.
macro_rules! planted {
    ($plant:ident) => {{
        #[cfg(feature = "planted-bugs")]
        let on = crate::vsr::planted::active(crate::vsr::planted::Plant::$plant);
        #[cfg(not(feature = "planted-bugs"))]
        let on = false;
        on
    }};
}

mod log;
#[cfg(feature = "planted-bugs")]
pub mod planted;
mod refuse;
mod replica;
pub mod timeout;
mod types;
mod view_change;
mod wire;

#[cfg(test)]
mod tests;

pub use log::Anchor;
pub use replica::{
    Config, ConfigError, Replica, LONE_CLIENT_QUEUE_MAX, LONE_PIPELINE_OPS_MAX,
    REPAIR_STUCK_ROUNDS_MAX, WIPED_REPAIR_OPS_MAX,
};
pub use types::{
    AppendError, Appended, BatchBytes, Body, ClientBatch, Event, Input, IoFailure, IoId, IoOutcome,
    Message, Outbox, Output, Prepare, Prepares, Status, StorageOp, Token, Trigger, VsrState,
};
