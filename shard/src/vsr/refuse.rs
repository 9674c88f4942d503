//! A cluster of one takes back an append its store refused without
//! accepting anything (the disk is full): the op leaves the log, and the
//! host answers its client with the store's own error, as a server without
//! replication did. Fencing would turn a retryable condition into a
//! fail-stop one.
//!
//! Only a cluster of one can do this: nobody else saw the op (no Prepare
//! left), and it is the log's last op, not committed. With peers, a refused
//! append fences as every failed write does.

use super::replica::Replica;
use super::types::{Event, IoId, Outbox, Status, Token};

impl Replica {
    /// The store refused `Append { op }` (I/O `id`) and changed nothing:
    /// forgets the op, its pending flush and its acks, and returns the
    /// token of the client waiting on it (the host replies). Appends queued
    /// behind a full pipeline stay queued: the ops below still in flight
    /// commit and make room. Anything else (peers, not the last op, already
    /// committed) fences.
    pub fn refuse_append(&mut self, id: IoId, op: u64, out: &mut Outbox) -> Option<Token> {
        let undoable = self.cfg.replica_count == 1
            && self.status == Status::Normal
            && op == self.log.op()
            && op > self.commit
            && self.appends.remove(&id);
        if !undoable {
            self.fence(format!("append of op {op} refused by the store"), out);
            return None;
        }
        self.log.truncate_above(op - 1);
        self.acks.remove(&op);
        self.flushes.retain(|_, covered| *covered < op);
        let token = self.waiting.remove(&op);
        out.event(Event::Dropped {
            what: "append",
            reason: "refused by the store",
        });
        self.assert_invariants();
        token
    }
}

#[cfg(test)]
mod tests {
    use ringlog_protocol::{BatchBuilder, Record, Stamp};

    use super::super::types::{AppendError, Input, IoOutcome, Output, StorageOp};
    use super::super::Config;
    use super::*;

    const PARTITION: u32 = 3;

    fn batch(tag: u8) -> Vec<u8> {
        let mut b = BatchBuilder::new(PARTITION);
        let value = [tag; 16];
        let record = Record {
            key: &[tag],
            headers: &[],
            value: &value,
            timestamp_ms: 1_000,
        };
        b.push(&record).expect("record fits");
        b.finish(&Stamp::default()).expect("batch seals")
    }

    /// Appends `tag`; returns the Append's id and op and the Flush's id.
    fn append(r: &mut Replica, token: Token, tag: u8) -> (IoId, u64, IoId) {
        let mut out = Outbox::new();
        let batch = batch(tag);
        r.step(
            Input::ClientAppend {
                token,
                batch: batch.into(),
            },
            &mut out,
        );
        let ios: Vec<(IoId, StorageOp)> = out
            .drain()
            .filter_map(|o| match o {
                Output::Io { id, op } => Some((id, op)),
                _ => None,
            })
            .collect();
        match &ios[..] {
            [(a, StorageOp::Append { op, .. }), (f, StorageOp::Flush)] => (*a, *op, *f),
            other => panic!("expected an append and a flush, got {other:?}"),
        }
    }

    /// Guards against: a full disk fencing a cluster of one (fail-stop for
    /// a retryable condition), or a refused op staying in its log (the
    /// next append would link to bytes the store never took).
    #[test]
    fn a_lone_replica_takes_back_a_refused_append_and_goes_on() {
        let mut r = Replica::new(Config::new(PARTITION, 1, 0), 1).expect("config");
        let (a1, op1, f1) = append(&mut r, 1, 1);
        let mut out = Outbox::new();
        let done = Ok(IoOutcome::Done);
        r.step(
            Input::IoDone {
                id: a1,
                result: done,
            },
            &mut out,
        );
        let (a2, op2, _) = append(&mut r, 2, 2);
        assert_eq!((op1, op2), (1, 2));
        assert_eq!(r.refuse_append(a2, op2, &mut out), Some(2));
        assert_eq!(r.op(), 1, "op 2 left the log");
        assert_eq!(r.status(), Status::Normal, "not fenced");
        // Op 1 commits on its flush; the next append is op 2 again.
        let done = Ok(IoOutcome::Done);
        r.step(
            Input::IoDone {
                id: f1,
                result: done,
            },
            &mut out,
        );
        let replies: Vec<_> = out
            .drain()
            .filter_map(|o| match o {
                Output::Reply { token, result } => Some((token, result)),
                _ => None,
            })
            .collect();
        assert_eq!(replies.len(), 1);
        assert_eq!(replies[0].0, 1);
        assert_eq!(r.commit(), 1);
        let (_, op, _) = append(&mut r, 3, 3);
        assert_eq!(op, 2);
    }

    /// Guards against: taking back an op others may hold (peers) or one
    /// below the log's head: that fences instead.
    #[test]
    fn a_refusal_that_cannot_be_undone_fences() {
        let mut r = Replica::new(Config::new(PARTITION, 1, 0), 1).expect("config");
        let (a1, op1, _) = append(&mut r, 1, 1);
        append(&mut r, 2, 2);
        let mut out = Outbox::new();
        assert_eq!(r.refuse_append(a1, op1, &mut out), None, "not the last op");
        assert_eq!(r.status(), Status::Fenced);
        let fenced = out.drain().any(|o| {
            matches!(
                o,
                Output::Reply {
                    token: 1,
                    result: Err(AppendError::OutcomeUnknown { .. })
                }
            )
        });
        assert!(fenced, "its client is told");

        let mut r = Replica::new(Config::new(PARTITION, 3, 0), 1).expect("config");
        let mut out = Outbox::new();
        let batch = batch(1);
        r.step(
            Input::ClientAppend {
                token: 1,
                batch: batch.into(),
            },
            &mut out,
        );
        let append = out.drain().find_map(|o| match o {
            Output::Io {
                id,
                op: StorageOp::Append { op, .. },
            } => Some((id, op)),
            _ => None,
        });
        let (id, op) = append.expect("the primary appends");
        assert_eq!(r.refuse_append(id, op, &mut out), None, "peers saw it");
        assert_eq!(r.status(), Status::Fenced);
    }
}
