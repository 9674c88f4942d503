//! The next segment, prepared ahead of the roll (issue 12 item 4): while the
//! active segment fills, a spare file in the live generation directory is
//! created (or taken from the recycle pool) and reserved through the ring,
//! in the background, so a roll only renames it into place, in the same
//! submission that commits the roll (see `PartitionStore::roll`).
//!
//! Nothing names the spare before that commit: a crash leaves it as garbage
//! the next open removes (`collect_garbage`), and a failure preparing it
//! changes no state: the spare is dropped (logged) and the roll provisions
//! its segment itself, as before, where a failure refuses (no space) or
//! fences. At most one spare operation is in flight per partition.
//!
//! The same goes for the active segment's growth: before the appends reach
//! the end of its reservation, the next step is reserved (fallocate) through
//! the ring in the background, so an append finds the room already there
//! and `reserve` makes no call. At most one reservation ahead is in flight
//! per partition; one that fails or lands after the segment rolled changes
//! nothing, and `reserve` then does it (refusing on a full disk) as before.

use std::path::PathBuf;

use super::{
    allocation_target, PartitionStore, Provisioned, StoreError, ALLOCATION_STEP_MAX_BYTES,
    ALLOCATION_STEP_MIN_BYTES,
};
use crate::io::{AlignedBuf, Completion, FileId, IoBackend, Op, OpenMode, Sqe, BLOCK_SIZE};
use crate::segment;

/// The spare's name in the generation directory (not a `.log`: garbage
/// collection unlinks it rather than recycling it).
pub const SPARE_FILE: &str = "next.spare";

/// Where the spare stands.
#[derive(Debug, Default)]
pub(super) enum Spare {
    #[default]
    Absent,
    /// Being created (or renamed in from the recycle pool, `recycled`).
    Opening {
        recycled: bool,
    },
    /// Open as `file`, being reserved (a recycled file is also having its
    /// first block zeroed, durably, as `provision_segment` does).
    Reserving {
        file: FileId,
        allocated_bytes: u64,
    },
    Ready(Provisioned),
    /// The generation it was made in was left (purge, install) while an
    /// op was in flight: its completion only releases the file (`file`, if
    /// it was open already, and whatever the batch opened).
    Orphaned {
        file: Option<FileId>,
    },
}

impl PartitionStore {
    /// Whether a spare should be prepared now: the active segment is half
    /// full, no spare exists or is in the making, the store is healthy.
    pub fn spare_due(&self) -> bool {
        matches!(self.spare, Spare::Absent)
            && self.fenced.is_none()
            && self.installing.is_none()
            && self.active.end_position >= self.active.capacity_bytes / 2
    }

    /// An op of the spare is in flight (see [`PartitionStore::complete_spare`]).
    pub fn spare_in_flight(&self) -> bool {
        matches!(
            self.spare,
            Spare::Opening { .. } | Spare::Reserving { .. } | Spare::Orphaned { .. }
        )
    }

    /// Whether a spare is ready for the next roll.
    pub fn spare_ready(&self) -> bool {
        matches!(self.spare, Spare::Ready(_))
    }

    /// The first step of a spare (only when [`PartitionStore::spare_due`]):
    /// ops to submit as one batch, whose completions go to
    /// [`PartitionStore::complete_spare`].
    pub fn prepare_spare(&mut self) -> Vec<Sqe> {
        assert!(self.spare_due(), "prepare_spare when no spare is due");
        let path = self.spare_path();
        let open = Op::Open {
            path: path.clone(),
            mode: OpenMode::Existing,
            dir: false,
        };
        let sqes = match self.pool.take_recycled() {
            Some(from) => {
                self.spare = Spare::Opening { recycled: true };
                // The rename replaces whatever a failed spare left.
                vec![Sqe::linked(Op::Rename { from, to: path }), Sqe::new(open)]
            }
            None => {
                self.spare = Spare::Opening { recycled: false };
                // A failed spare may have left a recycled file's stale bytes
                // under the name: start from an empty file. (A failed unlink
                // does not stop the chain; NotFound is the usual outcome.)
                vec![
                    Sqe::linked(Op::Unlink { path: path.clone() }),
                    Sqe::new(Op::Open {
                        path,
                        mode: OpenMode::Create,
                        dir: false,
                    }),
                ]
            }
        };
        debug_assert!(self.spare_in_flight());
        sqes
    }

    /// Applies the completions of the spare's batch in flight; returns the
    /// next batch to submit (its completions come back here too), or None
    /// when the spare is ready, failed or was orphaned. Every completion is
    /// checked: a failure drops the spare (closing its file) and is
    /// returned as a typed error for the caller to log or count; it never
    /// fences (nothing durable depends on a spare).
    pub fn complete_spare(
        &mut self,
        io: &mut impl IoBackend,
        completions: Vec<Completion>,
    ) -> Result<Option<Vec<Sqe>>, StoreError> {
        assert!(
            self.spare_in_flight(),
            "complete_spare with nothing in flight"
        );
        let state = std::mem::take(&mut self.spare);
        let path = self.spare_path();
        let failed = first_failure(&completions);
        let opened = completions
            .into_iter()
            .find(|c| matches!(c.op, Op::Open { .. }) && c.result.is_ok())
            .and_then(|c| c.opened().ok());
        match (state, failed) {
            (Spare::Orphaned { file }, _) => {
                file.into_iter().chain(opened).for_each(|f| io.close(f));
                Ok(None)
            }
            (Spare::Reserving { file, .. }, Some((kind, e))) => {
                io.close(file);
                Err(StoreError::io(self.partition_id, kind, path, e))
            }
            (Spare::Opening { .. }, Some((kind, e))) => {
                if let Some(file) = opened {
                    io.close(file);
                }
                Err(StoreError::io(self.partition_id, kind, path, e))
            }
            (Spare::Opening { recycled }, None) => match opened {
                Some(file) => Ok(Some(self.reserve_spare(file, recycled))),
                None => Err(StoreError::io(
                    self.partition_id,
                    "open",
                    path,
                    std::io::Error::other("the spare's open completed without a file"),
                )),
            },
            (
                Spare::Reserving {
                    file,
                    allocated_bytes,
                },
                None,
            ) => {
                self.spare = Spare::Ready(Provisioned {
                    file,
                    allocated_bytes,
                });
                Ok(None)
            }
            (Spare::Absent | Spare::Ready(_), _) => unreachable!("checked in flight above"),
        }
    }

    /// Prepares a spare and waits for it, for callers without a reaper
    /// (tests, tools). A failure is returned, the store stays healthy.
    pub fn provision_spare(&mut self, io: &mut impl IoBackend) -> Result<(), StoreError> {
        let mut sqes = self.prepare_spare();
        loop {
            let completions = io.submit(sqes);
            match self.complete_spare(io, completions)? {
                Some(next) => sqes = next,
                None => return Ok(()),
            }
        }
    }

    /// Takes the ready spare for a roll: the file and the rename that puts
    /// it at `to` (the roll links it before its directory fsync).
    pub(super) fn take_spare(&mut self, to: PathBuf) -> Option<(Provisioned, Op)> {
        if !self.spare_ready() {
            return None;
        }
        let Spare::Ready(provisioned) = std::mem::take(&mut self.spare) else {
            return None;
        };
        let rename = Op::Rename {
            from: self.spare_path(),
            to,
        };
        Some((provisioned, rename))
    }

    /// Leaving the generation (purge, install) or closing: a ready spare's
    /// file is closed and its removal queued on `ops` (`remove`); one in
    /// flight is orphaned.
    pub(super) fn abandon_spare(&mut self, io: &mut impl IoBackend, remove: Option<&mut Vec<Op>>) {
        let path = self.spare_path();
        self.spare = match std::mem::take(&mut self.spare) {
            Spare::Ready(p) => {
                io.close(p.file);
                if let Some(ops) = remove {
                    ops.push(Op::Unlink { path });
                }
                Spare::Absent
            }
            Spare::Absent => Spare::Absent,
            Spare::Opening { .. } => Spare::Orphaned { file: None },
            Spare::Reserving { file, .. } => Spare::Orphaned { file: Some(file) },
            orphaned @ Spare::Orphaned { .. } => orphaned,
        };
    }

    fn spare_path(&self) -> PathBuf {
        self.generation_dir.join(SPARE_FILE)
    }

    /// A fresh spare reserves its frontier record slots and a first step of
    /// data (a partition that filled half a segment is busy, so the largest
    /// step); a recycled one all of its blocks, with its first block zeroed
    /// and made durable (see `allocate_whole_segment`, `zero_first_block`).
    fn reserve_spare(&mut self, file: FileId, recycled: bool) -> Vec<Sqe> {
        let capacity = self.config.segment_size_bytes;
        let slots_at = segment::slot_offset(capacity, 0);
        let slots_end = segment::slot_offset(capacity, segment::SLOTS - 1) + segment::SLOT_BYTES;
        let (sqes, allocated_bytes) = if recycled {
            let mut zeros = AlignedBuf::new(BLOCK_SIZE);
            zeros.set_len(BLOCK_SIZE);
            let allocate = Op::Allocate {
                file,
                offset: 0,
                len_bytes: slots_end,
            };
            let sqes = vec![
                Sqe::linked(allocate),
                Sqe::linked(Op::Write {
                    file,
                    offset: 0,
                    buf: zeros,
                }),
                Sqe::new(Op::Fdatasync { file }),
            ];
            (sqes, capacity)
        } else {
            let target = allocation_target(ALLOCATION_STEP_MAX_BYTES, capacity);
            let sqes = vec![
                Sqe::new(Op::Allocate {
                    file,
                    offset: slots_at,
                    len_bytes: slots_end - slots_at,
                }),
                Sqe::new(Op::Allocate {
                    file,
                    offset: 0,
                    len_bytes: target,
                }),
            ];
            (sqes, target)
        };
        debug_assert!(allocated_bytes <= capacity);
        self.spare = Spare::Reserving {
            file,
            allocated_bytes,
        };
        sqes
    }
}

/// A reservation ahead in flight: the active segment's file and the end it
/// reserves up to.
#[derive(Clone, Copy, Debug)]
pub(super) struct ReserveAhead {
    file: FileId,
    target: u64,
}

impl PartitionStore {
    /// Whether the active segment's next reservation step should be taken
    /// now, ahead: its first reservation is done, it is not reserved to the
    /// end, the appends are within half a step of the reserved end, and no
    /// reservation ahead is in flight.
    pub fn reserve_ahead_due(&self) -> bool {
        let a = &self.active;
        let step = a
            .end_position
            .clamp(ALLOCATION_STEP_MIN_BYTES, ALLOCATION_STEP_MAX_BYTES);
        self.reserving.is_none()
            && self.fenced.is_none()
            && a.allocated_bytes > 0
            && a.allocated_bytes < a.capacity_bytes
            && a.end_position + step / 2 >= a.allocated_bytes
    }

    /// Whether a reservation ahead is in flight (at most one).
    pub fn reserve_ahead_in_flight(&self) -> bool {
        self.reserving.is_some()
    }

    /// The reservation ahead (only when [`PartitionStore::reserve_ahead_due`]):
    /// one op, whose completion goes to [`PartitionStore::complete_reserve_ahead`].
    pub fn prepare_reserve_ahead(&mut self) -> Vec<Sqe> {
        assert!(
            self.reserve_ahead_due(),
            "prepare_reserve_ahead when none is due"
        );
        let a = &self.active;
        let target = allocation_target(a.allocated_bytes, a.capacity_bytes);
        debug_assert!(target > a.allocated_bytes);
        self.reserving = Some(ReserveAhead {
            file: a.file,
            target,
        });
        vec![Sqe::new(Op::Allocate {
            file: a.file,
            offset: 0,
            len_bytes: target,
        })]
    }

    /// Applies the reservation ahead's completion: the active segment is
    /// reserved up to its target, unless it failed (returned, typed, for
    /// the caller to log: nothing changes, `reserve` retries when an
    /// append needs the room) or the segment rolled meanwhile (ignored).
    pub fn complete_reserve_ahead(
        &mut self,
        completions: Vec<Completion>,
    ) -> Result<(), StoreError> {
        let r = self
            .reserving
            .take()
            .expect("complete_reserve_ahead with none in flight");
        let path = segment::log_path(&self.generation_dir, self.active.base_offset);
        if let Some((kind, e)) = first_failure(&completions) {
            return Err(StoreError::io(self.partition_id, kind, path, e));
        }
        if completions.len() != 1 {
            return Err(StoreError::io(
                self.partition_id,
                "fallocate",
                path,
                std::io::Error::other(format!("{} completions for one op", completions.len())),
            ));
        }
        // A file still open is never renumbered: the same id is the same
        // (still active) segment.
        if self.active.file == r.file {
            self.active.allocated_bytes = self.active.allocated_bytes.max(r.target);
        }
        Ok(())
    }
}

/// The kind and error of the first failed op of a spare's batch (an
/// unlink of a missing file is no failure: a fresh spare starts with one).
fn first_failure(completions: &[Completion]) -> Option<(&'static str, std::io::Error)> {
    completions.iter().find_map(|c| match (&c.op, &c.result) {
        (Op::Unlink { .. }, Err(e)) if e.kind() == std::io::ErrorKind::NotFound => None,
        (op, Err(e)) => Some((op.kind(), copy_error(e))),
        _ => None,
    })
}

fn copy_error(e: &std::io::Error) -> std::io::Error {
    match e.raw_os_error() {
        Some(code) => std::io::Error::from_raw_os_error(code),
        None => std::io::Error::new(e.kind(), e.to_string()),
    }
}
