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
//!
//! One file per concern, each an `impl` block of [`MachineManager`] (this file keeps the loop,
//! scheduling, launches, cancellation and termination): [`job`] (a job and its phases),
//! [`requests`] (clients, limits, answers), [`publish`] (write-ahead: replies and launches once
//! the journal holds them), [`transfers`] (program transfers), [`heartbeat`] (Algorithm 4),
//! [`failure`], [`membership`], [`attention`], [`output`], [`pmi`], [`restart`] and [`saver`].

use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use bytes::Bytes;
use crossbeam_channel::{Receiver, Sender};
use storm_cluster::control::{JobInfo, JobOutcome, NodeInfo, Reply, Timing};
use storm_cluster::endpoint::{self, Listen};
use storm_cluster::identity::MmSigner;
use storm_cluster::keywatch::{Due, KeyWatch};
use storm_cluster::messages::{Command, JobId, MpiMode, NodeReport, decode_sealed};
use storm_cluster::{ClusterConfig, RmLayout};
use storm_primitives::helpers::{QueueConsumer, QueueProducer, epoch_base};
use storm_primitives::{NodeId, NodeSet, Primitives, Relation, Wait};

mod attention;
mod failure;
mod heartbeat;
mod job;
mod membership;
mod output;
mod pmi;
mod publish;
mod requests;
mod restart;
mod saver;
mod transfers;

use crate::control_server::{self, ClientId, Incoming};
use crate::env::{DaemonEnv, MmEnv};
use crate::journal::{JobRecord, JobState, Journal, Restored};
use crate::log_limit::LogLimit;
use crate::metrics::Metrics;
use crate::nodes::NodeTable;
use crate::policy::{Decision, Placement, Policy, PolicyKind};
use crate::transfer::TransferDone;
use heartbeat::InFlight;
use job::{
    Cancel, Job, NewJob, Phase, RanAt, finished_info, human, job_ask, job_record, launch_spec,
};
use requests::Client;

/// How to start a machine manager.
pub struct MmOptions {
    pub config: ClusterConfig,
    pub listen: Listen,
    /// Set to stop the MM (signal handlers set it).
    pub stop: Arc<AtomicBool>,
}

/// Bytes a heartbeat keeps free for its seal (an ed25519 signature, a time, framing).
pub const SEAL_ROOM: usize = 128;

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
