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
//! [`requests`] (clients, limits, answers), [`admission`] (when a queued job enters the
//! policy: dependencies, array throttles), [`publish`] (write-ahead: replies and launches once
//! the journal holds them), [`transfers`] (program transfers), [`heartbeat`] (Algorithm 4),
//! [`failure`], [`membership`], [`lending`], [`attention`], [`output`], [`pmi`], [`restart`], and
//! [`steps`] (jobs inside a running job's allocation).

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Result;
use storm_cluster::control::{EndCause, JobInfo, JobOutcome, NodeInfo, Reply, Timing};
use storm_cluster::identity::MmSigner;
use storm_cluster::messages::{Command, JobId, MpiMode, NodeReport, decode_sealed};
use storm_cluster::{ClusterConfig, RmLayout};
use storm_primitives::helpers::QueueConsumer;
use storm_primitives::{NodeSet, Primitives, Relation, Wait};

mod admission;
mod answers;
mod attention;
mod borrowing;
mod exit_wait;
mod failure;
mod fit;
mod flock;
mod health;
mod heartbeat;
mod history;
mod input;
mod job;
mod lending;
mod limits;
mod membership;
mod output;
mod pmi;
mod pmix_exchange;
mod publish;
mod quiet;
mod records;
mod requests;
mod restart;
mod steps;
mod transfers;

pub use publish::COPY_WAITS_AT_MOST;

use crate::env::{ClientId, MmEnv};
use crate::journal::{JobRecord, JobState, Journal, Restored};
use crate::metrics::Metrics;
use crate::nodes::NodeTable;
use crate::policy::{Decision, Placement, Policy, PolicyKind};
use job::{
    Cancel, Job, NewJob, Phase, RanAt, finished_info, human, job_ask, job_record, launch_spec,
};

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
    /// Membership, failures and drains of the nodes.
    nodes: NodeTable,
    /// The heartbeat (Algorithm 4): its queue, the commands it carries, receipt checks.
    hb: heartbeat::HeartbeatSender,
    /// Program transfers (Algorithm 6): workers, the nodes they send to.
    transfers: transfers::Transfers,
    /// Clients, their replies and the journal: what the MM tells goes out once recorded.
    outbox: publish::Outbox,
    /// What an MM restarted over its journal holds back for reattaching submitters.
    reattach: restart::Reattach,
    /// A signal of the termination event was handed in ([`Input::TerminationSignalled`]):
    /// the next look at terminations counts it.
    term_announced: bool,
    /// MPI jobs some of whose nodes said their ranks ended since the last look: a fence the
    /// others wait in may never be whole (see `pmi`).
    pmi_ended: BTreeSet<JobId>,
    /// A PMI fence result was not confirmed: look at the nodes' parts again next tick.
    pmi_recheck: bool,
    /// The seal (length and checksum) of what each PMIx job's nodes were last sent of its
    /// exchange (see `pmix_exchange`).
    pmix_sent: BTreeMap<JobId, [u8; 12]>,
    /// When `--wait` jobs' report areas are read next (see `exit_wait`).
    next_wait_scan: Instant,
    /// A job ended, started, or came held: look at the held jobs again at the next
    /// timeslice (see [`admission`]).
    queue_changed: bool,
    /// How many jobs hold each submitted program (an array's elements share one).
    program_holders: BTreeMap<crate::env::ProgramId, usize>,
    /// Queued jobs not admitted to the policy yet (see [`admission`]), and steps (see
    /// [`steps`]): what a timeslice looks at without walking every job.
    held: BTreeSet<JobId>,
    steps: BTreeSet<JobId>,
    /// The live jobs that submissions made, by their submitter's uid and token (an array's
    /// by its first element): a submission sent again finds its job (see `requests`).
    submissions: std::collections::HashMap<(u32, u64), JobId>,
    /// Each node's output queue, and the entries taken from it not yet released.
    outputs: Vec<output::NodeOutput>,
    /// Which nodes signalled since the last timeslice.
    attention: attention::Attention,
    /// The job areas (`max_jobs`): which job holds each.
    slots: Vec<Option<JobId>>,
    shutting_down: bool,
    /// Jobs that ended, as the journal keeps them.
    finished: history::History,
    /// Seals commands and membership messages (see `storm_cluster::identity`).
    signer: MmSigner,
    /// What `storm metrics` shows.
    metrics: Metrics,
    /// When the last timeslice began (to tell the MM's own stalls from nodes' silence).
    pub(super) last_tick: Instant,
    /// When the next timeslice is due.
    next_tick: Instant,
    /// Where the sweep of the nodes' records stands ([`records`]).
    sweep: records::Sweep,
    /// Each node's recent samples.
    node_history: crate::node_history::NodeHistory,
    /// The peer agent's last report of the peer clusters, and when it came (soft state: the
    /// agent reports again every `[federation] advertise_ms`).
    peers: Option<(Instant, Vec<storm_cluster::federation::PeerInfo>)>,
    /// What the peers offer for flocking, from those reports (see [`flock`]).
    peer_room: flock::PeerRoom,
    /// What this cluster asked its lenders for (see [`borrowing`]).
    borrowing: borrowing::Borrowing,
    /// Each node's memory for jobs: declared, or as its NM detected it (0: not known yet).
    node_mem: Vec<u64>,
    /// Each node's features, as bits (`ClusterConfig::features`).
    node_features: Vec<u64>,
    /// The cluster file names guest slots (nodes peers may lend here).
    has_guests: bool,
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
        let node_features = cfg.node_feature_masks();
        // Declared memory now; the others' when their NMs register.
        let node_mem: Vec<u64> = cfg.nodes.iter().map(|n| n.mem.map_or(0, |m| m.0)).collect();
        let mut fit = crate::policy::NodeFit::with_features(node_features.clone());
        for (n, mem) in node_mem.iter().enumerate() {
            fit.set_memory(n as storm_primitives::NodeId, *mem);
        }
        let mut policy = crate::policy::build(
            cfg.scheduler.policy,
            fit,
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
            hb: heartbeat::HeartbeatSender::new(&cfg, &rm, now),
            transfers: transfers::Transfers::new(cfg.cluster.max_transfers),
            outbox: publish::Outbox::new(journal),
            reattach: restart::Reattach::new(incarnation),
            policy,
            nodes: NodeTable::new(cfg.node_count(), cfg.failure.missed_heartbeats),
            term_announced: false,
            pmi_ended: BTreeSet::new(),
            pmi_recheck: false,
            pmix_sent: BTreeMap::new(),
            next_wait_scan: now,
            queue_changed: true,
            program_holders: BTreeMap::new(),
            held: BTreeSet::new(),
            steps: BTreeSet::new(),
            submissions: Default::default(),
            gang: cfg.scheduler.policy == PolicyKind::Gang,
            epoch: now,
            run_set: Vec::new(),
            run_rotates: false,
            slots: vec![None; cfg.cluster.max_jobs],
            jobs: BTreeMap::new(),
            next_job: 1,
            shutting_down: false,
            finished: history::History::new(cfg.history.clone()),
            signer,
            metrics: Metrics::new(),
            last_tick: now,
            next_tick: now,
            sweep: records::Sweep::new(now),
            node_history: crate::node_history::NodeHistory::new(
                cfg.nodes.len(),
                cfg.monitoring.history_points(),
            ),
            peers: None,
            peer_room: Default::default(),
            borrowing: Default::default(),
            node_mem,
            node_features,
            has_guests: cfg.has_guest_slots(),
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
        let settled = self.outbox.journal.settled();
        let launchable = self.jobs.values().any(|j| j.phase.may_launch(settled));
        if launchable {
            self.next_tick = self.next_tick.min(self.now());
        }
    }

    /// Whether a shutdown was asked for, its commands have gone out (or no node is left to
    /// take them), and the replies waiting for the journal (the shutdown's own "done" among
    /// them, behind the records of the jobs it ended) have gone. The host then waits for the
    /// last heartbeat ([`MachineManager::wait_heartbeats`]) and stops.
    pub fn is_done(&self) -> bool {
        self.shutting_down
            && (self.hb.commands.is_empty() || self.hb.queue.dest().is_empty())
            && self.outbox.replies.is_empty()
    }

    /// The environment, for a host or a simulator that looks inside it.
    pub fn env(&self) -> &E {
        &self.env
    }

    /// The environment, for a host that turns what arrived into [`Input`]s.
    pub fn env_mut(&mut self) -> &mut E {
        &mut self.env
    }

    /// The configuration the MM runs with.
    pub fn config(&self) -> &ClusterConfig {
        &self.cfg
    }

    /// The MM's endpoint, and the layout of global memory: a host waits on the fabric for
    /// the termination event between timeslices ([`crate::env::Input::TerminationSignalled`]).
    pub fn fabric(&self) -> (&Arc<dyn Primitives>, &RmLayout) {
        (&self.prims, &self.rm)
    }

    /// Records how long a timeslice took in real time (the host measures it: decisions read
    /// only the environment's clock).
    pub fn tick_took(&mut self, took: Duration) {
        self.metrics.ticked(took);
    }

    /// Seals what the MM sends with a new signing key from now on (the host read it again:
    /// SIGHUP, or a key being rotated, docs/security.md).
    pub fn replace_signer(&mut self, signer: MmSigner) {
        self.signer = signer;
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
        let now = self.now();
        // A stall of the MM's own (it was not scheduled, or swapped) is nobody's silence.
        let gap = now.saturating_duration_since(self.last_tick);
        let slice = self.cfg.timeslice();
        // What the MM meant to wait: a timeslice, or longer while quiet.
        let meant = self
            .next_tick
            .saturating_duration_since(self.last_tick)
            .max(slice);
        if gap > meant + slice * 2 {
            self.nodes.excuse(gap - meant);
        }
        self.last_tick = now;
        self.attention.collect(&*self.prims, now);
        self.membership();
        self.enforce_silence(now);
        self.sweep_records(now);
        self.take_finished_transfers();
        self.report_transfer_progress();
        self.verify_transfers();
        self.advance_recoveries(now);
        self.expire_history();
        self.end_leases();
        if !self.shutting_down {
            self.release_held();
            self.release_parked_outcomes();
            self.end_reattach_window(now);
            self.admit_waiting();
            self.end_orphan_steps();
            self.schedule();
            self.flock_jobs();
            self.share_nodes();
        }
        self.enforce_limits();
        self.enforce_exit_waits();
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
        let after = self.now();
        self.next_tick += slice;
        if self.next_tick < after {
            self.next_tick = after;
        }
        if self.is_quiet()
            && let Some(last) = &self.hb.last
        {
            // In whole timeslices: they stay on their grid, so that what is due K periods
            // after a heartbeat is seen then, not between two timeslices.
            self.next_tick = self.next_tick.max(self.hb.next_quiet(last));
        }
    }

    /// Asks the policy for this timeslice's decisions and applies them; answers submissions
    /// made since the last timeslice; starts program transfers that can start.
    fn schedule(&mut self) {
        let free_slots = self.slots.iter().filter(|s| s.is_none()).count();
        // Steps first: they hold nothing the policy could give away (their allocation's
        // nodes), only a job area each.
        let steps = self.steps_to_place(free_slots);
        let decisions = self
            .policy
            .tick(self.since_epoch(), free_slots - steps.len());
        let starting: Vec<JobId> = decisions
            .iter()
            .filter_map(|d| match d {
                Decision::Start { job, .. } => Some(*job),
                Decision::Run { .. } => None,
            })
            .chain(steps.iter().map(|(job, _)| *job))
            .collect();
        // Answer submissions: those starting now without a reason, before their Started.
        let unanswered: Vec<(ClientId, JobId)> = self.outbox.unanswered.drain(..).collect();
        for &(client, job) in unanswered.iter().filter(|(_, j)| starting.contains(j)) {
            self.reply(client, Reply::Accepted { job, queued: None });
        }
        let steps = steps
            .into_iter()
            .map(|(job, placed)| Decision::Start { job, placed });
        // Steps before the run set, which names them once placed.
        for d in steps.chain(decisions) {
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
                    let jobs = self.with_steps(jobs);
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
            if let Some(j) = self.jobs.get_mut(&id) {
                j.end_cause.get_or_insert(EndCause::Timeout);
            }
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
        // MPI fences, `--kill-on-bad-exit` and `--wait` read nodes' reports before the job
        // ends: none of an earlier run in this slot (a requeue) may be taken for this one's.
        if self.jobs.get(&id).is_some_and(|j| {
            j.req.mpi != MpiMode::None || j.req.kill_on_bad_exit || j.req.exit_wait_s > 0
        }) {
            self.clear_pmi_parts(slot, &nodes);
        }
        let now = self.now();
        let Some(j) = self.jobs.get_mut(&id) else {
            // Not reached while the table and the policy agree (`remove_job`); should they
            // not, the job is gone: its place is given back rather than the MM lost.
            tracing::error!(
                job = id,
                "the policy started a job the MM no longer holds: skipped"
            );
            self.slots[slot] = None;
            self.policy.ended(id, self.since_epoch());
            return;
        };
        j.nodes = nodes.clone();
        j.cpus = share.cpus;
        j.slot = Some(slot);
        j.time_slot = time_slot;
        j.allocated = Some(now);
        j.phase = Phase::Allocated;
        self.outbox.unrecorded.insert(id);
        tracing::info!(job = id, nodes = %nodes, cpus = ?j.cpus, time_slot, "job starts");
        let started = Reply::Started {
            job: id,
            ntasks: job::tasks_launched(&j.req, &j.plan),
            nodes,
            node_names: names,
            time_slot: gang.then_some(time_slot as u32),
        };
        let (client, in_place) = (j.client, j.in_place);
        if in_place {
            j.ready = Some(now);
        }
        if let Some(c) = client {
            self.reply(c, started);
        }
        if in_place {
            self.queue_launch(id);
        }
    }

    /// Readies job `id`'s launch: its record, saying it started (and to which NM processes,
    /// for a restarted MM to tell a node that never got the launch from one that lost the
    /// job), goes to the journal first, and the launch follows once that commit settled
    /// ([`MachineManager::release_launches`]).
    fn queue_launch(&mut self, id: JobId) {
        let now_ms = self.unix_ms();
        // Every node given to a job is a member, so its NM process is known.
        let launched_to = self.jobs[&id]
            .nodes
            .iter()
            .filter_map(|n| self.nodes.get(n).nm.map(|p| (n, p)))
            .collect();
        let j = self.jobs.get_mut(&id).expect("job");
        j.launched_ms = Some(now_ms);
        j.launched_to = launched_to;
        j.phase = Phase::Recording { batch: None };
        self.outbox.unrecorded.insert(id);
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
        for step in self.steps_of(id) {
            self.cancel(step, format!("its job {id} was cancelled"));
        }
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        j.end_cause.get_or_insert(EndCause::Cancelled);
        match j.phase {
            Phase::Queued => {
                // `finish` takes it out of the policy's queue.
                // A flocked job's peer cancels its copy when it is no longer listed.
                let at = match &j.flocked {
                    Some(f) if f.started => format!(" while it ran on peer cluster {}", f.peer),
                    Some(f) => format!(" on its way to peer cluster {}", f.peer),
                    None => " before it started".into(),
                };
                self.finish(id, Some(format!("{reason}{at}")), Vec::new());
            }
            // Its launch has not gone out: nothing runs anywhere.
            Phase::Allocated | Phase::Recording { .. } => {
                self.finish(id, Some(format!("{reason} before it started")), Vec::new());
            }
            Phase::Checking { .. } | Phase::Sending { .. } | Phase::Verifying { .. } => {
                if let Phase::Sending { transfer, .. } | Phase::Checking { transfer, .. } = j.phase
                {
                    self.env.cancel_transfer(transfer);
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
                self.hb.commands.push_back(Command::Signal {
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
            self.hb.commands.push_back(Command::Signal {
                job,
                signal: libc::SIGKILL,
            });
        }
    }

    // ---------------------------------------------------------------- heartbeat

    /// Waits up to `timeout` for the heartbeat in flight to complete. It blocks on the fabric:
    /// a host calls it once, when the MM [`is_done`](MachineManager::is_done).
    pub fn wait_heartbeats(&mut self, timeout: Duration) {
        let deadline = self.now() + timeout;
        while self.hb.in_flight.is_some() && self.now() < deadline {
            match self.prims.test_event(
                self.rm.hb_sent,
                Wait::Timeout(deadline.saturating_duration_since(self.now())),
            ) {
                Ok(true) | Err(_) => self.hb.in_flight = None,
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
                    // A node whose ranks ended may be one an MPI fence waits for (`pmi`).
                    if j.req.mpi != MpiMode::None {
                        self.pmi_ended.insert(j.id);
                    }
                }
            }
            self.end_for_failed_ranks();
            self.end_waited_jobs();
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
        let ntasks = {
            let j = &self.jobs[&id];
            job::tasks_launched(&j.req, &j.plan) as usize
        };
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
        let j = &self.jobs[&id];
        let reason = j.cancel.as_ref().map(|c| c.reason.clone()).or_else(|| {
            // What a node said of a batch script that could not start.
            let said = j.unsent.lines().next()?.trim();
            (!said.is_empty()).then(|| said.to_string())
        });
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
        if let Phase::Sending { transfer, .. } | Phase::Checking { transfer, .. } = j.phase {
            // The worker reports back and is forgotten; its slot frees when it does.
            self.env.cancel_transfer(transfer);
        }
        if matches!(j.phase, Phase::Verifying { .. }) {
            self.transfers.busy_nodes = self.transfers.busy_nodes.difference(&j.nodes);
        }
        // A sending worker's nodes are freed when it reports back (`transfer_done`).
        if !j.nodes.is_empty() {
            // A step's nodes are its allocation's.
            if j.req.step_of.is_none() {
                self.policy.ended(j.id, self.since_epoch());
            }
            self.run_set.retain(|r| *r != j.id);
            // What has not gone out yet never will: a launch must not start tasks that the
            // Forget behind it would kill at once.
            self.hb.commands.retain(|c| match c {
                Command::Launch(spec) => spec.job != j.id,
                Command::LaunchPiece { job, .. } => *job != j.id,
                Command::ReceiveFile(info) => info.job != j.id,
                Command::Input { job, .. } => *job != j.id,
                _ => true,
            });
            // Once the journal holds the job's end (see `Outbox::forgets`).
            self.outbox.forgets.push((j.id, None));
        }
    }

    /// Puts a job in the table, and in the indexes of held jobs and steps.
    fn add_job(&mut self, job: Job) {
        if job.req.step_of.is_some() {
            self.steps.insert(job.id);
        } else if job.phase == Phase::Queued && !job.admitted {
            self.held.insert(job.id);
        }
        if let Some(key) = job::submission_key(job.id, job.uid, &job.req) {
            self.submissions.insert(key, job.id);
        }
        self.jobs.insert(job.id, job);
    }

    /// Takes a job out of the table and its indexes, and out of the policy's queue if it
    /// waits there: the table and the queue never disagree, so no decision of the policy
    /// names a job the table has lost (a user whose program changed while it waited once
    /// crashed the MM that way).
    fn remove_job(&mut self, id: JobId) -> Option<Job> {
        self.held.remove(&id);
        self.steps.remove(&id);
        let job = self.jobs.remove(&id)?;
        if job.phase == Phase::Queued && job.admitted {
            self.policy.withdraw(id);
        }
        if let Some(key) = job::submission_key(job.id, job.uid, &job.req) {
            self.submissions.remove(&key);
        }
        Some(job)
    }

    /// Removes a job, frees what it held, and tells its submitter how it ended.
    fn finish(
        &mut self,
        id: JobId,
        reason: Option<String>,
        ranks: Vec<Option<storm_cluster::messages::RankStatus>>,
    ) {
        let Some(mut j) = self.remove_job(id) else {
            return;
        };
        self.queue_changed = true;
        self.release(&j);
        if let Some(p) = j.program.take() {
            self.let_go_of_program(p);
        }
        if j.client.is_none() && !j.held_output.is_empty() && self.reattach.until.is_some() {
            self.reattach
                .finished_output
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
            record_us: us(j.ready.or(j.allocated), j.recorded),
            verified_us: j.ran.verified_us.unwrap_or(0),
            prepared_us: j.ran.prepared_us.unwrap_or(0),
            asked_us: j.ran.asked_us.unwrap_or(0),
            execute_us,
            start_us: j.ran.first_started_us.unwrap_or(0),
            run_us: j.ran.run_us(),
            report_us: j
                .ran
                .last_exited_us
                .map_or(0, |last| execute_us.saturating_sub(last)),
            reported_us: j.ran.reported_us.unwrap_or(0),
            total_us: us(Some(j.submitted), Some(now)),
        };
        tracing::info!(job = id, ?timing, "job ended");
        if let Some(launched) = j.launched {
            let send = (!j.in_place).then_some(timing.send_us);
            self.metrics.launched(
                send.map(Duration::from_micros),
                now.saturating_duration_since(launched),
            );
        }
        // A rank's failure ended it: its code and cause, named first.
        let (reason, abort_code) = match &j.culprit {
            Some(c) => {
                let status = ranks.get(c.rank as usize).copied().flatten();
                (Some(c.reason(status)), c.exit_code(status).or(j.abort_code))
            }
            None => (reason, j.abort_code),
        };
        let mut outcome = JobOutcome {
            job: id,
            ranks,
            reason,
            abort_code,
            timing,
            usage: j.ran.usage,
            cause: j.end_cause,
            broadcast: !j.in_place && j.program_hash.is_some(),
        };
        // sacct's OUT_OF_MEMORY: it failed, and the kernel killed some of its processes for
        // want of memory (counted in its cgroups).
        if outcome.cause.is_none()
            && outcome.exit_code() != 0
            && outcome.usage.oom_kills.is_some_and(|n| n > 0)
        {
            outcome.cause = Some(EndCause::OutOfMemory);
        }
        self.record_end(j, outcome);
    }

    /// Counts, journals and tells the submitter of job `j` (taken out of the table) that it
    /// ended with `outcome`.
    fn record_end(&mut self, j: Job, outcome: JobOutcome) {
        self.metrics.job_ended(outcome.exit_code() == 0);
        self.record_finished(JobRecord {
            id: j.id,
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
