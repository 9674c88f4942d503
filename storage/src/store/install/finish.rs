//! An install's end (commit or abort) as a resumable step machine, so a
//! shard thread runs it on its ring without waiting: each step is one
//! submission, which the caller queues (`submit_nowait`) and whose reaped
//! completions it feeds back ([`PartitionStore::resume_finish`]) for the
//! next step or the result. The blocking [`PartitionStore::commit_install`]
//! and [`PartitionStore::abort_install`] are loops over the same steps.
//!
//! The commit's order: each artifact's index (create, then write and
//! fdatasync), the segment table, the new active segment (a recycled file
//! renamed, opened, allocated and its first block zeroed, or a fresh one
//! created), an fdatasync of every staged file and an fsync of the staging
//! directory, the removal of a stale generation directory of the target
//! name if one exists, the rename linked to the partition directory's fsync
//! (a submission of its own: a link chain does not stop at a failed rename),
//! the active segment's sync if it is behind, then the superblock (the
//! commit point), then the old generation's removals. Every completion is
//! checked. Failures before the staged sync abort the install; a failed
//! provision, staged sync, directory fsync or superblock write fences (a
//! full disk at provision does not, as for any segment); a failed rename or
//! stat changes nothing and aborts.

use std::path::{Path, PathBuf};

use super::super::retention::removal_batches;
use super::super::{
    check_completions, is_enospc, new_nonce, segment, small_file_sqes, table, ChainPoint,
    PartitionStore, Provisioned, SealedFile, StoreError, SUPERBLOCK_FILE,
};
use super::{Install, Step};
use crate::io::{AlignedBuf, Completion, FileId, IoBackend, Op, OpenMode, Sqe, BLOCK_SIZE};
use crate::segment::{segment_checksum, SealedIndex};
use crate::superblock::{half_for, SealedSegment, Superblock, TableRef};

/// What the caller does next for a [`Finishing`]: at `Done`, the commit
/// or abort is over.
pub type FinishStep = Step<()>;

/// A commit or abort in progress (see the module docs).
pub struct Finishing {
    /// Until the commit lands or the abort has closed its files.
    install: Option<Install>,
    stage: Stage,
    sealed: Vec<SealedFile>,
    table: Option<(Vec<u8>, TableRef)>,
    nonce: u64,
    active: Option<Provisioned>,
    /// The file the stage in flight opened or writes (an index, the table,
    /// the partition directory, the superblock); closed when it ends.
    open: Option<FileId>,
    /// Removals queued: the files, then the directories in a submission
    /// of their own.
    files: Vec<Op>,
    dirs: Vec<Op>,
    /// The superblock being written.
    next_sb: Option<Superblock>,
    /// What the abort in progress returns once its removals ran.
    failure: Option<StoreError>,
    old_table_id: u64,
}

#[derive(Debug, Clone)]
enum Stage {
    IndexOpen(usize),
    IndexWrite(usize),
    TableOpen,
    TableWrite,
    Recycle(PathBuf),
    SegmentOpen { recycled: bool },
    SegmentAllocate,
    SegmentZero,
    StagedSync,
    StaleExists,
    StaleFiles,
    StaleDirs,
    DirOpen,
    Rename,
    SyncBehind,
    SuperblockOpen,
    SuperblockWrite,
    OldFiles,
    OldDirs,
    AbortFiles,
    AbortDirs,
}

/// Where a stage's completions lead.
enum Flow {
    Next(Stage),
    /// Abort the install, then return this error.
    Abort(StoreError),
    /// Return this error (fenced, or nothing left to abort).
    Fail(StoreError),
    Finished,
}

impl Finishing {
    fn new(install: Install, stage: Stage) -> Self {
        Self {
            install: Some(install),
            stage,
            sealed: Vec::new(),
            table: None,
            nonce: 0,
            active: None,
            open: None,
            files: Vec::new(),
            dirs: Vec::new(),
            next_sb: None,
            failure: None,
            old_table_id: 0,
        }
    }

    fn install(&self) -> Result<&Install, StoreError> {
        self.install.as_ref().ok_or_else(|| {
            StoreError::io(
                0,
                "install",
                Path::new(""),
                std::io::Error::other("install gone"),
            )
        })
    }
}

impl PartitionStore {
    /// Starts committing `install` (see the module docs); nothing is
    /// submitted here.
    pub fn start_commit(
        &mut self,
        io: &mut impl IoBackend,
        install: Install,
    ) -> (Finishing, FinishStep) {
        let mut f = Finishing::new(install, Stage::TableOpen);
        f.old_table_id = self.sb.table.id;
        let first = match f.install().and_then(|i| self.check_committable(i)) {
            Err(e) => Flow::Abort(e),
            Ok(()) => self.after_index(&mut f, 0),
        };
        let step = self.enter(io, &mut f, first);
        (f, step)
    }

    /// Starts dropping an unfinished install and its staged files. The
    /// staging directory is listed with a plain call (getdents has no ring
    /// op); the removals are steps.
    pub fn start_abort(
        &mut self,
        io: &mut impl IoBackend,
        install: Install,
    ) -> (Finishing, FinishStep) {
        let mut f = Finishing::new(install, Stage::AbortFiles);
        let step = self.aborting(io, &mut f, None);
        (f, step)
    }

    /// Feeds the completions of the last [`FinishStep::Submit`] back.
    pub fn resume_finish(
        &mut self,
        io: &mut impl IoBackend,
        f: &mut Finishing,
        completions: Vec<Completion>,
    ) -> FinishStep {
        let flow = self.ended(io, f, completions);
        self.enter(io, f, flow)
    }

    /// Follows `flow` to the next submission, or the result.
    fn enter(&mut self, io: &mut impl IoBackend, f: &mut Finishing, mut flow: Flow) -> FinishStep {
        loop {
            let stage = match flow {
                Flow::Next(stage) => stage,
                Flow::Abort(e) => return self.aborting(io, f, Some(e)),
                Flow::Fail(e) => {
                    self.close_held(io, f);
                    return FinishStep::Done(Err(e));
                }
                Flow::Finished => {
                    debug_assert!(f.open.is_none(), "every stage closes what it opened");
                    return FinishStep::Done(f.failure.take().map_or(Ok(()), Err));
                }
            };
            f.stage = stage;
            match self.stage_sqes(f) {
                // An empty submission (no removals) is a stage with no I/O.
                Ok(sqes) if sqes.is_empty() => flow = self.ended(io, f, Vec::new()),
                Ok(sqes) => return FinishStep::Submit(sqes),
                Err(flow_now) => flow = flow_now,
            }
        }
    }

    /// Closes the files a failing commit holds beyond the install's.
    fn close_held(&mut self, io: &mut impl IoBackend, f: &mut Finishing) {
        if let Some(file) = f.open.take() {
            io.close(file);
        }
        if let Some(active) = f.active.take() {
            io.close(active.file);
        }
    }

    /// The abort: closes the install's files and queues the removal of its
    /// staging directory; `failure` is returned once that ran.
    fn aborting(
        &mut self,
        io: &mut impl IoBackend,
        f: &mut Finishing,
        failure: Option<StoreError>,
    ) -> FinishStep {
        self.close_held(io, f);
        let Some(install) = f.install.take() else {
            return FinishStep::Done(failure.map_or(Ok(()), Err));
        };
        self.installing = None;
        for file in install.files {
            io.close(file);
        }
        io.close(install.staging_dir_file);
        f.failure = failure;
        match self.tree_removals(io, &install.staging_dir) {
            // As before: the abort's own failure is the one reported.
            Err(e) => FinishStep::Done(Err(e)),
            Ok(ops) => {
                (f.files, f.dirs) = removal_batches(ops);
                self.enter(io, f, Flow::Next(Stage::AbortFiles))
            }
        }
    }

    /// The next stage after the index of artifact `i - 1` landed.
    fn after_index(&mut self, f: &mut Finishing, i: usize) -> Flow {
        let Ok(install) = f.install() else {
            return Flow::Fail(self.transfer_gone());
        };
        if i < install.manifest.artifacts.len() {
            return Flow::Next(Stage::IndexOpen(i));
        }
        // The new generation's segment table, made durable with the staged
        // files and named by the commit.
        let metas: Vec<SealedSegment> = f.sealed.iter().map(|s| s.meta).collect();
        f.table = Some(table::fresh(self.sb.table.id + 1, &metas));
        Flow::Next(Stage::TableOpen)
    }

    fn transfer_gone(&self) -> StoreError {
        let e = std::io::Error::other("the install left the commit");
        StoreError::io(self.partition_id, "install", &self.dir, e)
    }

    /// The staging paths the commit writes.
    fn finish_paths(&self, install: &Install, stage: &Stage) -> PathBuf {
        let m = &install.manifest;
        match stage {
            Stage::IndexOpen(i) | Stage::IndexWrite(i) => {
                let base = m.artifacts.get(*i).map_or(0, |a| a.base_offset);
                segment::index_path(&install.staging_dir, base)
            }
            Stage::TableOpen | Stage::TableWrite => {
                table::path(&install.staging_dir, self.sb.table.id + 1)
            }
            Stage::StaleExists | Stage::Rename => {
                segment::generation_dir(&self.dir, self.sb.live_generation + 1)
            }
            Stage::SuperblockOpen | Stage::SuperblockWrite => self.dir.join(SUPERBLOCK_FILE),
            _ => segment::log_path(&install.staging_dir, m.next_offset),
        }
    }

    /// The submission of `f.stage`, or where to go instead.
    fn stage_sqes(&mut self, f: &mut Finishing) -> Result<Vec<Sqe>, Flow> {
        match f.stage {
            Stage::StaleFiles | Stage::OldFiles | Stage::AbortFiles => {
                return Ok(std::mem::take(&mut f.files)
                    .into_iter()
                    .map(Sqe::new)
                    .collect());
            }
            Stage::StaleDirs | Stage::OldDirs | Stage::AbortDirs => {
                return Ok(std::mem::take(&mut f.dirs)
                    .into_iter()
                    .map(Sqe::new)
                    .collect());
            }
            _ => {}
        }
        let install = f.install().map_err(Flow::Fail)?;
        let path = self.finish_paths(install, &f.stage);
        let open = |path: PathBuf, mode, dir| vec![Sqe::new(Op::Open { path, mode, dir })];
        let held = f.open;
        let needs_held = matches!(
            f.stage,
            Stage::IndexWrite(_) | Stage::TableWrite | Stage::Rename | Stage::SuperblockWrite
        );
        if needs_held && held.is_none() {
            return Err(Flow::Fail(self.transfer_gone()));
        }
        let held_file = held.unwrap_or(FileId(u32::MAX));
        let sqes = match f.stage.clone() {
            Stage::IndexOpen(i) => {
                let a = &install.manifest.artifacts[i];
                if segment_checksum(&a.chunk_checksums) != a.checksum {
                    return Err(Flow::Abort(self.transfer_error(
                        crate::store::TransferError::Verification {
                            artifact: i as u32,
                            reason: "artifact checksum differs from its chunk checksums".into(),
                        },
                    )));
                }
                open(path, OpenMode::Create, false)
            }
            Stage::IndexWrite(i) => {
                let (sqes, sealed) = index_sqes(install, i, held_file);
                f.sealed.push(sealed);
                sqes
            }
            Stage::TableOpen => open(path, OpenMode::Create, false),
            Stage::TableWrite => {
                let bytes = f.table.as_ref().map_or(&[][..], |(b, _)| &b[..]);
                last_unlinked(small_file_sqes(held_file, bytes))
            }
            Stage::Recycle(from) => vec![Sqe::new(Op::Rename { from, to: path })],
            Stage::SegmentOpen { recycled } => {
                let mode = if recycled {
                    OpenMode::Existing
                } else {
                    OpenMode::Create
                };
                open(path, mode, false)
            }
            Stage::SegmentAllocate | Stage::SegmentZero => self.segment_sqes(f),
            Stage::StagedSync => staged_sync_sqes(install),
            Stage::StaleExists => vec![Sqe::new(Op::Exists { path })],
            Stage::StaleFiles
            | Stage::OldFiles
            | Stage::AbortFiles
            | Stage::StaleDirs
            | Stage::OldDirs
            | Stage::AbortDirs => Vec::new(),
            Stage::DirOpen => open(self.dir.clone(), OpenMode::Existing, true),
            Stage::Rename => rename_sqes(install, path, held_file),
            Stage::SyncBehind => {
                // The frontier the superblock names is durable in the
                // segment (as for every superblock write).
                debug_assert!(self.flushing.is_none(), "sync behind a flush in flight");
                vec![Sqe::new(Op::Fdatasync {
                    file: self.active.file,
                })]
            }
            Stage::SuperblockOpen => open(path, OpenMode::Existing, false),
            Stage::SuperblockWrite => {
                let next = self.installed(f);
                debug_assert_eq!(next.sequence, self.sb.sequence + 1);
                debug_assert!(next.frontier.next_offset >= self.sb.frontier.next_offset);
                let sqes = self.superblock_sqes(held_file, &next, &half_for(next.sequence));
                f.next_sb = Some(next);
                sqes
            }
        };
        Ok(sqes)
    }

    /// The superblock that names the install, from what the steps made.
    fn installed(&self, f: &Finishing) -> Superblock {
        let generation = self.sb.live_generation + 1;
        let table = f.table.as_ref().map(|(_, t)| *t).unwrap_or_default();
        let install = f.install.as_ref();
        debug_assert!(
            install.is_some(),
            "the install is held until the commit lands"
        );
        match install {
            Some(i) => self.installed_superblock(i, generation, table, f.nonce),
            None => self.sb.successor(),
        }
    }

    /// A recycled active segment's allocation, then its zeroed first block.
    fn segment_sqes(&self, f: &Finishing) -> Vec<Sqe> {
        let Some(file) = f.active.as_ref().map(|a| a.file) else {
            debug_assert!(false, "the segment is opened before it is allocated");
            return Vec::new();
        };
        if matches!(f.stage, Stage::SegmentAllocate) {
            let capacity = self.config.segment_size_bytes;
            let end = segment::slot_offset(capacity, segment::SLOTS - 1) + segment::SLOT_BYTES;
            return vec![Sqe::new(Op::Allocate {
                file,
                offset: 0,
                len_bytes: end,
            })];
        }
        let mut buf = AlignedBuf::new(BLOCK_SIZE);
        buf.set_len(BLOCK_SIZE);
        vec![
            Sqe::linked(Op::Write {
                file,
                offset: 0,
                buf,
            }),
            Sqe::new(Op::Fdatasync { file }),
        ]
    }
}

/// `sqes` with the link to whatever follows removed.
fn last_unlinked(mut sqes: Vec<Sqe>) -> Vec<Sqe> {
    if let Some(last) = sqes.last_mut() {
        last.link_next = false;
    }
    sqes
}

/// Artifact `i`'s index written to `file` (its index file, open), and the
/// artifact as a sealed segment.
fn index_sqes(install: &Install, i: usize, file: FileId) -> (Vec<Sqe>, SealedFile) {
    let m = &install.manifest;
    let a = &m.artifacts[i];
    assert!(
        i < install.indexes.len(),
        "a committable install indexed every artifact"
    );
    let idx = SealedIndex {
        index: install.indexes[i].clone(),
        chunk_size_bytes: m.chunk_size_bytes,
        chunk_checksums: a.chunk_checksums.clone(),
    };
    let sqes = small_file_sqes(file, &idx.encode(a.base_offset));
    let sealed = SealedFile {
        meta: SealedSegment {
            base_offset: a.base_offset,
            end_offset: a.end_offset,
            length_bytes: a.length_bytes,
            checksum: a.checksum,
            last_batch_checksum: a.last_batch_checksum,
            max_timestamp_ms: a.max_timestamp_ms,
        },
        file: install.files[i],
        index: idx.index,
        chunk_checksums: idx.chunk_checksums,
        index_persisted: true,
    };
    (last_unlinked(sqes), sealed)
}

/// Everything staged made durable before the rename.
fn staged_sync_sqes(install: &Install) -> Vec<Sqe> {
    let mut sqes: Vec<Sqe> = install
        .files
        .iter()
        .map(|&file| Sqe::new(Op::Fdatasync { file }))
        .collect();
    sqes.push(Sqe::new(Op::Fsync {
        file: install.staging_dir_file,
    }));
    sqes
}

/// The rename of the staging directory linked to the partition
/// directory's fsync (`dir_file`).
fn rename_sqes(install: &Install, to: PathBuf, dir_file: FileId) -> Vec<Sqe> {
    debug_assert_ne!(install.staging_dir, to, "a rename to the next generation");
    vec![
        Sqe::linked(Op::Rename {
            from: install.staging_dir.clone(),
            to,
        }),
        Sqe::new(Op::Fsync { file: dir_file }),
    ]
}

/// The file of an [`Op::Open`] batch's one completion.
fn opened(completions: Vec<Completion>) -> std::io::Result<FileId> {
    match crate::io::only(completions) {
        Ok(c) => c.opened(),
        Err(e) => Err(e),
    }
}

impl PartitionStore {
    /// Where the completions of `f.stage` lead.
    fn ended(
        &mut self,
        io: &mut impl IoBackend,
        f: &mut Finishing,
        completions: Vec<Completion>,
    ) -> Flow {
        let pid = self.partition_id;
        let Some(install) = f.install.as_ref() else {
            // Only the abort's removals run without the install.
            return self.removals_ended(f, completions);
        };
        let path = self.finish_paths(install, &f.stage);
        let io_err = |kind: &'static str, path: &Path, e| StoreError::io(pid, kind, path, e);
        match f.stage.clone() {
            Stage::IndexOpen(_) | Stage::TableOpen | Stage::DirOpen | Stage::SuperblockOpen => {
                let (kind, abort) = match f.stage {
                    Stage::SuperblockOpen => ("open", false),
                    Stage::DirOpen => ("open", true),
                    _ => ("create", true),
                };
                let path = if matches!(f.stage, Stage::DirOpen) {
                    self.dir.clone()
                } else {
                    path
                };
                match opened(completions) {
                    Ok(file) => self.opened_ended(io, f, file),
                    Err(e) if abort => Flow::Abort(io_err(kind, &path, e)),
                    Err(e) => Flow::Fail(io_err(kind, &path, e)),
                }
            }
            Stage::IndexWrite(i) => match self.small_write_ended(io, f, completions, &path) {
                Ok(()) => self.after_index(f, i + 1),
                Err(e) => Flow::Abort(e),
            },
            Stage::TableWrite => match self.small_write_ended(io, f, completions, &path) {
                Ok(()) => self.after_table(f),
                Err(e) => Flow::Abort(e),
            },
            Stage::Recycle(_) | Stage::SegmentOpen { .. } => {
                self.segment_opened(f, completions, &path)
            }
            Stage::SegmentAllocate | Stage::SegmentZero => {
                self.segment_ended(f, completions, &path)
            }
            Stage::StagedSync => {
                let ops = install.files.len() + 1;
                match check_completions(completions, ops) {
                    Ok(_) => Flow::Next(Stage::StaleExists),
                    Err((kind, e)) => Flow::Fail(self.fence(format!("staged {kind} failed: {e}"))),
                }
            }
            Stage::StaleExists => self.stale_ended(io, f, completions, &path),
            Stage::Rename => self.rename_ended(io, f, completions),
            Stage::SyncBehind => match check_completions(completions, 1) {
                Ok(_) => {
                    self.behind = false;
                    Flow::Next(Stage::SuperblockOpen)
                }
                Err((kind, e)) => {
                    Flow::Fail(self.fence(format!("segment {kind} behind the journal failed: {e}")))
                }
            },
            Stage::SuperblockWrite => self.superblock_ended(io, f, completions),
            _ => self.removals_ended(f, completions),
        }
    }

    /// An open landed: the file is held for the stage that writes it.
    fn opened_ended(&mut self, io: &mut impl IoBackend, f: &mut Finishing, file: FileId) -> Flow {
        debug_assert!(f.open.is_none(), "one file opened at a time");
        match f.stage {
            Stage::IndexOpen(i) => {
                f.open = Some(file);
                Flow::Next(Stage::IndexWrite(i))
            }
            Stage::TableOpen if f.table.as_ref().is_some_and(|(b, _)| b.is_empty()) => {
                // Nothing to write: the file only has to exist for the next
                // roll.
                io.close(file);
                self.after_table(f)
            }
            Stage::TableOpen => {
                f.open = Some(file);
                Flow::Next(Stage::TableWrite)
            }
            Stage::DirOpen => {
                f.open = Some(file);
                Flow::Next(Stage::Rename)
            }
            _ => {
                f.open = Some(file);
                Flow::Next(Stage::SuperblockWrite)
            }
        }
    }

    /// A small file's write and fdatasync: checked, the file closed.
    fn small_write_ended(
        &mut self,
        io: &mut impl IoBackend,
        f: &mut Finishing,
        completions: Vec<Completion>,
        path: &Path,
    ) -> Result<(), StoreError> {
        if let Some(file) = f.open.take() {
            io.close(file);
        }
        check_completions(completions, 2)
            .map(|_| ())
            .map_err(|(kind, e)| StoreError::io(self.partition_id, kind, path, e))
    }

    /// The table is written: the nonce, then the new active segment.
    fn after_table(&mut self, f: &mut Finishing) -> Flow {
        let Ok(install) = f.install() else {
            return Flow::Fail(self.transfer_gone());
        };
        match new_nonce(self.partition_id, &install.staging_dir) {
            Ok(nonce) => f.nonce = nonce,
            Err(e) => return Flow::Abort(e),
        }
        match self.pool.take_recycled() {
            Some(from) => Flow::Next(Stage::Recycle(from)),
            None => Flow::Next(Stage::SegmentOpen { recycled: false }),
        }
    }

    /// A failed provision of the active segment: a full disk changes no
    /// state; anything else fences.
    fn provision_failed(&mut self, kind: &'static str, path: &Path, e: std::io::Error) -> Flow {
        let pid = self.partition_id;
        if is_enospc(&e) {
            return Flow::Fail(StoreError::DiskFull {
                partition_id: pid,
                path: path.into(),
            });
        }
        Flow::Fail(self.fence(StoreError::io(pid, kind, path, e).to_string()))
    }

    fn segment_opened(
        &mut self,
        f: &mut Finishing,
        completions: Vec<Completion>,
        path: &Path,
    ) -> Flow {
        match f.stage.clone() {
            Stage::Recycle(from) => match check_completions(completions, 1) {
                Ok(_) => Flow::Next(Stage::SegmentOpen { recycled: true }),
                Err((_, e)) => self.provision_failed("rename", &from, e),
            },
            Stage::SegmentOpen { recycled } => match opened(completions) {
                Ok(file) => {
                    let capacity = self.config.segment_size_bytes;
                    f.active = Some(Provisioned {
                        file,
                        allocated_bytes: if recycled { capacity } else { 0 },
                    });
                    let next = if recycled {
                        Stage::SegmentAllocate
                    } else {
                        Stage::StagedSync
                    };
                    Flow::Next(next)
                }
                Err(e) => {
                    let kind = if recycled { "open" } else { "create" };
                    self.provision_failed(kind, path, e)
                }
            },
            _ => Flow::Fail(self.transfer_gone()),
        }
    }

    fn segment_ended(
        &mut self,
        f: &mut Finishing,
        completions: Vec<Completion>,
        path: &Path,
    ) -> Flow {
        let (ops, next) = match f.stage {
            Stage::SegmentAllocate => (1, Stage::SegmentZero),
            _ => (2, Stage::StagedSync),
        };
        match check_completions(completions, ops) {
            Ok(_) => Flow::Next(next),
            Err((kind, e)) => self.provision_failed(kind, path, e),
        }
    }

    /// A directory of the next generation's name is garbage the superblock
    /// does not name (an attempt that never committed, whose removal
    /// failed): removed before the rename.
    fn stale_ended(
        &mut self,
        io: &mut impl IoBackend,
        f: &mut Finishing,
        completions: Vec<Completion>,
        to: &Path,
    ) -> Flow {
        let pid = self.partition_id;
        let exists = crate::io::only(completions).and_then(|c| c.result);
        match exists {
            Err(e) => Flow::Abort(StoreError::io(pid, "stat", to, e)),
            Ok(0) => Flow::Next(Stage::DirOpen),
            Ok(_) => {
                tracing::warn!(partition = pid, dir = %to.display(), "removing a stale generation");
                match self.tree_removals(io, to) {
                    Err(e) => Flow::Abort(e),
                    Ok(ops) => {
                        (f.files, f.dirs) = removal_batches(ops);
                        Flow::Next(Stage::StaleFiles)
                    }
                }
            }
        }
    }

    /// The rename and the partition directory's fsync: a failed rename
    /// changes nothing (aborted); a failed fsync fences.
    fn rename_ended(
        &mut self,
        io: &mut impl IoBackend,
        f: &mut Finishing,
        completions: Vec<Completion>,
    ) -> Flow {
        if let Some(dir_file) = f.open.take() {
            io.close(dir_file);
        }
        let n = completions.len();
        let mut results = completions.into_iter().map(|c| c.result);
        let lost = || Err(std::io::Error::other(format!("{n} completions for 2 ops")));
        let renamed = results.next().unwrap_or_else(lost);
        let synced = results.next().unwrap_or_else(lost);
        let from = f
            .install
            .as_ref()
            .map(|i| i.staging_dir.clone())
            .unwrap_or_default();
        if let Err(e) = renamed {
            return Flow::Abort(StoreError::io(self.partition_id, "rename", from, e));
        }
        match synced {
            Ok(_) if self.behind => Flow::Next(Stage::SyncBehind),
            Ok(_) => Flow::Next(Stage::SuperblockOpen),
            Err(e) => Flow::Fail(self.fence(format!("install commit directory fsync failed: {e}"))),
        }
    }

    /// The commit point landed (or fenced): the store switches over to the
    /// installed generation and removes the old one.
    fn superblock_ended(
        &mut self,
        io: &mut impl IoBackend,
        f: &mut Finishing,
        completions: Vec<Completion>,
    ) -> Flow {
        if let Some(sb_file) = f.open.take() {
            io.close(sb_file);
        }
        let ops = 1 + half_for(self.sb.sequence + 1).len();
        if let Err((kind, e)) = check_completions(completions, ops) {
            return Flow::Fail(self.fence(format!("superblock {kind} failed: {e}")));
        }
        let (Some(next), Some(install), Some(active)) =
            (f.next_sb.take(), f.install.take(), f.active.take())
        else {
            return Flow::Fail(self.transfer_gone());
        };
        self.superblock_written(next);
        let m = &install.manifest;
        tracing::info!(
            partition = self.partition_id,
            next_offset = m.next_offset,
            segments = f.sealed.len(),
            "snapshot installed"
        );
        let chain = ChainPoint {
            next_offset: m.next_offset,
            last_checksum: m.last_checksum,
            last_op: m.last_op,
        };
        self.chain = chain;
        self.durable = chain;
        self.installing = None;
        // The old generation's files go next: no snapshot may read them.
        self.invalidate_snapshots();
        io.close(install.staging_dir_file);
        let generation_dir = segment::generation_dir(&self.dir, self.sb.live_generation);
        let sealed = std::mem::take(&mut f.sealed);
        let old = (generation_dir, f.old_table_id);
        let ops = self.switch_generation_ops(io, old, sealed, (active, chain));
        (f.files, f.dirs) = removal_batches(ops);
        Flow::Next(Stage::OldFiles)
    }

    /// Removals ran: failures only leave garbage the next open removes.
    fn removals_ended(&mut self, f: &mut Finishing, completions: Vec<Completion>) -> Flow {
        self.note_removals(completions);
        match f.stage {
            Stage::StaleFiles => Flow::Next(Stage::StaleDirs),
            Stage::StaleDirs => Flow::Next(Stage::DirOpen),
            Stage::OldFiles => Flow::Next(Stage::OldDirs),
            Stage::AbortFiles => Flow::Next(Stage::AbortDirs),
            Stage::OldDirs | Stage::AbortDirs => Flow::Finished,
            _ => Flow::Fail(self.transfer_gone()),
        }
    }
}
