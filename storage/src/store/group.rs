//! Group commit across the partitions of one shard.

use super::{PartitionStore, StoreError};
use crate::io::IoBackend;

/// Flushes every partition in one ring submission: one write plus one
/// fdatasync per partition with pending appends. Every partition's
/// completions are checked; the first error is returned after all of them
/// were processed (a failed partition is fenced, the others proceed).
pub fn flush_all(
    io: &mut impl IoBackend,
    stores: &mut [&mut PartitionStore],
) -> Result<(), StoreError> {
    let mut sqes = Vec::with_capacity(stores.len() * 2);
    let mut counts = Vec::with_capacity(stores.len());
    let mut first_error = None;
    for store in stores.iter_mut() {
        match store.prepare_flush(&mut sqes) {
            Ok(n) => counts.push(n),
            Err(e) => {
                counts.push(0);
                first_error.get_or_insert(e);
            }
        }
    }
    let mut completions = io.submit(sqes).into_iter();
    for (store, n) in stores.iter_mut().zip(counts) {
        if n == 0 {
            continue;
        }
        if let Err(e) = store.complete_flush(completions.by_ref().take(n)) {
            first_error.get_or_insert(e);
        }
    }
    first_error.map_or(Ok(()), Err)
}
