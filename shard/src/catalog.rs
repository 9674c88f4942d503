//! Topic metadata: names, partition counts and stable partition ids.
//!
//! Durable as `<data_dir>/topics.json`, replaced atomically: write
//! `topics.json.tmp`, fdatasync it, rename it over `topics.json`, fsync the
//! directory. A topic is first written as `creating`, its partitions are
//! created on their shards, then it is rewritten as `ready`; on boot a
//! `creating` topic's missing partitions are created, while a `ready`
//! topic's missing partition is a fault (reported, never silently recreated).
//!
//! A missing or unreadable catalog never deletes data: boot refuses with a
//! message that says how to proceed, and [`TopicTable::rebuild`] (the
//! `--rebuild-catalog` flag) recovers the table from the partition
//! directories and the partition ids in their superblocks.
//!
//! One writer (the controller on shard 0); every shard reads through
//! [`Catalog::snapshot`], which costs one atomic load unless the table
//! changed.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use serde::{Deserialize, Serialize};
use thiserror::Error;

pub const TOPICS_FILE: &str = "topics.json";
pub const TOPICS_DIR: &str = "topics";

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum TopicState {
    Creating,
    Ready,
}

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicMeta {
    pub partitions: u32,
    /// Partition `i` has stable id `first_partition_id + i`.
    pub first_partition_id: u32,
    pub state: TopicState,
    /// Replicas of each partition: 1 on a single node; in a cluster every
    /// node, ordered by node id, replica index = position (see
    /// `placement::group_id`). Files written before it existed read 1.
    #[serde(default = "single_replica")]
    pub replication_factor: u8,
}

fn single_replica() -> u8 {
    1
}

impl TopicMeta {
    pub fn partition_id(&self, index: u32) -> Option<u32> {
        (index < self.partitions).then(|| self.first_partition_id + index)
    }
}

#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicTable {
    /// Format version of the file.
    pub format: u32,
    /// Next stable partition id to hand out (ids are never reused).
    pub next_partition_id: u32,
    pub topics: BTreeMap<String, TopicMeta>,
    /// In a cluster: the last metadata op whose local actions this table
    /// reflects (the node's applied view of the metadata group). A boot
    /// replays the group's log from its start and skips the actions of
    /// ops up to this one, so it never re-creates a topic deleted later.
    #[serde(default)]
    pub meta_applied_op: u64,
}

#[derive(Debug, Error)]
pub enum CatalogError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error(
        "{path} is corrupt: {message} (nothing was deleted; restore it from a backup, \
         or move it aside and start once with --rebuild-catalog)"
    )]
    Corrupt { path: PathBuf, message: String },
    #[error(
        "{path} is missing but {dir} holds {topics} topic directories; nothing was deleted. \
         Restore topics.json from a backup, or start once with --rebuild-catalog to \
         rebuild it from the partitions on disk"
    )]
    Missing {
        path: PathBuf,
        dir: PathBuf,
        topics: usize,
    },
    #[error("cannot rebuild the catalog from {path}: {message}")]
    Rebuild { path: PathBuf, message: String },
}

fn io_err<'a>(
    what: &'static str,
    path: &'a Path,
) -> impl FnOnce(std::io::Error) -> CatalogError + 'a {
    move |source| CatalogError::Io {
        what,
        path: path.into(),
        source,
    }
}

impl TopicTable {
    pub const FORMAT: u32 = 1;

    fn empty() -> TopicTable {
        TopicTable {
            format: Self::FORMAT,
            ..TopicTable::default()
        }
    }

    /// Loads `topics.json` from `data_dir`. A missing file is an empty table
    /// only if no topic directory exists (a fresh data dir); otherwise it is
    /// [`CatalogError::Missing`], because garbage collection would take every
    /// topic for a deleted one.
    pub fn load(data_dir: &Path) -> Result<TopicTable, CatalogError> {
        let path = data_dir.join(TOPICS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                let dir = data_dir.join(TOPICS_DIR);
                let topics = topic_dirs(&dir)?.len();
                if topics > 0 {
                    return Err(CatalogError::Missing { path, dir, topics });
                }
                return Ok(Self::empty());
            }
            Err(e) => return Err(io_err("read", &path)(e)),
        };
        let table: TopicTable = serde_json::from_str(&text).map_err(|e| CatalogError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        if table.format != Self::FORMAT {
            return Err(CatalogError::Corrupt {
                path,
                message: format!("unknown format {}", table.format),
            });
        }
        Ok(table)
    }

    /// Replaces `topics.json` atomically and durably (see the module docs).
    pub fn store(&self, data_dir: &Path) -> Result<(), CatalogError> {
        let path = data_dir.join(TOPICS_FILE);
        let tmp = data_dir.join(format!("{TOPICS_FILE}.tmp"));
        let text = serde_json::to_string_pretty(self).map_err(|e| CatalogError::Corrupt {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let mut f = std::fs::File::create(&tmp).map_err(io_err("create", &tmp))?;
        f.write_all(text.as_bytes())
            .map_err(io_err("write", &tmp))?;
        f.sync_data().map_err(io_err("fdatasync", &tmp))?;
        drop(f);
        std::fs::rename(&tmp, &path).map_err(io_err("rename", &path))?;
        sync_dir(data_dir)
    }

    /// Rebuilds the table from what is on disk: every `topics/<name>/<index>`
    /// directory with the partition id its superblock records. Every topic
    /// comes back `ready`, and so does a topic deleted while its
    /// directories were not yet removed; ids of deleted topics that left
    /// nothing on disk may be handed out again (nothing refers to them any
    /// more). Refuses
    /// (never guesses) if a topic's indexes have gaps, a superblock is
    /// unreadable, or a topic's ids are not consecutive.
    pub fn rebuild(data_dir: &Path) -> Result<TopicTable, CatalogError> {
        let mut table = Self::empty();
        let root = data_dir.join(TOPICS_DIR);
        for (name, dir) in topic_dirs(&root)? {
            let mut ids: BTreeMap<u32, u32> = BTreeMap::new();
            for entry in std::fs::read_dir(&dir).map_err(io_err("list", &dir))? {
                let entry = entry.map_err(io_err("list", &dir))?;
                let index = entry
                    .file_name()
                    .to_str()
                    .and_then(|s| s.parse::<u32>().ok());
                let Some(index) = index else { continue };
                ids.insert(index, superblock_partition_id(&entry.path())?);
            }
            let Some(&first) = ids.get(&0) else {
                if ids.is_empty() {
                    continue; // an empty topic directory holds no data
                }
                return Err(rebuild_err(&dir, "no partition 0".into()));
            };
            for (i, (&index, &id)) in ids.iter().enumerate() {
                if index as usize != i || Some(id) != first.checked_add(index) {
                    return Err(rebuild_err(
                        &dir,
                        format!(
                            "partition {index} has id {id}; expected index {i} with id {first}+{i}"
                        ),
                    ));
                }
            }
            let partitions = ids.len() as u32;
            let end = first + partitions;
            table.next_partition_id = table.next_partition_id.max(end);
            table.topics.insert(
                name,
                TopicMeta {
                    partitions,
                    first_partition_id: first,
                    state: TopicState::Ready,
                    replication_factor: 1,
                },
            );
        }
        let mut ranges: Vec<(u32, u32)> = table
            .topics
            .values()
            .map(|m| (m.first_partition_id, m.first_partition_id + m.partitions))
            .collect();
        ranges.sort_unstable();
        if ranges.windows(2).any(|w| w[0].1 > w[1].0) {
            return Err(rebuild_err(
                &root,
                "two topics claim the same partition id".into(),
            ));
        }
        Ok(table)
    }

    /// Directory of one partition.
    pub fn partition_dir(data_dir: &Path, topic: &str, index: u32) -> PathBuf {
        data_dir
            .join(TOPICS_DIR)
            .join(topic)
            .join(index.to_string())
    }
}

fn rebuild_err(path: &Path, message: String) -> CatalogError {
    CatalogError::Rebuild {
        path: path.into(),
        message,
    }
}

/// The topic directories under `root` (name, path); none if it is absent.
fn topic_dirs(root: &Path) -> Result<Vec<(String, PathBuf)>, CatalogError> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(io_err("list", root)(e)),
    };
    let mut out = Vec::new();
    for entry in entries {
        let entry = entry.map_err(io_err("list", root))?;
        let is_dir = entry.file_type().map_err(io_err("stat", root))?.is_dir();
        if let (true, Some(name)) = (is_dir, entry.file_name().to_str()) {
            out.push((name.to_string(), entry.path()));
        }
    }
    Ok(out)
}

/// The partition id recorded in the superblock of partition directory `dir`.
fn superblock_partition_id(dir: &Path) -> Result<u32, CatalogError> {
    let path = dir.join(ringlog_storage::store::SUPERBLOCK_FILE);
    let bytes = std::fs::read(&path).map_err(io_err("read", &path))?;
    ringlog_storage::superblock::choose(&bytes, &path)
        .map(|c| c.superblock.partition_id)
        .map_err(|e| rebuild_err(&path, e.to_string()))
}

/// fsyncs a directory so the names in it are durable.
pub fn sync_dir(dir: &Path) -> Result<(), CatalogError> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(io_err("fsync directory", dir))
}

/// The shared, versioned topic table.
pub struct Catalog {
    version: AtomicU64,
    table: RwLock<Arc<TopicTable>>,
}

impl Catalog {
    pub fn new(table: TopicTable) -> Catalog {
        Catalog {
            version: AtomicU64::new(1),
            table: RwLock::new(Arc::new(table)),
        }
    }

    pub fn version(&self) -> u64 {
        self.version.load(Ordering::Acquire)
    }

    /// The current table.
    pub fn snapshot(&self) -> Arc<TopicTable> {
        match self.table.read() {
            Ok(t) => t.clone(),
            Err(poisoned) => poisoned.into_inner().clone(),
        }
    }

    /// Publishes a new table (controller only).
    pub fn publish(&self, table: TopicTable) {
        let mut guard = match self.table.write() {
            Ok(g) => g,
            Err(poisoned) => poisoned.into_inner(),
        };
        *guard = Arc::new(table);
        self.version.fetch_add(1, Ordering::AcqRel);
    }
}

/// A shard's cached view: re-reads the table only when the version moved.
pub struct CatalogView {
    catalog: Arc<Catalog>,
    version: u64,
    table: Arc<TopicTable>,
}

impl CatalogView {
    pub fn new(catalog: Arc<Catalog>) -> CatalogView {
        let version = catalog.version();
        let table = catalog.snapshot();
        CatalogView {
            catalog,
            version,
            table,
        }
    }

    pub fn get(&mut self) -> &Arc<TopicTable> {
        let v = self.catalog.version();
        if v != self.version {
            self.table = self.catalog.snapshot();
            self.version = v;
        }
        &self.table
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_and_load_round_trip() {
        let dir = tempfile::tempdir().unwrap();
        let empty = TopicTable::load(dir.path()).unwrap();
        assert!(empty.topics.is_empty());
        let mut t = empty.clone();
        t.next_partition_id = 3;
        t.topics.insert(
            "a".into(),
            TopicMeta {
                partitions: 3,
                first_partition_id: 0,
                state: TopicState::Ready,
                replication_factor: 1,
            },
        );
        t.store(dir.path()).unwrap();
        assert_eq!(TopicTable::load(dir.path()).unwrap(), t);
        assert!(!dir.path().join("topics.json.tmp").exists());
        std::fs::write(dir.path().join(TOPICS_FILE), "{ nope").unwrap();
        assert!(matches!(
            TopicTable::load(dir.path()),
            Err(CatalogError::Corrupt { .. })
        ));
    }

    #[test]
    fn missing_catalog_with_topic_dirs_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let part = TopicTable::partition_dir(dir.path(), "t", 0);
        std::fs::create_dir_all(&part).unwrap();
        let err = TopicTable::load(dir.path()).unwrap_err();
        assert!(
            matches!(err, CatalogError::Missing { topics: 1, .. }),
            "{err}"
        );
        assert!(err.to_string().contains("--rebuild-catalog"), "{err}");
        // A partition directory without a superblock is not guessed at.
        let err = TopicTable::rebuild(dir.path()).unwrap_err();
        assert!(err.to_string().contains("superblock"), "{err}");
        assert!(part.is_dir());
        std::fs::remove_dir(&part).unwrap();
        assert!(TopicTable::rebuild(dir.path()).unwrap().topics.is_empty());
    }

    #[test]
    fn views_follow_publishes() {
        let c = Arc::new(Catalog::new(TopicTable::default()));
        let mut v = CatalogView::new(c.clone());
        assert!(v.get().topics.is_empty());
        c.publish(TopicTable {
            next_partition_id: 9,
            ..TopicTable::default()
        });
        assert_eq!(v.get().next_partition_id, 9);
    }
}
