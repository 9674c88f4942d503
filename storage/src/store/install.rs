//! Installing a snapshot from a peer: staged, verified, committed atomically.
//!
//! 1. [`PartitionStore::begin_install`] refuses stale or oversized offers
//!    (purge generation, frontier or commit below ours; more artifacts or
//!    bigger ones than we could hold; another chunk size), then creates the
//!    staging directory with one file per artifact.
//! 2. [`Install::accept_chunk`] verifies each chunk against the manifest and
//!    writes it straight to its place in the staged file: memory is one chunk
//!    buffer here, whatever the segment size; the caller bounds the chunks in
//!    flight.
//! 3. [`PartitionStore::commit_install`] verifies every staged artifact as a
//!    log (batches, offsets, hash chain, whole-file checksum) while rebuilding
//!    its index, fsyncs the staged files and then, in one linked submission,
//!    renames the staging directory to the next generation, fsyncs the
//!    partition directory and writes the superblock copy by copy. Every
//!    completion is checked; the superblock write is the commit point.
//!
//! Recovery needs nothing but the superblock: if it names a generation whose
//! directory is still called `staging` (the rename did not land), the rename
//! is rolled forward; otherwise `staging` is garbage and rolled back.

use std::path::{Path, PathBuf};

use ringlog_protocol::checksum;
use ringlog_protocol::manifest::Manifest;

use super::open::list;
use super::walk::{Visit, WalkStop, Walker};
use super::{
    submit_checked, write_new_file, ActiveSegment, ChainPoint, PartitionStore, SealedFile,
    StoreError, TransferError, STAGING_DIR,
};
use crate::io::{AlignedBuf, FileId, IoBackend, Op, OpenMode, Sqe};
use crate::segment::{self, SealedIndex, SegmentHasher, SparseIndex};
use crate::superblock::{half_for, Frontier, SealedSegment, SEGMENTS_MAX};

/// Read size of the verification pass over staged artifacts.
const VERIFY_CHUNK_BYTES: usize = 1024 * 1024;

/// An install in progress: the offer and what has arrived of it.
pub struct Install {
    partition_id: u32,
    manifest: Manifest,
    staging_dir: PathBuf,
    staging_dir_file: FileId,
    /// One staged file per artifact.
    files: Vec<FileId>,
    /// Per artifact, which chunks have landed.
    received: Vec<Vec<bool>>,
    missing_chunks: u64,
    /// The one chunk buffer (O_DIRECT needs aligned memory).
    buf: AlignedBuf,
}

impl Install {
    pub fn manifest(&self) -> &Manifest {
        &self.manifest
    }

    /// Chunks still to fetch, as (artifact, chunk).
    pub fn missing(&self) -> impl Iterator<Item = (u32, u32)> + '_ {
        self.received.iter().enumerate().flat_map(|(a, chunks)| {
            chunks
                .iter()
                .enumerate()
                .filter(|(_, done)| !**done)
                .map(move |(c, _)| (a as u32, c as u32))
        })
    }

    pub fn missing_count(&self) -> u64 {
        self.missing_chunks
    }

    /// Verifies one chunk against the manifest and writes it to its staged
    /// file. A duplicate of a chunk already written is ignored.
    pub fn accept_chunk(
        &mut self,
        io: &mut impl IoBackend,
        artifact: u32,
        chunk: u32,
        bytes: &[u8],
    ) -> Result<(), StoreError> {
        let refuse = |source| StoreError::Transfer {
            partition_id: self.partition_id,
            source,
        };
        let Some(a) = self.manifest.artifacts.get(artifact as usize) else {
            return Err(refuse(TransferError::ChunkOutOfRange { artifact, chunk }));
        };
        let Some(&expected) = a.chunk_checksums.get(chunk as usize) else {
            return Err(refuse(TransferError::ChunkOutOfRange { artifact, chunk }));
        };
        let chunk_bytes = u64::from(self.manifest.chunk_size_bytes);
        let offset = u64::from(chunk) * chunk_bytes;
        let len = chunk_bytes.min(a.length_bytes - offset) as usize;
        if bytes.len() != len {
            let reason = format!("{} bytes, expected {len}", bytes.len());
            return Err(refuse(TransferError::BadChunk {
                artifact,
                chunk,
                reason,
            }));
        }
        if checksum(bytes) != expected {
            let reason = "checksum mismatch".to_string();
            return Err(refuse(TransferError::BadChunk {
                artifact,
                chunk,
                reason,
            }));
        }
        if self.received[artifact as usize][chunk as usize] {
            return Ok(());
        }
        let mut buf = std::mem::replace(&mut self.buf, AlignedBuf::new(0));
        buf.clear();
        buf.extend_from_slice(bytes);
        // The tail of a last, short chunk is padded with zeros: O_DIRECT
        // writes whole blocks, and the artifact's length says where it ends.
        let padded = crate::io::align_up(len as u64) as usize;
        buf.full_mut()[len..padded].fill(0);
        buf.set_len(padded);
        let write = Op::Write {
            file: self.files[artifact as usize],
            offset,
            buf,
        };
        let result = submit_checked(io, vec![Sqe::new(write)]);
        let path = segment::log_path(&self.staging_dir, a.base_offset);
        match result {
            Ok(mut completions) => {
                let c = completions.pop().expect("one completion per op");
                self.buf = c.op.into_buf().expect("write returns its buffer");
            }
            Err((kind, e)) => {
                self.buf = AlignedBuf::new(chunk_bytes as usize);
                return Err(StoreError::io(self.partition_id, kind, path, e));
            }
        }
        self.received[artifact as usize][chunk as usize] = true;
        self.missing_chunks -= 1;
        Ok(())
    }
}

impl PartitionStore {
    /// Checks an offer and prepares to stage it. Refusals are typed
    /// [`TransferError`]s; nothing on disk changes for a refused offer.
    pub fn begin_install(
        &mut self,
        io: &mut impl IoBackend,
        manifest: Manifest,
    ) -> Result<Install, StoreError> {
        self.check_fenced()?;
        if self.installing {
            return Err(self.transfer_error(TransferError::InstallInProgress));
        }
        self.check_offer(&manifest)?;
        let pid = self.partition_id;
        let staging_dir = self.dir.join(STAGING_DIR);
        // Leftovers of an install abandoned earlier in this process.
        if io
            .exists(&staging_dir)
            .map_err(|e| StoreError::io(pid, "stat", &staging_dir, e))?
        {
            self.remove_tree(io, &staging_dir)?;
        }
        io.create_dir(&staging_dir)
            .map_err(|e| StoreError::io(pid, "mkdir", &staging_dir, e))?;
        let staging_dir_file = io
            .open_dir(&staging_dir)
            .map_err(|e| StoreError::io(pid, "open", &staging_dir, e))?;
        let mut files = Vec::with_capacity(manifest.artifacts.len());
        for a in &manifest.artifacts {
            let path = segment::log_path(&staging_dir, a.base_offset);
            let file = io
                .open_file(&path, OpenMode::Create)
                .map_err(|e| StoreError::io(pid, "create", &path, e))?;
            files.push(file);
        }
        let received: Vec<Vec<bool>> = manifest
            .artifacts
            .iter()
            .map(|a| vec![false; a.chunk_checksums.len()])
            .collect();
        let missing_chunks = received.iter().map(|r| r.len() as u64).sum();
        self.installing = true;
        Ok(Install {
            partition_id: pid,
            buf: AlignedBuf::new(manifest.chunk_size_bytes as usize),
            manifest,
            staging_dir,
            staging_dir_file,
            files,
            received,
            missing_chunks,
        })
    }

    /// Drops an unfinished install and its staged files.
    pub fn abort_install(
        &mut self,
        io: &mut impl IoBackend,
        install: Install,
    ) -> Result<(), StoreError> {
        self.installing = false;
        for file in install.files {
            io.close(file);
        }
        io.close(install.staging_dir_file);
        self.remove_tree(io, &install.staging_dir)
    }

    /// Verifies the staged snapshot and makes it this partition's state.
    pub fn commit_install(
        &mut self,
        io: &mut impl IoBackend,
        install: Install,
    ) -> Result<(), StoreError> {
        if install.missing_chunks > 0 {
            let missing = install.missing_chunks;
            self.abort_install(io, install)?;
            return Err(self.transfer_error(TransferError::Incomplete { missing }));
        }
        // The log may have moved (a purge, appends) since the offer arrived.
        if let Err(e) = self.check_offer(&install.manifest) {
            self.abort_install(io, install)?;
            return Err(e);
        }
        let sealed = match self.verify_staged(io, &install) {
            Ok(sealed) => sealed,
            Err(e) => {
                self.abort_install(io, install)?;
                return Err(e);
            }
        };
        let m = &install.manifest;
        let active_path = segment::log_path(&install.staging_dir, m.next_offset);
        let active_file = self.provision_segment(io, &active_path)?;

        // Everything staged is durable before the commit chain starts.
        let mut sqes: Vec<Sqe> = install
            .files
            .iter()
            .map(|&file| Sqe::new(Op::Fdatasync { file }))
            .collect();
        sqes.push(Sqe::new(Op::Fsync {
            file: install.staging_dir_file,
        }));
        if let Err((kind, e)) = submit_checked(io, sqes) {
            return Err(self.fence(format!("staged {kind} failed: {e}")));
        }

        let generation = self.sb.live_generation + 1;
        let generation_dir = segment::generation_dir(&self.dir, generation);
        let mut next = self.sb.successor();
        next.live_generation = generation;
        next.purge_generation = next.purge_generation.max(m.purge_generation);
        next.vsr.commit = next.vsr.commit.max(m.commit);
        next.segments = sealed.iter().map(|s| s.meta).collect();
        next.frontier = Frontier {
            next_offset: m.next_offset,
            last_op: m.last_op,
            last_checksum: m.last_checksum,
            active_base: m.next_offset,
            active_position: 0,
            active_prev_checksum: m.last_checksum,
        };
        // One submission: rename, directory fsync, superblock copies. The
        // chain does not stop on a failed rename or fsync, so every
        // completion is checked; any failure leaves the outcome to recovery.
        let mut sqes = vec![
            Sqe::linked(Op::Rename {
                from: install.staging_dir.clone(),
                to: generation_dir.clone(),
            }),
            Sqe::linked(Op::Fsync {
                file: self.dir_file,
            }),
        ];
        sqes.extend(self.superblock_sqes(&next, &half_for(next.sequence))?);
        if let Err((kind, e)) = submit_checked(io, sqes) {
            return Err(self.fence(format!("install commit {kind} failed: {e}")));
        }
        tracing::info!(
            partition = self.partition_id,
            next_offset = m.next_offset,
            segments = sealed.len(),
            "snapshot installed"
        );

        // Committed: switch over, then remove the old generation.
        let old_dir = std::mem::replace(&mut self.generation_dir, generation_dir);
        let old_dir_file =
            std::mem::replace(&mut self.generation_dir_file, install.staging_dir_file);
        let pending = std::mem::replace(&mut self.active.pending, AlignedBuf::new(0));
        let old_active = std::mem::replace(
            &mut self.active,
            ActiveSegment::empty(
                m.next_offset,
                active_file,
                m.last_checksum,
                pending,
                self.config.transfer_chunk_bytes,
            ),
        );
        let old_sealed = std::mem::replace(&mut self.sealed, sealed);
        let chain = ChainPoint {
            next_offset: m.next_offset,
            last_checksum: m.last_checksum,
            last_op: m.last_op,
        };
        self.chain = chain;
        self.durable = chain;
        self.sb = next;
        self.installing = false;

        io.close(old_dir_file);
        io.close(old_active.file);
        let mut ops = Vec::new();
        for s in old_sealed {
            io.close(s.file);
            self.dispose(&segment::log_path(&old_dir, s.meta.base_offset), &mut ops);
            ops.push(Op::Unlink {
                path: segment::index_path(&old_dir, s.meta.base_offset),
            });
        }
        self.dispose(
            &segment::log_path(&old_dir, old_active.base_offset),
            &mut ops,
        );
        ops.push(Op::RemoveDir { path: old_dir });
        self.run_removals(io, ops);
        Ok(())
    }

    /// The refusals that protect the local log from stale or hostile offers.
    fn check_offer(&self, m: &Manifest) -> Result<(), StoreError> {
        let refuse = |e| Err(self.transfer_error(e));
        if m.partition_id != self.partition_id {
            return refuse(TransferError::WrongPartition {
                offered: m.partition_id,
            });
        }
        if m.purge_generation < self.sb.purge_generation {
            return refuse(TransferError::StalePurgeGeneration {
                offered: m.purge_generation,
                ours: self.sb.purge_generation,
            });
        }
        if m.next_offset < self.chain.next_offset {
            return refuse(TransferError::StaleFrontier {
                offered: m.next_offset,
                ours: self.chain.next_offset,
            });
        }
        if m.commit < self.sb.vsr.commit {
            return refuse(TransferError::StaleCommit {
                offered: m.commit,
                ours: self.sb.vsr.commit,
            });
        }
        if m.chunk_size_bytes != self.config.transfer_chunk_bytes {
            return refuse(TransferError::ChunkSize {
                offered: m.chunk_size_bytes,
                ours: self.config.transfer_chunk_bytes,
            });
        }
        if m.artifacts.len() > SEGMENTS_MAX {
            return refuse(TransferError::OfferTooLarge {
                what: "artifact count",
                value: m.artifacts.len() as u64,
                max: SEGMENTS_MAX as u64,
            });
        }
        if let Some(a) = m
            .artifacts
            .iter()
            .find(|a| a.length_bytes > self.config.segment_size_bytes)
        {
            return refuse(TransferError::OfferTooLarge {
                what: "artifact length",
                value: a.length_bytes,
                max: self.config.segment_size_bytes,
            });
        }
        // The caller's manifest decode already checked contiguity; an offer
        // built in-process is checked here as well.
        let mut expected = m.artifacts.first().map(|a| a.base_offset);
        for a in &m.artifacts {
            if Some(a.base_offset) != expected || a.end_offset <= a.base_offset {
                return refuse(TransferError::NotContiguous {
                    base_offset: a.base_offset,
                });
            }
            expected = Some(a.end_offset);
        }
        if let Some(end) = expected.filter(|&end| end != m.next_offset) {
            return refuse(TransferError::FrontierMismatch {
                artifacts_end: end,
                next_offset: m.next_offset,
            });
        }
        if self.active.end_position > self.active.durable_position || self.flushing.is_some() {
            return refuse(TransferError::Busy);
        }
        Ok(())
    }

    /// Reads every staged artifact back as a log: valid batches, contiguous
    /// offsets, an unbroken hash chain ending at the offered frontier, and
    /// the whole-file checksum. Builds each index and writes it beside the
    /// artifact (fdatasynced; the staging directory fsync follows).
    fn verify_staged(
        &mut self,
        io: &mut impl IoBackend,
        install: &Install,
    ) -> Result<Vec<SealedFile>, StoreError> {
        let m = &install.manifest;
        let pid = self.partition_id;
        let mut sealed = Vec::with_capacity(m.artifacts.len());
        let mut chain: Option<u64> = None;
        for (i, (a, &file)) in m.artifacts.iter().zip(&install.files).enumerate() {
            let artifact = i as u32;
            let fail = |reason: String| StoreError::Transfer {
                partition_id: pid,
                source: TransferError::Verification { artifact, reason },
            };
            let mut index = SparseIndex::default();
            let mut hasher = SegmentHasher::new(m.chunk_size_bytes);
            let mut next_offset = a.base_offset;
            let mut last = chain;
            let mut walker = Walker::new(file, VERIFY_CHUNK_BYTES);
            let path = segment::log_path(&install.staging_dir, a.base_offset);
            let (end, stop) = walker
                .walk(io, 0, a.length_bytes, |position, view| {
                    let h = view.header();
                    if h.partition_id != pid || h.base_offset != next_offset {
                        return Visit::Reject(format!(
                            "offset {} where {next_offset} was due",
                            h.base_offset
                        ));
                    }
                    if last.is_some_and(|c| c != h.prev_checksum) {
                        return Visit::Reject("hash chain broken".into());
                    }
                    index.observe(
                        (h.base_offset - a.base_offset) as u32,
                        position as u32,
                        h.max_timestamp_ms,
                        self.config.index_interval_bytes,
                    );
                    hasher.update(view.as_bytes());
                    next_offset = h.next_offset();
                    last = Some(h.header_checksum);
                    Visit::Continue
                })
                .map_err(|e| StoreError::io(pid, "read", &path, e))?;
            if let WalkStop::Invalid { position, reason } = stop {
                return Err(fail(format!("at byte {position}: {reason}")));
            }
            if end != a.length_bytes || next_offset != a.end_offset {
                return Err(fail(format!(
                    "ends at byte {end} offset {next_offset}, expected {} and {}",
                    a.length_bytes, a.end_offset
                )));
            }
            if hasher.checksum() != a.checksum || last != Some(a.last_batch_checksum) {
                return Err(fail("checksum differs from the manifest".into()));
            }
            chain = last;
            let idx = SealedIndex {
                index,
                chunk_size_bytes: m.chunk_size_bytes,
                chunk_checksums: a.chunk_checksums.clone(),
            };
            let idx_path = segment::index_path(&install.staging_dir, a.base_offset);
            write_new_file(io, pid, &idx_path, &idx.encode(a.base_offset))?;
            sealed.push(SealedFile {
                meta: SealedSegment {
                    base_offset: a.base_offset,
                    end_offset: a.end_offset,
                    length_bytes: a.length_bytes,
                    checksum: a.checksum,
                    last_batch_checksum: a.last_batch_checksum,
                    max_timestamp_ms: a.max_timestamp_ms,
                },
                file,
                index: idx.index,
                chunk_checksums: idx.chunk_checksums,
                index_persisted: true,
            });
        }
        if chain.is_some_and(|c| c != m.last_checksum) {
            return Err(self.transfer_error(TransferError::Verification {
                artifact: m.artifacts.len() as u32 - 1,
                reason: "last batch does not match the offered frontier".into(),
            }));
        }
        Ok(sealed)
    }

    /// Removes a directory and the files in it (no recycling: staged files
    /// may hold anything).
    pub(super) fn remove_tree(
        &mut self,
        io: &mut impl IoBackend,
        dir: &Path,
    ) -> Result<(), StoreError> {
        let mut ops: Vec<Op> = list(io, self.partition_id, dir)?
            .into_iter()
            .map(|path| Op::Unlink { path })
            .collect();
        ops.push(Op::RemoveDir { path: dir.into() });
        self.run_removals(io, ops);
        Ok(())
    }
}
