//! The replica: state, `step`, the durability gate, timeouts, storage
//! completions and normal operation (primary sequencing, backups, commit).
//! View change, recovery and repair are in `view_change.rs`.

use std::collections::{BTreeMap, BTreeSet, VecDeque};

use ringlog_protocol::batch::{
    encode_header, BatchBuilder, BatchError, BatchHeader, BatchView, Record, Stamp, VerifiedBatch,
    ATTR_PURGE,
};

use super::log::{Anchor, Entry, Log};
use super::timeout::{Rng, Timeout};
use ringlog_protocol::replication as wire;

use super::types::*;

/// Replica settings. Every queue the replica keeps is bounded by one of
/// these.
#[derive(Debug, Clone)]
pub struct Config {
    pub partition_id: u32,
    pub replica_count: u8,
    pub replica: u8,
    /// Uncommitted ops the primary keeps in flight.
    pub pipeline_ops_max: u64,
    /// Client appends queued while the pipeline is full; more are refused.
    pub client_queue_max: usize,
    /// Headers the journal keeps (committed ones are dropped beyond this);
    /// also the longest view-change suffix sent.
    pub journal_ops_max: usize,
    /// Messages held behind the durability gate; beyond it the oldest is
    /// dropped (the protocol retransmits).
    pub held_messages_max: usize,
    /// Batches per repair request and answer.
    pub repair_batches_max: u64,
    /// Repair reads in flight for peers.
    pub repair_reads_max: usize,
    pub heartbeat_ticks: u64,
    pub prepare_retry_ticks: u64,
    pub primary_silent_ticks: u64,
    pub view_change_retry_ticks: u64,
    pub view_change_escalate_ticks: u64,
    pub start_view_request_ticks: u64,
    pub repair_retry_ticks: u64,
    /// Unanswered RequestStartView rounds after which a restarted replica
    /// with its disk intact joins a view change itself (else a cluster
    /// that restarted whole would wait forever). A wiped one never does.
    pub recovering_attempts_max: u32,
    /// Bytes of batches a primary sequences at most between two moments
    /// its pipeline is empty (everything it holds committed). A store with
    /// an uncommitted headroom rolls a segment only at an append when
    /// every op in it is committed (`StoreConfig::uncommitted_headroom_bytes`):
    /// under a steady stream the pipeline never drains, no replica's store
    /// rolls, the headroom fills and appends are refused. Set it to at
    /// most the headroom less a pipeline of batches; None: never forced
    /// (a store without headroom).
    pub drain_every_bytes: Option<u64>,
    /// A wiped replica whose log is empty (it never held or installed
    /// anything: its superblock names no commit) and that would repair
    /// more ops than this transfers state instead
    /// ([`Trigger::NewOrWiped`]): a snapshot's sealed segments are copied
    /// a chunk window at a time, repair brings `repair_batches_max` ops a
    /// round trip. A smaller gap is repaired. None: never (a host that
    /// runs no transfers).
    pub wiped_repair_ops_max: Option<u64>,
    /// Repair rounds (`repair_retry_ticks` retries, backing off) in a row
    /// in which the log did not grow, after which the replica transfers
    /// state ([`Trigger::RepairStuck`]); it keeps repairing meanwhile, and
    /// progress ends the episode. None: never (a host that runs no
    /// transfers).
    pub repair_stuck_rounds_max: Option<u32>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfigError {
    #[error("replica_count {0} must be 1..=32 and odd")]
    ReplicaCount(u8),
    #[error("replica index {replica} is not below replica_count {count}")]
    ReplicaIndex { replica: u8, count: u8 },
    #[error("{field} must be at least {min}")]
    TooSmall { field: &'static str, min: u64 },
}

/// Pipeline of a cluster of one by default. The shard keeps appending to a
/// partition while its flush is in flight until the store's write buffer
/// (4 MiB by default) would overflow: up to ~43,000 of the smallest
/// batches (96-byte header and a record) per flush, twice that with one
/// flush in flight and one filling. The pipeline must not cap that group
/// commit, so it is sized for 2 x 4 MiB of 97-byte batches.
pub const LONE_PIPELINE_OPS_MAX: u64 = 1 << 17;
const _: () = assert!(LONE_PIPELINE_OPS_MAX >= 2 * 4 * 1024 * 1024 / 97);
/// Client queue of a cluster of one by default: one shard turn's worth of
/// appends (`group_commit_appends_max`, 1024 by default).
pub const LONE_CLIENT_QUEUE_MAX: usize = 1024;
/// Default [`Config::wiped_repair_ops_max`]: 16 repair round trips at
/// the default `repair_batches_max`.
pub const WIPED_REPAIR_OPS_MAX: u64 = 256;
/// Default [`Config::repair_stuck_rounds_max`]: with the retry's backoff
/// from `repair_retry_ticks` (10), several seconds at the shard's 20 ms
/// tick, far beyond a lost message or two.
pub const REPAIR_STUCK_ROUNDS_MAX: u32 = 8;
/// Log entries up to which every step checks the whole journal; above it
/// (only a cluster of one's long pipeline gets there) a step checks its
/// O(1) invariants only, so a step costs O(1) on the data path.
const FULL_CHECK_ENTRIES_MAX: usize = 512;

impl Config {
    /// Defaults; a cluster of one gets [`LONE_PIPELINE_OPS_MAX`] and
    /// [`LONE_CLIENT_QUEUE_MAX`] (it is its own quorum: ops leave the
    /// pipeline as fast as its flushes complete).
    pub fn new(partition_id: u32, replica_count: u8, replica: u8) -> Self {
        let lone = replica_count == 1;
        Self {
            partition_id,
            replica_count,
            replica,
            pipeline_ops_max: if lone { LONE_PIPELINE_OPS_MAX } else { 8 },
            client_queue_max: if lone { LONE_CLIENT_QUEUE_MAX } else { 64 },
            journal_ops_max: 64,
            held_messages_max: 256,
            repair_batches_max: 16,
            repair_reads_max: 4,
            heartbeat_ticks: 5,
            prepare_retry_ticks: 10,
            primary_silent_ticks: 30,
            view_change_retry_ticks: 10,
            view_change_escalate_ticks: 50,
            start_view_request_ticks: 10,
            repair_retry_ticks: 10,
            recovering_attempts_max: 8,
            drain_every_bytes: None,
            wiped_repair_ops_max: Some(WIPED_REPAIR_OPS_MAX),
            repair_stuck_rounds_max: Some(REPAIR_STUCK_ROUNDS_MAX),
        }
    }

    pub fn validate(&self) -> Result<(), ConfigError> {
        let n = self.replica_count;
        if n == 0 || n > 32 || n.is_multiple_of(2) {
            return Err(ConfigError::ReplicaCount(n));
        }
        if self.replica >= n {
            return Err(ConfigError::ReplicaIndex {
                replica: self.replica,
                count: n,
            });
        }
        // The journal is also the longest view-change suffix; a cluster of
        // one has no view change to send one in.
        let journal_min = if n == 1 { 1 } else { 2 * self.pipeline_ops_max };
        let mins = [
            ("pipeline_ops_max", self.pipeline_ops_max, 1),
            ("journal_ops_max", self.journal_ops_max as u64, journal_min),
            ("held_messages_max", self.held_messages_max as u64, 1),
            ("repair_batches_max", self.repair_batches_max, 1),
            ("repair_reads_max", self.repair_reads_max as u64, 1),
            (
                "repair_stuck_rounds_max",
                self.repair_stuck_rounds_max.map_or(1, u64::from),
                1,
            ),
        ];
        for (field, value, min) in mins {
            if value < min {
                return Err(ConfigError::TooSmall { field, min });
            }
        }
        Ok(())
    }

    pub fn quorum(&self) -> u32 {
        u32::from(self.replica_count) / 2 + 1
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum T {
    Heartbeat,
    PrepareRetry,
    PrimarySilent,
    ViewChangeRetry,
    ViewChangeEscalate,
    StartViewRequest,
    RepairRetry,
}

const TIMEOUTS: [T; 7] = [
    T::Heartbeat,
    T::PrepareRetry,
    T::PrimarySilent,
    T::ViewChangeRetry,
    T::ViewChangeEscalate,
    T::StartViewRequest,
    T::RepairRetry,
];

/// Acks for one op of the pipeline: a bit per replica, for one checksum.
#[derive(Debug, Clone, Copy)]
pub(super) struct Ack {
    pub checksum: u64,
    pub voters: u32,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Dvc {
    pub log_view: u32,
    pub op: u64,
    pub head_checksum: u64,
    pub commit: u64,
    pub suffix: Vec<BatchHeader>,
}

/// A StartView's fields: `head` is (op, head_checksum).
#[derive(Debug, Clone)]
pub(super) struct Sv {
    pub head: (u64, u64),
    pub commit: u64,
    pub nonce: u64,
    pub suffix: Vec<BatchHeader>,
}

/// Where a new primary is in finishing a view change.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Collecting,
    /// Merged: truncating, repairing, flushing the canonical log.
    Repairing,
    /// log_view = view is being persisted; then StartView.
    Persisting,
}

pub struct Replica {
    pub(super) cfg: Config,
    pub(super) rng: Rng,
    pub(super) status: Status,
    pub(super) view: u32,
    pub(super) log_view: u32,
    /// Highest op known committed that this log holds.
    pub(super) commit: u64,
    /// Highest op known committed anywhere.
    pub(super) commit_max: u64,
    pub(super) durable: VsrState,
    pub(super) persisting: Option<(IoId, VsrState)>,
    pub(super) persist_again: bool,
    pub(super) log: Log,
    pub(super) acks: BTreeMap<u64, Ack>,
    pub(super) waiting: BTreeMap<u64, Token>,
    pub(super) queue: VecDeque<(Token, ClientBatch)>,
    pub(super) next_io: IoId,
    pub(super) appends: BTreeSet<IoId>,
    /// Flush id -> highest op it covers.
    pub(super) flushes: BTreeMap<IoId, u64>,
    pub(super) truncations: BTreeSet<IoId>,
    /// Repair reads: id -> (peer, view asked in).
    pub(super) reads: BTreeMap<IoId, (u8, u32)>,
    pub(super) svc_votes: u32,
    pub(super) dvc_sent: bool,
    pub(super) dvcs: BTreeMap<u8, Dvc>,
    pub(super) phase: Phase,
    pub(super) nonce: u64,
    pub(super) view_seen_max: u32,
    /// Canonical headers of ops not yet in the log (view change).
    pub(super) target: BTreeMap<u64, BatchHeader>,
    pub(super) repair_goal: u64,
    pub(super) repair_from: Option<u8>,
    pub(super) held: VecDeque<(u8, Message)>,
    pub(super) timeouts: [Timeout; 7],
    /// Booted with no disk state and not yet repaired to a durable
    /// log_view: it learns the view and repairs, but never votes or leads.
    pub(super) wiped: bool,
    /// Mirrors [`VsrState::view_lost`]: its disk was lost, so it may have
    /// promised a view it no longer knows. It acks nothing, and its wipe
    /// ends only once `views_heard` covers its view (`view_known`).
    pub(super) view_lost: bool,
    /// While `view_lost`: the highest view each peer named in a fresh
    /// answer (a ViewNotice or StartView echoing our nonce); one entry per
    /// peer, so at most `replica_count - 1`.
    pub(super) views_heard: BTreeMap<u8, u32>,
    /// The commit of the last Commit heartbeat (to notice a stall).
    pub(super) heartbeat_commit: u64,
    /// The op the log must hold (durably) before log_view is persisted.
    pub(super) log_view_op: u64,
    /// Some(v): ops above v were kept at a view change although no header
    /// vouched for them (see `cut_point`); they are not committed until a
    /// linked append proves the chain below it canonical.
    pub(super) unverified_above: Option<u64>,
    /// Bytes sequenced since the pipeline was last empty (see
    /// [`Config::drain_every_bytes`]).
    pub(super) drain_bytes: u64,
    /// Some(trigger): it asked for a transfer ([`Event::TransferNeeded`])
    /// and its log lacks ops repair cannot bring. It keeps voting with its
    /// intact log (unless wiped), never leads or sends PrepareOk. For a
    /// trigger that repairs meanwhile ([`Trigger::repairs_meanwhile`]) it
    /// keeps repairing, rotating peers (another may hold the ops), and the
    /// next append ends it (the gap closed); else it repairs nothing until
    /// the reboot onto an install.
    pub(super) transferring: Option<Trigger>,
    /// Why it was wiped: the trigger a wiped replica far behind raises
    /// (NewOrWiped; CorruptSegment for a store set aside as corrupt, which
    /// transfers whatever the gap).
    pub(super) wipe_cause: Trigger,
    /// The log's last op at the last repair round, and the rounds in a row
    /// it stayed there (see [`Config::repair_stuck_rounds_max`]).
    pub(super) repair_rounds_at: (u64, u32),
    /// A purge op in the log not yet committed: always the log's head (the
    /// primary sequences nothing after it, and an op after it proves it
    /// committed: see `append`).
    pub(super) purge_op: Option<u64>,
    /// [`StorageOp::Purge`] ids in flight.
    pub(super) purges: BTreeSet<IoId>,
}

impl Replica {
    /// A replica of a freshly formatted cluster: view 0, empty log, Normal.
    /// A restarted or wiped replica must use [`Replica::restart`].
    pub fn new(cfg: Config, seed: u64) -> Result<Self, ConfigError> {
        let mut r = Self::blank(cfg, seed, VsrState::default(), Log::new(Anchor::default()))?;
        r.status = Status::Normal;
        r.arm_for_status();
        r.assert_invariants();
        Ok(r)
    }

    /// A replica booted from disk: `durable` from the superblock, the
    /// journal from the last `headers` above `base`. It starts Recovering:
    /// it learns the current view (RequestStartView) before it votes,
    /// acks or leads, whatever view it had.
    ///
    /// Except a replica of a cluster of one whose durable log_view is its
    /// view: it is its own quorum, nobody else can have moved the view, and
    /// every op on its disk was flushed by the only replica, so it resumes
    /// Normal as primary of its persisted view with its whole log
    /// committed, without a view change or a superblock write. One that
    /// crashed inside a view change (log_view below view) takes the slow
    /// path; a wiped one ([`Replica::wiped`]) stays refused.
    ///
    /// A `durable` state marked wiped (a wiped replica that crashed before
    /// its repair was done) boots wiped again, with the log it repaired.
    /// So does one whose store installed a snapshot (state transfer): the
    /// host marks the superblock wiped before the install begins, and
    /// boots it with `base` = the installed frontier; its log lacks the
    /// committed ops between the snapshot and the commit, so it repairs
    /// from `base` and never votes or leads until its log is whole.
    pub fn restart(
        cfg: Config,
        seed: u64,
        durable: VsrState,
        base: Anchor,
        headers: &[BatchHeader],
    ) -> Result<Self, ConfigError> {
        let lone = cfg.replica_count == 1 && durable.log_view == durable.view && !durable.wiped;
        let mut r = Self::boot(cfg, seed, durable, base, headers)?;
        if lone {
            r.commit = r.log.op();
            r.commit_max = r.commit_max.max(r.commit);
            // Applied at recovery (`replica_io::recover_lone`).
            r.purge_op = None;
            r.status = Status::Normal;
            r.arm_for_status();
        }
        r.assert_invariants();
        Ok(r)
    }

    /// A replica whose disk was lost: empty, Recovering, and it stays so
    /// until the current primary's StartView (it never claims view 0).
    /// The host first writes `VsrState { wiped: true, view_lost: true,
    /// ..Default::default() }` to the new store's superblock: the state
    /// this replica starts from.
    pub fn wiped(cfg: Config, seed: u64) -> Result<Self, ConfigError> {
        Self::wiped_for(cfg, seed, Trigger::NewOrWiped)
    }

    /// [`Replica::wiped`], its disk lost for `cause`: the trigger of the
    /// transfer it asks for. [`Trigger::CorruptSegment`]: its store failed
    /// verification and was replaced by an empty one; it transfers
    /// whatever the gap (its peers hold what it lost).
    pub fn wiped_for(cfg: Config, seed: u64, cause: Trigger) -> Result<Self, ConfigError> {
        assert!(
            matches!(cause, Trigger::NewOrWiped | Trigger::CorruptSegment),
            "a wipe's cause is a lost disk"
        );
        let durable = VsrState {
            wiped: true,
            view_lost: true,
            ..VsrState::default()
        };
        let mut r = Self::boot(cfg, seed, durable, Anchor::default(), &[])?;
        r.wipe_cause = cause;
        r.assert_invariants();
        Ok(r)
    }

    /// Booted from `durable` and the journal, Recovering.
    fn boot(
        cfg: Config,
        seed: u64,
        durable: VsrState,
        base: Anchor,
        headers: &[BatchHeader],
    ) -> Result<Self, ConfigError> {
        let mut log = Log::new(base);
        for h in headers {
            log.push(Entry {
                header: *h,
                batch: None,
                durable: true,
            });
        }
        let mut r = Self::blank(cfg, seed, durable, log)?;
        r.wiped = durable.wiped;
        r.view_lost = durable.view_lost;
        r.commit = durable.commit.min(r.log.op()).max(base.op);
        // An op after a purge op was appended only once the purge had
        // committed (and been applied: `append`); one at the head may not be.
        if let Some(p) = headers
            .iter()
            .rev()
            .find(|h| h.is_purge())
            .map(|h| h.vsr_op)
        {
            if p < r.log.op() {
                r.commit = r.commit.max(p);
            } else if p > r.commit {
                r.purge_op = Some(p);
            }
        }
        r.commit_max = durable.commit.max(r.commit);
        r.status = Status::Recovering;
        r.nonce = r.rng.next_u64() | 1;
        r.arm_for_status();
        Ok(r)
    }

    fn blank(cfg: Config, seed: u64, durable: VsrState, log: Log) -> Result<Self, ConfigError> {
        cfg.validate()?;
        let timeouts = [
            Timeout::new("heartbeat", cfg.heartbeat_ticks.max(1), false),
            Timeout::new("prepare_retry", cfg.prepare_retry_ticks.max(1), false),
            Timeout::new("primary_silent", cfg.primary_silent_ticks.max(1), true),
            Timeout::new(
                "view_change_retry",
                cfg.view_change_retry_ticks.max(1),
                false,
            ),
            Timeout::new(
                "view_change_escalate",
                cfg.view_change_escalate_ticks.max(1),
                true,
            ),
            Timeout::new(
                "start_view_request",
                cfg.start_view_request_ticks.max(1),
                true,
            ),
            Timeout::new("repair_retry", cfg.repair_retry_ticks.max(1), false),
        ];
        Ok(Self {
            cfg,
            rng: Rng::new(seed),
            status: Status::Recovering,
            view: durable.view,
            log_view: durable.log_view,
            commit: log.base().op,
            commit_max: log.base().op,
            durable,
            persisting: None,
            persist_again: false,
            log,
            acks: BTreeMap::new(),
            waiting: BTreeMap::new(),
            queue: VecDeque::new(),
            next_io: 1,
            appends: BTreeSet::new(),
            flushes: BTreeMap::new(),
            truncations: BTreeSet::new(),
            reads: BTreeMap::new(),
            svc_votes: 0,
            dvc_sent: false,
            dvcs: BTreeMap::new(),
            phase: Phase::Collecting,
            nonce: 0,
            view_seen_max: durable.view,
            target: BTreeMap::new(),
            repair_goal: 0,
            repair_from: None,
            held: VecDeque::new(),
            timeouts,
            wiped: false,
            view_lost: false,
            views_heard: BTreeMap::new(),
            heartbeat_commit: 0,
            log_view_op: 0,
            unverified_above: None,
            drain_bytes: 0,
            transferring: None,
            wipe_cause: Trigger::NewOrWiped,
            repair_rounds_at: (0, 0),
            purge_op: None,
            purges: BTreeSet::new(),
        })
    }

    pub fn status(&self) -> Status {
        self.status
    }

    pub fn view(&self) -> u32 {
        self.view
    }

    pub fn log_view(&self) -> u32 {
        self.log_view
    }

    pub fn commit(&self) -> u64 {
        self.commit
    }

    pub fn op(&self) -> u64 {
        self.log.op()
    }

    /// The highest op this replica heard is committed anywhere (at least
    /// its own commit): what it lags behind.
    pub fn commit_max(&self) -> u64 {
        debug_assert!(self.commit_max >= self.commit);
        self.commit_max
    }

    pub fn durable(&self) -> VsrState {
        self.durable
    }

    /// Booted wiped and not yet repaired to a durable log_view (durable in
    /// the superblock: [`VsrState::wiped`]).
    pub fn is_wiped(&self) -> bool {
        self.wiped
    }

    /// Asked for a transfer and not caught up since (see
    /// [`Event::TransferNeeded`]): it votes (unless wiped), serves, and
    /// for a trigger that repairs meanwhile repairs (rotating peers), but
    /// neither leads nor sends PrepareOk. False again once such a
    /// replica appends an op: a host running a transfer for it cancels it
    /// then.
    pub fn is_transferring(&self) -> bool {
        self.transferring.is_some()
    }

    /// Whether a Prepare, PrepareOk or Commit of `view` can be stepped while
    /// the host's flush is in flight: its step then emits no storage op but
    /// an Append of the Prepare's batch and a Flush (a host checks that
    /// append against its own write buffer), so the host need not hold it
    /// behind the flush, which cost a replicated op a whole fdatasync at
    /// the backup and another at the primary. False when the step could
    /// cut or persist: another view or status (a view change), a purge op
    /// a commit would apply, a superblock commit due, client batches a
    /// commit would sequence (appends the host did not check), a transfer.
    pub fn steps_beside_flush(&self, view: u32) -> bool {
        // No step commits past the log's head, which a Prepare moves by one.
        let reach = self.log.op() + 1;
        let lag_max = (self.cfg.journal_ops_max / 2) as u64;
        let persist_due = self.cfg.replica_count > 1 && reach >= self.durable.commit + lag_max;
        let quiet = self.queue.is_empty()
            && self.purge_op.is_none()
            && self.truncations.is_empty()
            && self.transferring.is_none();
        debug_assert!(self.status == Status::Fenced || self.commit < reach);
        debug_assert!(
            self.purge_op.is_none_or(|p| p == self.log.op()),
            "a pending purge op is the log's head"
        );
        view == self.view && self.status == Status::Normal && quiet && !persist_due
    }

    /// Why it is transferring, if it is.
    pub fn transfer_trigger(&self) -> Option<Trigger> {
        self.transferring
    }

    pub fn replica(&self) -> u8 {
        self.cfg.replica
    }

    pub fn primary_of(&self, view: u32) -> u8 {
        // replica_count <= 32, so the remainder fits in u8.
        (view % u32::from(self.cfg.replica_count)) as u8
    }

    /// Whether [`Input::Tick`] can do anything: some timeout is armed. A
    /// host ticks only the replicas that need it (a Normal replica of a
    /// cluster of one never does), so a tick costs O(those), not O(all).
    pub fn needs_tick(&self) -> bool {
        self.timeouts.iter().any(|t| t.armed())
    }

    pub fn is_primary(&self) -> bool {
        self.primary_of(self.view) == self.cfg.replica
    }

    /// Whether a purge op is in the log uncommitted (a host driving purges
    /// submits no other until it committed or left the log).
    pub fn purge_pending(&self) -> bool {
        self.purge_op.is_some()
    }

    /// The offset after the last committed op, if the journal still holds
    /// that op's header (it always does: pruning keeps the commit): how
    /// far a host may serve reads of a replicated log.
    pub fn commit_next_offset(&self) -> Option<u64> {
        let base = self.log.base();
        if self.commit == base.op {
            return Some(base.next_offset);
        }
        let next = self.log.get(self.commit).map(|e| e.header.next_offset());
        debug_assert!(next.is_some() || self.commit < base.op);
        next
    }

    /// `header_checksum` of `op` if the journal still holds it.
    pub fn checksum_at(&self, op: u64) -> Option<u64> {
        self.log.checksum_at(op)
    }

    pub fn step(&mut self, input: Input, out: &mut Outbox) {
        let before = (self.commit, self.durable, self.view);
        match input {
            Input::ClientAppend { token, .. } | Input::ClientPurge { token }
                if self.status == Status::Fenced =>
            {
                out.push(Output::Reply {
                    token,
                    result: Err(AppendError::Fenced),
                });
            }
            _ if self.status == Status::Fenced => {}
            Input::Tick => self.on_tick(out),
            Input::ClientAppend { token, batch } => match BatchHeader::decode(batch.as_ref()) {
                // Only `ClientPurge` sequences a purge.
                Ok(h) if h.is_purge() => out.push(Output::Reply {
                    token,
                    result: Err(AppendError::InvalidBatch(BatchError::NonZeroReserved {
                        field: "attributes",
                    })),
                }),
                _ => self.on_client_append(token, batch, out),
            },
            Input::ClientPurge { token } => {
                let batch = self.purge_batch();
                self.on_client_append(token, batch.into(), out)
            }
            Input::IoDone { id, result } => self.on_io_done(id, result, out),
            Input::Message { from, msg } => self.on_message(from, msg, out),
        }
        assert!(self.commit >= before.0, "commit went back");
        assert!(self.durable.view >= before.1.view && self.durable.log_view >= before.1.log_view);
        assert!(self.view >= before.2, "view went back");
        self.leave_wiped_when_whole(out);
        if self.log.len() <= FULL_CHECK_ENTRIES_MAX {
            self.assert_invariants();
        } else {
            self.assert_invariants_o1();
        }
    }

    /// Every invariant, the whole journal and pipeline included.
    pub fn assert_invariants(&self) {
        self.assert_invariants_o1();
        self.log.check_chain();
        for (&op, ack) in &self.acks {
            assert!(
                op > self.commit && op <= self.log.op(),
                "ack for op {op} outside pipeline"
            );
            assert!(
                ack.voters >> self.cfg.replica_count == 0,
                "vote from unknown replica"
            );
        }
        assert!(self.waiting.keys().all(|op| self.acks.contains_key(op)));
    }

    /// The invariants a step checks in O(1) (not per journal entry).
    fn assert_invariants_o1(&self) {
        let d = self.durable;
        assert!(d.log_view <= d.view, "durable log_view above durable view");
        assert!(self.log_view <= self.view, "log_view above view");
        assert!(
            d.view <= self.view && d.log_view <= self.log_view,
            "durable ahead of memory"
        );
        assert!(self.commit <= self.commit_max, "commit above commit_max");
        assert_eq!(self.wiped, d.wiped, "the wipe is what the superblock says");
        assert_eq!(self.view_lost, d.view_lost, "so is a lost view");
        assert!(self.wiped || !self.view_lost, "a lost view is a wipe's");
        assert!(
            self.log.base().op <= self.commit,
            "journal pruned uncommitted ops"
        );
        assert!(self.status == Status::Fenced || self.commit <= self.log.op());
        assert!(
            self.held.len() <= self.cfg.held_messages_max,
            "held queue over its bound"
        );
        assert!(
            self.queue.len() <= self.cfg.client_queue_max,
            "client queue over its bound"
        );
        assert!(
            self.reads.len() <= self.cfg.repair_reads_max,
            "repair reads over bound"
        );
        assert!(
            self.unverified_above
                .is_none_or(|v| v >= self.commit && v < self.log.op()),
            "unverified ops include committed ones"
        );
        assert!(
            self.purge_op
                .is_none_or(|p| p == self.log.op() && p > self.commit),
            "an uncommitted purge op below the log's head"
        );
        let leading = self.status == Status::Normal && self.is_primary();
        assert!(
            !(leading && self.transferring.is_some()),
            "a transferring replica leads"
        );
        if leading {
            assert_eq!(
                self.log_view, self.view,
                "a normal primary's log_view is its view"
            );
        } else {
            assert!(
                self.waiting.is_empty() && self.queue.is_empty(),
                "clients held off-primary"
            );
        }
        assert!(
            self.waiting.len() <= self.acks.len(),
            "clients wait on ops outside the pipeline"
        );
    }

    // ---- outputs, the durability gate, timeouts ----

    pub(super) fn io(&mut self, out: &mut Outbox, op: StorageOp) -> IoId {
        let id = self.next_io;
        self.next_io += 1;
        out.push(Output::Io { id, op });
        id
    }

    pub(super) fn send(&mut self, out: &mut Outbox, to: u8, body: Body) {
        self.send_as(out, to, self.view, body);
    }

    /// Sends with an explicit view: a Prepare keeps the view its batch was
    /// stamped in, also when a later primary resends it.
    fn send_as(&mut self, out: &mut Outbox, to: u8, view: u32, body: Body) {
        debug_assert!(to != self.cfg.replica && to < self.cfg.replica_count);
        debug_assert!(view <= self.view);
        let msg = Message { view, body };
        if self.gate_open(&msg) {
            out.push(Output::Send { to, msg });
            return;
        }
        if self.held.len() == self.cfg.held_messages_max {
            self.held.pop_front();
            out.event(Event::Dropped {
                what: "held message",
                reason: "held queue full",
            });
        }
        self.held.push_back((to, msg));
    }

    pub(super) fn send_all(&mut self, out: &mut Outbox, body: Body) {
        for to in 0..self.cfg.replica_count {
            if to != self.cfg.replica {
                self.send(out, to, body.clone());
            }
        }
    }

    /// The log_view a message vouches for, if it vouches for one.
    fn vouched_log_view(&self, msg: &Message) -> Option<u32> {
        match &msg.body {
            Body::DoViewChange(_) if planted!(LogViewNotPersistedBeforeDoViewChange) => None,
            Body::DoViewChange(wire::DoViewChange { log_view, .. }) => Some(*log_view),
            Body::StartView(wire::StartView { .. }) => Some(msg.view),
            Body::PrepareOk(wire::PrepareOk { .. }) => Some(self.log_view),
            _ => None,
        }
    }

    fn gate_open(&self, msg: &Message) -> bool {
        let log_view_ok = self
            .vouched_log_view(msg)
            .is_none_or(|lv| lv <= self.durable.log_view);
        msg.view <= self.durable.view && log_view_ok
    }

    fn release_held(&mut self, out: &mut Outbox) {
        let held = std::mem::take(&mut self.held);
        for (to, msg) in held {
            if msg.view != self.view {
                continue; // stale: the protocol resends what the new view needs
            }
            if self.gate_open(&msg) {
                out.push(Output::Send { to, msg });
            } else {
                self.held.push_back((to, msg));
            }
        }
    }

    pub(super) fn persist(&mut self, out: &mut Outbox) {
        if self.persisting.is_some() {
            self.persist_again = true;
            return;
        }
        let log_view = if self.log_view_ready() {
            self.log_view
        } else {
            self.durable.log_view
        };
        let wipe_ends = self.wipe_may_end(log_view);
        let state = VsrState {
            view: self.view,
            log_view,
            commit: self.commit.max(self.durable.commit),
            wiped: self.wiped && !wipe_ends,
            view_lost: self.view_lost && !wipe_ends,
        };
        if state == self.durable {
            return;
        }
        let id = self.io(out, StorageOp::PersistVsr(state));
        self.persisting = Some((id, state));
    }

    /// Whether the log is the whole log of `log_view` up to the op its
    /// StartView named, cut and durable. Until then the superblock keeps
    /// the older log_view: a crash mid-repair must not leave a durable
    /// claim of view v on a log that lacks v's committed ops.
    fn log_view_ready(&self) -> bool {
        let op = self.log_view_op;
        self.truncations.is_empty()
            && self.log.op() >= op
            && self
                .log
                .entries()
                .all(|e| e.durable || e.header.vsr_op > op)
    }

    /// Whether a superblock naming `log_view` would describe a whole log:
    /// normal in that view, and the log the whole log of the view up to
    /// the StartView's op, durable. Not `log_view == view` alone: in view 0
    /// a wiped replica's blank superblock says so from the start, and the
    /// first commit it writes mid-repair would end the wipe.
    fn whole_at(&self, log_view: u32) -> bool {
        self.status == Status::Normal
            && log_view == self.view
            && self.log_view == self.view
            && self.log_view_ready()
    }

    /// A wipe may end with a superblock naming `log_view`: the log is
    /// whole there and, if the disk was lost, the view is known.
    fn wipe_may_end(&self, log_view: u32) -> bool {
        self.whole_at(log_view) && (!self.view_lost || self.view_known())
    }

    /// Whether the fresh answers rule out a view above ours that this
    /// replica may have promised before it lost its disk. Any view change
    /// quorum holds at least `quorum - 1` other replicas, each of which
    /// persisted that view before it voted; answers from `n - quorum + 1`
    /// of the `n - 1` others include one of them (Viewstamped Replication's
    /// recovery quorum).
    pub(super) fn view_known(&self) -> bool {
        let n = u32::from(self.cfg.replica_count);
        let need = (n - self.cfg.quorum() + 1).min(n - 1);
        debug_assert!(self.views_heard.len() < usize::from(self.cfg.replica_count));
        self.views_heard.len() as u32 >= need && self.views_heard.values().all(|&v| v <= self.view)
    }

    /// A wiped replica whose log is whole clears the superblock's wiped
    /// flag; it is an ordinary replica once that write is durable
    /// (`on_persisted`). One whose disk was lost first asks every peer
    /// for its view, until a quorum of answers covers its own.
    fn leave_wiped_when_whole(&mut self, out: &mut Outbox) {
        if !self.wiped || self.status == Status::Fenced {
            return;
        }
        if self.wipe_may_end(self.durable.log_view) {
            self.persist(out);
        } else if self.view_lost && self.whole_at(self.durable.log_view) {
            self.ask_views(out);
        }
    }

    /// Persists log_view once the log has caught up with it.
    pub(super) fn persist_log_view_when_ready(&mut self, out: &mut Outbox) {
        if self.log_view > self.durable.log_view && self.log_view_ready() {
            self.persist(out);
        }
    }

    pub(super) fn timeout(&mut self, t: T) -> &mut Timeout {
        &mut self.timeouts[t as usize]
    }

    /// A cluster of one has nobody to heartbeat or resend prepares to:
    /// those timeouts stay off, so its Normal primary needs no tick.
    fn peerless(&self, t: T) -> bool {
        self.cfg.replica_count == 1 && matches!(t, T::Heartbeat | T::PrepareRetry)
    }

    pub(super) fn start(&mut self, t: T) {
        if !self.peerless(t) {
            self.timeouts[t as usize].start(&mut self.rng);
        }
    }

    pub(super) fn ensure(&mut self, t: T) {
        if !self.peerless(t) {
            self.timeouts[t as usize].ensure(&mut self.rng);
        }
    }

    pub(super) fn backoff(&mut self, t: T) {
        self.timeouts[t as usize].backoff(&mut self.rng);
    }

    /// Arms exactly the timeouts the current status and role use.
    pub(super) fn arm_for_status(&mut self) {
        for t in &mut self.timeouts {
            t.stop();
        }
        match self.status {
            Status::Normal if self.is_primary() => {
                self.start(T::Heartbeat);
                if !self.acks.is_empty() {
                    self.start(T::PrepareRetry);
                }
            }
            Status::Normal => self.start(T::PrimarySilent),
            Status::ViewChange => {
                self.start(T::ViewChangeRetry);
                self.start(T::ViewChangeEscalate);
            }
            Status::Recovering => self.start(T::StartViewRequest),
            Status::Fenced => {}
        }
    }

    fn on_tick(&mut self, out: &mut Outbox) {
        for t in &mut self.timeouts {
            t.tick();
        }
        for t in TIMEOUTS {
            if self.timeouts[t as usize].fired() && self.status != Status::Fenced {
                self.on_timeout(t, out);
            }
        }
    }

    fn on_timeout(&mut self, t: T, out: &mut Outbox) {
        match t {
            T::Heartbeat => {
                let commit = self.commit;
                let commit_checksum = self.log.checksum_at(commit).unwrap_or(0);
                self.send_all(
                    out,
                    Body::Commit(wire::Commit {
                        commit,
                        commit_checksum,
                    }),
                );
                self.start(T::Heartbeat);
            }
            T::PrepareRetry => self.resend_prepares(out),
            T::PrimarySilent if self.wiped => self.back_to_recovering(out),
            T::PrimarySilent => self.start_view_change(self.view + 1, out),
            T::ViewChangeRetry => self.view_change_retry(out),
            T::ViewChangeEscalate => self.start_view_change(self.view + 1, out),
            T::StartViewRequest => self.start_view_request_retry(out),
            T::RepairRetry => self.repair_retry(out),
        }
    }

    // ---- storage completions ----

    fn on_io_done(&mut self, id: IoId, result: Result<IoOutcome, IoFailure>, out: &mut Outbox) {
        if let Some((to, view)) = self.reads.remove(&id) {
            return self.on_read_done(to, view, result, out);
        }
        if let Err(failure) = result {
            return self.fence(failure.reason, out);
        }
        if self.persisting.is_some_and(|(p, _)| p == id) {
            self.on_persisted(out);
        } else if let Some(op) = self.flushes.remove(&id) {
            self.on_flushed(op, out);
        } else if self.truncations.remove(&id) {
            self.persist_log_view_when_ready(out);
            self.try_finish_view(out);
        } else if self.purges.remove(&id) {
            // Applied; nothing waits on it (later ops ran after it).
        } else if !self.appends.remove(&id) {
            out.event(Event::Dropped {
                what: "io completion",
                reason: "unknown id",
            });
        }
    }

    fn on_persisted(&mut self, out: &mut Outbox) {
        let Some((_, state)) = self.persisting.take() else {
            return;
        };
        assert!(state.view >= self.durable.view && state.log_view >= self.durable.log_view);
        assert!(self.wiped || !state.wiped, "a wipe ends only once");
        self.durable = state;
        // Its log is whole and the superblock says so: an ordinary replica.
        self.wiped = state.wiped;
        let view_found = self.view_lost && !state.view_lost;
        self.view_lost = state.view_lost;
        if view_found && self.status == Status::Normal && !self.is_primary() {
            // The acks it withheld while its view was unknown.
            self.ack_uncommitted(self.commit, out);
        }
        if std::mem::take(&mut self.persist_again) {
            self.persist(out);
        }
        self.release_held(out);
        let done = self.status == Status::ViewChange
            && self.phase == Phase::Persisting
            && self.durable.log_view == self.view;
        if done {
            self.become_primary(out);
        }
    }

    fn on_flushed(&mut self, op_max: u64, out: &mut Outbox) {
        let mut newly = Vec::new();
        let from = self.log.base().op + 1;
        for op in from..=op_max.min(self.log.op()) {
            if let Some(e) = self.log.get_mut(op) {
                if !e.durable {
                    e.durable = true;
                    newly.push((op, e.header.header_checksum));
                }
            }
        }
        match self.status {
            Status::Normal if self.is_primary() => {
                for &(op, checksum) in &newly {
                    self.vote(self.cfg.replica, op, checksum, out);
                }
            }
            Status::Normal => {
                for &(op, checksum) in &newly {
                    if op > self.commit {
                        self.send_prepare_ok(op, checksum, out);
                    }
                }
            }
            _ => self.try_finish_view(out),
        }
        self.persist_log_view_when_ready(out);
    }

    pub(super) fn fence(&mut self, reason: String, out: &mut Outbox) {
        self.abandon_clients(out);
        self.status = Status::Fenced;
        self.held.clear();
        self.arm_for_status();
        out.event(Event::Fenced { reason });
    }

    /// Replies to every client this replica can no longer serve as primary.
    pub(super) fn abandon_clients(&mut self, out: &mut Outbox) {
        let view = self.view;
        for (op, token) in std::mem::take(&mut self.waiting) {
            out.push(Output::Reply {
                token,
                result: Err(AppendError::OutcomeUnknown { view, op }),
            });
        }
        let primary = self.primary_of(view);
        for (token, _) in std::mem::take(&mut self.queue) {
            out.push(Output::Reply {
                token,
                result: Err(AppendError::NotPrimary { view, primary }),
            });
        }
        self.acks.clear();
    }

    // ---- normal operation ----

    fn on_client_append(&mut self, token: Token, batch: ClientBatch, out: &mut Outbox) {
        if !(self.status == Status::Normal && self.is_primary()) {
            let (view, primary) = (self.view, self.primary_of(self.view));
            let result = Err(AppendError::NotPrimary { view, primary });
            return out.push(Output::Reply { token, result });
        }
        if !self.admits() || !self.queue.is_empty() {
            if self.queue.len() < self.cfg.client_queue_max {
                self.queue.push_back((token, batch));
            } else {
                let result = Err(AppendError::Busy {
                    queued: self.queue.len(),
                });
                out.push(Output::Reply { token, result });
            }
            return;
        }
        self.sequence(token, batch, out);
    }

    /// Bytes of the client batches queued behind a full pipeline (at most
    /// `client_queue_max` of them): they reach the store before any later
    /// batch.
    pub fn queued_bytes(&self) -> usize {
        let bytes: usize = self.queue.iter().map(|(_, b)| b.as_ref().len()).sum();
        debug_assert!(self.queue.len() <= self.cfg.client_queue_max);
        bytes
    }

    pub(super) fn pipeline_full(&self) -> bool {
        self.log.op() - self.commit >= self.cfg.pipeline_ops_max
    }

    /// Whether the primary sequences a client append now: its pipeline has
    /// room and it is not letting the pipeline drain.
    fn admits(&self) -> bool {
        let draining = self
            .cfg
            .drain_every_bytes
            .is_some_and(|max| self.drain_bytes >= max)
            && self.commit < self.log.op();
        !self.pipeline_full() && !draining && self.purge_op.is_none()
    }

    /// The operator's purge as a batch: one empty record, marked
    /// `ATTR_PURGE` (the primary stamps it like any batch).
    fn purge_batch(&self) -> Vec<u8> {
        let mut b = BatchBuilder::new(self.cfg.partition_id);
        let record = Record {
            key: &[],
            headers: &[],
            value: &[],
            timestamp_ms: 0,
        };
        let built = b.push(&record).and_then(|()| b.finish(&Stamp::default()));
        let Ok(mut batch) = built else {
            unreachable!("an empty record fits a batch");
        };
        let mut header = match BatchHeader::decode(&batch) {
            Ok(h) => h,
            Err(e) => unreachable!("a built batch decodes: {e}"),
        };
        header.attributes = ATTR_PURGE;
        if let Some(head) = batch.first_chunk_mut() {
            encode_header(&header, head);
        }
        debug_assert!(BatchHeader::decode(&batch).is_ok_and(|h| h.is_purge()));
        batch
    }

    /// `op` is committed here: tells the host, and applies a purge op.
    /// Repair reads in flight may hold ops the purge drops: their answers
    /// are dropped (the askers ask again and learn the range is purged).
    fn on_committed(&mut self, op: u64, out: &mut Outbox) {
        debug_assert!(op == self.commit);
        out.event(Event::Committed { op });
        if self.purge_op == Some(op) {
            self.purge_op = None;
            self.reads.clear();
            let id = self.io(out, StorageOp::Purge { through_op: op });
            self.purges.insert(id);
        }
    }

    /// Primary: stamps op, offset, view and chain link, appends, prepares.
    fn sequence(&mut self, token: Token, batch: ClientBatch, out: &mut Outbox) {
        debug_assert!(!self.pipeline_full() && self.status == Status::Normal);
        // The one full check of the body: the store trusts the proof.
        let mut verified = match VerifiedBatch::parse(batch) {
            Ok(v) => v,
            Err((e, _)) => {
                return out.push(Output::Reply {
                    token,
                    result: Err(e.into()),
                })
            }
        };
        let header = *verified.header();
        if header.partition_id != self.cfg.partition_id {
            let (batch, replica) = (header.partition_id, self.cfg.partition_id);
            let result = Err(AppendError::WrongPartition { batch, replica });
            return out.push(Output::Reply { token, result });
        }
        let head = self.log.head();
        let stamp = Stamp {
            base_offset: head.next_offset,
            vsr_op: head.op + 1,
            vsr_view: self.view,
            prev_checksum: head.checksum,
        };
        let header = match verified.restamp(&stamp) {
            Ok(h) => h,
            Err(e) => {
                return out.push(Output::Reply {
                    token,
                    result: Err(e.into()),
                })
            }
        };
        let bytes = BatchBytes::from(verified);
        self.drain_bytes = self.drain_bytes.saturating_add(bytes.len() as u64);
        let op = header.vsr_op;
        self.append(header, bytes.clone(), out);
        self.acks.insert(
            op,
            Ack {
                checksum: header.header_checksum,
                voters: 0,
            },
        );
        self.waiting.insert(op, token);
        let commit = self.commit;
        self.send_all(
            out,
            Body::Prepare(Prepare {
                op,
                commit,
                batch: bytes,
            }),
        );
        self.ensure(T::PrepareRetry);
    }

    /// Appends a verified, linked batch and flushes it.
    pub(super) fn append(&mut self, header: BatchHeader, batch: BatchBytes, out: &mut Outbox) {
        let op = header.vsr_op;
        // The op after our log arrived: no transfer needed any more (the
        // host cancels its receiver, see `is_transferring`). A transfer
        // that replaces the log ends only with the reboot.
        if self.transferring.is_some_and(Trigger::repairs_meanwhile) {
            self.transferring = None;
        }
        // It links to our head: the whole chain below is the canonical one.
        self.unverified_above = None;
        if let Some(p) = self.purge_op {
            // An op after a purge op: no primary sequences one before the
            // purge commits, so it committed. Applied before this append.
            debug_assert_eq!(p + 1, op, "the purge op is the head");
            self.advance_commit(p, out);
            assert!(self.purge_op.is_none(), "purge op {p} not committed");
        }
        // The body serves prepares and repairs for peers; a cluster of one
        // has none, and the store holds the bytes already.
        let body = (self.cfg.replica_count > 1).then(|| batch.clone());
        if header.is_purge() {
            self.purge_op = Some(op);
        }
        self.log.push(Entry {
            header,
            batch: body,
            durable: false,
        });
        self.repair_rounds_at = (op, 0);
        let append = self.io(out, StorageOp::Append { op, batch });
        self.appends.insert(append);
        let flush = self.io(out, StorageOp::Flush);
        self.flushes.insert(flush, op);
        if planted!(AckBeforeFsync) && self.status == Status::Normal && !self.is_primary() {
            self.send_prepare_ok(op, header.header_checksum, out);
        }
    }

    /// Counts one replica's vote for (op, checksum), once.
    fn vote(&mut self, from: u8, op: u64, checksum: u64, out: &mut Outbox) {
        let Some(ack) = self.acks.get_mut(&op) else {
            let reason = "op not in the pipeline";
            return out.event(Event::Dropped {
                what: "prepare_ok",
                reason,
            });
        };
        if ack.checksum != checksum {
            let reason = "checksum differs";
            return out.event(Event::Dropped {
                what: "prepare_ok",
                reason,
            });
        }
        let bit = 1u32 << from;
        if ack.voters & bit != 0 && planted!(DuplicatePrepareOkCounted) {
            // Counted as a vote: the lowest replica that has not voted.
            let spare = !ack.voters & ((1u32 << self.cfg.replica_count) - 1);
            ack.voters |= spare & spare.wrapping_neg();
            return self.try_commit(out);
        }
        if ack.voters & bit != 0 {
            let reason = "duplicate";
            return out.event(Event::Dropped {
                what: "prepare_ok",
                reason,
            });
        }
        // The ack vouches for every op below it too: its checksum links the
        // backup's log to ours down the chain, and its flush covered them.
        // A backup re-acks only above its own commit, which may be above
        // ours (sim seed 7200075).
        for (_, below) in self.acks.range_mut(..=op) {
            below.voters |= bit;
        }
        debug_assert!(self
            .acks
            .values()
            .all(|a| a.voters < 1u32 << self.cfg.replica_count));
        self.try_commit(out);
    }

    pub(super) fn try_commit(&mut self, out: &mut Outbox) {
        let quorum = self.cfg.quorum();
        while let Some(ack) = self.acks.get(&(self.commit + 1)) {
            if ack.voters.count_ones() < quorum {
                break;
            }
            let op = self.commit + 1;
            self.acks.remove(&op);
            self.commit = op;
            self.commit_max = self.commit_max.max(op);
            self.on_committed(op, out);
            if let Some(token) = self.waiting.remove(&op) {
                let h = self.log.get(op).map(|e| e.header);
                let result = h.map(|h| Appended {
                    op,
                    base_offset: h.base_offset,
                    next_offset: h.next_offset(),
                });
                debug_assert!(result.is_some(), "committed op {op} not in the journal");
                if let Some(appended) = result {
                    out.push(Output::Reply {
                        token,
                        result: Ok(appended),
                    });
                }
            }
        }
        self.log.prune(self.commit, self.cfg.journal_ops_max);
        self.persist_commit_if_behind(out);
        if self.acks.is_empty() {
            self.timeout(T::PrepareRetry).stop();
        }
        if self.commit == self.log.op() {
            // Drained: every store may roll at the next append.
            self.drain_bytes = 0;
        }
        while self.admits() {
            let Some((token, batch)) = self.queue.pop_front() else {
                break;
            };
            self.sequence(token, batch, out);
        }
    }

    fn resend_prepares(&mut self, out: &mut Outbox) {
        let commit = self.commit;
        let pending: Vec<(u64, u32, u32, BatchBytes)> = self
            .acks
            .iter()
            .filter_map(|(&op, ack)| {
                let e = self.log.get(op)?;
                Some((op, e.header.vsr_view, ack.voters, e.batch.clone()?))
            })
            .collect();
        for (op, view, voters, batch) in pending {
            for to in 0..self.cfg.replica_count {
                if to != self.cfg.replica && voters & (1 << to) == 0 {
                    let body = Body::Prepare(Prepare {
                        op,
                        commit,
                        batch: batch.clone(),
                    });
                    self.send_as(out, to, view, body);
                }
            }
        }
        self.backoff(T::PrepareRetry);
    }

    pub(super) fn send_prepare_ok(&mut self, op: u64, prepare_checksum: u64, out: &mut Outbox) {
        debug_assert!(
            self.log.held(op).is_some_and(|(_, durable)| durable) || planted!(AckBeforeFsync),
            "ack before fsync"
        );
        if self.transferring.is_some() {
            // Withheld until the log grows again: an install may replace
            // it, and until then it lacks what the primary committed.
            return;
        }
        if self.view_lost {
            // It may be in a view older than one it promised before its
            // disk was lost: its ack could complete an older view's quorum.
            return;
        }
        let primary = self.primary_of(self.view);
        self.send(
            out,
            primary,
            Body::PrepareOk(wire::PrepareOk {
                op,
                prepare_checksum,
            }),
        );
    }

    fn on_message(&mut self, from: u8, msg: Message, out: &mut Outbox) {
        if from >= self.cfg.replica_count || from == self.cfg.replica {
            let what = msg.body.name();
            return out.event(Event::Dropped {
                what,
                reason: "bad sender",
            });
        }
        let view = msg.view;
        match msg.body {
            Body::Prepare(Prepare { op, commit, batch }) => {
                self.on_prepare(from, view, op, commit, batch, out)
            }
            Body::PrepareOk(wire::PrepareOk {
                op,
                prepare_checksum,
            }) => self.on_prepare_ok(from, view, op, prepare_checksum, out),
            Body::Commit(wire::Commit {
                commit,
                commit_checksum,
            }) => self.on_commit(from, view, commit, commit_checksum, out),
            Body::StartViewChange => self.on_start_view_change(from, view, out),
            Body::DoViewChange(wire::DoViewChange {
                log_view,
                op,
                head_checksum,
                commit,
                suffix,
            }) => {
                let dvc = Dvc {
                    log_view,
                    op,
                    head_checksum,
                    commit,
                    suffix,
                };
                self.on_do_view_change(from, view, dvc, out)
            }
            Body::StartView(wire::StartView {
                op,
                head_checksum,
                commit,
                nonce,
                suffix,
            }) => {
                let sv = Sv {
                    head: (op, head_checksum),
                    commit,
                    nonce,
                    suffix,
                };
                self.on_start_view(from, view, sv, out)
            }
            Body::RequestStartView(wire::RequestStartView { nonce }) => {
                self.on_request_start_view(from, view, nonce, out)
            }
            Body::ViewNotice(wire::ViewNotice { nonce }) => {
                self.on_view_notice(from, view, nonce, out)
            }
            Body::RequestPrepares(wire::RequestPrepares { op_min, op_max }) => {
                self.on_request_prepares(from, view, op_min, op_max, out)
            }
            Body::Prepares(Prepares { commit, batches }) => {
                self.on_prepares(from, view, commit, batches, out)
            }
            Body::RangeEvicted(evicted) => self.on_range_evicted(from, view, evicted, out),
        }
    }

    /// Common view check for normal-operation messages: false (and the
    /// message dropped) unless `view` is ours and we are Normal.
    fn in_normal_view(
        &mut self,
        what: &'static str,
        from: u8,
        view: u32,
        out: &mut Outbox,
    ) -> bool {
        if view > self.view && self.status != Status::Recovering {
            self.learn_view(view, out);
        } else if view < self.view
            && self.status == Status::ViewChange
            && from == self.primary_of(view)
        {
            // The primary of an older view is alive and we hear it, but the
            // others kept it (they ignore our StartViewChange): ask it to
            // move up to our view, which cannot go back.
            let nonce = self.nonce;
            self.send(
                out,
                from,
                Body::RequestStartView(wire::RequestStartView { nonce }),
            );
        } else if self.status == Status::Recovering
            && view > self.view_seen_max
            && self.primary_of(view) != self.cfg.replica
        {
            // A primary of a newer view is talking: ask it now, once per view.
            self.view_seen_max = view;
            let nonce = self.nonce;
            let primary = self.primary_of(view);
            self.send(
                out,
                primary,
                Body::RequestStartView(wire::RequestStartView { nonce }),
            );
        }
        let ok = view == self.view && self.status == Status::Normal;
        if !ok {
            out.event(Event::Dropped {
                what,
                reason: "not normal in this view",
            });
        }
        ok
    }

    fn on_prepare(
        &mut self,
        from: u8,
        view: u32,
        op: u64,
        commit: u64,
        batch: BatchBytes,
        out: &mut Outbox,
    ) {
        if view < self.view {
            return self.on_prepare_inherited(from, view, op, batch, out);
        }
        if !self.in_normal_view("prepare", from, view, out) {
            return;
        }
        if self.is_primary() || from != self.primary_of(view) {
            return out.event(Event::Dropped {
                what: "prepare",
                reason: "not from the primary",
            });
        }
        self.start(T::PrimarySilent);
        let Some(header) = self.verify_batch(&batch, out) else {
            return;
        };
        if header.vsr_op != op || header.vsr_view != view {
            return out.event(Event::Dropped {
                what: "prepare",
                reason: "fields differ from batch",
            });
        }
        if op <= self.log.op() {
            self.on_prepare_held(op, commit, header.header_checksum, out);
        } else if self.log.links(&header) {
            // The commit first: a store rolls its segment only once its
            // whole tail is committed (`StoreConfig::uncommitted_headroom_bytes`),
            // so it must know the commit the prepare carries before it takes
            // the op; appended first, a backup's tail is never all committed
            // at an append and it never rolls.
            self.advance_commit(commit, out);
            self.append(header, batch, out);
        } else if op == self.log.op() + 1 {
            out.event(Event::Dropped {
                what: "prepare",
                reason: "does not link to the log",
            });
        } else {
            self.request_repair(from, op - 1, out);
        }
        self.advance_commit(commit, out);
    }

    /// A Prepare from an older view, resent by our primary for an op it
    /// inherited: re-ack it if we hold that very batch, else repair up to it.
    fn on_prepare_inherited(
        &mut self,
        from: u8,
        view: u32,
        op: u64,
        batch: BatchBytes,
        out: &mut Outbox,
    ) {
        let ours = self.status == Status::Normal
            && !self.is_primary()
            && from == self.primary_of(self.view);
        if !ours {
            let reason = "stale view";
            return out.event(Event::Dropped {
                what: "prepare",
                reason,
            });
        }
        let Some(header) = self.verify_batch(&batch, out) else {
            return;
        };
        if header.vsr_op != op || header.vsr_view != view {
            let reason = "fields differ from batch";
            return out.event(Event::Dropped {
                what: "prepare",
                reason,
            });
        }
        if op <= self.log.op() {
            self.on_prepare_held(op, 0, header.header_checksum, out);
        } else {
            self.request_repair(from, op, out);
        }
    }

    /// A Prepare for an op we hold: re-ack it (our ack may have been lost).
    fn on_prepare_held(&mut self, op: u64, commit: u64, checksum: u64, out: &mut Outbox) {
        match self.log.held(op) {
            Some((c, true)) if c == checksum && op > commit => {
                self.send_prepare_ok(op, checksum, out)
            }
            Some((c, _)) if c != checksum => out.event(Event::Dropped {
                what: "prepare",
                reason: "differs from held op",
            }),
            _ => {}
        }
    }

    /// Parses and checks a batch from a peer (body checksum included).
    pub(super) fn verify_batch(&self, batch: &BatchBytes, out: &mut Outbox) -> Option<BatchHeader> {
        let header = match BatchView::parse(batch) {
            Ok(view) => *view.header(),
            Err(_) => {
                out.event(Event::Dropped {
                    what: "batch",
                    reason: "invalid batch",
                });
                return None;
            }
        };
        if header.partition_id != self.cfg.partition_id || header.total_len() != batch.len() {
            out.event(Event::Dropped {
                what: "batch",
                reason: "wrong partition or length",
            });
            return None;
        }
        Some(header)
    }

    fn on_prepare_ok(&mut self, from: u8, view: u32, op: u64, checksum: u64, out: &mut Outbox) {
        if !self.in_normal_view("prepare_ok", from, view, out) {
            return;
        }
        if !self.is_primary() {
            return out.event(Event::Dropped {
                what: "prepare_ok",
                reason: "not primary",
            });
        }
        self.vote(from, op, checksum, out);
    }

    fn on_commit(&mut self, from: u8, view: u32, commit: u64, checksum: u64, out: &mut Outbox) {
        if !self.in_normal_view("commit", from, view, out) {
            return;
        }
        if self.is_primary() || from != self.primary_of(view) {
            return out.event(Event::Dropped {
                what: "commit",
                reason: "not from the primary",
            });
        }
        self.start(T::PrimarySilent);
        if self
            .log
            .checksum_at(commit)
            .is_some_and(|c| c != checksum && commit > 0)
        {
            return out.event(Event::Dropped {
                what: "commit",
                reason: "checksum differs",
            });
        }
        if commit > self.log.op() {
            self.request_repair(from, commit, out);
        }
        let stalled = commit == self.heartbeat_commit;
        self.heartbeat_commit = commit;
        self.advance_commit(commit, out);
        if stalled {
            // Commit did not move since the last heartbeat: our acks may
            // have been lost, and a primary that restarted holds no bytes
            // to re-prepare with, so re-ack what we hold.
            self.ack_uncommitted(commit, out);
        }
    }

    /// PrepareOk for every durable op above the primary's `commit` (ours
    /// may be ahead: a new primary can learn a commit only from acks),
    /// the log's base too: after an install or a purge it may be the only
    /// op we hold above that commit, and a primary rebooted without batch
    /// bytes cannot re-prepare it (sim seed 31009637).
    pub(super) fn ack_uncommitted(&mut self, commit: u64, out: &mut Outbox) {
        let base = self.log.base();
        let acks: Vec<(u64, u64)> = (base.op > commit)
            .then_some((base.op, base.checksum))
            .into_iter()
            .chain(
                self.log
                    .entries()
                    .filter(|e| e.durable && e.header.vsr_op > commit)
                    .map(|e| (e.header.vsr_op, e.header.header_checksum)),
            )
            .collect();
        debug_assert!(acks.windows(2).all(|w| w[0].0 < w[1].0));
        for (op, checksum) in acks {
            self.send_prepare_ok(op, checksum, out);
        }
    }

    /// Backup: learns `commit_max` and commits what its log holds of it.
    pub(super) fn advance_commit(&mut self, commit_max: u64, out: &mut Outbox) {
        self.commit_max = self.commit_max.max(commit_max);
        let verified = self.unverified_above.unwrap_or(u64::MAX);
        let target = self.commit_max.min(self.log.op()).min(verified);
        while self.commit < target {
            self.commit += 1;
            self.on_committed(self.commit, out);
        }
        self.acks.retain(|&op, _| op > self.commit);
        self.log.prune(self.commit, self.cfg.journal_ops_max);
        self.persist_commit_if_behind(out);
    }

    /// Keeps the superblock's commit within half a journal of the commit.
    /// A restarted replica starts from it; further behind, it could lead a
    /// view whose ops its backups pruned from their journals long ago (they
    /// re-ack only journal ops), and its commit would never advance.
    /// A cluster of one has no backups and restarts with its durable end as
    /// commit: a superblock write per half journal would only add a second
    /// fdatasync to its group commit.
    fn persist_commit_if_behind(&mut self, out: &mut Outbox) {
        if self.cfg.replica_count == 1 {
            return;
        }
        let lag_max = (self.cfg.journal_ops_max / 2) as u64;
        if self.commit >= self.durable.commit + lag_max {
            self.persist(out);
        }
    }

    /// Cuts every op above `op` (never a committed one).
    pub(super) fn truncate_to(&mut self, op: u64, out: &mut Outbox) {
        let op = if planted!(TruncateBelowCommit) {
            op.min(self.commit.saturating_sub(1))
                .max(self.log.base().op)
        } else {
            op
        };
        assert!(
            op >= self.commit || planted!(TruncateBelowCommit),
            "truncation at or below commit"
        );
        if !self.log.truncate_above(op) {
            return;
        }
        if self.unverified_above.is_some_and(|v| v >= op) {
            self.unverified_above = None;
        }
        if self.purge_op.is_some_and(|p| p > op) {
            self.purge_op = None;
        }
        let id = self.io(out, StorageOp::TruncateAbove { op });
        self.truncations.insert(id);
        for covered in self.flushes.values_mut() {
            *covered = (*covered).min(op);
        }
        self.acks.retain(|&o, _| o <= op);
        out.event(Event::Truncated { op });
    }
}
