//! The sim backend: an in-memory, seeded, crashable filesystem.
//!
//! It keeps two views of every file and of the namespace: what the running
//! process sees, and what would survive a power cut. A write is durable only
//! once an fdatasync of its file completed; a create, rename, unlink or mkdir
//! only once an fsync of the directory holding the name completed.
//!
//! Crash model ([`SimBackend::set_crash_at`] then [`SimBackend::reboot`]):
//! - the op with the chosen index is "in flight" when power fails: if it is a
//!   write, a random subset of its 512-byte sectors may reach the disk (a torn
//!   write), every other op at or after it never happens;
//! - every write not covered by a completed fdatasync is dropped;
//! - namespace changes not followed by a directory fsync are kept only as a
//!   random prefix (in order, as a journal would commit them), so a rename or
//!   unlink may be lost.
//!
//! Everything is driven by a seed, so a failing run replays exactly.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};

use super::{BatchId, Completion, FileId, IoBackend, Op, OpenMode, Sqe, BLOCK_SIZE};

/// Torn writes tear at this granularity (a disk sector).
pub const SECTOR_SIZE: usize = 512;

/// A small deterministic PRNG (splitmix64): the sim must not depend on the
/// process's randomness, so every run is replayable from its seed.
#[derive(Clone, Debug)]
pub struct SimRng(u64);

impl SimRng {
    pub fn new(seed: u64) -> Self {
        Self(seed)
    }

    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// Uniform in `0..n` (n > 0).
    pub fn below(&mut self, n: u64) -> u64 {
        debug_assert!(n > 0);
        self.next_u64() % n
    }

    pub fn chance(&mut self, numerator: u64, denominator: u64) -> bool {
        self.below(denominator) < numerator
    }
}

type Inode = u64;

#[derive(Clone, Debug, Default)]
struct FileData {
    /// What the process reads.
    current: Vec<u8>,
    /// What survives a crash.
    durable: Vec<u8>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Node {
    File(Inode),
    Dir,
}

#[derive(Clone, Debug)]
enum NameChange {
    Insert { path: PathBuf, node: Node },
    Remove { path: PathBuf },
    Rename { from: PathBuf, to: PathBuf },
}

impl NameChange {
    fn touches_dir(&self, dir: &Path) -> bool {
        let parent_is = |p: &Path| p.parent() == Some(dir);
        match self {
            NameChange::Insert { path, .. } | NameChange::Remove { path } => parent_is(path),
            NameChange::Rename { from, to } => parent_is(from) || parent_is(to),
        }
    }

    /// Whether this change makes `path` exist.
    fn creates(&self, path: &Path) -> bool {
        match self {
            NameChange::Insert { path: p, .. } => p == path,
            NameChange::Rename { to, .. } => to == path,
            NameChange::Remove { .. } => false,
        }
    }

    fn apply(&self, names: &mut BTreeMap<PathBuf, Node>) {
        match self {
            NameChange::Insert { path, node } => {
                names.insert(path.clone(), *node);
            }
            NameChange::Remove { path } => {
                names.remove(path);
            }
            NameChange::Rename { from, to } => {
                if let Some(node) = names.remove(from) {
                    names.insert(to.clone(), node);
                }
            }
        }
    }
}

/// The in-memory disk. Paths are used as given (callers pass absolute-like
/// paths under a root of their choosing); "/" always exists.
#[derive(Debug)]
pub struct SimBackend {
    rng: SimRng,
    names: BTreeMap<PathBuf, Node>,
    durable_names: BTreeMap<PathBuf, Node>,
    pending_names: Vec<NameChange>,
    inodes: BTreeMap<Inode, FileData>,
    inode_next: Inode,
    open: BTreeMap<u32, (PathBuf, Node)>,
    fd_next: u32,
    /// Mutating ops executed so far (the crash-point clock).
    ops_count: u64,
    crash_at_op: Option<u64>,
    fail_at_op: Option<u64>,
    crashed: bool,
    /// The write that was in flight at the crash: (inode, offset, bytes).
    torn_candidate: Option<(Inode, u64, Vec<u8>)>,
    tear_in_flight: bool,
    /// Batches of `submit_nowait` not run yet, in submission order.
    queued: Vec<(BatchId, Vec<Sqe>)>,
    next_batch: u64,
}

impl SimBackend {
    pub fn new(seed: u64) -> Self {
        let mut names = BTreeMap::new();
        names.insert(PathBuf::from("/"), Node::Dir);
        Self {
            rng: SimRng::new(seed),
            durable_names: names.clone(),
            names,
            pending_names: Vec::new(),
            inodes: BTreeMap::new(),
            inode_next: 1,
            open: BTreeMap::new(),
            fd_next: 1,
            ops_count: 0,
            crash_at_op: None,
            fail_at_op: None,
            crashed: false,
            torn_candidate: None,
            tear_in_flight: true,
            queued: Vec::new(),
            next_batch: 0,
        }
    }

    /// Mutating ops executed so far; crash points are indices on this clock.
    pub fn ops_count(&self) -> u64 {
        self.ops_count
    }

    /// Power fails while the op with index `op_index` (on the [`ops_count`]
    /// clock) is in flight. `tear` decides whether an in-flight write may land
    /// partially.
    ///
    /// [`ops_count`]: SimBackend::ops_count
    pub fn set_crash_at(&mut self, op_index: u64, tear: bool) {
        self.crash_at_op = Some(op_index);
        self.tear_in_flight = tear;
    }

    /// The op with index `op_index` fails with EIO (a failing disk), the rest
    /// run normally.
    pub fn set_fail_at(&mut self, op_index: u64) {
        self.fail_at_op = Some(op_index);
    }

    pub fn is_crashed(&self) -> bool {
        self.crashed
    }

    /// Cuts the power now (if no crash happened yet) and returns the disk as
    /// the next boot sees it. The backend's seed drives which unsynced
    /// namespace changes survive and how the in-flight write tears.
    pub fn reboot(mut self) -> SimBackend {
        let mut rng = self.rng.clone();
        let mut names = self.durable_names.clone();
        let keep = rng.below(self.pending_names.len() as u64 + 1) as usize;
        for change in &self.pending_names[..keep] {
            change.apply(&mut names);
        }
        // A directory rename that is lost takes its children back with it
        // (they moved with the directory when it was renamed).
        for change in self.pending_names[keep..].iter().rev() {
            if let NameChange::Rename { from, to } = change {
                let moved: Vec<PathBuf> = names
                    .keys()
                    .filter(|p| p.starts_with(to) && *p != to)
                    .cloned()
                    .collect();
                for path in moved {
                    let rel = path.strip_prefix(to).expect("prefix checked").to_path_buf();
                    if let Some(node) = names.remove(&path) {
                        names.insert(from.join(rel), node);
                    }
                }
            }
        }
        // A name whose directory did not survive is gone with it.
        let dirs: BTreeSet<PathBuf> = names
            .iter()
            .filter(|(_, n)| **n == Node::Dir)
            .map(|(p, _)| p.clone())
            .collect();
        names.retain(|p, _| {
            p.ancestors()
                .skip(1)
                .all(|a| a.as_os_str().is_empty() || dirs.contains(a))
        });

        if let Some((inode, offset, bytes)) = self.torn_candidate.take() {
            if self.tear_in_flight {
                if let Some(file) = self.inodes.get_mut(&inode) {
                    for (i, sector) in bytes.chunks(SECTOR_SIZE).enumerate() {
                        if rng.chance(1, 2) {
                            let at = offset as usize + i * SECTOR_SIZE;
                            write_into(&mut file.durable, at, sector);
                        }
                    }
                }
            }
        }
        let mut inodes = BTreeMap::new();
        for node in names.values() {
            if let Node::File(inode) = node {
                if let Some(file) = self.inodes.get(inode) {
                    inodes.insert(
                        *inode,
                        FileData {
                            current: file.durable.clone(),
                            durable: file.durable.clone(),
                        },
                    );
                }
            }
        }
        SimBackend {
            rng: SimRng::new(rng.next_u64()),
            durable_names: names.clone(),
            names,
            pending_names: Vec::new(),
            inodes,
            inode_next: self.inode_next,
            open: BTreeMap::new(),
            fd_next: 1,
            ops_count: 0,
            crash_at_op: None,
            fail_at_op: None,
            crashed: false,
            torn_candidate: None,
            tear_in_flight: true,
            queued: Vec::new(),
            next_batch: 0,
        }
    }

    /// The bytes a process would read from `path` now (test helper).
    pub fn read_whole(&self, path: &Path) -> Option<&[u8]> {
        match self.names.get(path)? {
            Node::File(inode) => self.inodes.get(inode).map(|f| &f.current[..]),
            Node::Dir => None,
        }
    }

    /// Overwrites bytes of a file in place, durably (test helper for
    /// simulating media corruption).
    pub fn corrupt(&mut self, path: &Path, offset: usize, bytes: &[u8]) {
        if let Some(Node::File(inode)) = self.names.get(path) {
            if let Some(file) = self.inodes.get_mut(inode) {
                write_into(&mut file.current, offset, bytes);
                write_into(&mut file.durable, offset, bytes);
            }
        }
    }

    /// Every path that currently exists, for test assertions.
    pub fn paths(&self) -> Vec<PathBuf> {
        self.names.keys().cloned().collect()
    }

    /// Advances the op clock; returns Err if this op must not happen.
    fn tick(&mut self) -> io::Result<()> {
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
            return Err(io::Error::from_raw_os_error(libc::EIO));
        }
        Ok(())
    }

    fn parent_exists(&self, path: &Path) -> io::Result<()> {
        match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => match self.names.get(parent) {
                Some(Node::Dir) => Ok(()),
                _ => Err(io::Error::from(io::ErrorKind::NotFound)),
            },
            _ => Ok(()),
        }
    }

    /// A directory fsync: its pending name changes become durable, with the
    /// earlier changes they depend on (what created a renamed source, or the
    /// parent directory of a new name), in their original order, as a
    /// journaling filesystem commits them. Unrelated changes stay pending.
    fn commit_names(&mut self, dir: &Path) {
        let pending = std::mem::take(&mut self.pending_names);
        let mut commit = vec![false; pending.len()];
        let mut stack: Vec<usize> = (0..pending.len())
            .filter(|&i| pending[i].touches_dir(dir))
            .collect();
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut commit[i], true) {
                continue;
            }
            let needs: Vec<PathBuf> = match &pending[i] {
                NameChange::Rename { from, to } => {
                    vec![
                        from.clone(),
                        to.parent().map(Path::to_path_buf).unwrap_or_default(),
                    ]
                }
                NameChange::Insert { path, .. } => {
                    vec![path.parent().map(Path::to_path_buf).unwrap_or_default()]
                }
                NameChange::Remove { .. } => Vec::new(),
            };
            for need in needs {
                if let Some(j) = (0..i).rev().find(|&j| pending[j].creates(&need)) {
                    stack.push(j);
                }
            }
        }
        for (change, done) in pending.into_iter().zip(commit) {
            if done {
                change.apply(&mut self.durable_names);
            } else {
                self.pending_names.push(change);
            }
        }
    }

    fn change_names(&mut self, change: NameChange) {
        change.apply(&mut self.names);
        self.pending_names.push(change);
    }

    fn file_inode(&self, file: FileId) -> io::Result<Inode> {
        match self.open.get(&file.0) {
            Some((_, Node::File(inode))) => Ok(*inode),
            Some((_, Node::Dir)) => Err(io::Error::from_raw_os_error(libc::EISDIR)),
            None => Err(io::Error::from_raw_os_error(libc::EBADF)),
        }
    }

    fn run(&mut self, op: &mut Op) -> io::Result<usize> {
        // Reads do not advance the crash clock: a crash "after a read" is the
        // same state as one before the next mutating op.
        if let Op::Read {
            file,
            offset,
            len,
            buf,
        } = op
        {
            if self.crashed {
                return Err(crashed_error());
            }
            check_aligned(*offset, *len)?;
            let inode = self.file_inode(*file)?;
            let data = &self.inodes[&inode].current;
            let start = (*offset as usize).min(data.len());
            let end = (start + *len).min(data.len());
            let n = end - start;
            buf.set_len(n);
            buf.copy_from_slice(&data[start..end]);
            return Ok(n);
        }
        let was_crashed = self.crashed;
        if let Err(e) = self.tick() {
            if let (false, true, Op::Write { file, offset, buf }) =
                (was_crashed, self.crashed, &*op)
            {
                // This write is the one in flight when power failed.
                if let Ok(inode) = self.file_inode(*file) {
                    self.torn_candidate = Some((inode, *offset, buf.to_vec()));
                }
            }
            return Err(e);
        }
        match op {
            Op::Read { .. } => unreachable!("handled above"),
            Op::Write { file, offset, buf } => {
                check_aligned(*offset, buf.len())?;
                let inode = self.file_inode(*file)?;
                let data = self.inodes.get_mut(&inode).expect("open inode exists");
                write_into(&mut data.current, *offset as usize, buf);
                Ok(buf.len())
            }
            Op::Fdatasync { file } => {
                let inode = self.file_inode(*file)?;
                let data = self.inodes.get_mut(&inode).expect("open inode exists");
                data.durable.clone_from(&data.current);
                Ok(0)
            }
            Op::Fsync { file } => {
                match self.open.get(&file.0) {
                    Some((path, Node::Dir)) => {
                        let dir = path.clone();
                        self.commit_names(&dir);
                    }
                    Some((_, Node::File(inode))) => {
                        let data = self.inodes.get_mut(inode).expect("open inode exists");
                        data.durable.clone_from(&data.current);
                    }
                    None => return Err(io::Error::from_raw_os_error(libc::EBADF)),
                }
                Ok(0)
            }
            Op::Rename { from, to } => {
                let node = *self
                    .names
                    .get(from.as_path())
                    .ok_or_else(|| io::Error::from(io::ErrorKind::NotFound))?;
                self.parent_exists(to)?;
                if node == Node::Dir && self.names.contains_key(to.as_path()) {
                    return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
                }
                self.change_names(NameChange::Rename {
                    from: from.clone(),
                    to: to.clone(),
                });
                if node == Node::Dir {
                    // Move the children with their directory.
                    let children: Vec<(PathBuf, Node)> = self
                        .names
                        .range(from.clone()..)
                        .take_while(|(p, _)| p.starts_with(&*from))
                        .map(|(p, n)| (p.clone(), *n))
                        .collect();
                    for (path, node) in children {
                        let rel = path.strip_prefix(&*from).expect("prefix checked");
                        let moved = to.join(rel);
                        self.names.remove(&path);
                        self.names.insert(moved.clone(), node);
                        // Children move with their directory entry at once,
                        // durable or not, as on a real filesystem.
                        if let Some(n) = self.durable_names.remove(&path) {
                            self.durable_names.insert(moved, n);
                        }
                    }
                    // An open directory handle follows its directory.
                    for (path, _) in self.open.values_mut() {
                        if let Ok(rel) = path.strip_prefix(&*from) {
                            *path = to.join(rel);
                        }
                    }
                }
                Ok(0)
            }
            Op::Unlink { path } => match self.names.get(path.as_path()) {
                Some(Node::File(_)) => {
                    self.change_names(NameChange::Remove { path: path.clone() });
                    Ok(0)
                }
                Some(Node::Dir) => Err(io::Error::from_raw_os_error(libc::EISDIR)),
                None => Err(io::Error::from(io::ErrorKind::NotFound)),
            },
            Op::RemoveDir { path } => match self.names.get(path.as_path()) {
                Some(Node::Dir) => {
                    let has_children = self
                        .names
                        .keys()
                        .any(|p| p.parent() == Some(path.as_path()));
                    if has_children {
                        return Err(io::Error::from_raw_os_error(libc::ENOTEMPTY));
                    }
                    self.change_names(NameChange::Remove { path: path.clone() });
                    Ok(0)
                }
                Some(Node::File(_)) => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
                None => Err(io::Error::from(io::ErrorKind::NotFound)),
            },
        }
    }
}

fn crashed_error() -> io::Error {
    io::Error::other("sim: power failed")
}

fn check_aligned(offset: u64, len: usize) -> io::Result<()> {
    if !offset.is_multiple_of(BLOCK_SIZE as u64) || !len.is_multiple_of(BLOCK_SIZE) {
        return Err(io::Error::from_raw_os_error(libc::EINVAL));
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
        let node = match (self.names.get(path).copied(), mode) {
            (Some(Node::File(inode)), _) => Node::File(inode),
            (Some(Node::Dir), _) => return Err(io::Error::from_raw_os_error(libc::EISDIR)),
            (None, OpenMode::Existing) => return Err(io::Error::from(io::ErrorKind::NotFound)),
            (None, OpenMode::Create) => {
                self.parent_exists(path)?;
                self.tick()?;
                let inode = self.inode_next;
                self.inode_next += 1;
                self.inodes.insert(inode, FileData::default());
                let node = Node::File(inode);
                self.change_names(NameChange::Insert {
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
        match self.names.get(path) {
            Some(Node::Dir) => {
                let fd = self.fd_next;
                self.fd_next += 1;
                self.open.insert(fd, (path.to_path_buf(), Node::Dir));
                Ok(FileId(fd))
            }
            Some(Node::File(_)) => Err(io::Error::from_raw_os_error(libc::ENOTDIR)),
            None => Err(io::Error::from(io::ErrorKind::NotFound)),
        }
    }

    fn close(&mut self, file: FileId) {
        self.open.remove(&file.0);
    }

    fn create_dir(&mut self, path: &Path) -> io::Result<()> {
        if self.names.contains_key(path) {
            return Err(io::Error::from(io::ErrorKind::AlreadyExists));
        }
        self.parent_exists(path)?;
        self.tick()?;
        self.change_names(NameChange::Insert {
            path: path.to_path_buf(),
            node: Node::Dir,
        });
        Ok(())
    }

    fn list_dir(&mut self, path: &Path) -> io::Result<Vec<String>> {
        if self.names.get(path) != Some(&Node::Dir) {
            return Err(io::Error::from(io::ErrorKind::NotFound));
        }
        Ok(self
            .names
            .keys()
            .filter(|p| p.parent() == Some(path))
            .filter_map(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
            .collect())
    }

    fn exists(&mut self, path: &Path) -> io::Result<bool> {
        Ok(self.names.contains_key(path))
    }

    fn file_size(&mut self, file: FileId) -> io::Result<u64> {
        let inode = self.file_inode(file)?;
        Ok(self.inodes[&inode].current.len() as u64)
    }

    fn allocate(&mut self, file: FileId, len_bytes: u64) -> io::Result<()> {
        let inode = self.file_inode(file)?;
        self.tick()?;
        let data = self.inodes.get_mut(&inode).expect("open inode exists");
        // Allocation is metadata the journal commits with the next sync; the
        // store never relies on a file's size, so keeping it is harmless.
        for view in [&mut data.current, &mut data.durable] {
            if (view.len() as u64) < len_bytes {
                view.resize(len_bytes as usize, 0);
            }
        }
        Ok(())
    }

    fn submit(&mut self, batch: Vec<Sqe>) -> Vec<Completion> {
        // Ops run one after another in submission order: one of the orders
        // the kernel may choose, and the one every link chain requires.
        batch
            .into_iter()
            .map(|Sqe { mut op, .. }| {
                let result = self.run(&mut op);
                Completion { op, result }
            })
            .collect()
    }

    fn submit_nowait(&mut self, batch: Vec<Sqe>) -> BatchId {
        let id = BatchId(self.next_batch);
        self.next_batch += 1;
        self.queued.push((id, batch));
        id
    }

    /// Runs every queued batch, oldest first.
    fn reap(&mut self) -> Vec<(BatchId, Vec<Completion>)> {
        std::mem::take(&mut self.queued)
            .into_iter()
            .map(|(id, batch)| (id, self.submit(batch)))
            .collect()
    }

    fn batches_running(&self) -> usize {
        self.queued.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::io::AlignedBuf;

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
        let mut reaped = io.reap();
        reaped.sort_by_key(|(id, _)| *id);
        let ids: Vec<BatchId> = reaped.iter().map(|(id, _)| *id).collect();
        assert_eq!(ids, [a, b]);
        assert!(reaped
            .iter()
            .all(|(_, c)| c.len() == 1 && c[0].result.is_ok()));
        assert_eq!(io.batches_running(), 0);
        assert!(io.reap().is_empty());
    }
}
