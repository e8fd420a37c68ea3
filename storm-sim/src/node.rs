//! A simulated node: the node manager's own core ([`storm_nm::NodeManager`]) over the local
//! backend, in an environment whose tasks use virtual time instead of processes
//! ([`crate::tasks`]). Their output crosses the NM's own forwarder
//! ([`storm_nm::output::SteppedOutput`], pumped once per step) to the MM's output queue. What
//! the daemon does with files and sockets (the spool, PMI) is what this environment leaves
//! out: program transfers are modelled on the MM's side ([`crate::env`]), and tasks speak no
//! PMI.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use storm_cluster::clock::Clock;
use storm_cluster::messages::{CheckProgram, Command, FileInfo, HeldJob, JobId, MpiMode};
use storm_cluster::{ClusterConfig, RmLayout};
use storm_nm::env::{OutputForwarder, PmiServer, Spool, SwitchRecord, TaskRunner};
use storm_nm::membership::Identity;
use storm_nm::output::{Forwarder, SteppedOutput};
use storm_nm::pmi::JobFacts;
use storm_nm::{JobState, NmEnv, NmParts, NodeManager, Stepped};
use storm_primitives::{NodeId, Primitives};

use crate::tasks::SimTasks;

/// How many messages a node takes in one step at most (it takes all that arrived).
const MESSAGES_PER_STEP: usize = 1024;

/// A heartbeat as a node took it.
#[derive(Debug, Clone)]
pub struct Heard {
    pub seq: u64,
    pub at: Instant,
    pub commands: Vec<Command>,
}

/// How a simulated node's NM is set up.
#[derive(Debug, Clone, Default)]
pub struct NodeOptions {
    /// Keep every heartbeat it takes ([`SimNode::heard`]).
    pub record: bool,
    /// How far its wall clock reads ahead of the MM's (behind, when negative), in
    /// milliseconds: it shows in the NM's start time, which its registrations carry.
    pub clock_ahead_ms: i64,
    /// A guest slot's lease grant, shown in its registrations.
    pub lease: Option<storm_cluster::identity::LeaseGrant>,
}

pub struct SimNode {
    core: NodeManager<SimNodeEnv>,
    frozen: bool,
    /// The NM takes no message before this time (a heartbeat that reaches it late); it runs
    /// on meanwhile.
    intake_held_until: Option<Instant>,
}

impl SimNode {
    pub fn new(
        cfg: &Arc<ClusterConfig>,
        rm: &RmLayout,
        id: NodeId,
        prims: Arc<dyn Primitives>,
        clock: Arc<dyn Clock>,
        opts: NodeOptions,
    ) -> Self {
        let NodeOptions {
            record,
            clock_ahead_ms,
            ..
        } = opts.clone();
        let identity = Identity {
            clock: clock.clone(),
            pid: 1000 + id,
            started_ms: clock.unix_ms().saturating_add_signed(clock_ahead_ms),
            // Simulated nodes have what a typical compute node has.
            mem: 64 << 30,
            mm: storm_cluster::identity::MmVerifier::new(
                crate::mm_signing_key().verifying_key(),
                &cfg.cluster.name,
            ),
            lease: opts.lease,
        };
        // An ENQUEUE that finds no room gives up at once: the next step tries again.
        let forwarder = Forwarder::new(prims.clone(), rm, id, cfg.mm_id(), Duration::ZERO);
        let origin = clock.now();
        let env = SimNodeEnv {
            origin,
            tasks: SimTasks::new(origin),
            output: SteppedOutput::new(forwarder, clock.now()),
            clock,
            none: NoFiles,
            record,
            heard: Vec::new(),
        };
        let parts = NmParts {
            config: Arc::clone(cfg),
            rm: rm.clone(),
            node: id,
            fabric: prims,
            identity,
            report_wait: Duration::ZERO,
            pmi_library: PathBuf::new(),
            guest_user: None,
            cpus: (0..cfg.nodes[id as usize].cpus).collect(),
        };
        Self {
            core: NodeManager::new(parts, env),
            frozen: false,
            intake_held_until: None,
        }
    }

    /// Stops (or continues) the node manager, as SIGSTOP would: it takes no heartbeat and
    /// sends nothing while frozen; its tasks go on running.
    pub fn set_frozen(&mut self, frozen: bool) {
        self.frozen = frozen;
    }

    pub fn is_frozen(&self) -> bool {
        self.frozen
    }

    /// Lets what arrives for this node reach its NM only from `at` on (a late heartbeat: a
    /// slow link, a retransmission); the NM runs on meanwhile.
    pub fn hold_intake_until(&mut self, at: Instant) {
        self.intake_held_until = Some(at);
    }

    /// When the node must step before the MM's next tick, if it must: its held intake
    /// ends, or its slot's lease runs out (the daemon's loop wakes then too).
    pub fn wake_at(&self) -> Option<Instant> {
        if self.frozen {
            return None;
        }
        [self.intake_held_until, self.core.lease_deadline()]
            .into_iter()
            .flatten()
            .min()
    }

    /// The windows of virtual time in which job `job`'s tasks here ran, per task
    /// ([`SimTasks::run_windows`](crate::tasks::SimTasks::run_windows)).
    pub fn run_windows(&self, job: JobId) -> Vec<Vec<(Instant, Instant)>> {
        self.core.env().tasks.run_windows(job)
    }

    /// How many tasks of job `job` this node's NM ever started, ended and released ones
    /// included (a task launched again counts twice).
    pub fn tasks_started(&self, job: JobId) -> u32 {
        self.core.env().tasks.started(job)
    }

    /// The jobs this node holds, and whether each has ended here.
    pub fn jobs(&self) -> Vec<(JobId, bool)> {
        self.core
            .held_jobs()
            .into_iter()
            .map(|HeldJob { job, ended, .. }| (job, ended))
            .collect()
    }

    /// Whether job `job`'s tasks run here now.
    pub fn running(&self, job: JobId) -> bool {
        self.job_state(job) == Some(JobState::Running)
    }

    /// Where job `job` stands on this node, as its NM sees it.
    pub fn job_state(&self, job: JobId) -> Option<JobState> {
        self.core.job_state(job)
    }

    /// How long the node's NM would wait before its next look ([`NodeManager::poll_timeout`]):
    /// the daemon's loop waits that long for a heartbeat.
    ///
    /// [`NodeManager::poll_timeout`]: storm_nm::NodeManager::poll_timeout
    pub fn poll_timeout(&self) -> Duration {
        self.core.poll_timeout()
    }

    /// Whether this node keeps the heartbeats it takes.
    pub fn records(&self) -> bool {
        self.core.env().record
    }

    /// Every heartbeat this node took, if the simulation records them.
    pub fn heard(&self) -> &[Heard] {
        &self.core.env().heard
    }

    /// One step at the clock's time: the tasks progress, their output goes to the MM, and the
    /// NM takes everything that arrived, carries it out, and reports jobs whose tasks here
    /// have all ended (and whose output was delivered).
    pub fn step(&mut self) {
        let env = self.core.env_mut();
        let now = env.clock.now();
        env.tasks.advance(now);
        if self.frozen {
            return;
        }
        env.output.pump(now);
        if self.intake_held_until.is_some_and(|until| now < until) {
            self.core.tend();
            return;
        }
        self.intake_held_until = None;
        for _ in 0..MESSAGES_PER_STEP {
            match self.core.step(Duration::ZERO) {
                Ok(Stepped::Message) => {}
                Ok(Stepped::Idle) | Err(_) => break,
            }
        }
        // What the NM told the user, and what a new epoch sends again, goes now.
        self.core.env_mut().output.pump(now);
    }
}

/// The simulated node's environment.
pub struct SimNodeEnv {
    clock: Arc<dyn Clock>,
    origin: Instant,
    tasks: SimTasks,
    output: SteppedOutput,
    none: NoFiles,
    record: bool,
    heard: Vec<Heard>,
}

impl NmEnv for SimNodeEnv {
    fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    fn tasks(&mut self) -> &mut dyn TaskRunner {
        &mut self.tasks
    }

    fn spool(&mut self) -> &mut dyn Spool {
        &mut self.none
    }

    fn output(&mut self) -> &mut dyn OutputForwarder {
        &mut self.output
    }

    fn pmi(&mut self) -> &mut dyn PmiServer {
        &mut self.none
    }

    fn guest(&mut self) -> &mut dyn storm_nm::env::GuestRunner {
        &mut self.none
    }

    fn heard(&mut self, seq: u64, _received_ns: u128, commands: &[Command]) {
        if self.record {
            self.heard.push(Heard {
                seq,
                at: self.clock.now(),
                commands: commands.to_vec(),
            });
        }
    }

    fn switched(&mut self, _switch: &SwitchRecord) {}

    fn stamp_ns(&self) -> u128 {
        self.clock.now().duration_since(self.origin).as_nanos()
    }
}

/// What the simulated node has no use for: a spool (transfers are modelled by the MM's
/// environment) and PMI (tasks speak none).
struct NoFiles;

impl Spool for NoFiles {
    fn job_dir(&self, job: JobId) -> PathBuf {
        PathBuf::from(format!("/storm-sim/job-{job}"))
    }

    fn receive(&mut self, _info: FileInfo) {}

    /// Modelled too: the MM's environment answers for the nodes (no program is in place).
    fn check(&mut self, _check: CheckProgram) {}

    fn cancel(&mut self, _job: JobId) {}

    /// Modelled transfers carry no bytes: there is nothing to compare.
    fn verify(&self, _job: JobId, _expected: Option<[u8; 32]>) -> Result<(), String> {
        Ok(())
    }

    fn stop_all(&mut self) {}

    fn remove(&mut self, _job: JobId) {}

    /// Simulated tasks make no files: a path, never made.
    fn scratch_dir(&mut self, job: JobId, _uid: u32, _gid: u32) -> Option<PathBuf> {
        Some(PathBuf::from(format!("/storm-sim/scratch/job-{job}")))
    }
}

impl storm_nm::env::GuestRunner for NoFiles {
    // A simulated node runs no processes: a lease's guest NM is not simulated (the guest
    // slots of a simulated borrower are nodes of its own simulation).
    fn start(&mut self, _peer: &str, _until_ms: u64, _grant: &storm_cluster::identity::LeaseGrant) {
    }

    fn stop(&mut self) {}
}

impl PmiServer for NoFiles {
    fn start_job(
        &mut self,
        _slot: usize,
        _mode: MpiMode,
        _facts: JobFacts,
        ranks: &[u32],
    ) -> Result<storm_nm::env::PmiStart, String> {
        // Simulated tasks speak no PMI: they get no socket.
        Ok(storm_nm::env::PmiStart {
            ends: ranks.iter().map(|_| None).collect(),
            env: Vec::new(),
        })
    }

    fn remove_job(&mut self, _job: JobId) {}

    fn resend(&mut self) {}

    fn contacted(&self, _job: JobId, _rank: u32) -> bool {
        false
    }

    // No simulated task is a PMIx client: nobody to tell.
    fn rank_ended(
        &mut self,
        _job: JobId,
        _rank: u32,
        _status: storm_cluster::messages::RankStatus,
    ) {
    }
}
