//! The sim backend: an in-memory, seeded, crashable, faulty filesystem.
//!
//! It keeps two views of every file and of the namespace: what the running
//! process sees, and what would survive a power cut. A write is durable only
//! once an fdatasync (or fsync) of its file completed; a create, rename,
//! unlink or mkdir only once an fsync of the directory holding the name
//! completed.
//!
//! # Submission and completion order
//!
//! Batches are held when submitted and run when [`IoBackend::reap`] is called
//! (which runs a seeded number of ops, at least one) or op by op with
//! [`SimBackend::step`]. The next op to run is drawn by the seed from the head
//! of every link chain of every held batch: unlinked ops of all batches
//! complete in a seeded order, a chain's ops in order. Blocking
//! [`IoBackend::submit`] runs ops the same way (others' too) until its batch
//! is done. Links behave as the kernel's: a failed read or write cancels the
//! rest of its chain with ECANCELED; a failed fsync, rename, unlink or rmdir
//! does not. (Short reads and writes never surface: a backend completes them.)
//!
//! # Crash model
//!
//! [`SimBackend::set_crash_at`] picks the mutating op (on the
//! [`SimBackend::ops_count`] clock) during which power fails; it and every op
//! after it never happen. [`SimBackend::reboot`] returns the disk the next
//! boot sees:
//! - with tearing (the default), each 512-byte sector of every write not
//!   covered by a completed sync (the in-flight one included) survives or not,
//!   by the seed; without it, only synced data survives;
//! - namespace changes not followed by a directory fsync are kept only as a
//!   seeded prefix (in order, as a journal would commit them), so a create,
//!   rename or unlink may be lost.
//!
//! # Faults
//!
//! [`Faults`] sets per-op probabilities of EIO on reads, writes and syncs and
//! of a bit flip in a read's buffer, and the disk's size (ENOSPC);
//! [`SimBackend::inject`] targets one op by its index among ops of its kind,
//! and [`SimBackend::set_fail_at`] one op on the crash clock.
//!
//! Everything is driven by the seed, so a failing run replays exactly.

mod faults;
mod names;
mod queue;

use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};

pub use faults::{Fault, FaultOp, Faults, SimRng};
use faults::{FaultPlan, Outcome};
use names::{Inode, NameChange, Namespace, Node};
use queue::Running;

use super::{AlignedBuf, BatchId, Completion, FileId, IoBackend, Op, OpenMode, Sqe, BLOCK_SIZE};

/// Torn writes tear at this granularity (a disk sector).
pub const SECTOR_SIZE: usize = 512;

#[derive(Clone, Debug, Default)]
struct FileData {
    /// What the process reads.
    current: Vec<u8>,
    /// What survives a crash.
    durable: Vec<u8>,
    /// Writes since the last sync, in order: (offset, bytes). A sync applies
    /// them to `durable`; a crash applies a seeded subset of their sectors.
    unsynced: Vec<(usize, Vec<u8>)>,
}

/// The in-memory disk. Paths are used as given (callers pass absolute-like
/// paths under a root of their choosing); "/" always exists.
#[derive(Debug)]
pub struct SimBackend {
    rng: SimRng,
    ns: Namespace,
    inodes: BTreeMap<Inode, FileData>,
    inode_next: Inode,
    open: BTreeMap<u32, (PathBuf, Node)>,
    fd_next: u32,
    /// Mutating ops executed so far (the crash-point clock).
    ops_count: u64,
    crash_at_op: Option<u64>,
    fail_at_op: Option<u64>,
    crashed: bool,
    /// Whether unsynced sectors may survive the crash (see the module docs).
    tear: bool,
    plan: FaultPlan,
    /// Submitted batches not handed back yet, in submission order.
    running: Vec<Running>,
    next_batch: u64,
}

impl SimBackend {
    pub fn new(seed: u64) -> Self {
        Self::boot(SimRng::new(seed), Namespace::new(), BTreeMap::new(), 1)
    }

    fn boot(
        rng: SimRng,
        ns: Namespace,
        inodes: BTreeMap<Inode, FileData>,
        inode_next: Inode,
    ) -> Self {
        Self {
            rng,
            ns,
            inodes,
            inode_next,
            open: BTreeMap::new(),
            fd_next: 1,
            ops_count: 0,
            crash_at_op: None,
            fail_at_op: None,
            crashed: false,
            tear: true,
            plan: FaultPlan::default(),
            running: Vec::new(),
            next_batch: 0,
        }
    }

    /// Mutating ops executed so far; crash points are indices on this clock.
    pub fn ops_count(&self) -> u64 {
        self.ops_count
    }

    /// Power fails while the op with index `op_index` (on the [`ops_count`]
    /// clock) is in flight. `tear` decides whether unsynced writes may partly
    /// reach the disk (see the module docs).
    ///
    /// [`ops_count`]: SimBackend::ops_count
    pub fn set_crash_at(&mut self, op_index: u64, tear: bool) {
        self.crash_at_op = Some(op_index);
        self.tear = tear;
    }

    /// The op with index `op_index` on the crash clock fails with EIO (with
    /// its kind's side effects, see [`Faults`]); the rest run normally.
    pub fn set_fail_at(&mut self, op_index: u64) {
        self.fail_at_op = Some(op_index);
    }

    /// The op of kind `op` with index `nth` (counted from boot, see
    /// [`SimBackend::op_count`]) gets `fault`.
    pub fn inject(&mut self, op: FaultOp, nth: u64, fault: Fault) {
        self.plan.inject(op, nth, fault);
    }

    /// Ops of kind `op` run since boot.
    pub fn op_count(&self, op: FaultOp) -> u64 {
        self.plan.count(op)
    }

    /// Replaces the fault probabilities and the disk size (kept across
    /// reboots, as properties of the disk).
    pub fn set_faults(&mut self, faults: Faults) {
        self.plan.faults = faults;
    }

    pub fn is_crashed(&self) -> bool {
        self.crashed
    }

    /// Bytes of file data the disk holds now (what [`Faults::space_bytes_max`]
    /// bounds): the sizes of every file with a name or an open handle.
    pub fn space_used_bytes(&self) -> u64 {
        let mut live: Vec<Inode> = self
            .ns
            .names
            .values()
            .chain(self.open.values().map(|(_, n)| n))
            .filter_map(|n| match n {
                Node::File(inode) => Some(*inode),
                Node::Dir => None,
            })
            .collect();
        live.sort_unstable();
        live.dedup();
        live.iter()
            .filter_map(|i| self.inodes.get(i))
            .map(|f| f.current.len() as u64)
            .sum()
    }

    /// Cuts the power now (if no crash happened yet) and returns the disk as
    /// the next boot sees it. The seed drives which unsynced sectors and
    /// namespace changes survive. Held batches are lost with the process;
    /// the fault settings stay, targeted faults and counters restart.
    pub fn reboot(self) -> SimBackend {
        let mut rng = self.rng.clone();
        let ns = self.ns.after_crash(&mut rng);
        let mut inodes = BTreeMap::new();
        for node in ns.names.values() {
            let Node::File(inode) = node else { continue };
            let Some(file) = self.inodes.get(inode) else {
                continue;
            };
            let mut durable = file.durable.clone();
            if self.tear {
                for (at, bytes) in &file.unsynced {
                    for (i, sector) in bytes.chunks(SECTOR_SIZE).enumerate() {
                        if rng.chance(1, 2) {
                            write_into(&mut durable, at + i * SECTOR_SIZE, sector);
                        }
                    }
                }
            }
            let data = FileData {
                current: durable.clone(),
                durable,
                unsynced: Vec::new(),
            };
            inodes.insert(*inode, data);
        }
        let mut next = Self::boot(SimRng::new(rng.next_u64()), ns, inodes, self.inode_next);
        next.plan = FaultPlan::new(self.plan.faults.clone());
        next
    }

    /// The bytes a process would read from `path` now (test helper).
    pub fn read_whole(&self, path: &Path) -> Option<&[u8]> {
        match self.ns.get(path)? {
            Node::File(inode) => self.inodes.get(&inode).map(|f| &f.current[..]),
            Node::Dir => None,
        }
    }

    /// Overwrites bytes of a file in place, durably (test helper for
    /// simulating media corruption).
    pub fn corrupt(&mut self, path: &Path, offset: usize, bytes: &[u8]) {
        if let Some(Node::File(inode)) = self.ns.get(path) {
            if let Some(file) = self.inodes.get_mut(&inode) {
                write_into(&mut file.current, offset, bytes);
                write_into(&mut file.durable, offset, bytes);
            }
        }
    }

    /// Every path that currently exists, for test assertions.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.ns.names.keys().cloned().collect()
    }

    /// The paths of every open file and directory, for test assertions.
    pub fn open_paths(&self) -> Vec<PathBuf> {
        self.open.values().map(|(path, _)| path.clone()).collect()
    }

    /// Runs one op of the held batches: the head of a link chain drawn by the
    /// seed. False if nothing is left to run.
    pub fn step(&mut self) -> bool {
        let ready: usize = self.running.iter().map(Running::ready).sum();
        if ready == 0 {
            return false;
        }
        let mut pick = self.rng.below(ready as u64) as usize;
        let mut running = std::mem::take(&mut self.running);
        for batch in running.iter_mut() {
            if pick < batch.ready() {
                let result = self.run(batch.next_op(pick));
                batch.finish(pick, result);
                break;
            }
            pick -= batch.ready();
        }
        debug_assert!(self.running.is_empty());
        self.running = running;
        true
    }

    /// Advances the op clock. Err if power is (now) off; `Fail` if this op
    /// was picked by [`SimBackend::set_fail_at`].
    fn tick(&mut self) -> io::Result<Outcome> {
        if self.crashed {
            return Err(crashed_error());
        }
        let index = self.ops_count;
        self.ops_count += 1;
        if self.crash_at_op == Some(index) {
            self.crashed = true;
            return Err(crashed_error());
        }
        if self.fail_at_op == Some(index) {
            return Ok(Outcome::Fail(libc::EIO));
        }
        Ok(Outcome::Normal)
    }

    /// [`SimBackend::tick`] then the fault plan for an op of kind `op`.
    fn tick_with(&mut self, op: FaultOp) -> io::Result<Outcome> {
        let ticked = self.tick()?;
        let planned = self.plan.next(op, &mut self.rng);
        Ok(if ticked == Outcome::Normal {
            planned
        } else {
            ticked
        })
    }

    fn file_inode(&self, file: FileId) -> io::Result<Inode> {
        match self.open.get(&file.0) {
            Some((_, Node::File(inode))) => Ok(*inode),
            Some((_, Node::Dir)) => Err(errno(libc::EISDIR)),
            None => Err(errno(libc::EBADF)),
        }
    }

    /// ENOSPC if growing `inode` to `end` bytes would exceed the disk.
    fn check_space(&self, inode: Inode, end: u64) -> io::Result<()> {
        let Some(max) = self.plan.faults.space_bytes_max else {
            return Ok(());
        };
        let len = self
            .inodes
            .get(&inode)
            .map_or(0, |f| f.current.len() as u64);
        if end > len && self.space_used_bytes() + (end - len) > max {
            return Err(errno(libc::ENOSPC));
        }
        Ok(())
    }

    fn run(&mut self, op: &mut Op) -> io::Result<usize> {
        match op {
            Op::Read {
                file,
                offset,
                len,
                buf,
            } => self.read(*file, *offset, *len, buf),
            Op::Write { file, offset, buf } => self.write(*file, *offset, buf),
            Op::Fdatasync { file } | Op::Fsync { file } => self.sync(*file),
            Op::Rename { from, to } => {
                fail_if(self.tick()?)?;
                self.rename(from, to)
            }
            Op::Unlink { path } => {
                fail_if(self.tick()?)?;
                match self.ns.get(path) {
                    Some(node @ Node::File(_)) => {
                        self.ns.change(NameChange::Remove {
                            path: path.clone(),
                            node,
                        });
                        Ok(0)
                    }
                    Some(Node::Dir) => Err(errno(libc::EISDIR)),
                    None => Err(io::Error::from(io::ErrorKind::NotFound)),
                }
            }
            Op::RemoveDir { path } => {
                fail_if(self.tick()?)?;
                self.remove_dir(path)
            }
            // The metadata ops behave (crash clock, faults, ENOSPC) exactly
            // as the synchronous methods of the same names.
            Op::Open { path, mode, dir } => {
                let file = if *dir {
                    self.open_dir(path)?
                } else {
                    self.open_file(path, *mode)?
                };
                Ok(file.0 as usize)
            }
            Op::Allocate {
                file,
                offset,
                len_bytes,
            } => self.allocate_range(*file, *offset, *len_bytes).map(|()| 0),
            Op::FileSize { file } => self.file_size(*file).map(|n| n as usize),
            Op::Exists { path } => self.exists(path).map(usize::from),
            Op::MakeDir { path } => self.create_dir(path).map(|()| 0),
        }
    }

    /// Reads do not advance the crash clock: a crash "after a read" is the
    /// same state as one before the next mutating op.
    fn read(
        &mut self,
        file: FileId,
        offset: u64,
        len: usize,
        buf: &mut AlignedBuf,
    ) -> io::Result<usize> {
        if self.crashed {
            return Err(crashed_error());
        }
        check_aligned(offset, len)?;
        if len > buf.capacity() {
            return Err(io::Error::new(
                io::ErrorKind::InvalidInput,
                format!("read of {len} bytes into a {} byte buffer", buf.capacity()),
            ));
        }
        let inode = self.file_inode(file)?;
        let outcome = self.plan.next(FaultOp::Read, &mut self.rng);
        fail_if(outcome)?;
        let data = &self.inodes[&inode].current;
        let start = (offset as usize).min(data.len());
        let end = (start + len).min(data.len());
        let n = end - start;
        buf.set_len(n);
        buf.copy_from_slice(&data[start..end]);
        if outcome == Outcome::BitFlip && n > 0 {
            let bit = self.rng.below(n as u64 * 8) as usize;
            buf[bit / 8] ^= 1 << (bit % 8);
        }
        Ok(n)
    }

    fn write(&mut self, file: FileId, offset: u64, bytes: &[u8]) -> io::Result<usize> {
        let was_crashed = self.crashed;
        let ticked = self.tick_with(FaultOp::Write);
        if !was_crashed && self.crashed {
            // In flight when power failed: its sectors may still land.
            if let Ok(inode) = self.file_inode(file) {
                if let Some(data) = self.inodes.get_mut(&inode) {
                    data.unsynced.push((offset as usize, bytes.to_vec()));
                }
            }
        }
        let outcome = ticked?;
        check_aligned(offset, bytes.len())?;
        let inode = self.file_inode(file)?;
        self.check_space(inode, offset + bytes.len() as u64)?;
        let Some(data) = self.inodes.get_mut(&inode) else {
            return Err(errno(libc::EBADF));
        };
        let at = offset as usize;
        if let Outcome::Fail(code) = outcome {
            // A failed write may have written any subset of its sectors.
            for (i, sector) in bytes.chunks(SECTOR_SIZE).enumerate() {
                if self.rng.chance(1, 2) {
                    let at = at + i * SECTOR_SIZE;
                    write_into(&mut data.current, at, sector);
                    data.unsynced.push((at, sector.to_vec()));
                }
            }
            return Err(errno(code));
        }
        write_into(&mut data.current, at, bytes);
        data.unsynced.push((at, bytes.to_vec()));
        Ok(bytes.len())
    }

    /// fdatasync or fsync: of a file, its unsynced writes become durable; of
    /// a directory, its name changes (see [`Namespace::commit`]).
    fn sync(&mut self, file: FileId) -> io::Result<usize> {
        let outcome = self.tick_with(FaultOp::Sync)?;
        let failed = matches!(outcome, Outcome::Fail(_));
        match self.open.get(&file.0) {
            Some((path, Node::Dir)) => {
                if !failed {
                    let dir = path.clone();
                    self.ns.commit(&dir);
                }
            }
            Some((_, Node::File(inode))) => {
                let Some(data) = self.inodes.get_mut(inode) else {
                    return Err(errno(libc::EBADF));
                };
                // After a failed writeback the pages are clean but were
                // never written: the data is gone from the disk's view for
                // good, though the process still reads it.
                for (at, bytes) in std::mem::take(&mut data.unsynced) {
                    if !failed {
                        write_into(&mut data.durable, at, &bytes);
                    }
                }
            }
            None => return Err(errno(libc::EBADF)),
        }
        fail_if(outcome)?;
        Ok(0)
    }

    fn rename(&mut self, from: &Path, to: &Path) -> io::Result<usize> {
        let node = self
            .ns
            .get(from)
            .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
        if !self.ns.parent_exists(to) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        if node == Node::Dir && self.ns.get(to).is_some() {
            return Err(errno(libc::ENOTEMPTY));
        }
        if node == Node::Dir {
            self.ns.settle_removal_of(to);
        }
        self.ns.change(NameChange::Rename {
            from: from.to_path_buf(),
            to: to.to_path_buf(),
            node,
        });
        if node == Node::Dir {
            self.ns.move_children(from, to);
            // An open directory handle follows its directory.
            for (path, _) in self.open.values_mut() {
                if let Ok(rel) = path.strip_prefix(from) {
                    *path = to.join(rel);
                }
            }
        }
        Ok(0)
    }

    fn remove_dir(&mut self, path: &Path) -> io::Result<usize> {
        match self.ns.get(path) {
            Some(Node::Dir) => {
                let has_children = self.ns.names.keys().any(|p| p.parent() == Some(path));
                if has_children {
                    return Err(errno(libc::ENOTEMPTY));
                }
                self.ns.change(NameChange::Remove {
                    path: path.to_path_buf(),
                    node: Node::Dir,
                });
                Ok(0)
            }
            Some(Node::File(_)) => Err(errno(libc::ENOTDIR)),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }
}

fn crashed_error() -> io::Error {
    io::Error::other("sim: power failed")
}

fn errno(code: i32) -> io::Error {
    io::Error::from_raw_os_error(code)
}

fn fail_if(outcome: Outcome) -> io::Result<()> {
    match outcome {
        Outcome::Fail(code) => Err(errno(code)),
        Outcome::Normal | Outcome::BitFlip => Ok(()),
    }
}

fn check_aligned(offset: u64, len: usize) -> io::Result<()> {
    if !offset.is_multiple_of(BLOCK_SIZE as u64) || !len.is_multiple_of(BLOCK_SIZE) {
        return Err(errno(libc::EINVAL));
    }
    Ok(())
}

fn write_into(data: &mut Vec<u8>, at: usize, bytes: &[u8]) {
    let end = at + bytes.len();
    if data.len() < end {
        data.resize(end, 0);
    }
    data[at..end].copy_from_slice(bytes);
}

impl IoBackend for SimBackend {
    fn open_file(&mut self, path: &Path, mode: OpenMode) -> io::Result<FileId> {
        if self.crashed {
            return Err(crashed_error());
        }
        let node = match (self.ns.get(path), mode) {
            (Some(Node::File(inode)), _) => Node::File(inode),
            (Some(Node::Dir), _) => return Err(errno(libc::EISDIR)),
            (None, OpenMode::Existing) => return Err(io::Error::from(io::ErrorKind::NotFound)),
            (None, OpenMode::Create) => {
                if !self.ns.parent_exists(path) {
                    return Err(io::Error::from(io::ErrorKind::NotFound));
                }
                fail_if(self.tick()?)?;
                let inode = self.inode_next;
                self.inode_next += 1;
                self.inodes.insert(inode, FileData::default());
                let node = Node::File(inode);
                self.ns.change(NameChange::Insert {
                    path: path.to_path_buf(),
                    node,
                });
                node
            }
        };
        let fd = self.fd_next;
        self.fd_next += 1;
        self.open.insert(fd, (path.to_path_buf(), node));
        Ok(FileId(fd))
    }

    fn open_dir(&mut self, path: &Path) -> io::Result<FileId> {
        if self.crashed {
            return Err(crashed_error());
        }
        match self.ns.get(path) {
            Some(Node::Dir) => {
                let fd = self.fd_next;
                self.fd_next += 1;
                self.open.insert(fd, (path.to_path_buf(), Node::Dir));
                Ok(FileId(fd))
            }
            Some(Node::File(_)) => Err(errno(libc::ENOTDIR)),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    fn close(&mut self, file: FileId) {
        self.open.remove(&file.0);
    }

    fn create_dir(&mut self, path: &Path) -> io::Result<()> {
        if self.ns.get(path).is_some() {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        if !self.ns.parent_exists(path) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        fail_if(self.tick()?)?;
        self.ns.change(NameChange::Insert {
            path: path.to_path_buf(),
            node: Node::Dir,
        });
        Ok(())
    }

    fn list_dir(&mut self, path: &Path) -> io::Result<Vec<String>> {
        if self.ns.get(path) != Some(Node::Dir) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        Ok(self
            .ns
            .names
            .keys()
            .filter(|p| p.parent() == Some(path))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    fn exists(&mut self, path: &Path) -> io::Result<bool> {
        Ok(self.ns.get(path).is_some())
    }

    fn file_size(&mut self, file: FileId) -> io::Result<u64> {
        let inode = self.file_inode(file)?;
        Ok(self
            .inodes
            .get(&inode)
            .map_or(0, |f| f.current.len() as u64))
    }

    fn allocate_range(&mut self, file: FileId, offset: u64, len_bytes: u64) -> io::Result<()> {
        let inode = self.file_inode(file)?;
        fail_if(self.tick()?)?;
        // No holes here: the file grows to the range's end.
        let len_bytes = offset + len_bytes;
        self.check_space(inode, len_bytes)?;
        let Some(data) = self.inodes.get_mut(&inode) else {
            return Err(errno(libc::EBADF));
        };
        // Allocation is metadata the journal commits with the next sync; the
        // store never relies on a file's size, so keeping it is harmless.
        for view in [&mut data.current, &mut data.durable] {
            if (view.len() as u64) < len_bytes {
                view.resize(len_bytes as usize, 0);
            }
        }
        Ok(())
    }

    /// Runs held ops (this batch's and others', in the seeded order) until
    /// this batch is done.
    fn submit(&mut self, batch: Vec<Sqe>) -> Vec<Completion> {
        let id = self.submit_nowait(batch);
        loop {
            if let Some(pos) = self.running.iter().position(|b| b.id == id) {
                if self.running[pos].is_done() {
                    return self.running.remove(pos).into_completions();
                }
            }
            let ran = self.step();
            debug_assert!(ran, "an unfinished batch has a ready chain");
        }
    }

    fn submit_nowait(&mut self, batch: Vec<Sqe>) -> BatchId {
        let id = BatchId(self.next_batch);
        self.next_batch += 1;
        self.running.push(Running::new(id, batch));
        id
    }

    /// Runs a seeded number of held ops (at least one, if any is left), then
    /// hands back every finished batch.
    fn reap(&mut self) -> Vec<(BatchId, Vec<Completion>)> {
        let ready: usize = self.running.iter().map(Running::ready).sum();
        if ready > 0 {
            let steps = 1 + self.rng.below(2 * ready as u64);
            for _ in 0..steps {
                if !self.step() {
                    break;
                }
            }
        }
        let (done, left): (Vec<Running>, Vec<Running>) = std::mem::take(&mut self.running)
            .into_iter()
            .partition(Running::is_done);
        self.running = left;
        done.into_iter()
            .map(|b| (b.id, b.into_completions()))
            .collect()
    }

    fn batches_running(&self) -> usize {
        self.running.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn block(byte: u8) -> AlignedBuf {
        let mut b = AlignedBuf::new(BLOCK_SIZE);
        b.extend_from_slice(&[byte; BLOCK_SIZE]);
        b
    }

    fn write(io: &mut SimBackend, f: FileId, off: u64, byte: u8) -> io::Result<usize> {
        let c = io.submit(vec![Sqe::new(Op::Write {
            file: f,
            offset: off,
            buf: block(byte),
        })]);
        c.into_iter().next().unwrap().result
    }

    fn sync(io: &mut SimBackend, op: Op) {
        let c = io.submit(vec![Sqe::new(op)]);
        c.into_iter().next().unwrap().result.unwrap();
    }

    #[test]
    fn unsynced_writes_are_lost_synced_survive() {
        let mut io = SimBackend::new(1);
        let root = io.open_dir(Path::new("/")).unwrap();
        let f = io.open_file(Path::new("/a"), OpenMode::Create).unwrap();
        write(&mut io, f, 0, 1).unwrap();
        sync(&mut io, Op::Fdatasync { file: f });
        sync(&mut io, Op::Fsync { file: root });
        write(&mut io, f, 4096, 2).unwrap();
        // No tearing: nothing unsynced survives.
        io.set_crash_at(io.ops_count(), false);
        let io = io.reboot();
        assert_eq!(io.read_whole(Path::new("/a")).unwrap(), &[1u8; 4096][..]);
    }

    #[test]
    fn create_without_dir_fsync_may_vanish() {
        let mut lost = 0;
        for seed in 0..32 {
            let mut io = SimBackend::new(seed);
            let f = io.open_file(Path::new("/a"), OpenMode::Create).unwrap();
            write(&mut io, f, 0, 1).unwrap();
            sync(&mut io, Op::Fdatasync { file: f });
            let io = io.reboot();
            if io.read_whole(Path::new("/a")).is_none() {
                lost += 1;
            }
        }
        assert!(lost > 0 && lost < 32, "lost {lost} of 32");
    }

    #[test]
    fn crash_point_stops_everything_and_tears_in_flight_write() {
        let mut torn = 0;
        for seed in 0..16 {
            let mut io = SimBackend::new(seed);
            let root = io.open_dir(Path::new("/")).unwrap();
            let f = io.open_file(Path::new("/a"), OpenMode::Create).unwrap();
            sync(&mut io, Op::Fsync { file: root });
            let at = io.ops_count();
            io.set_crash_at(at, true);
            assert!(write(&mut io, f, 0, 9).is_err());
            assert!(io.is_crashed());
            assert!(write(&mut io, f, 0, 9).is_err());
            let io = io.reboot();
            let data = io.read_whole(Path::new("/a")).unwrap();
            if data.contains(&9) {
                torn += 1;
                // Torn only at sector granularity.
                for sector in data.chunks(SECTOR_SIZE) {
                    assert!(sector.iter().all(|&b| b == 9) || sector.iter().all(|&b| b == 0));
                }
            }
        }
        assert!(torn > 0);
    }

    #[test]
    fn rename_is_durable_after_dir_fsync() {
        let mut io = SimBackend::new(3);
        io.create_dir(Path::new("/d")).unwrap();
        let root = io.open_dir(Path::new("/")).unwrap();
        sync(&mut io, Op::Fsync { file: root });
        let d = io.open_dir(Path::new("/d")).unwrap();
        let f = io
            .open_file(Path::new("/d/x.tmp"), OpenMode::Create)
            .unwrap();
        write(&mut io, f, 0, 5).unwrap();
        sync(&mut io, Op::Fdatasync { file: f });
        sync(
            &mut io,
            Op::Rename {
                from: "/d/x.tmp".into(),
                to: "/d/x".into(),
            },
        );
        sync(&mut io, Op::Fsync { file: d });
        let io = io.reboot();
        assert_eq!(io.read_whole(Path::new("/d/x")).unwrap(), &[5u8; 4096][..]);
        assert!(io.read_whole(Path::new("/d/x.tmp")).is_none());
    }

    #[test]
    fn directory_handle_follows_rename_and_fsync_commits_dependencies() {
        let mut io = SimBackend::new(5);
        let root = io.open_dir(Path::new("/")).unwrap();
        io.create_dir(Path::new("/r")).unwrap();
        io.create_dir(Path::new("/g")).unwrap();
        sync(&mut io, Op::Fsync { file: root });
        let f = io.open_file(Path::new("/g/old"), OpenMode::Create).unwrap();
        write(&mut io, f, 0, 3).unwrap();
        sync(&mut io, Op::Fdatasync { file: f });
        let g = io.open_dir(Path::new("/g")).unwrap();
        sync(&mut io, Op::Fsync { file: g });
        // Recycle it (no fsync), then reuse it under a new name in /g.
        sync(
            &mut io,
            Op::Rename {
                from: "/g/old".into(),
                to: "/r/x".into(),
            },
        );
        sync(
            &mut io,
            Op::Rename {
                from: "/r/x".into(),
                to: "/g/new".into(),
            },
        );
        sync(&mut io, Op::Fsync { file: g });
        let io = io.reboot();
        assert_eq!(
            io.read_whole(Path::new("/g/new")).unwrap(),
            &[3u8; 4096][..]
        );

        // An fd opened on /s keeps working after /s becomes /t.
        let mut io = SimBackend::new(6);
        let root = io.open_dir(Path::new("/")).unwrap();
        io.create_dir(Path::new("/s")).unwrap();
        let s = io.open_dir(Path::new("/s")).unwrap();
        let f = io.open_file(Path::new("/s/a"), OpenMode::Create).unwrap();
        write(&mut io, f, 0, 4).unwrap();
        sync(&mut io, Op::Fdatasync { file: f });
        sync(&mut io, Op::Fsync { file: s });
        sync(
            &mut io,
            Op::Rename {
                from: "/s".into(),
                to: "/t".into(),
            },
        );
        sync(&mut io, Op::Fsync { file: root });
        let b = io.open_file(Path::new("/t/b"), OpenMode::Create).unwrap();
        write(&mut io, b, 0, 5).unwrap();
        sync(&mut io, Op::Fdatasync { file: b });
        sync(&mut io, Op::Fsync { file: s });
        let io = io.reboot();
        assert_eq!(io.read_whole(Path::new("/t/a")).unwrap(), &[4u8; 4096][..]);
        assert_eq!(io.read_whole(Path::new("/t/b")).unwrap(), &[5u8; 4096][..]);
    }

    #[test]
    fn a_lost_directory_rename_keeps_its_children() {
        let mut kept_old_name = 0;
        for seed in 0..16 {
            let mut io = SimBackend::new(seed);
            let root = io.open_dir(Path::new("/")).unwrap();
            io.create_dir(Path::new("/s")).unwrap();
            sync(&mut io, Op::Fsync { file: root });
            let s = io.open_dir(Path::new("/s")).unwrap();
            let f = io.open_file(Path::new("/s/a"), OpenMode::Create).unwrap();
            write(&mut io, f, 0, 4).unwrap();
            sync(&mut io, Op::Fdatasync { file: f });
            sync(&mut io, Op::Fsync { file: s });
            sync(
                &mut io,
                Op::Rename {
                    from: "/s".into(),
                    to: "/t".into(),
                },
            );
            let io = io.reboot();
            let at_s = io.read_whole(Path::new("/s/a")).is_some();
            let at_t = io.read_whole(Path::new("/t/a")).is_some();
            assert!(at_s != at_t, "the file must be in exactly one place");
            kept_old_name += usize::from(at_s);
        }
        assert!(kept_old_name > 0 && kept_old_name < 16);
    }

    #[test]
    fn submit_nowait_holds_batches_until_reap() {
        let mut io = SimBackend::new(7);
        let f = io.open_file(Path::new("/a"), OpenMode::Create).unwrap();
        let a = io.submit_nowait(vec![Sqe::new(Op::Write {
            file: f,
            offset: 0,
            buf: block(1),
        })]);
        let b = io.submit_nowait(vec![Sqe::new(Op::Fdatasync { file: f })]);
        assert_ne!(a, b);
        assert_eq!(io.batches_running(), 2);
        // Nothing ran yet.
        assert_eq!(io.read_whole(Path::new("/a")).unwrap().len(), 0);
        let mut reaped = Vec::new();
        for _ in 0..10 {
            reaped.extend(io.reap());
        }
        reaped.sort_by_key(|(id, _)| *id);
        let ids: Vec<BatchId> = reaped.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [a, b]);
        assert!(reaped
            .iter()
            .all(|(_, c)| c.len() == 1 && c[0].result.is_ok()));
        assert_eq!(io.batches_running(), 0);
        assert!(io.reap().is_empty());
    }

    fn errno_of(c: &Completion) -> Option<i32> {
        c.result.as_ref().err().and_then(io::Error::raw_os_error)
    }

    fn write_op(file: FileId, offset: u64, byte: u8) -> Op {
        Op::Write {
            file,
            offset,
            buf: block(byte),
        }
    }

    fn read_block(io: &mut SimBackend, file: FileId, offset: u64) -> io::Result<AlignedBuf> {
        let c = io.submit(vec![Sqe::new(Op::Read {
            file,
            offset,
            len: BLOCK_SIZE,
            buf: AlignedBuf::new(BLOCK_SIZE),
        })]);
        let Completion { op, result } = c.into_iter().next().unwrap();
        result.map(|_| op.into_buf().unwrap())
    }

    /// A file with one synced block of zeros' complement (0xAA) and a durable
    /// name, so only later writes are unsynced.
    fn synced_file(io: &mut SimBackend, path: &str) -> FileId {
        let root = io.open_dir(Path::new("/")).unwrap();
        let f = io.open_file(Path::new(path), OpenMode::Create).unwrap();
        write(io, f, 0, 0xAA).unwrap();
        sync(io, Op::Fdatasync { file: f });
        sync(io, Op::Fsync { file: root });
        f
    }

    #[test]
    fn crash_keeps_a_seeded_subset_of_sectors_of_every_unsynced_write() {
        let sectors = BLOCK_SIZE / SECTOR_SIZE;
        let mut kept_per_write = [0usize; 3];
        let mut runs_with_mixed_block = 0;
        for seed in 0..32 {
            let mut io = SimBackend::new(seed);
            let a = synced_file(&mut io, "/a");
            let b = synced_file(&mut io, "/b");
            // Three unsynced writes, none in flight at the crash.
            write(&mut io, a, 0, 1).unwrap();
            write(&mut io, a, 4096, 2).unwrap();
            write(&mut io, b, 0, 3).unwrap();
            let root = io.open_dir(Path::new("/")).unwrap();
            sync(&mut io, Op::Fsync { file: root });
            let io = io.reboot();
            let a = io.read_whole(Path::new("/a")).unwrap();
            let b = io.read_whole(Path::new("/b")).unwrap();
            let views = [&a[..4096], a.get(4096..8192).unwrap_or(&[]), &b[..4096]];
            for (w, view) in views.iter().enumerate() {
                let new = w as u8 + 1;
                let mut kept = 0;
                for sector in view.chunks(SECTOR_SIZE) {
                    // Each sector is whole: the new bytes or the old.
                    assert!(
                        sector.iter().all(|&x| x == new) || sector.iter().all(|&x| x != new),
                        "seed {seed}: a sector tore inside"
                    );
                    kept += usize::from(sector[0] == new);
                }
                kept_per_write[w] += kept;
                if kept > 0 && kept < sectors {
                    runs_with_mixed_block += 1;
                }
            }
            // Synced data is never lost.
            if a.len() >= 4096 && a[0] != 1 {
                assert_eq!(a[0], 0xAA, "seed {seed}");
            }
        }
        // Every write, not only the last, had sectors survive somewhere.
        assert!(kept_per_write.iter().all(|&k| k > 0), "{kept_per_write:?}");
        assert!(kept_per_write.iter().all(|&k| k < 32 * sectors));
        assert!(runs_with_mixed_block > 0);
    }

    #[test]
    fn failed_write_cancels_its_chain_failed_fsync_does_not() {
        let mut io = SimBackend::new(9);
        let f = synced_file(&mut io, "/a");
        let d = io.open_dir(Path::new("/")).unwrap();
        io.inject(
            FaultOp::Write,
            io.op_count(FaultOp::Write),
            Fault::Errno(libc::EIO),
        );
        let c = io.submit(vec![
            Sqe::linked(write_op(f, 4096, 7)),
            Sqe::linked(Op::Fdatasync { file: f }),
            Sqe::linked(Op::Rename {
                from: "/a".into(),
                to: "/b".into(),
            }),
            Sqe::new(Op::Fsync { file: d }),
        ]);
        assert_eq!(errno_of(&c[0]), Some(libc::EIO));
        for later in &c[1..] {
            assert_eq!(errno_of(later), Some(libc::ECANCELED));
        }
        assert!(
            io.read_whole(Path::new("/a")).is_some(),
            "rename was cancelled"
        );

        io.inject(
            FaultOp::Sync,
            io.op_count(FaultOp::Sync),
            Fault::Errno(libc::EIO),
        );
        let c = io.submit(vec![
            Sqe::linked(Op::Fdatasync { file: f }),
            Sqe::linked(Op::Rename {
                from: "/a".into(),
                to: "/b".into(),
            }),
            Sqe::new(Op::Fsync { file: d }),
        ]);
        assert_eq!(errno_of(&c[0]), Some(libc::EIO));
        assert!(c[1].result.is_ok() && c[2].result.is_ok());
        assert!(io.read_whole(Path::new("/b")).is_some(), "rename ran");
        // A failed rename does not stop its chain either.
        let c = io.submit(vec![
            Sqe::linked(Op::Rename {
                from: "/missing".into(),
                to: "/c".into(),
            }),
            Sqe::new(write_op(f, 0, 8)),
        ]);
        assert!(c[0].result.is_err() && c[1].result.is_ok());
    }

    #[test]
    fn read_eio_targeted_and_by_probability() {
        let mut io = SimBackend::new(10);
        let f = synced_file(&mut io, "/a");
        io.inject(
            FaultOp::Read,
            io.op_count(FaultOp::Read) + 1,
            Fault::Errno(libc::EIO),
        );
        assert!(read_block(&mut io, f, 0).is_ok());
        let err = read_block(&mut io, f, 0).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EIO));
        assert!(read_block(&mut io, f, 0).is_ok());
        // A failed read cancels what is linked behind it.
        io.inject(
            FaultOp::Read,
            io.op_count(FaultOp::Read),
            Fault::Errno(libc::EIO),
        );
        let c = io.submit(vec![
            Sqe::linked(Op::Read {
                file: f,
                offset: 0,
                len: BLOCK_SIZE,
                buf: AlignedBuf::new(BLOCK_SIZE),
            }),
            Sqe::new(write_op(f, 0, 1)),
        ]);
        assert_eq!(errno_of(&c[1]), Some(libc::ECANCELED));
        assert_eq!(io.read_whole(Path::new("/a")).unwrap()[0], 0xAA);

        io.set_faults(Faults {
            read_eio: 0.5,
            ..Faults::default()
        });
        let failed = (0..200)
            .filter(|_| read_block(&mut io, f, 0).is_err())
            .count();
        assert!((50..150).contains(&failed), "{failed} of 200 reads failed");
    }

    #[test]
    fn write_eio_lands_a_subset_of_sectors_and_fails() {
        let mut partial = 0;
        for seed in 0..16 {
            let mut io = SimBackend::new(seed);
            let f = synced_file(&mut io, "/a");
            io.set_faults(Faults {
                write_eio: 1.0,
                ..Faults::default()
            });
            let err = write(&mut io, f, 0, 5).unwrap_err();
            assert_eq!(err.raw_os_error(), Some(libc::EIO));
            let data = io.read_whole(Path::new("/a")).unwrap();
            let new = data.chunks(SECTOR_SIZE).filter(|s| s[0] == 5).count();
            partial += usize::from(new > 0 && new < BLOCK_SIZE / SECTOR_SIZE);
        }
        assert!(partial > 0);
    }

    #[test]
    fn failed_fsync_drops_unsynced_data_for_good() {
        let mut io = SimBackend::new(11);
        let f = synced_file(&mut io, "/a");
        write(&mut io, f, 0, 3).unwrap();
        io.inject(
            FaultOp::Sync,
            io.op_count(FaultOp::Sync),
            Fault::Errno(libc::EIO),
        );
        let c = io.submit(vec![Sqe::new(Op::Fdatasync { file: f })]);
        assert_eq!(errno_of(&c[0]), Some(libc::EIO));
        // The process still reads the new bytes (the page cache has them)...
        assert_eq!(read_block(&mut io, f, 0).unwrap()[0], 3);
        // ...and a retried sync succeeds, but the disk never got them.
        sync(&mut io, Op::Fdatasync { file: f });
        let io = io.reboot();
        assert_eq!(io.read_whole(Path::new("/a")).unwrap(), &[0xAA; 4096][..]);
    }

    #[test]
    fn bit_flip_on_read_leaves_the_stored_bytes_intact() {
        let mut io = SimBackend::new(12);
        let f = synced_file(&mut io, "/a");
        io.inject(FaultOp::Read, io.op_count(FaultOp::Read), Fault::BitFlip);
        let flipped = read_block(&mut io, f, 0).unwrap();
        let diff: u32 = flipped.iter().map(|&b| (b ^ 0xAA).count_ones()).sum();
        assert_eq!(diff, 1, "exactly one bit flipped");
        assert_eq!(io.read_whole(Path::new("/a")).unwrap(), &[0xAA; 4096][..]);
        assert_eq!(&read_block(&mut io, f, 0).unwrap()[..], &[0xAA; 4096][..]);
    }

    /// The metadata ops, submitted as ops (asynchronously too), behave as
    /// the methods: results, crash clock, ENOSPC, failure at a chosen op.
    #[test]
    fn metadata_ops_run_on_the_crash_clock_like_the_methods() {
        let mut io = SimBackend::new(21);
        let open = |path: &str, mode| Op::Open {
            path: path.into(),
            mode,
            dir: false,
        };
        let id = io.submit_nowait(vec![
            Sqe::linked(Op::MakeDir { path: "/d".into() }),
            Sqe::linked(open("/d/a", OpenMode::Create)),
            Sqe::new(Op::Exists {
                path: "/d/a".into(),
            }),
        ]);
        let mut done = Vec::new();
        while done.is_empty() {
            done = io.reap();
        }
        let (got, mut cs) = done.pop().unwrap();
        assert_eq!(got, id);
        assert_eq!(cs.pop().unwrap().result.unwrap(), 1);
        let file = cs.pop().unwrap().opened().unwrap();
        assert_eq!(io.ops_count(), 2, "mkdir and create tick the clock");
        let cs = io.submit(vec![
            Sqe::linked(Op::Allocate {
                file,
                offset: 4096,
                len_bytes: 8192,
            }),
            Sqe::new(Op::FileSize { file }),
        ]);
        assert_eq!(cs[0].result.as_ref().unwrap(), &0);
        assert_eq!(cs[1].result.as_ref().unwrap(), &(3 * 4096));
        // The disk is full: the reservation fails with ENOSPC.
        io.set_faults(Faults {
            space_bytes_max: Some(4 * BLOCK_SIZE as u64),
            ..Faults::default()
        });
        let grow = |len_bytes| {
            vec![Sqe::new(Op::Allocate {
                file,
                offset: 0,
                len_bytes,
            })]
        };
        let cs = io.submit(grow(8 * 4096));
        assert_eq!(errno_of(&cs[0]), Some(libc::ENOSPC));
        // EIO at a chosen op on the clock.
        io.set_fail_at(io.ops_count());
        let cs = io.submit(grow(4 * 4096));
        assert_eq!(errno_of(&cs[0]), Some(libc::EIO));
        // Power fails during the next create: it never happened, and the
        // directory (never fsynced) may be gone too.
        io.set_crash_at(io.ops_count(), false);
        let cs = io.submit(vec![Sqe::new(open("/d/b", OpenMode::Create))]);
        assert!(cs[0].result.is_err());
        assert!(io.is_crashed());
        let mut io = io.reboot();
        assert!(!io.exists(Path::new("/d/b")).unwrap());
    }

    #[test]
    fn enospc_once_the_disk_is_full_until_space_is_freed() {
        let mut io = SimBackend::new(13);
        io.set_faults(Faults {
            space_bytes_max: Some(3 * BLOCK_SIZE as u64),
            ..Faults::default()
        });
        let a = io.open_file(Path::new("/a"), OpenMode::Create).unwrap();
        let b = io.open_file(Path::new("/b"), OpenMode::Create).unwrap();
        write(&mut io, a, 0, 1).unwrap();
        write(&mut io, a, 4096, 1).unwrap();
        io.allocate(b, 4096).unwrap();
        assert_eq!(io.space_used_bytes(), 3 * BLOCK_SIZE as u64);
        let err = write(&mut io, a, 8192, 1).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        let err = io.allocate(b, 8192).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
        // Space already held is written freely.
        write(&mut io, a, 0, 2).unwrap();
        write(&mut io, b, 0, 2).unwrap();
        // Freeing a file (name and handle gone) makes room again.
        io.close(b);
        sync(&mut io, Op::Unlink { path: "/b".into() });
        write(&mut io, a, 8192, 1).unwrap();
        // The limit is a property of the disk: it survives a reboot.
        let mut io = io.reboot();
        let c = io.open_file(Path::new("/c"), OpenMode::Create).unwrap();
        let used = io.space_used_bytes();
        let err = io
            .allocate(c, 3 * BLOCK_SIZE as u64 - used + 1)
            .unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOSPC));
    }

    /// The order in which the ops of held batches ran, as the byte each
    /// one left in a shared block: batch `b`'s op `k` writes `b * 10 + k`.
    fn completion_order(seed: u64) -> Vec<u8> {
        let mut io = SimBackend::new(seed);
        let f = io.open_file(Path::new("/a"), OpenMode::Create).unwrap();
        for b in 0..4u8 {
            // Batch 3 is one linked chain; the others are unlinked ops.
            let sqes = (0..3u8)
                .map(|k| Sqe {
                    op: write_op(f, 0, b * 10 + k),
                    link_next: b == 3,
                })
                .collect();
            io.submit_nowait(sqes);
        }
        let mut order = Vec::new();
        while io.step() {
            order.push(io.read_whole(Path::new("/a")).unwrap()[0]);
        }
        assert_eq!(io.reap().len(), 4);
        order
    }

    #[test]
    fn completion_order_is_seeded_reproducible_and_keeps_chains() {
        let orders: Vec<Vec<u8>> = (0..8).map(completion_order).collect();
        for (seed, order) in orders.iter().enumerate() {
            assert_eq!(order, &completion_order(seed as u64), "seed {seed} replays");
            let mut sorted = order.clone();
            sorted.sort_unstable();
            assert_eq!(sorted, [0, 1, 2, 10, 11, 12, 20, 21, 22, 30, 31, 32]);
            let chain: Vec<u8> = order.iter().copied().filter(|&x| x >= 30).collect();
            assert_eq!(chain, [30, 31, 32], "seed {seed}: a chain runs in order");
        }
        let distinct: BTreeSet<&Vec<u8>> = orders.iter().collect();
        assert!(distinct.len() > 4, "orders differ across seeds");
        // Batches interleave: not always one batch after the other.
        assert!(orders.iter().any(|o| o
            .windows(2)
            .any(|w| w[0] / 10 != w[1] / 10 && w[1] % 10 != 0)));
    }

    #[test]
    fn blocking_submit_runs_alongside_held_batches() {
        let mut io = SimBackend::new(14);
        let f = io.open_file(Path::new("/a"), OpenMode::Create).unwrap();
        let held = io.submit_nowait((0..8).map(|k| Sqe::new(write_op(f, k * 4096, 1))).collect());
        let c = io.submit(vec![Sqe::new(write_op(f, 64 * 1024, 2))]);
        assert!(c[0].result.is_ok());
        let mut reaped = Vec::new();
        while reaped.is_empty() {
            reaped = io.reap();
        }
        assert_eq!(reaped[0].0, held);
        assert!(reaped[0].1.iter().all(|c| c.result.is_ok()));
    }
}
