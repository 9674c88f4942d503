//! The sim's namespace: names as the process sees them, as they would
//! survive a power cut, and the changes in between.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use super::faults::SimRng;

pub(super) type Inode = u64;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Node {
    File(Inode),
    Dir,
}

#[derive(Clone, Debug)]
pub(super) enum NameChange {
    Insert {
        path: PathBuf,
        node: Node,
    },
    /// `node` is what the name held when it was removed: a later replay
    /// removes only that (the name may hold another node by then, moved
    /// in with a renamed directory).
    Remove {
        path: PathBuf,
        node: Node,
    },
    /// `node` is what `from` held when it was renamed: a later replay
    /// moves only that (as for `Remove`).
    Rename {
        from: PathBuf,
        to: PathBuf,
        node: Node,
    },
}

impl NameChange {
    fn touches_dir(&self, dir: &Path) -> bool {
        let parent_is = |p: &Path| p.parent() == Some(dir);
        match self {
            NameChange::Insert { path, .. } | NameChange::Remove { path, .. } => parent_is(path),
            NameChange::Rename { from, to, .. } => parent_is(from) || parent_is(to),
        }
    }

    /// Whether this change makes `path` stop existing.
    fn frees(&self, path: &Path) -> bool {
        match self {
            NameChange::Remove { path: p, .. } => p == path,
            NameChange::Rename { from, .. } => from == path,
            NameChange::Insert { .. } => false,
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
            NameChange::Remove { path, node } => {
                if names.get(path) == Some(node) {
                    names.remove(path);
                }
            }
            NameChange::Rename { from, to, node } => {
                if names.get(from) == Some(node) {
                    names.remove(from);
                    names.insert(to.clone(), *node);
                }
            }
        }
    }
}

/// The namespace. "/" always exists.
#[derive(Clone, Debug)]
pub(super) struct Namespace {
    /// What the process sees.
    pub names: BTreeMap<PathBuf, Node>,
    /// What survives a crash.
    durable: BTreeMap<PathBuf, Node>,
    /// Changes made since, in order, not covered by a directory fsync.
    pending: Vec<NameChange>,
}

impl Namespace {
    pub fn new() -> Self {
        let mut names = BTreeMap::new();
        names.insert(PathBuf::from("/"), Node::Dir);
        Self::durable(names)
    }

    fn durable(names: BTreeMap<PathBuf, Node>) -> Self {
        Self {
            durable: names.clone(),
            names,
            pending: Vec::new(),
        }
    }

    pub fn get(&self, path: &Path) -> Option<Node> {
        self.names.get(path).copied()
    }

    pub fn parent_exists(&self, path: &Path) -> bool {
        match path.parent() {
            Some(parent) if !parent.as_os_str().is_empty() => {
                self.names.get(parent) == Some(&Node::Dir)
            }
            _ => true,
        }
    }

    pub fn change(&mut self, change: NameChange) {
        change.apply(&mut self.names);
        self.pending.push(change);
    }

    /// A directory fsync: its pending name changes become durable, with the
    /// earlier changes they depend on (what created a renamed source, the
    /// parent directory of a new name, the removal that freed a new name,
    /// the removals that emptied a removed directory), in their original order, as a journaling filesystem
    /// commits them. Unrelated changes stay pending.
    pub fn commit(&mut self, dir: &Path) {
        let seeds = (0..self.pending.len())
            .filter(|&i| self.pending[i].touches_dir(dir))
            .collect();
        self.commit_with_needs(seeds);
    }

    /// Before a directory is renamed onto `to`, a name whose old directory's
    /// removal is pending: that removal becomes durable, with the changes
    /// that emptied it (a journaling filesystem commits them no later than
    /// the rename). The durable view is keyed by path and cannot hold the
    /// old directory's entries beside the new one's, which the rename moves
    /// in at once (sim seed 35010082: a reopen renamed a crashed install's
    /// segments out of its generation directory, the next install's staging
    /// directory took that name, and the durable view lost a renamed-out
    /// segment that a later roll renamed back in).
    pub fn settle_removal_of(&mut self, to: &Path) {
        let freed = (0..self.pending.len())
            .rev()
            .find(|&i| self.pending[i].frees(to));
        if let Some(i) = freed {
            self.commit_with_needs(vec![i]);
        }
    }

    /// Makes the pending changes `seeds` durable with those they depend on.
    fn commit_with_needs(&mut self, mut stack: Vec<usize>) {
        let pending = std::mem::take(&mut self.pending);
        let mut commit = vec![false; pending.len()];
        while let Some(i) = stack.pop() {
            if std::mem::replace(&mut commit[i], true) {
                continue;
            }
            let needs: Vec<PathBuf> = match &pending[i] {
                NameChange::Rename { from, to, .. } => {
                    vec![
                        from.clone(),
                        to.parent().map(Path::to_path_buf).unwrap_or_default(),
                    ]
                }
                NameChange::Insert { path, .. } => {
                    vec![path.parent().map(Path::to_path_buf).unwrap_or_default()]
                }
                NameChange::Remove { path, .. } => {
                    // A directory is removed only once empty: its durable
                    // removal carries the changes that emptied it (else a
                    // crash could replay them onto a new directory that
                    // took its name).
                    let emptied = (0..i).filter(|&j| pending[j].touches_dir(path));
                    stack.extend(emptied);
                    Vec::new()
                }
            };
            for need in needs {
                if let Some(j) = (0..i).rev().find(|&j| pending[j].creates(&need)) {
                    stack.push(j);
                }
            }
            // A name is created only once free: its durable creation
            // carries the removal that freed it (else a crash could replay
            // the old removal onto the new node, which a `Dir` cannot tell
            // apart).
            let created = match &pending[i] {
                NameChange::Insert { path, .. } => Some(path),
                NameChange::Rename { to, .. } => Some(to),
                NameChange::Remove { .. } => None,
            };
            if let Some(path) = created {
                if let Some(j) = (0..i).rev().find(|&j| pending[j].frees(path)) {
                    stack.push(j);
                }
            }
        }
        for (change, done) in pending.into_iter().zip(commit) {
            if done {
                change.apply(&mut self.durable);
            } else {
                self.pending.push(change);
            }
        }
    }

    /// Moves the children of directory `from` to `to` at once, in both views
    /// (a directory's entries go with it, durable or not, as on a real
    /// filesystem). The rename of `from` itself is a separate change.
    pub fn move_children(&mut self, from: &Path, to: &Path) {
        debug_assert!(
            !self.durable.keys().any(|p| p.parent() == Some(to)),
            "durable entries of an old {to:?} would be overwritten"
        );
        let children: Vec<(PathBuf, Node)> = self
            .names
            .range(from.to_path_buf()..)
            .take_while(|(p, _)| p.starts_with(from))
            .filter(|(p, _)| *p != from)
            .map(|(p, n)| (p.clone(), *n))
            .collect();
        for (path, node) in children {
            let Ok(rel) = path.strip_prefix(from) else {
                continue;
            };
            let moved = to.join(rel);
            self.names.remove(&path);
            self.names.insert(moved.clone(), node);
            if let Some(n) = self.durable.remove(&path) {
                self.durable.insert(moved, n);
            }
        }
    }

    /// The namespace the next boot sees: the durable names plus a seeded
    /// prefix of the pending changes (in order, as a journal commits them).
    pub fn after_crash(&self, rng: &mut SimRng) -> Namespace {
        let mut names = self.durable.clone();
        let keep = rng.below(self.pending.len() as u64 + 1) as usize;
        for change in &self.pending[..keep] {
            change.apply(&mut names);
        }
        // A directory rename that is lost takes its children back with it
        // (they moved with the directory when it was renamed).
        for change in self.pending[keep..].iter().rev() {
            if let NameChange::Rename { from, to, .. } = change {
                let moved: Vec<PathBuf> = names
                    .keys()
                    .filter(|p| p.starts_with(to) && *p != to)
                    .cloned()
                    .collect();
                for path in moved {
                    let Ok(rel) = path.strip_prefix(to).map(Path::to_path_buf) else {
                        continue;
                    };
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
        Namespace::durable(names)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(s: &str) -> PathBuf {
        PathBuf::from(s)
    }

    fn insert(ns: &mut Namespace, names: &[(&str, Node)]) {
        for &(path, node) in names {
            ns.change(NameChange::Insert {
                path: p(path),
                node,
            });
        }
    }

    fn remove(ns: &mut Namespace, names: &[(&str, Node)]) {
        for &(path, node) in names {
            ns.change(NameChange::Remove {
                path: p(path),
                node,
            });
        }
    }

    fn rename_file(ns: &mut Namespace, from: &str, to: &str, inode: Inode) {
        ns.change(NameChange::Rename {
            from: p(from),
            to: p(to),
            node: Node::File(inode),
        });
    }

    /// Durable `/d/f` (inode 1), `/r` and `/s/f` (inode 2); then `/d/f`
    /// renamed to `/r/f`, `/d` removed, `/s` renamed to `/d` and `/`
    /// fsynced.
    fn old_dir_renamed_away_then_name_reused() -> Namespace {
        let mut ns = Namespace::new();
        insert(&mut ns, &[("/d", Node::Dir), ("/d/f", Node::File(1))]);
        insert(&mut ns, &[("/r", Node::Dir)]);
        insert(&mut ns, &[("/s", Node::Dir), ("/s/f", Node::File(2))]);
        for dir in ["/", "/d", "/r", "/s"] {
            ns.commit(Path::new(dir));
        }
        assert!(ns.pending.is_empty(), "everything durable so far");
        rename_file(&mut ns, "/d/f", "/r/f", 1);
        remove(&mut ns, &[("/d", Node::Dir)]);
        rename_dir(&mut ns, "/s", "/d");
        ns.commit(Path::new("/"));
        ns
    }

    /// A directory rename as the sim backend makes it.
    fn rename_dir(ns: &mut Namespace, from: &str, to: &str) {
        ns.settle_removal_of(Path::new(to));
        ns.change(NameChange::Rename {
            from: p(from),
            to: p(to),
            node: Node::Dir,
        });
        ns.move_children(Path::new(from), Path::new(to));
    }

    /// Guards against a crash resurrecting, under a reused name, the
    /// unlinks of the directory that name used to hold: a stale `/d`
    /// emptied and removed, then `/s` renamed to `/d`, then `/` fsynced.
    /// The unlink of the old `/d/f` ran in the removed directory; it must
    /// not remove the new `/d/f` when the next boot replays the journal.
    #[test]
    fn a_reused_directory_name_keeps_the_new_directorys_entries() {
        let mut ns = Namespace::new();
        insert(&mut ns, &[("/d", Node::Dir), ("/d/f", Node::File(1))]);
        insert(&mut ns, &[("/s", Node::Dir), ("/s/f", Node::File(2))]);
        ns.commit(Path::new("/"));
        ns.commit(Path::new("/d"));
        ns.commit(Path::new("/s"));
        assert!(ns.pending.is_empty(), "everything durable so far");

        remove(&mut ns, &[("/d/f", Node::File(1)), ("/d", Node::Dir)]);
        rename_dir(&mut ns, "/s", "/d");
        ns.commit(Path::new("/"));
        // Removing `/d` durably implies it was durably empty first.
        assert!(ns.pending.is_empty(), "pending: {:?}", ns.pending);
        for seed in 0..16 {
            let after = ns.after_crash(&mut SimRng::new(seed));
            assert_eq!(
                after.get(Path::new("/d/f")),
                Some(Node::File(2)),
                "seed {seed}"
            );
            assert_eq!(after.get(Path::new("/s")), None, "seed {seed}");
        }
    }

    /// Guards against a crash replaying, under a reused name, a rename out
    /// of the directory that name used to hold (sim seed 34004449, found
    /// through `transfer_sim`: a crashed install's generation directory had
    /// its segments renamed into the recycle pool at reopen, then the next
    /// install's staging directory took that name). The rename moved the
    /// old `/d/f`; it must not move the new `/d/f` at the next boot.
    #[test]
    fn a_reused_directory_name_keeps_entries_the_old_one_renamed_away() {
        let ns = old_dir_renamed_away_then_name_reused();
        for seed in 0..16 {
            let after = ns.after_crash(&mut SimRng::new(seed));
            assert_eq!(
                after.get(Path::new("/d/f")),
                Some(Node::File(2)),
                "seed {seed}"
            );
            let moved = after.get(Path::new("/r/f"));
            assert_ne!(moved, Some(Node::File(2)), "seed {seed}");
        }
    }

    /// Guards against the durable view losing a file renamed out of a
    /// directory whose name a renamed directory then took, when the file
    /// comes back under that name (sim seed 35010082: a crashed install's
    /// segment renamed to the recycle pool, the next install's directory
    /// renamed onto the old name, the segment recycled into it by a roll).
    #[test]
    fn a_file_renamed_out_of_a_reused_directory_name_can_come_back() {
        let mut ns = old_dir_renamed_away_then_name_reused();
        rename_file(&mut ns, "/r/f", "/d/g", 1);
        ns.commit(Path::new("/d"));
        for seed in 0..16 {
            let after = ns.after_crash(&mut SimRng::new(seed));
            assert_eq!(after.get(Path::new("/d/g")), Some(Node::File(1)));
            assert_eq!(after.get(Path::new("/d/f")), Some(Node::File(2)));
        }
    }

    /// Guards against a crash replaying the removal of a directory onto the
    /// new directory created under its name: a leftover `/s` emptied and
    /// removed, a new `/s` made with `/s/g` and fsynced, renamed to `/d`,
    /// then `/` fsynced. The new directory and its entry must survive.
    #[test]
    fn a_recreated_directory_is_not_removed_by_the_old_ones_removal() {
        let mut ns = Namespace::new();
        insert(&mut ns, &[("/s", Node::Dir), ("/s/f", Node::File(1))]);
        ns.commit(Path::new("/"));
        ns.commit(Path::new("/s"));
        remove(&mut ns, &[("/s/f", Node::File(1)), ("/s", Node::Dir)]);
        insert(&mut ns, &[("/s", Node::Dir), ("/s/g", Node::File(2))]);
        ns.commit(Path::new("/s"));
        rename_dir(&mut ns, "/s", "/d");
        ns.commit(Path::new("/"));
        assert!(ns.pending.is_empty(), "pending: {:?}", ns.pending);
        for seed in 0..16 {
            let after = ns.after_crash(&mut SimRng::new(seed));
            assert_eq!(after.get(Path::new("/d")), Some(Node::Dir), "seed {seed}");
            assert_eq!(
                after.get(Path::new("/d/g")),
                Some(Node::File(2)),
                "seed {seed}"
            );
            assert_eq!(after.get(Path::new("/s")), None, "seed {seed}");
            assert_eq!(after.get(Path::new("/s/f")), None, "seed {seed}");
        }
    }
}
