//! Planted bugs (test-only cargo feature `planted-bugs`): each turns one
//! rule of the machine off, so a test can show the simulator catches it
//! (`shard/tests/planted.rs`). One build covers all; a thread-local picks
//! the active one, so tests on other threads run the machine unchanged.
//! Without the feature this module and every hook compile to nothing.

use std::cell::Cell;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plant {
    /// A backup sends PrepareOk when it appends, before the op's fsync.
    AckBeforeFsync,
    /// DoViewChange carries the in-memory log_view and skips the gate.
    LogViewNotPersistedBeforeDoViewChange,
    /// A duplicate PrepareOk is counted as another replica's vote.
    DuplicatePrepareOkCounted,
    /// A cut of the log goes one op below the commit.
    TruncateBelowCommit,
    /// The transfer receiver takes an offer without comparing its purge
    /// generation with its own (`transfer::Receiver::check_offer`).
    InstallIgnoresPurgeGeneration,
}

pub const ALL: [Plant; 5] = [
    Plant::AckBeforeFsync,
    Plant::LogViewNotPersistedBeforeDoViewChange,
    Plant::DuplicatePrepareOkCounted,
    Plant::TruncateBelowCommit,
    Plant::InstallIgnoresPurgeGeneration,
];

thread_local! {
    static ACTIVE: Cell<Option<Plant>> = const { Cell::new(None) };
}

/// Turns `plant` on for this thread (None: the machine as written).
pub fn set(plant: Option<Plant>) {
    ACTIVE.with(|a| a.set(plant));
}

pub fn active(plant: Plant) -> bool {
    ACTIVE.with(|a| a.get()) == Some(plant)
}
