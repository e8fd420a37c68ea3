//! The control protocol between storm-submit / storm and the MM, over the MM's Unix socket.
//!
//! Frames are a 4-byte little-endian length and a bincode body of at most [`MAX_FRAME`]
//! bytes. The first request on a connection is [`Request::Hello`] with the protocol version.
//! A submission passes the program to the MM as an open file descriptor (SCM_RIGHTS) rather
//! than a path: the MM reads exactly the file the user opened, with the user's rights, and a
//! path the user could not read can never be broadcast by a privileged MM. The MM identifies
//! the user from the socket's peer credentials (SO_PEERCRED), never from the request.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use storm_primitives::NodeSet;

use crate::messages::{JobId, OutputChunk, RankStatus};
use crate::tasks::TaskRequest;

/// Version 3: `overcommit` in task requests; metrics. Version 4: output chunks carry their
/// stream offset. Version 5: `mpi` in job requests. Version 6: `--mpi openmpi`. Version 7:
/// the launch, start, run and report phases in `Timing`. Version 8: `exclusive` in task
/// requests, and the CPUs of a job that shares its node. Version 9: job and node
/// states as enums. Version 10: `dependency`, `batch`, `step_of`, `array` and `element` in
/// job requests; the cancelled, timeout and node_fail states, what ended a job, and times.
/// Version 11: arguments, environment and paths as bytes (UTF-8 or not). Version 12: how the
/// program reaches the nodes (`delivery`), and whether it was copied (`broadcast`). Version
/// 13: a dependency names array elements (`12_3`). Version 14: `Managers`, the replicas of a
/// replicated MM. Version 15: a job request's submission `token`. Version 16: a node's usage
/// record (its jobs' CPU and memory, its fabric ports) in its records; `PeerReport` and
/// `Peers`. Version 17: flocking (a request's `flock`, `FlockOut`, `FlockReport`,
/// `SubmitFlocked`, `Flocked`, and where a job runs in its `JobInfo`). Version 18: a job
/// flocked here (`Flock::From`) and whose it is in its `JobInfo` (`from_cluster`). Version
/// 19: lending (a request's `borrow`, `Lend`, `Reclaim`, the node state `Lent`). Version 20:
/// borrowing for waiting jobs (`BorrowOut`, `LendAsked`, `GiveBack`, `Lent`), a request's `less` and
/// `one_cluster`. Version 21: calling lent nodes home with notice (`Reclaim`'s `now`,
/// `Recalls`, `Recalled`). Version 22: a flocked job's standard input in its `FlockOrder`.
/// Version 23: each node of a `Lent` says whether it was lent on the borrower's asking.
/// Version 24: a request's `kill_on_bad_exit`, `exit_wait_s` and `cpu_bind`.
pub const PROTOCOL_VERSION: u32 = 24;
pub const MAX_FRAME: usize = 16 << 20;

/// A job as storm-submit asks for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobRequest {
    pub name: String,
    /// The program's absolute path (as resolved by storm-submit). With `bcast` the file
    /// itself travels as the descriptor attached to the request.
    #[serde(with = "crate::os_bytes::path")]
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, OsString)>,
    #[serde(with = "crate::os_bytes::path")]
    pub cwd: PathBuf,
    pub tasks: TaskRequest,
    /// How the program reaches the nodes: in place or copied.
    pub delivery: Delivery,
    /// Wall-clock limit in milliseconds (`--time`); the job is killed when it passes.
    pub time_limit_ms: Option<u64>,
    /// Put the job back in the queue, rather than end it, when one of its nodes fails
    /// (`--requeue`).
    pub requeue: bool,
    /// Which PMI protocols the tasks are served (`--mpi`).
    pub mpi: crate::messages::MpiMode,
    /// Which tasks read the submitter's standard input (`-i`).
    pub input: crate::messages::InputTarget,
    /// What must happen to other jobs before this one may start (`--dependency`).
    pub dependency: Option<crate::dependency::Dependency>,
    /// A batch job (`storm batch`): the program is a script that runs as one task on the
    /// first node of the allocation, its output goes to files, and the job goes on without
    /// its submitter.
    pub batch: Option<crate::messages::BatchOutput>,
    /// A step of this running job (`storm-submit` inside a batch script or an allocation):
    /// it runs on that job's nodes, in its time slot, without queueing.
    pub step_of: Option<JobId>,
    /// A job array (`storm batch --array`): the MM makes one batch job per index.
    pub array: Option<ArraySpec>,
    /// Set by the MM on each job of an array: which array, which element.
    pub element: Option<ArrayElement>,
    /// Drawn at random by the submitter for this submission. A submission that lost its MM
    /// before the answer came is sent again with the same token (to the MM back after a
    /// restart, or to the next leader of a replicated group): an MM that already holds a job
    /// of this user with this token answers by following that job instead of making another,
    /// so a job is neither lost nor run twice.
    pub token: Option<u64>,
    /// Memory the job needs (`--mem`, `--mem-per-cpu`); none: it is not counted, nor capped.
    pub mem: Option<MemRequest>,
    /// Features every node of the job must have (`--constraint`, the cluster file's
    /// `features`).
    pub constraint: Vec<String>,
    /// Where it may run: at home, or on a peer cluster (`--flock`, `--clusters`,
    /// `--no-flock`; docs/federation.md).
    pub flock: crate::flock::Flock,
    /// It may run on guest slots, nodes peer clusters lend here, beside this cluster's own
    /// (`--borrow`; docs/federation.md). Without it a job runs on this cluster's own nodes.
    pub borrow: bool,
    /// It may start on fewer nodes than it asked for, if that many cannot be had (`--less`,
    /// Balloc's `--ba--less`): the MM then shrinks it to the nodes it can have, keeping its
    /// tasks per node.
    pub less: bool,
    /// Its nodes are all of one cluster: this one's own, or one lender's guest slots, never
    /// both (`--one-cluster`, Balloc's `--ba--one`).
    pub one_cluster: bool,
    /// A rank that exits with a non-zero code or is killed by a signal ends the whole job at
    /// once, with its code (`--kill-on-bad-exit`, srun's `-K`; docs/mpi.md).
    pub kill_on_bad_exit: bool,
    /// Seconds after its first rank ends that the job ends, if its other ranks still run
    /// (`--wait`, srun's `-W`, Flux's `exit-timeout`); 0: they may run on as long as they
    /// like. storm-submit's default is [`DEFAULT_EXIT_WAIT_S`].
    pub exit_wait_s: u32,
    /// How its ranks are bound to CPUs (`--cpu-bind`); `None`: the cluster's `[cluster]
    /// cpu_bind`.
    pub cpu_bind: Option<crate::cpu_bind::CpuBind>,
}

/// How long a job's other ranks may run on after its first rank ended, unless storm-submit
/// is told otherwise (`--wait`): Flux's default `exit-timeout`.
pub const DEFAULT_EXIT_WAIT_S: u32 = 30;

/// Memory a job asks for, as srun means it (bytes).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MemRequest {
    /// `--mem`: on each of its nodes.
    PerNode(u64),
    /// `--mem-per-cpu`: for each CPU it holds on a node.
    PerCpu(u64),
}

impl MemRequest {
    /// Bytes on a node where the job holds `cpus` CPUs.
    pub fn per_node(self, cpus: u32) -> u64 {
        match self {
            MemRequest::PerNode(b) => b,
            MemRequest::PerCpu(b) => b.saturating_mul(u64::from(cpus)),
        }
    }
}

impl JobRequest {
    /// A job named `name` that runs `program` from `cwd` and asks for nothing beyond the
    /// defaults: no arguments or environment, one task, the program delivered as
    /// [`Delivery::Auto`], no time limit, no dependency, no submission token. Benches, tests
    /// and the simulator set what they ask for with struct update syntax
    /// (`JobRequest { tasks, ..JobRequest::new(name, program, cwd) }`); the CLIs spell every
    /// field, so that each new one is decided where users ask for jobs.
    pub fn new(
        name: impl Into<String>,
        program: impl Into<PathBuf>,
        cwd: impl Into<PathBuf>,
    ) -> Self {
        Self {
            name: name.into(),
            program: program.into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: cwd.into(),
            tasks: TaskRequest::default(),
            delivery: Delivery::Auto,
            time_limit_ms: None,
            requeue: false,
            mpi: Default::default(),
            input: Default::default(),
            dependency: None,
            batch: None,
            step_of: None,
            array: None,
            element: None,
            token: None,
            mem: None,
            constraint: Vec::new(),
            flock: Default::default(),
            borrow: false,
            less: false,
            one_cluster: false,
            kill_on_bad_exit: false,
            exit_wait_s: 0,
            cpu_bind: None,
        }
    }
}

/// How a job's program reaches its nodes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Delivery {
    /// Run it in place if every node has the file at its path, identical to the one submitted
    /// (a shared file system: files next to it are found as under srun); otherwise copy it
    /// to each node's spool. The default.
    #[default]
    Auto,
    /// Always copy it to each node's spool (`--bcast`; batch scripts, which run as they were
    /// when submitted).
    Broadcast,
    /// Never copy it: it is at its path on every node (`--no-bcast`).
    InPlace,
}

impl Delivery {
    /// Whether the program travels with the submission (as a descriptor): it may be copied.
    pub fn carries_program(self) -> bool {
        self != Delivery::InPlace
    }
}

/// `--array 0-99%10`: the indices, and how many elements may run at once.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArraySpec {
    /// Distinct, in increasing order.
    pub indices: Vec<u32>,
    pub throttle: Option<u32>,
}

/// One job of an array: the array's id (its first element's job id), the element's index,
/// the array's size, and the throttle.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArrayElement {
    pub array: JobId,
    pub index: u32,
    pub count: u32,
    pub throttle: Option<u32>,
}

/// The largest index an array may have (Slurm's default MaxArraySize is 1001; indices are
/// kept below this whatever the cluster's limit on elements).
pub const MAX_ARRAY_INDEX: u32 = 4_000_000;

impl std::str::FromStr for ArraySpec {
    type Err = String;

    /// Slurm's `--array`: `0-15`, `0,6,16-32`, `0-15:4` (every 4th), each followed by
    /// `%N` to run at most N elements at once.
    fn from_str(text: &str) -> Result<Self, String> {
        let (list, throttle) = match text.split_once('%') {
            Some((l, t)) => {
                let t: u32 =
                    t.parse().ok().filter(|&t| t > 0).ok_or_else(|| {
                        format!("--array {text:?}: %{t} is not a count of 1 or more")
                    })?;
                (l, Some(t))
            }
            None => (text, None),
        };
        let num = |s: &str| -> Result<u32, String> {
            s.parse::<u32>()
                .ok()
                .filter(|&n| n <= MAX_ARRAY_INDEX)
                .ok_or_else(|| {
                    format!("--array {text:?}: {s:?} is not an index from 0 to {MAX_ARRAY_INDEX}")
                })
        };
        let mut indices = std::collections::BTreeSet::new();
        for part in list.split(',') {
            let (range, step) = match part.split_once(':') {
                Some((r, s)) => (r, num(s)?),
                None => (part, 1),
            };
            if step == 0 {
                return Err(format!("--array {text:?}: a step of 0"));
            }
            let (lo, hi) = match range.split_once('-') {
                Some((a, b)) => (num(a)?, num(b)?),
                None => (num(range)?, num(range)?),
            };
            if lo > hi {
                return Err(format!("--array {text:?}: {range} runs backwards"));
            }
            let mut i = lo;
            while i <= hi {
                indices.insert(i);
                if indices.len() > MAX_ARRAY_INDEX as usize {
                    break;
                }
                i = match i.checked_add(step) {
                    Some(n) => n,
                    None => break,
                };
            }
        }
        Ok(ArraySpec {
            indices: indices.into_iter().collect(),
            throttle,
        })
    }
}

/// Indices as Slurm shows them: `1-5,7,9-10`.
pub fn index_ranges(indices: &[u32]) -> String {
    let mut out = String::new();
    let mut i = 0;
    while i < indices.len() {
        let lo = indices[i];
        let mut hi = lo;
        while i + 1 < indices.len() && indices[i + 1] == hi + 1 {
            i += 1;
            hi = indices[i];
        }
        if !out.is_empty() {
            out.push(',');
        }
        if lo == hi {
            out.push_str(&lo.to_string());
        } else {
            out.push_str(&format!("{lo}-{hi}"));
        }
        i += 1;
    }
    out
}

/// Parses a time limit as Slurm's `--time` does: `M` (minutes), `M:S`, `H:M:S`, `D-H`,
/// `D-H:M`, `D-H:M:S`. Returns milliseconds.
pub fn parse_time_limit(text: &str) -> Result<u64, String> {
    let bad = || {
        format!("{text:?} is not a time limit (examples: 10 for ten minutes, 0:30, 1:00:00, 2-12)")
    };
    let num = |s: &str| s.parse::<u64>().map_err(|_| bad());
    let (days, rest) = match text.split_once('-') {
        Some((d, r)) => (num(d)?, Some(r)),
        None => (0, None),
    };
    let secs = match rest {
        Some(r) => {
            let parts: Vec<&str> = r.split(':').collect();
            match parts.as_slice() {
                [h] => num(h)? * 3600,
                [h, m] => num(h)? * 3600 + num(m)? * 60,
                [h, m, s] => num(h)? * 3600 + num(m)? * 60 + num(s)?,
                _ => return Err(bad()),
            }
        }
        None => {
            let parts: Vec<&str> = text.split(':').collect();
            match parts.as_slice() {
                [m] => num(m)? * 60,
                [m, s] => num(m)? * 60 + num(s)?,
                [h, m, s] => num(h)? * 3600 + num(m)? * 60 + num(s)?,
                _ => return Err(bad()),
            }
        }
    };
    let total = days * 86_400 + secs;
    if total == 0 {
        return Err(format!("time limit {text:?} is zero"));
    }
    Ok(total * 1000)
}

/// A job as users name it, as Slurm writes it: an id (`12`; an array's id stands for the
/// whole array), or one element of an array by its index (`12_3`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum JobRef {
    Id(JobId),
    Element { array: JobId, index: u32 },
}

impl std::str::FromStr for JobRef {
    type Err = String;
    fn from_str(text: &str) -> Result<Self, String> {
        let bad =
            || format!("{text:?} is not a job id (12, or 12_3 for element 3 of array job 12)");
        let id = |s: &str| s.parse::<JobId>().ok().filter(|&id| id > 0);
        match text.split_once('_') {
            None => id(text).map(JobRef::Id).ok_or_else(bad),
            Some((array, index)) => match (id(array), index.parse::<u32>()) {
                (Some(array), Ok(index)) => Ok(JobRef::Element { array, index }),
                _ => Err(bad()),
            },
        }
    }
}

impl std::fmt::Display for JobRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            JobRef::Id(id) => write!(f, "{id}"),
            JobRef::Element { array, index } => write!(f, "{array}_{index}"),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Request {
    Hello {
        version: u32,
    },
    /// Boxed: a job request is far larger than any other request.
    Submit(Box<JobRequest>),
    /// Cancel a job; an array's id cancels every element that has not ended.
    Cancel {
        job: JobId,
    },
    Queue,
    Nodes,
    /// The replicas of a replicated MM, as the leader sees them (`storm managers`).
    Managers,
    /// Remove a replica from the manager group (`storm managers remove NAME`; operators
    /// only): a Raft configuration change the leader proposes.
    RemoveManager {
        name: String,
    },
    /// Lend these idle nodes to peer cluster `peer` for `for_ms` (docs/federation.md).
    Lend {
        nodes: NodeSet,
        peer: String,
        for_ms: u64,
    },
    /// Call these lent nodes home. The borrower is told why, preempts its jobs there and
    /// gives them back; they come home then, or after `[federation] vacate_ms` at the latest.
    /// `now`: they come home at once, without notice (the borrower sees its guests go
    /// silent).
    Reclaim {
        nodes: NodeSet,
        now: bool,
    },
    /// The lent nodes this cluster calls home, by borrower, for its peer agent to tell them
    /// (operators only): answered with [`Reply::Recalls`].
    Recalls,
    /// Lender `peer` calls home these nodes it lent this cluster (operators only: this
    /// cluster's peer agent, passing on the lender's [`crate::federation::PeerMessage::Recall`]).
    /// The jobs on them are preempted with the lender's reason, and the nodes are given back.
    Recalled {
        peer: String,
        nodes: Vec<crate::federation::Recalled>,
    },
    /// What this cluster wants of its lenders now, for its peer agent to pass on (operators
    /// only): answered with [`Reply::BorrowOut`]. `lent`: the lenders' answers the agent
    /// heard since it last asked (each lender's latest: its nodes lent to this cluster).
    BorrowOut {
        lent: Vec<(String, Vec<crate::federation::LentNode>)>,
    },
    /// Peer `peer`'s agent asked, for its waiting jobs, for up to `count` of these nodes
    /// (those lent to it already count) for `for_ms` (operators only: this cluster's peer
    /// agent). Idle nodes are lent, unless a job of this cluster waits: answered with
    /// [`Reply::Lent`].
    LendAsked {
        peer: String,
        nodes: Vec<String>,
        count: u32,
        for_ms: u64,
    },
    /// Peer `peer` gives back these nodes it borrowed on its asking (operators only).
    GiveBack {
        peer: String,
        nodes: Vec<String>,
    },
    /// Keep these nodes out of allocation until resumed; jobs on them run to their end.
    Drain {
        nodes: NodeSet,
        reason: String,
    },
    /// End a drain.
    Resume {
        nodes: NodeSet,
    },
    /// Follow a job submitted on another connection (storm-submit after the MM restarted):
    /// the MM answers as it answered the submission (`Accepted`, then `Started`, output and
    /// `Finished`), or at once with `Finished` for a job that already ended.
    Attach {
        job: JobId,
    },
    /// Standard input for a job this connection submitted or follows: the stream's bytes
    /// from `offset` on (at most [`crate::messages::MAX_INPUT_CHUNK`]), and whether it ends
    /// after them. The tasks' [`crate::messages::Stream::InputTaken`] chunks say how far
    /// they took it; the submitter keeps what is not taken and sends it again after an MM
    /// restart.
    Input {
        job: JobId,
        offset: u64,
        data: Vec<u8>,
        eof: bool,
    },
    /// Jobs that ended, most recent last.
    History,
    /// The MM's metrics, in the Prometheus text format.
    Metrics,
    Shutdown,
    /// A control relay's first request instead of `Hello` (`storm-relay --manager`, on the
    /// MM's host): the connection acts for user `uid`/`gid`, who connected to the relay of
    /// node `node`, which proved that it is that node. The MM takes it only from root or its
    /// own user.
    RelayHello {
        version: u32,
        uid: u32,
        gid: u32,
        node: String,
    },
    /// Cancel one element of an array (`storm cancel 12_3`).
    CancelElement {
        array: JobId,
        index: u32,
    },
    /// Each named node's history of samples over the last `window_ms` (`storm nodes
    /// --history`); no names: every node.
    NodeHistory {
        nodes: Vec<String>,
        window_ms: u64,
    },
    /// The peer agent's (`storm-peer`) view of the peer clusters, for the MM to keep and
    /// show (operators only: root or the MM's own user, on the MM's host).
    PeerReport(Vec<crate::federation::PeerInfo>),
    /// The peer clusters (`storm peers`).
    Peers,
    /// The jobs this cluster flocked to peers, for its peer agent to pass on (operators
    /// only): answered with [`Reply::FlockOut`].
    FlockOut,
    /// What the peer agent heard of this cluster's flocked jobs from the peers that run
    /// them (operators only): answered with [`Reply::FlockTaken`].
    FlockReport(Vec<crate::flock::FlockUpdate>),
    /// A job flocked here from peer cluster `origin`, submitted by this cluster's peer agent
    /// for local user `uid`/`gid` (the agent maps the owner's name; operators only). The
    /// connection then follows the job as storm-submit's would; the job goes on if it
    /// leaves.
    SubmitFlocked {
        origin: String,
        uid: u32,
        gid: u32,
        req: Box<JobRequest>,
    },
}

/// Time spent in each phase of a job, in microseconds (the paper's Fig. 2 breakdown, and
/// `storm-submit --timing`). `queued + send + launch + execute = total`, and `execute =
/// start + run + report` as far as the nodes' clocks tell (they count from their own receipt
/// of the launch heartbeat).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Timing {
    /// Submission to nodes allocated.
    pub queued_us: u64,
    /// Nodes allocated to program ready on every node (0 with `--no-bcast`).
    pub send_us: u64,
    /// Program ready (nodes allocated with `--no-bcast`) to the launch heartbeat issued.
    pub launch_us: u64,
    /// Launch heartbeat to termination detected.
    pub execute_us: u64,
    /// Program ready to its start held by the journal (write-ahead: a restarted MM must know
    /// of every job whose tasks may run); part of `launch_us`.
    pub record_us: u64,
    /// Launch heartbeat taken to its seal checked, on the slowest node; part of `start_us`.
    pub verified_us: u64,
    /// Launch heartbeat taken to the job readied (program checked, PMI set up), on the
    /// slowest node; part of `start_us`.
    pub prepared_us: u64,
    /// Launch heartbeat taken to every local task handed to the launcher, on the slowest
    /// node; part of `start_us` where one node runs the job.
    pub asked_us: u64,
    /// Launch heartbeat to the first task started (on the node that started one first).
    pub start_us: u64,
    /// First task started to last task ended (on any node).
    pub run_us: u64,
    /// Last task ended to termination detected by the MM.
    pub report_us: u64,
    /// Launch heartbeat taken to the report written, on the node that wrote last: the
    /// node's part of `report_us` ends here, the MM's begins.
    pub reported_us: u64,
    /// Submission to termination detected.
    pub total_us: u64,
}

/// How a job ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobOutcome {
    pub job: JobId,
    /// Status of every rank, by rank; `None` for ranks that never reported.
    pub ranks: Vec<Option<RankStatus>>,
    /// Why the job ended other than by its processes finishing (cancelled, failed to start).
    pub reason: Option<String>,
    /// The exit code a rank asked the whole job to end with (`MPI_Abort`).
    pub abort_code: Option<i32>,
    pub timing: Timing,
    /// What its processes used, from their cgroups: CPU time over all its nodes, and the
    /// largest peak memory of one node.
    pub usage: crate::messages::JobUsage,
    /// What ended it, when not its tasks' own end: `storm history`'s state.
    pub cause: Option<EndCause>,
    /// Its program ran from a copy in each node's spool, not from its own path.
    pub broadcast: bool,
}

/// What ended a job other than its tasks: the states `storm history` shows beside
/// `completed` and `failed`, as sacct's.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EndCause {
    /// `storm cancel`, its submitter leaving, its allocation ending, the cluster shutting down.
    Cancelled,
    /// Its time limit (`--time`).
    Timeout,
    /// A node of it failed.
    NodeFail,
    /// It failed, and the kernel's OOM killer had killed some of its processes.
    OutOfMemory,
    /// A node of it, borrowed from a peer cluster, was called home by its owner (sacct's
    /// `PREEMPTED`).
    Preempted,
}

impl JobOutcome {
    /// The state `storm history` shows: what ended it, or its exit code's verdict.
    pub fn state(&self) -> JobState {
        match self.cause {
            Some(EndCause::Cancelled) => JobState::Cancelled,
            Some(EndCause::Timeout) => JobState::Timeout,
            Some(EndCause::NodeFail) => JobState::NodeFail,
            Some(EndCause::OutOfMemory) => JobState::OutOfMemory,
            Some(EndCause::Preempted) => JobState::Preempted,
            None if self.exit_code() == 0 => JobState::Completed,
            None => JobState::Failed,
        }
    }

    /// The exit code storm-submit returns: the code of the rank that ended the job (an
    /// `MPI_Abort`'s, or that rank's own exit code or 128 + its signal: `abort_code`);
    /// otherwise 0 when every rank succeeded; otherwise the lowest failing rank's exit code,
    /// or 128 + its signal; 1 for a job that ended without reports (docs/mpi.md).
    pub fn exit_code(&self) -> i32 {
        if let Some(code) = self.abort_code {
            return code;
        }
        for status in &self.ranks {
            match status {
                Some(s) if s.success() => {}
                Some(s) => return s.shell_code(),
                None => return 1,
            }
        }
        if self.reason.is_some() && self.ranks.is_empty() {
            1
        } else {
            0
        }
    }
}

/// A job's state, as `storm queue` and `storm history` show it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum JobState {
    /// Waiting for nodes.
    Queued,
    /// Placed; its program transfer waits for a worker or for its nodes.
    Starting,
    /// Its program is being sent to its nodes.
    Sending,
    /// Its launch is being recorded or waits for the next heartbeat.
    Launching,
    /// It ran when the MM restarted; its nodes have not all said they still hold it.
    Recovering,
    Running,
    /// Gang scheduling: placed, but not in this timeslice's slot.
    Suspended,
    /// Its nodes announced its end; the MM is collecting their reports.
    Ending,
    /// Cancelled; its tasks are being stopped.
    Cancelling,
    /// Ended with exit code 0.
    Completed,
    /// Ended otherwise.
    Failed,
    /// Ended by `storm cancel`, its submitter leaving, or its allocation ending.
    Cancelled,
    /// Ended at its time limit.
    Timeout,
    /// Ended because a node of it failed.
    NodeFail,
    /// Failed, with processes killed by the kernel's OOM killer.
    OutOfMemory,
    /// Ended because the owner of a node it borrowed called that node home.
    Preempted,
}

impl JobState {
    pub fn as_str(self) -> &'static str {
        match self {
            JobState::Queued => "queued",
            JobState::Starting => "starting",
            JobState::Sending => "sending",
            JobState::Launching => "launching",
            JobState::Recovering => "recovering",
            JobState::Running => "running",
            JobState::Suspended => "suspended",
            JobState::Ending => "ending",
            JobState::Cancelling => "cancelling",
            JobState::Completed => "completed",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
            JobState::Timeout => "timeout",
            JobState::NodeFail => "node_fail",
            JobState::OutOfMemory => "out_of_memory",
            JobState::Preempted => "preempted",
        }
    }
}

impl std::fmt::Display for JobState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

/// A node's state, as `storm nodes` shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum NodeState {
    /// Its NM has not registered since the MM started.
    Unknown,
    /// Registered; being welcomed into the heartbeat.
    Joining,
    /// Up, without jobs.
    Idle,
    /// Up, with jobs.
    Allocated,
    /// Stopped taking heartbeats; down if it does not come back within the failure window.
    Unresponsive,
    Down,
    /// Drained by an operator, with jobs still on it.
    Draining,
    /// Drained by an operator, without jobs.
    Drained,
    /// Lent to a peer cluster (docs/federation.md): it runs that cluster's jobs, none of
    /// this one's, until it comes home.
    Lent,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Unknown => "unknown",
            NodeState::Joining => "joining",
            NodeState::Idle => "idle",
            NodeState::Allocated => "allocated",
            NodeState::Unresponsive => "unresponsive",
            NodeState::Down => "down",
            NodeState::Draining => "draining",
            NodeState::Drained => "drained",
            NodeState::Lent => "lent",
        }
    }
}

impl std::fmt::Display for NodeState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.pad(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JobInfo {
    pub job: JobId,
    pub name: String,
    pub uid: u32,
    pub state: JobState,
    pub nodes: NodeSet,
    /// The CPUs it holds of its one node, when it shares the node with other jobs.
    pub cpus: Option<NodeSet>,
    pub ntasks: u32,
    pub elapsed_ms: u64,
    /// Why a queued job waits.
    pub reason: Option<String>,
    /// Gang scheduling: the job's row of the Ousterhout matrix, once placed.
    pub time_slot: Option<u32>,
    /// For a job that ended: the exit code storm-submit returned for it.
    pub exit_code: Option<i32>,
    /// For a job that ended: what its processes used (from their cgroups).
    pub usage: crate::messages::JobUsage,
    /// For a job of an array: which array and element.
    pub element: Option<ArrayElement>,
    /// When it was submitted, started (its launch went out) and ended, in milliseconds since
    /// the Unix epoch, as far as it got.
    pub submitted_ms: u64,
    pub started_ms: Option<u64>,
    pub ended_ms: Option<u64>,
    /// The peer cluster it was flocked to, which runs it (`None`: this cluster).
    #[serde(default)]
    pub runs_on: Option<String>,
    /// The peer cluster whose job this is, for one flocked here (`None`: this cluster's own).
    #[serde(default)]
    pub from_cluster: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    pub id: u32,
    pub name: String,
    pub state: NodeState,
    pub jobs: Vec<JobId>,
    /// Why the node is down or drained.
    pub reason: Option<String>,
    /// What the node's NM last sampled (`None` from an MM that does not gather samples).
    #[serde(default)]
    pub records: Option<crate::sample::NodeRecords>,
}

impl NodeInfo {
    /// The node's last sample if it is fresh: a stale one (the NM stopped sampling) is not
    /// what the node does now, and is never shown or counted as if it were.
    pub fn fresh_sample(&self) -> Option<&crate::sample::NodeSample> {
        let r = self.records.as_ref()?;
        r.sample.as_ref().filter(|_| !r.stale)
    }

    /// What the node's jobs and fabric ports used, taken with its fresh sample (`None` if
    /// that sample is stale).
    pub fn fresh_usage(&self) -> Option<&crate::usage::NodeUsage> {
        let r = self.records.as_ref()?;
        r.usage.as_ref().filter(|_| !r.stale)
    }
}

/// One replica of the MM, as the leader sees it (a single MM shows itself alone).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ManagerInfo {
    pub name: String,
    /// `leader`; `follower`, heard from within an election timeout; `learner`, a replica
    /// the group admitted that does not vote until its log holds everything committed;
    /// `unreachable`, not heard from; `diverged`, its journal differs from the majority's
    /// until it took the leader's; `removed`, no member holds its place; or `single` (no
    /// group).
    pub role: String,
    /// The Raft term it was last known in (0: a single MM).
    pub term: u64,
    /// The last log entry it is known to hold.
    pub matched: u64,
    /// Entries it lacks of the leader's log.
    pub lag: u64,
    /// How long ago the leader last heard from it (milliseconds; `None`: never, or itself).
    pub heard_ms_ago: Option<u64>,
}

impl ManagerInfo {
    /// A single MM (no group).
    pub fn single() -> Self {
        Self {
            name: "mm".into(),
            role: "single".into(),
            term: 0,
            matched: 0,
            lag: 0,
            heard_ms_ago: None,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Reply {
    Hello {
        version: u32,
        cluster: String,
        nodes: u32,
    },
    Error(String),
    /// The job is accepted; `queued` says why it waits, if it does.
    Accepted {
        job: JobId,
        queued: Option<String>,
    },
    /// The job has its nodes; `time_slot` is its row of the gang scheduler's matrix.
    Started {
        job: JobId,
        /// How many tasks the job runs.
        ntasks: u32,
        nodes: NodeSet,
        node_names: Vec<String>,
        time_slot: Option<u32>,
    },
    Output(OutputChunk),
    /// A node of the job failed; the job (`--requeue`) is back in the queue and will run
    /// again from the start.
    Requeued {
        job: JobId,
        reason: String,
    },
    Finished(JobOutcome),
    /// The program is being sent to the job's nodes: `sent` of `total` bytes have reached
    /// every one of them. Sent while the transfer lasts, a few times a second at most.
    Progress {
        job: JobId,
        sent: u64,
        total: u64,
    },
    /// The metrics text (`Request::Metrics`).
    Metrics(String),
    Queue(Vec<JobInfo>),
    History(Vec<JobInfo>),
    Nodes(Vec<NodeInfo>),
    Managers(Vec<ManagerInfo>),
    Done,
    /// Done, and what the operator should know about it.
    Notice(String),
    /// The answer to [`Request::NodeHistory`].
    NodeHistory(Vec<crate::sample::NodeTrace>),
    /// The answer to [`Request::Peers`]: the peer agent's last report, and how long ago it
    /// came (`None`: no agent has reported since the MM started).
    Peers {
        peers: Vec<crate::federation::PeerInfo>,
        reported_ms_ago: Option<u64>,
    },
    /// The job waits at home no longer: peer cluster `peer` runs it (docs/federation.md).
    /// Its `Started`, output and `Finished` follow from there.
    Flocked {
        job: JobId,
        peer: String,
    },
    /// The answer to [`Request::FlockOut`].
    FlockOut(Vec<crate::flock::FlockOrder>),
    /// The answer to [`Request::BorrowOut`]: one order per lender with something to say.
    BorrowOut(Vec<crate::federation::BorrowOrder>),
    /// The answer to [`Request::LendAsked`]: the nodes lent to that peer now, of those asked
    /// for, and whether each was lent on its asking.
    Lent(Vec<crate::federation::LentNode>),
    /// The answer to [`Request::Recalls`]: each borrower, and the nodes called home from it.
    Recalls(Vec<(String, Vec<crate::federation::Recalled>)>),
    /// The answer to [`Request::FlockReport`]: how many events of each update the MM took,
    /// in order. It takes no more output of a job whose submitter has not read what it was
    /// sent (flow control from end to end): the rest comes again.
    FlockTaken(Vec<usize>),
}

mod wire;
pub use wire::*;

#[cfg(test)]
mod tests;
