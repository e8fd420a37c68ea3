//! The cluster file's sections (`[cluster]`, `[tcp]`, `[scheduler]`, `[failure]`, `[mm]`,
//! `[replication]`, `[[manager]]`, `[[node]]`, `[security]`, `[limits]`, `[history]`,
//! `[monitoring]`, `[relay]`, `[ofi]`): each key, its meaning and its default. The file as a
//! whole, and what it must satisfy, is [`super::ClusterConfig`].

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use storm_primitives::tcp::TcpConfig;

/// Which implementation of the primitives the daemons use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BackendKind {
    /// TCP trees: any IP network.
    Tcp,
    /// libfabric: RDMA writes and network atomics (verbs;ofi_rxm on InfiniBand).
    Ofi,
    /// Every node a thread of one process sharing one fabric (`storm-local`): a cluster for
    /// one machine without sockets between its daemons.
    Local,
}

impl std::str::FromStr for BackendKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "tcp" => Ok(BackendKind::Tcp),
            "ofi" => Ok(BackendKind::Ofi),
            "local" => Ok(BackendKind::Local),
            other => Err(format!(
                "unknown backend {other:?} (expected tcp, ofi or local)"
            )),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ClusterSection {
    pub name: String,
    pub backend: BackendKind,
    /// The heartbeat period: the MM acts only at these boundaries.
    pub timeslice_ms: f64,
    /// Unix socket where the MM takes requests from storm-submit and storm.
    pub control_socket: PathBuf,
    /// Jobs that may run at once (sizes the per-job areas of global memory).
    pub max_jobs: usize,
    /// Tasks one node may run for one job.
    pub max_tasks_per_node: usize,
    /// Heartbeat queue: slots and bytes per slot.
    pub heartbeat_slots: usize,
    pub heartbeat_bytes: usize,
    /// Program transfer (Algorithm 6): bytes per chunk and slots in the chunk queue. Eight
    /// slots, not the paper's two: on tcp an AWAIT-SPACE check travels behind the chunks
    /// already on their way, so a producer that may run only two chunks ahead waits a whole
    /// chunk's journey for every chunk (docs/architecture.md, "Job launch").
    pub transfer_chunk_bytes: usize,
    pub transfer_slots: usize,
    /// Program transfers that may run at once (on disjoint nodes).
    pub max_transfers: usize,
    /// Output queue from each node to the MM: slots and bytes per slot.
    pub output_slots: usize,
    pub output_bytes: usize,
    /// MPI jobs (PMI): bytes of one node's puts to one fence, and of a job's whole key space
    /// as the MM sends it back (docs/mpi.md).
    pub pmi_node_bytes: usize,
    pub pmi_job_bytes: usize,
    /// After SIGTERM, how long a cancelled job has before SIGKILL.
    pub kill_wait_ms: u64,
    /// The storm-pl binary; by default the one next to storm-nm.
    pub pl_path: Option<PathBuf>,
    /// The PMI-1 client library Open MPI loads (`storm-submit --mpi openmpi`); by default
    /// `libstorm_pmi.so` next to storm-nm.
    pub pmi_library: Option<PathBuf>,
    /// Where the MM keeps its journal (jobs, results, drains) and the programs of waiting
    /// jobs, so that a restarted MM loses nothing it accepted.
    pub state_dir: PathBuf,
    /// The secret every daemon of the cluster shares (`storm keygen`). By default
    /// `storm.key` next to the cluster file; a relative path is taken from there too.
    pub key_file: Option<PathBuf>,
    /// The MM's secret signing key (`storm keygen --mm`), on the MM's host only; by default
    /// `mm.key` next to the cluster file (see [`crate::identity`]).
    pub mm_key_file: Option<PathBuf>,
    /// The MM's public key, on every node: NMs carry out only what it sealed. By default
    /// `mm.pub` next to the cluster file.
    pub mm_public_key_file: Option<PathBuf>,
    /// This node's secret identity key (`storm keygen --node NAME`); `{node}` stands for the
    /// node's name. By default `node.key` next to the cluster file.
    pub node_key_file: Option<PathBuf>,
    /// The nodes' public identity keys, enrolled at the MM (`NAME KEY` per line); by default
    /// `nodes.pub` next to the cluster file.
    pub enrolled_file: Option<PathBuf>,
    /// Which cgroups confine each job's processes on the nodes (`auto`: v2 where the host
    /// is v2 only, else v1 where it has v1 controllers, else v2; `none`: process groups
    /// only).
    pub cgroups: CgroupMode,
    /// How PMIx clients prove their account to the node's PMIx server (docs/mpi.md, PMIx).
    pub pmix: PmixSecurity,
    /// The account a root NM runs its PMIx helper as (never root; no job of it is served
    /// PMIx). A dedicated account is best: any process of it can stop the helper.
    pub pmix_user: String,
    /// How a job's ranks are bound to CPUs when storm-submit does not say (`--cpu-bind`):
    /// `cores` (each rank its own CPUs), `rank` or `none` (docs/mpi.md). An embedded local
    /// cluster whose pretend nodes share the host's CPUs is written with `none`.
    pub cpu_bind: crate::cpu_bind::CpuBind,
}

/// How a PMIx client proves which account it runs as (`[cluster] pmix`). The PMIx library
/// takes its clients over loopback TCP, where the kernel vouches for no one.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PmixSecurity {
    /// A MUNGE credential, checked by the node's munged; without munged, PMIx is not served.
    #[default]
    Munge,
    /// The account the client says it runs as: any local user can pose as a rank of any
    /// job on the node (its data, its fences, its abort). Only for a node no one else uses.
    Native,
    /// PMIx is not served (PMI-1 and PMI-2 still are).
    Off,
}

/// The cgroup version jobs are confined with (`[cluster] cgroups`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum CgroupMode {
    #[default]
    Auto,
    V1,
    V2,
    None,
}

impl Default for ClusterSection {
    fn default() -> Self {
        Self {
            name: "storm".into(),
            backend: BackendKind::Tcp,
            timeslice_ms: 1.0,
            control_socket: PathBuf::from("/run/storm/mm.sock"),
            max_jobs: 32,
            max_tasks_per_node: 64,
            heartbeat_slots: 16,
            heartbeat_bytes: 64 * 1024,
            transfer_chunk_bytes: 512 * 1024,
            transfer_slots: 8,
            max_transfers: 4,
            output_slots: 8,
            output_bytes: 16 * 1024,
            pmi_node_bytes: 32 * 1024,
            pmi_job_bytes: 1024 * 1024,
            kill_wait_ms: 2000,
            pl_path: None,
            pmi_library: None,
            state_dir: PathBuf::from("/var/lib/storm"),
            key_file: None,
            mm_key_file: None,
            mm_public_key_file: None,
            node_key_file: None,
            enrolled_file: None,
            cgroups: CgroupMode::Auto,
            pmix: PmixSecurity::Munge,
            pmix_user: "nobody".into(),
            cpu_bind: crate::cpu_bind::CpuBind::Cores,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TcpSection {
    pub fanout: usize,
    pub chunk_bytes: usize,
    pub op_timeout_ms: u64,
    pub connect_timeout_ms: u64,
    /// Data unacknowledged this long closes the connection (TCP_USER_TIMEOUT): how soon a
    /// node behind a cut link is noticed.
    pub peer_timeout_ms: u64,
    /// Encrypt frames as well as authenticate them (AES-256-GCM): jobs' environments (tokens,
    /// passwords) and output cross the network. On by default; `false` is an explicit
    /// opt-out for a network no one else can read, and the daemons warn about it.
    pub encrypt: bool,
}

impl Default for TcpSection {
    fn default() -> Self {
        let d = TcpConfig::default();
        Self {
            fanout: d.fanout,
            chunk_bytes: d.chunk_size,
            op_timeout_ms: d.op_timeout.as_millis() as u64,
            connect_timeout_ms: d.connect_timeout.as_millis() as u64,
            peer_timeout_ms: d.peer_timeout.as_millis() as u64,
            encrypt: true,
        }
    }
}

/// How the MM schedules jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum PolicyKind {
    /// First come, first served, space sharing.
    #[default]
    Fcfs,
    /// EASY backfilling (uses `--time`).
    Easy,
    /// Gang scheduling: time slicing over an Ousterhout matrix.
    Gang,
}

impl std::str::FromStr for PolicyKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "fcfs" => Ok(PolicyKind::Fcfs),
            "easy" => Ok(PolicyKind::Easy),
            "gang" => Ok(PolicyKind::Gang),
            other => Err(format!(
                "unknown policy {other:?} (expected fcfs, easy or gang)"
            )),
        }
    }
}

/// Scheduling.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SchedulerSection {
    pub policy: PolicyKind,
    /// Time slots of the gang scheduler's matrix (multiprogramming level).
    pub mpl: usize,
    /// Limit given to jobs submitted without `--time` (EASY needs one for every job).
    pub default_time_limit_s: u64,
    /// Each NM appends every schedule it applies to `<spool>/switches.log` (for benchmarks and
    /// tests), one line per switch: `SEQ DONE_NS stop=JOBS cont=JOBS start=JOBS recv=NS
    /// from=SEQ`, with CLOCK_MONOTONIC times of the switch's completion and of the heartbeat's
    /// receipt. `from` is the heartbeat that began the switch: earlier than `SEQ` when the old
    /// slot's tasks took longer than a heartbeat to stop. A line that ends `lease=expired` is
    /// no switch: heartbeat `SEQ`'s lease ran out (`slot_lease`) and the NM stopped `stop`
    /// at `recv`.
    pub switch_log: bool,
    /// Each NM appends every heartbeat it takes to `<spool>/heartbeats.log` (for benchmarks),
    /// one line each: `SEQ RECV_NS`, the CLOCK_MONOTONIC time it took the heartbeat from its
    /// queue.
    pub heartbeat_log: bool,
    /// Run the MM and the NMs under the real-time policy SCHED_FIFO at this priority (1-99;
    /// 0: the normal policy). A heartbeat then preempts the jobs' tasks at once instead of
    /// waiting out their time slice of the kernel's scheduler, which is what keeps the nodes
    /// of a gang in step, and a millisecond quantum real, on busy nodes. The launcher and the
    /// tasks run under the normal policy. On by default (`DEFAULT_DAEMON_RT_PRIORITY`);
    /// it needs root or CAP_SYS_NICE, and without them a daemon warns and runs under the
    /// normal policy, where busy nodes switch up to a kernel time slice apart
    /// (docs/scheduling.md).
    pub daemon_rt_priority: u8,
    /// Gang scheduling: each heartbeat that ends with a switch gives its slot a lease of one
    /// timeslice plus this grace, counted from the node's receipt. A node whose next
    /// heartbeat has not come by then stops the slot's tasks until it comes, so a late (or
    /// lost) heartbeat lets a node run the old slot beside the other nodes' new one for at
    /// most this long. `slot_lease = false` lets the slot run on until the heartbeat comes
    /// (docs/scheduling.md).
    pub slot_lease: bool,
    pub slot_grace_ms: f64,
}

/// The daemons' SCHED_FIFO priority unless the cluster file says otherwise: low among
/// real-time priorities (the kernel's own threads use 50 and up), above every normal task.
pub const DEFAULT_DAEMON_RT_PRIORITY: u8 = 10;

impl Default for SchedulerSection {
    fn default() -> Self {
        Self {
            policy: PolicyKind::Fcfs,
            mpl: 2,
            default_time_limit_s: 24 * 3600,
            switch_log: false,
            heartbeat_log: false,
            daemon_rt_priority: DEFAULT_DAEMON_RT_PRIORITY,
            slot_lease: true,
            slot_grace_ms: 5.0,
        }
    }
}

/// Failure detection (docs/operations.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FailureSection {
    /// K: a node that has taken no heartbeat for this many heartbeat periods (and has not
    /// registered back) is DOWN.
    pub missed_heartbeats: u32,
    /// A heartbeat's deadline, in heartbeat periods: a member that has not taken it by then
    /// leaves the heartbeat (unresponsive) and the others go on without it. Less than K.
    pub deadline_heartbeats: u32,
    /// The least a heartbeat's deadline may be, in milliseconds, whatever the period: a
    /// healthy node on a loaded host can go unscheduled for tens of milliseconds (more than
    /// 50 ms was seen on a 2-core host running 8 NMs), and leaving the heartbeat for that
    /// makes it register again and sends a job being started there back to the queue.
    pub deadline_min_ms: u64,
    /// How often the MM checks with COMPARE-AND-WRITE that every member took the heartbeats
    /// delivered to it; one found behind is unresponsive.
    pub check_interval_ms: u64,
    /// A heartbeat that would tell the members nothing new (no command, the schedule they
    /// already run) goes only this often, not every timeslice: an idle cluster then costs its
    /// daemons almost nothing. Bounded by failure detection (at most a quarter of a
    /// heartbeat's deadline and of K periods); 0 sends one every timeslice, as does a
    /// cluster with peers or a replicated MM (see `ClusterConfig::quiet_heartbeat_period`).
    pub quiet_heartbeat_ms: u64,
    /// After a restart of the MM, how long jobs that ran wait for their nodes to register
    /// again and say they still hold them; a job some of whose nodes did not come back by then
    /// ends, naming them.
    pub readopt_within_ms: u64,
    /// An NM that hears no heartbeat for this long assumes the MM dropped it (or restarted)
    /// and registers again. Longer than any stall of the MM.
    pub rejoin_after_ms: u64,
    /// A node's launcher (storm-pl) that leaves a task request unanswered this long is
    /// stuck (stopped, or starved of processor time): the NM kills it, reports the tasks it
    /// held as killed, and starts a new one for the next task.
    pub launcher_timeout_ms: u64,
    /// A task's process that has not reached its program this long after the launcher
    /// started it (its user stopped it before its exec, say) is killed, and the task fails
    /// with the reason. The launcher never waits for it meanwhile.
    pub task_start_timeout_ms: u64,
}

impl Default for FailureSection {
    fn default() -> Self {
        Self {
            missed_heartbeats: 1000,
            deadline_heartbeats: 10,
            deadline_min_ms: 200,
            check_interval_ms: 100,
            quiet_heartbeat_ms: 50,
            readopt_within_ms: 30_000,
            rejoin_after_ms: 10_000,
            launcher_timeout_ms: 10_000,
            task_start_timeout_ms: 10_000,
        }
    }
}

/// The libfabric backend.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct OfiSection {
    /// The provider, e.g. `tcp;ofi_rxm` or `verbs;ofi_rxm`; by default `verbs;ofi_rxm` where an
    /// RDMA device exists, else `tcp;ofi_rxm`.
    pub provider: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MmSection {
    /// Where the MM's primitives endpoint listens. With a replicated group (`[[manager]]`)
    /// the section may be left out: each replica listens at its own entry's address.
    pub address: SocketAddr,
}

/// No `[mm]` section: only valid with `[[manager]]` entries, which then give the address.
impl Default for MmSection {
    fn default() -> Self {
        Self {
            address: SocketAddr::from(([0, 0, 0, 0], 0)),
        }
    }
}

/// How a replicated MM's replicas keep in touch (`[replication]`; only with `[[manager]]`).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ReplicationSection {
    /// The Raft tick: the leader's heartbeat to the other replicas.
    pub heartbeat_ms: u64,
    /// A follower that hears nothing from the leader for this long (up to twice as long,
    /// drawn at random) stands for election. The leader stops acting as the cluster's MM once
    /// it has not heard from a majority for half of it, before anyone can replace it.
    pub election_timeout_ms: u64,
    /// Every this many log entries, the replicas compare a hash of their journals; one that
    /// differs from the majority takes the leader's state (0: never compare).
    pub checksum_every: u64,
    /// Each replica drops the log entries its journal holds durably once the log holds twice
    /// this many, keeping the newest this many (a replica that was away briefly catches up
    /// from them). One that lacks entries the leader dropped takes the leader's state instead.
    pub log_entries_kept: u64,
    /// For measuring only: replicas do not sync their Raft logs before they acknowledge
    /// entries (so a killed replica loses the entries and votes it wrote since its last
    /// checkpoint, up to a second: jobs can be lost or run twice, and two leaders can be
    /// elected in one term). It shows what the sync costs (docs/operations.md).
    pub unsafe_no_log_sync: bool,
}

impl Default for ReplicationSection {
    fn default() -> Self {
        Self {
            heartbeat_ms: 10,
            election_timeout_ms: 100,
            checksum_every: 256,
            log_entries_kept: 4096,
            unsafe_no_log_sync: false,
        }
    }
}

/// One replica of a replicated machine manager (`[[manager]]`): three (2f+1) MMs that keep
/// one journal through Raft; the leader of the moment is the cluster's MM (docs/operations.md,
/// "A replicated manager group").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ManagerEntry {
    pub name: String,
    /// Where this replica's MM endpoint listens while it leads; the NMs try each replica's
    /// in turn until they find the leader.
    pub address: SocketAddr,
    /// Where this replica takes the other replicas' messages (the managers' own fabric).
    pub peer_address: SocketAddr,
    /// This replica's `[cluster] state_dir`, where it differs (replicas sharing a host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub state_dir: Option<PathBuf>,
    /// This replica's `[cluster] control_socket`, where it differs (replicas sharing a host).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub control_socket: Option<PathBuf>,
    /// Where the manager side of the control relay beside this replica listens
    /// (`storm-relay --manager --replica NAME`), in place of `[relay] address`: the node
    /// relays try each replica's in turn, and only the leader's takes a user's connection.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub relay_address: Option<SocketAddr>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NodeEntry {
    pub name: String,
    /// Where this node's NM listens for the primitives.
    pub address: SocketAddr,
    /// Node-local directory for transferred programs.
    pub spool: PathBuf,
    /// Processors: how many tasks of one job the node runs without `--overcommit` (and how
    /// many `-n` alone puts on it). Default 1, as in Slurm.
    #[serde(default = "one")]
    pub cpus: u32,
    /// Memory jobs may use on the node (`mem = "64G"`); none: what the node has, as its NM
    /// detects it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mem: Option<crate::size::ByteSize>,
    /// What `--constraint` selects the node by (`features = ["ib", "gpu"]`).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub features: Vec<String>,
    /// A guest slot (docs/federation.md, lending): this entry is the place in this cluster's
    /// fabric of a node that a peer cluster lends here, not a node of this cluster. It is
    /// down, and given no job, but while that node's guest NM is a member; only jobs that
    /// allow borrowing (`--borrow`) go there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_of: Option<crate::federation::GuestOf>,
}

pub(super) fn one() -> u32 {
    1
}

/// Who may run jobs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct SecuritySection {
    /// Whether root (uid 0) may run jobs, as Slurm allows by default. The MM refuses such
    /// jobs at submission when false, and NMs refuse to start them.
    pub allow_root_jobs: bool,
    /// How often a running daemon checks its key files again (mode and owner), seconds; it
    /// also does on SIGHUP, when it reads its keys again (key rotation, docs/security.md).
    pub key_check_interval_s: u64,
}

impl Default for SecuritySection {
    fn default() -> Self {
        Self {
            allow_root_jobs: true,
            key_check_interval_s: 60,
        }
    }
}

/// What one user may hold at the MM, so that no user can exhaust it for the others. Each limit
/// is checked when something new is asked for; what was accepted before is never dropped for
/// it. The defaults are far above what an interactive user needs.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsSection {
    /// Jobs of one user waiting in the queue (not yet started).
    pub max_queued_jobs_per_user: u32,
    /// Size of a program sent with the job, to be copied to the nodes unless it is in place
    /// there (`--no-bcast` sends none).
    pub max_program_bytes: u64,
    /// Total size of the programs the MM holds for one user's unfinished jobs.
    pub max_spooled_bytes_per_user: u64,
    /// Control connections (storm-submit, storm) one user may have open at once.
    pub max_connections_per_user: u32,
    /// Size of one control request.
    pub max_request_bytes: u32,
    /// Bytes of replies (other than output, which is flow-controlled end to end) a client may
    /// leave unread; past it the client is disconnected and its jobs go on without it. In
    /// bytes, not replies: one `storm queue` of a long queue is megabytes.
    pub max_unread_reply_bytes: u64,
    /// Size of a job's name (shown to every user by `storm queue`).
    pub max_job_name_bytes: u32,
    /// Size of a job's arguments and environment together (the kernel's `ARG_MAX` is 2 MiB
    /// with the default stack limit).
    pub max_argument_bytes: u64,
    /// Elements of one job array (`storm batch --array`), as Slurm's MaxArraySize.
    pub max_array_size: u32,
    /// Bytes of arguments and environment the MM holds, in memory and in its journal, for
    /// one user's unfinished jobs (each element of an array counts): without it, a user's
    /// queue of jobs at `max_argument_bytes` each grew the MM by gigabytes.
    pub max_held_request_bytes_per_user: u64,
}

impl Default for LimitsSection {
    fn default() -> Self {
        Self {
            max_queued_jobs_per_user: 10_000,
            max_program_bytes: 1 << 30,
            max_spooled_bytes_per_user: 8 << 30,
            max_connections_per_user: 64,
            max_request_bytes: 4 << 20,
            max_unread_reply_bytes: 16 << 20,
            max_job_name_bytes: 256,
            max_argument_bytes: 2 << 20,
            max_array_size: 1001,
            max_held_request_bytes_per_user: 128 << 20,
        }
    }
}

/// How long ended jobs stay in `storm history` (and for `--dependency` on them, and for a
/// submitter that reattaches after an MM restart), as Slurm's `PurgeJobAfter`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct HistorySection {
    /// Days after its end that a job's record is kept.
    pub keep_days: u32,
    /// The most ended jobs kept whatever their age, oldest dropped first: a bound on the
    /// MM's memory and journal (a record without its environment is about a kilobyte).
    pub max_jobs: usize,
}

impl Default for HistorySection {
    fn default() -> Self {
        Self {
            keep_days: 30,
            max_jobs: 100_000,
        }
    }
}

impl HistorySection {
    /// How long a record is kept after its job ended.
    pub fn keep(&self) -> Duration {
        Duration::from_secs(u64::from(self.keep_days) * 86_400)
    }
}

/// Node monitoring (`[monitoring]`): how often each NM samples its node, and where the CPU
/// and memory figures come from (docs/monitoring.md).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MonitoringSection {
    /// The sample period (milliseconds): each NM samples its node and puts the record where
    /// the MM reads it this often.
    pub sample_ms: u64,
    /// Where a node's CPU and memory figures come from: `host` (`/proc`, a node that is a
    /// host of its own) or `node_cgroup` (the node's cgroup subtree, for nodes that share one
    /// kernel, as on the namespace testbed and an embedded cluster).
    pub source: crate::sample::Source,
    /// How far back the MM keeps each node's samples (seconds; 0: none), for `storm nodes
    /// --history`: 12 bytes per node and sample.
    pub history_s: u64,
    /// Where sysfs is mounted: the NM reads the fabric ports' counters under
    /// `SYSFS/class/infiniband` (as node_exporter's `--path.sysfs`, for an NM that sees the
    /// host's sysfs elsewhere).
    pub sysfs: std::path::PathBuf,
}

impl Default for MonitoringSection {
    fn default() -> Self {
        Self {
            sample_ms: 1000,
            source: crate::sample::Source::Host,
            history_s: 3600,
            sysfs: "/sys".into(),
        }
    }
}

impl MonitoringSection {
    pub fn period(&self) -> Duration {
        Duration::from_millis(self.sample_ms)
    }

    /// Samples each node's history holds.
    pub fn history_points(&self) -> usize {
        (self.history_s.saturating_mul(1000) / self.sample_ms.max(1)) as usize
    }
}

/// The control relay (`storm-relay`): how users on the compute nodes reach the MM, whose
/// control socket is a Unix socket on its own host. One `storm-relay --manager` beside the MM
/// listens on `address`; one `storm-relay --node NAME` on each node takes local users'
/// connections on `socket` and carries them there, proving which node it is with the
/// cluster key and its identity key (docs/security.md, "The control relay").
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RelaySection {
    /// Where the manager side listens; no relay when absent.
    pub address: Option<SocketAddr>,
    /// The node side's Unix socket, which jobs' tasks get as `STORM_SOCKET`; `{node}` stands
    /// for the node's name (for clusters whose nodes share one file system). A relative path
    /// is relative to the cluster file's directory.
    pub socket: PathBuf,
    /// Whether root on a node (and the MM's own user there) acts as an operator of the
    /// whole cluster through the relay. Off by default: root of one node is then an ordinary
    /// user of the cluster, and cannot drain nodes, cancel other users' jobs, or run jobs as
    /// root through the relay.
    pub root_from_nodes: bool,
    /// The lowest uid a relay may act for, root apart (root's rights through a relay are
    /// `root_from_nodes`'). Root of a compute node holds that node's keys and can name any
    /// user through its relay: system accounts below this (`daemon`, `mail`, `www-data`...),
    /// which own system files, are not reached that way. 1000 is Debian's first user.
    pub min_uid: u32,
}

impl Default for RelaySection {
    fn default() -> Self {
        Self {
            address: None,
            socket: PathBuf::from("/run/storm/relay.sock"),
            root_from_nodes: false,
            min_uid: 1000,
        }
    }
}

impl RelaySection {
    /// The node side's socket on node `name`.
    pub fn socket_of(&self, name: &str) -> PathBuf {
        crate::identity::key_path(Path::new(""), &self.socket, Some(name))
    }
}
