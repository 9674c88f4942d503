//! Committed consumer offsets (`consume --group`), kept on the server in an
//! ordinary topic: each commit is a produced record (key `group NUL topic
//! NUL partition`, value the next offset to read, decimal), durable like
//! any acknowledged produce; the newest record per key wins. Resuming reads
//! the whole offsets topic; the server reads it too, for `ctl consumers` and
//! the lag metric (`ringlog_shard::control::consumers`, which owns the
//! format).

use std::collections::BTreeMap;

use ringlog_protocol::wire::ErrorCode;
use ringlog_protocol::{BatchBuilder, Record, Stamp};
use ringlog_shard::client::{records, Client, ClientError};
use ringlog_shard::control::consumers::{commit_key, parse_commit, OFFSETS_TOPIC};
/// Bytes per fetch while loading the commits.
const LOAD_FETCH_BYTES: u32 = 1 << 20;

/// (group, topic, partition) -> next offset to read.
pub type Committed = BTreeMap<(String, String, u32), u64>;

/// What a committed offset outside the partition's current range becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Reset {
    /// The first offset still stored (after a purge or retention).
    Earliest,
    /// The end of the partition.
    Latest,
    /// Refuse to start.
    Error,
}

impl Reset {
    /// Where to resume from `committed` in a partition holding
    /// `log_start..end`.
    pub fn apply(
        self,
        committed: u64,
        log_start: u64,
        end: u64,
        what: &str,
    ) -> Result<u64, ClientError> {
        if (log_start..=end).contains(&committed) {
            return Ok(committed);
        }
        match self {
            Reset::Earliest => Ok(log_start),
            Reset::Latest => Ok(end),
            Reset::Error => Err(ClientError::Usage(format!(
                "{what}: committed offset {committed} is outside the stored range \
                 {log_start}..{end} (purged, retention, or a recreated topic); \
                 use --reset earliest or --reset latest"
            ))),
        }
    }
}

/// Creates the offsets topic if it does not exist yet.
pub fn ensure_topic(client: &mut Client) -> Result<(), ClientError> {
    match client.create_topic(OFFSETS_TOPIC, 1) {
        Err(e) if e.code() != Some(ErrorCode::TopicExists) => Err(e),
        _ => Ok(()),
    }
}

/// Every commit, newest per key; `group` keeps only that group's. An
/// absent offsets topic means nothing was committed.
pub fn load(client: &mut Client, group: Option<&str>) -> Result<Committed, ClientError> {
    let mut out = Committed::new();
    let mut offset = match client.describe_topic(OFFSETS_TOPIC) {
        Err(e) if e.code() == Some(ErrorCode::UnknownTopic) => return Ok(out),
        other => other?.partitions.first().map_or(0, |p| p.log_start_offset),
    };
    loop {
        let page = client.fetch(OFFSETS_TOPIC, 0, offset, LOAD_FETCH_BYTES, 0)?;
        for r in records(&page.batches)? {
            if r.offset < offset {
                continue;
            }
            let Some((k, v)) = parse_commit(&r.key, &r.value) else {
                continue;
            };
            if group.is_none_or(|g| g == k.0) {
                out.insert(k, v);
            }
        }
        offset = page.next_offset;
        if offset >= page.high_watermark {
            return Ok(out);
        }
    }
}

/// Commits `positions` (partition, next offset) of `group` on `topic` in
/// one batch; returns once it is durable.
pub fn commit(
    client: &mut Client,
    group: &str,
    topic: &str,
    positions: &[(u32, u64)],
) -> Result<(), ClientError> {
    if positions.is_empty() {
        return Ok(());
    }
    let keys: Vec<(Vec<u8>, Vec<u8>)> = positions
        .iter()
        .map(|(p, o)| (commit_key(group, topic, *p), o.to_string().into_bytes()))
        .collect();
    let now_ms = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    let mut b = BatchBuilder::new(0);
    for (k, v) in &keys {
        b.push(&Record {
            key: k,
            headers: &[],
            value: v,
            timestamp_ms: now_ms,
        })?;
    }
    client.produce(OFFSETS_TOPIC, 0, b.finish(&Stamp::default())?)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reset_applies_only_outside_the_range() {
        assert_eq!(Reset::Error.apply(5, 3, 9, "x").unwrap(), 5);
        assert_eq!(Reset::Earliest.apply(1, 3, 9, "x").unwrap(), 3);
        assert_eq!(Reset::Latest.apply(1, 3, 9, "x").unwrap(), 9);
        assert_eq!(Reset::Earliest.apply(12, 3, 9, "x").unwrap(), 3);
        let e = Reset::Error.apply(12, 3, 9, "t/0").unwrap_err();
        assert!(e.to_string().contains("--reset earliest"), "{e}");
    }
}
