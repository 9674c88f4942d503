//! Topic metadata: names, partition counts and stable partition ids.
//!
//! Durable as `<data_dir>/topics.json`, replaced atomically: write
//! `topics.json.tmp`, fdatasync it, rename it over `topics.json`, fsync the
//! directory. A topic is first written as `creating`, its partitions are
//! created on their shards, then it is rewritten as `ready`; on boot a
//! `creating` topic's missing partitions are created, while a `ready`
//! topic's missing partition is a fault (reported, never silently recreated).
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
}

#[derive(Debug, Error)]
pub enum CatalogError {
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path} is corrupt: {message}")]
    Corrupt { path: PathBuf, message: String },
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

    /// Loads `topics.json` from `data_dir`; a missing file is an empty table.
    pub fn load(data_dir: &Path) -> Result<TopicTable, CatalogError> {
        let path = data_dir.join(TOPICS_FILE);
        let text = match std::fs::read_to_string(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Ok(TopicTable {
                    format: Self::FORMAT,
                    ..TopicTable::default()
                })
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

    /// Directory of one partition.
    pub fn partition_dir(data_dir: &Path, topic: &str, index: u32) -> PathBuf {
        data_dir
            .join(TOPICS_DIR)
            .join(topic)
            .join(index.to_string())
    }
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
