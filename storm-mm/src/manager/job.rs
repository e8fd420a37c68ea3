//! A job as the machine manager holds it: its phase ([`Phase`]), what it asked for and where
//! it runs ([`Job`]), how its start is planned ([`NewJob`]) and timed ([`RanAt`]), and how it
//! becomes a journal record, a policy's ask, a `storm queue` line and a launch command.

use std::time::{Duration, Instant};

use storm_cluster::control::{JobInfo, JobRequest};
use storm_cluster::messages::{
    BatchLaunch, JobId, JobUsage, LaunchSpec, OutputChunk, Program, ProgramStamp,
};
use storm_cluster::tasks::TaskPlan;
use storm_primitives::{NodeId, NodeSet};

use crate::env::{ClientId, ProgramId};
use crate::journal::{JobRecord, JobState};
use crate::nodes::NmProcess;
use crate::policy::{JobAsk, Need};

use super::restart;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Phase {
    Queued,
    /// Nodes allocated; the program transfer waits for a worker or for its nodes to finish
    /// another job's transfer (each node has one chunk queue).
    Allocated,
    /// A worker hashes the submitted program while the nodes look whether they have it, the
    /// same, at its path (`Command::CheckProgram`, numbered as a transfer).
    Checking {
        transfer: u32,
        worker: usize,
        since: Instant,
    },
    /// A worker is sending the program. `reported`: what its submitter was last told (when,
    /// how many bytes every node had).
    Sending {
        transfer: u32,
        worker: usize,
        reported: (Instant, u64),
    },
    /// Sent; waiting for every node's acknowledgement. After a check (`Checking`): waiting
    /// for every node's answer, to compare their digests with `check`'s.
    Verifying {
        transfer: u32,
        check: Option<InPlaceCheck>,
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
    pub(super) fn started(self) -> bool {
        matches!(self, Phase::Running | Phase::Recovering)
    }

    /// Whether the job's launch may go now: the commit recording its start is among those
    /// settled (up to batch `settled`).
    pub(super) fn may_launch(self, settled: u64) -> bool {
        matches!(self, Phase::Recording { batch: Some(b) } if b <= settled)
    }
}

/// A check whether a program is in place on every node, once the MM has the digest the
/// nodes' must equal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct InPlaceCheck {
    pub(super) digest: u64,
    /// When the check went out: a node that has not answered within
    /// [`super::transfers::CHECK_WAIT`] (a hung file system) gets a copy instead.
    pub(super) since: Instant,
}

pub(super) struct Cancel {
    pub(super) reason: String,
    pub(super) since: Instant,
    pub(super) killed: bool,
}

pub(super) struct Job {
    pub(super) id: JobId,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) req: JobRequest,
    pub(super) plan: TaskPlan,
    /// The descriptor of the program storm-submit passed (`--bcast`), held only until its
    /// copy beside the journal is made (or, for a job that starts at once and is never
    /// requeued, until its launch goes out): the MM holds no descriptor per waiting job. The host
    /// holds it; the core lets go of it with `MmEnv::release_program`.
    pub(super) program: Option<ProgramId>,
    /// The program's size as checked against the limits at submission: exactly this much is
    /// copied and sent.
    pub(super) size: u64,
    /// The BLAKE3 hash of the program as it was sent: its launch carries it, sealed.
    pub(super) program_hash: Option<[u8; 32]>,
    /// The submitted program's size, modification time and permissions, for the check
    /// whether it is in place on every node; unknown after a restart of the MM (the
    /// program is then copied).
    pub(super) stamp: Option<ProgramStamp>,
    /// Its program runs from its own path on the nodes (`--no-bcast`, or the check found it
    /// there, identical, on every node), not from a copy in their spools.
    pub(super) in_place: bool,
    /// The check whether its program is in place was made on its nodes: it was not, so the
    /// program is copied.
    pub(super) checked: bool,
    pub(super) client: Option<ClientId>,
    pub(super) phase: Phase,
    pub(super) nodes: NodeSet,
    /// The CPUs it holds of its one node, when it shares the node with other jobs.
    pub(super) cpus: Option<NodeSet>,
    pub(super) slot: Option<usize>,
    pub(super) submitted: Instant,
    /// `submitted` as wall-clock time (milliseconds since the Unix epoch), for the journal.
    pub(super) submitted_ms: u64,
    /// A copy of the program is in the journal's state directory.
    pub(super) program_saved: bool,
    /// Copying the program there failed (logged); it is not tried again.
    pub(super) program_save_failed: bool,
    pub(super) allocated: Option<Instant>,
    pub(super) ready: Option<Instant>,
    /// Its start held by the journal: its launch may go.
    pub(super) recorded: Option<Instant>,
    pub(super) launched: Option<Instant>,
    /// When its tasks ran, as its nodes reported (for the outcome's timing).
    pub(super) ran: RanAt,
    /// `launched` as wall-clock time (milliseconds since the Unix epoch), for the journal.
    pub(super) launched_ms: Option<u64>,
    /// The NM process of each of its nodes when its launch was readied, for the journal: after
    /// a restart of the MM, only that process's word that it lacks the job means the launch
    /// never reached it.
    pub(super) launched_to: Vec<(NodeId, NmProcess)>,
    pub(super) cancel: Option<Cancel>,
    pub(super) terminating: bool,
    /// Row of the gang scheduler's matrix.
    pub(super) time_slot: usize,
    pub(super) limit: Option<Duration>,
    /// While `Recovering`: what its nodes said so far.
    pub(super) recovery: Option<restart::Recovery>,
    /// Restored from the journal after a restart of the MM: its submitter may reattach.
    pub(super) restored: bool,
    /// Output taken from the nodes' queues while the restored job's submitter has not
    /// reattached yet: (node, queue entry, chunk), sent when it does.
    pub(super) held_output: Vec<(NodeId, u64, OutputChunk)>,
    /// MPI: the last PMI fence whose result went to the job's nodes.
    pub(super) pmi_epoch: u32,
    /// MPI: the exit code a rank asked the job to end with (`MPI_Abort`).
    pub(super) abort_code: Option<i32>,
    /// The rank whose failure ended the job, as its node said it (see `pmi`): its own exit
    /// code or signal is the job's, never the SIGTERM storm then sent the others.
    pub(super) culprit: Option<super::pmi::Culprit>,
    /// `--wait`: the first node the MM found to have ended its ranks (see `exit_wait`).
    pub(super) first_end: Option<super::exit_wait::FirstEnd>,
    /// A batch job (no submitter follows it): the start of what came through the output
    /// queues (a node saying why its script could not start), for the outcome's reason.
    pub(super) unsent: String,
    /// Standard input that came before the job's launch went out (see `input`).
    pub(super) held_input: Vec<super::input::HeldInput>,
    /// It entered the scheduling policy's queue (see `admission`): a queued job that has not
    /// waits for its dependency, its array's throttle, or the hold after a restart.
    pub(super) admitted: bool,
    /// What is ending it, when not its tasks: a cancel, its time limit, a lost node.
    pub(super) end_cause: Option<storm_cluster::control::EndCause>,
    /// A peer cluster runs it (see `flock`).
    pub(super) flocked: Option<super::flock::Flocked>,
    /// Peer clusters that refused it: it does not go to them again.
    pub(super) flock_refused: Vec<String>,
}

/// Bytes of a batch job's queued output kept for its outcome.
const UNSENT_KEPT: usize = 1024;

/// When a job's tasks ran, over its nodes' reports: microseconds after each node took the
/// launch heartbeat.
#[derive(Debug, Default, Clone, Copy)]
pub(super) struct RanAt {
    /// How far the slowest node's start got: its seal checked, the job readied, every
    /// task handed to the launcher.
    pub(super) verified_us: Option<u64>,
    pub(super) prepared_us: Option<u64>,
    pub(super) asked_us: Option<u64>,
    pub(super) first_started_us: Option<u64>,
    /// The last node's report written.
    pub(super) reported_us: Option<u64>,
    pub(super) last_exited_us: Option<u64>,
    /// What its processes used: CPU time summed over its nodes, the largest peak memory
    /// of any node (each known only where some node's cgroup told it).
    pub(super) usage: JobUsage,
}

impl RanAt {
    pub(super) fn add(&mut self, t: &storm_cluster::messages::NodeTiming) {
        self.verified_us = self.verified_us.max(t.verified_us);
        self.prepared_us = self.prepared_us.max(t.prepared_us);
        self.asked_us = self.asked_us.max(t.asked_us);
        self.reported_us = self.reported_us.max(Some(t.reported_us));
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
        u.oom_kills = match (u.oom_kills, t.usage.oom_kills) {
            (Some(a), Some(b)) => Some(a + b),
            (a, b) => a.or(b),
        };
    }

    /// First task started to last task ended.
    pub(super) fn run_us(&self) -> u64 {
        match (self.first_started_us, self.last_exited_us) {
            (Some(first), Some(last)) => last.saturating_sub(first),
            _ => 0,
        }
    }
}

/// What a new job (or one restored from the journal) starts with.
pub(super) struct NewJob {
    pub(super) id: JobId,
    pub(super) uid: u32,
    pub(super) gid: u32,
    pub(super) req: JobRequest,
    pub(super) plan: TaskPlan,
    pub(super) program: Option<ProgramId>,
    /// The program's size, checked against the limits (0 without one).
    pub(super) size: u64,
    /// The submitted program's stamp (see [`Job::stamp`]).
    pub(super) stamp: Option<ProgramStamp>,
    pub(super) client: Option<ClientId>,
    pub(super) submitted: Instant,
    pub(super) submitted_ms: u64,
}

impl Job {
    /// A job waiting in the queue.
    pub(super) fn queued(new: NewJob) -> Self {
        let size = new.size;
        let mut job = Self {
            id: new.id,
            uid: new.uid,
            gid: new.gid,
            plan: new.plan,
            program: new.program,
            size,
            program_hash: None,
            stamp: new.stamp,
            in_place: false,
            checked: false,
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
            recorded: None,
            launched: None,
            ran: RanAt::default(),
            launched_ms: None,
            launched_to: Vec::new(),
            cancel: None,
            terminating: false,
            time_slot: 0,
            limit: new.req.time_limit_ms.map(Duration::from_millis),
            recovery: None,
            restored: false,
            held_output: Vec::new(),
            pmi_epoch: 0,
            abort_code: None,
            culprit: None,
            first_end: None,
            unsent: String::new(),
            held_input: Vec::new(),
            admitted: false,
            end_cause: None,
            flocked: None,
            flock_refused: Vec::new(),
            req: new.req,
        };
        job.forget_program_place();
        job
    }

    /// Forgets where its program was found (a new placement looks again): it runs in place
    /// only with `--no-bcast` until a check finds it there.
    pub(super) fn forget_program_place(&mut self) {
        self.in_place = !self.req.delivery.carries_program();
        self.checked = false;
    }

    /// Whether an MM that took over from its record could have to run it from its beginning,
    /// and so needs its program's copy beside the journal: its launch is not recorded yet
    /// (it waits, or it got its nodes and its program is being sent), or it may be requeued.
    /// The same rule as the record's (`JobRecord::needs_program_copy`), on the job in memory.
    pub(super) fn copy_needed(&self) -> bool {
        self.launched_ms.is_none() || self.req.requeue
    }

    /// Keeps the start of output no submitter will read (see `unsent`).
    pub(super) fn keep_unsent(&mut self, data: &[u8]) {
        let room = UNSENT_KEPT.saturating_sub(self.unsent.len());
        if room > 0 {
            let take = &data[..data.len().min(room)];
            self.unsent.push_str(&String::from_utf8_lossy(take));
        }
    }

    /// The launch command of this started job (it has a job slot), on nodes of `node_cpus`
    /// CPUs.
    pub(super) fn launch_spec(&self, node_cpus: u32) -> LaunchSpec {
        let held_cpus = self.cpus.as_ref().map_or(node_cpus, |c| c.len() as u32);
        let mut spec = launch_spec(
            self.id,
            self.slot.expect("started jobs have a slot"),
            &self.req,
            &self.plan,
            &self.nodes,
            (self.uid, self.gid),
            held_cpus,
        );
        if self.in_place {
            spec.program = Program::Path(self.req.program.clone());
        }
        spec.program_hash = self.program_hash;
        spec.cpus = self.cpus.clone();
        spec
    }
}

/// The journal's record of a job that has not ended.
pub(super) fn job_record(j: &Job) -> JobRecord {
    JobRecord {
        id: j.id,
        uid: j.uid,
        gid: j.gid,
        req: j.req.clone(),
        submitted_ms: j.submitted_ms,
        state: match j.phase {
            Phase::Queued => match &j.flocked {
                Some(f) => JobState::Flocked {
                    peer: f.peer.clone(),
                    since_ms: f.since_ms,
                },
                None => JobState::Queued,
            },
            _ => JobState::Started {
                nodes: j.nodes.clone(),
                cpus: j.cpus.clone(),
                slot: j.slot.unwrap_or(0) as u32,
                time_slot: j.time_slot as u32,
                launched_ms: j.launched_ms,
                launched_to: j.launched_to.clone(),
                program_hash: j.program_hash,
            },
        },
    }
}

/// What a job asks of the scheduling policy on nodes of `cpus` CPUs, its `--constraint`
/// being `features` (bits). `--mem-per-cpu` counts the CPUs it holds on a node: those of its
/// share of one node, or every CPU of a node it takes whole.
pub(super) fn job_ask(
    job: JobId,
    req: &JobRequest,
    plan: &TaskPlan,
    cpus: u32,
    features: u64,
) -> JobAsk {
    let need = Need::of(plan.nodes, plan.ntasks, cpus, req.tasks.exclusive);
    let held_cpus = match need {
        Need::Cpus(k) => k,
        Need::Nodes(_) => cpus,
    };
    JobAsk {
        job,
        need,
        limit: req.time_limit_ms.map(Duration::from_millis),
        mem: req.mem.map_or(0, |m| m.per_node(held_cpus)),
        features,
    }
}

/// How `storm history` shows a finished job.
pub(super) fn finished_info(rec: &JobRecord) -> Option<JobInfo> {
    let JobState::Finished {
        nodes,
        outcome,
        ended_ms,
    } = &rec.state
    else {
        return None;
    };
    let code = outcome.exit_code();
    // It started when its launch went out: after its queueing, program transfer and launch.
    let t = &outcome.timing;
    let started_ms = (outcome.timing.execute_us > 0)
        .then(|| rec.submitted_ms + (t.queued_us + t.send_us + t.launch_us) / 1000);
    Some(JobInfo {
        job: rec.id,
        name: rec.req.name.clone(),
        uid: rec.uid,
        state: outcome.state(),
        nodes: nodes.clone(),
        cpus: None,
        ntasks: outcome.ranks.len() as u32,
        elapsed_ms: outcome.timing.total_us / 1000,
        reason: outcome.reason.clone(),
        time_slot: None,
        exit_code: Some(code),
        usage: outcome.usage,
        element: rec.req.element,
        submitted_ms: rec.submitted_ms,
        started_ms,
        ended_ms: Some(*ended_ms),
        runs_on: None,
        from_cluster: rec.req.flock.flocked_from().map(str::to_string),
    })
}

/// The launch command of a job placed on `nodes`, holding `held_cpus` CPUs on each.
pub(super) fn launch_spec(
    id: JobId,
    slot: usize,
    req: &JobRequest,
    plan: &TaskPlan,
    nodes: &NodeSet,
    (uid, gid): (u32, u32),
    held_cpus: u32,
) -> LaunchSpec {
    // Copied to the spools unless it runs in place (which `Job::launch_spec` decides).
    let program = if req.delivery.carries_program() {
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
        ntasks: tasks_launched(req, plan),
        program,
        program_hash: None,
        args: req.args.clone(),
        env: req.env.clone(),
        cwd: req.cwd.clone(),
        uid,
        gid,
        // The node whose tasks end last, as a rule: a batch job's only task is on its first.
        reporter: if req.batch.is_some() {
            nodes.first()
        } else {
            nodes.last()
        }
        .unwrap_or(0),
        mpi: req.mpi,
        input: req.input,
        batch: req.batch.clone().map(|files| BatchLaunch {
            files,
            alloc_tasks: plan.ntasks,
            array: req.element.map(|e| (e.array, e.index, e.count)),
        }),
        mem: req.mem.map(|m| m.per_node(held_cpus)),
        kill_on_bad_exit: req.kill_on_bad_exit,
        exit_wait_s: req.exit_wait_s,
        cpu_bind: req.cpu_bind,
        cpus: None,
    }
}

/// The tasks a job's launch starts: its plan's, or one for a batch job (its script, on the
/// first node; the rest of the allocation is for its steps).
pub(super) fn tasks_launched(req: &JobRequest, plan: &TaskPlan) -> u32 {
    if req.batch.is_some() { 1 } else { plan.ntasks }
}

/// `1m30s`-style text for a duration.
pub(super) fn human(d: Duration) -> String {
    let secs = d.as_secs();
    match (secs / 3600, secs % 3600 / 60, secs % 60) {
        (0, 0, s) => format!("{s}s"),
        (0, m, s) => format!("{m}m{s:02}s"),
        (h, m, s) => format!("{h}h{m:02}m{s:02}s"),
    }
}

/// The key a submission sent again is recognised by: its submitter's uid and token, for the
/// job the submission made (an array's first element, whose id is the array's); `None` for
/// a job without a token, and for an array's other elements.
pub(super) fn submission_key(id: JobId, uid: u32, req: &JobRequest) -> Option<(u32, u64)> {
    let token = req.token?;
    req.element
        .is_none_or(|e| e.array == id)
        .then_some((uid, token))
}
