//! A simulated node: the NM's own membership and report code (`storm_nm::membership`,
//! `storm_nm::report`) over the local backend, with simulated tasks in place of processes.
//!
//! A simulated task needs `work` of virtual CPU time (the job's first argument, in
//! milliseconds) and exits 0 when it has had it. It runs while its job is launched and, under
//! gang scheduling, while its job is in the node's latest schedule. A signal ends it at once
//! (`Signaled(n)`), except SIGTERM for a job whose second argument is `ignore-sigterm`.
//! What the NodeManager does with processes (storm-pl, process groups, /proc) is not
//! simulated: it is the part `NodeManager<E: NmEnv>` will put behind a `TaskRunner`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use storm_cluster::clock::Clock;
use storm_cluster::messages::{Command, Heartbeat, HeldJob, JobId, LaunchSpec, RankStatus, decode};
use storm_cluster::tasks::ranks_on;
use storm_cluster::{ClusterConfig, RmLayout};
use storm_nm::membership::{Event, Identity, Registration};
use storm_nm::report::Reporter;
use storm_primitives::{NodeId, Primitives};

/// The argument that makes a simulated task ignore SIGTERM.
pub const IGNORE_SIGTERM: &str = "ignore-sigterm";

/// A heartbeat as a node took it.
#[derive(Debug, Clone)]
pub struct Heard {
    pub seq: u64,
    pub at: Instant,
    pub commands: Vec<Command>,
}

struct LocalJob {
    spec: LaunchSpec,
    /// Virtual CPU time each task still needs.
    left: Duration,
    ignore_term: bool,
    /// Launched under gang scheduling, waiting for its first time slot.
    pending: bool,
    /// Out of its time slot (gang scheduling).
    suspended: bool,
    /// Signalled to end: it runs until it does, whatever the schedule.
    ending: bool,
    status: Option<RankStatus>,
    reported: bool,
}

pub struct SimNode {
    id: NodeId,
    prims: Arc<dyn Primitives>,
    rm: RmLayout,
    mm: NodeId,
    heartbeat_bytes: usize,
    gang: bool,
    clock: Arc<dyn Clock>,
    registration: Registration,
    jobs: BTreeMap<JobId, LocalJob>,
    last_step: Instant,
    frozen: bool,
    record: bool,
    /// Every heartbeat this node took, if the simulation records them.
    pub heard: Vec<Heard>,
}

impl SimNode {
    pub fn new(
        cfg: &ClusterConfig,
        rm: &RmLayout,
        id: NodeId,
        prims: Arc<dyn Primitives>,
        clock: Arc<dyn Clock>,
        record: bool,
    ) -> Self {
        let identity = Identity {
            clock: clock.clone(),
            pid: 1000 + id,
            started_ms: clock.unix_ms(),
        };
        let registration = Registration::new(
            prims.clone(),
            rm.clone(),
            id,
            cfg.mm_id(),
            Duration::from_millis(cfg.failure.rejoin_after_ms),
            identity,
        );
        Self {
            id,
            rm: rm.clone(),
            mm: cfg.mm_id(),
            heartbeat_bytes: cfg.cluster.heartbeat_bytes,
            gang: cfg.scheduler.policy == storm_cluster::config::PolicyKind::Gang,
            last_step: clock.now(),
            clock,
            prims,
            registration,
            jobs: BTreeMap::new(),
            frozen: false,
            record,
            heard: Vec::new(),
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

    /// The jobs this node holds, and whether each has ended here.
    pub fn jobs(&self) -> Vec<(JobId, bool)> {
        self.jobs
            .iter()
            .map(|(&job, j)| (job, j.status.is_some()))
            .collect()
    }

    /// Whether job `job`'s tasks run here now.
    pub fn running(&self, job: JobId) -> bool {
        self.jobs
            .get(&job)
            .is_some_and(|j| j.status.is_none() && !j.pending && !j.suspended)
    }

    /// One step at the clock's time: the tasks progress, the node takes what the MM sent,
    /// and reports jobs whose tasks here have all ended.
    pub fn step(&mut self) {
        let now = self.clock.now();
        let ran = now.saturating_duration_since(self.last_step);
        self.last_step = now;
        for j in self.jobs.values_mut() {
            if j.status.is_none() && !j.pending && (!j.suspended || j.ending) {
                j.left = j.left.saturating_sub(ran);
                if j.left.is_zero() {
                    j.status = Some(RankStatus::Exited(0));
                }
            }
        }
        if self.frozen {
            return;
        }
        // Everything that arrived: a node takes every heartbeat queued for it.
        for _ in 0..1024 {
            let held = self.held_jobs();
            match self.registration.next(Duration::ZERO, &|| held.clone()) {
                Ok(Event::Heartbeat(bytes)) => self.heartbeat(&bytes, now),
                Ok(Event::Welcomed { keep, .. }) => self.jobs.retain(|job, _| keep.contains(job)),
                Ok(Event::Idle) | Err(_) => break,
            }
        }
        self.report_ended();
    }

    fn held_jobs(&self) -> Vec<HeldJob> {
        self.jobs
            .iter()
            .map(|(&job, j)| HeldJob {
                job,
                slot: j.spec.slot,
                ended: j.status.is_some(),
            })
            .collect()
    }

    fn heartbeat(&mut self, bytes: &[u8], now: Instant) {
        let hb: Heartbeat = match decode("heartbeat", bytes, self.heartbeat_bytes) {
            Ok(hb) => hb,
            Err(e) => {
                tracing::error!(node = self.id, "ignoring a heartbeat: {e}");
                return;
            }
        };
        for cmd in &hb.commands {
            if cmd.nodes().is_some_and(|n| !n.contains(self.id)) {
                continue;
            }
            match cmd {
                Command::Launch(spec) => self.launch(spec.clone()),
                Command::Signal { job, signal } => self.signal(*job, *signal),
                Command::Forget { job } => {
                    self.jobs.remove(job);
                }
                Command::Schedule { run } => {
                    for (job, j) in &mut self.jobs {
                        j.suspended = !run.contains(job);
                        if !j.suspended {
                            j.pending = false;
                        }
                    }
                }
                Command::ReceiveFile(_) | Command::Shutdown => {}
            }
        }
        if self.record {
            self.heard.push(Heard {
                seq: hb.seq,
                at: now,
                commands: hb.commands,
            });
        }
    }

    fn launch(&mut self, spec: LaunchSpec) {
        if spec.nodes.rank(self.id).is_none() || self.jobs.contains_key(&spec.job) {
            return;
        }
        self.reporter().prepare_slot(&spec);
        let work = spec
            .args
            .first()
            .and_then(|a| a.parse::<u64>().ok())
            .map_or(Duration::ZERO, Duration::from_millis);
        let ignore_term = spec.args.iter().any(|a| a == IGNORE_SIGTERM);
        self.jobs.insert(
            spec.job,
            LocalJob {
                spec,
                left: work,
                ignore_term,
                pending: self.gang,
                suspended: self.gang,
                ending: false,
                status: None,
                reported: false,
            },
        );
    }

    fn signal(&mut self, job: JobId, signal: i32) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        if j.status.is_some() {
            return;
        }
        if j.pending {
            // Never started here: its tasks end, unstarted, by this signal.
            j.status = Some(RankStatus::Signaled(signal));
            return;
        }
        j.ending = true;
        if !(signal == libc::SIGTERM && j.ignore_term) {
            j.status = Some(RankStatus::Signaled(signal));
        }
    }

    fn reporter(&self) -> Reporter<'_> {
        Reporter {
            prims: &*self.prims,
            rm: &self.rm,
            node: self.id,
            mm: self.mm,
            wait: Duration::ZERO,
        }
    }

    fn report_ended(&mut self) {
        let ended: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(_, j)| j.status.is_some() && !j.reported)
            .map(|(&job, _)| job)
            .collect();
        for job in ended {
            let j = &self.jobs[&job];
            let k = j.spec.nodes.rank(self.id).expect("launched here") as u32;
            let (first, count) = ranks_on(j.spec.ntasks, j.spec.nodes.len() as u32, k);
            let status = j.status.expect("ended");
            let statuses = (first..first + count).map(|r| (r, status)).collect();
            match self.reporter().report(&j.spec, statuses) {
                Ok(()) => {
                    if let Some(j) = self.jobs.get_mut(&job) {
                        j.reported = true;
                    }
                }
                Err(e) => tracing::debug!(node = self.id, job, "cannot report yet: {e}"),
            }
        }
    }
}
