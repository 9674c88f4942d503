//! An install's begin as a resumable step machine, like its end
//! ([`super::Finishing`]): the offer is checked with no I/O, then each step
//! is one submission the caller queues and feeds back
//! ([`PartitionStore::resume_begin`]): whether a staging directory is left
//! over (removed, if so), the staging directory's creation, then one batch
//! opening it and creating every artifact's file. A begin that fails after
//! creating anything closes what it opened and removes the staging
//! directory again before it answers. The first window of disk is taken
//! from the budget before anything is created; its fallocate, like each
//! later window's, goes into the batch of the staged writes it covers.

use std::path::PathBuf;

use ringlog_protocol::manifest::Manifest;

use super::super::retention::removal_batches;
use super::super::{PartitionStore, StoreError, STAGING_DIR};
use super::{Install, InstallBudget, InstallSlot, Reservation, Step};
use crate::io::{align_up, Completion, FileId, IoBackend, Op, OpenMode, Sqe};
use crate::segment;

/// What the caller does next for a [`Beginning`]: at `Done`, the
/// install, or why there is none.
pub type BeginStep = Step<Box<Install>>;

/// A begin in progress (see the module docs).
pub struct Beginning {
    manifest: Manifest,
    /// The first window, taken from the budget before anything is created
    /// (returned if the begin fails), allocated with the first writes.
    reservation: Reservation,
    first_window_bytes: u64,
    staging_dir: PathBuf,
    stage: Stage,
    /// Removals still to submit: the files, then the directories.
    files: Vec<Op>,
    dirs: Vec<Op>,
    /// What a begin cleaning up after a failure returns.
    failure: Option<StoreError>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    StaleExists,
    StaleFiles,
    StaleDirs,
    MakeDir,
    Create,
    CleanFiles,
    CleanDirs,
}

impl PartitionStore {
    /// Checks an offer (see [`PartitionStore::begin_install`]): a refusal
    /// is returned here, with nothing submitted and nothing on disk
    /// changed; otherwise the begin and its first submission.
    pub fn start_begin(
        &mut self,
        io: &mut impl IoBackend,
        manifest: Manifest,
        budget: &InstallBudget,
    ) -> Result<(Beginning, Vec<Sqe>), StoreError> {
        let first_window_bytes = self.check_begin(io, &manifest)?;
        let mut reservation = Reservation {
            budget: budget.clone(),
            bytes: 0,
        };
        reservation
            .take(first_window_bytes)
            .map_err(|e| self.transfer_error(e))?;
        let staging_dir = self.dir.join(STAGING_DIR);
        let sqes = vec![Sqe::new(Op::Exists {
            path: staging_dir.clone(),
        })];
        let b = Beginning {
            manifest,
            reservation,
            first_window_bytes,
            staging_dir,
            stage: Stage::StaleExists,
            files: Vec::new(),
            dirs: Vec::new(),
            failure: None,
        };
        Ok((b, sqes))
    }

    /// The refusals a begin answers before it touches the disk; the bytes
    /// of its first window.
    fn check_begin(
        &mut self,
        io: &mut impl IoBackend,
        manifest: &Manifest,
    ) -> Result<u64, StoreError> {
        self.check_fenced()?;
        self.clear_dropped_install(io)?;
        self.check_offer(manifest)?;
        let window =
            u64::from(manifest.chunk_size_bytes) * self.config.transfer_window_chunks as u64;
        Ok(manifest
            .artifacts
            .first()
            .map_or(0, |a| align_up(a.length_bytes).min(window)))
    }

    /// Feeds the completions of the last [`BeginStep::Submit`] back.
    pub fn resume_begin(
        &mut self,
        io: &mut impl IoBackend,
        b: &mut Beginning,
        completions: Vec<Completion>,
    ) -> BeginStep {
        debug_assert!(!completions.is_empty(), "every step submits something");
        let mut stage = match b.stage {
            Stage::StaleExists => match stale_exists(completions) {
                Ok(true) => match self.queue_removals(io, b) {
                    Ok(()) => Stage::StaleFiles,
                    Err(e) => return BeginStep::Done(Err(e)),
                },
                Ok(false) => Stage::MakeDir,
                Err(e) => return BeginStep::Done(Err(self.begin_io(b, "stat", e))),
            },
            Stage::StaleFiles | Stage::StaleDirs | Stage::MakeDir => {
                if let Some(e) = first_error(completions) {
                    let what = if b.stage == Stage::MakeDir {
                        "mkdir"
                    } else {
                        "remove a stale staging directory"
                    };
                    return BeginStep::Done(Err(self.begin_io(b, what, e)));
                }
                next_stage(b.stage)
            }
            Stage::Create => match self.created(io, b, completions) {
                Ok(install) => return BeginStep::Done(Ok(Box::new(install))),
                Err(e) => {
                    b.failure = Some(e);
                    match self.queue_removals(io, b) {
                        Ok(()) => Stage::CleanFiles,
                        Err(e) => return BeginStep::Done(Err(e)),
                    }
                }
            },
            // A failed removal is logged (the next begin or open removes
            // the garbage); the begin's own failure is the one reported.
            Stage::CleanFiles | Stage::CleanDirs => {
                self.note_removals(completions);
                next_stage(b.stage)
            }
        };
        loop {
            b.stage = stage;
            match self.begin_sqes(b) {
                Some(sqes) if !sqes.is_empty() => return BeginStep::Submit(sqes),
                Some(_) => stage = next_stage(stage),
                None => {
                    let e = b.failure.take().unwrap_or_else(|| {
                        let e = std::io::Error::other("a begin cleaned up without a failure");
                        self.begin_io(b, "install", e)
                    });
                    return BeginStep::Done(Err(e));
                }
            }
        }
    }

    /// The submission of `b.stage` (empty: nothing to do there); None once
    /// a failed begin has cleaned up.
    fn begin_sqes(&self, b: &mut Beginning) -> Option<Vec<Sqe>> {
        let sqes = match b.stage {
            Stage::StaleFiles | Stage::CleanFiles => std::mem::take(&mut b.files),
            Stage::StaleDirs => std::mem::take(&mut b.dirs),
            Stage::CleanDirs if b.dirs.is_empty() => return None,
            Stage::CleanDirs => std::mem::take(&mut b.dirs),
            Stage::MakeDir => vec![Op::MakeDir {
                path: b.staging_dir.clone(),
            }],
            Stage::Create => create_ops(&b.staging_dir, &b.manifest),
            Stage::StaleExists => {
                debug_assert!(false, "the first step is submitted by start_begin");
                Vec::new()
            }
        };
        Some(sqes.into_iter().map(Sqe::new).collect())
    }

    /// Lists the staging directory (a plain getdents call, as an abort's
    /// does: the ring has no op for it) and queues its removal.
    fn queue_removals(
        &mut self,
        io: &mut impl IoBackend,
        b: &mut Beginning,
    ) -> Result<(), StoreError> {
        let ops = self.tree_removals(io, &b.staging_dir)?;
        (b.files, b.dirs) = removal_batches(ops);
        debug_assert_eq!(b.dirs.len(), 1, "one directory to remove");
        Ok(())
    }

    /// The install, once the create batch's completions all succeeded; on
    /// any failure every file it opened is closed again.
    fn created(
        &mut self,
        io: &mut impl IoBackend,
        b: &mut Beginning,
        completions: Vec<Completion>,
    ) -> Result<Install, StoreError> {
        let expected = b.manifest.artifacts.len() + 1;
        let mut opened: Vec<FileId> = Vec::with_capacity(expected);
        let mut failure = None;
        let count = completions.len();
        for c in completions {
            let path = match &c.op {
                Op::Open { path, .. } => path.clone(),
                _ => b.staging_dir.clone(),
            };
            match c.opened() {
                Ok(file) => opened.push(file),
                Err(e) => {
                    failure.get_or_insert_with(|| {
                        StoreError::io(self.partition_id, "create", &path, e)
                    });
                }
            }
        }
        if failure.is_none() && count != expected {
            let e = std::io::Error::other(format!("{count} completions for {expected} opens"));
            failure = Some(self.begin_io(b, "create", e));
        }
        if let Some(e) = failure {
            for file in opened {
                io.close(file);
            }
            return Err(e);
        }
        let dir_file = opened.remove(0);
        Ok(self.new_install(b, dir_file, opened))
    }

    /// The install of `b`'s offer on its created files (the staging
    /// directory's first), registered so a dropped one is noticed.
    fn new_install(&mut self, b: &mut Beginning, dir_file: FileId, files: Vec<FileId>) -> Install {
        assert_eq!(
            files.len(),
            b.manifest.artifacts.len(),
            "a file per artifact"
        );
        let window_chunks = self.config.transfer_window_chunks;
        let manifest = b.manifest.clone();
        let alive = std::sync::Arc::new(());
        let mut held = files.clone();
        held.push(dir_file);
        self.installing = Some(InstallSlot {
            alive: std::sync::Arc::downgrade(&alive),
            files: held,
        });
        let mut allocated = vec![0; files.len()];
        let mut allocations_due = Vec::new();
        if let (Some(&file), true) = (files.first(), b.first_window_bytes > 0) {
            allocated[0] = b.first_window_bytes;
            allocations_due.push(Sqe::new(Op::Allocate {
                file,
                offset: 0,
                len_bytes: b.first_window_bytes,
            }));
        }
        let empty = Reservation {
            budget: b.reservation.budget.clone(),
            bytes: 0,
        };
        let reservation = std::mem::replace(&mut b.reservation, empty);
        debug_assert_eq!(reservation.bytes, b.first_window_bytes);
        Install {
            partition_id: self.partition_id,
            pool: crate::io::BufPool::new(manifest.chunk_size_bytes as usize, window_chunks),
            allocated,
            allocations_due,
            manifest,
            staging_dir: b.staging_dir.clone(),
            staging_dir_file: dir_file,
            files,
            cursor: (0, 0),
            ahead: Default::default(),
            window_chunks,
            verifier: None,
            indexes: Vec::new(),
            chain: None,
            batch_bytes_max: self.config.batch_bytes_max(),
            index_interval_bytes: self.config.index_interval_bytes,
            chunks_written: 0,
            writes_in_flight: Default::default(),
            poisoned: None,
            _alive: alive,
            reservation,
            mark_wiped: false,
        }
    }

    fn begin_io(&self, b: &Beginning, what: &'static str, e: std::io::Error) -> StoreError {
        StoreError::io(self.partition_id, what, &b.staging_dir, e)
    }
}

fn next_stage(stage: Stage) -> Stage {
    match stage {
        Stage::StaleExists | Stage::StaleDirs => Stage::MakeDir,
        Stage::StaleFiles => Stage::StaleDirs,
        Stage::MakeDir => Stage::Create,
        Stage::Create | Stage::CleanFiles => Stage::CleanDirs,
        Stage::CleanDirs => Stage::CleanDirs,
    }
}

/// The staging directory opened (for its fsync at the commit), then an
/// empty file per artifact: independent opens, one batch.
fn create_ops(staging_dir: &std::path::Path, manifest: &Manifest) -> Vec<Op> {
    let dir = Op::Open {
        path: staging_dir.to_path_buf(),
        mode: OpenMode::Existing,
        dir: true,
    };
    let files = manifest.artifacts.iter().map(|a| Op::Open {
        path: segment::log_path(staging_dir, a.base_offset),
        mode: OpenMode::Create,
        dir: false,
    });
    std::iter::once(dir).chain(files).collect()
}

fn stale_exists(completions: Vec<Completion>) -> std::io::Result<bool> {
    let c = crate::io::only(completions)?;
    debug_assert!(matches!(c.op, Op::Exists { .. }), "the stat of the stage");
    c.result.map(|found| found == 1)
}

fn first_error(completions: Vec<Completion>) -> Option<std::io::Error> {
    completions.into_iter().find_map(|c| c.result.err())
}
