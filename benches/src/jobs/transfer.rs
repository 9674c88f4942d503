//! The state-transfer job: a whole partition log moved from a source store
//! to an empty receiver store, both stores in this process on one io_uring
//! ring (one thread), through the code a replica uses: the transfer
//! machines ([`Server`], [`Receiver`]) over the pipelined executor
//! ([`Pipeline`]), so the serving side reads the next chunks while earlier
//! ones are on the wire and being written.
//!
//! Between the two machines runs an in-process delay line, not TCP: every
//! message (requests and replies) is held `delay` (one way) before it is
//! delivered, so a round trip costs twice that. The lockstep baseline
//! ([`Source::lockstep`]) is the design Apache Iggy ships: one 256 KiB
//! chunk requested at a time, read, sent back and written before the next
//! is asked for, over the same delay line.
//!
//! The source is filled once, un-timed, with batches built as the append
//! job builds them, and committed; the fill ends with an (un-timed)
//! snapshot open and release, which seals the active segment, so every
//! timed rep serves the same sealed segments. Each rep creates a fresh
//! receiver (un-timed) and times the transfer from the receiver's first
//! request to the committed install (index files, fdatasyncs, rename,
//! superblock).

use std::collections::{BTreeMap, VecDeque};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use ringlog_protocol::manifest::{Manifest, ManifestError, ManifestLimits};
use ringlog_protocol::replication::{ChunkKey, Offer, SnapshotOffer};
use ringlog_protocol::{restamp, Stamp};
use ringlog_shard::transfer::io::{Installs, Pipeline};
use ringlog_shard::transfer::{
    Budgets, Event, Fault, IoId, IoOutcome, Local, Message, Outbox, Output, Receiver,
    ReceiverConfig, ReceiverInput, Server, ServerConfig, ServerInput, ServingState, TransferOp,
    Trigger,
};
use ringlog_storage::io::uring::UringBackend;
use ringlog_storage::io::IoBackend;
use ringlog_storage::store::{InstallBudget, PartitionStore, StoreConfig, StoreError};
use ringlog_storage::superblock::VsrState;

use super::append::{build_batch, store_config_for, AppendError, RING_ENTRIES};
use crate::stats::{CpuMeter, LatencyRecorder, LatencySummary, RunSummary, Timeline};

/// Partition id of both stores (an install must be for the same partition).
const PARTITION_ID: u32 = 0;
/// The receiver is replica 0, the serving peer replica 1.
const RECEIVER: u8 = 0;
const SERVER: u8 = 1;
/// One machine tick (their timeouts are in ticks).
const TICK: Duration = Duration::from_millis(1);
/// The lockstep baseline's chunk: what Iggy requests at a time.
pub const LOCKSTEP_CHUNK_BYTES: u32 = 256 << 10;
/// A transfer that has not committed by then failed.
const TRANSFER_TIMEOUT: Duration = Duration::from_secs(600);
/// Receiver memory allowed beyond window x chunk size: the chunk being
/// copied into a staging buffer while the window's buffers are all held.
pub const RECEIVER_SLACK_CHUNKS: u64 = 1;

#[derive(Debug, thiserror::Error)]
pub enum TransferJobError {
    #[error(transparent)]
    Batch(#[from] AppendError),
    #[error("io_uring setup failed: {0}")]
    Ring(#[source] std::io::Error),
    #[error("creating the data directory failed: {0}")]
    Dir(#[source] std::io::Error),
    #[error("eventfd setup failed: {0}")]
    EventFd(#[source] std::io::Error),
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("decoding the manifest failed: {0}")]
    Manifest(#[from] ManifestError),
    #[error("the source store is empty after the fill")]
    EmptySource,
    #[error("transfer setup refused: {0}")]
    Setup(String),
    #[error("the transfer failed: {0}")]
    Failed(String),
    #[error("receiver memory {peak_bytes} bytes over its bound {bound_bytes} (window x chunk size + {RECEIVER_SLACK_CHUNKS} chunk)")]
    MemoryBound { peak_bytes: u64, bound_bytes: u64 },
}

#[derive(Debug, Clone)]
pub struct TransferConfig {
    /// The source store goes in `dir/src`, the receiver in `dir/dst`.
    pub dir: PathBuf,
    /// Batch bytes appended to the source (rounded up to whole batches).
    pub total_bytes: u64,
    pub segment_size: u64,
    /// StoreConfig::transfer_chunk_bytes, the same on both sides.
    pub chunk_size: u32,
    /// Chunks the receiver keeps requested, in flight or being written.
    pub window: usize,
    /// Encoded bytes of each batch of the fill.
    pub batch_size: usize,
    /// Value bytes of each record of the fill.
    pub record_size: usize,
    /// One-way delay of every message between the machines (in process).
    pub delay: Duration,
}

impl TransferConfig {
    pub fn source_dir(&self) -> PathBuf {
        self.dir.join("src")
    }

    pub fn receiver_dir(&self) -> PathBuf {
        self.dir.join("dst")
    }

    /// Batches the fill appends: `total_bytes` rounded up to whole batches.
    pub fn fill_batches(&self) -> u64 {
        self.total_bytes
            .max(1)
            .div_ceil(self.batch_size.max(1) as u64)
    }

    /// Both stores' config.
    pub fn store_config(&self) -> StoreConfig {
        StoreConfig {
            transfer_chunk_bytes: self.chunk_size,
            transfer_window_chunks: self.window.max(2),
            ..store_config_for(self.batch_size, self.segment_size)
        }
    }

    /// The lockstep baseline's stores: 256 KiB chunks, their own
    /// directories (`dir/lockstep-src`, `dir/lockstep-dst`).
    pub fn lockstep(&self) -> TransferConfig {
        TransferConfig {
            dir: self.dir.join("lockstep"),
            chunk_size: LOCKSTEP_CHUNK_BYTES,
            window: 1,
            ..self.clone()
        }
    }

    /// The receiver's budgets: the window, and timeouts far above any
    /// delay the job is run with (a re-request would be a failure here).
    fn budgets(&self, manifest_bytes: u64) -> Budgets {
        let delay_ticks = (self.delay.as_millis() as u64).max(1);
        let timeout_ticks = 10_000 + 20 * delay_ticks;
        Budgets {
            window_chunks: self.window.max(2),
            chunk_timeout_ticks: timeout_ticks,
            offer_timeout_ticks: timeout_ticks,
            stall_ticks_max: 3 * timeout_ticks,
            artifact_bytes_max: self.segment_size,
            total_bytes_max: manifest_bytes.max(1) * 2,
            chunk_size_bytes: self.chunk_size,
            ..Budgets::default()
        }
    }

    /// What the receiver may hold in chunk buffers.
    pub fn receiver_bound_bytes(&self) -> u64 {
        let chunk = u64::from(self.chunk_size);
        (self.window.max(2) as u64 + RECEIVER_SLACK_CHUNKS) * chunk
    }
}

/// Wall time of the parts of one timed transfer.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Phases {
    /// Request, offer and `begin_install`, up to the first chunk request.
    pub open: Duration,
    /// Every chunk requested, read, delivered and staged.
    pub chunks: Duration,
    /// `commit_install`: index files, fdatasyncs, rename,
    /// directory fsync and superblock.
    pub commit: Duration,
}

/// How a transfer ran.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// A window of chunk requests in flight (the transfer machines).
    Windowed,
    /// One chunk requested at a time (the baseline).
    Lockstep,
}

/// The result of one timed transfer.
#[derive(Debug, Clone)]
pub struct TransferResult {
    pub mode: Mode,
    /// bytes = artifact bytes, ios = chunks, runtime = first request ..
    /// install committed; lat = per chunk, its request sent to its staged
    /// write done.
    pub summary: RunSummary,
    pub artifacts: u32,
    /// Per chunk: the serving read of the request holding it.
    pub read_lat: LatencySummary,
    /// Per chunk: staging (verify + write) of the chunk.
    pub write_lat: LatencySummary,
    pub phases: Phases,
    pub chunk_size: u32,
    pub window: usize,
    pub delay: Duration,
    /// Peak chunk buffer bytes held by the receiver (its install's staging
    /// buffers: parked, being written, idle in its pool; plus delivered
    /// chunks not yet handed to storage), sampled after every step.
    pub receiver_peak_bytes: u64,
    /// window x chunk size + [`RECEIVER_SLACK_CHUNKS`] chunks.
    pub receiver_bound_bytes: u64,
    /// Chunks asked for again after a timeout (0 in a clean run).
    pub chunks_rerequested: u64,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// A non-blocking eventfd the ring signals when `reap` may have news.
struct Wake {
    fd: OwnedFd,
}

impl Wake {
    fn new() -> Result<Self, TransferJobError> {
        // SAFETY: plain syscall; the result is checked.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(TransferJobError::EventFd(std::io::Error::last_os_error()));
        }
        // SAFETY: eventfd returned a fresh descriptor nothing else owns.
        Ok(Self {
            fd: unsafe { OwnedFd::from_raw_fd(fd) },
        })
    }

    /// Sleeps until the eventfd is signalled or `timeout` passed, then
    /// clears it.
    fn wait(&self, timeout: Duration) {
        let mut pfd = libc::pollfd {
            fd: self.fd.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        let ts = libc::timespec {
            tv_sec: timeout.as_secs() as libc::time_t,
            tv_nsec: timeout.subsec_nanos() as libc::c_long,
        };
        // SAFETY: one valid pollfd, a valid timespec, no signal mask.
        let n = unsafe { libc::ppoll(&mut pfd, 1, &ts, std::ptr::null()) };
        if n > 0 {
            let mut counter = [0u8; 8];
            // SAFETY: reads 8 bytes into a valid buffer; EAGAIN is harmless.
            let _ = unsafe { libc::read(self.fd.as_raw_fd(), counter.as_mut_ptr().cast(), 8) };
        }
    }
}

/// The filled source store and the ring both stores run on, kept across
/// reps.
pub struct Source {
    io: UringBackend,
    wake: Wake,
    store: PartitionStore,
    /// Bytes of the sealed segments a snapshot serves.
    bytes: u64,
}

impl Source {
    /// Creates the source store in `cfg.source_dir()` (which must not exist)
    /// and appends [`TransferConfig::fill_batches`] batches to it, commits
    /// them, then seals the active segment. Un-timed.
    pub fn fill(cfg: &TransferConfig) -> Result<Source, TransferJobError> {
        let now = now_ms();
        let (mut batch, _) = build_batch(PARTITION_ID, cfg.batch_size, cfg.record_size, now)?;
        // The lockstep source lives a level down (`dir/lockstep/src`).
        std::fs::create_dir_all(&cfg.dir).map_err(TransferJobError::Dir)?;
        let mut io = UringBackend::new(RING_ENTRIES).map_err(TransferJobError::Ring)?;
        let wake = Wake::new()?;
        io.register_eventfd(wake.fd.as_raw_fd())
            .map_err(TransferJobError::Ring)?;
        let mut store =
            PartitionStore::create(&mut io, &cfg.source_dir(), PARTITION_ID, cfg.store_config())?;
        let ops = cfg.fill_batches();
        for op in 1..=ops {
            let stamp = Stamp {
                base_offset: store.next_offset(),
                vsr_op: op,
                vsr_view: 0,
                prev_checksum: store.last_checksum(),
            };
            restamp(&mut batch, &stamp).map_err(AppendError::from)?;
            // Flushes by itself whenever the write buffer fills.
            store.append(&mut io, &batch)?;
        }
        store.flush(&mut io)?;
        // Committed: a replica serves only what is at or below its commit.
        store.note_commit(ops);
        let vsr = VsrState {
            view: 0,
            log_view: 0,
            commit: ops,
            op: ops,
            wiped: false,
            view_lost: false,
        };
        store.set_vsr(&mut io, vsr)?;
        // Seal the active segment now, so no timed rep pays for the roll.
        let manifest = store.open_snapshot(&mut io, now_ms())?;
        store.release_snapshot(manifest.snapshot_id);
        let bytes = manifest.total_length_bytes();
        if bytes == 0 {
            return Err(TransferJobError::EmptySource);
        }
        Ok(Source {
            io,
            wake,
            store,
            bytes,
        })
    }

    /// Bytes one transfer moves.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Checkpoints and closes the source store.
    pub fn close(self) -> Result<(), TransferJobError> {
        let Source { mut io, store, .. } = self;
        store.close(&mut io)?;
        Ok(())
    }

    /// Creates an empty receiver in `cfg.receiver_dir()` (which must not
    /// exist; un-timed) on the source's ring.
    fn receiver(&mut self, cfg: &TransferConfig) -> Result<PartitionStore, TransferJobError> {
        Ok(PartitionStore::create(
            &mut self.io,
            &cfg.receiver_dir(),
            PARTITION_ID,
            cfg.store_config(),
        )?)
    }

    /// The windowed transfer into a fresh receiver (timed), which is then
    /// closed (un-timed); its directory is left for the caller to remove.
    pub fn transfer(&mut self, cfg: &TransferConfig) -> Result<TransferResult, TransferJobError> {
        let mut receiver = self.receiver(cfg)?;
        let result = Run::new(self, cfg)?.drive(self, &mut receiver);
        receiver.close(&mut self.io)?;
        let result = result?;
        if result.receiver_peak_bytes > result.receiver_bound_bytes {
            return Err(TransferJobError::MemoryBound {
                peak_bytes: result.receiver_peak_bytes,
                bound_bytes: result.receiver_bound_bytes,
            });
        }
        Ok(result)
    }
}

/// Which machine an input is for.
enum Input {
    Receiver(ReceiverInput),
    Server(ServerInput),
}

/// One windowed transfer: both machines, their pipelines and the delay
/// line between them, driven on the source's thread and ring.
struct Run {
    cfg: TransferConfig,
    receiver: Receiver,
    server: Server,
    serving: ServingState,
    rx_pipe: Pipeline,
    srv_pipe: Pipeline,
    installs: Installs,
    /// Messages on the wire: (deliver at, to, message), in send order (one
    /// delay for all, so the front is due first).
    line: VecDeque<(Instant, u8, Message)>,
    inputs: VecDeque<Input>,
    out: Outbox,
    /// Per chunk: when its request was sent.
    requested: BTreeMap<(u32, u32), Instant>,
    /// Serving reads in flight: started at, chunks.
    reads: BTreeMap<IoId, (Instant, usize)>,
    /// Staging ops in flight: started at, chunks, bytes.
    stages: BTreeMap<IoId, (Instant, Vec<ChunkKey>, u64)>,
    lat: LatencyRecorder,
    read_lat: LatencyRecorder,
    write_lat: LatencyRecorder,
    timeline: Timeline,
    staged_bytes: u64,
    chunks: u64,
    /// Artifacts of the offer taken.
    artifacts: u32,
    peak_bytes: u64,
    first_request: Option<Instant>,
    commit_started: Option<Instant>,
    installed: Option<Instant>,
    failure: Option<String>,
}

impl Run {
    fn new(source: &Source, cfg: &TransferConfig) -> Result<Self, TransferJobError> {
        let setup = |e: &dyn std::fmt::Display| TransferJobError::Setup(e.to_string());
        let budgets = cfg.budgets(source.bytes);
        let rx_cfg = ReceiverConfig {
            replica_count: 2,
            replica: RECEIVER,
            budgets,
        };
        let receiver = Receiver::new(rx_cfg, now_ms() | 1).map_err(|e| setup(&e))?;
        let window = cfg.window.max(2);
        let server = Server::new(ServerConfig {
            snapshots_max: 1,
            lease_ticks: budgets.stall_ticks_max,
            reads_keys_max: window,
        });
        let commit = source.store.commit_known();
        let window_bytes = u64::from(cfg.chunk_size) * window as u64;
        let start = Instant::now();
        Ok(Run {
            cfg: cfg.clone(),
            receiver,
            server,
            serving: ServingState {
                available: true,
                normal: true,
                commit,
                commit_max: commit,
            },
            rx_pipe: Pipeline::new(cfg.chunk_size, 0),
            srv_pipe: Pipeline::new(cfg.chunk_size, window),
            installs: Installs::new(1, InstallBudget::new(window_bytes)),
            line: VecDeque::new(),
            inputs: VecDeque::new(),
            out: Outbox::new(),
            requested: BTreeMap::new(),
            reads: BTreeMap::new(),
            stages: BTreeMap::new(),
            lat: LatencyRecorder::new(),
            read_lat: LatencyRecorder::new(),
            write_lat: LatencyRecorder::new(),
            timeline: Timeline::starting(start),
            staged_bytes: 0,
            chunks: 0,
            artifacts: 0,
            peak_bytes: 0,
            first_request: None,
            commit_started: None,
            installed: None,
            failure: None,
        })
    }

    /// Runs the transfer into `dst` to its commit.
    fn drive(
        mut self,
        src: &mut Source,
        dst: &mut PartitionStore,
    ) -> Result<TransferResult, TransferJobError> {
        let d = dst.durable();
        let local = Local {
            partition_id: PARTITION_ID,
            view: 0,
            commit: dst.superblock().vsr.commit,
            purge_generation: dst.superblock().purge_generation,
            frontier: ringlog_shard::transfer::Frontier {
                next_offset: d.next_offset,
                last_op: d.last_op,
                last_checksum: d.last_checksum,
            },
        };
        let cpu = CpuMeter::start();
        let start = Instant::now();
        self.timeline = Timeline::starting(start);
        let mut next_tick = start + TICK;
        self.inputs.push_back(Input::Receiver(ReceiverInput::Start {
            trigger: Trigger::NewOrWiped,
            local,
        }));
        self.pump(src, dst);
        while self.installed.is_none() {
            if let Some(why) = self.failure.take() {
                return Err(TransferJobError::Failed(why));
            }
            if start.elapsed() > TRANSFER_TIMEOUT {
                return Err(TransferJobError::Failed("no install within 600 s".into()));
            }
            let now = Instant::now();
            let mut progressed = self.deliver(now);
            for (batch, completions) in src.io.reap() {
                self.route(src, dst, batch, completions);
                progressed = true;
            }
            while now >= next_tick {
                self.inputs.push_back(Input::Receiver(ReceiverInput::Tick));
                self.inputs.push_back(Input::Server(ServerInput::Tick));
                next_tick += TICK;
            }
            self.pump(src, dst);
            if !progressed {
                let due = self.line.front().map_or(next_tick, |m| m.0.min(next_tick));
                src.wake.wait(due.saturating_duration_since(Instant::now()));
            }
        }
        let cpu = cpu.usage();
        self.settle(src, dst)?;
        Ok(self.result(start, cpu))
    }

    /// After the commit (un-timed): delivers what is still on the line (the
    /// receiver's ReleaseSnapshot) and finishes the I/O in flight, so the
    /// source holds no snapshot into the next rep.
    fn settle(
        &mut self,
        src: &mut Source,
        dst: &mut PartitionStore,
    ) -> Result<(), TransferJobError> {
        let deadline = Instant::now() + TRANSFER_TIMEOUT;
        while !self.line.is_empty() || self.srv_pipe.in_flight() + self.rx_pipe.in_flight() > 0 {
            if Instant::now() > deadline {
                return Err(TransferJobError::Failed(
                    "the transfer did not settle".into(),
                ));
            }
            self.deliver(deadline);
            for (batch, completions) in src.io.reap() {
                self.route(src, dst, batch, completions);
            }
            self.pump(src, dst);
            src.wake.wait(TICK);
        }
        match src.store.snapshots_open() {
            0 => Ok(()),
            n => Err(TransferJobError::Failed(format!(
                "{n} snapshots still open on the source after the transfer"
            ))),
        }
    }

    /// Delivers the messages due by `now`.
    fn deliver(&mut self, now: Instant) -> bool {
        let mut any = false;
        while self.line.front().is_some_and(|m| m.0 <= now) {
            let Some((_, to, msg)) = self.line.pop_front() else {
                break;
            };
            let from = if to == SERVER { RECEIVER } else { SERVER };
            self.inputs.push_back(if to == SERVER {
                Input::Server(ServerInput::Message {
                    from,
                    msg,
                    state: self.serving,
                })
            } else {
                Input::Receiver(ReceiverInput::Message { from, msg })
            });
            any = true;
        }
        any
    }

    /// Hands a reaped batch to the pipeline that queued it.
    fn route(
        &mut self,
        src: &mut Source,
        dst: &mut PartitionStore,
        batch: ringlog_storage::io::BatchId,
        completions: Vec<ringlog_storage::io::Completion>,
    ) {
        let mut done = Vec::new();
        if self.srv_pipe.owns(batch) {
            self.srv_pipe.complete(
                &mut src.store,
                &mut src.io,
                &mut self.installs,
                (batch, completions),
                now_ms(),
                &mut done,
            );
            self.server_done(done);
        } else if self.rx_pipe.owns(batch) {
            self.rx_pipe.complete(
                dst,
                &mut src.io,
                &mut self.installs,
                (batch, completions),
                now_ms(),
                &mut done,
            );
            self.receiver_done(done);
        } else {
            self.failure = Some(format!("batch {} has no owner", batch.0));
        }
    }

    fn server_done(&mut self, done: Vec<(IoId, Result<IoOutcome, Fault>)>) {
        for (id, result) in done {
            if let Some((at, n)) = self.reads.remove(&id) {
                for _ in 0..n {
                    self.read_lat.record(at.elapsed());
                }
            }
            self.inputs
                .push_back(Input::Server(ServerInput::IoDone { id, result }));
        }
    }

    fn receiver_done(&mut self, done: Vec<(IoId, Result<IoOutcome, Fault>)>) {
        let now = Instant::now();
        for (id, result) in done {
            if let Some((at, keys, bytes)) = self.stages.remove(&id) {
                if result.is_ok() {
                    self.timeline.record(now, bytes);
                    self.staged_bytes += bytes;
                    self.chunks += keys.len() as u64;
                    for k in keys {
                        self.write_lat.record(now - at);
                        if let Some(asked) = self.requested.remove(&(k.artifact, k.chunk)) {
                            self.lat.record(now - asked);
                        }
                    }
                }
            }
            self.inputs
                .push_back(Input::Receiver(ReceiverInput::IoDone { id, result }));
        }
    }

    /// Steps the machines until no input is left.
    fn pump(&mut self, src: &mut Source, dst: &mut PartitionStore) {
        while let Some(input) = self.inputs.pop_front() {
            let side = match input {
                Input::Receiver(i) => {
                    self.receiver.step(i, &mut self.out);
                    RECEIVER
                }
                Input::Server(i) => {
                    self.server.step(i, &mut self.out);
                    SERVER
                }
            };
            let outputs: Vec<Output> = self.out.drain().collect();
            for output in outputs {
                match output {
                    Output::Send { to, msg } => self.send(to, msg),
                    Output::Io { id, op } if side == SERVER => self.serve_io(src, id, op),
                    Output::Io { id, op } => self.receive_io(src, dst, id, op),
                    Output::Event(e) => self.event(e),
                }
            }
        }
    }

    fn send(&mut self, to: u8, msg: Message) {
        let now = Instant::now();
        match &msg {
            Message::RequestChunks(r) => {
                self.first_request.get_or_insert(now);
                for k in &r.keys {
                    self.requested.entry((k.artifact, k.chunk)).or_insert(now);
                }
            }
            Message::SnapshotOffer(SnapshotOffer {
                offer: Offer::Snapshot(m),
                ..
            }) => self.artifacts = m.artifacts.len() as u32,
            _ => {}
        }
        self.line.push_back((now + self.cfg.delay, to, msg));
    }

    fn serve_io(&mut self, src: &mut Source, id: IoId, op: TransferOp) {
        if let TransferOp::ReadChunks { keys, .. } = &op {
            self.reads.insert(id, (Instant::now(), keys.len()));
        }
        let mut done = Vec::new();
        self.srv_pipe.start(
            &mut src.store,
            &mut src.io,
            &mut self.installs,
            (id, &op),
            now_ms(),
            &mut done,
        );
        self.server_done(done);
    }

    fn receive_io(&mut self, src: &mut Source, dst: &mut PartitionStore, id: IoId, op: TransferOp) {
        let mut held_bytes = 0;
        match &op {
            TransferOp::AcceptChunks { chunks } => {
                let keys = chunks.iter().map(|(k, _)| *k).collect();
                held_bytes = chunks.iter().map(|(_, d)| d.len() as u64).sum();
                self.stages.insert(id, (Instant::now(), keys, held_bytes));
            }
            TransferOp::CommitInstall => self.commit_started = Some(Instant::now()),
            _ => {}
        }
        let mut done = Vec::new();
        self.rx_pipe.start(
            dst,
            &mut src.io,
            &mut self.installs,
            (id, &op),
            now_ms(),
            &mut done,
        );
        // Measured while the delivered chunk is still alive beside the
        // staging buffer it was copied into.
        let held = self.installs.buffered_bytes() + held_bytes;
        self.peak_bytes = self.peak_bytes.max(held);
        drop(op);
        self.receiver_done(done);
    }

    fn event(&mut self, e: Event) {
        match e {
            Event::Installed { .. } => self.installed = Some(Instant::now()),
            Event::AttemptFailed { reason, .. } => self.failure = Some(reason.to_owned()),
            Event::OfferRefused { why, .. } => {
                self.failure = Some(format!("offer refused: {why:?}"))
            }
            _ => {}
        }
    }

    fn result(self, start: Instant, cpu: crate::stats::CpuUsage) -> TransferResult {
        let end = self.installed.unwrap_or_else(Instant::now);
        let opened = self.first_request.unwrap_or(start);
        let committing = self.commit_started.unwrap_or(end);
        let artifacts = self.artifacts;
        TransferResult {
            mode: Mode::Windowed,
            summary: RunSummary::from_counts(
                self.staged_bytes,
                self.chunks,
                end - start,
                self.lat.summary(),
            )
            .with_cpu(cpu)
            .with_timeline(self.timeline),
            artifacts,
            read_lat: self.read_lat.summary(),
            write_lat: self.write_lat.summary(),
            phases: Phases {
                open: opened - start,
                chunks: committing - opened,
                commit: end - committing,
            },
            chunk_size: self.cfg.chunk_size,
            window: self.cfg.window.max(2),
            delay: self.cfg.delay,
            receiver_peak_bytes: self.peak_bytes,
            receiver_bound_bytes: self.cfg.receiver_bound_bytes(),
            chunks_rerequested: self.receiver.counters().chunks_rerequested,
        }
    }
}

impl Source {
    /// The lockstep baseline into a fresh receiver (timed), on the same
    /// delay line: for each 256 KiB chunk in turn, the request travels
    /// `delay`, the chunk is read, travels `delay` back and is verified
    /// and written; then the next is asked for. The source must have been
    /// filled with [`TransferConfig::lockstep`]'s config.
    pub fn lockstep(&mut self, cfg: &TransferConfig) -> Result<TransferResult, TransferJobError> {
        let mut receiver = self.receiver(cfg)?;
        let result = self.lockstep_into(cfg, &mut receiver);
        receiver.close(&mut self.io)?;
        result
    }

    fn lockstep_into(
        &mut self,
        cfg: &TransferConfig,
        receiver: &mut PartitionStore,
    ) -> Result<TransferResult, TransferJobError> {
        let (mut lat, mut read_lat, mut write_lat) = (
            LatencyRecorder::new(),
            LatencyRecorder::new(),
            LatencyRecorder::new(),
        );
        let (io, source) = (&mut self.io, &mut self.store);
        let cpu = CpuMeter::start();
        let start = Instant::now();
        let mut timeline = Timeline::starting(start);
        // RequestSnapshot out, the offer back.
        std::thread::sleep(cfg.delay);
        let manifest = source.open_snapshot(io, now_ms())?;
        let offer = Manifest::decode(&manifest.encode(), &ManifestLimits::default())?;
        std::thread::sleep(cfg.delay);
        let budget = InstallBudget::new(u64::from(cfg.chunk_size) * 2);
        let mut install = receiver.begin_install(io, offer, &budget)?;
        let opened = Instant::now();
        let missing: Vec<(u32, u32)> = install.missing().collect();
        let mut peak_bytes = 0u64;
        for &(artifact, chunk) in &missing {
            let asked = Instant::now();
            std::thread::sleep(cfg.delay);
            let t = Instant::now();
            let buf = source.read_chunk(io, manifest.snapshot_id, artifact, chunk, now_ms())?;
            read_lat.record(t.elapsed());
            std::thread::sleep(cfg.delay);
            let t = Instant::now();
            install.accept_chunk(io, artifact, chunk, &buf)?;
            let now = Instant::now();
            peak_bytes = peak_bytes.max(install.buffered_bytes() + buf.len() as u64);
            write_lat.record(now - t);
            lat.record(now - asked);
            timeline.record(now, buf.len() as u64);
        }
        let chunks_done = Instant::now();
        receiver.commit_install(io, install)?;
        let end = Instant::now();
        let cpu = cpu.usage();
        source.release_snapshot(manifest.snapshot_id);
        Ok(TransferResult {
            mode: Mode::Lockstep,
            summary: RunSummary::from_counts(
                manifest.total_length_bytes(),
                missing.len() as u64,
                end - start,
                lat.summary(),
            )
            .with_cpu(cpu)
            .with_timeline(timeline),
            artifacts: manifest.artifacts.len() as u32,
            read_lat: read_lat.summary(),
            write_lat: write_lat.summary(),
            phases: Phases {
                open: opened - start,
                chunks: chunks_done - opened,
                commit: end - chunks_done,
            },
            chunk_size: cfg.chunk_size,
            window: 1,
            delay: cfg.delay,
            receiver_peak_bytes: peak_bytes,
            receiver_bound_bytes: cfg.receiver_bound_bytes(),
            chunks_rerequested: 0,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> TransferConfig {
        TransferConfig {
            dir: PathBuf::from("d"),
            total_bytes: 512 << 20,
            segment_size: 256 << 20,
            chunk_size: 1 << 20,
            window: 4,
            batch_size: 1 << 20,
            record_size: 1024,
            delay: Duration::ZERO,
        }
    }

    #[test]
    fn fill_rounds_up_to_whole_batches() {
        let mut c = cfg();
        assert_eq!(c.fill_batches(), 512);
        c.total_bytes = (512 << 20) + 1;
        assert_eq!(c.fill_batches(), 513);
        c.total_bytes = 1;
        assert_eq!(c.fill_batches(), 1);
    }

    #[test]
    fn both_stores_use_the_chunk_size_and_a_valid_config() {
        let mut c = cfg();
        c.chunk_size = 256 << 10;
        let sc = c.store_config();
        assert_eq!(sc.transfer_chunk_bytes, 256 << 10);
        assert_eq!(sc.segment_size_bytes, 256 << 20);
        assert!(sc.batch_bytes_max() >= c.batch_size);
        assert!(sc.validate().is_ok());
        c.segment_size = 4 << 20;
        assert!(c.store_config().validate().is_ok());
    }

    /// A real transfer on the repo's filesystem (O_DIRECT), two reps into
    /// fresh receivers, then the lockstep pull of the same log.
    #[test]
    fn transfers_every_byte_of_the_source() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let c = TransferConfig {
            dir: tmp.path().to_owned(),
            total_bytes: 6 << 20,
            segment_size: 2 << 20,
            chunk_size: 256 << 10,
            window: 3,
            batch_size: 64 << 10,
            record_size: 1024,
            delay: Duration::ZERO,
        };
        let mut source = Source::fill(&c).unwrap();
        assert_eq!(source.bytes(), 6 << 20);
        for _ in 0..2 {
            let r = source.transfer(&c).unwrap();
            assert_eq!(r.mode, Mode::Windowed);
            assert_eq!(r.summary.bytes, 6 << 20);
            assert_eq!(r.artifacts, 3);
            assert_eq!(r.summary.ios, 24);
            assert_eq!(r.summary.lat.samples, 24);
            assert_eq!(r.read_lat.samples, 24);
            assert_eq!(r.write_lat.samples, 24);
            assert_eq!(r.chunks_rerequested, 0);
            assert!(r.summary.runtime >= r.phases.chunks);
            // Measured: the window's buffers were all in use at some point.
            assert!(r.receiver_peak_bytes >= 2 * (256 << 10));
            assert!(r.receiver_peak_bytes <= r.receiver_bound_bytes);
            assert_eq!(r.receiver_bound_bytes, 4 * (256 << 10));
            // The receiver's release reached the server: no snapshot is
            // left to pile up over the reps (they did, once 4 were open).
            assert_eq!(source.store.snapshots_open(), 0);
            std::fs::remove_dir_all(c.receiver_dir()).unwrap();
        }
        let l = TransferConfig {
            dir: c.dir.clone(),
            ..c.lockstep()
        };
        let r = source.lockstep(&l).unwrap();
        assert_eq!(r.mode, Mode::Lockstep);
        assert_eq!(r.summary.bytes, 6 << 20);
        assert_eq!(r.summary.ios, 24);
        std::fs::remove_dir_all(l.receiver_dir()).unwrap();
        source.close().unwrap();
    }

    /// The delay line holds every message: with 10 ms each way a windowed
    /// transfer of 16 chunks takes at least the offer's and a window's
    /// round trips, the lockstep pull at least 16 round trips. The delay is
    /// long beside the I/O of 4 MiB, so the windowed run stays the shorter
    /// one on a loaded machine (at 3 ms it once did not).
    #[test]
    fn the_delay_line_delays_both_ways() {
        let tmp = tempfile::tempdir_in(env!("CARGO_MANIFEST_DIR")).unwrap();
        let c = TransferConfig {
            dir: tmp.path().to_owned(),
            total_bytes: 4 << 20,
            segment_size: 2 << 20,
            chunk_size: 256 << 10,
            window: 4,
            batch_size: 64 << 10,
            record_size: 1024,
            delay: Duration::from_millis(10),
        };
        let mut source = Source::fill(&c).unwrap();
        let w = source.transfer(&c).unwrap();
        std::fs::remove_dir_all(c.receiver_dir()).unwrap();
        let rtt = 2 * c.delay;
        assert_eq!(w.summary.ios, 16);
        // Snapshot request + offer, then 16 chunks at most 4 per trip.
        assert!(w.summary.runtime >= rtt * 5, "{:?}", w.summary.runtime);
        assert!(
            w.summary.lat.min_ns >= rtt.as_nanos() as u64,
            "a chunk costs a round trip"
        );
        let l = TransferConfig {
            dir: c.dir.clone(),
            ..c.lockstep()
        };
        let s = source.lockstep(&l).unwrap();
        assert!(s.summary.runtime >= rtt * 17, "{:?}", s.summary.runtime);
        assert!(s.summary.runtime > w.summary.runtime);
        source.close().unwrap();
    }
}
