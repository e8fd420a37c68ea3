//! The machine manager's loop. It acts only at heartbeat boundaries: every timeslice it
//!
//! 1. takes the requests that arrived on the control socket;
//! 2. answers NM registrations and welcomes nodes into the heartbeat (see [`membership`]);
//! 3. follows program transfers (Algorithm 6 runs in worker threads; the MM checks each
//!    node's acknowledgement with COMPARE-AND-WRITE);
//! 4. asks the scheduling policy (FCFS, EASY backfilling or gang) what to start and, under gang
//!    scheduling, which jobs run in this timeslice; enforces time limits;
//! 5. escalates cancellations from SIGTERM to SIGKILL;
//! 6. issues the heartbeat with the commands due and, under gang scheduling, the schedule of
//!    the timeslice (the strobe; Algorithm 4), and detects failed nodes from heartbeats that
//!    do not arrive (see [`failure`]);
//! 7. forwards the tasks' output to storm-submit;
//! 8. detects terminations (Algorithm 8) and tells storm-submit how its job ended.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use storm_cluster::control::{
    self, JobInfo, JobOutcome, JobRequest, NodeInfo, Reply, Request, Timing,
};
use storm_cluster::endpoint::{self, Listen};
use storm_cluster::identity::MmSigner;
use storm_cluster::keywatch::{Due, KeyWatch};
use storm_cluster::messages::{
    Command, FileInfo, Heartbeat, JobId, JobUsage, LaunchSpec, MpiMode, NodeReport, OutputChunk,
    Program, decode_sealed, encode, file_ack,
};
use storm_cluster::tasks::TaskPlan;
use storm_cluster::{ClusterConfig, RmLayout};
use storm_primitives::helpers::{QueueConsumer, QueueProducer, epoch_base};
use storm_primitives::{NodeId, NodeSet, PrimError, Primitives, Relation, Wait};

mod attention;
mod failure;
mod membership;
mod output;
mod pmi;
mod restart;
mod saver;

use crate::control_server::{self, ClientId, Incoming};
use crate::env::{DaemonEnv, MmEnv};
use crate::journal::{JobRecord, JobState, Journal, Restored};
use crate::log_limit::LogLimit;
use crate::metrics::Metrics;
use crate::nodes::NodeTable;
use crate::policy::{Decision, JobAsk, Need, Placement, Policy, PolicyKind};
use crate::transfer::{Transfer, TransferDone};

/// How often a submitter hears how far its program transfer is.
const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

/// How to start a machine manager.
pub struct MmOptions {
    pub config: ClusterConfig,
    pub listen: Listen,
    /// Set to stop the MM (signal handlers set it).
    pub stop: Arc<AtomicBool>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Phase {
    Queued,
    /// Nodes allocated; the program transfer waits for a worker or for its nodes to finish
    /// another job's transfer (each node has one chunk queue).
    Allocated,
    /// A worker is sending the program.
    Sending {
        transfer: u32,
        worker: usize,
    },
    /// Sent; waiting for every node's acknowledgement.
    Verifying {
        transfer: u32,
    },
    /// Ready to launch; the launch waits until the journal holds the record saying the job
    /// started (write-ahead: a restarted MM must know of any job whose tasks may run). `batch`
    /// is the commit that writes that record, once it is handed to the journal.
    Recording {
        batch: Option<u64>,
    },
    /// The launch command is waiting for the next heartbeat.
    Launching,
    Running,
    /// Ran when the MM restarted: waiting for its nodes to register and say they still hold
    /// it (see [`restart`]).
    Recovering,
}

impl Phase {
    /// Whether the job's launch has gone out, so that some of its tasks may run.
    fn started(self) -> bool {
        matches!(self, Phase::Running | Phase::Recovering)
    }

    /// Whether the job's launch may go now: the commit recording its start is among those
    /// settled (up to batch `settled`).
    fn may_launch(self, settled: u64) -> bool {
        matches!(self, Phase::Recording { batch: Some(b) } if b <= settled)
    }
}

struct Cancel {
    reason: String,
    since: Instant,
    killed: bool,
}

struct Job {
    id: JobId,
    uid: u32,
    gid: u32,
    req: JobRequest,
    plan: TaskPlan,
    /// The descriptor of the program storm-submit passed (`--bcast`), held only until its
    /// copy beside the journal is made (or, for a job that starts at once and is never
    /// requeued, until it is sent): the MM holds no descriptor per waiting job.
    program: Option<File>,
    /// The program's size as checked against the limits at submission: exactly this much is
    /// copied and sent.
    size: u64,
    /// The BLAKE3 hash of the program as it was sent: its launch carries it, sealed.
    program_hash: Option<[u8; 32]>,
    client: Option<ClientId>,
    phase: Phase,
    nodes: NodeSet,
    /// The CPUs it holds of its one node, when it shares the node with other jobs.
    cpus: Option<NodeSet>,
    slot: Option<usize>,
    submitted: Instant,
    /// `submitted` as wall-clock time (milliseconds since the Unix epoch), for the journal.
    submitted_ms: u64,
    /// A copy of the program is in the journal's state directory.
    program_saved: bool,
    /// Copying the program there failed (logged); it is not tried again.
    program_save_failed: bool,
    allocated: Option<Instant>,
    ready: Option<Instant>,
    launched: Option<Instant>,
    /// When its tasks ran, as its nodes reported (for the outcome's timing).
    ran: RanAt,
    /// `launched` as wall-clock time (milliseconds since the Unix epoch), for the journal.
    launched_ms: Option<u64>,
    cancel: Option<Cancel>,
    worker_cancel: Option<Arc<AtomicBool>>,
    /// While the program is sent: bytes delivered to every node, and what was last reported
    /// to the submitter (when, how much).
    transfer_progress: Option<(Arc<AtomicU64>, Instant, u64)>,
    terminating: bool,
    /// Row of the gang scheduler's matrix.
    time_slot: usize,
    limit: Option<Duration>,
    /// While `Recovering`: what its nodes said so far.
    recovery: Option<restart::Recovery>,
    /// Restored from the journal after a restart of the MM: its submitter may reattach.
    restored: bool,
    /// Output taken from the nodes' queues while the restored job's submitter has not
    /// reattached yet: (node, queue entry, chunk), sent when it does.
    held_output: Vec<(NodeId, u64, OutputChunk)>,
    /// MPI: the last PMI fence whose result went to the job's nodes.
    pmi_epoch: u32,
    /// MPI: the exit code a rank asked the job to end with (`MPI_Abort`).
    abort_code: Option<i32>,
}

/// When a job's tasks ran, over its nodes' reports: microseconds after each node took the
/// launch heartbeat.
#[derive(Debug, Default, Clone, Copy)]
struct RanAt {
    first_started_us: Option<u64>,
    last_exited_us: Option<u64>,
    /// What its processes used: CPU time summed over its nodes, the largest peak memory
    /// of any node (each known only where some node's cgroup told it).
    usage: JobUsage,
}

impl RanAt {
    fn add(&mut self, t: &storm_cluster::messages::NodeTiming) {
        self.first_started_us = match (self.first_started_us, t.first_started_us) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        };
        self.last_exited_us = self.last_exited_us.max(t.last_exited_us);
        let u = &mut self.usage;
        u.cpu_us = match (u.cpu_us, t.usage.cpu_us) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
        u.peak_memory_bytes = u.peak_memory_bytes.max(t.usage.peak_memory_bytes);
    }

    /// First task started to last task ended.
    fn run_us(&self) -> u64 {
        match (self.first_started_us, self.last_exited_us) {
            (Some(first), Some(last)) => last.saturating_sub(first),
            _ => 0,
        }
    }
}

/// What a new job (or one restored from the journal) starts with.
struct NewJob {
    id: JobId,
    uid: u32,
    gid: u32,
    req: JobRequest,
    plan: TaskPlan,
    program: Option<File>,
    /// The program's size, checked against the limits (0 without one).
    size: u64,
    client: Option<ClientId>,
    submitted: Instant,
    submitted_ms: u64,
}

impl Job {
    /// A job waiting in the queue.
    fn queued(new: NewJob) -> Self {
        let size = new.size;
        Self {
            id: new.id,
            uid: new.uid,
            gid: new.gid,
            plan: new.plan,
            program: new.program,
            size,
            program_hash: None,
            client: new.client,
            phase: Phase::Queued,
            nodes: NodeSet::new(),
            cpus: None,
            slot: None,
            submitted: new.submitted,
            submitted_ms: new.submitted_ms,
            program_saved: false,
            program_save_failed: false,
            allocated: None,
            ready: None,
            launched: None,
            ran: RanAt::default(),
            launched_ms: None,
            cancel: None,
            worker_cancel: None,
            transfer_progress: None,
            terminating: false,
            time_slot: 0,
            limit: new.req.time_limit_ms.map(Duration::from_millis),
            recovery: None,
            restored: false,
            held_output: Vec::new(),
            pmi_epoch: 0,
            abort_code: None,
            req: new.req,
        }
    }

    /// The launch command of this started job (it has a job slot).
    fn launch_spec(&self) -> LaunchSpec {
        let mut spec = launch_spec(
            self.id,
            self.slot.expect("started jobs have a slot"),
            &self.req,
            &self.plan,
            &self.nodes,
            (self.uid, self.gid),
        );
        spec.program_hash = self.program_hash;
        spec
    }
}

/// Bytes a heartbeat keeps free for its seal (an ed25519 signature, a time, framing).
pub const SEAL_ROOM: usize = 128;

/// The heartbeat whose transfer has not completed yet.
struct InFlight {
    /// The heartbeat as sent, sent again as it is if it fails.
    bytes: Bytes,
    issued: Instant,
}

struct Client {
    uid: u32,
    gid: u32,
    tx: Sender<Reply>,
    /// Replies queued for this client so far (the outbox numbers them in order).
    queued: u64,
    /// Replies written to its socket so far (counted by its writer thread).
    written: Arc<AtomicU64>,
    /// Its replies other than output that may not be written yet, by number, with their size
    /// (output is flow-controlled end to end, see `output`; these are bounded by
    /// `[limits] max_unread_reply_bytes`).
    unread: VecDeque<(u64, u64)>,
    /// The bytes of the replies in `unread`.
    unread_bytes: u64,
    /// Its connection, to close when it breaks that limit.
    closer: std::os::unix::net::UnixStream,
}

/// What a machine manager is made of, besides its environment: everything the host opened.
pub struct MmParts {
    pub config: ClusterConfig,
    pub rm: RmLayout,
    /// This node's primitives endpoint (the MM's node id is `config.mm_id()`).
    pub fabric: Arc<dyn Primitives>,
    /// The journal, and what it held when opened.
    pub journal: Journal,
    pub restored: Restored,
    /// Which MM process this is (see [`incarnation`]); a simulation numbers its restarts.
    pub incarnation: u64,
    /// The MM's signing key: every command and membership message it sends is sealed.
    pub signer: MmSigner,
}

/// The machine manager's core: every rule, and no I/O of its own (see [`crate::env`]). A host
/// feeds it requests with [`MachineManager::handle`], calls [`MachineManager::tick`] at
/// [`MachineManager::poll_timeout`], and stops when [`MachineManager::is_done`].
pub struct MachineManager<E: MmEnv> {
    env: E,
    cfg: ClusterConfig,
    rm: RmLayout,
    prims: Arc<dyn Primitives>,
    clients: HashMap<ClientId, Client>,
    jobs: BTreeMap<JobId, Job>,
    next_job: JobId,
    policy: Box<dyn Policy>,
    gang: bool,
    /// When the MM started: the policy's time origin.
    epoch: Instant,
    /// Jobs that run in this timeslice (gang scheduling).
    run_set: Vec<JobId>,
    /// Whether the next timeslice runs other jobs: the heartbeat then gives this one a lease
    /// (`Command::Schedule`).
    run_rotates: bool,
    /// Heartbeat failures recur every timeslice while a node is unreachable: log them at most
    /// once a second.
    hb_errors: LogLimit,
    /// Nodes receiving a program now.
    transferring: NodeSet,
    /// Submissions not yet answered (answered after the next scheduling decision).
    unanswered: Vec<(ClientId, JobId)>,
    /// Membership, failures and drains of the nodes.
    nodes: NodeTable,
    /// Producer of the heartbeat queue; its node set is the members (the UP nodes).
    heartbeats: QueueProducer,
    /// Sequence number of the next new heartbeat.
    hb_seq: u64,
    hb_in_flight: Option<InFlight>,
    /// [`MachineManager::wait`] took a signal of the termination event: the next look at
    /// terminations counts it.
    term_announced: bool,
    /// A heartbeat whose transfer failed, to send again before any new one.
    hb_resend: Option<Bytes>,
    /// A PMI fence result was not confirmed: look at the nodes' parts again next tick.
    pmi_recheck: bool,
    /// Every heartbeat before this sequence number reached every member.
    hb_delivered: u64,
    /// When the next receipt check (COMPARE-AND-WRITE on the heartbeat counters) is due, and
    /// what it checks: that every member took every heartbeat before `check_target`.
    next_check: Instant,
    check_target: u64,
    commands: VecDeque<Command>,
    /// Each node's output queue, and the entries taken from it not yet released.
    outputs: Vec<output::NodeOutput>,
    /// Which nodes signalled since the last timeslice.
    attention: attention::Attention,
    slots: Vec<Option<JobId>>,
    /// Transfer workers at work: the job and the nodes each sends to.
    workers: Vec<Option<(JobId, NodeSet)>>,
    next_transfer: u32,
    worker_tx: Sender<TransferDone>,
    worker_rx: Receiver<TransferDone>,
    shutting_down: bool,
    /// Jobs, results and drains, kept so that a restarted MM loses nothing it accepted.
    journal: Journal,
    /// Jobs whose journal record must be written with the next commit.
    unrecorded: std::collections::BTreeSet<JobId>,
    /// Replies held until the journal has committed what they tell.
    /// Replies to send, each with the journal commit it waits for (`None`: this
    /// timeslice's, not yet made).
    outbox: Vec<(ClientId, Reply, Option<u64>)>,
    /// Copies programs of waiting jobs beside the journal, off the main loop.
    saver: saver::Saver,
    /// Jobs whose program copy is under way: not journaled yet, their submitters' replies
    /// held.
    saving: BTreeSet<JobId>,
    /// Jobs that ended, as the journal keeps them (oldest first).
    finished: BTreeMap<JobId, JobRecord>,
    /// Jobs restored from the journal, held out of the queue until their submitters reattach
    /// or this instant passes (see [`restart`]).
    held: Option<Instant>,
    /// Until when submitters of jobs restored after a restart may reattach (see [`restart`]).
    reattach_until: Option<Instant>,
    /// Output held for restored jobs that ended before their submitters reattached: given
    /// to the submitter that reattaches, before the outcome (see [`output`]).
    finished_output: HashMap<JobId, Vec<(NodeId, u64, storm_cluster::messages::OutputChunk)>>,
    /// Which MM process this is (NMs send again what an earlier one held in its memory).
    incarnation: u64,
    /// Seals commands and membership messages (see `storm_cluster::identity`).
    signer: MmSigner,
    journal_errors: LogLimit,
    /// What `storm metrics` shows.
    metrics: Metrics,
    /// When the last timeslice began (to tell the MM's own stalls from nodes' silence).
    last_tick: Instant,
    /// When the next timeslice is due.
    next_tick: Instant,
}

impl MachineManager<DaemonEnv> {
    /// SIGHUP: reads the MM's signing key and the enrolled nodes' keys again (a key being
    /// rotated, docs/security.md). A file that does not read keeps the keys in use.
    pub fn reload_keys(&mut self) {
        match self.cfg.load_mm_signer() {
            Ok(signer) => {
                tracing::info!(
                    public_key = %storm_cluster::identity::public_hex(&signer.public()),
                    "read the MM's signing key again"
                );
                self.signer = signer;
            }
            Err(e) => tracing::error!("keeping the MM's signing key in use: {e}"),
        }
        if let Some(enrolled) = &self.env.enrolled {
            match self.cfg.load_enrolled() {
                Ok(e) => {
                    *enrolled.write() = e;
                    tracing::info!("read the enrolled nodes' keys again");
                }
                Err(e) => tracing::error!("keeping the enrolled nodes' keys in use: {e}"),
            }
        }
    }

    /// The daemon: reads the key, lays out global memory, opens the journal, starts the
    /// endpoint and the control socket, and makes the core over them.
    pub fn start(opts: MmOptions) -> Result<(Self, Receiver<Incoming>)> {
        let MmOptions {
            config: cfg,
            listen,
            stop: _,
        } = opts;
        // First: without the key this daemon must not run at all.
        let key = cfg.load_key()?;
        let signer = cfg.load_mm_signer()?;
        // Every node must prove which it is: its key is enrolled here.
        let enrolled = Arc::new(parking_lot::RwLock::new(
            cfg.load_enrolled().map_err(anyhow::Error::msg)?,
        ));
        let rm = RmLayout::new(&cfg)?;
        tracing::info!(
            mm_mib = rm.layout.size_at(cfg.mm_id()) >> 20,
            nm_mib = rm.layout.size_at(0) >> 20,
            nodes = cfg.node_count(),
            "global memory laid out (address space; untouched pages take no memory)"
        );
        let (journal, restored) = Journal::open(&cfg.cluster.state_dir)?;
        let fabric = endpoint::start(
            &cfg,
            &rm,
            cfg.mm_id(),
            listen,
            key,
            endpoint::LinkIdentity::Manager(enrolled.clone()),
        )
        .map_err(anyhow::Error::msg)?;
        let waker = crate::Waker::new(fabric.clone(), rm.term_event);
        // The disk's fsync stays off the MM's loop; replies wait for their commit instead.
        let journal = journal.commit_in_background(waker.clone())?;
        let (tx, incoming) = crossbeam_channel::unbounded();
        control_server::start(
            &cfg.cluster.control_socket,
            cfg.cluster.name.clone(),
            cfg.node_count(),
            cfg.limits.clone(),
            tx,
            waker,
        )?;
        let parts = MmParts {
            config: cfg,
            rm,
            fabric,
            journal,
            restored,
            incarnation: incarnation(),
            signer,
        };
        let mut env = DaemonEnv::default();
        env.enrolled = Some(enrolled);
        Ok((Self::new(parts, env)?, incoming))
    }
}

impl<E: MmEnv> MachineManager<E> {
    /// A machine manager over `parts` in `env`: no sockets, no threads. It takes up what the
    /// journal held at once (see [`restart`]).
    pub fn new(parts: MmParts, env: E) -> Result<Self> {
        let MmParts {
            config: cfg,
            rm,
            fabric: prims,
            journal,
            restored,
            incarnation,
            signer,
        } = parts;
        let now = env.clock().now();
        let all = NodeSet::first_n(cfg.node_count());
        let outputs = (0..cfg.node_count() as usize)
            .map(|i| QueueConsumer::new(&*prims, rm.output[i], 1).map(output::NodeOutput::new))
            .collect::<Result<Vec<_>, _>>()?;
        let (worker_tx, worker_rx) = crossbeam_channel::unbounded();
        let mut policy = crate::policy::build(
            cfg.scheduler.policy,
            cfg.node_count(),
            cfg.capacity().cpus_per_node,
            cfg.scheduler.mpl,
            Duration::from_secs(cfg.scheduler.default_time_limit_s),
        );
        // Nodes become available as they join.
        for n in all.iter() {
            policy.set_unavailable(n);
        }
        tracing::info!(
            cluster = %cfg.cluster.name,
            nodes = cfg.node_count(),
            socket = %cfg.cluster.control_socket.display(),
            timeslice = ?cfg.timeslice(),
            "machine manager started"
        );
        let mut mm = Self {
            // No member yet: nodes join as their NMs register. AWAIT-SPACE waits at most a
            // timeslice, so a node that stops taking heartbeats never stalls the others (the
            // receipt check finds it). A heartbeat applies at each node as it arrives (one
            // round trip, not two): a failed one goes again, and nodes that took it skip it.
            heartbeats: QueueProducer::new(rm.heartbeat, NodeSet::new(), 1)
                .applied_on_arrival()
                .with_space_timeout(cfg.timeslice().max(Duration::from_millis(1)))
                .with_op_timeout(cfg.heartbeat_deadline()),
            policy,
            nodes: NodeTable::new(cfg.node_count(), cfg.failure.missed_heartbeats),
            hb_in_flight: None,
            term_announced: false,
            hb_resend: None,
            pmi_recheck: false,
            hb_delivered: epoch_base(1),
            next_check: now,
            check_target: epoch_base(1),
            gang: cfg.scheduler.policy == PolicyKind::Gang,
            epoch: now,
            run_set: Vec::new(),
            run_rotates: false,
            hb_errors: LogLimit::new(Duration::from_secs(1)),
            transferring: NodeSet::new(),
            unanswered: Vec::new(),
            slots: vec![None; cfg.cluster.max_jobs],
            workers: vec![None; cfg.cluster.max_transfers],
            clients: HashMap::new(),
            jobs: BTreeMap::new(),
            next_job: 1,
            hb_seq: 0,
            commands: VecDeque::new(),
            next_transfer: 1,
            worker_tx,
            worker_rx,
            shutting_down: false,
            saver: saver::Saver::new(journal.program_store()),
            saving: BTreeSet::new(),
            journal,
            unrecorded: Default::default(),
            outbox: Vec::new(),
            finished: BTreeMap::new(),
            held: None,
            reattach_until: None,
            finished_output: HashMap::new(),
            incarnation,
            signer,
            journal_errors: LogLimit::new(Duration::from_secs(10)),
            metrics: Metrics::new(),
            last_tick: now,
            next_tick: now,
            outputs,
            attention: attention::Attention::new(&rm, now),
            rm,
            prims,
            cfg,
            env,
        };
        mm.restore(restored);
        Ok(mm)
    }

    /// The time now, on the environment's clock.
    fn now(&self) -> Instant {
        self.env.clock().now()
    }

    /// The wall-clock time now (milliseconds since the Unix epoch), for records.
    fn unix_ms(&self) -> u64 {
        self.env.clock().unix_ms()
    }

    /// Time since the MM started: the scheduling policy's clock.
    fn since_epoch(&self) -> Duration {
        self.now().saturating_duration_since(self.epoch)
    }

    /// When [`MachineManager::tick`] is due next: one timeslice after the last, or now if
    /// the MM fell behind.
    pub fn poll_timeout(&self) -> Instant {
        self.next_tick
    }

    /// Waits on the fabric until `until` (a timeslice is due), or until something arrives
    /// for the MM: a node announces a termination, or one of the MM's threads wakes it (see
    /// [`crate::waker`]). The host then hands it what arrived and calls
    /// [`MachineManager::between_ticks`] (or [`MachineManager::tick`], if one is due). A host
    /// that steps the MM (the simulator) does not call it.
    pub fn wait(&mut self, until: Instant) {
        let left = until.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return;
        }
        match self
            .prims
            .test_event(self.rm.term_event, Wait::Timeout(left))
        {
            Ok(true) => self.term_announced = true,
            Ok(false) => {}
            // The endpoint is closed (shutting down): sleep, or the loop would spin.
            Err(_) => std::thread::sleep(left),
        }
    }

    /// A handle that ends the MM's [`MachineManager::wait`] from another thread.
    pub fn waker(&self) -> crate::Waker {
        crate::Waker::new(self.prims.clone(), self.rm.term_event)
    }

    /// What the MM does between timeslices: takes the terminations announced since the last
    /// timeslice, takes the program transfers its workers finished (verifying the nodes'
    /// answers, and recording the launch of a job whose program every node holds), and sends
    /// the replies whose journal commit has settled. It schedules and launches nothing (that
    /// waits for the timeslice, and its heartbeat); but a settled commit that lets a launch go
    /// brings the next timeslice forward to now, so that the launch does not wait out the rest
    /// of this one on top of the commit.
    pub fn between_ticks(&mut self) {
        self.detect_terminations();
        if self.take_finished_transfers() {
            self.verify_transfers();
        }
        self.publish();
        let settled = self.journal.settled();
        let launchable = self.jobs.values().any(|j| j.phase.may_launch(settled));
        if launchable {
            self.next_tick = self.next_tick.min(self.now());
        }
    }

    /// Whether a shutdown was asked for and its commands have gone out (or no node is left
    /// to take them). The host then waits for the last heartbeat
    /// ([`MachineManager::wait_heartbeats`]) and stops.
    pub fn is_done(&self) -> bool {
        self.shutting_down && (self.commands.is_empty() || self.heartbeats.dest().is_empty())
    }

    /// The environment, for a host or a simulator that looks inside it.
    pub fn env(&self) -> &E {
        &self.env
    }

    /// The nodes as `storm nodes` shows them, without a request (for a simulator's checks).
    pub fn nodes_view(&self) -> Vec<NodeInfo> {
        self.node_infos()
    }

    /// The jobs as `storm queue` shows them, without a request.
    pub fn queue_view(&self) -> Vec<JobInfo> {
        self.jobs.values().map(|j| self.job_info(j)).collect()
    }

    /// The jobs the latest gang strobe runs (empty under the other policies).
    pub fn run_set(&self) -> &[JobId] {
        &self.run_set
    }

    /// One timeslice (see the module's overview), at the environment clock's time.
    pub fn tick(&mut self) {
        let started = Instant::now();
        let now = self.now();
        // A stall of the MM's own (it was not scheduled, or swapped) is nobody's silence.
        let gap = now.saturating_duration_since(self.last_tick);
        let slice = self.cfg.timeslice();
        if gap > slice * 3 {
            self.nodes.excuse(gap - slice);
        }
        self.last_tick = now;
        self.attention.collect(&*self.prims, now);
        self.membership();
        self.enforce_silence(now);
        self.take_finished_transfers();
        self.report_transfer_progress();
        self.verify_transfers();
        self.advance_recoveries(now);
        if !self.shutting_down {
            self.release_held();
            self.end_reattach_window(now);
            self.schedule();
        }
        self.enforce_limits();
        self.escalate_cancels();
        if self
            .jobs
            .values()
            .any(|j| j.phase == (Phase::Recording { batch: None }))
        {
            // The starts go to the journal now rather than at the end of the timeslice: a
            // journal that commits in place holds them at once, and this heartbeat can carry
            // their launches.
            self.publish();
        }
        self.release_launches();
        self.issue_heartbeat();
        self.check_receipt();
        self.forward_output(self.attention.output_nodes(self.cfg.node_count()));
        self.pmi_exchange();
        self.detect_terminations();
        self.publish();
        // The real time the timeslice took, whatever clock decisions use.
        self.metrics.ticked(started.elapsed());
        let after = self.now();
        self.next_tick += slice;
        if self.next_tick < after {
            self.next_tick = after;
        }
    }

    /// Commits this timeslice's changes to the journal, then sends the replies that tell of
    /// them: a client never learns of a state a restarted MM would not know. A job whose
    /// program is being copied is journaled once the copy is complete, and its submitter's
    /// replies wait for that.
    fn publish(&mut self) {
        for (id, saved) in self.saver.finished() {
            self.saving.remove(&id);
            match (self.jobs.get_mut(&id), saved) {
                (Some(j), Ok(())) => {
                    j.program_saved = true;
                    // From now on the program is read from the copy.
                    j.program = None;
                }
                (Some(_), Err(e @ crate::journal::JournalError::ProgramChanged { .. })) => {
                    self.fail(id, e.to_string());
                }
                (Some(j), Err(e)) => {
                    j.program_save_failed = true;
                    tracing::error!(
                        job = id,
                        "the job would not survive a restart of the MM: {e}"
                    );
                }
                // It ended while its copy was made; nothing will need the copy.
                (None, _) => {
                    if let Some(store) = self.journal.program_store() {
                        store.remove(id);
                    }
                }
            }
        }
        let mut later = BTreeSet::new();
        let mut recording = Vec::new();
        for id in std::mem::take(&mut self.unrecorded) {
            let Some(j) = self.jobs.get_mut(&id) else {
                continue;
            };
            if self.saving.contains(&id) {
                later.insert(id);
                continue;
            }
            // A waiting job (or one that may be requeued) needs its program after a restart.
            if !j.program_saved
                && !j.program_save_failed
                && (j.phase == Phase::Queued || j.req.requeue)
                && let Some(program) = &j.program
            {
                let size = j.size;
                match program
                    .try_clone()
                    .map(|copy| self.saver.save(id, copy, size))
                {
                    Ok(true) => {
                        self.saving.insert(id);
                        later.insert(id);
                        continue;
                    }
                    Ok(false) => {
                        j.program_save_failed = true;
                        tracing::error!(
                            job = id,
                            "the job would not survive a restart of the MM: its program cannot be copied beside the journal"
                        );
                    }
                    Err(e) => {
                        j.program_save_failed = true;
                        tracing::error!(
                            job = id,
                            "the job would not survive a restart of the MM: cannot read its program: {e}"
                        );
                    }
                }
            }
            let rec = job_record(j);
            self.journal.put_job(rec);
            if j.phase == (Phase::Recording { batch: None }) {
                recording.push(id);
            }
        }
        self.unrecorded = later;
        let batch = self.journal.commit().unwrap_or_else(|e| {
            self.journal_failed(e);
            // Replies and launches go all the same, as they did before commits were made
            // apart.
            self.journal.settled()
        });
        for id in recording {
            if let Some(j) = self.jobs.get_mut(&id) {
                j.phase = Phase::Recording { batch: Some(batch) };
            }
        }
        for settled in self.journal.settle() {
            match settled.outcome {
                Ok(()) => self.metrics.journal_committed(settled.took),
                // A failed write settles too: its replies go, the error is logged, and the
                // changes are tried again with the next commit.
                Err(e) => self.journal_failed(e),
            }
        }
        let settled = self.journal.settled();
        let mut held: HashSet<ClientId> = self
            .saving
            .iter()
            .filter_map(|id| self.jobs.get(id)?.client)
            .collect();
        let mut kept = Vec::new();
        for (client, mut r, waits_for) in self.outbox.drain(..) {
            // A reply of this timeslice waits for this timeslice's commit, except output,
            // which the journal does not hold.
            let waits_for = waits_for.unwrap_or(match r {
                Reply::Output(_) => 0,
                _ => batch,
            });
            // A listing made this timeslice may name a job whose copy just began: it is not
            // accepted until its record is journaled.
            if let Reply::Queue(list) = &mut r {
                list.retain(|j| !self.saving.contains(&j.job));
            }
            // A client's replies keep their order: once one waits, the later ones wait too.
            if held.contains(&client) || waits_for > settled {
                held.insert(client);
                kept.push((client, r, Some(waits_for)));
            } else if let Some(c) = self.clients.get(&client) {
                let _ = c.tx.send(r);
            }
        }
        self.outbox = kept;
    }

    /// A commit failed: what changed would not survive a restart of the MM until a later
    /// commit succeeds (the changes are tried again with it).
    fn journal_failed(&mut self, e: crate::journal::JournalError) {
        if let Some(more) = self.journal_errors.allow(self.now()) {
            tracing::error!(
                suppressed = more,
                "cannot write the journal; what changed now would not survive a restart of the MM: {e}"
            );
        }
    }

    // ---------------------------------------------------------------- control requests

    /// Queues a reply; it is sent at the end of the timeslice, once the journal holds what
    /// it tells. Returns its number among the replies to this client (it is written to the
    /// client's socket once the client's `written` count reaches it), or `None` if the client
    /// is gone.
    fn reply(&mut self, client: ClientId, r: Reply) -> Option<u64> {
        let c = self.clients.get_mut(&client)?;
        c.queued += 1;
        let n = c.queued;
        if !matches!(r, Reply::Output(_)) {
            let written = c.written.load(Ordering::Acquire);
            while let Some(&(k, bytes)) = c.unread.front()
                && k <= written
            {
                c.unread.pop_front();
                c.unread_bytes -= bytes;
            }
            let bytes = control::encoded_len(&r) as u64;
            c.unread.push_back((n, bytes));
            c.unread_bytes += bytes;
            if c.unread_bytes > self.cfg.limits.max_unread_reply_bytes {
                self.drop_unreading_client(client);
                return None;
            }
        }
        self.outbox.push((client, r, None));
        Some(n)
    }

    /// Disconnects a client that leaves more than `[limits] max_unread_reply_bytes` of
    /// replies unread (it asks without reading the answers). Its jobs go on without it: their output
    /// is dropped, and their state stays in `storm queue`.
    fn drop_unreading_client(&mut self, client: ClientId) {
        let Some(c) = self.clients.remove(&client) else {
            return;
        };
        let mut detached = 0;
        for j in self.jobs.values_mut().filter(|j| j.client == Some(client)) {
            j.client = None;
            detached += 1;
        }
        tracing::warn!(
            client,
            uid = c.uid,
            detached,
            "disconnecting a control client that left {} replies ({} bytes) unread ([limits] \
             max_unread_reply_bytes = {}); its jobs go on without it",
            c.unread.len(),
            c.unread_bytes,
            self.cfg.limits.max_unread_reply_bytes
        );
        control::hang_up(&c.closer);
    }

    /// Takes a message from the control socket: a client came or went, or asked something.
    /// Replies go out at the end of the next timeslice, once the journal holds what they tell.
    pub fn handle(&mut self, msg: Incoming) {
        match msg {
            Incoming::Connected {
                client,
                uid,
                gid,
                tx,
                written,
                closer,
            } => {
                self.clients.insert(
                    client,
                    Client {
                        uid,
                        gid,
                        tx,
                        queued: 0,
                        written,
                        unread: VecDeque::new(),
                        unread_bytes: 0,
                        closer,
                    },
                );
            }
            Incoming::Gone { client } => {
                self.clients.remove(&client);
                let orphans: Vec<JobId> = self
                    .jobs
                    .values()
                    .filter(|j| j.client == Some(client))
                    .map(|j| j.id)
                    .collect();
                for job in orphans {
                    self.cancel(job, "storm-submit went away".into());
                }
            }
            Incoming::Request { client, req, fds } => self.request(client, req, fds),
        }
    }

    fn request(&mut self, client: ClientId, req: Request, fds: Vec<OwnedFd>) {
        let Some(uid) = self.clients.get(&client).map(|c| c.uid) else {
            return;
        };
        match req {
            Request::Hello { .. } => {
                self.reply(client, Reply::Error("already connected".into()));
            }
            // Accepted is sent after the next scheduling decision, saying why the job waits.
            Request::Submit(job) => {
                if let Err(e) = self.submit(client, job, fds) {
                    self.reply(client, Reply::Error(e));
                }
            }
            Request::Cancel { job } => {
                let reply = match self.jobs.get(&job) {
                    None => Reply::Error(format!("no job {job} (it may have finished already)")),
                    Some(j) if uid != 0 && uid != j.uid => Reply::Error(format!(
                        "job {job} belongs to uid {}; only its owner or root may cancel it",
                        j.uid
                    )),
                    Some(_) => {
                        self.cancel(job, format!("cancelled by uid {uid}"));
                        Reply::Done
                    }
                };
                self.reply(client, reply);
            }
            Request::Queue => {
                let list = self.jobs.values().map(|j| self.job_info(j)).collect();
                self.reply(client, Reply::Queue(list));
            }
            Request::History => {
                let list = self.finished.values().filter_map(finished_info).collect();
                self.reply(client, Reply::History(list));
            }
            Request::Attach { job } => self.attach(client, uid, job),
            Request::Metrics => {
                let text = self.metrics_text();
                self.reply(client, Reply::Metrics(text));
            }
            Request::Nodes => {
                let list = self.node_infos();
                self.reply(client, Reply::Nodes(list));
            }
            Request::Drain { nodes, reason } => {
                let reply = self.operator(uid, "drain nodes").and_then(|()| {
                    self.drain(&nodes, reason)?;
                    Ok(Reply::Done)
                });
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::Resume { nodes } => {
                let reply = self.operator(uid, "resume nodes").and_then(|()| {
                    self.resume(&nodes)?;
                    Ok(Reply::Done)
                });
                self.reply(client, reply.unwrap_or_else(Reply::Error));
            }
            Request::Shutdown => {
                let me = self.env.operator_uid();
                if uid != 0 && uid != me {
                    self.reply(
                        client,
                        Reply::Error(
                            "only root or the MM's own user may shut the cluster down".into(),
                        ),
                    );
                    return;
                }
                for job in self.jobs.keys().copied().collect::<Vec<_>>() {
                    self.cancel(job, "the cluster is shutting down".into());
                }
                self.commands.push_back(Command::Shutdown);
                self.shutting_down = true;
                self.reply(client, Reply::Done);
            }
        }
    }

    /// Whether `uid` may act on the cluster as an operator: root or the MM's own user.
    fn operator(&self, uid: u32, what: &str) -> Result<(), String> {
        let me = self.env.operator_uid();
        if uid == 0 || uid == me {
            Ok(())
        } else {
            Err(format!("only root or the MM's own user may {what}"))
        }
    }

    /// `[limits] max_program_bytes` and `max_spooled_bytes_per_user` for a program of
    /// `size` bytes that user `uid` sends with a new job.
    fn check_program_limits(&self, uid: u32, program: &Path, size: u64) -> Result<(), String> {
        let l = &self.cfg.limits;
        if size > l.max_program_bytes {
            return Err(format!(
                "{} is {size} bytes, over the limit for a program sent with its job ([limits] \
                 max_program_bytes = {}); put it where every node can read it and submit with \
                 --no-bcast",
                program.display(),
                l.max_program_bytes
            ));
        }
        let held: u64 = self
            .jobs
            .values()
            .filter(|j| j.uid == uid && j.req.bcast)
            .map(|j| j.size)
            .sum();
        if held + size > l.max_spooled_bytes_per_user {
            return Err(format!(
                "the machine manager already holds {held} bytes of programs for user {uid}'s \
                 unfinished jobs; {size} more would pass the limit ([limits] \
                 max_spooled_bytes_per_user = {}); wait for some jobs to finish",
                l.max_spooled_bytes_per_user
            ));
        }
        Ok(())
    }

    /// `[limits] max_job_name_bytes` and `max_argument_bytes` for a new job's request.
    fn check_request_sizes(&self, req: &JobRequest) -> Result<(), String> {
        let l = &self.cfg.limits;
        if req.name.len() > l.max_job_name_bytes as usize {
            return Err(format!(
                "the job's name is {} bytes, over the limit ([limits] max_job_name_bytes = {}); \
                 give a shorter one with -J",
                req.name.len(),
                l.max_job_name_bytes
            ));
        }
        let args: usize = req.args.iter().map(|a| a.len() + 1).sum::<usize>()
            + req
                .env
                .iter()
                .map(|(k, v)| k.len() + v.len() + 2)
                .sum::<usize>();
        if args as u64 > l.max_argument_bytes {
            return Err(format!(
                "the job's arguments and environment are {args} bytes, over the limit ([limits] \
                 max_argument_bytes = {})",
                l.max_argument_bytes
            ));
        }
        Ok(())
    }

    /// `[limits] max_queued_jobs_per_user` for a new job of user `uid`.
    fn check_queue_limit(&self, uid: u32) -> Result<(), String> {
        let limit = self.cfg.limits.max_queued_jobs_per_user;
        let waiting = self
            .jobs
            .values()
            .filter(|j| j.uid == uid && j.phase == Phase::Queued)
            .count();
        if waiting >= limit as usize {
            return Err(format!(
                "user {uid} already has {waiting} jobs waiting to start, the limit ([limits] \
                 max_queued_jobs_per_user = {limit}); wait for some to start, or cancel some"
            ));
        }
        Ok(())
    }

    fn submit(
        &mut self,
        client: ClientId,
        req: JobRequest,
        mut fds: Vec<OwnedFd>,
    ) -> Result<JobId, String> {
        if self.shutting_down {
            return Err("the cluster is shutting down".into());
        }
        let (uid, gid) = self
            .clients
            .get(&client)
            .map(|c| (c.uid, c.gid))
            .ok_or("unknown client")?;
        if uid == 0 && !self.cfg.security.allow_root_jobs {
            return Err(
                "root may not run jobs on this cluster ([security] allow_root_jobs = false); \
                 submit as another user"
                    .into(),
            );
        }
        self.check_request_sizes(&req)?;
        let plan = self.plan(&req)?;
        if !req.cwd.is_absolute() || !req.program.is_absolute() {
            return Err("program and working directory must be absolute paths".into());
        }
        let program = if req.bcast {
            let fd = fds
                .pop()
                .ok_or("the program's descriptor did not arrive with the request")?;
            let file = File::from(fd);
            let meta = file
                .metadata()
                .map_err(|e| format!("cannot inspect the program: {e}"))?;
            if !meta.is_file() {
                return Err(format!("{} is not a regular file", req.program.display()));
            }
            if meta.permissions().mode() & 0o111 == 0 {
                return Err(format!("{} is not executable", req.program.display()));
            }
            self.check_program_limits(uid, &req.program, meta.len())?;
            Some((file, meta.len()))
        } else {
            None
        };
        let (program, size) = program.map_or((None, 0), |(f, n)| (Some(f), n));
        self.check_queue_limit(uid)?;
        let id = self.next_job;
        self.next_job += 1;
        self.journal.set_next_job(self.next_job);
        let launch_probe = launch_spec(
            id,
            0,
            &req,
            &plan,
            &NodeSet::first_n(plan.nodes),
            (uid, gid),
        );
        let limit = self.cfg.cluster.heartbeat_bytes - 256;
        if let Err(e) = encode("launch", &Command::Launch(launch_probe), limit) {
            return Err(format!(
                "the job description is too large for a heartbeat ({e}); export fewer variables"
            ));
        }
        self.jobs.insert(
            id,
            Job::queued(NewJob {
                id,
                uid,
                gid,
                req,
                plan,
                program,
                size,
                client: Some(client),
                submitted: self.now(),
                submitted_ms: self.unix_ms(),
            }),
        );
        // While jobs restored after a restart are held, new ones queue behind them (they
        // enter the policy together, in order, when the hold ends).
        if self.held.is_none() {
            let ask = self.ask(&self.jobs[&id]);
            self.policy.submit(ask, self.since_epoch());
        }
        self.unanswered.push((client, id));
        self.unrecorded.insert(id);
        self.metrics.job_submitted();
        tracing::info!(
            job = id,
            uid,
            nodes = plan.nodes,
            tasks = plan.ntasks,
            "job accepted"
        );
        Ok(id)
    }

    /// What job `j` asks of the scheduling policy.
    fn ask(&self, j: &Job) -> JobAsk {
        job_ask(j.id, &j.req, &j.plan, self.cfg.capacity().cpus_per_node)
    }

    /// The shape of job `req` on this cluster, or why it does not fit.
    fn plan(&self, req: &JobRequest) -> Result<TaskPlan, String> {
        req.tasks
            .plan(&self.cfg.capacity())
            .map_err(|e| format!("{e} (cluster {:?})", self.cfg.cluster.name))
    }

    /// Why a queued job cannot start right now, if it cannot.
    fn wait_reason(&self, job: JobId) -> Option<String> {
        if self.held.is_some() {
            return Some(format!(
                "held after a restart of the machine manager until the submitters of the queued \
                 jobs reattach (at most {} s)",
                restart::REATTACH_GRACE.as_secs()
            ));
        }
        let want = self.jobs.get(&job).map_or(0, |j| j.plan.nodes);
        let available = self.nodes.available_count();
        if want > available {
            return Some(format!(
                "waiting for {want} nodes: {available} of {} are up and not drained ({} up)",
                self.nodes.len(),
                self.nodes.up_count()
            ));
        }
        if self.slots.iter().all(Option::is_some) {
            return Some(format!(
                "waiting: {} jobs already run (max_jobs)",
                self.slots.len()
            ));
        }
        self.policy.reason(job)
    }

    fn job_info(&self, j: &Job) -> JobInfo {
        let state = match (&j.cancel, j.phase) {
            (Some(_), Phase::Queued) => "cancelling",
            (Some(_), _) => "cancelling",
            (None, Phase::Queued) => "queued",
            (None, Phase::Allocated) => "starting",
            (None, Phase::Sending { .. } | Phase::Verifying { .. }) => "sending",
            (None, Phase::Recording { .. } | Phase::Launching) => "launching",
            (None, Phase::Recovering) => "recovering",
            (None, Phase::Running) if j.terminating => "ending",
            // Gang scheduling: placed, but not in this timeslice's slot.
            (None, Phase::Running) if self.gang && !self.run_set.contains(&j.id) => "suspended",
            (None, Phase::Running) => "running",
        };
        JobInfo {
            job: j.id,
            name: j.req.name.clone(),
            uid: j.uid,
            state: state.into(),
            nodes: j.nodes.clone(),
            cpus: j.cpus.clone(),
            ntasks: j.plan.ntasks,
            elapsed_ms: self
                .now()
                .saturating_duration_since(j.submitted)
                .as_millis() as u64,
            reason: (j.phase == Phase::Queued)
                .then(|| self.wait_reason(j.id))
                .flatten(),
            time_slot: (self.gang && j.phase != Phase::Queued).then_some(j.time_slot as u32),
            exit_code: None,
            usage: JobUsage::default(),
        }
    }

    fn node_infos(&self) -> Vec<NodeInfo> {
        self.cfg
            .nodes
            .iter()
            .enumerate()
            .map(|(i, n)| {
                let id = i as NodeId;
                let jobs: Vec<JobId> = self
                    .jobs
                    .values()
                    .filter(|j| j.nodes.contains(id))
                    .map(|j| j.id)
                    .collect();
                let (state, reason) = self.nodes.describe(id, !jobs.is_empty());
                NodeInfo {
                    id,
                    name: n.name.clone(),
                    state: state.into(),
                    jobs,
                    reason,
                }
            })
            .collect()
    }

    /// The metrics, with the node and job gauges set from the state now.
    fn metrics_text(&self) -> String {
        let busy = self
            .jobs
            .values()
            .fold(NodeSet::new(), |all, j| all.union(&j.nodes));
        let node_states: Vec<&str> = (0..self.cfg.node_count())
            .map(|n| self.nodes.describe(n, busy.contains(n)).0)
            .collect();
        let job_states: Vec<String> = self.jobs.values().map(|j| self.job_info(j).state).collect();
        let queued = self
            .jobs
            .values()
            .filter(|j| j.phase == Phase::Queued)
            .count();
        self.metrics
            .encode(node_states, job_states.iter().map(String::as_str), queued)
    }

    // ---------------------------------------------------------------- scheduling

    /// Asks the policy for this timeslice's decisions and applies them; answers submissions
    /// made since the last timeslice; starts program transfers that can start.
    fn schedule(&mut self) {
        let free_slots = self.slots.iter().filter(|s| s.is_none()).count();
        let decisions = self.policy.tick(self.since_epoch(), free_slots);
        let starting: Vec<JobId> = decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Start { job, .. } => Some(*job),
                Decision::Run { .. } => None,
            })
            .collect();
        // Answer submissions: those starting now without a reason, before their Started.
        let unanswered: Vec<(ClientId, JobId)> = self.unanswered.drain(..).collect();
        for &(client, job) in unanswered.iter().filter(|(_, j)| starting.contains(j)) {
            self.reply(client, Reply::Accepted { job, queued: None });
        }
        for d in decisions {
            match d {
                Decision::Start { job, placed } => {
                    let slot = self
                        .slots
                        .iter()
                        .position(Option::is_none)
                        .expect("the policy starts at most max_starts jobs");
                    self.slots[slot] = Some(job);
                    self.start_job(job, placed, slot);
                }
                Decision::Run { jobs, rotates } => {
                    if jobs != self.run_set {
                        self.metrics.gang_switched();
                    }
                    self.run_set = jobs;
                    self.run_rotates = rotates;
                }
            }
        }
        for (client, job) in unanswered
            .into_iter()
            .filter(|(_, j)| !starting.contains(j))
        {
            if self.jobs.contains_key(&job) {
                let queued = self.wait_reason(job);
                self.reply(client, Reply::Accepted { job, queued });
            }
        }
        self.begin_transfers();
    }

    /// Jobs past their time limit are cancelled on every node.
    fn enforce_limits(&mut self) {
        let now = self.now();
        let late: Vec<(JobId, Duration)> = self
            .jobs
            .values()
            .filter(|j| j.cancel.is_none())
            .filter_map(|j| Some((j.id, j.limit?, j.allocated?)))
            .filter(|(_, limit, since)| now.saturating_duration_since(*since) > *limit)
            .map(|(id, limit, _)| (id, limit))
            .collect();
        for (id, limit) in late {
            self.cancel(id, format!("time limit of {} exceeded", human(limit)));
        }
    }

    /// A job got its nodes: tell its submitter, then transfer its program or launch it.
    fn start_job(&mut self, id: JobId, placed: Placement, slot: usize) {
        let Placement { share, time_slot } = placed;
        let nodes = share.nodes;
        let names: Vec<String> = nodes
            .iter()
            .map(|n| self.cfg.nodes[n as usize].name.clone())
            .collect();
        let gang = self.gang;
        if self
            .jobs
            .get(&id)
            .is_some_and(|j| j.req.mpi != MpiMode::None)
        {
            self.clear_pmi_parts(slot, &nodes);
        }
        let now = self.now();
        let j = self.jobs.get_mut(&id).expect("job");
        j.nodes = nodes.clone();
        j.cpus = share.cpus;
        j.slot = Some(slot);
        j.time_slot = time_slot;
        j.allocated = Some(now);
        j.phase = Phase::Allocated;
        self.unrecorded.insert(id);
        tracing::info!(job = id, nodes = %nodes, cpus = ?j.cpus, time_slot, "job starts");
        let started = Reply::Started {
            job: id,
            nodes,
            node_names: names,
            time_slot: gang.then_some(time_slot as u32),
        };
        let (client, bcast) = (j.client, j.req.bcast);
        if !bcast {
            j.ready = Some(now);
        }
        if let Some(c) = client {
            self.reply(c, started);
        }
        if !bcast {
            self.queue_launch(id);
        }
    }

    /// Starts the program transfers of allocated jobs, as workers and nodes allow: each node
    /// receives one program at a time (it has one chunk queue).
    fn begin_transfers(&mut self) {
        let waiting: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.phase == Phase::Allocated)
            .map(|j| j.id)
            .collect();
        for id in waiting {
            let Some(worker) = self.workers.iter().position(Option::is_none) else {
                return;
            };
            if !self.jobs[&id].nodes.is_disjoint(&self.transferring) {
                continue;
            }
            self.begin_transfer(id, worker);
        }
    }

    fn begin_transfer(&mut self, id: JobId, worker: usize) {
        let op_timeout = Duration::from_millis(self.cfg.tcp.op_timeout_ms);
        let transfer = self.next_transfer;
        let now = self.now();
        let j = self.jobs.get_mut(&id).expect("job");
        if !j.req.bcast {
            return;
        }
        // The submitted descriptor while it is held, else the copy beside the journal.
        let file = match &j.program {
            Some(f) => f.try_clone().map_err(|e| e.to_string()),
            None if j.program_saved => self
                .journal
                .program(id)
                .ok_or_else(|| "its copy beside the journal is missing".to_string()),
            None => Err("it is no longer at hand".to_string()),
        };
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                self.fail(id, format!("cannot read the program: {e}"));
                return;
            }
        };
        self.next_transfer += 1;
        let name = j
            .req
            .program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "program".into());
        let cancel = Arc::new(AtomicBool::new(false));
        j.worker_cancel = Some(cancel.clone());
        j.phase = Phase::Sending { transfer, worker };
        let delivered = Arc::new(AtomicU64::new(0));
        j.transfer_progress = Some((delivered.clone(), now, 0));
        let progress = j.client.map(|c| {
            let total = j.size;
            (
                c,
                Reply::Progress {
                    job: id,
                    sent: 0,
                    total,
                },
            )
        });
        let nodes = j.nodes.clone();
        let info = FileInfo {
            transfer,
            job: id,
            nodes: nodes.clone(),
            size: j.size,
            name,
            uid: j.uid,
            gid: j.gid,
        };
        let size = j.size;
        if let Some((c, r)) = progress {
            self.reply(c, r);
        }
        self.workers[worker] = Some((id, nodes.clone()));
        self.transferring = self.transferring.union(&nodes);
        self.commands.push_back(Command::ReceiveFile(info));
        self.env.start_transfer(
            self.prims.clone(),
            &self.rm,
            Transfer {
                job: id,
                transfer,
                nodes,
                file,
                size,
                worker,
                event: self.rm.chunk_sent[worker],
                cancel,
                delivered,
                timeout: op_timeout * 6,
                file_ack: self.rm.file_ack,
                ack_wait: self.cfg.heartbeat_deadline(),
                wake: self.waker(),
            },
            self.worker_tx.clone(),
        );
    }

    /// Readies job `id`'s launch: its record, saying it started (and when, for a restarted
    /// MM to tell a node that never got the launch from one that lost the job), goes to the
    /// journal first, and the launch follows once that commit settled
    /// ([`MachineManager::release_launches`]).
    fn queue_launch(&mut self, id: JobId) {
        let now_ms = self.unix_ms();
        let j = self.jobs.get_mut(&id).expect("job");
        j.launched_ms = Some(now_ms);
        j.phase = Phase::Recording { batch: None };
        self.unrecorded.insert(id);
    }

    /// Queues the launch of every job whose start the journal now holds.
    fn release_launches(&mut self) {
        let settled = self.journal.settled();
        let mut ready: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.phase.may_launch(settled))
            .map(|j| j.id)
            .collect();
        // In the order they became ready to launch.
        ready.sort_by_key(|id| self.jobs[id].ready);
        for id in ready {
            let j = self.jobs.get_mut(&id).expect("listed");
            j.phase = Phase::Launching;
            let spec = j.launch_spec();
            self.commands.push_back(Command::Launch(spec));
        }
    }

    // ---------------------------------------------------------------- program transfer

    /// Tells submitters how far their program transfer is, at most every
    /// [`PROGRESS_INTERVAL`] and only when it moved.
    fn report_transfer_progress(&mut self) {
        let now = self.now();
        let mut due = Vec::new();
        for j in self.jobs.values_mut() {
            let (Some(client), Some((delivered, last_at, last))) =
                (j.client, j.transfer_progress.as_mut())
            else {
                continue;
            };
            let sent = delivered.load(Ordering::Relaxed);
            if sent != *last && now.duration_since(*last_at) >= PROGRESS_INTERVAL {
                (*last_at, *last) = (now, sent);
                due.push((
                    client,
                    Reply::Progress {
                        job: j.id,
                        sent,
                        total: j.size,
                    },
                ));
            }
        }
        for (client, r) in due {
            self.reply(client, r);
        }
    }

    /// Takes what the transfer workers reported; true if any did.
    fn take_finished_transfers(&mut self) -> bool {
        let mut any = false;
        while let Ok(done) = self.worker_rx.try_recv() {
            self.transfer_done(done);
            any = true;
        }
        any
    }

    fn transfer_done(&mut self, done: TransferDone) {
        // The worker slot frees only now, even for a job that ended meanwhile: until its
        // worker is done, late completions may still land on the slot's event.
        let sent_to = match &self.workers[done.worker] {
            Some((job, nodes)) if *job == done.job => nodes.clone(),
            _ => NodeSet::new(),
        };
        self.workers[done.worker] = None;
        let current = self.jobs.get(&done.job).is_some_and(
            |j| matches!(j.phase, Phase::Sending { transfer, .. } if transfer == done.transfer),
        );
        if !current {
            // The job ended, or was requeued, while its worker still sent: only now are its
            // nodes free for another transfer (nothing of this one can reach them any more).
            self.transferring = self.transferring.difference(&sent_to);
            return;
        }
        let j = self.jobs.get_mut(&done.job).expect("current");
        let Phase::Sending { transfer, .. } = j.phase else {
            return;
        };
        j.transfer_progress = None;
        if done.result.is_err() {
            // The worker has stopped: the nodes are free for another transfer, this job's
            // again included. (A successful transfer keeps them until it is verified.)
            self.transferring = self.transferring.difference(&sent_to);
        }
        let j = self.jobs.get_mut(&done.job).expect("current");
        match done.result {
            Ok(hash) => {
                j.program_hash = Some(hash);
                j.phase = Phase::Verifying { transfer };
                if let Some(c) = j.client {
                    let (job, total) = (j.id, j.size);
                    self.reply(
                        c,
                        Reply::Progress {
                            job,
                            sent: total,
                            total,
                        },
                    );
                }
            }
            Err(e) => match j.cancel.as_ref().map(|c| c.reason.clone()) {
                Some(reason) => self.fail(done.job, reason),
                // Nodes that did not take the program: they leave the heartbeat, and the job,
                // none of whose tasks started, is placed again.
                None if !e.blamed.is_empty() => {
                    self.blame_nodes(&e.blamed, &e.message);
                    self.node_lost_job(done.job, format!("program transfer failed: {e}"));
                }
                None => self.fail(done.job, format!("program transfer failed: {e}")),
            },
        }
    }

    fn verify_transfers(&mut self) {
        let verifying: Vec<(JobId, u32, NodeSet)> = self
            .jobs
            .values()
            .filter_map(|j| match j.phase {
                Phase::Verifying { transfer } => Some((j.id, transfer, j.nodes.clone())),
                _ => None,
            })
            .collect();
        for (id, transfer, nodes) in verifying {
            let good = file_ack(transfer, true);
            let ack = self.rm.file_ack;
            let deadline = Some(self.cfg.heartbeat_deadline());
            let answered = match self.prims.compare_and_write_within(
                &nodes,
                ack,
                Relation::Ge,
                good - 1,
                None,
                deadline,
            ) {
                Ok(a) => a,
                Err(e) => {
                    self.blame(&e);
                    let why = format!("cannot check the program on the nodes: {e}");
                    if e.blamed().is_empty() {
                        self.fail(id, why);
                    } else {
                        self.node_lost_job(id, why);
                    }
                    continue;
                }
            };
            if !answered {
                continue;
            }
            // Every node has answered; find those that did not verify the program.
            let bad: NodeSet = nodes
                .iter()
                .filter(|&n| {
                    let one = NodeSet::single(n);
                    !matches!(
                        self.prims.compare_and_write_within(
                            &one,
                            ack,
                            Relation::Eq,
                            good,
                            None,
                            deadline
                        ),
                        Ok(true)
                    )
                })
                .collect();
            if bad.is_empty() {
                let now = self.now();
                let j = self.jobs.get_mut(&id).expect("job");
                j.ready = Some(now);
                self.metrics.program_delivered(j.size, nodes.len() as u64);
                self.transferring = self.transferring.difference(&nodes);
                self.queue_launch(id);
            } else {
                self.fail(
                    id,
                    format!("the program did not arrive intact on nodes {bad}"),
                );
            }
        }
    }

    // ---------------------------------------------------------------- cancellation

    fn cancel(&mut self, id: JobId, reason: String) {
        let now = self.now();
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if j.cancel.is_some() {
            return;
        }
        tracing::info!(job = id, "{reason}");
        match j.phase {
            Phase::Queued => {
                self.policy.withdraw(id);
                self.finish(id, Some(format!("{reason} before it started")), Vec::new());
            }
            // Its launch has not gone out: nothing runs anywhere.
            Phase::Allocated | Phase::Recording { .. } => {
                self.finish(id, Some(format!("{reason} before it started")), Vec::new());
            }
            Phase::Sending { .. } | Phase::Verifying { .. } => {
                if let Some(c) = &j.worker_cancel {
                    c.store(true, Ordering::Release);
                }
                j.cancel = Some(Cancel {
                    reason: reason.clone(),
                    since: now,
                    killed: true,
                });
                if matches!(j.phase, Phase::Verifying { .. }) {
                    self.fail(id, format!("{reason} during program transfer"));
                }
            }
            Phase::Launching | Phase::Running | Phase::Recovering => {
                j.cancel = Some(Cancel {
                    reason,
                    since: now,
                    killed: false,
                });
                self.commands.push_back(Command::Signal {
                    job: id,
                    signal: libc::SIGTERM,
                });
            }
        }
    }

    fn escalate_cancels(&mut self) {
        let wait = Duration::from_millis(self.cfg.cluster.kill_wait_ms);
        let now = self.now();
        let mut kill = Vec::new();
        for j in self.jobs.values_mut() {
            if let Some(c) = &mut j.cancel
                && !c.killed
                && now.saturating_duration_since(c.since) >= wait
            {
                c.killed = true;
                kill.push(j.id);
            }
        }
        for job in kill {
            self.commands.push_back(Command::Signal {
                job,
                signal: libc::SIGKILL,
            });
        }
    }

    // ---------------------------------------------------------------- heartbeat

    /// Issues this timeslice's heartbeat to the members, once the previous one has completed.
    /// One heartbeat is in flight at a time, so a failed one can be sent again, byte for byte
    /// under the same sequence number, with nothing after it to overtake it.
    fn issue_heartbeat(&mut self) {
        if !self.heartbeat_completed() {
            return;
        }
        if self.heartbeats.dest().is_empty() {
            return;
        }
        let (bytes, fresh) = match self.hb_resend.take() {
            Some(bytes) => (bytes, None),
            None => match self.next_heartbeat() {
                Some((bytes, taken)) => (bytes, Some(taken)),
                None => return,
            },
        };
        match self
            .heartbeats
            .enqueue(&*self.prims, &bytes, Some(self.rm.hb_sent))
        {
            Ok(()) => {
                let now = self.now();
                if let Some(taken) = fresh {
                    self.hb_seq += 1;
                    for cmd in self.commands.drain(..taken) {
                        if let Command::Launch(spec) = cmd
                            && let Some(j) = self.jobs.get_mut(&spec.job)
                            && j.phase == Phase::Launching
                        {
                            // Its record (with the time its launch was readied) was
                            // written before this heartbeat: a restarted MM re-adopts it.
                            j.launched = Some(now);
                            j.phase = Phase::Running;
                        }
                    }
                }
                self.hb_in_flight = Some(InFlight { bytes, issued: now });
            }
            Err(e) => {
                // AWAIT-SPACE found no room in time (a node that just joined, or one that no
                // longer takes heartbeats, which the receipt check finds), or could not ask a
                // node: one that did not answer by the heartbeat's deadline (or whose
                // connection failed) misses this heartbeat, as if the transfer had failed.
                if fresh.is_none() {
                    self.hb_resend = Some(bytes);
                }
                if let Some(more) = self.hb_errors.allow(self.now()) {
                    tracing::warn!(suppressed = more, "cannot issue the heartbeat yet: {e}");
                }
                if !matches!(e, PrimError::QueueFull { .. }) {
                    self.blame(&e);
                }
            }
        }
    }

    /// The next heartbeat: as many queued commands as fit and, under gang scheduling, the
    /// schedule of this timeslice (the strobe). Also returns how many commands it carries.
    fn next_heartbeat(&self) -> Option<(Bytes, usize)> {
        let limit = self.cfg.cluster.heartbeat_bytes;
        let mut hb = Heartbeat {
            seq: self.hb_seq,
            commands: Vec::new(),
            seal: None,
        };
        // Room for the seal, which covers the commands chosen.
        let room = limit.saturating_sub(SEAL_ROOM);
        let mut taken = 0;
        for cmd in &self.commands {
            hb.commands.push(cmd.clone());
            if encode("heartbeat", &hb, room).is_err() {
                hb.commands.pop();
                break;
            }
            taken += 1;
        }
        if self.gang {
            let lease = self.cfg.slot_lease().filter(|_| self.run_rotates);
            hb.commands.push(Command::Schedule {
                run: self.run_set.clone(),
                lease_us: lease.map_or(0, |l| l.as_micros().clamp(1, u32::MAX as u128) as u32),
            });
        }
        hb.seal = self
            .signer
            .seal_commands(self.incarnation, hb.seq, &hb.commands, self.unix_ms());
        match encode("heartbeat", &hb, limit) {
            Ok(b) => Some((Bytes::from(b), taken)),
            Err(e) => {
                tracing::error!("cannot encode a heartbeat: {e}");
                None
            }
        }
    }

    /// Takes the outcome of the heartbeat in flight, if it has one; true when none is in
    /// flight any more.
    fn heartbeat_completed(&mut self) -> bool {
        let now = self.now();
        let Some(flight) = &self.hb_in_flight else {
            return true;
        };
        match self.prims.test_event(self.rm.hb_sent, Wait::Poll) {
            Ok(false) => false,
            Ok(true) => {
                let issued = flight.issued;
                self.metrics
                    .heartbeat_delivered(now.saturating_duration_since(issued));
                self.hb_in_flight = None;
                self.hb_delivered = self.heartbeats.next_seq();
                self.nodes.heard_all(issued);
                true
            }
            Err(e) => {
                let flight = self.hb_in_flight.take().expect("in flight");
                self.heartbeat_failed(e, flight.bytes);
                true
            }
        }
    }

    /// Waits up to `timeout` for the heartbeat in flight to complete. It blocks on the fabric:
    /// a host calls it once, when the MM [`is_done`](MachineManager::is_done).
    pub fn wait_heartbeats(&mut self, timeout: Duration) {
        let deadline = Instant::now() + timeout;
        while self.hb_in_flight.is_some() && Instant::now() < deadline {
            match self.prims.test_event(
                self.rm.hb_sent,
                Wait::Timeout(deadline.saturating_duration_since(Instant::now())),
            ) {
                Ok(true) | Err(_) => self.hb_in_flight = None,
                Ok(false) => break,
            }
        }
    }

    // ---------------------------------------------------------------- termination

    /// Algorithm 8.
    fn detect_terminations(&mut self) {
        let mut announced = std::mem::take(&mut self.term_announced);
        while let Ok(true) = self.prims.test_event(self.rm.term_event, Wait::Poll) {
            announced = true;
        }
        if announced {
            let mem = self.prims.memory();
            for j in self.jobs.values_mut().filter(|j| j.phase == Phase::Running) {
                if let Some(slot) = j.slot
                    && mem.load(self.rm.term_hint.at(slot)) == j.id
                {
                    j.terminating = true;
                }
            }
        }
        let ending: Vec<(JobId, usize, NodeSet)> = self
            .jobs
            .values()
            .filter(|j| j.terminating)
            .map(|j| {
                (
                    j.id,
                    j.slot.expect("running jobs have a slot"),
                    j.nodes.clone(),
                )
            })
            .collect();
        for (id, slot, nodes) in ending {
            let flag = self.rm.terminated.at(slot);
            let deadline = Some(self.cfg.heartbeat_deadline());
            // Compare only: a check that fails part way (a node too slow to answer) must not
            // have cleared the flag on the nodes that did, or no later check could succeed
            // and the job would stay "ending" for ever. The flag holds the job's id, never
            // reused, and an NM clears it when the same job is launched again (requeue).
            match self.prims.compare_and_write_within(
                &nodes,
                flag,
                Relation::Eq,
                id,
                None,
                deadline,
            ) {
                Ok(true) => self.job_ended(id, slot, &nodes),
                Ok(false) => {}
                Err(e) => {
                    tracing::warn!(job = id, "termination check failed: {e}");
                    self.blame(&e);
                }
            }
        }
    }

    fn job_ended(&mut self, id: JobId, slot: usize, nodes: &NodeSet) {
        // Everything the tasks wrote was delivered before their nodes reported; forward it
        // before the outcome.
        self.forward_output(nodes.iter());
        let ntasks = self.jobs[&id].plan.ntasks as usize;
        let mut ranks = vec![None; ntasks];
        let mut ran = RanAt::default();
        for n in nodes.iter() {
            let offset = self.rm.report_offset(slot, n as usize);
            let bytes = self
                .prims
                .memory()
                .read_vec(offset, self.rm.report_bytes)
                .unwrap_or_default();
            match decode_sealed::<NodeReport>("report", &bytes, self.rm.report_bytes) {
                Ok(r) if r.job == id => {
                    ran.add(&r.timing);
                    tracing::debug!(job = id, node = n, timing = ?r.timing, "report");
                    for (rank, status) in r.statuses {
                        if let Some(slot) = ranks.get_mut(rank as usize) {
                            *slot = Some(status);
                        }
                    }
                }
                Ok(r) => tracing::error!(job = id, node = n, "report is for job {}", r.job),
                Err(e) => tracing::error!(job = id, node = n, "{e}"),
            }
        }
        self.prims.memory().store(self.rm.term_hint.at(slot), 0);
        let reason = self.jobs[&id].cancel.as_ref().map(|c| c.reason.clone());
        if let Some(j) = self.jobs.get_mut(&id) {
            j.ran = ran;
        }
        self.finish(id, reason, ranks);
    }

    /// Ends a job that failed before or while starting.
    fn fail(&mut self, id: JobId, reason: String) {
        tracing::warn!(job = id, "{reason}");
        self.finish(id, Some(reason), Vec::new());
    }

    /// Frees what a started job holds: its job area, its transfer worker, its nodes (and their
    /// processes and spool directories, through `Forget`).
    fn release(&mut self, j: &Job) {
        if let Some(slot) = j.slot {
            self.slots[slot] = None;
            self.prims.memory().store(self.rm.term_hint.at(slot), 0);
        }
        if let Phase::Sending { .. } = j.phase {
            // The worker reports back and is forgotten; its slot frees when it does.
            if let Some(c) = &j.worker_cancel {
                c.store(true, Ordering::Release);
            }
        }
        if matches!(j.phase, Phase::Verifying { .. }) {
            self.transferring = self.transferring.difference(&j.nodes);
        }
        // A sending worker's nodes are freed when it reports back (`transfer_done`).
        if !j.nodes.is_empty() {
            self.policy.ended(j.id, self.since_epoch());
            self.run_set.retain(|r| *r != j.id);
            // What has not gone out yet never will: a launch must not start tasks that the
            // Forget behind it would kill at once.
            self.commands.retain(|c| match c {
                Command::Launch(spec) => spec.job != j.id,
                Command::ReceiveFile(info) => info.job != j.id,
                _ => true,
            });
            self.commands.push_back(Command::Forget { job: j.id });
        }
    }

    /// Removes a job, frees what it held, and tells its submitter how it ended.
    fn finish(
        &mut self,
        id: JobId,
        reason: Option<String>,
        ranks: Vec<Option<storm_cluster::messages::RankStatus>>,
    ) {
        let Some(mut j) = self.jobs.remove(&id) else {
            return;
        };
        self.release(&j);
        if j.client.is_none() && !j.held_output.is_empty() && self.reattach_until.is_some() {
            self.finished_output
                .insert(id, std::mem::take(&mut j.held_output));
        }
        let now = self.now();
        let us = |a: Option<Instant>, b: Option<Instant>| match (a, b) {
            (Some(a), Some(b)) if b >= a => (b - a).as_micros() as u64,
            _ => 0,
        };
        let execute_us = us(j.launched, Some(now));
        let timing = Timing {
            queued_us: us(Some(j.submitted), j.allocated),
            send_us: us(j.allocated, j.ready),
            launch_us: us(j.ready.or(j.allocated), j.launched),
            execute_us,
            start_us: j.ran.first_started_us.unwrap_or(0),
            run_us: j.ran.run_us(),
            report_us: j
                .ran
                .last_exited_us
                .map_or(0, |last| execute_us.saturating_sub(last)),
            total_us: us(Some(j.submitted), Some(now)),
        };
        tracing::info!(job = id, ?timing, "job ended");
        if let Some(launched) = j.launched {
            let send = j.req.bcast.then_some(timing.send_us);
            self.metrics.launched(
                send.map(Duration::from_micros),
                now.saturating_duration_since(launched),
            );
        }
        let outcome = JobOutcome {
            job: id,
            ranks,
            reason,
            abort_code: j.abort_code,
            timing,
            usage: j.ran.usage,
        };
        self.metrics.job_ended(outcome.exit_code() == 0);
        self.record_finished(JobRecord {
            id,
            uid: j.uid,
            gid: j.gid,
            req: j.req,
            submitted_ms: j.submitted_ms,
            state: JobState::Finished {
                nodes: j.nodes,
                outcome: outcome.clone(),
                ended_ms: self.unix_ms(),
            },
        });
        if let Some(c) = j.client {
            self.reply(c, Reply::Finished(outcome));
        }
    }

    /// Keeps a finished job for `storm history` and reattaching submitters, in memory and in
    /// the journal.
    fn record_finished(&mut self, rec: JobRecord) {
        self.unrecorded.remove(&rec.id);
        self.finished.insert(rec.id, rec.clone());
        while self.finished.len() > crate::journal::KEEP_FINISHED {
            self.finished.pop_first();
        }
        self.journal.put_job(rec);
    }
}

/// The journal's record of a job that has not ended.
fn job_record(j: &Job) -> JobRecord {
    JobRecord {
        id: j.id,
        uid: j.uid,
        gid: j.gid,
        req: j.req.clone(),
        submitted_ms: j.submitted_ms,
        state: match j.phase {
            Phase::Queued => JobState::Queued,
            _ => JobState::Started {
                nodes: j.nodes.clone(),
                cpus: j.cpus.clone(),
                slot: j.slot.unwrap_or(0) as u32,
                time_slot: j.time_slot as u32,
                launched_ms: j.launched_ms,
                program_hash: j.program_hash,
            },
        },
    }
}

/// What a job asks of the scheduling policy on nodes of `cpus` CPUs.
fn job_ask(job: JobId, req: &JobRequest, plan: &TaskPlan, cpus: u32) -> JobAsk {
    JobAsk {
        job,
        need: Need::of(plan.nodes, plan.ntasks, cpus, req.tasks.exclusive),
        limit: req.time_limit_ms.map(Duration::from_millis),
    }
}

/// How `storm history` shows a finished job.
fn finished_info(rec: &JobRecord) -> Option<JobInfo> {
    let JobState::Finished { nodes, outcome, .. } = &rec.state else {
        return None;
    };
    let code = outcome.exit_code();
    Some(JobInfo {
        job: rec.id,
        name: rec.req.name.clone(),
        uid: rec.uid,
        state: if code == 0 { "completed" } else { "failed" }.into(),
        nodes: nodes.clone(),
        cpus: None,
        ntasks: outcome.ranks.len() as u32,
        elapsed_ms: outcome.timing.total_us / 1000,
        reason: outcome.reason.clone(),
        time_slot: None,
        exit_code: Some(code),
        usage: outcome.usage,
    })
}

/// The launch command of a job placed on `nodes`.
fn launch_spec(
    id: JobId,
    slot: usize,
    req: &JobRequest,
    plan: &TaskPlan,
    nodes: &NodeSet,
    (uid, gid): (u32, u32),
) -> LaunchSpec {
    let program = if req.bcast {
        Program::Spooled(
            req.program
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| "program".into()),
        )
    } else {
        Program::Path(req.program.clone())
    };
    LaunchSpec {
        job: id,
        slot: slot as u32,
        nodes: nodes.clone(),
        ntasks: plan.ntasks,
        program,
        program_hash: None,
        args: req.args.clone(),
        env: req.env.clone(),
        cwd: req.cwd.clone(),
        uid,
        gid,
        reporter: nodes.last().unwrap_or(0),
        mpi: req.mpi,
    }
}

impl<E: MmEnv> std::fmt::Debug for MachineManager<E> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "MachineManager({} jobs)", self.jobs.len())
    }
}

/// The `storm-mm` daemon: starts a machine manager, tells the service manager it is ready
/// (control socket bound, endpoint up, journal restored), and hosts it until a shutdown
/// request or a signal: a timeslice runs at each [`MachineManager::poll_timeout`]; between
/// them the loop waits on the fabric ([`MachineManager::wait`]) and, when woken, hands the core
/// the requests that arrived and lets it take reports and send settled replies.
pub fn run(opts: MmOptions) -> Result<()> {
    let stop = opts.stop.clone();
    let (mut mm, incoming) = MachineManager::start(opts).context("starting the machine manager")?;
    let mut keys = KeyWatch::new(
        vec![
            (storm_cluster::key::CLUSTER_KEY, mm.cfg.key_path()),
            (storm_cluster::key::MM_KEY, mm.cfg.mm_key_paths().0),
        ],
        Duration::from_secs(mm.cfg.security.key_check_interval_s),
    )?;
    storm_cluster::daemon::notify_ready();
    loop {
        if keys.poll(Instant::now()) == Due::Reload {
            mm.reload_keys();
        }
        while let Ok(msg) = incoming.try_recv() {
            mm.handle(msg);
        }
        if Instant::now() >= mm.poll_timeout() {
            mm.tick();
        } else {
            mm.between_ticks();
        }
        if stop.load(Ordering::Acquire) {
            tracing::info!("stopping on a signal");
            break;
        }
        if mm.is_done() {
            mm.wait_heartbeats(Duration::from_millis(mm.cfg.tcp.op_timeout_ms));
            tracing::info!("shut down");
            break;
        }
        let due = mm.poll_timeout();
        mm.wait(due);
    }
    let _ = std::fs::remove_file(&mm.cfg.cluster.control_socket);
    Ok(())
}

/// A number that tells this MM process from any other that ran the cluster: the start time
/// and the pid.
fn incarnation() -> u64 {
    crate::journal::now_ms() << 22 | (std::process::id() as u64 & 0x3f_ffff)
}

/// `1m30s`-style text for a duration.
fn human(d: Duration) -> String {
    let secs = d.as_secs();
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}
