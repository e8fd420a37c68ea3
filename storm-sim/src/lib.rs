//! # storm-sim: the machine and node managers in virtual time
//!
//! One process holds a whole cluster on the local backend (`storm_primitives::local`): the
//! real machine manager core (`storm_mm::MachineManager`, every rule it has) and one
//! [`SimNode`] per node: the real node manager core (`storm_nm::NodeManager`) with tasks
//! that use virtual CPU time instead of processes. A
//! [`VirtualClock`] moves only when [`Sim::step`] moves it, one timeslice at a time, so a
//! test can state a rule exactly ("DOWN at the K-th missed heartbeat", "SIGKILL
//! `kill_wait_ms` after SIGTERM") and a run is the same every time.
//!
//! * [`Sim::step`], [`Sim::run_until`], [`Sim::run_for`]: time.
//! * [`Sim::submit`], [`Sim::cancel`]: requests, as storm-submit makes them (uid 1000).
//! * [`Sim::freeze`], [`Sim::cut`], [`Sim::kill`]: failures (a stopped NM; a pulled cable,
//!   the NM running on; a crashed node).
//! * [`Sim::restart_mm`]: a new MM process over the journal the old one committed.
//! * [`SimOptions::managers`], [`Sim::kill_leader`]: a replicated MM, its journal kept by a
//!   Raft group of replicas (raft-rs, in virtual time: [`group`]); the leader killed, the
//!   next elected, and its MM core started over its own copy of the journal.
//! * [`SimJob::program`]: a job whose program the MM sends; the transfer takes the launch
//!   model's time ([`TransferModel`]) and moves no bytes.
//!
//! * [`SimJob::lines`]: tasks that write lines; they cross the NM's own output forwarder and
//!   the MM's output queue to the client ([`Sim::output`]).
//!
//! Not simulated: what the NM does with processes, files and sockets (storm-pl, PMI, program
//! reception); see `docs/architecture.md`.
//!
//! Why this file is over 1,000 lines: `Sim` is one driver whose methods are the simulated
//! cluster's whole control surface (submit, fail, freeze, federate, step) and share its private
//! state; the federation methods are the part to move into a module of their own next.

pub mod env;
pub mod group;
mod journal;
pub mod node;
pub mod tasks;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cluster::clock::{Clock, VirtualClock};
use storm_cluster::config::PolicyKind;
use storm_cluster::control::{JobOutcome, JobRequest, NodeInfo, Reply, Request};
use storm_cluster::dependency::Dependency;
use storm_cluster::messages::{JobId, Stream};
use storm_cluster::tasks::TaskRequest;
use storm_cluster::{ClusterConfig, RmLayout};
use storm_mm::MachineManager;
use storm_mm::env::{Input, TransferDone};
use storm_mm::journal::Restored;
use storm_mm::manager::COPY_WAITS_AT_MOST;
use storm_primitives::local::{LocalFabric, thread_cpu};
use storm_primitives::{NodeId, Primitives};

use env::ProgramCopies;
pub use env::{SimEnv, TransferModel};
use journal::SimJournal;
pub use node::{Heard, NodeOptions, SimNode};
use storm_cluster::control::NodeState;
pub use tasks::{EXIT_CODE, IGNORE_SIGTERM, LINES, REAPED_AFTER};

/// The uid simulated jobs are submitted as.
pub const SIM_UID: u32 = 1000;

/// Timeslices within which the MM answers a submission: the next, or the one after a waiting
/// job's program copy was made.
const ANSWER_WITHIN_TICKS: usize = 3;

/// The shape of a simulated cluster.
#[derive(Debug, Clone)]
pub struct SimOptions {
    pub nodes: u32,
    /// CPUs of every node (a job of fewer tasks than one node's CPUs shares that node).
    pub cpus: u32,
    pub policy: PolicyKind,
    pub mpl: usize,
    pub timeslice: Duration,
    pub missed_heartbeats: u32,
    pub kill_wait: Duration,
    pub max_jobs: usize,
    /// Keep every heartbeat each node takes ([`SimNode::heard`]).
    pub record: bool,
    /// How long a program transfer takes.
    pub transfer: TransferModel,
    /// Hand the journal's commits over to be written at the next step, as the daemon's
    /// journal hands them to its thread (so that [`Sim::hold_journal`] can hold its writes),
    /// instead of committing in place.
    pub background_journal: bool,
    /// Gang scheduling: how long past its timeslice a node runs a slot whose next heartbeat
    /// is late (`[scheduler] slot_grace_ms`); `None` runs it until the heartbeat comes
    /// (`slot_lease = false`).
    pub slot_grace: Option<Duration>,
    /// Replicas of a replicated MM (3, 5, ...; 0 or 1: a single MM). With a group the journal
    /// hands its commits over, as `background_journal`, and they settle once a majority of
    /// the replicas holds them.
    pub managers: usize,
    /// How far the nodes' wall clocks read ahead of the MM's (behind, when negative), in
    /// milliseconds. It shows in the start time that an NM's registrations carry.
    pub node_clock_ahead_ms: i64,
    /// Peer clusters (`[federation]`, `[[peer]]`): the MM flocks jobs to them on what
    /// [`Sim::operator_request`]'s `PeerReport`s say of them.
    pub federation: storm_cluster::federation::FederationSection,
    pub peers: Vec<storm_cluster::federation::PeerEntry>,
    /// Guest slots after the cluster's own nodes (`<cluster>-<node>`, for node `node` of
    /// peer `cluster`): simulated nodes like the others, which a test kills at once
    /// ([`Sim::kill`]) to stand for nodes nobody lent yet.
    pub guests: Vec<storm_cluster::federation::GuestOf>,
    /// Features of the cluster's own nodes (`[[node]] features`), by node index.
    pub features: Vec<(u32, Vec<String>)>,
}

impl Default for SimOptions {
    fn default() -> Self {
        Self {
            nodes: 4,
            cpus: 1,
            policy: PolicyKind::Fcfs,
            mpl: 4,
            timeslice: Duration::from_millis(10),
            missed_heartbeats: 3,
            kill_wait: Duration::from_millis(500),
            max_jobs: 64,
            record: false,
            transfer: TransferModel::default(),
            background_journal: false,
            slot_grace: Some(Duration::from_millis(5)),
            managers: 0,
            node_clock_ahead_ms: 0,
            federation: Default::default(),
            peers: Vec::new(),
            guests: Vec::new(),
            features: Vec::new(),
        }
    }
}

/// A simulated job: `nodes` nodes, one task each, needing `work` of virtual time.
#[derive(Debug, Clone)]
pub struct SimJob {
    pub nodes: u32,
    /// Tasks in all (one per node if `None`); a job on one node with fewer tasks than the
    /// node's CPUs takes only that many CPUs.
    pub ntasks: Option<u32>,
    pub work: Duration,
    pub time_limit: Option<Duration>,
    pub requeue: bool,
    pub ignore_sigterm: bool,
    /// Bytes of a program the MM sends to the job's nodes before it launches (storm-submit's
    /// default); `None` runs a program already on every node (`--no-bcast`).
    pub program: Option<u64>,
    /// Lines each task writes to its standard output over its work (`rank R line I`).
    pub lines: u32,
    /// How long after a task ended its exit status is known (its launcher reaps it).
    pub reaped_after: Duration,
    /// What each task exits with once it has had its work.
    pub exit_code: i32,
    /// The job's name (`-J`; "sim" by default).
    pub name: String,
    /// `--dependency`, as storm-submit takes it.
    pub dependency: Option<Dependency>,
    /// A batch job (`storm batch`): one task, on the allocation's first node, and the job
    /// goes on without its submitter.
    pub batch: bool,
    /// A step of this running job (`storm-submit` inside it).
    pub step_of: Option<JobId>,
    /// `--array`, as storm batch takes it.
    pub array: Option<storm_cluster::control::ArraySpec>,
    /// The submission's token.
    pub token: Option<u64>,
    /// Where it may run (`--flock`, `--clusters`, `--no-flock`).
    pub flock: storm_cluster::flock::Flock,
    /// It may run on guest slots (`--borrow`), and fewer nodes will do (`--less`).
    pub borrow: bool,
    pub less: bool,
    /// The features its nodes must have (`--constraint`).
    pub constraint: Vec<String>,
    /// Which ranks read its submitter's standard input (`-i`; none by default here, rank 0
    /// in storm-submit): what [`Sim::send_input`] sends.
    pub input: storm_cluster::messages::InputTarget,
}

impl SimJob {
    pub fn new(nodes: u32, work: Duration) -> Self {
        Self {
            nodes,
            ntasks: None,
            work,
            time_limit: None,
            requeue: false,
            ignore_sigterm: false,
            program: None,
            lines: 0,
            reaped_after: Duration::ZERO,
            exit_code: 0,
            name: "sim".into(),
            dependency: None,
            batch: false,
            step_of: None,
            array: None,
            token: None,
            flock: Default::default(),
            borrow: false,
            less: false,
            constraint: Vec::new(),
            input: Default::default(),
        }
    }

    /// The same job as a job array (a batch job) with `--array text` (which must parse).
    pub fn with_array(mut self, text: &str) -> Self {
        self.batch = true;
        self.array = Some(text.parse().expect("a valid --array"));
        self
    }

    /// The same job, as a batch job.
    pub fn as_batch(mut self) -> Self {
        self.batch = true;
        self
    }

    /// The same job, as a step of job `job`.
    pub fn as_step_of(mut self, job: JobId) -> Self {
        self.step_of = Some(job);
        self
    }

    /// The same job, each task exiting `code`.
    /// The submission's token (`JobRequest::token`), as storm-submit draws one.
    pub fn with_token(mut self, token: u64) -> Self {
        self.token = Some(token);
        self
    }

    pub fn with_exit_code(mut self, code: i32) -> Self {
        self.exit_code = code;
        self
    }

    /// The same job, named `name`.
    pub fn with_name(mut self, name: &str) -> Self {
        self.name = name.into();
        self
    }

    /// The same job with `--dependency text` (which must parse).
    pub fn with_dependency(mut self, text: &str) -> Self {
        self.dependency = Some(text.parse().expect("a valid --dependency"));
        self
    }

    /// The same job, each task's exit status known only `delay` after it ended.
    pub fn with_reap_delay(mut self, delay: Duration) -> Self {
        self.reaped_after = delay;
        self
    }

    /// The same job with `ntasks` tasks in all.
    pub fn with_tasks(mut self, ntasks: u32) -> Self {
        self.ntasks = Some(ntasks);
        self
    }

    /// The same job, each task writing `lines` lines.
    pub fn with_lines(mut self, lines: u32) -> Self {
        self.lines = lines;
        self
    }

    /// The same job, sending a program of `bytes` first.
    pub fn with_program(mut self, bytes: u64) -> Self {
        self.program = Some(bytes);
        self
    }

    /// The request and, for a job that sends its program, the program's size.
    fn submission(&self) -> (Request, Option<u64>) {
        (Request::Submit(Box::new(self.request())), self.program)
    }

    fn request(&self) -> JobRequest {
        let mut args = vec![self.work.as_millis().to_string()];
        if self.ignore_sigterm {
            args.push(IGNORE_SIGTERM.into());
        }
        if self.lines > 0 {
            args.push(format!("{LINES}{}", self.lines));
        }
        if !self.reaped_after.is_zero() {
            args.push(format!("{REAPED_AFTER}{}", self.reaped_after.as_millis()));
        }
        if self.exit_code != 0 {
            args.push(format!("{EXIT_CODE}{}", self.exit_code));
        }
        JobRequest {
            args: args.into_iter().map(Into::into).collect(),
            tasks: TaskRequest {
                nodes: Some(self.nodes),
                ntasks: Some(self.ntasks.unwrap_or(self.nodes)),
                ..TaskRequest::default()
            },
            delivery: if self.program.is_some() {
                storm_cluster::control::Delivery::Broadcast
            } else {
                storm_cluster::control::Delivery::InPlace
            },
            time_limit_ms: self.time_limit.map(|d| d.as_millis() as u64),
            requeue: self.requeue,
            dependency: self.dependency.clone(),
            batch: self
                .batch
                .then(storm_cluster::messages::BatchOutput::default_files),
            step_of: self.step_of,
            array: self.array.clone(),
            token: self.token,
            flock: self.flock.clone(),
            borrow: self.borrow,
            less: self.less,
            constraint: self.constraint.clone(),
            input: self.input,
            ..JobRequest::new(self.name.clone(), "/sim/task", "/")
        }
    }
}

/// A cluster in virtual time (see the crate's overview).
pub struct Sim {
    clock: Arc<VirtualClock>,
    fabric: Arc<LocalFabric>,
    cfg: Arc<ClusterConfig>,
    rm: RmLayout,
    journal: SimJournal,
    /// The replicas of a replicated MM (`SimOptions::managers`).
    group: Option<group::Group>,
    mm: MachineManager<SimEnv>,
    incarnation: u64,
    nodes: Vec<SimNode>,
    /// The control connection the simulation's requests use.
    client: u64,
    next_client: u64,
    /// Requests made since the last timeslice (with the size of the program sent with a
    /// submission): the MM takes them at the start of the next, as the daemon's host does
    /// with what arrived on the control socket.
    requests: Vec<(Request, Option<u64>)>,
    /// The program copies "beside the journal", which outlive an MM.
    copies: ProgramCopies,
    /// Jobs the simulation's client submitted.
    submitted: Vec<JobId>,
    /// The peer agent's connections that follow the jobs it submitted here
    /// ([`Sim::submit_flocked`]), kept open as its followers keep theirs; what they are sent
    /// is read and dropped.
    followers: Vec<u64>,
    /// Replies to the simulation's requests, with the time they were sent.
    pub replies: Vec<(Instant, Reply)>,
    /// The client has stopped reading its replies ([`Sim::stop_reading`]).
    not_reading: bool,
    ticks: u64,
    cpu: SimCpu,
}

/// Processor time (of the simulating thread) spent in the MM core (its requests and ticks)
/// and in the node cores: what the MM's logic costs, apart from the nodes simulated with it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SimCpu {
    /// In the MM, the network's part of its primitives included.
    pub mm: Duration,
    /// Of `mm`, delivering the MM's transfers (copying a heartbeat into every node's memory):
    /// the network's work, which NICs do on a real machine.
    pub mm_network: Duration,
    /// In the node cores.
    pub nodes: Duration,
}

impl SimCpu {
    /// The MM's own work: `mm` without the network's part of its primitives.
    pub fn mm_logic(&self) -> Duration {
        self.mm.saturating_sub(self.mm_network)
    }
}

impl Sim {
    pub fn new(opts: SimOptions) -> Result<Self> {
        let cfg = Arc::new(config(&opts)?);
        let rm = RmLayout::new(&cfg)?;
        let clock = VirtualClock::new();
        let fabric = LocalFabric::new(cfg.node_count() + 1, rm.layout.clone());
        fabric.measure_network(true);
        let (group, journal, incarnation) = if opts.managers > 1 {
            let (group, leader, term) = elect_first(&opts, &cfg, &clock)?;
            let journal = SimJournal::over(group.store(leader));
            let incarnation = storm_cluster::messages::incarnation(term, 1, 0);
            (Some(group), journal, incarnation)
        } else {
            (None, SimJournal::new(opts.background_journal), 1)
        };
        let copies = ProgramCopies::default();
        let mm = new_mm(&cfg, &rm, &fabric, &journal, incarnation, |writer| {
            SimEnv::new(clock.clone(), opts.transfer, copies.clone(), writer)
        })?;
        let nodes = (0..cfg.node_count())
            .map(|n| {
                SimNode::new(
                    &cfg,
                    &rm,
                    n,
                    Arc::new(fabric.node(n)),
                    clock.clone(),
                    NodeOptions {
                        record: opts.record,
                        clock_ahead_ms: opts.node_clock_ahead_ms,
                        lease: sim_lease(&cfg, n, SIM_LEASE_MS),
                    },
                )
            })
            .collect();
        let mut sim = Self {
            client: 0,
            next_client: 1,
            requests: Vec::new(),
            copies,
            submitted: Vec::new(),
            followers: Vec::new(),
            not_reading: false,
            clock,
            fabric,
            cfg,
            rm,
            journal,
            group,
            mm,
            incarnation,
            nodes,
            replies: Vec::new(),
            ticks: 0,
            cpu: SimCpu::default(),
        };
        sim.connect()?;
        Ok(sim)
    }

    /// The virtual time now.
    pub fn now(&self) -> Instant {
        self.clock.now()
    }

    /// Virtual time since the simulation began.
    pub fn elapsed(&self) -> Duration {
        self.clock.elapsed()
    }

    /// Timeslices run so far.
    pub fn ticks(&self) -> u64 {
        self.ticks
    }

    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    pub fn mm_mut(&mut self) -> &mut MachineManager<SimEnv> {
        &mut self.mm
    }

    pub fn mm(&self) -> &MachineManager<SimEnv> {
        &self.mm
    }

    /// The fabric every node and the MM share (fabric node `config().mm_id()` is the MM).
    pub fn fabric(&self) -> &Arc<LocalFabric> {
        &self.fabric
    }

    /// The layout of the cluster's global memory.
    pub fn layout(&self) -> &RmLayout {
        &self.rm
    }

    pub fn node(&self, n: NodeId) -> &SimNode {
        &self.nodes[n as usize]
    }

    /// One timeslice: the clock moves to the MM's next tick, the MM takes the requests made
    /// since the last one and ticks, then every node takes what it was sent and reports what
    /// ended.
    pub fn step(&mut self) {
        // A request wakes a quiet MM, whose next timeslice then comes at the usual cadence.
        let tick = match self.requests.is_empty() {
            true => self.mm.poll_timeout(),
            false => self.mm.poll_timeout_with_input(),
        };
        self.step_nodes_before(tick);
        self.clock.advance_to(tick);
        let mm_start = thread_cpu();
        let network_start = self.fabric.network_cpu();
        self.land_transfers();
        for (req, program) in std::mem::take(&mut self.requests) {
            let program = program.map(|len| Ok(self.mm.env_mut().hold_program(len)));
            self.mm.handle(Input::Request {
                client: self.client,
                req,
                program,
            });
        }
        self.mm.tick();
        let nodes_start = thread_cpu();
        self.cpu.mm += nodes_start.saturating_sub(mm_start);
        self.cpu.mm_network += self.fabric.network_cpu().saturating_sub(network_start);
        self.ticks += 1;
        for node in &mut self.nodes {
            node.step();
        }
        self.cpu.nodes += thread_cpu().saturating_sub(nodes_start);
        self.collect_replies();
    }

    /// Steps, in time order, the nodes that must wake before `tick` (see [`SimNode::wake_at`]),
    /// as their daemons' loops would.
    fn step_nodes_before(&mut self, tick: Instant) {
        while let Some(at) = self
            .nodes
            .iter()
            .filter_map(SimNode::wake_at)
            .filter(|&at| at < tick)
            .min()
        {
            self.clock.advance_to(at.max(self.clock.now()));
            let nodes_start = thread_cpu();
            for node in &mut self.nodes {
                if node.wake_at().is_some_and(|w| w <= at) {
                    node.step();
                }
            }
            self.cpu.nodes += thread_cpu().saturating_sub(nodes_start);
        }
    }

    /// Node `n` takes the MM's next heartbeat (and anything else that arrives meanwhile)
    /// `late` after it arrives; its NM runs on meanwhile.
    pub fn delay_next_heartbeat(&mut self, n: NodeId, late: Duration) {
        let arrives = self.mm.poll_timeout();
        self.nodes[n as usize].hold_intake_until(arrives + late);
    }

    /// Lets virtual time run to `at` (at most the next timeslice) and wakes the MM there, as
    /// the daemon's loop is woken between timeslices: the simulated program transfers due by
    /// then land, and the MM takes what arrived ([`MachineManager::between_ticks`]).
    pub fn wake_at(&mut self, at: Instant) {
        self.clock.advance_to(at.min(self.mm.poll_timeout()));
        self.land_transfers();
        self.mm.between_ticks();
        self.collect_replies();
    }

    /// When the next simulated program transfer lands, if one is in flight.
    pub fn next_landing(&self) -> Option<Instant> {
        self.mm.env().next_landing()
    }

    /// The processor time the simulation has spent in the MM and in the nodes so far.
    pub fn cpu(&self) -> SimCpu {
        self.cpu
    }

    /// Steps until `done` holds (true) or `limit` of virtual time passed (false).
    pub fn run_until(&mut self, limit: Duration, mut done: impl FnMut(&Sim) -> bool) -> bool {
        let end = self.now() + limit;
        while self.now() < end {
            if done(self) {
                return true;
            }
            self.step();
        }
        done(self)
    }

    /// Steps for `d` of virtual time.
    pub fn run_for(&mut self, d: Duration) {
        self.run_until(d, |_| false);
    }

    /// A simulated cluster with every node up, as most tests start: [`Sim::new`], then
    /// [`Sim::run_until_up`] within 5 s of virtual time.
    pub fn up(opts: SimOptions) -> Result<Self> {
        let mut s = Self::new(opts)?;
        s.run_until_up(Duration::from_secs(5))?;
        Ok(s)
    }

    /// Steps until every node is up (or `limit` passes).
    pub fn run_until_up(&mut self, limit: Duration) -> Result<()> {
        if !self.run_until(limit, |s| {
            s.mm.nodes_view()
                .iter()
                .all(|n| n.state == NodeState::Idle || n.state == NodeState::Allocated)
        }) {
            bail!(
                "not every node came up within {limit:?}: {:?}",
                self.states()
            );
        }
        Ok(())
    }

    /// Submits `job`; returns its id once the MM accepted it: the next timeslice; for a job
    /// that waits with a program, the one after its copy beside the journal was made; for a
    /// job with a program given nodes at once, the one that journals its launch, or, if its
    /// program travels longer than a quarter second, the one after its copy was made (a submitter
    /// never hears of a job a restarted MM would not know).
    pub fn submit(&mut self, job: &SimJob) -> Result<JobId, String> {
        let before = self.replies.len();
        self.requests.push(job.submission());
        let slice = self.cfg.timeslice().max(Duration::from_micros(1));
        let ticks = match job.program {
            Some(_) => {
                ANSWER_WITHIN_TICKS + (COPY_WAITS_AT_MOST.as_nanos() / slice.as_nanos()) as usize
            }
            None => ANSWER_WITHIN_TICKS,
        };
        for _ in 0..ticks {
            self.step();
            for (_, r) in &self.replies[before..] {
                match r {
                    Reply::Accepted { job, .. } => {
                        self.submitted.push(*job);
                        return Ok(*job);
                    }
                    Reply::Error(e) => return Err(e.clone()),
                    _ => {}
                }
            }
        }
        Err(format!(
            "no answer to the submission in {ANSWER_WITHIN_TICKS} timeslices"
        ))
    }

    /// Sends a piece of standard input for `job` as its submitter (storm-submit's
    /// `Request::Input`), at the next timeslice.
    pub fn send_input(&mut self, job: JobId, offset: u64, data: &[u8], eof: bool) {
        self.requests.push((
            Request::Input {
                job,
                offset,
                data: data.to_vec(),
                eof,
            },
            None,
        ));
    }

    /// Submits every job of `jobs`, a few hundred per timeslice (the client reads its replies
    /// between timeslices, and the MM disconnects one that leaves too many unread); their ids
    /// in order, or the first refusal.
    pub fn submit_all(&mut self, jobs: &[SimJob]) -> Result<Vec<JobId>, String> {
        // An acceptance is a few dozen bytes: a quarter of the unread-reply limit in them.
        let per_slice = (self.cfg.limits.max_unread_reply_bytes as usize / 4 / 64).clamp(1, 256);
        let before = self.replies.len();
        for batch in jobs.chunks(per_slice) {
            for job in batch {
                self.requests.push(job.submission());
            }
            self.step();
        }
        let answered = |s: &Sim| {
            s.replies[before..]
                .iter()
                .filter(|(_, r)| matches!(r, Reply::Accepted { .. } | Reply::Error(_)))
                .count()
        };
        for _ in 0..ANSWER_WITHIN_TICKS {
            if answered(self) >= jobs.len() {
                break;
            }
            self.step();
        }
        let mut ids = Vec::with_capacity(jobs.len());
        for (_, r) in &self.replies[before..] {
            match r {
                Reply::Accepted { job, .. } => ids.push(*job),
                Reply::Error(e) => return Err(e.clone()),
                _ => {}
            }
        }
        if ids.len() != jobs.len() {
            return Err(format!(
                "{} of {} submissions answered",
                ids.len(),
                jobs.len()
            ));
        }
        self.submitted.extend(&ids);
        Ok(ids)
    }

    /// Node `n`'s global memory: (bytes its layout reserves, bytes touched). The MM is node
    /// `config().mm_id()`.
    pub fn memory(&self, n: NodeId) -> (usize, usize) {
        let node = self.fabric.node(n);
        let mem = storm_primitives::Primitives::memory(&node);
        (mem.len(), mem.resident_bytes())
    }

    /// The client goes away (a logout) and another connects, following none of the jobs
    /// the first submitted.
    pub fn hang_up(&mut self) -> Result<()> {
        self.mm.handle(Input::Gone {
            client: self.client,
        });
        self.submitted.clear();
        self.connect()
    }

    /// Cancels `job`, as its owner (taken at the next timeslice).
    pub fn cancel(&mut self, job: JobId) {
        self.request(Request::Cancel { job });
    }

    fn request(&mut self, req: Request) {
        self.requests.push((req, None));
    }

    /// Sends `job`'s submission, taken at the next timeslice, without waiting for its answer
    /// (see [`Sim::replies`]).
    pub fn send_submission(&mut self, job: &SimJob) {
        self.requests.push(job.submission());
    }

    /// Lets only `n` more program copies beside the journal complete (a slow disk); `None`
    /// lets every copy complete at the timeslice after it began, as by default.
    pub fn allow_copies(&mut self, n: Option<usize>) {
        self.mm.env_mut().allow_copies(n);
    }

    /// The copy of job `job`'s program beside the journal, under way (held by
    /// [`Sim::allow_copies`]), finds the program no longer of the size checked at its
    /// submission: its user changed it meanwhile (rebuilt it, or grew it on purpose), as
    /// the daemon's saver reports it. False if no copy of it was under way.
    pub fn change_program_during_copy(&mut self, job: JobId) -> bool {
        let Some(checked) = self.mm.env_mut().take_copy(job) else {
            return false;
        };
        self.mm.handle(Input::ProgramSaved {
            job,
            result: Err(storm_mm::journal::JournalError::ProgramChanged {
                job,
                checked,
                now: checked + 1,
            }),
        });
        true
    }

    /// What `storm queue` shows now, asked on a connection of its own (as the command
    /// opens one): the answer, which waits for the journal as every reply does.
    pub fn queue_listing(&mut self) -> Result<Vec<storm_cluster::control::JobInfo>, String> {
        let observer = self.open_connection();
        self.mm.handle(Input::Request {
            client: observer,
            req: Request::Queue,
            program: None,
        });
        let mut answer = None;
        for _ in 0..ANSWER_WITHIN_TICKS {
            self.step();
            answer = self
                .mm
                .env_mut()
                .read_replies(observer)
                .into_iter()
                .find_map(|r| match r {
                    Reply::Queue(list) => Some(list),
                    _ => None,
                });
            if answer.is_some() {
                break;
            }
        }
        self.mm.handle(Input::Gone { client: observer });
        let _ = self.mm.env_mut().read_replies(observer);
        answer
            .ok_or_else(|| format!("no answer to storm queue in {ANSWER_WITHIN_TICKS} timeslices"))
    }

    /// Completes the program transfers due by now: every reachable node of the job
    /// acknowledges the program, as its NM's receiver does, and the MM's worker reports (a
    /// cancelled transfer reports that it was cancelled). Program copies made since the last
    /// timeslice are reported too, as the daemon's saver thread reports them, and the
    /// journal's batches handed over since are written, unless the journal is held.
    fn land_transfers(&mut self) {
        if let Some(group) = &mut self.group {
            let batches = self
                .mm
                .env_mut()
                .journal
                .as_mut()
                .map(journal::JournalWriter::take)
                .unwrap_or_default();
            for b in &batches {
                group
                    .propose(b)
                    .expect("the leading replica takes its core's commits");
            }
            group.run_to(self.clock.now());
            for settled in group.take_settled() {
                self.mm.handle(Input::Persisted(settled));
            }
        } else if let Some(settled) = self.mm.env_mut().journal.as_mut().and_then(|w| w.write()) {
            self.mm.handle(Input::Persisted(settled));
        }
        let now = self.clock.now();
        for f in self.mm.env_mut().landed(now) {
            let t = f.transfer;
            let result = if f.cancelled {
                Err(storm_mm::env::Failure::new("cancelled".into()))
            } else {
                let ack = storm_cluster::messages::file_ack(t.transfer, true);
                for n in t.nodes.iter() {
                    if !self.nodes[n as usize].is_frozen() {
                        self.fabric.node(n).memory().store(self.rm.file_ack, ack);
                    }
                }
                // Modelled: no bytes, so no hash of them.
                Ok([0; 32])
            };
            self.mm.handle(Input::TransferDone(TransferDone {
                job: t.job,
                transfer: t.transfer,
                worker: t.worker,
                result,
                // Modelled in one step: the parts of its time are not.
                took: Default::default(),
            }));
        }
        for job in self.mm.env_mut().copies_made() {
            self.mm.handle(Input::ProgramSaved {
                job,
                result: Ok(()),
            });
        }
    }

    /// Freezes (or thaws) node `n`: its NM stops taking part, as a stopped process.
    pub fn freeze(&mut self, n: NodeId, frozen: bool) {
        self.fabric.freeze(n, frozen);
        self.nodes[n as usize].set_frozen(frozen);
    }

    /// Cuts (or mends) node `n`'s link: its NM runs on, but nothing passes between it and
    /// the rest of the machine.
    pub fn cut(&mut self, n: NodeId, cut: bool) {
        self.fabric.cut(n, cut);
    }

    /// Crashes node `n` for good.
    pub fn kill(&mut self, n: NodeId) {
        self.fabric.kill(n);
        self.nodes[n as usize].set_frozen(true);
    }

    /// Node `n`'s NM process ends, and its tasks with it (their cgroup is killed), and
    /// another starts in its place with fresh memory. The new one has the same pid (an NM in
    /// a container is often pid 1), and its node's wall clock now reads `clock_ahead_ms`
    /// ahead of the MM's (behind, when negative).
    pub fn restart_nm(&mut self, n: NodeId, clock_ahead_ms: i64) {
        self.restart_nm_showing(n, clock_ahead_ms, sim_lease(&self.cfg, n, SIM_LEASE_MS));
    }

    /// [`Sim::restart_nm`], its NM showing `lease` when it registers (a guest slot's grant,
    /// or none: [`sim_lease`] makes one).
    pub fn restart_nm_showing(
        &mut self,
        n: NodeId,
        clock_ahead_ms: i64,
        lease: Option<storm_cluster::identity::LeaseGrant>,
    ) {
        self.fabric.restart(n);
        let record = self.nodes[n as usize].records();
        self.nodes[n as usize] = SimNode::new(
            &self.cfg,
            &self.rm,
            n,
            Arc::new(self.fabric.node(n)),
            self.clock.clone(),
            NodeOptions {
                record,
                clock_ahead_ms,
                lease,
            },
        );
    }

    /// The MM's clock, as Unix ms (what a lease grant's end is compared with).
    pub fn unix_ms(&self) -> u64 {
        self.clock.unix_ms()
    }

    /// Ends the MM process and starts another over the journal it committed: a new
    /// incarnation, whose memory starts empty. The simulation's client connects again and
    /// reattaches to its jobs.
    pub fn restart_mm(&mut self) -> Result<()> {
        self.restart_mm_as(self.incarnation + 1)
    }

    /// [`Sim::restart_mm`] after the operator changed the MM's cluster file (`change`): the
    /// new MM reads the changed file; the nodes keep the one they started with.
    pub fn restart_mm_with(&mut self, change: impl FnOnce(&mut ClusterConfig)) -> Result<()> {
        let mut cfg = (*self.cfg).clone();
        change(&mut cfg);
        self.cfg = Arc::new(cfg);
        self.restart_mm()
    }

    /// [`Sim::restart_mm`] as the leader of Raft term `term` of a replicated MM: its
    /// incarnation carries the term (see `storm_cluster::messages::incarnation`), which the
    /// nodes use to refuse the MM of an older term once a newer one welcomed them.
    pub fn restart_mm_in_term(&mut self, term: u64) -> Result<()> {
        let uniq = self.incarnation + 1;
        self.restart_mm_as(storm_cluster::messages::incarnation(term, uniq, 0))
    }

    fn restart_mm_as(&mut self, incarnation: u64) -> Result<()> {
        if self.group.is_some() {
            bail!("the MM of a replicated group changes through kill_leader");
        }
        // What it handed its journal's thread is written before it goes.
        if let Some(w) = &mut self.mm.env_mut().journal {
            w.write_all();
        }
        self.replace_mm(incarnation)
    }

    /// Kills the leader of a replicated MM (`SimOptions::managers`): its MM process ends at
    /// once, with the commits it had not handed to the group, and its replica with it; the
    /// nodes run on. The other replicas elect a leader, whose MM core starts over its own
    /// copy of the journal in its term (the nodes join it, the client reattaches). The
    /// virtual time from the kill until the new core runs.
    pub fn kill_leader(&mut self) -> Result<Duration> {
        let mut group = self
            .group
            .take()
            .context("kill_leader needs a replicated MM (SimOptions::managers)")?;
        let killed = self.clock.now();
        let old = group.leader().context("no MM core leads the group")?;
        group.kill(old);
        let limit = killed + Duration::from_secs(10);
        let found = loop {
            if let Some(found) = group.ready_leader() {
                break Some(found);
            }
            if self.clock.now() >= limit {
                break None;
            }
            // No MM runs: the nodes go on, and the replicas' clocks.
            let next = self.clock.now() + self.cfg.timeslice();
            self.step_nodes_before(next);
            self.clock.advance_to(next);
            for node in &mut self.nodes {
                node.step();
            }
            group.run_to(next);
        };
        let Some((leader, term)) = found else {
            self.group = Some(group);
            bail!("no replica was elected within 10 s of virtual time");
        };
        group.lead(leader, term);
        self.journal = SimJournal::over(group.store(leader));
        self.group = Some(group);
        let uniq = self.incarnation + 1;
        self.replace_mm(storm_cluster::messages::incarnation(term, uniq, 0))?;
        Ok(self.clock.now() - killed)
    }

    /// The replica whose MM core runs, in a replicated MM.
    pub fn leader_replica(&self) -> Option<usize> {
        self.group.as_ref().and_then(group::Group::leader)
    }

    /// A new MM process, `incarnation`, over the journal: it starts with fresh global memory
    /// and no pending events; the old one's transfer workers ended with it, and the program
    /// copies are on its disk.
    fn replace_mm(&mut self, incarnation: u64) -> Result<()> {
        self.incarnation = incarnation;
        // The old MM's connections went with it; the agent's followers submit again.
        self.followers.clear();
        let mm_node = self.cfg.mm_id();
        self.fabric.restart(mm_node);
        let model = self.mm.env().model;
        let (clock, copies) = (self.clock.clone(), self.copies.clone());
        self.mm = new_mm(
            &self.cfg,
            &self.rm,
            &self.fabric,
            &self.journal,
            self.incarnation,
            |writer| SimEnv::new(clock, model, copies, writer),
        )?;
        self.connect()?;
        // Like storm-submit, the client reattaches to each job it has not seen end.
        let open: Vec<JobId> = self
            .submitted
            .iter()
            .copied()
            .filter(|&job| self.outcome(job).is_none())
            .collect();
        for job in open {
            self.request(Request::Attach { job });
        }
        Ok(())
    }

    /// Holds the journal's writes (a disk that stopped answering) until called with false;
    /// once let go, what was held is written at the next step. Needs
    /// `SimOptions::background_journal`.
    pub fn hold_journal(&mut self, held: bool) {
        self.mm
            .env_mut()
            .journal
            .as_mut()
            .expect("hold_journal needs SimOptions::background_journal")
            .hold(held);
    }

    /// What the MM's journal holds now: what a restarted MM would know.
    pub fn journaled(&self) -> Restored {
        self.journal.committed()
    }

    fn connect(&mut self) -> Result<()> {
        self.client = self.open_connection();
        Ok(())
    }

    /// Sends `req` as root on the MM's host (as the peer agent does) on a connection of its
    /// own, and steps until the MM answers; the answer.
    pub fn operator_request(&mut self, req: Request) -> Result<Reply, String> {
        let (client, answer) = self.root_request(req);
        self.mm.handle(Input::Gone { client });
        answer
    }

    /// `req` on a new connection as root on the MM's host, stepping until its first reply;
    /// the connection, left open, and that reply.
    fn root_request(&mut self, req: Request) -> (u64, Result<Reply, String>) {
        let id = self.next_client;
        self.next_client += 1;
        self.mm.handle(Input::Connected {
            client: id,
            uid: 0,
            gid: 0,
            relayed_from: None,
        });
        self.mm.handle(Input::Request {
            client: id,
            req,
            program: None,
        });
        for _ in 0..ANSWER_WITHIN_TICKS {
            self.step();
            if let Some(r) = self.mm.env_mut().read_replies(id).into_iter().next() {
                return (id, Ok(r));
            }
        }
        (
            id,
            Err(format!("no answer within {ANSWER_WITHIN_TICKS} timeslices")),
        )
    }

    /// Submits `job` as this cluster's peer agent does for peer cluster `origin`
    /// (`SubmitFlocked`, as root on the MM's host, for the simulation's user); the job's id.
    pub fn submit_flocked(&mut self, origin: &str, job: &SimJob) -> Result<JobId, String> {
        let (client, answer) = self.root_request(Request::SubmitFlocked {
            origin: origin.into(),
            uid: SIM_UID,
            gid: SIM_UID,
            req: Box::new(job.request()),
        });
        let answer = answer.and_then(|r| match r {
            Reply::Accepted { job, .. } => Ok(job),
            Reply::Error(e) => Err(e),
            other => Err(format!("unexpected answer {other:?}")),
        });
        // Like the agent's follower, the connection stays while the job runs.
        if answer.is_ok() {
            self.followers.push(client);
        } else {
            self.mm.handle(Input::Gone { client });
        }
        answer
    }

    /// A new control connection of the simulation's user to the MM.
    fn open_connection(&mut self) -> storm_mm::env::ClientId {
        let id = self.next_client;
        self.next_client += 1;
        self.mm.handle(Input::Connected {
            client: id,
            uid: SIM_UID,
            gid: SIM_UID,
            relayed_from: None,
        });
        id
    }

    /// The simulation's client stops reading what the MM sends it (or reads again): the
    /// replies wait unread, as behind a reply the MM's socket writer has not written yet, so
    /// the output they carry is not released on its nodes.
    pub fn stop_reading(&mut self, stop: bool) {
        self.not_reading = stop;
    }

    fn collect_replies(&mut self) {
        let now = self.now();
        let client = self.client;
        if !self.not_reading {
            for r in self.mm.env_mut().read_replies(client) {
                self.replies.push((now, r));
            }
        }
        for &f in &self.followers {
            let _ = self.mm.env_mut().read_replies(f);
        }
    }

    /// The peer agent's followers of the jobs flocked here leave (the agent withdrew them,
    /// or it died): the jobs go on with nobody following them.
    pub fn drop_followers(&mut self) {
        for client in std::mem::take(&mut self.followers) {
            self.mm.handle(Input::Gone { client });
        }
    }

    /// When job `job` ended and how, if it has.
    pub fn finished(&self, job: JobId) -> Option<(Instant, &JobOutcome)> {
        self.replies.iter().find_map(|(t, r)| match r {
            Reply::Finished(o) if o.job == job => Some((*t, o)),
            _ => None,
        })
    }

    /// What job `job`'s ranks wrote to `stream` as the client received it, by rank: each
    /// rank's bytes put in order by their offsets (a chunk sent again counts once), up to the
    /// first gap.
    pub fn output(&self, job: JobId, stream: Stream) -> BTreeMap<u32, String> {
        let mut pieces: BTreeMap<u32, BTreeMap<u64, &[u8]>> = BTreeMap::new();
        for (_, r) in &self.replies {
            if let Reply::Output(c) = r
                && c.job == job
                && c.stream == stream
            {
                pieces.entry(c.rank).or_default().insert(c.offset, &c.data);
            }
        }
        pieces
            .into_iter()
            .map(|(rank, chunks)| {
                let mut bytes = Vec::new();
                for (offset, data) in chunks {
                    let have = bytes.len() as u64;
                    if offset > have {
                        break;
                    }
                    let skip = ((have - offset) as usize).min(data.len());
                    bytes.extend_from_slice(&data[skip..]);
                }
                (rank, String::from_utf8_lossy(&bytes).into_owned())
            })
            .collect()
    }

    /// Every reply the client received, in order, with the virtual time it was read.
    pub fn replies(&self) -> &[(Instant, Reply)] {
        &self.replies
    }

    /// How job `job` ended, if it has.
    pub fn outcome(&self, job: JobId) -> Option<&JobOutcome> {
        self.finished(job).map(|(_, o)| o)
    }

    /// Steps until job `job` ends (at most `limit` of virtual time), and checks, as its
    /// submitter and its nodes see it, that it ran once to its end: no reason, exit 0, and
    /// its one task on each of nodes `0..nodes` started once. Panics otherwise (for tests).
    pub fn assert_ran_once_to_its_end(&mut self, job: JobId, nodes: NodeId, limit: Duration) {
        assert!(
            self.run_until(limit, |s| s.outcome(job).is_some()),
            "the job ends"
        );
        let outcome = self.outcome(job).unwrap();
        assert_eq!(outcome.reason, None, "{outcome:?}");
        assert_eq!(outcome.exit_code(), 0);
        for n in 0..nodes {
            assert_eq!(
                self.node(n).tasks_started(job),
                1,
                "its one task on node {n} started once"
            );
        }
    }

    /// When job `job` was told it started, each time it did (a requeued job starts again).
    pub fn started(&self, job: JobId) -> Vec<Instant> {
        self.replies
            .iter()
            .filter_map(|(t, r)| {
                matches!(r, Reply::Started { job: j, .. } if *j == job).then_some(*t)
            })
            .collect()
    }

    /// The state `storm nodes` shows for node `n`.
    pub fn state(&self, n: NodeId) -> NodeInfo {
        self.mm.nodes_view().swap_remove(n as usize)
    }

    fn states(&self) -> Vec<String> {
        self.mm
            .nodes_view()
            .into_iter()
            .map(|n| format!("{}={}", n.name, n.state))
            .collect()
    }
}

/// The cluster file of a simulation.
fn config(opts: &SimOptions) -> Result<ClusterConfig> {
    if opts.nodes == 0 {
        bail!("a simulated cluster needs at least one node");
    }
    let text = format!(
        r#"
        [cluster]
        name = "sim"
        [mm]
        address = "127.0.0.1:7000"
        [[node]]
        name = "sim[00000-{:05}]"
        address = "127.0.0.1:0"
        spool = "/nonexistent/storm-sim"
        cpus = {}
        "#,
        opts.nodes - 1,
        opts.cpus.max(1)
    );
    let mut cfg = ClusterConfig::parse(&text)?;
    cfg.cluster.timeslice_ms = opts.timeslice.as_secs_f64() * 1000.0;
    cfg.cluster.kill_wait_ms = opts.kill_wait.as_millis() as u64;
    cfg.cluster.max_jobs = opts.max_jobs;
    cfg.scheduler.policy = opts.policy;
    cfg.scheduler.mpl = opts.mpl;
    cfg.failure.missed_heartbeats = opts.missed_heartbeats;
    cfg.scheduler.slot_lease = opts.slot_grace.is_some();
    if let Some(grace) = opts.slot_grace {
        cfg.scheduler.slot_grace_ms = grace.as_secs_f64() * 1000.0;
    }
    cfg.federation = opts.federation.clone();
    cfg.peers = opts.peers.clone();
    // A simulated lender's MM key is no file ([`SimEnv`] hands it over); the path is named
    // as a borrower's file must.
    for p in cfg.peers.iter_mut().filter(|p| p.borrow) {
        p.mm_public_key_file
            .get_or_insert_with(|| format!("/storm-sim/{}-mm.pub", p.name).into());
    }
    // Guest slots: entries like the first node's, standing for the peers' nodes.
    let template = cfg.nodes[0].clone();
    for g in &opts.guests {
        cfg.nodes.push(storm_cluster::config::NodeEntry {
            name: format!("{}-{}", g.cluster, g.node),
            guest_of: Some(g.clone()),
            ..template.clone()
        });
    }
    for (n, features) in &opts.features {
        let Some(node) = cfg.nodes.get_mut(*n as usize).filter(|_| *n < opts.nodes) else {
            bail!("features for node {n}, which the simulated cluster does not have");
        };
        node.features = features.clone();
    }
    Ok(cfg)
}

/// The replicas of a new replicated MM, and the first leader elected with its term.
fn elect_first(
    opts: &SimOptions,
    cfg: &ClusterConfig,
    clock: &Arc<VirtualClock>,
) -> Result<(group::Group, usize, u64)> {
    let r = &cfg.replication;
    let heartbeat = Duration::from_millis(r.heartbeat_ms);
    let ticks = (r.election_timeout_ms / r.heartbeat_ms).max(4) as usize;
    let mut group = group::Group::new(opts.managers, heartbeat, ticks, clock.now())?;
    for _ in 0..1000 {
        if let Some((leader, term)) = group.ready_leader() {
            group.lead(leader, term);
            return Ok((group, leader, term));
        }
        clock.advance_to(clock.now() + heartbeat);
        group.run_to(clock.now());
    }
    bail!("the simulated manager group elected no leader")
}

fn new_mm(
    cfg: &ClusterConfig,
    rm: &RmLayout,
    fabric: &Arc<LocalFabric>,
    journal: &SimJournal,
    incarnation: u64,
    env: impl FnOnce(Option<journal::JournalWriter>) -> SimEnv,
) -> Result<MachineManager<SimEnv>> {
    let (journal, restored, writer) = journal.open()?;
    let env = env(writer);
    MachineManager::new(
        storm_mm::MmParts {
            config: cfg.clone(),
            rm: rm.clone(),
            fabric: Arc::new(fabric.node(cfg.mm_id())),
            journal,
            restored,
            incarnation,
            signer: storm_cluster::identity::MmSigner::new(mm_signing_key(), &cfg.cluster.name),
        },
        env,
    )
}

/// The signing key of every simulated lender's MM: the grants of the guest slots' leases
/// ([`sim_lease`]) are signed with it.
pub fn lender_signing_key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[0x1e; 32])
}

/// A lease grant for guest slot `n` of `cfg` (`None` for an own node) from its lender, until
/// `until_ms`: what a lent node's guest NM shows when it registers.
pub fn sim_lease(
    cfg: &ClusterConfig,
    n: NodeId,
    until_ms: u64,
) -> Option<storm_cluster::identity::LeaseGrant> {
    let g = cfg.nodes.get(n as usize)?.guest_of.as_ref()?;
    let lender = storm_cluster::identity::MmSigner::new(lender_signing_key(), &g.cluster);
    Some(lender.grant_lease(&cfg.cluster.name, &g.node, until_ms))
}

/// How long a simulated guest slot's lease runs: for the whole of any simulation.
const SIM_LEASE_MS: u64 = u64::MAX / 4;

/// The simulated MM's signing key (the same in every simulation: nothing secret is at stake).
pub fn mm_signing_key() -> ed25519_dalek::SigningKey {
    ed25519_dalek::SigningKey::from_bytes(&[0x5a; 32])
}
