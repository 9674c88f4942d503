//! Streaming verification of a log arriving in pieces (state transfer).
//!
//! Chunks split batches anywhere, so the verifier carries the unfinished
//! tail of one batch between pieces: memory is at most one batch, capped by
//! the largest batch this store accepts.

use ringlog_protocol::{BatchHeader, BatchView, HEADER_LEN};

use crate::segment::SparseIndex;

pub(super) struct LogVerifier {
    partition_id: u32,
    base_offset: u64,
    next_offset: u64,
    /// Header checksum of the last batch (None: the chain starts here).
    last_checksum: Option<u64>,
    /// Bytes of whole batches consumed.
    position: u64,
    /// The start of a batch whose end has not arrived yet.
    carry: Vec<u8>,
    batch_bytes_max: usize,
    index: SparseIndex,
    index_interval_bytes: u32,
}

impl LogVerifier {
    pub(super) fn new(
        partition_id: u32,
        base_offset: u64,
        prev_checksum: Option<u64>,
        batch_bytes_max: usize,
        index_interval_bytes: u32,
    ) -> Self {
        Self {
            partition_id,
            base_offset,
            next_offset: base_offset,
            last_checksum: prev_checksum,
            position: 0,
            carry: Vec::new(),
            batch_bytes_max,
            index: SparseIndex::default(),
            index_interval_bytes,
        }
    }

    /// Consumes the next bytes of the log; errors name the byte position.
    pub(super) fn feed(&mut self, mut bytes: &[u8]) -> Result<(), String> {
        while !bytes.is_empty() {
            if !self.carry.is_empty() {
                let target = if self.carry.len() < HEADER_LEN {
                    HEADER_LEN
                } else {
                    self.batch_len(&self.carry)?
                };
                let take = (target - self.carry.len()).min(bytes.len());
                // One allocation for the whole batch, kept for the next
                // (bounded by batch_bytes_max): no regrowth per batch.
                self.carry.reserve(target - self.carry.len());
                self.carry.extend_from_slice(&bytes[..take]);
                bytes = &bytes[take..];
                if self.carry.len() == target && target > HEADER_LEN {
                    let batch = std::mem::take(&mut self.carry);
                    let accepted = self.accept(&batch);
                    self.carry = batch;
                    self.carry.clear();
                    accepted?;
                }
                continue;
            }
            if bytes.len() < HEADER_LEN {
                self.carry.extend_from_slice(bytes);
                return Ok(());
            }
            let len = self.batch_len(bytes)?;
            if bytes.len() < len {
                self.carry.reserve(len);
                self.carry.extend_from_slice(bytes);
                return Ok(());
            }
            self.accept(&bytes[..len])?;
            bytes = &bytes[len..];
        }
        Ok(())
    }

    /// Checks that the log ended exactly where it should; returns the index
    /// and the last batch's checksum.
    pub(super) fn finish(
        self,
        length_bytes: u64,
        end_offset: u64,
    ) -> Result<(SparseIndex, Option<u64>), String> {
        if !self.carry.is_empty() || self.position != length_bytes {
            return Err(format!(
                "log ends mid-batch or early: {} whole-batch bytes of {length_bytes}",
                self.position
            ));
        }
        if self.next_offset != end_offset {
            return Err(format!(
                "log ends at offset {}, expected {end_offset}",
                self.next_offset
            ));
        }
        Ok((self.index, self.last_checksum))
    }

    fn batch_len(&self, header: &[u8]) -> Result<usize, String> {
        let h = BatchHeader::decode(header).map_err(|e| self.at(e))?;
        let len = h.total_len();
        if len > self.batch_bytes_max {
            return Err(self.at(format!(
                "batch of {len} bytes over the cap {}",
                self.batch_bytes_max
            )));
        }
        Ok(len)
    }

    fn accept(&mut self, bytes: &[u8]) -> Result<(), String> {
        let view = BatchView::parse(bytes).map_err(|e| self.at(e))?;
        let h = view.header();
        if h.partition_id != self.partition_id || h.base_offset != self.next_offset {
            return Err(self.at(format!(
                "batch of partition {} at offset {} where {} was due",
                h.partition_id, h.base_offset, self.next_offset
            )));
        }
        if self.last_checksum.is_some_and(|c| c != h.prev_checksum) {
            return Err(self.at("hash chain broken"));
        }
        self.index.observe(
            (h.base_offset - self.base_offset) as u32,
            self.position as u32,
            h.max_timestamp_ms,
            self.index_interval_bytes,
        );
        self.position += bytes.len() as u64;
        self.next_offset = h.next_offset();
        self.last_checksum = Some(h.header_checksum);
        Ok(())
    }

    fn at(&self, e: impl std::fmt::Display) -> String {
        format!("at byte {}: {e}", self.position)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use ringlog_protocol::{BatchBuilder, Record, Stamp};

    fn log(batches: u64) -> Vec<u8> {
        let mut out = Vec::new();
        let mut prev = 0;
        for i in 0..batches {
            let mut b = BatchBuilder::new(1);
            let value = vec![i as u8; 100 + (i as usize * 37) % 500];
            b.push(&Record {
                key: b"k",
                headers: &[],
                value: &value,
                timestamp_ms: i,
            })
            .unwrap();
            let bytes = b
                .finish(&Stamp {
                    base_offset: 10 + i,
                    vsr_op: i,
                    vsr_view: 0,
                    prev_checksum: prev,
                })
                .unwrap();
            prev = BatchHeader::decode(&bytes).unwrap().header_checksum;
            out.extend_from_slice(&bytes);
        }
        out
    }

    #[test]
    fn any_split_verifies_and_damage_is_caught() {
        let bytes = log(20);
        for piece in [1usize, 7, 96, 97, 500, 4096, bytes.len()] {
            let mut v = LogVerifier::new(1, 10, None, 1 << 20, 256);
            for p in bytes.chunks(piece) {
                v.feed(p).unwrap();
            }
            let (index, last) = v.finish(bytes.len() as u64, 30).unwrap();
            assert!(!index.entries().is_empty());
            assert!(last.is_some());
        }
        let mut bad = bytes.clone();
        bad[700] ^= 1;
        let mut v = LogVerifier::new(1, 10, None, 1 << 20, 256);
        let fed = bad.chunks(333).try_for_each(|p| v.feed(p));
        assert!(fed.is_err());
        // A log cut short does not finish.
        let mut v = LogVerifier::new(1, 10, None, 1 << 20, 256);
        v.feed(&bytes[..bytes.len() - 5]).unwrap();
        assert!(v.finish(bytes.len() as u64, 30).is_err());
        // Batches over the cap are refused before they are buffered.
        let mut v = LogVerifier::new(1, 10, None, 200, 256);
        assert!(v.feed(&bytes).is_err());
    }
}
