//! Checks that a sequence of batch headers is one contiguous piece of a
//! partition's log (see "Runs" in the module docs).

use super::{Command, ReplicationError};
use crate::batch::BatchHeader;

/// Validates the run `headers` of `partition_id`, every view at most
/// `view_max`. Index 0 is checked against nothing before it.
pub(super) fn check_run<'h>(
    command: Command,
    partition_id: u32,
    view_max: u32,
    headers: impl IntoIterator<Item = &'h BatchHeader>,
) -> Result<(), ReplicationError> {
    let broken = |index: u32, reason| ReplicationError::BrokenRun {
        command,
        index,
        reason,
    };
    let mut prev: Option<&BatchHeader> = None;
    for (index, h) in (0u32..).zip(headers) {
        if h.partition_id != partition_id {
            return Err(broken(index, "belongs to another partition"));
        }
        if h.vsr_view > view_max {
            return Err(broken(index, "has a view above the message's"));
        }
        if h.vsr_op == 0 {
            return Err(broken(index, "has op 0, which is never prepared"));
        }
        if let Some(p) = prev {
            if Some(h.vsr_op) != p.vsr_op.checked_add(1) {
                return Err(broken(index, "does not follow the previous op"));
            }
            if h.prev_checksum != p.header_checksum {
                return Err(broken(index, "does not link to the previous checksum"));
            }
            if h.base_offset != p.next_offset() {
                return Err(broken(index, "does not start at the previous next offset"));
            }
            if h.vsr_view < p.vsr_view {
                return Err(broken(index, "has a view below the previous op's"));
            }
        }
        prev = Some(h);
    }
    Ok(())
}
