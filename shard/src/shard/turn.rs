//! The shard's turn: applying work to its partitions, group commit and
//! its completions, long-poll fetches. Pure over the storage backend: no
//! clock (the runtime loops in `shard.rs` pass the time in), no thread, no
//! monoio, no blocking filesystem call (file I/O goes through the ring);
//! tests/layering.rs checks this file for them.

use super::*;

impl<B: IoBackend> Shard<B> {
    /// Takes up to `group_commit_appends_max` work items (local queue first,
    /// then the mailbox) and applies them; then queues one flush per touched
    /// partition (without one in flight) as one ring submission, without
    /// waiting for it, and replies to everything but the produces, which are
    /// acknowledged once a completed flush covers them (see
    /// [`Shard::on_storage_completions`]). Returns how many items it took.
    pub(super) fn run_turn(&self, now: Instant) -> usize {
        let max = self.config.group_commit_appends_max;
        let mut works = Vec::new();
        {
            let mut q = self.queue.borrow_mut();
            while works.len() < max {
                let Some(w) = q.pop_front() else { break };
                works.push(w);
            }
        }
        while works.len() < max {
            let Some(env) = self.rx.try_recv() else {
                break;
            };
            let reply = match env.reply {
                ReplyTo::Shard { shard, token } => Responder::Remote { shard, token },
                ReplyTo::Thread(tx) => Responder::Thread(tx),
                ReplyTo::Nobody => Responder::Nobody,
            };
            works.push(Work { op: env.op, reply });
        }
        let taken = works.len();
        if taken == 0 {
            return 0;
        }
        let mut out = Applied::new(taken, now);
        {
            let mut core = self.core.borrow_mut();
            for work in works {
                self.apply(&mut core, work, &mut out);
            }
            self.commit(&mut core, &mut out);
        }
        for (reply, outcome) in out.replies {
            self.respond(reply, outcome);
        }
        taken
    }

    /// The partition whose flush in flight `op` must wait for, if it must:
    /// anything that would flush synchronously (purge, close, an append that
    /// overflows the write buffer or rolls the segment), and anything queued
    /// behind such an op, so a partition's ops keep their order. Fetches
    /// read durable data only and never wait. A peer message waits unless
    /// the partition can step it beside the flush
    /// ([`Partition::peer_message_beside_flush`]: Prepare, PrepareOk,
    /// Commit of normal operation): any other may make the replica append
    /// past the write buffer, cut its tail or persist its view, which the
    /// store runs as synchronous flushes. Holding those three too cost a
    /// replicated op a fdatasync at each replica (issue 11 item 7).
    pub(super) fn must_park(core: &Core<B>, op: &Op) -> Option<u32> {
        let pid = match op {
            Op::Produce { partition_id, .. }
            | Op::Purge { partition_id }
            | Op::PurgeTo { partition_id, .. }
            | Op::DropPartition { partition_id }
            | Op::PeerMessage { partition_id, .. } => *partition_id,
            _ => return None,
        };
        let p = core.partitions.get(&pid)?;
        // A spare in flight counts as a flush in flight: a roll then waits
        // to rename it into place, and a purge or close waits to release it.
        if !p.flush_in_flight() && !p.spare_in_flight() {
            return None;
        }
        let behind = core.lanes.get(&pid).is_some_and(|l| !l.parked.is_empty());
        let wait = behind
            || match op {
                Op::Produce { batch, .. } => p.append_must_wait(batch.as_ref().len()),
                Op::PeerMessage { payload, .. } => !p.peer_message_beside_flush(payload),
                _ => true,
            };
        wait.then_some(pid)
    }

    /// Applies one work item: replies go to `out.replies`, appends become
    /// pending acknowledgements of their partition's lane.
    pub(super) fn apply(&self, core: &mut Core<B>, work: Work, out: &mut Applied) {
        if let Some(pid) = Self::must_park(core, &work.op) {
            metrics::inc(&self.metrics.parked_total);
            core.lanes.entry(pid).or_default().parked.push_back(work);
            return;
        }
        let Work { op, reply } = work;
        let Core {
            io,
            pool,
            partitions,
            lanes,
            ticking,
            read_ahead_parked,
            installs,
            ..
        } = core;
        let Applied {
            replies,
            touched,
            now,
            now_ms,
        } = out;
        match op {
            Op::Produce {
                partition_id,
                batch,
            } => {
                let len = batch.as_ref().len() as u64;
                let Some(p) = partitions.get_mut(&partition_id) else {
                    let e = self.held_elsewhere(partition_id);
                    replies.push((
                        reply,
                        Err(e.unwrap_or_else(|| unknown_partition(partition_id))),
                    ));
                    return;
                };
                match p.produce(io, batch) {
                    Ok(token) => {
                        metrics::add(&self.metrics.append_bytes_total, len);
                        touch(touched, partition_id);
                        let lane = lanes.entry(partition_id).or_default();
                        lane.acks.insert(token, (reply, *now));
                    }
                    Err(e) => {
                        metrics::inc(&self.metrics.append_errors_total);
                        replies.push((reply, Err(e)));
                    }
                }
            }
            Op::Fetch {
                partition_id,
                offset,
                max_bytes,
                wait_ms,
            } => {
                let Some(p) = partitions.get_mut(&partition_id) else {
                    let e = self.held_elsewhere(partition_id);
                    replies.push((
                        reply,
                        Err(e.unwrap_or_else(|| unknown_partition(partition_id))),
                    ));
                    return;
                };
                let waits = wait_ms > 0 && p.high_watermark() == Some(offset);
                if waits {
                    let mut waiters = self.waiters.borrow_mut();
                    let list = waiters.entry(partition_id).or_default();
                    if list.len() < self.config.fetch_waiters_max {
                        list.push(Waiter {
                            offset,
                            max_bytes,
                            deadline: *now + Duration::from_millis(u64::from(wait_ms)),
                            reply,
                        });
                        return;
                    }
                }
                if p.read_ahead_pending(offset) {
                    // Its bytes are on their way: reading them again would
                    // cost a second device read; it runs once they land.
                    let list = read_ahead_parked.entry(partition_id).or_default();
                    if list.len() < self.config.fetch_waiters_max {
                        let op = Op::Fetch {
                            partition_id,
                            offset,
                            max_bytes,
                            wait_ms,
                        };
                        list.push(Work { op, reply });
                        return;
                    }
                }
                let buf = self.reply_buffer(max_bytes);
                let outcome = p.fetch(io, offset, max_bytes, buf).map(|f| {
                    metrics::inc(&self.metrics.fetches_total);
                    metrics::add(&self.metrics.fetch_bytes_total, f.batches.len() as u64);
                    metrics::set_read_cache(&self.metrics, &pool.read_cache_stats());
                    metrics::set_read_ahead(&self.metrics, &pool.read_ahead_stats());
                    OpReply::Fetched(f)
                });
                if outcome.is_err() && p.needs_tick() {
                    // A read that found a corrupt sealed segment: the
                    // next tick replaces the store (see Partition::tick).
                    ticking.insert(partition_id);
                }
                replies.push((reply, outcome));
            }
            Op::Purge { partition_id } => {
                let outcome = match partitions.get_mut(&partition_id) {
                    // The store's purge bypasses the replica: on one node
                    // alone it would fork the group's log.
                    Some(p) if p.is_replicated() => Err(OpError::new(
                        ErrorCode::PartitionUnavailable,
                        format!(
                            "partition {} of topic {:?} is replicated: its topic is purged \
                             whole, through the cluster metadata (ringlog ctl purge {})",
                            p.index, p.topic, p.topic
                        ),
                    )),
                    Some(p) => p.purge(io).map(|()| OpReply::Empty),
                    None => Err(unknown_partition(partition_id)),
                };
                // The purge flushed: pending acknowledgements may be due.
                touch(touched, partition_id);
                replies.push((reply, outcome));
            }
            Op::PurgeTo {
                partition_id,
                generation,
            } => {
                let outcome = match partitions.get_mut(&partition_id) {
                    Some(p) => p.purge_to(io, generation).map(|s| OpReply::Purge {
                        done: s == crate::partition::PurgeState::Done,
                    }),
                    None => Err(unknown_partition(partition_id)),
                };
                // It may have appended (the purge op) or answered a flush.
                touch(touched, partition_id);
                replies.push((reply, outcome));
            }
            Op::Describe { partition_ids } => {
                let mut list: Vec<_> = match partition_ids {
                    Some(ids) => ids
                        .iter()
                        .filter_map(|id| partitions.get(id))
                        .map(|p| p.status(self.id))
                        .collect(),
                    None => partitions.values().map(|p| p.status(self.id)).collect(),
                };
                list.sort_by(|a, b| (&a.topic, a.partition).cmp(&(&b.topic, b.partition)));
                replies.push((reply, Ok(OpReply::Partitions(list))));
            }
            Op::OpenPartition {
                topic,
                index,
                partition_id,
                create,
            } => {
                let outcome = match partitions.entry(partition_id) {
                    std::collections::hash_map::Entry::Occupied(_) => Ok(OpReply::Empty),
                    std::collections::hash_map::Entry::Vacant(slot) => {
                        let dir = TopicTable::partition_dir(&self.config.data_dir, &topic, index);
                        let replicas = self
                            .table()
                            .topics
                            .get(&topic)
                            .map_or(1, |m| m.replication_factor);
                        if !self.holds(partition_id, replicas) {
                            // Placed on other nodes: nothing to open here.
                            replies.push((reply, Ok(OpReply::Empty)));
                            return;
                        }
                        let p = match self.replication(&topic, index, partition_id, replicas) {
                            Ok(repl) => Partition::open_replicated(
                                io,
                                pool,
                                &dir,
                                &topic,
                                index,
                                partition_id,
                                self.config.store_config(),
                                create,
                                repl,
                            ),
                            Err(why) => {
                                Partition::unavailable(&dir, &topic, index, partition_id, why)
                            }
                        };
                        let fault = p.status(self.id).fault;
                        if p.needs_tick() {
                            ticking.insert(partition_id);
                        }
                        slot.insert(p);
                        match fault {
                            None => Ok(OpReply::Empty),
                            Some(f) => Err(OpError::new(ErrorCode::Storage, f)),
                        }
                    }
                };
                replies.push((reply, outcome));
            }
            Op::DropPartition { partition_id } => {
                pool.discard_journal_replay(partition_id);
                if let Some(mut p) = partitions.remove(&partition_id) {
                    // Produces the replica answered already (made durable
                    // by the flush this drop waited for) are answered so;
                    // `settle` fails the rest with UnknownPartition.
                    if let Some(lane) = lanes.get_mut(&partition_id) {
                        self.answer(lane, &mut p, replies, *now);
                    }
                    let dir = p.dir().to_path_buf();
                    if let Err(e) = p.close(io) {
                        tracing::warn!(partition_id, error = %e, "close before delete failed");
                    }
                    // Renamed away on the ring, removed by the trash's own
                    // thread: the name is free now, the shard never waits
                    // for a recursive removal.
                    let to = trash::entry_path(&self.config.data_dir, partition_id);
                    match trash::move_in(io, &dir, &to) {
                        Ok(()) => {
                            self.trash.poke();
                        }
                        Err(e) => {
                            tracing::warn!(dir = %dir.display(), error = %e, "moving a dropped partition into the trash; boot removes it");
                        }
                    }
                }
                // Appends still waiting for an acknowledgement get an error
                // (the lane is settled as touched), as do waiting fetches.
                touch(touched, partition_id);
                if let Some(ws) = self.waiters.borrow_mut().remove(&partition_id) {
                    for w in ws {
                        replies.push((w.reply, Err(unknown_partition(partition_id))));
                    }
                }
                replies.push((reply, Ok(OpReply::Empty)));
            }
            Op::PeerMessage {
                from,
                partition_id,
                payload,
            } if partition_id == META_PARTITION_ID && crate::meta_hosted::is_forward(&payload) => {
                // A command for the metadata primary: the controller
                // submits it (or drops it, and the forwarder retries).
                let mut q = self.meta_queue.borrow_mut();
                if self.meta_group.is_none() || q.len() >= META_QUEUE_MAX {
                    metrics::inc(&self.metrics.peer_drops_total);
                    return;
                }
                let payload = payload.into_vec();
                q.push_back((MetaOp::Forwarded { from, payload }, Responder::Nobody));
                self.meta.notify();
            }
            Op::PeerMessage {
                from,
                partition_id,
                payload,
            } => {
                let Some(p) = partitions.get_mut(&partition_id) else {
                    metrics::inc(&self.metrics.peer_drops_total);
                    return;
                };
                match p.deliver_payload(io, installs, *now_ms, from, payload) {
                    Ok(()) => {
                        metrics::inc(&self.metrics.peer_messages_total);
                        touch(touched, partition_id);
                    }
                    Err(e) => {
                        metrics::inc(&self.metrics.peer_drops_total);
                        tracing::warn!(partition_id, from, error = %e, "peer message dropped");
                    }
                }
            }
            Op::PeerSend {
                to,
                partition_id,
                payload,
            } => self.send_to_peer(to, partition_id, payload),
            Op::ShardStatus => {
                let st = ShardStatus {
                    shard: self.id,
                    core: self.core_id,
                    partitions: partitions.len(),
                    connections: self
                        .metrics
                        .connections_open
                        .load(std::sync::atomic::Ordering::Relaxed),
                    mailbox_depth: self.rx.len(),
                };
                replies.push((reply, Ok(OpReply::Shard(st))));
            }
            Op::Meta(m) => {
                let mut q = self.meta_queue.borrow_mut();
                if self.id != 0 {
                    replies.push((
                        reply,
                        Err(OpError::new(ErrorCode::Internal, "not the controller")),
                    ));
                } else if q.len() >= META_QUEUE_MAX {
                    replies.push((
                        reply,
                        Err(OpError::new(
                            ErrorCode::Backpressure,
                            "too many topic operations queued; retry",
                        )),
                    ));
                } else {
                    q.push_back((m, reply));
                    self.meta.notify();
                }
            }
        }
    }

    /// After applying work: queues one flush per touched partition that has
    /// none in flight, all in one ring submission that nobody waits for
    /// (group commit), then acknowledges whatever is durable already and
    /// answers long-poll fetches. With the journal, the small flushes of
    /// every partition share ONE journal write and ONE fdatasync in that
    /// submission (their segment writes go behind it); while a journal
    /// write is in flight, small flushes wait for the next one
    /// (`journal_waiting`), so turns are durable, and acknowledged, in
    /// order.
    pub(super) fn commit(&self, core: &mut Core<B>, out: &mut Applied) {
        if out.touched.is_empty() {
            return;
        }
        let mut sqes = Vec::new();
        let mut parts = Vec::new();
        for &pid in &out.touched {
            let Some(p) = core.partitions.get_mut(&pid) else {
                continue;
            };
            if p.needs_tick() {
                core.ticking.insert(pid);
            }
            if waits_for_journal(core.journal.as_ref(), p) {
                if !core.journal_waiting.contains(&pid) {
                    core.journal_waiting.push(pid);
                }
                continue;
            }
            let before = core.journal.as_ref().map_or(0, Journal::turn_records);
            let prepared = match core.journal.as_mut() {
                Some(j) => p.prepare_flush_journaled(&mut core.io, &mut sqes, j),
                None => p.prepare_flush(&mut core.io, &mut sqes),
            };
            match prepared {
                Ok(0) => {}
                Ok(n) => {
                    let after = core.journal.as_ref().map_or(0, Journal::turn_records);
                    parts.push((pid, n, after > before));
                }
                // Fenced: `settle` answers its appends with the cause.
                Err(e) => tracing::debug!(partition_id = pid, error = %e, "no flush"),
            }
        }
        let journal_entries = core
            .journal
            .as_mut()
            .map_or(0, |j| j.prepare_write(&mut sqes));
        if !parts.is_empty() {
            let direct = parts.iter().filter(|(_, _, journaled)| !journaled).count();
            let fsyncs = direct + usize::from(journal_entries > 0);
            let id = core.io.submit_nowait(sqes);
            metrics::add(&self.metrics.fsyncs_total, fsyncs as u64);
            core.flights.insert(
                id,
                Flight {
                    parts,
                    journal_entries,
                    started: out.now,
                },
            );
        }
        self.start_spares(core, &out.touched);
        self.send_replica_messages(core, &out.touched);
        let settled = self.settle(core, &out.touched, &mut out.replies, out.now);
        if settled > 0 {
            self.metrics.group_commit_appends.record(settled as u64);
        }
        self.serve_waiters(core, &out.touched, &mut out.replies);
    }

    /// Sends what the replicas of `pids` emitted (see `peer_route`).
    fn send_replica_messages(&self, core: &mut Core<B>, pids: &[u32]) {
        let mut sends = Vec::new();
        for pid in pids {
            let Some(p) = core.partitions.get_mut(pid) else {
                continue;
            };
            p.take_sends(&mut sends);
            for (to, payload) in sends.drain(..) {
                self.send_to_peer(to, *pid, payload);
            }
        }
    }

    /// Queues one replication message for node `to`: on the transport if
    /// this shard runs it, else through shard 0's mailbox. A full queue or
    /// mailbox drops it (counted; VSR retransmits).
    pub(super) fn send_to_peer(&self, to: u32, partition_id: u32, payload: Outgoing) {
        if let Some(t) = self.transport.borrow().as_ref() {
            if let Err(e) = t.send_outgoing(to, partition_id, payload) {
                metrics::inc(&self.metrics.peer_drops_total);
                tracing::debug!(to, partition_id, error = %e, "replication message not queued");
            }
            return;
        }
        if self.id == 0 {
            // Shard 0 without a transport: not a cluster, or it failed.
            metrics::inc(&self.metrics.peer_drops_total);
            return;
        }
        let env = Envelope {
            op: Op::PeerSend {
                to,
                partition_id,
                payload,
            },
            reply: ReplyTo::Nobody,
        };
        if let Some(Err(e)) = self.peers.first().map(|tx| tx.send(env)) {
            metrics::inc(&self.metrics.peer_drops_total);
            tracing::debug!(to, partition_id, error = ?e, "replication message dropped on the way to shard 0");
        }
    }

    /// Starts a journal checkpoint if one is due (the ring past half full,
    /// no journal write in flight, every partition with records replayed):
    /// first the fdatasyncs of the active segments with live records.
    fn start_checkpoint(&self, core: &mut Core<B>) {
        let Some(journal) = core.journal.as_mut() else {
            return;
        };
        if core.checkpoint.is_some()
            || !journal.checkpoint_due()
            || core.pool.journal_replay_pending()
        {
            return;
        }
        let pids = journal.begin_checkpoint();
        let mut sqes = Vec::with_capacity(pids.len());
        let mut synced = Vec::with_capacity(pids.len());
        for pid in pids {
            // A dropped partition's records are dead.
            let Some(p) = core.partitions.get(&pid) else {
                continue;
            };
            match p.segment_sync_sqe() {
                Some(sqe) => {
                    sqes.push(sqe);
                    synced.push(pid);
                }
                None => {
                    journal.abandon_checkpoint(format!("partition {pid} is fenced or unavailable"));
                    return;
                }
            }
        }
        let id = core.io.submit_nowait(sqes);
        metrics::add(&self.metrics.fsyncs_total, synced.len() as u64);
        core.checkpoint = Some((id, CheckpointStep::Segments(synced)));
    }

    /// Takes a checkpoint step's completions: after the segments, the
    /// header; after the header, the ring space is free.
    fn on_checkpoint(
        &self,
        core: &mut Core<B>,
        step: CheckpointStep,
        completions: Vec<Completion>,
    ) {
        let Some(journal) = core.journal.as_mut() else {
            return;
        };
        match step {
            CheckpointStep::Segments(pids) => {
                for (pid, c) in pids.iter().zip(&completions) {
                    if let Err(e) = &c.result {
                        if let Some(p) = core.partitions.get_mut(pid) {
                            p.fence_segment_sync(&e.to_string());
                        }
                        journal.abandon_checkpoint(format!(
                            "partition {pid}: segment fdatasync failed: {e}"
                        ));
                        return;
                    }
                }
                let mut sqes = Vec::with_capacity(2);
                journal.prepare_checkpoint_commit(&mut sqes);
                let id = core.io.submit_nowait(sqes);
                metrics::inc(&self.metrics.fsyncs_total);
                core.checkpoint = Some((id, CheckpointStep::Header));
            }
            CheckpointStep::Header => {
                if let Err(e) = journal.complete_checkpoint(completions) {
                    tracing::error!(shard = self.id, error = %e, "journal checkpoint failed");
                }
            }
        }
    }

    /// Answers the pending produces of `pids` the replicas replied to
    /// (acknowledged once the group commit made them durable, or refused);
    /// a removed partition fails the rest with UnknownPartition. Returns how
    /// many it acknowledged.
    pub(super) fn settle(
        &self,
        core: &mut Core<B>,
        pids: &[u32],
        replies: &mut Vec<(Responder, Outcome)>,
        now: Instant,
    ) -> usize {
        let mut acked = 0;
        for pid in pids {
            // Taken with or without a lane: a later produce is the new
            // replica's.
            let replaced = core
                .partitions
                .get_mut(pid)
                .is_some_and(Partition::take_replaced);
            let Some(lane) = core.lanes.get_mut(pid) else {
                continue;
            };
            let Some(p) = core.partitions.get_mut(pid) else {
                let lane = core.lanes.remove(pid).unwrap_or_default();
                for (reply, _) in lane.acks.into_values() {
                    metrics::inc(&self.metrics.append_errors_total);
                    replies.push((reply, Err(unknown_partition(*pid))));
                }
                for w in lane.parked {
                    replies.push((w.reply, Err(unknown_partition(*pid))));
                }
                continue;
            };
            acked += self.answer(lane, p, replies, now);
            if replaced {
                // The replica that would have answered them is gone.
                let e = OpError::new(
                    ErrorCode::PartitionUnavailable,
                    format!("outcome unknown: partition {pid}'s replica replaced its corrupt store with the append in flight"),
                );
                for (_, (reply, _)) in lane.acks.drain() {
                    metrics::inc(&self.metrics.append_errors_total);
                    replies.push((reply, Err(e.clone())));
                }
            }
            // Nothing in flight will answer them (cannot happen: every
            // append is followed by a flush, answered by the next group
            // commit); never leave a producer hanging.
            let waiting = core.journal_waiting.contains(pid);
            // A replicated partition's produces wait for a quorum, not
            // only for this flush: the replica answers each (committed, or
            // outcome unknown when it loses the view).
            let quorum = p.is_replicated();
            if !lane.acks.is_empty() && !p.flush_in_flight() && !waiting && !quorum {
                let e = OpError::new(ErrorCode::Storage, "append not durable");
                for (_, (reply, _)) in lane.acks.drain() {
                    metrics::inc(&self.metrics.append_errors_total);
                    replies.push((reply, Err(e.clone())));
                }
            }
            if lane.acks.is_empty() && lane.parked.is_empty() {
                core.lanes.remove(pid);
            }
        }
        acked
    }

    /// Answers the produces of `lane` that `p`'s replica replied to (at
    /// `now`, the turn's time). Returns how many it acknowledged.
    fn answer(
        &self,
        lane: &mut Lane,
        p: &mut Partition,
        replies: &mut Vec<(Responder, Outcome)>,
        now: Instant,
    ) -> usize {
        let (index, pid) = (p.index, p.id);
        let replicated = p.is_replicated();
        let mut acked = 0;
        // Recorded once the replies are taken (they borrow `p`).
        let mut latencies_us = Vec::new();
        for (token, result) in p.take_replies() {
            let Some((reply, appended)) = lane.acks.remove(&token) else {
                tracing::warn!(partition_id = pid, token, "reply to an unknown produce");
                continue;
            };
            let outcome = match result {
                Ok(app) => {
                    metrics::inc(&self.metrics.appends_total);
                    acked += 1;
                    if replicated {
                        let us = now.saturating_duration_since(appended).as_micros();
                        latencies_us.push(u64::try_from(us).unwrap_or(u64::MAX));
                    }
                    Ok(OpReply::Produced(ProduceReply {
                        partition: index,
                        base_offset: app.base_offset,
                        next_offset: app.next_offset,
                    }))
                }
                Err(e) => {
                    metrics::inc(&self.metrics.append_errors_total);
                    Err(e)
                }
            };
            replies.push((reply, outcome));
        }
        for us in latencies_us {
            p.record_commit_latency(us);
        }
        acked
    }

    /// Completes one group commit's flushes: the journal's write first (its
    /// entries come last in the submission), then each partition's, a
    /// journaled one with the journal's fdatasync as its own (so a failed
    /// one fences every partition it carried).
    fn complete_flight(
        &self,
        core: &mut Core<B>,
        flight: Flight,
        completions: Vec<Completion>,
        done: &mut Vec<u32>,
    ) {
        let mut completions = completions;
        let journal_done = match core.journal.as_mut() {
            Some(j) if flight.journal_entries > 0 => {
                let at = completions.len().saturating_sub(flight.journal_entries);
                let result = j.complete_write(completions.split_off(at));
                if let Err(e) = &result {
                    tracing::error!(shard = self.id, error = %e, "journal write failed");
                }
                Some(result)
            }
            _ => None,
        };
        let mut completions = completions.into_iter();
        for (pid, n, journaled) in flight.parts {
            let mut mine: Vec<Completion> = completions.by_ref().take(n).collect();
            if journaled {
                match (core.journal.as_ref(), &journal_done) {
                    (Some(j), Some(result)) => mine.push(j.durable_completion(result)),
                    _ => unreachable!("a journaled flush rides a journal write"),
                }
            }
            match core.partitions.get_mut(&pid) {
                Some(p) => {
                    if let Err(e) = p.complete_flush(&mut core.io, mine) {
                        tracing::error!(shard = self.id, partition_id = pid, error = %e, "flush failed");
                    }
                }
                None => tracing::error!(partition_id = pid, "flushed partition is gone"),
            }
            done.push(pid);
        }
    }

    /// Reaps finished group commits: completes each partition's flush (a
    /// failure fences it), runs the work parked behind those flushes, queues
    /// the next flush of partitions that took appends meanwhile, and
    /// acknowledges the appends that are durable now.
    pub(super) fn on_storage_completions(&self, now: Instant) {
        let mut out = Applied::new(0, now);
        {
            let mut core = self.core.borrow_mut();
            let core = &mut *core;
            let reaped = core.io.reap();
            if reaped.is_empty() {
                return;
            }
            let mut done: Vec<u32> = Vec::new();
            let mut read_aheads = 0usize;
            let mut transfers: BTreeMap<u32, crate::transfer::io::Reaped> = BTreeMap::new();
            for (id, completions) in reaped {
                if let Some(pid) = core.installs.owner(id) {
                    transfers.entry(pid).or_default().push((id, completions));
                    continue;
                }
                if let Some((pid, ahead)) = core.spares.remove(&id) {
                    self.on_ahead(core, pid, ahead, completions);
                    // Work parked behind the spare runs (or parks again).
                    done.push(pid);
                    continue;
                }
                let Some(completions) = core.pool.complete_read_ahead(id, completions) else {
                    read_aheads += 1;
                    continue;
                };
                if core.checkpoint.as_ref().is_some_and(|(cp, _)| *cp == id) {
                    if let Some((_, step)) = core.checkpoint.take() {
                        self.on_checkpoint(core, step, completions);
                    }
                    continue;
                }
                let Some(flight) = core.flights.remove(&id) else {
                    tracing::warn!(shard = self.id, batch = ?id, "completion of an unknown flush");
                    continue;
                };
                let elapsed_us = now.saturating_duration_since(flight.started).as_micros() as u64;
                self.metrics.fsync_latency_us.record(elapsed_us);
                self.complete_flight(core, flight, completions, &mut done);
            }
            // Transfer I/O after the flushes it may have waited for: an
            // install's commit runs only with none in flight.
            for (pid, batches) in transfers {
                self.on_transfer_io(core, pid, batches, &mut out);
            }
            // The next journal write may go: what waited for it flushes now
            // (after a checkpoint started at the head, if one is due).
            if core.journal.as_ref().is_some_and(|j| !j.writing()) {
                self.start_checkpoint(core);
                // A fenced journal takes nothing: these flush directly.
                done.append(&mut core.journal_waiting);
            }
            for &pid in &done {
                out.touch(pid);
            }
            // Work parked behind these flushes: nothing is in flight for
            // these partitions now, so all of it runs.
            for pid in done {
                let parked = core
                    .lanes
                    .get_mut(&pid)
                    .map(|l| std::mem::take(&mut l.parked))
                    .unwrap_or_default();
                for work in parked {
                    self.apply(core, work, &mut out);
                }
            }
            if read_aheads > 0 {
                // Fetches that waited for a read-ahead run now (those whose
                // read is still in flight park again).
                for (_, works) in std::mem::take(&mut core.read_ahead_parked) {
                    for work in works {
                        self.apply(core, work, &mut out);
                    }
                }
            }
            self.commit(core, &mut out);
        }
        for (reply, outcome) in out.replies {
            self.respond(reply, outcome);
        }
        self.flushed.notify();
    }

    /// Hands reaped transfer batches back to the partition whose pipeline
    /// started them (a partition gone meanwhile: dropped, forgotten); its
    /// sends go out and its flush, if any, with this turn's commit.
    fn on_transfer_io(
        &self,
        core: &mut Core<B>,
        pid: u32,
        batches: crate::transfer::io::Reaped,
        out: &mut Applied,
    ) {
        let Some(p) = core.partitions.get_mut(&pid) else {
            for reaped in batches {
                core.installs.forget(&mut core.io, reaped);
            }
            return;
        };
        p.transfer_reaped(&mut core.io, &mut core.installs, out.now_ms, batches);
        out.touch(pid);
    }

    /// A buffer for a fetch reply of up to `max_bytes`, from the server's
    /// pool (the connection sending the reply gives it back).
    fn reply_buffer(&self, max_bytes: u32) -> Vec<u8> {
        let (buf, fresh) = self.reply_pool.take(max_bytes as usize);
        if fresh {
            metrics::inc(&self.metrics.reply_buffers_allocated_total);
        }
        buf
    }

    /// Starts the background work of every touched partition that is due
    /// some, one batch of each kind each, without waiting: its next segment
    /// once the active one is half full (the roll then only renames it into
    /// place), and the active segment's next reservation step before the
    /// appends reach the reserved end.
    fn start_spares(&self, core: &mut Core<B>, touched: &[u32]) {
        for &pid in touched {
            let Some(p) = core.partitions.get_mut(&pid) else {
                continue;
            };
            let batches = [
                (Ahead::Spare, p.prepare_spare()),
                (Ahead::Reserve, p.prepare_reserve_ahead()),
            ];
            for (ahead, sqes) in batches {
                let Some(sqes) = sqes else { continue };
                debug_assert!(!core.spares.values().any(|&k| k == (pid, ahead)));
                let id = core.io.submit_nowait(sqes);
                core.spares.insert(id, (pid, ahead));
            }
        }
    }

    /// A background batch finished: a spare's next step goes out, or it is
    /// ready (or dropped, logged); a reservation applies (or is dropped,
    /// logged). A partition gone meanwhile gets nothing: the files the
    /// batch opened are closed (garbage for the next open).
    fn on_ahead(&self, core: &mut Core<B>, pid: u32, ahead: Ahead, completions: Vec<Completion>) {
        let Some(p) = core.partitions.get_mut(&pid) else {
            crate::partition::close_opened(&mut core.io, completions);
            return;
        };
        let next = match ahead {
            Ahead::Spare => p.complete_spare(&mut core.io, completions),
            Ahead::Reserve => {
                p.complete_reserve_ahead(completions);
                None
            }
        };
        if let Some(sqes) = next {
            let id = core.io.submit_nowait(sqes);
            core.spares.insert(id, (pid, ahead));
        }
    }

    /// Answers long-poll fetches whose data became durable.
    pub(super) fn serve_waiters(
        &self,
        core: &mut Core<B>,
        touched: &[u32],
        replies: &mut Vec<(Responder, Outcome)>,
    ) {
        let Core { io, partitions, .. } = core;
        let mut waiters = self.waiters.borrow_mut();
        for pid in touched {
            let Some(list) = waiters.get_mut(pid) else {
                continue;
            };
            let Some(p) = partitions.get_mut(pid) else {
                continue;
            };
            let hwm = p.high_watermark().unwrap_or(0);
            let (ready, waiting): (Vec<Waiter>, Vec<Waiter>) =
                list.drain(..).partition(|w| w.offset < hwm);
            *list = waiting;
            for w in ready {
                let buf = self.reply_buffer(w.max_bytes);
                let outcome = p
                    .fetch(io, w.offset, w.max_bytes, buf)
                    .map(OpReply::Fetched);
                replies.push((w.reply, outcome));
            }
        }
    }

    /// Answers the long-poll fetches whose deadline is at or before `now`
    /// (all of them once stopping) with an empty fetch.
    pub(super) fn expire_waiters(&self, now: Instant) {
        let mut replies = Vec::new();
        {
            let core = self.core.borrow();
            let mut waiters = self.waiters.borrow_mut();
            for (pid, list) in waiters.iter_mut() {
                let (expired, keep): (Vec<Waiter>, Vec<Waiter>) = list
                    .drain(..)
                    .partition(|w| w.deadline <= now || self.is_stopping());
                *list = keep;
                for w in expired {
                    let outcome = match core.partitions.get(pid) {
                        Some(p) => Ok(OpReply::Fetched(p.empty_fetch(w.offset))),
                        None => Err(unknown_partition(*pid)),
                    };
                    replies.push((w.reply, outcome));
                }
            }
            waiters.retain(|_, l| !l.is_empty());
        }
        for (reply, outcome) in replies {
            self.respond(reply, outcome);
        }
    }

    /// Steps the replicas that have a timeout armed with one tick, then
    /// flushes and answers what that produced. Returns how many it ticked:
    /// O(partitions in `ticking`), none for idle clusters of one.
    pub(super) fn tick_replicas(&self, now: Instant) -> usize {
        let mut out = Applied::new(0, now);
        let mut ticked = 0;
        {
            let mut core = self.core.borrow_mut();
            let core = &mut *core;
            let due: Vec<u32> = core.ticking.iter().copied().collect();
            for pid in due {
                let Some(p) = core.partitions.get_mut(&pid) else {
                    core.ticking.remove(&pid);
                    continue;
                };
                if p.flush_in_flight() {
                    // A tick may make the replica cut or persist (a view
                    // change): it waits for the next tick, like a message.
                    continue;
                }
                p.tick(&mut core.io, &mut core.installs, out.now_ms);
                ticked += 1;
                if !p.needs_tick() {
                    core.ticking.remove(&pid);
                }
                out.touch(pid);
            }
            self.commit(core, &mut out);
        }
        for (reply, outcome) in out.replies {
            self.respond(reply, outcome);
        }
        ticked
    }

    /// Brings the durable frontier record of partitions idle since the last
    /// tick up to their durable end, in one group submission nobody waits
    /// for: a partition's record otherwise trails by its last flush until
    /// its next one (see `PartitionStore::prepare_checkpoint`).
    pub(super) fn checkpoint_idle(&self, now: Instant) {
        let mut core = self.core.borrow_mut();
        let Core {
            io,
            partitions,
            flights,
            ..
        } = &mut *core;
        let mut sqes = Vec::new();
        let mut parts = Vec::new();
        for (&pid, p) in partitions.iter_mut() {
            match p.prepare_checkpoint(&mut sqes) {
                Ok(0) => {}
                Ok(n) => parts.push((pid, n, false)),
                Err(e) => tracing::debug!(partition_id = pid, error = %e, "no checkpoint"),
            }
        }
        if !parts.is_empty() {
            let id = io.submit_nowait(sqes);
            metrics::inc(&self.metrics.fsyncs_total);
            flights.insert(
                id,
                Flight {
                    parts,
                    journal_entries: 0,
                    started: now,
                },
            );
        }
    }
}

/// Whether `p`'s flush must wait for the journal write in flight: its bytes
/// are small enough for the journal, and one journal write is in flight at
/// a time (so a later turn is never acknowledged before an earlier one).
fn waits_for_journal(journal: Option<&Journal>, p: &Partition) -> bool {
    let Some(j) = journal else {
        return false;
    };
    let bytes = p.unflushed_bytes();
    j.writing() && bytes > 0 && bytes <= j.config().append_bytes_max as u64
}
