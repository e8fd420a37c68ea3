//! A replica of a replicated machine manager: the journal kept by a Raft group of MMs, and
//! the leader of the moment acting as the cluster's MM.
//!
//! Raft is raft-rs's ([`raft::RawNode`]); nothing here is a consensus protocol of our own. A
//! thread of the daemon's drives it ([`Replica::start`]):
//!
//! * its messages travel in mailboxes in the managers' own fabric ([`mailbox`]), over
//!   XFER-AND-SIGNAL like everything else the RM sends, on links that hold a key no compute
//!   node has;
//! * its log is on disk beside the journal ([`log`], in a file of its own format: [`wal`]);
//! * the log's entries are the journal's commits ([`entry`]): the leader's MM core commits
//!   once per timeslice as always, and the commit settles (its replies and launches go out)
//!   once a majority holds it and the leader has applied it. Every replica applies every
//!   committed entry to its own journal store, so a follower's journal is the leader's.
//!
//! A replica waits as a follower ([`Replica::wait_to_lead`]) until Raft makes it leader and
//! its journal holds everything committed; the daemon then starts the MM core over that
//! journal, as an MM restarted after a crash does, and the nodes follow it (they try every
//! replica's address). It leads until it is deposed or loses its lease ([`Replica::fenced`]):
//! a leader that has not heard from a majority for half the election timeout stops acting
//! before any other replica can have been elected. The daemon then drops that core and the
//! replica steps down ([`Replica::step_down`]): it stays in the group as a follower, and may
//! lead again, with a new core, in a later term. A leader that still hears the replicas but
//! not its nodes hands the group to the most up-to-date replica it hears
//! ([`Replica::hand_over`], Raft's leadership transfer) and stops its core the same way:
//! Raft alone would keep it leading, and it would mark every node DOWN.
//!
//! The group's members can change while it runs ([`member`], [`membership`]): an operator
//! removes a replica whose disk was lost, and a replica started on a new disk with `--join`
//! is admitted in its place under a new Raft id, first as a learner.
//!
//! Beyond Raft's crash model, the replicas compare a hash of their journals every window of
//! log entries ([`checksum`]); one whose journal differs from the majority's stops standing
//! for election and takes the leader's state ([`resync`]). The log drops what this replica's
//! journal holds durably ([`log`]); a replica that lacks dropped entries takes the leader's
//! state the same way.
//!
//! The replica's thread (`Host`) is spread by concern: this file starts it and runs its step;
//! `ready` handles raft-rs's Readies (send, persist, apply); `leading` is what only a leader
//! does (proposals, its lease, handing over, `storm managers`); `catch_up` counts the state
//! reports and takes or offers a state; `membership` admits, promotes and removes replicas.

mod catch_up;
pub mod checksum;
mod copies;
pub mod entry;
mod leading;
pub mod log;
pub mod mailbox;
pub mod member;
mod membership;
pub mod program;
mod ready;
pub mod resync;
pub mod wal;
pub mod writer;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{Receiver, Sender};
use parking_lot::Mutex;
use raft::eraftpb::{Entry, EntryType, MessageType};
use raft::{RawNode, StateRole};
use storm_cluster::ClusterConfig;
use storm_cluster::daemon_dir::DaemonDir;
use storm_primitives::{NodeId, Primitives, Wait};

use crate::journal::{Batch, JournalStore, ProgramStore, Restored, Settled};
use crate::waker::Waker;
use checksum::{Report, Windows};
use log::DurableLog;
use mailbox::{GroupLayout, Inbox, Outbox};
use member::Welcome;
use resync::{Offer, Standing, Why, Wire};

#[derive(Debug, thiserror::Error)]
pub enum ReplicaError {
    #[error("the replicated log {path}: {message}")]
    Log {
        path: std::path::PathBuf,
        message: String,
    },
    #[error("the managers' fabric: {0}")]
    Fabric(String),
    #[error("raft: {0}")]
    Raft(String),
}

/// Everything a replica decodes of a message from another's mailbox: the message when it
/// arrives, and what each entry of a Raft message brings when the entry is applied (the
/// `replica` fuzz target runs both). The error says what does not decode.
pub fn decode_peer_message(bytes: &[u8]) -> Result<(Wire, Vec<Applied>), String> {
    let wire = Wire::decode(bytes)?;
    let parts = match &wire {
        Wire::Raft(msg) => {
            for e in msg.entries.iter() {
                if let Some(Err(why)) = member::conf_change(e) {
                    return Err(format!("a group change in entry {}: {why}", e.index));
                }
            }
            msg.entries
                .iter()
                .filter_map(Applied::of)
                .collect::<Result<_, _>>()?
        }
        Wire::Want(_)
        | Wire::Part(_)
        | Wire::Join
        | Wire::Welcome(_)
        | Wire::WantCopy(_)
        | Wire::CopyPart(_) => Vec::new(),
    };
    Ok((wire, parts))
}

/// What a committed log entry brings a replica.
#[derive(Debug)]
pub enum Applied {
    /// A part of a journal commit.
    Part(entry::Part),
    /// A chunk of a job's program copy.
    Program(program::Chunk),
    /// A note of a program copy too large for the log, to fetch from the leader.
    FarProgram(program::Far),
    /// A replica's hash of its state ([`checksum`]).
    Checksum(Report),
}

impl Applied {
    /// What entry `e` holds, if anything (Raft's own entries hold nothing for the journal).
    fn of(e: &Entry) -> Option<Result<Self, String>> {
        if e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty() {
            return None;
        }
        Some(match e.context.as_ref() {
            program::CONTEXT => program::Chunk::decode(&e.data).map(Applied::Program),
            program::FAR_CONTEXT => program::Far::decode(&e.data).map(Applied::FarProgram),
            checksum::CONTEXT => Report::decode(&e.data).map(Applied::Checksum),
            entry::CONTEXT => entry::decode(&e.data).map(Applied::Part),
            [] | b"journal-14" | b"journal-15" | b"journal-16" => {
                Err(entry::OLDER_FORMAT.to_string())
            }
            other => Err(format!(
                "an entry marked {:?}, which this storm-mm does not know",
                String::from_utf8_lossy(other)
            )),
        })
    }
}

/// What the replica thread tells the daemon.
enum RoleEvent {
    /// This replica leads `term`, and its journal holds every committed entry.
    Leads { term: u64, restored: Restored },
    /// It no longer leads `term` (another replica won a later term); it follows the group.
    Deposed { term: u64, why: String },
    /// It cannot go on as a replica.
    Stopped(String),
}

/// What a replica shows of itself and, leading, of the others (`storm managers`).
#[derive(Debug, Clone, Default)]
pub struct ReplicaStatus {
    pub role: String,
    pub term: u64,
    pub leader: Option<usize>,
    pub applied: u64,
    pub committed: u64,
    /// Every replica as the leader sees it (empty unless leading).
    pub group: Vec<storm_cluster::control::ManagerInfo>,
}

/// State the replica thread and the daemon share.
struct Shared {
    /// Set to stop the thread.
    stop: AtomicBool,
    /// The leader's lease, in microseconds since `epoch`: it heard from a majority recently
    /// enough to act until then (0: not leading).
    lease_until_us: AtomicU64,
    /// How long a lease runs past the last word from a majority.
    lease: Duration,
    epoch: Instant,
    /// Wakes the MM's loop when a batch settles (set once the MM runs).
    waker: Mutex<Option<Waker>>,
    status: Mutex<ReplicaStatus>,
}

/// The daemon's handle on its replica thread.
pub struct Replica {
    /// Journal commits, each with the term of the core that made it.
    proposals: Sender<(u64, Batch)>,
    /// Asks the thread to hand leadership of a term to another replica.
    handovers: Sender<u64>,
    /// Tells the thread that the core leading a term stopped.
    step_downs: Sender<u64>,
    /// Asks the thread to remove a replica from the group (`storm managers remove`).
    removals: Sender<Removal>,
    election_timeout: Duration,
    settled: Receiver<Settled>,
    events: Receiver<RoleEvent>,
    shared: Arc<Shared>,
    fabric: Arc<dyn Primitives>,
    group: GroupLayout,
    thread: Option<JoinHandle<()>>,
}

/// A request to remove the replica named so from the group, and where to answer.
type Removal = (String, Sender<Result<String, String>>);

/// The generation of the Raft id a joining replica's placeholder node has until the leader
/// admits it (never given: generations are log indexes).
const PLACEHOLDER_GENERATION: u64 = (1 << 48) - 1;

/// raft-rs's node for replica `id` over `storage`, which applied entries up to `applied`.
fn raft_node(
    r: &storm_cluster::config::ReplicationSection,
    id: u64,
    applied: u64,
    storage: log::LogStorage,
) -> Result<RawNode<log::LogStorage>, ReplicaError> {
    let election_ticks = (r.election_timeout_ms / r.heartbeat_ms).max(4) as usize;
    let raft_cfg = raft::Config {
        applied,
        ..raft_config(id, election_ticks)
    };
    raft_cfg
        .validate()
        .map_err(|e| ReplicaError::Raft(e.to_string()))?;
    let logger = slog::Logger::root(TracingDrain, slog::o!());
    RawNode::new(&raft_cfg, storage, &logger).map_err(|e| ReplicaError::Raft(e.to_string()))
}

/// raft-rs's settings for replica `id` that every group of managers shares (the daemon's and
/// the simulator's): one tick per replica heartbeat, an election after `election_ticks`
/// silent ones, pre-vote and check-quorum, so that a replica cut off cannot depose a leader
/// and a leader cut off steps down.
///
/// A follower learns that entries are committed with the next entries or the next heartbeat,
/// not from a message of its own (`skip_bcast_commit`): only the leader acts on a commit, a
/// follower's journal may lag a heartbeat period, and each entry then costs the group two
/// messages per follower (the entries and the answer) instead of four.
pub fn raft_config(id: u64, election_ticks: usize) -> raft::Config {
    raft::Config {
        id,
        election_tick: election_ticks,
        heartbeat_tick: 1,
        max_size_per_msg: PART_BYTES as u64,
        max_inflight_msgs: 256,
        check_quorum: true,
        pre_vote: true,
        skip_bcast_commit: true,
        ..Default::default()
    }
}

/// Largest journal part proposed as one entry; a larger record goes alone.
pub const PART_BYTES: usize = 256 * 1024;

impl Replica {
    /// Starts replica `index` of `cfg`'s group (the daemon's config seen as that replica):
    /// opens its log in the state directory and its endpoint in the managers' fabric, and
    /// starts its thread as a follower. `store` is the journal's store, which the thread
    /// writes from now on; `programs`, where program copies are. With `join`, a replica
    /// whose state directory is new asks the group to admit it ([`member`]) instead of
    /// starting the group the cluster file names.
    pub fn start(
        cfg: &ClusterConfig,
        index: usize,
        store: Box<dyn JournalStore>,
        programs: Option<ProgramStore>,
        join: bool,
    ) -> anyhow::Result<Self> {
        let replicas = cfg.managers.len();
        // A mailbox slot takes the largest request a client may send, and then some.
        let max_message = (cfg.limits.max_request_bytes as usize * 2).max(4 * PART_BYTES);
        let group = GroupLayout::new(replicas, max_message);
        let key = cfg.load_group_key()?;
        let fabric = storm_cluster::endpoint::start_group(cfg, index, group.layout.clone(), key)
            .map_err(ReplicaError::Fabric)?;
        let dir = DaemonDir::open_or_create(&cfg.cluster.state_dir, 0o700)?;
        let voters: Vec<u64> = (0..replicas).map(|p| member::raft_id(p, 0)).collect();
        let mut log = DurableLog::open(&dir, voters, join)?;
        // Its Raft id: the one the leader gave it when it joined, none yet if it waits to be
        // admitted, or else the first generation's.
        let id = match log.identity() {
            Some(id) if member::position_of(id) != Some(index) => anyhow::bail!(
                "this state directory holds the Raft log of the replica at another place in \
                 the group (Raft id {id}), not of {}",
                cfg.managers[index].name
            ),
            Some(id) => Some(id),
            None if log.has_no_group() => None,
            None => Some(member::raft_id(index, 0)),
        };
        log.set_sync(!cfg.replication.unsafe_no_log_sync);
        if cfg.replication.unsafe_no_log_sync {
            tracing::error!(
                "[replication] unsafe_no_log_sync = true: this replica does not sync its Raft \
                 log; killed, it loses the entries and votes of up to its last second. For \
                 measuring only"
            );
        }
        // Raft gives again every committed entry after the last one the journal holds
        // durably (it may have lost later ones in a crash: they are written without a sync).
        let mut store = store;
        let mut applied = store.applied()?.min(log.committed());
        // A journal that wants another's state (it lacked entries the leader dropped, or
        // holds less than the log dropped: it was lost) starts where the log does, and takes
        // the leader's state before it stands for election.
        let behind = (log.wants_state().is_some() || applied < log.compacted()).then(|| {
            applied = applied.max(log.compacted());
            log.compacted()
        });
        log.applied_to(applied);
        if let Some(from) = behind {
            tracing::warn!(
                from,
                "this replica's journal wants the leader's state (as of log entry {from})"
            );
        }
        let r = &cfg.replication;
        // A replica waiting to be admitted has a node that is never stepped until it is.
        let node = raft_node(
            r,
            id.unwrap_or(member::raft_id(index, PLACEHOLDER_GENERATION)),
            applied,
            log.storage(),
        )?;
        if id.is_none() {
            tracing::warn!(
                "this replica has no place in the manager group yet (--join, a new state \
                 directory): it asks the leader to admit it"
            );
        }
        let shared = Arc::new(Shared {
            stop: AtomicBool::new(false),
            lease_until_us: AtomicU64::new(0),
            lease: Duration::from_millis(r.election_timeout_ms / 2),
            epoch: Instant::now(),
            waker: Mutex::new(None),
            status: Mutex::new(ReplicaStatus::default()),
        });
        let (proposals, proposed) = crossbeam_channel::unbounded();
        let (settle, settled) = crossbeam_channel::unbounded();
        let (tell, events) = crossbeam_channel::unbounded();
        let (handovers, handover) = crossbeam_channel::unbounded();
        let (step_downs, step_down) = crossbeam_channel::unbounded();
        let (removals, removal) = crossbeam_channel::unbounded();
        {
            // The log's writer thread wakes this replica's thread once a write is done.
            let (fabric, arrived) = (fabric.clone(), group.arrived);
            log.set_wake(Box::new(move || {
                let _ = fabric.wake_local(arrived);
            }));
        }
        let host = Host {
            node,
            id,
            replication: r.clone(),
            removal,
            asked_to_join: None,
            refusal: String::new(),
            not_members: BTreeSet::new(),
            log,
            unpersisted: std::collections::VecDeque::new(),
            store,
            programs,
            fabric: fabric.clone(),
            group: group.clone(),
            inbox: Inbox::new(index as NodeId, replicas),
            outbox: Outbox::new(
                index as NodeId,
                replicas,
                Duration::from_millis(r.election_timeout_ms),
            ),
            me: index,
            names: cfg.managers.iter().map(|m| m.name.clone()).collect(),
            election_timeout: Duration::from_millis(r.election_timeout_ms),
            replicas,
            tick: Duration::from_millis(r.heartbeat_ms),
            lease: Duration::from_millis(r.election_timeout_ms / 2),
            heard: vec![None; replicas],
            arrived_after: Instant::now(),
            proposed,
            handover,
            step_down,
            settle,
            tell,
            shared: shared.clone(),
            leading: None,
            unneeded: BTreeMap::new(),
            proposed_at: BTreeMap::new(),
            shipped: Default::default(),
            receiving: Default::default(),
            fetching: Default::default(),
            applied,
            checkpointed: (applied, Instant::now()),
            checksum_every: r.checksum_every,
            windows: Windows::new(replicas),
            reports: Vec::new(),
            standing: match behind {
                Some(from) => Standing::taking(Why::Behind, from),
                None => Standing::InStep { resynced_at: 0 },
            },
            snapshots_sent: Vec::new(),
            entries_kept: r.log_entries_kept,
            peers_diverged: BTreeSet::new(),
            offer: None,
            offers_made: 0,
            slowest: ("", Duration::ZERO),
        };
        let thread = std::thread::Builder::new()
            .name("replica".into())
            .spawn(move || host.run())?;
        tracing::info!(
            replica = index,
            replicas,
            "started as a follower of the manager group"
        );
        Ok(Self {
            proposals,
            handovers,
            step_downs,
            removals,
            election_timeout: Duration::from_millis(r.election_timeout_ms),
            settled,
            events,
            shared,
            fabric,
            group,
            thread: Some(thread),
        })
    }

    /// Waits until this replica leads with every committed entry in its journal, and returns
    /// its term and what the journal holds; `None` if `stop` was set first, `Err` if the
    /// replica failed.
    pub fn wait_to_lead(&self, stop: &AtomicBool) -> anyhow::Result<Option<(u64, Restored)>> {
        loop {
            if stop.load(Ordering::Acquire) {
                return Ok(None);
            }
            match self.events.recv_timeout(Duration::from_millis(50)) {
                Ok(RoleEvent::Leads { term, restored }) => {
                    // What settled for an earlier term's core is no news to this one's.
                    let _ = self.settled.try_iter().count();
                    return Ok(Some((term, restored)));
                }
                // A core that stopped already (it learned of it another way).
                Ok(RoleEvent::Deposed { term, why }) => {
                    tracing::debug!(term, "{why} (its core had stopped already)");
                }
                Ok(RoleEvent::Stopped(why)) => anyhow::bail!("{why}"),
                Err(crossbeam_channel::RecvTimeoutError::Timeout) => {}
                Err(crossbeam_channel::RecvTimeoutError::Disconnected) => {
                    anyhow::bail!("the replica's thread ended")
                }
            }
        }
    }

    /// Wakes `waker` whenever a batch settles.
    pub fn set_waker(&self, waker: Waker) {
        *self.shared.waker.lock() = Some(waker);
    }

    /// Why this replica must stop acting as the cluster's MM, if it must: it was deposed, or
    /// its lease ran out (it has not heard from a majority for half an election timeout).
    pub fn fenced(&self) -> Option<String> {
        match self.events.try_recv() {
            Ok(RoleEvent::Deposed { why, .. } | RoleEvent::Stopped(why)) => return Some(why),
            Ok(RoleEvent::Leads { .. }) | Err(_) => {}
        }
        let until = self.shared.lease_until_us.load(Ordering::Acquire);
        let now = self.shared.epoch.elapsed().as_micros() as u64;
        (now > until).then(|| {
            if until == 0 {
                return "lost its lease".to_string();
            }
            let silence = Duration::from_micros(now - until) + self.shared.lease;
            format!(
                "lost its lease: no word from a majority of the managers for {} ms (the \
                 lease is {} ms, half the election timeout)",
                silence.as_millis(),
                self.shared.lease.as_millis()
            )
        })
    }

    /// Asks the group to elect another replica in this one's place, because this leader
    /// cannot act (`why`: cut off from its nodes, say), and waits, at most two election
    /// timeouts, until another leads. Raft's leadership transfer goes to the most up-to-date
    /// replica this one hears; journal commits not yet settled are dropped, as in a crash
    /// (their clients had no answer). What happened, to say as the daemon stops; if no replica
    /// took over in time, this one stops all the same, and the group elects another once its
    /// election timeout passes.
    pub fn hand_over(&self, term: u64, why: &str) -> String {
        tracing::warn!("{why}: handing the manager group over");
        let _ = self.handovers.send(term);
        let _ = self.fabric.wake_local(self.group.arrived);
        let deadline = Instant::now() + self.election_timeout * 2;
        loop {
            match self.events.recv_deadline(deadline) {
                Ok(RoleEvent::Deposed { why: how, .. } | RoleEvent::Stopped(how)) => {
                    return format!("{why}; {how}");
                }
                Ok(RoleEvent::Leads { .. }) => {}
                Err(_) => {
                    return format!(
                        "{why}; no replica took over within {} ms, so the group elects one \
                         once this replica stops leading",
                        (self.election_timeout * 2).as_millis()
                    );
                }
            }
        }
    }

    /// Hands a journal commit of the core leading `term` to the group (one of a core that no
    /// longer leads is dropped, as in a crash: its clients had no answer).
    pub fn send(&self, term: u64, batch: Batch) {
        let _ = self.proposals.send((term, batch));
        let _ = self.fabric.wake_local(self.group.arrived);
    }

    /// The core that led `term` stopped (deposed, its lease lost, or it handed the group
    /// over): this replica stops leading, if it still does, and follows the group until it
    /// is elected again ([`Replica::wait_to_lead`]).
    pub fn step_down(&self, term: u64) {
        // The stopped core's waker holds its endpoint, which the next core binds again.
        self.shared.waker.lock().take();
        let _ = self.step_downs.send(term);
        let _ = self.fabric.wake_local(self.group.arrived);
    }

    /// Removes replica `name` from the group (a Raft configuration change, which this
    /// replica proposes as leader): what the operator should know, or why not.
    pub fn remove(&self, name: &str) -> Result<String, String> {
        let (answer, answered) = crossbeam_channel::bounded(1);
        self.removals
            .send((name.to_string(), answer))
            .map_err(|_| "this replica stopped".to_string())?;
        let _ = self.fabric.wake_local(self.group.arrived);
        answered
            .recv_timeout(self.election_timeout.max(Duration::from_secs(1)))
            .map_err(|_| "this replica did not answer in time: ask again".to_string())?
    }

    /// The commits settled since the last call, oldest first.
    pub fn settled(&self) -> Vec<Settled> {
        self.settled.try_iter().collect()
    }

    pub fn status(&self) -> ReplicaStatus {
        self.shared.status.lock().clone()
    }

    /// Every replica of the group, as this one (leading) sees it.
    pub fn managers(&self) -> Vec<storm_cluster::control::ManagerInfo> {
        self.shared.status.lock().group.clone()
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Release);
        let _ = self.fabric.wake_local(self.group.arrived);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// The replica's thread: raft-rs's node and everything it needs done.
struct Host {
    node: RawNode<log::LogStorage>,
    /// This replica's Raft id (`None`: it waits for the leader to admit it, and `node` is a
    /// placeholder).
    id: Option<u64>,
    replication: storm_cluster::config::ReplicationSection,
    /// Requests to remove a replica from the group.
    removal: Receiver<Removal>,
    /// When this replica, waiting to be admitted, last asked to join.
    asked_to_join: Option<Instant>,
    /// The last reason the leader gave for not admitting it (logged once each).
    refusal: String,
    /// Raft ids heard from that are not members (logged once each).
    not_members: BTreeSet<u64>,
    log: DurableLog,
    store: Box<dyn JournalStore>,
    programs: Option<ProgramStore>,
    fabric: Arc<dyn Primitives>,
    group: GroupLayout,
    inbox: Inbox,
    outbox: Outbox,
    me: usize,
    names: Vec<String>,
    election_timeout: Duration,
    replicas: usize,
    tick: Duration,
    lease: Duration,
    /// When each other replica was last heard from: no later than its message arrived (see
    /// `arrived_after`), which is what the lease may count on.
    heard: Vec<Option<Instant>>,
    /// When the previous step began to take the inbox: every message the current step takes
    /// arrived after it. A message is credited as heard at this instant, not at the time it
    /// is read, since a step that held the thread (a slow disk sync) may read a message long
    /// after it came, and a lease counted from the reading would outlast the follower's
    /// promise not to vote (which runs from when it sent the message).
    arrived_after: Instant,
    proposed: Receiver<(u64, Batch)>,
    /// Requests to hand leadership of a term over ([`Replica::hand_over`]).
    handover: Receiver<u64>,
    /// Cores that stopped leading a term ([`Replica::step_down`]).
    step_down: Receiver<u64>,
    settle: Sender<Settled>,
    tell: Sender<RoleEvent>,
    shared: Arc<Shared>,
    /// Readies whose records the log's writer thread has not written yet, in order: each
    /// with its number, the write that makes it durable ([`DurableLog::append_queued`]), and
    /// the messages that may go only once it is.
    unpersisted: std::collections::VecDeque<(u64, u64, Vec<raft::eraftpb::Message>)>,
    /// The term this replica leads, once it said so.
    leading: Option<u64>,
    /// Program copies to delete once their batch settles.
    unneeded: BTreeMap<u64, Vec<storm_cluster::messages::JobId>>,
    /// When each batch not yet settled was proposed: its commit time, as the metrics give it,
    /// runs from there to the settle (a majority's syncs and the hops between).
    proposed_at: BTreeMap<u64, Instant>,
    /// The jobs whose program copies this leader proposed (or found too large to).
    shipped: std::collections::HashSet<storm_cluster::messages::JobId>,
    /// Program copies arriving through the log, or fetched beside it.
    receiving: program::Receiving,
    /// Program copies too large for the log, being fetched.
    fetching: copies::Fetches,
    /// The last log entry written to the journal, and the last one written durably, when.
    applied: u64,
    checkpointed: (u64, Instant),
    /// Entries in a window of [`checksum`] (0: the replicas do not compare their states).
    checksum_every: u64,
    /// The reports of the replicas' hashes applied so far.
    windows: Windows,
    /// This replica's reports, to propose.
    reports: Vec<Vec<u8>>,
    /// Whether this replica's state agrees with the group's, or it is taking another's.
    standing: Standing,
    /// The replicas this leader sent a Raft snapshot (a position only) since the last Ready.
    snapshots_sent: Vec<u64>,
    /// See `[replication] log_entries_kept`.
    entries_kept: u64,
    /// The other replicas the reports found diverged, until they agree again.
    peers_diverged: BTreeSet<u32>,
    /// The state this replica sends a diverged one.
    offer: Option<Offer>,
    offers_made: u64,
    /// The slowest part of the current step, and how long it took (see [`Host::timed`]).
    slowest: (&'static str, Duration),
}

/// How long a replica keeps the state it sends a diverged one once no part of it is asked for.
const OFFER_KEPT: Duration = Duration::from_secs(60);

/// How often a replica makes what it applied to its journal durable (applying does not sync:
/// the log on a majority of disks holds every committed entry; a replica that crashes applies
/// again what its journal lost since).
const CHECKPOINT: Duration = Duration::from_secs(1);

impl Host {
    fn run(mut self) {
        if self.id.is_some() && !self.standing.is_taking() {
            match self.store.read() {
                Ok(state) => self.fetch_missing_copies(&state),
                Err(e) => tracing::error!("reading the journal for missing program copies: {e}"),
            }
        }
        let mut next_tick = Instant::now() + self.tick;
        while !self.shared.stop.load(Ordering::Acquire) {
            let now = Instant::now();
            if now < next_tick {
                let _ = self
                    .fabric
                    .test_event(self.group.arrived, Wait::Timeout(next_tick - now));
            }
            let started = Instant::now();
            self.slowest = ("", Duration::ZERO);
            let stepped = self.step(&mut next_tick);
            self.warn_if_slow(started.elapsed());
            if let Err(e) = stepped {
                tracing::error!("the replica stops: {e}");
                let _ = self.tell.send(RoleEvent::Stopped(e.to_string()));
                self.shared.lease_until_us.store(0, Ordering::Release);
                return;
            }
        }
        if let Err(e) = self.checkpoint() {
            tracing::error!("cannot make the journal durable on stopping: {e}");
        }
    }

    /// Notes how long a part of the step took, since `started`.
    fn timed(&mut self, what: &'static str, started: Instant) {
        let took = started.elapsed();
        if took > self.slowest.1 {
            self.slowest = (what, took);
        }
    }

    /// A step that held the thread for half a lease or more is worth an operator's look: a
    /// leader's thread that is held a whole lease loses it (its core sees no word from the
    /// group meanwhile), and a follower's delays its acknowledgements.
    fn warn_if_slow(&self, took: Duration) {
        if took >= self.lease / 2 {
            let (what, part) = self.slowest;
            tracing::warn!(
                took_ms = took.as_millis() as u64,
                lease_ms = self.lease.as_millis() as u64,
                slowest = what,
                slowest_ms = part.as_millis() as u64,
                "the replica's thread was held for {} ms in one step (the longest part: {what}, \
                 {} ms); a leader loses its lease after {} ms without word from the group",
                took.as_millis(),
                part.as_millis(),
                self.lease.as_millis()
            );
        }
    }

    /// Makes the journal durable up to the last entry applied, and records it in the log.
    fn checkpoint(&mut self) -> Result<(), ReplicaError> {
        if self.applied > self.checkpointed.0 {
            let started = Instant::now();
            self.store
                .write_applied(&[], None, self.applied, true)
                .map_err(|e| ReplicaError::Raft(format!("syncing the journal: {e}")))?;
            self.timed("syncing the journal", started);
            let started = Instant::now();
            self.log.set_applied(self.applied)?;
            self.timed("recording the applied index", started);
        }
        self.checkpointed = (self.applied, Instant::now());
        // What the journal holds durably may leave the log, but for the newest entries (a
        // journal that wants a state holds nothing the log may drop).
        if self.entries_kept > 0
            && !self.standing.is_taking()
            && self.log.held() > 2 * self.entries_kept
        {
            let upto = self.applied.saturating_sub(self.entries_kept);
            if upto > self.log.compacted() {
                let started = Instant::now();
                self.log.compact(upto)?;
                self.timed("compacting the Raft log", started);
                tracing::debug!(upto, "dropped the log entries the journal holds");
            }
        }
        Ok(())
    }

    fn step(&mut self, next_tick: &mut Instant) -> Result<(), ReplicaError> {
        let Some(me) = self.id else {
            return self.join_step();
        };
        for (name, answer) in self.removal.try_iter().collect::<Vec<_>>() {
            let _ = answer.send(self.remove(&name));
        }
        for term in self.step_down.try_iter().collect::<Vec<_>>() {
            self.step_down(term);
        }
        if self
            .handover
            .try_iter()
            .any(|term| Some(term) == self.leading)
        {
            self.transfer_leadership();
        }
        for (term, batch) in self.proposed.try_iter().collect::<Vec<_>>() {
            self.propose(term, batch)?;
        }
        let arrived_after = std::mem::replace(&mut self.arrived_after, Instant::now());
        for (from, bytes) in self.inbox.take(&*self.fabric, &self.group) {
            // Entries' journal parts are decoded when applied, not here.
            let msg = match Wire::decode(&bytes) {
                Ok(Wire::Raft(msg)) => msg,
                Ok(Wire::Want(want)) => {
                    self.heard[from as usize] = Some(arrived_after);
                    self.offer_state(from as usize, want)?;
                    continue;
                }
                Ok(Wire::Part(part)) => {
                    self.heard[from as usize] = Some(arrived_after);
                    self.take_state(from as usize, part);
                    continue;
                }
                Ok(Wire::Join) => {
                    self.admit(from as usize);
                    continue;
                }
                Ok(Wire::Welcome(Welcome::Refused { id, why })) if id == me => {
                    return Err(ReplicaError::Raft(why));
                }
                Ok(Wire::Welcome(_)) => continue,
                Ok(Wire::WantCopy(want)) => {
                    self.offer_copy(from as usize, want);
                    continue;
                }
                Ok(Wire::CopyPart(chunk)) => {
                    self.take_copy_part(from as usize, chunk);
                    continue;
                }
                Err(why) => {
                    tracing::warn!(from, "dropping a replica message: {why}");
                    continue;
                }
            };
            // Each replica speaks only for itself (its link proves which it is).
            if member::position_of(msg.from) != Some(from as usize) {
                tracing::warn!(from, "dropping a replica message with the wrong ends");
                continue;
            }
            if msg.to != me {
                // Sent to the Raft id this replica's place had before it joined anew.
                tracing::debug!(from, to = msg.to, "dropping a message to another Raft id");
                continue;
            }
            if !member::is_member(self.log.conf(), msg.from) {
                self.not_a_member(from as usize, msg.from);
                continue;
            }
            self.heard[from as usize] = Some(arrived_after);
            let last = self.node.raft.raft_log.last_index();
            if msg.get_msg_type() == MessageType::MsgHeartbeat && msg.commit > last {
                // The leader commits only what this replica acknowledged having on disk.
                let name = &self.names[self.me];
                return Err(ReplicaError::Raft(format!(
                    "this replica's Raft log ends at entry {last}, but it acknowledged entries \
                     up to {} to the leader: its state directory was lost or replaced. It \
                     cannot rejoin under its old Raft id ({me}); replace it: `storm managers \
                     remove {name}`, then start it on an empty state directory with \
                     `storm-mm --manager {name} --join` (docs/operations.md)",
                    msg.commit
                )));
            }
            if self.standing.is_taking() && msg.get_msg_type() == MessageType::MsgTimeoutNow {
                tracing::warn!("asked to lead, but this replica's state diverged: it does not");
                continue;
            }
            let _ = self.node.step(msg);
        }
        let now = Instant::now();
        if now >= *next_tick {
            self.tick();
            *next_tick = (*next_tick + self.tick).max(now);
        }
        // A Ready whose writes are done at once (it had nothing to write) makes raft-rs ready
        // again; a few rounds here spare it the wait for the next tick.
        for _ in 0..4 {
            self.persisted()?;
            if !self.node.has_ready() {
                break;
            }
            self.handle_ready()?;
        }
        self.persisted()?;
        for to in std::mem::take(&mut self.snapshots_sent) {
            // The snapshot is a position only: the state goes by `resync`, asked for by the
            // receiver. If the message was lost, the next probe finds the replica behind still.
            self.node.report_snapshot(to, raft::SnapshotStatus::Finish);
        }
        self.propose_reports();
        self.fetch_copies();
        self.resync()?;
        if self
            .offer
            .as_ref()
            .is_some_and(|o| o.asked.elapsed() > OFFER_KEPT)
        {
            self.offer = None;
        }
        self.roles()?;
        self.promote_learners();
        self.publish_status();
        if self.checkpointed.1.elapsed() >= CHECKPOINT {
            self.checkpoint()?;
        }
        Ok(())
    }

    /// Raft's tick, except that a follower whose state diverged never stands for election
    /// (its election clock still runs, so that it votes as any follower does).
    fn tick(&mut self) {
        let raft = &mut self.node.raft;
        if self.standing.is_taking() && raft.state != StateRole::Leader {
            raft.election_elapsed += 1;
        } else {
            self.node.tick();
        }
    }
}

/// raft-rs logs through slog: its records go to `tracing`, at debug level and below (its
/// elections and term changes are logged here, by the replica, where they matter).
struct TracingDrain;

impl slog::Drain for TracingDrain {
    type Ok = ();
    type Err = slog::Never;

    fn log(&self, record: &slog::Record, _: &slog::OwnedKVList) -> Result<(), slog::Never> {
        match record.level() {
            slog::Level::Critical | slog::Level::Error => {
                tracing::error!(target: "raft", "{}", record.msg())
            }
            slog::Level::Warning => tracing::warn!(target: "raft", "{}", record.msg()),
            slog::Level::Info => tracing::debug!(target: "raft", "{}", record.msg()),
            _ => tracing::trace!(target: "raft", "{}", record.msg()),
        }
        Ok(())
    }
}
