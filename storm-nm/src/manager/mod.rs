//! The node manager's core: every rule, and no I/O of its own but the fabric (see
//! [`crate::env`]).
//!
//! Join the cluster (see [`crate::membership`]); take heartbeats from the heartbeat queue
//! (Algorithm 5); carry out each heartbeat's commands for this node; then, on every pass, look
//! at the tasks that ended and, when all of a job's local tasks have ended and their output is
//! delivered, report their exit statuses to the MM and set `terminated[slot]` (Algorithm 9).
//! The job's last node also announces the termination to the MM.
//!
//! The tasks outlive the node's membership: when the NM registers again (it was cut off,
//! frozen, or the MM restarted) it keeps every job the MM still knows, and when the MM is a
//! new process, it reports again the jobs that ended (their reports were in the old MM's
//! memory) once their output has been sent again.
//!
//! A host calls [`NodeManager::step`] with the wait [`NodeManager::poll_timeout`] asks for,
//! until [`NodeManager::is_done`]; the daemon's host is [`crate::daemon`], the simulator's
//! steps with no wait at virtual times.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use storm_cluster::config::PolicyKind;
use storm_cluster::cpu_bind;
use storm_cluster::identity::{MmVerifier, Seal, SealError};
use storm_cluster::messages::{
    Command, FileInfo, Heartbeat, HeldJob, JobId, LaunchSpec, MAX_LAUNCH_BYTES, MpiMode,
    NodeTiming, Program, RankStatus, Stream, decode, expand_output_pattern,
};
use storm_cluster::tasks::ranks_on;
use storm_cluster::{ClusterConfig, RmLayout};
use storm_primitives::log_limit::LogLimit;
use storm_primitives::{NodeId, PrimError, Primitives};

use crate::env::{NmEnv, SwitchRecord, TaskId, TaskStart, TaskTimes};
use crate::membership::{Event, Identity, Registration};
use crate::output::Drained;
use crate::pmi::{JobFacts, process_mapping};
use crate::report::{Ended, Reporter};
use crate::singleton;

mod ending;
mod gang;
mod start;
mod task_env;

/// How long after its tasks ended a job's output pipes may stay open (held by a process the
/// task left behind) before the NM stops reading them and reports the job.
const OUTPUT_GRACE: Duration = Duration::from_secs(2);

/// How long a gang switch waits, inside the heartbeat, for the old slot's tasks to stop
/// before it leaves the rest to the NM's loop (which looks again every millisecond).
const SWITCH_INLINE_WAIT: Duration = Duration::from_millis(5);
/// How often a switch waiting for tasks to stop is looked at again.
const SWITCH_RECHECK: Duration = Duration::from_millis(1);
/// The first look again for the exit status of a task whose output has drained: its
/// launcher writes the status once it has reaped the task, a moment after the task's pipes
/// closed (which is what woke the NM). Later looks wait as long as the NM has waited so far.
const EXIT_RECHECK_FIRST: Duration = Duration::from_micros(100);

/// How long to wait before looking again at tasks that are exiting, `waited` after the first
/// began to: as long as they have taken so far (at least [`EXIT_RECHECK_FIRST`]), but never
/// past `idle`, which a slot's lease about to run out shortens below that minimum (CI saw
/// `clamp` panic there, with min above max, and the NM die).
fn exit_recheck(waited: Duration, idle: Duration) -> Duration {
    waited.max(EXIT_RECHECK_FIRST).min(idle)
}

/// A switch whose old slot still has not stopped after this long is logged.
const SWITCH_WARN: Duration = Duration::from_millis(50);
/// A task that has not acted on SIGSTOP after this long is stuck in the kernel (a hung file
/// system): its pending SIGSTOP still stops it before it runs user code again, so the new
/// slot runs rather than wait for it indefinitely.
const SWITCH_GIVE_UP: Duration = Duration::from_secs(1);

/// A gang switch in progress: the old slot's jobs have been sent SIGSTOP; the new slot's are
/// continued once those have stopped.
struct Switch {
    /// The heartbeat whose schedule the switch carries out (the latest, if several came
    /// while it waited) and the one that began it.
    seq: u64,
    from: u64,
    received_ns: u128,
    since: Instant,
    stopped: Vec<JobId>,
    warned: bool,
}

/// What a node manager is made of besides its environment.
pub struct NmParts {
    /// The cluster file (shared: a simulation's nodes all read one).
    pub config: Arc<ClusterConfig>,
    pub rm: RmLayout,
    pub node: NodeId,
    /// This node's primitives endpoint.
    pub fabric: Arc<dyn Primitives>,
    /// Who registers with the MM; its clock should be the environment's.
    pub identity: Identity,
    /// How long a report to the MM may take to complete.
    pub report_wait: Duration,
    /// The PMI-1 client library `--mpi openmpi` tasks are told to load.
    pub pmi_library: PathBuf,
    /// A guest NM (a node lent to the cluster of `config`, docs/federation.md): every job's
    /// files and tasks are this local account's (uid, gid), whoever the borrower's MM says
    /// owns the job. The borrower's word for a uid reaches no user of the lending cluster.
    pub guest_user: Option<(u32, u32)>,
    /// The CPUs this NM may run tasks on (its own affinity: the machine's, or a Slurm
    /// allocation's cpuset), in order: index `i` of a job's held CPUs is `cpus[i % len]`
    /// (`--cpu-bind`, [`storm_cluster::cpu_bind`]).
    pub cpus: Vec<u32>,
}

struct LocalRank {
    rank: u32,
    /// The runner's task; none for a task that never started.
    task: Option<TaskId>,
    status: Option<RankStatus>,
    output: Drained,
    /// Gang scheduling has stopped the task, or holds its slot before the task starts.
    stopped: bool,
    /// Whether it loaded an MPI library (see `singleton`).
    mpi: crate::singleton::Probe,
}

impl LocalRank {
    fn unstarted(rank: u32, status: RankStatus) -> Self {
        Self {
            rank,
            task: None,
            status: Some(status),
            output: Arc::new(AtomicU32::new(0)),
            stopped: false,
            mpi: Default::default(),
        }
    }

    fn live_task(&self) -> Option<TaskId> {
        self.task.filter(|_| self.status.is_none())
    }
}

struct LocalJob {
    spec: LaunchSpec,
    ranks: Vec<LocalRank>,
    /// Out of its time slot: its tasks are kept stopped.
    suspended: bool,
    /// Signalled to end: it runs until it does, whatever the schedule.
    ending: bool,
    exited_at: Option<Instant>,
    /// When this node took the heartbeat that launched it ([`NmEnv::stamp_ns`]).
    launched_ns: u128,
    /// How far its start got here, and when (the phases its report gives).
    stamps: LaunchStamps,
    output_closed: bool,
    reported: bool,
    /// Reported to another MM process: reported again to this one once the output that
    /// process may not have passed on has been sent again.
    report_again: bool,
    /// The local rank whose failure ended the job here (`--kill-on-bad-exit`).
    culprit: Option<u32>,
    /// The local rank that ended first, and when (`--wait` counts from it).
    first_ended: Option<(u32, Instant)>,
    /// The other local ranks were stopped because they outlived `first_ended` by `--wait`.
    waited: bool,
    /// When this NM stopped the job's local ranks of its own accord (`--kill-on-bad-exit`,
    /// `--wait`) with SIGTERM: those still running `[cluster] kill_wait_ms` later get
    /// SIGKILL, as a cancel's do (until then the node cannot report, so nothing else would).
    stopped_at: Option<Instant>,
}

/// When a job's start passed each phase on this node ([`NmEnv::stamp_ns`]).
#[derive(Debug, Clone, Copy, Default)]
struct LaunchStamps {
    /// Its launch heartbeat's seal was checked.
    verified_ns: Option<u128>,
    /// Its program was checked and its PMI server set up.
    prepared_ns: Option<u128>,
    /// Every local task was handed to the launcher.
    asked_ns: Option<u128>,
}

impl LocalJob {
    /// A job as it starts on this node; `ending` for one whose tasks never start here.
    fn new(spec: LaunchSpec, ranks: Vec<LocalRank>, ending: bool, launched_ns: u128) -> Self {
        Self {
            spec,
            ranks,
            suspended: false,
            ending,
            exited_at: None,
            launched_ns,
            stamps: LaunchStamps::default(),
            output_closed: false,
            reported: false,
            report_again: false,
            culprit: None,
            first_ended: None,
            waited: false,
            stopped_at: None,
        }
    }

    /// Whether its local ranks still running have outlived the first to end by `--wait`
    /// (and have not been stopped for it, or for anything else, yet).
    fn outlived_wait(&self, now: Instant) -> bool {
        let wait = Duration::from_secs(u64::from(self.spec.exit_wait_s));
        self.spec.exit_wait_s > 0
            && !self.ending
            && !self.waited
            && self.culprit.is_none()
            && self
                .first_ended
                .is_some_and(|(_, at)| now.saturating_duration_since(at) >= wait)
    }

    /// Whether gang scheduling keeps this job's tasks stopped.
    fn held_out(&self) -> bool {
        self.suspended && !self.reported && !self.ending
    }
}

/// Where a job stands on this node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JobState {
    /// Launched under gang scheduling; its time slot has not come yet.
    Waiting,
    /// Some of its tasks run.
    Running,
    /// Out of its time slot: its tasks are stopped.
    Suspended,
    /// Every local task has ended (reported or not yet).
    Ended,
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stepped {
    /// Took a heartbeat or a membership message.
    Message,
    /// Nothing arrived within the wait.
    Idle,
}

/// The node manager's core (see the module's overview).
pub struct NodeManager<E: NmEnv> {
    env: E,
    cfg: Arc<ClusterConfig>,
    node: NodeId,
    mm: NodeId,
    rm: RmLayout,
    prims: Arc<dyn Primitives>,
    registration: Registration,
    report_wait: Duration,
    pmi_library: PathBuf,
    /// A guest NM's account for every job (see [`NmParts::guest_user`]).
    guest_user: Option<(u32, u32)>,
    /// The CPUs this NM may run tasks on (see [`NmParts::cpus`]).
    cpus: Vec<u32>,
    jobs: BTreeMap<JobId, LocalJob>,
    /// Jobs launched under gang scheduling whose time slot has not come yet.
    pending: BTreeMap<JobId, LaunchSpec>,
    /// Launches arriving in pieces (`Command::LaunchPiece`): the pieces so far, by job.
    assembling: BTreeMap<JobId, Vec<Vec<u8>>>,
    /// The jobs the latest gang schedule runs.
    run: Vec<JobId>,
    /// A gang switch waiting for the old slot to stop.
    switch: Option<Switch>,
    /// Until when the latest schedule's slot may run without the next heartbeat (its
    /// `lease_us`, counted from its receipt); past it every job here is stopped.
    lease: Option<Instant>,
    /// The heartbeat whose schedule was applied last.
    last_schedule: Option<u64>,
    /// Leases that ran out, logged at most 5 times a minute.
    late_heartbeats: LogLimit,
    /// The MM process (incarnation) and output queue epoch of the current membership.
    incarnation: Option<u64>,
    /// Checks the MM's seal on every command this node carries out.
    mm_key: MmVerifier,
    /// The latest heartbeat whose sealed commands were carried out (in this incarnation):
    /// an older or repeated one is refused.
    last_sealed: Option<u64>,
    /// Commands refused for their seal, logged at most 20 times every 10 s.
    refused: LogLimit,
    /// When the latest heartbeat was taken ([`NmEnv::stamp_ns`]): jobs it launches count
    /// their timing from it.
    heard_ns: u128,
    /// When the last heartbeat's seal was checked ([`NmEnv::stamp_ns`]).
    verified_ns: u128,
    output_epoch: u32,
    /// Since when some task's output has drained but its exit status is not known yet: the
    /// NM looks again soon, rather than at its next heartbeat, to report the end at once.
    exiting_since: Option<Instant>,
    /// A heartbeat said to shut down.
    done: bool,
}

impl<E: NmEnv> NodeManager<E> {
    /// A node manager about to register with the MM; it opens nothing and starts nothing.
    pub fn new(parts: NmParts, env: E) -> Self {
        let NmParts {
            config: cfg,
            rm,
            node,
            fabric: prims,
            identity,
            report_wait,
            pmi_library,
            guest_user,
            cpus,
        } = parts;
        let mm = cfg.mm_id();
        let mm_key = identity.mm.clone();
        let registration = Registration::new(
            prims.clone(),
            rm.clone(),
            node,
            mm,
            Duration::from_millis(cfg.failure.rejoin_after_ms),
            identity,
        );
        Self {
            env,
            cfg,
            node,
            mm,
            rm,
            prims,
            registration,
            report_wait,
            pmi_library,
            guest_user,
            cpus,
            jobs: BTreeMap::new(),
            pending: BTreeMap::new(),
            assembling: BTreeMap::new(),
            run: Vec::new(),
            switch: None,
            lease: None,
            last_schedule: None,
            late_heartbeats: LogLimit::with_burst(Duration::from_secs(60), 5),
            incarnation: None,
            mm_key,
            last_sealed: None,
            refused: LogLimit::with_burst(Duration::from_secs(10), 20),
            heard_ns: 0,
            verified_ns: 0,
            output_epoch: 0,
            exiting_since: None,
            done: false,
        }
    }

    /// The cluster file this node runs by.
    pub fn config(&self) -> Arc<ClusterConfig> {
        Arc::clone(&self.cfg)
    }

    /// Checks the MM's seals with `mm` from now on (its keys read again: one rotated).
    pub fn set_mm_keys(&mut self, mm: MmVerifier) {
        self.registration.set_mm_keys(mm.clone());
        self.mm_key = mm;
    }

    pub fn env(&self) -> &E {
        &self.env
    }

    pub fn env_mut(&mut self) -> &mut E {
        &mut self.env
    }

    /// How long the next step may wait for a message: short while a gang switch waits for
    /// tasks to stop, else a few timeslices (the tasks are looked at on every step).
    pub fn poll_timeout(&self) -> Duration {
        let mut idle = if self.switch.is_some() {
            SWITCH_RECHECK
        } else {
            (self.cfg.timeslice() * 10).clamp(Duration::from_millis(1), Duration::from_millis(50))
        };
        if let Some(until) = self.lease {
            idle = idle.min(until.saturating_duration_since(self.env.clock().now()));
        }
        match self.exiting_since {
            Some(since) => {
                let waited = self.env.clock().now().saturating_duration_since(since);
                exit_recheck(waited, idle)
            }
            None => idle,
        }
    }

    /// Whether a heartbeat said to shut down.
    pub fn is_done(&self) -> bool {
        self.done
    }

    /// One pass: waits up to `wait` for a heartbeat or membership message and carries it out,
    /// goes on with a gang switch under way, and reports the jobs whose tasks here all ended.
    /// An error is the fabric's (`ShutDown` once the endpoint is closed).
    pub fn step(&mut self, wait: Duration) -> Result<Stepped, PrimError> {
        if self.registration.registering() {
            // Before a registration goes out: see `ForwarderState::hold`.
            self.env.output().state().hold();
        }
        // The inventory is made only when a registration goes out.
        let (jobs, pending) = (&self.jobs, &self.pending);
        let stepped = match self.registration.next(wait, &|| held_jobs(jobs, pending))? {
            Event::Heartbeat(bytes) => {
                self.heartbeat(&bytes);
                Stepped::Message
            }
            Event::Welcomed {
                output_epoch,
                incarnation,
                keep,
            } => {
                self.new_membership(output_epoch, incarnation, &keep);
                self.registration.acknowledge();
                Stepped::Message
            }
            Event::Idle => Stepped::Idle,
        };
        if self.env.output().state().stalled() {
            self.registration
                .rejoin("output could not be delivered to the MM");
        }
        self.tend();
        Ok(stepped)
    }

    /// What the NM does between messages, at every step: stops the slot whose lease ran
    /// out, goes on with a gang switch under way, and reports the jobs whose tasks here all
    /// ended. (A host that holds messages back, as the simulator's late node does, calls it
    /// alone.)
    pub fn tend(&mut self) {
        self.expire_lease();
        self.finish_switch(Duration::ZERO);
        self.poll_tasks();
    }

    /// When the current slot's lease runs out, if it has one: the NM must look by then.
    pub fn lease_deadline(&self) -> Option<Instant> {
        self.lease
    }

    /// Kills every job's tasks (the NM is stopping).
    pub fn shut_down(&mut self) {
        tracing::info!(node = self.node, "node manager stopping");
        for job in self.jobs.keys().copied().collect::<Vec<_>>() {
            self.signal_job(job, libc::SIGKILL);
        }
    }

    /// Where job `job` stands here, if this node holds it.
    pub fn job_state(&self, job: JobId) -> Option<JobState> {
        if self.pending.contains_key(&job) {
            return Some(JobState::Waiting);
        }
        let j = self.jobs.get(&job)?;
        Some(if j.ranks.iter().all(|r| r.status.is_some()) {
            JobState::Ended
        } else if j.ranks.iter().any(|r| r.status.is_none() && !r.stopped) {
            JobState::Running
        } else {
            JobState::Suspended
        })
    }

    /// How many jobs this node holds (launched here and not yet forgotten).
    pub fn job_count(&self) -> usize {
        self.jobs.len()
    }

    /// The jobs this node holds, as its registration lists them.
    pub fn held_jobs(&self) -> Vec<HeldJob> {
        held_jobs(&self.jobs, &self.pending)
    }

    /// Carries out one heartbeat.
    fn heartbeat(&mut self, bytes: &[u8]) {
        let received_ns = self.env.stamp_ns();
        self.heard_ns = received_ns;
        let hb: Heartbeat = match decode("heartbeat", bytes, self.cfg.cluster.heartbeat_bytes) {
            Ok(hb) => hb,
            Err(e) => {
                tracing::error!(node = self.node, "ignoring a heartbeat: {e}");
                return;
            }
        };
        self.env.heard(hb.seq, received_ns, &hb.commands);
        let mut commands = hb.commands;
        if let Err(e) = self.check_seal(hb.seq, &commands, hb.seal.as_ref()) {
            if let Some(more) = self.refused.allow(self.env.clock().now()) {
                tracing::error!(
                    node = self.node,
                    seq = hb.seq,
                    suppressed = more,
                    "refusing a heartbeat's commands: {e}"
                );
            }
            // The schedule rides on the links' protection alone (docs/security.md).
            commands.retain(|c| matches!(c, Command::Schedule { .. }));
        }
        self.verified_ns = self.env.stamp_ns();
        for mut cmd in commands {
            if cmd.nodes().is_some_and(|n| !n.contains(self.node)) {
                continue;
            }
            if let Some(user) = self.guest_user {
                if !guest_obeys(&cmd) {
                    tracing::warn!(
                        "refusing a lend from the borrower: a guest NM lends nothing (the node is \
                         its lender's, not the borrower's)"
                    );
                    continue;
                }
                cmd.run_as(user);
            }
            match cmd {
                Command::ReceiveFile(info) => self.receive_file(info),
                Command::CheckProgram(check) => self.env.spool().check(check),
                Command::Launch(spec) => self.launch(spec),
                Command::LaunchPiece {
                    job,
                    index,
                    count,
                    bytes,
                    ..
                } => {
                    if let Some(spec) = self.launch_piece(job, index, count, bytes) {
                        self.launch(spec);
                    }
                }
                Command::Signal { job, signal } => self.signal_job(job, signal),
                Command::Forget { job } => self.forget(job),
                Command::Schedule { run, lease_us } => {
                    self.last_schedule = Some(hb.seq);
                    self.lease = (lease_us > 0)
                        .then(|| self.env.clock().now() + Duration::from_micros(lease_us.into()));
                    self.apply_schedule(hb.seq, received_ns, &run);
                }
                Command::Shutdown => self.done = true,
                Command::Lend {
                    peer,
                    until_ms,
                    grant,
                    ..
                } => self.env.guest().start(&peer, until_ms, &grant),
                Command::EndLend { .. } => self.env.guest().stop(),
                Command::Input {
                    job,
                    offset,
                    data,
                    eof,
                    ..
                } => self.input(job, offset, data, eof),
            }
        }
    }

    /// Whether the commands of heartbeat `seq` that concern this node are the current MM's,
    /// sealed for this heartbeat and not carried out before. A heartbeat with nothing for
    /// this node but the schedule needs no seal.
    fn check_seal(
        &mut self,
        seq: u64,
        commands: &[Command],
        seal: Option<&Seal>,
    ) -> Result<(), SealError> {
        let mine = |c: &Command| {
            !matches!(c, Command::Schedule { .. })
                && c.nodes().is_none_or(|n| n.contains(self.node))
        };
        if !commands.iter().any(mine) {
            return Ok(());
        }
        let incarnation = self.incarnation.ok_or(SealError::NotWelcomed)?;
        if let Some(last) = self.last_sealed.filter(|&last| seq <= last) {
            return Err(SealError::Replayed { seq, last });
        }
        let now_ms = self.env.clock().unix_ms();
        self.mm_key
            .check_commands(incarnation, seq, commands, seal, now_ms)?;
        self.last_sealed = Some(seq);
        Ok(())
    }

    /// The MM welcomed this node into a new membership that keeps the jobs of `keep`: any
    /// other job ended with the earlier membership (its nodes were told to forget it, or the
    /// MM no longer knows it), so it goes here too. Program transfers start afresh; output
    /// goes on in the new queue epoch, starting with what the MM may not have passed on.
    fn new_membership(&mut self, output_epoch: u32, incarnation: u64, keep: &[JobId]) {
        let jobs: Vec<JobId> = self
            .jobs
            .keys()
            .chain(self.pending.keys())
            .copied()
            .filter(|job| !keep.contains(job))
            .collect();
        for job in jobs {
            tracing::warn!(
                node = self.node,
                job,
                "ending a job the MM no longer knows here"
            );
            self.env.output().discard_job(job);
            self.forget(job);
        }
        // A new MM process lost the reports in the old one's memory, and the output the old
        // one took but never released: that goes again in the new epoch. Until it has been
        // delivered and the job reported again, this node's termination flag must not tell
        // the new MM that the job ended here (it would end the job, and drop the output that
        // came after).
        if self.incarnation.is_some_and(|i| i != incarnation) {
            let mem = self.prims.memory();
            for j in self.jobs.values_mut().filter(|j| j.reported) {
                j.reported = false;
                j.report_again = true;
                let flag = self.rm.terminated.at(j.spec.slot as usize);
                if mem.load(flag) == j.spec.job {
                    mem.store(flag, 0);
                }
            }
        }
        if self.incarnation != Some(incarnation) {
            // Another MM process numbers its heartbeats afresh.
            self.last_sealed = None;
        }
        self.incarnation = Some(incarnation);
        self.env.spool().stop_all();
        // A restarted MM numbers its transfers afresh, so the chunk queue's epochs start
        // over: the queue goes back to its never-used state (a producer then waits for this
        // node's receiver, whatever epoch it starts at), and an acknowledgement left from the
        // earlier membership must not answer for a new transfer.
        self.prims.memory().store(self.rm.chunks.dequeued, 0);
        self.prims.memory().store(self.rm.file_ack, 0);
        self.output_epoch = output_epoch;
        self.env.output().new_epoch(output_epoch);
        self.env.pmi().resend();
    }

    fn receive_file(&mut self, info: FileInfo) {
        if let Some(why) = info.problem(self.cfg.limits.max_program_bytes) {
            tracing::error!(
                node = self.node,
                job = info.job,
                "ignoring a file transfer: {why}"
            );
            return;
        }
        self.env.spool().receive(info);
    }

    /// LAUNCH-JOB. Under gang scheduling the job's tasks are started at the first strobe that
    /// runs the job, so no task ever runs outside its time slot, not even briefly.
    fn launch(&mut self, mut spec: LaunchSpec) {
        if spec.nodes.rank(self.node).is_none() {
            return;
        }
        if let Some((uid, gid)) = self.guest_user {
            (spec.uid, spec.gid) = (uid, gid);
        }
        let c = &self.cfg.cluster;
        let root_refused = (spec.uid == 0 && !self.cfg.security.allow_root_jobs)
            .then(|| "a job as root, which [security] allow_root_jobs forbids".to_string());
        if let Some(why) = root_refused
            .or_else(|| spec.problem(self.cfg.node_count(), c.max_jobs, c.max_tasks_per_node))
        {
            tracing::error!(
                node = self.node,
                job = spec.job,
                "ignoring an impossible launch: {why}"
            );
            return;
        }
        if self.jobs.contains_key(&spec.job) || self.pending.contains_key(&spec.job) {
            // Launched again for a node that missed the first launch; this one did not.
            return;
        }
        self.reporter().prepare_slot(&spec);
        if self.cfg.scheduler.policy == PolicyKind::Gang {
            self.pending.insert(spec.job, spec);
        } else {
            self.spawn_job(spec);
        }
    }

    /// storm-submit's standard input for the local tasks of `job` that read it. A job not
    /// started yet here (gang scheduling starts it at its first slot) gets it all the same:
    /// the forwarder keeps it until the task's pipe is there.
    fn input(&mut self, job: JobId, offset: u64, data: Vec<u8>, eof: bool) {
        let spec = match (self.jobs.get(&job), self.pending.get(&job)) {
            (Some(j), _) => &j.spec,
            (None, Some(spec)) => spec,
            (None, None) => return,
        };
        let Some(k) = spec.nodes.rank(self.node) else {
            return;
        };
        let (first, count) = ranks_on(spec.ntasks, spec.nodes.len() as u32, k as u32);
        let target = spec.input;
        for rank in (first..first + count).filter(|&r| target.includes(r)) {
            self.env
                .output()
                .input(job, rank, offset, data.clone(), eof);
        }
    }

    /// Takes piece `index` of `count` of a job's launch; the launch, once every piece is
    /// here in order. Piece 0 starts again (the launch is sent again to a node that missed a
    /// piece); a piece out of order, or past the size a node assembles, drops what came.
    fn launch_piece(
        &mut self,
        job: JobId,
        index: u32,
        count: u32,
        bytes: Vec<u8>,
    ) -> Option<LaunchSpec> {
        if index == 0 {
            self.assembling.insert(job, Vec::new());
        }
        let pieces = self.assembling.get_mut(&job)?;
        let total: usize = pieces.iter().map(Vec::len).sum::<usize>() + bytes.len();
        if pieces.len() as u32 != index || index >= count || total > MAX_LAUNCH_BYTES {
            tracing::warn!(
                node = self.node,
                job,
                index,
                count,
                "a piece of a launch out of order; waiting for the launch to be sent again"
            );
            self.assembling.remove(&job);
            return None;
        }
        pieces.push(bytes);
        if index + 1 < count {
            return None;
        }
        let whole = self.assembling.remove(&job)?.concat();
        match decode::<LaunchSpec>("launch", &whole, MAX_LAUNCH_BYTES) {
            Ok(spec) if spec.job == job => Some(spec),
            Ok(_) => {
                tracing::error!(
                    node = self.node,
                    job,
                    "a launch in pieces names another job"
                );
                None
            }
            Err(e) => {
                tracing::error!(node = self.node, job, "a launch in pieces: {e}");
                None
            }
        }
    }

    fn forget(&mut self, job: JobId) {
        tracing::info!(node = self.node, job, "forgetting the job");
        self.pending.remove(&job);
        self.assembling.remove(&job);
        // Cancelled now; joined before the next transfer starts.
        self.env.spool().cancel(job);
        if self.jobs.get(&job).is_some_and(|j| !j.reported) {
            self.signal_job(job, libc::SIGKILL);
        }
        // Whatever of it is left, in its process groups or not.
        self.env.tasks().end_job(job);
        self.env.pmi().remove_job(job);
        self.env.output().end_input(job);
        if let Some(j) = self.jobs.remove(&job) {
            for task in j.ranks.iter().filter_map(|r| r.task) {
                self.env.tasks().release(task);
            }
        }
        self.env.spool().remove(job);
    }
}

/// The jobs a node holds: those launched here, and those waiting for their time slot.
fn held_jobs(
    jobs: &BTreeMap<JobId, LocalJob>,
    pending: &BTreeMap<JobId, LaunchSpec>,
) -> Vec<HeldJob> {
    let running = jobs.iter().map(|(&job, j)| HeldJob {
        job,
        slot: j.spec.slot,
        ended: j.ranks.iter().all(|r| r.status.is_some()),
    });
    let waiting = pending.iter().map(|(&job, spec)| HeldJob {
        job,
        slot: spec.slot,
        ended: false,
    });
    running.chain(waiting).collect()
}

/// Whether a guest NM carries out `cmd` from its borrower: everything a node of the
/// borrower's does, but lending the node on (`Lend`, `EndLend`), which only the node's own
/// cluster may: a borrower that sealed one would have the lender's node start a guest NM, as
/// root, for a cluster of its choosing.
fn guest_obeys(cmd: &Command) -> bool {
    !matches!(cmd, Command::Lend { .. } | Command::EndLend { .. })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A guest NM refuses a borrower's `Lend` and `EndLend`, and nothing else a node does.
    #[test]
    fn a_guest_nm_refuses_to_lend_its_node_on() {
        let nodes = storm_primitives::NodeSet::single(0);
        let signer = storm_cluster::identity::MmSigner::new(
            ed25519_dalek::SigningKey::from_bytes(&[1; 32]),
            "borrower",
        );
        assert!(!guest_obeys(&Command::Lend {
            nodes: nodes.clone(),
            peer: "elsewhere".into(),
            until_ms: u64::MAX,
            grant: signer.grant_lease("elsewhere", "n0", u64::MAX),
        }));
        assert!(!guest_obeys(&Command::EndLend {
            nodes: nodes.clone()
        }));
        assert!(guest_obeys(&Command::Signal { job: 1, signal: 15 }));
        assert!(guest_obeys(&Command::Forget { job: 1 }));
        assert!(guest_obeys(&Command::Shutdown));
    }

    /// An exiting task's next look waits as long as it has waited, from 100 us, and never
    /// past the time left: a lease running out leaves less than 100 us, which used to panic.
    #[test]
    fn the_recheck_of_exiting_tasks_never_passes_the_time_left() {
        let idle = Duration::from_millis(10);
        assert_eq!(exit_recheck(Duration::ZERO, idle), EXIT_RECHECK_FIRST);
        assert_eq!(
            exit_recheck(Duration::from_millis(3), idle),
            Duration::from_millis(3)
        );
        assert_eq!(exit_recheck(Duration::from_secs(1), idle), idle);
        let almost_gone = Duration::from_micros(20);
        assert_eq!(exit_recheck(Duration::ZERO, almost_gone), almost_gone);
        assert_eq!(
            exit_recheck(Duration::from_millis(5), Duration::ZERO),
            Duration::ZERO
        );
    }
}
