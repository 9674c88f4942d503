//! Batches the sim holds between submission and completion.

use std::io;

use crate::io::{BatchId, Completion, Op, Sqe};

/// One submitted batch while its ops run, chain by chain.
#[derive(Debug)]
pub(super) struct Running {
    pub id: BatchId,
    ops: Vec<Op>,
    results: Vec<Option<io::Result<usize>>>,
    /// Link chains with ops left to run: their members (indices into `ops`,
    /// in order) and how many of them ran.
    chains: Vec<(Vec<usize>, usize)>,
}

impl Running {
    pub fn new(id: BatchId, batch: Vec<Sqe>) -> Self {
        let mut ops = Vec::with_capacity(batch.len());
        let mut chains = Vec::new();
        let mut chain = Vec::new();
        let last = batch.len().saturating_sub(1);
        for (i, Sqe { op, link_next }) in batch.into_iter().enumerate() {
            ops.push(op);
            chain.push(i);
            // A link on the last op links to nothing, as on the kernel.
            if !link_next || i == last {
                chains.push((std::mem::take(&mut chain), 0));
            }
        }
        let results = ops.iter().map(|_| None).collect();
        Self {
            id,
            ops,
            results,
            chains,
        }
    }

    /// Chains with an op ready to run (each chain's next op is).
    pub fn ready(&self) -> usize {
        self.chains.len()
    }

    pub fn is_done(&self) -> bool {
        self.chains.is_empty()
    }

    /// The next op of ready chain `chain`.
    pub fn next_op(&mut self, chain: usize) -> &mut Op {
        let (members, ran) = &self.chains[chain];
        &mut self.ops[members[*ran]]
    }

    /// Records the result of the op [`Running::next_op`] gave out. A failed
    /// read or write cancels the rest of its chain (ECANCELED), as the
    /// kernel does; a failed fsync, rename, unlink or rmdir does not.
    pub fn finish(&mut self, chain: usize, result: io::Result<usize>) {
        let (members, ran) = &mut self.chains[chain];
        let i = members[*ran];
        *ran += 1;
        let cancels = result.is_err() && matches!(self.ops[i], Op::Read { .. } | Op::Write { .. });
        self.results[i] = Some(result);
        if cancels {
            for &j in &members[*ran..] {
                self.results[j] = Some(Err(io::Error::from_raw_os_error(libc::ECANCELED)));
            }
            *ran = members.len();
        }
        if *ran == members.len() {
            self.chains.swap_remove(chain);
        }
    }

    pub fn into_completions(self) -> Vec<Completion> {
        debug_assert!(self.is_done());
        self.ops
            .into_iter()
            .zip(self.results)
            .map(|(op, result)| Completion {
                op,
                result: result.unwrap_or_else(|| Err(io::Error::other("sim: op never ran"))),
            })
            .collect()
    }
}
