//! Consumer groups as the server sees them (`ctl consumers`, the lag
//! metric). Clients commit a group's position as an ordinary record in the
//! topic [`OFFSETS_TOPIC`] (key [`commit_key`], value the next offset to
//! read, decimal); the newest record per key wins. The server reads that
//! topic on demand, keeping what it has read (so each request reads only
//! the commits made since the last one), and sets each position against
//! its partition's end.

use std::collections::BTreeMap;
use std::sync::Mutex;

use ringlog_protocol::wire::ErrorCode;
use ringlog_protocol::BatchView;
use serde::Serialize;

use super::commands::{ask_within, Patience};
use crate::catalog::{Catalog, TopicState};
use crate::mailbox::MailboxTx;
use crate::ops::{Op, OpReply, PartitionStatus};
use crate::placement::shard_for;

/// The topic holding the commits (one partition: one total order).
pub const OFFSETS_TOPIC: &str = "__consumer_offsets";
/// Most distinct (group, topic, partition) keys the table holds: bounds its
/// memory (a key is at most a few hundred bytes). Past it a request fails
/// with an error naming the bound.
pub const KEYS_MAX: usize = 65_536;
/// Bytes per fetch while reading the commits.
const FETCH_BYTES: u32 = 1 << 20;

/// (group, topic, partition).
pub type GroupKey = (String, String, u32);

/// The record key of a commit of `group` on `topic`/`partition`.
pub fn commit_key(group: &str, topic: &str, partition: u32) -> Vec<u8> {
    format!("{group}\0{topic}\0{partition}").into_bytes()
}

/// A commit record's (key, next offset); None if it is not one.
pub fn parse_commit(key: &[u8], value: &[u8]) -> Option<(GroupKey, u64)> {
    let text = std::str::from_utf8(key).ok()?;
    let mut parts = text.split('\0');
    let (g, t, p) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    let offset = std::str::from_utf8(value).ok()?.parse().ok()?;
    Some(((g.to_string(), t.to_string(), p.parse().ok()?), offset))
}

/// One group's position on one partition.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ConsumerRow {
    pub group: String,
    pub topic: String,
    pub partition: u32,
    /// The next offset the group will read.
    pub committed: u64,
    /// The partition's first stored offset; None if it no longer exists.
    pub log_start: Option<u64>,
    /// The partition's durable end (next offset to be written).
    pub end: Option<u64>,
    /// `end - committed`, 0 when committed is past the end.
    pub lag: Option<u64>,
    /// The committed offset is outside `log_start..=end` (purged, retention,
    /// a recreated topic): the consumer's `--reset` policy decides.
    pub out_of_range: bool,
}

/// The commits read so far from the offsets topic's partition.
#[derive(Debug, Default)]
struct Cache {
    partition_id: Option<u32>,
    next_offset: u64,
    committed: BTreeMap<GroupKey, u64>,
}

impl Cache {
    /// Takes in fetched (offset, key, value) records (those below
    /// `next_offset` were read before); refuses a new key past `keys_max`.
    fn absorb<'a>(
        &mut self,
        records: impl IntoIterator<Item = (u64, &'a [u8], &'a [u8])>,
        keys_max: usize,
    ) -> Result<(), String> {
        for (at, key, value) in records {
            if at < self.next_offset {
                continue;
            }
            let Some((key, offset)) = parse_commit(key, value) else {
                continue;
            };
            if self.committed.len() >= keys_max && !self.committed.contains_key(&key) {
                return Err(format!(
                    "{OFFSETS_TOPIC} holds more than {keys_max} (group, topic, partition) keys"
                ));
            }
            self.committed.insert(key, offset);
        }
        Ok(())
    }
}

/// The server's view of the commits.
#[derive(Debug)]
pub struct ConsumerTable {
    cache: Mutex<Cache>,
    keys_max: usize,
}

impl Default for ConsumerTable {
    fn default() -> Self {
        ConsumerTable {
            cache: Mutex::new(Cache::default()),
            keys_max: KEYS_MAX,
        }
    }
}

fn describe(
    peers: &[MailboxTx],
    shard: usize,
    ids: Option<Vec<u32>>,
    patience: &Patience,
) -> Result<Vec<PartitionStatus>, String> {
    let op = Op::Describe { partition_ids: ids };
    match ask_within(peers, shard, op, patience).map_err(|e| e.to_string())? {
        OpReply::Partitions(list) => Ok(list),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

impl ConsumerTable {
    /// Every committed position (only `group`'s, if given) with its lag,
    /// as a control command (waiting its turn and on full mailboxes).
    pub(super) fn rows(
        &self,
        catalog: &Catalog,
        peers: &[MailboxTx],
        group: Option<&str>,
    ) -> Result<Vec<ConsumerRow>, String> {
        let committed = self.committed(catalog, peers, &Patience::command(), true)?;
        if committed.is_empty() {
            return Ok(Vec::new());
        }
        let mut ends = BTreeMap::new();
        for shard in 0..peers.len() {
            for p in describe(peers, shard, None, &Patience::command())? {
                ends.insert((p.topic, p.partition), (p.log_start_offset, p.commit));
            }
        }
        let rows = committed
            .into_iter()
            .filter(|((g, _, _), _)| group.is_none_or(|want| want == g))
            .map(|((group, topic, partition), committed)| {
                let range = ends.get(&(topic.clone(), partition)).copied();
                ConsumerRow {
                    out_of_range: range.is_some_and(|(s, e)| !(s..=e).contains(&committed)),
                    log_start: range.map(|r| r.0),
                    end: range.map(|r| r.1),
                    lag: range.map(|r| r.1.saturating_sub(committed)),
                    group,
                    topic,
                    partition,
                    committed,
                }
            })
            .collect();
        Ok(rows)
    }

    /// Reads the commits made since the last call, as `patience` allows
    /// (what is read before it runs out is kept: the next call goes on from
    /// there); returns all of them. Without `wait_turn`, a read already in
    /// progress (a slow `ctl consumers`) makes this fail at once rather
    /// than wait for it.
    pub(super) fn committed(
        &self,
        catalog: &Catalog,
        peers: &[MailboxTx],
        patience: &Patience,
        wait_turn: bool,
    ) -> Result<BTreeMap<GroupKey, u64>, String> {
        let mut cache = match self.cache.try_lock() {
            Ok(c) => c,
            Err(std::sync::TryLockError::Poisoned(p)) => p.into_inner(),
            Err(std::sync::TryLockError::WouldBlock) if wait_turn => match self.cache.lock() {
                Ok(c) => c,
                Err(poisoned) => poisoned.into_inner(),
            },
            Err(std::sync::TryLockError::WouldBlock) => {
                return Err(format!("{OFFSETS_TOPIC} is being read by another request"))
            }
        };
        let table = catalog.snapshot();
        let Some(meta) = table
            .topics
            .get(OFFSETS_TOPIC)
            .filter(|m| m.state == TopicState::Ready)
        else {
            *cache = Cache::default();
            return Ok(BTreeMap::new());
        };
        let id = meta.first_partition_id;
        let owner = shard_for(OFFSETS_TOPIC, 0, peers.len());
        let status = describe(peers, owner, Some(vec![id]), patience)?;
        let Some(status) = status.first() else {
            return Err(format!("{OFFSETS_TOPIC}/0 is not open on shard {owner}"));
        };
        // A recreated or purged offsets topic: what was read is gone.
        if cache.partition_id != Some(id)
            || cache.next_offset < status.log_start_offset
            || cache.next_offset > status.commit
        {
            *cache = Cache {
                partition_id: Some(id),
                next_offset: status.log_start_offset,
                committed: BTreeMap::new(),
            };
        }
        while cache.next_offset < status.commit {
            let op = Op::Fetch {
                partition_id: id,
                offset: cache.next_offset,
                max_bytes: FETCH_BYTES,
                wait_ms: 0,
            };
            let page = match ask_within(peers, owner, op, patience) {
                Ok(OpReply::Fetched(page)) => page,
                Ok(other) => return Err(format!("unexpected reply {other:?}")),
                Err(e) if e.code == ErrorCode::OffsetOutOfRange => {
                    // Purged while we read: start over next time.
                    *cache = Cache::default();
                    return Err(format!("{OFFSETS_TOPIC} changed while read: {e}"));
                }
                Err(e) => return Err(e.to_string()),
            };
            let mut rest = page.batches.as_slice();
            while !rest.is_empty() {
                let view = BatchView::parse(rest)
                    .map_err(|e| format!("{OFFSETS_TOPIC}/0 at {}: {e}", cache.next_offset))?;
                cache.absorb(
                    view.records().map(|r| (r.offset, r.key, r.value)),
                    self.keys_max,
                )?;
                rest = &rest[view.as_bytes().len()..];
            }
            if page.next_offset <= cache.next_offset {
                return Err(format!(
                    "{OFFSETS_TOPIC}/0: a fetch at {} made no progress",
                    cache.next_offset
                ));
            }
            cache.next_offset = page.next_offset;
        }
        Ok(cache.committed.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record<'a>(offset: u64, key: &'a [u8], value: &'a str) -> (u64, &'a [u8], &'a [u8]) {
        (offset, key, value.as_bytes())
    }

    #[test]
    fn keys_round_trip_and_junk_is_not_a_commit() {
        let k = commit_key("g/1", "t.x", 7);
        assert_eq!(
            parse_commit(&k, b"42"),
            Some((("g/1".into(), "t.x".into(), 7), 42))
        );
        assert_eq!(parse_commit(b"no separators", b"1"), None);
        assert_eq!(parse_commit(&k, b"x"), None);
        assert_eq!(parse_commit(b"a\0b\0c\0d", b"1"), None);
    }

    #[test]
    fn newest_commit_wins_and_the_key_bound_is_enforced() {
        let mut cache = Cache {
            next_offset: 1,
            ..Cache::default()
        };
        let a = commit_key("g", "t", 0);
        let b = commit_key("g", "t", 1);
        let records = [
            record(0, &a, "99"), // read before: skipped
            record(1, &a, "3"),
            record(2, b"junk", "1"),
            record(3, &b, "5"),
            record(4, &a, "4"),
        ];
        cache.absorb(records, 2).unwrap();
        let want: BTreeMap<GroupKey, u64> = [
            (("g".into(), "t".into(), 0), 4),
            (("g".into(), "t".into(), 1), 5),
        ]
        .into();
        assert_eq!(cache.committed, want);
        // A known key still updates at the bound; a third one is refused.
        cache.next_offset = 5;
        cache.absorb([record(5, &b, "6")], 2).unwrap();
        let h = commit_key("h", "t", 0);
        let err = cache.absorb([record(6, &h, "1")], 2).unwrap_err();
        assert!(err.contains("more than 2"), "{err}");
        assert_eq!(cache.committed.len(), 2);
    }
}
