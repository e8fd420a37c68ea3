//! The MM's journal: what a restarted MM needs so that no accepted job is lost.
//!
//! It lives in `state_dir` (cluster file): `journal.redb`, a redb database (an embedded,
//! transactional, crash-safe store), and `programs/`, the programs of jobs that wait in the
//! queue (the MM holds a job's program as the descriptor storm-submit passed; a restarted MM
//! needs a copy).
//!
//! It records every job from acceptance to its end (queued, started on some nodes, finished
//! with its outcome), the next job id, and the operator's drains. Changes are staged during a
//! timeslice and committed together, once, before the MM answers anyone (see
//! `MachineManager::tick`): a client never sees a state the journal has not recorded.
//! The daemon's journal hands its commits over ([`Journal::hand_off`]) to a thread of the
//! host's (`crate::committer`), so that the MM's timeslices do not wait for the disk; the
//! replies wait for their batch instead.
//!
//! Finished jobs are kept, for `storm history` and for a storm-submit that reattaches after
//! the MM restarted, until the MM removes them ([`Journal::remove_job`], by the cluster
//! file's `[history]`).

use std::collections::{BTreeMap, BTreeSet};
use std::fs::File;
use std::io::Write;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use storm_cluster::control::{JobOutcome, JobRequest};
use storm_cluster::daemon_dir::DaemonDir;
use storm_cluster::messages::JobId;
use storm_primitives::{NodeId, NodeSet};

use crate::nodes::NmProcess;

mod migrate;

/// Bumped when a record changes shape; a journal of another format is refused, not misread.
/// Format 2: a job's task request carries `overcommit`. Format 3: a started job records its
/// job slot, time slot and launch time (a restarted MM re-adopts running jobs). Format 4: a
/// request carries its `mpi` mode and an outcome its `abort_code`. Format 5: an outcome's
/// timing has the launch, start, run and report phases. Format 6: a request carries
/// `exclusive`, and a started job that shares its node the CPUs it holds there. Format 7: an
/// outcome carries what the job's processes used (CPU time, peak memory), and a started job
/// the hash of the program sent to its nodes. Format 8: a request carries its `dependency`,
/// `batch`, `step_of`, `array` and `element`. Format 9: an outcome carries its `cause`.
/// Format 10: a request's arguments, environment and paths are bytes (UTF-8 or not). Format
/// 11: a request carries its program's `delivery`, and an outcome whether it was `broadcast`
/// (a started job whose program ran in place records no program hash). Format 12: a
/// dependency's jobs are ids or array elements (`JobRef`). Format 13: a request carries its
/// submission `token`. Format 14: a started job carries `launched_to`, the NM process its
/// launch went to on each node. Format 15: a request carries its `mem` and `constraint` (a
/// journal of format 13 or 14 is rewritten in format 15 when opened, see [`migrate`]).
/// Format 16: a request carries where it may run (`flock`), and a job may be `Flocked` to a
/// peer cluster (a journal of format 13, 14 or 15 is rewritten in format 16 when opened).
/// Format 17: a request carries whether it may run on borrowed nodes (`borrow`), and a node
/// whether it is lent to a peer cluster (`lent`). Format 18: a request carries `less` and
/// `one_cluster`, and a lease whether the peer `asked` for it (a journal of format 13 to 17
/// is rewritten in format 18 when opened). Format 19: a lease carries whether its node is
/// called home (`recall`; a journal of format 13 to 18 is rewritten in format 19 when
/// opened). Format 20: a request carries `kill_on_bad_exit`, `exit_wait_s` and `cpu_bind` (a
/// journal of format 13 to 19 is rewritten in format 20 when opened).
pub(crate) const FORMAT: u64 = 20;

const JOBS: TableDefinition<u64, &[u8]> = TableDefinition::new("jobs");
const NODES: TableDefinition<u32, &[u8]> = TableDefinition::new("nodes");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");

#[derive(Debug, thiserror::Error)]
pub enum JournalError {
    #[error("journal {path}: {message}")]
    Store { path: PathBuf, message: String },
    #[error(
        "journal {path}: record {record} is unreadable ({message}); move the file away to start with an empty journal"
    )]
    Corrupt {
        path: PathBuf,
        record: String,
        message: String,
    },
    #[error("program of job {job} in {path}: {source}")]
    Program {
        job: JobId,
        path: PathBuf,
        source: std::io::Error,
    },
    /// The user's program is not the size checked at submission any more.
    #[error(
        "the program of job {job} changed after it was submitted: {checked} bytes were checked \
         against the limits, it has {now} now; submit it again once it is complete"
    )]
    ProgramChanged { job: JobId, checked: u64, now: u64 },
}

/// A job as the journal knows it.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct JobRecord {
    pub id: JobId,
    pub uid: u32,
    pub gid: u32,
    pub req: JobRequest,
    /// Milliseconds since the Unix epoch.
    pub submitted_ms: u64,
    pub state: JobState,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum JobState {
    /// Waiting for nodes; its program (with bcast) is saved in `programs/`.
    Queued,
    /// Given nodes: its program is being sent, or it runs.
    Started {
        nodes: NodeSet,
        /// The CPUs it holds of its one node, when it shares the node with other jobs.
        cpus: Option<NodeSet>,
        /// Its per-job areas of global memory (termination flags, reports).
        slot: u32,
        /// Its row of the gang scheduler's matrix (0 for the other policies).
        time_slot: u32,
        /// When its launch command went out (milliseconds since the Unix epoch); `None` while
        /// its program is sent or its launch waits for a heartbeat (no task can have started).
        launched_ms: Option<u64>,
        /// The NM process its launch went to on each node: after a restart of the MM, that
        /// process alone, registering without the job, never got the launch.
        launched_to: Vec<(NodeId, NmProcess)>,
        /// The BLAKE3 hash of the program sent to its nodes (its launch, sent again after a
        /// restart, carries it).
        program_hash: Option<[u8; 32]>,
    },
    /// Ended, with what its submitter was told.
    Finished {
        nodes: NodeSet,
        outcome: JobOutcome,
        /// Milliseconds since the Unix epoch.
        ended_ms: u64,
    },
    /// Sent to peer cluster `peer`, which runs it (docs/federation.md); queued at home again
    /// if that peer goes away.
    Flocked {
        peer: String,
        /// When it was sent (milliseconds since the Unix epoch): each sending is a
        /// submission of its own on the peer.
        since_ms: u64,
    },
}

impl JobRecord {
    /// Whether an MM that takes over from this record (restarted, or the next leader of a
    /// group) needs the job's program copy: it may have to run the job from its beginning,
    /// because the job waits (here, or on a peer that may give it back), because its launch
    /// had not gone out, or because it may be requeued. A program that runs in place has no
    /// copy.
    pub fn needs_program_copy(&self) -> bool {
        self.req.delivery.carries_program()
            && match &self.state {
                JobState::Queued
                | JobState::Flocked { .. }
                | JobState::Started {
                    launched_ms: None, ..
                } => true,
                JobState::Started { .. } => self.req.requeue,
                JobState::Finished { .. } => false,
            }
    }
}

/// Per-node state that outlives an MM restart.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NodeRecord {
    /// The operator drained the node, for this reason.
    pub drain: Option<String>,
    /// The node is lent to a peer cluster (docs/federation.md): no job of this cluster goes
    /// there until it comes back.
    pub lent: Option<storm_cluster::federation::Lease>,
}

/// What the journal held when opened (and a replica's whole state, as another replica sends it
/// to one that diverged: `crate::replica::resync`).
#[derive(Debug, Default, Clone, PartialEq, Serialize, Deserialize)]
pub struct Restored {
    pub next_job: JobId,
    /// By id: submission order.
    pub jobs: Vec<JobRecord>,
    pub nodes: BTreeMap<NodeId, NodeRecord>,
}

/// One staged change (whole records: applying the same change twice changes nothing more).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub enum Change {
    Job(Box<JobRecord>),
    Node(NodeId, NodeRecord),
    RemoveJob(JobId),
}

/// Where committed records live: [`RedbStore`] on disk for the daemon, [`MemoryStore`] for the
/// simulator and tests. [`Journal`] stages changes and hands each commit to the store whole.
pub trait JournalStore: Send {
    /// What the store holds (creating it on first use).
    fn read(&mut self) -> Result<Restored, JournalError>;
    /// Applies `changes` and the next job id, all or nothing.
    fn write(&mut self, changes: &[Change], next_job: Option<JobId>) -> Result<(), JournalError>;
    /// Applies `changes` as [`JournalStore::write`] does and records, with them, that the
    /// store holds a replicated log up to entry `applied` (a replica of a manager group). Not
    /// durable unless `durable`: the log holds the changes, and a replica that restarts
    /// applies again what the store lost, from [`JournalStore::applied`] on.
    fn write_applied(
        &mut self,
        changes: &[Change],
        next_job: Option<JobId>,
        _applied: u64,
        _durable: bool,
    ) -> Result<(), JournalError> {
        self.write(changes, next_job)
    }
    /// The replicated log's last entry the store holds durably (0: none).
    fn applied(&mut self) -> Result<u64, JournalError> {
        Ok(0)
    }
    /// Replaces everything the store holds with `state`, durably, as of the replicated log's
    /// entry `applied` (a replica whose state diverged takes another's).
    fn replace(&mut self, state: &Restored, applied: u64) -> Result<(), JournalError>;
}

/// The journal as a redb database: `journal.redb` in the state directory.
pub struct RedbStore {
    db: Database,
    path: PathBuf,
}

impl RedbStore {
    /// Opens (or creates) `name` in `dir`, readable by the MM's user only; `path` names it
    /// in messages.
    pub fn open_at(dir: &DaemonDir, name: &str, path: PathBuf) -> Result<Self, JournalError> {
        let store = |message: String| JournalError::Store {
            path: path.clone(),
            message,
        };
        // Created 0600 before redb opens it, so it is never readable by others.
        if !dir.contains(name) {
            dir.create_file(name)
                .map_err(|e| store(format!("cannot create it: {e}")))?;
        }
        let db = Database::create(dir.via_descriptor(name)).map_err(|e| store(e.to_string()))?;
        Ok(Self { db, path })
    }

    fn store_error(&self, e: impl std::fmt::Display) -> JournalError {
        JournalError::Store {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    fn decode<T: DeserializeOwned>(&self, record: &str, bytes: &[u8]) -> Result<T, JournalError> {
        decode_record(&self.path, record, bytes)
    }
}

impl JournalStore for RedbStore {
    fn read(&mut self) -> Result<Restored, JournalError> {
        // Create the tables (and stamp the format) on first use.
        let w = self.db.begin_write().map_err(|e| self.store_error(e))?;
        {
            let mut meta = w.open_table(META).map_err(|e| self.store_error(e))?;
            let format = meta
                .get("format")
                .map_err(|e| self.store_error(e))?
                .map(|v| v.value());
            match format {
                None => {
                    meta.insert("format", FORMAT)
                        .map_err(|e| self.store_error(e))?;
                }
                Some(FORMAT) => {}
                Some(from) if migrate::READS.contains(&from) => {
                    let mut jobs = w.open_table(JOBS).map_err(|e| self.store_error(e))?;
                    let mut old = Vec::new();
                    for entry in jobs.iter().map_err(|e| self.store_error(e))? {
                        let (k, v) = entry.map_err(|e| self.store_error(e))?;
                        let id = k.value();
                        let rec = migrate::job_from(from, v.value()).map_err(|message| {
                            JournalError::Corrupt {
                                path: self.path.clone(),
                                record: format!("job {id} (format {from})"),
                                message,
                            }
                        })?;
                        old.push(rec);
                    }
                    for rec in &old {
                        let bytes = encode(rec).map_err(|e| self.store_error(e))?;
                        jobs.insert(rec.id, bytes.as_slice())
                            .map_err(|e| self.store_error(e))?;
                    }
                    let mut nodes = w.open_table(NODES).map_err(|e| self.store_error(e))?;
                    let mut old_nodes = Vec::new();
                    for entry in nodes.iter().map_err(|e| self.store_error(e))? {
                        let (k, v) = entry.map_err(|e| self.store_error(e))?;
                        let id = k.value();
                        let rec = migrate::node_from(from, v.value()).map_err(|message| {
                            JournalError::Corrupt {
                                path: self.path.clone(),
                                record: format!("node {id} (format {from})"),
                                message,
                            }
                        })?;
                        old_nodes.push((id, rec));
                    }
                    for (id, rec) in &old_nodes {
                        let bytes = encode(rec).map_err(|e| self.store_error(e))?;
                        nodes
                            .insert(*id, bytes.as_slice())
                            .map_err(|e| self.store_error(e))?;
                    }
                    meta.insert("format", FORMAT)
                        .map_err(|e| self.store_error(e))?;
                    tracing::info!(
                        jobs = old.len(),
                        "journal rewritten from format {from} in format {FORMAT}"
                    );
                }
                Some(other) => {
                    return Err(self.store_error(format!(
                        "written in format {other} by another version of storm-mm; this one \
                         reads format {FORMAT}. Finish or cancel the jobs with the storm-mm that \
                         wrote it, or move the file away to start with an empty journal"
                    )));
                }
            }
            w.open_table(JOBS).map_err(|e| self.store_error(e))?;
            w.open_table(NODES).map_err(|e| self.store_error(e))?;
        }
        w.commit().map_err(|e| self.store_error(e))?;

        let r = self.db.begin_read().map_err(|e| self.store_error(e))?;
        let meta = r.open_table(META).map_err(|e| self.store_error(e))?;
        let mut restored = Restored {
            next_job: meta
                .get("next_job")
                .map_err(|e| self.store_error(e))?
                .map_or(1, |v| v.value()),
            ..Restored::default()
        };
        let jobs = r.open_table(JOBS).map_err(|e| self.store_error(e))?;
        for entry in jobs.iter().map_err(|e| self.store_error(e))? {
            let (k, v) = entry.map_err(|e| self.store_error(e))?;
            let rec: JobRecord = self.decode(&format!("job {}", k.value()), v.value())?;
            restored.jobs.push(rec);
        }
        let nodes = r.open_table(NODES).map_err(|e| self.store_error(e))?;
        for entry in nodes.iter().map_err(|e| self.store_error(e))? {
            let (k, v) = entry.map_err(|e| self.store_error(e))?;
            let rec: NodeRecord = self.decode(&format!("node {}", k.value()), v.value())?;
            restored.nodes.insert(k.value(), rec);
        }
        Ok(restored)
    }

    fn write(&mut self, changes: &[Change], next_job: Option<JobId>) -> Result<(), JournalError> {
        self.write_with(changes, next_job, None, true)
    }

    fn write_applied(
        &mut self,
        changes: &[Change],
        next_job: Option<JobId>,
        applied: u64,
        durable: bool,
    ) -> Result<(), JournalError> {
        self.write_with(changes, next_job, Some(applied), durable)
    }

    /// One durable transaction that empties the tables and fills them with `state`.
    fn replace(&mut self, state: &Restored, applied: u64) -> Result<(), JournalError> {
        let w = self.db.begin_write().map_err(|e| self.store_error(e))?;
        w.delete_table(JOBS).map_err(|e| self.store_error(e))?;
        w.delete_table(NODES).map_err(|e| self.store_error(e))?;
        {
            let mut jobs = w.open_table(JOBS).map_err(|e| self.store_error(e))?;
            for rec in &state.jobs {
                let bytes = encode(rec).map_err(|e| self.store_error(e))?;
                jobs.insert(rec.id, bytes.as_slice())
                    .map_err(|e| self.store_error(e))?;
            }
            let mut nodes = w.open_table(NODES).map_err(|e| self.store_error(e))?;
            for (n, rec) in &state.nodes {
                let bytes = encode(rec).map_err(|e| self.store_error(e))?;
                nodes
                    .insert(*n, bytes.as_slice())
                    .map_err(|e| self.store_error(e))?;
            }
            let mut meta = w.open_table(META).map_err(|e| self.store_error(e))?;
            meta.insert("next_job", state.next_job)
                .map_err(|e| self.store_error(e))?;
            meta.insert(APPLIED, applied)
                .map_err(|e| self.store_error(e))?;
        }
        w.commit().map_err(|e| self.store_error(e))
    }

    fn applied(&mut self) -> Result<u64, JournalError> {
        let r = self.db.begin_read().map_err(|e| self.store_error(e))?;
        let meta = match r.open_table(META) {
            Ok(m) => m,
            Err(redb::TableError::TableDoesNotExist(_)) => return Ok(0),
            Err(e) => return Err(self.store_error(e)),
        };
        Ok(meta
            .get(APPLIED)
            .map_err(|e| self.store_error(e))?
            .map_or(0, |v| v.value()))
    }
}

/// Where a replica's journal records the replicated log's entry it holds up to.
const APPLIED: &str = "raft_applied";

impl RedbStore {
    fn write_with(
        &mut self,
        changes: &[Change],
        next_job: Option<JobId>,
        applied: Option<u64>,
        durable: bool,
    ) -> Result<(), JournalError> {
        let mut w = self.db.begin_write().map_err(|e| self.store_error(e))?;
        if !durable {
            w.set_durability(redb::Durability::None)
                .map_err(|e| self.store_error(e))?;
        }
        {
            let mut jobs = w.open_table(JOBS).map_err(|e| self.store_error(e))?;
            let mut nodes = w.open_table(NODES).map_err(|e| self.store_error(e))?;
            let mut meta = w.open_table(META).map_err(|e| self.store_error(e))?;
            for change in changes {
                match change {
                    Change::Job(rec) => {
                        let bytes = encode(rec).map_err(|e| self.store_error(e))?;
                        jobs.insert(rec.id, bytes.as_slice())
                            .map_err(|e| self.store_error(e))?;
                    }
                    Change::RemoveJob(id) => {
                        jobs.remove(*id).map_err(|e| self.store_error(e))?;
                    }
                    Change::Node(n, rec) => {
                        let bytes = encode(rec).map_err(|e| self.store_error(e))?;
                        nodes
                            .insert(*n, bytes.as_slice())
                            .map_err(|e| self.store_error(e))?;
                    }
                }
            }
            if let Some(next) = next_job {
                meta.insert("next_job", next)
                    .map_err(|e| self.store_error(e))?;
            }
            if let Some(applied) = applied {
                meta.insert(APPLIED, applied)
                    .map_err(|e| self.store_error(e))?;
            }
        }
        w.commit().map_err(|e| self.store_error(e))
    }
}

/// The journal in memory, shared by its clones: a simulated MM that restarts reads what the
/// one before it committed. It keeps no programs.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    held: std::sync::Arc<std::sync::Mutex<Restored>>,
}

impl MemoryStore {
    pub(crate) fn held(&self) -> std::sync::MutexGuard<'_, Restored> {
        // A panic elsewhere while holding it leaves plain data, still whole.
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl JournalStore for MemoryStore {
    fn read(&mut self) -> Result<Restored, JournalError> {
        let held = self.held();
        Ok(Restored {
            next_job: held.next_job.max(1),
            jobs: held.jobs.clone(),
            nodes: held.nodes.clone(),
        })
    }

    fn write(&mut self, changes: &[Change], next_job: Option<JobId>) -> Result<(), JournalError> {
        let mut held = self.held();
        for change in changes {
            match change {
                Change::Job(rec) => match held.jobs.binary_search_by_key(&rec.id, |j| j.id) {
                    Ok(i) => held.jobs[i] = (**rec).clone(),
                    Err(i) => held.jobs.insert(i, (**rec).clone()),
                },
                Change::RemoveJob(id) => held.jobs.retain(|j| j.id != *id),
                Change::Node(n, rec) => {
                    held.nodes.insert(*n, rec.clone());
                }
            }
        }
        if let Some(next) = next_job {
            held.next_job = next;
        }
        Ok(())
    }

    fn replace(&mut self, state: &Restored, _applied: u64) -> Result<(), JournalError> {
        *self.held() = state.clone();
        Ok(())
    }
}

/// Where commits are written: in place (the simulator's memory store: a commit is settled
/// when it returns) or by the committer thread (the daemon's store on disk).
enum Writer {
    /// Writes each commit when it is made.
    InPlace(Box<dyn JournalStore>),
    /// Hands each commit over as a [`Batch`] for the host to write
    /// ([`Journal::take_handed`]); the outcomes come back through [`Journal::persisted`].
    HandedOff {
        handed: Vec<Batch>,
        arrived: Vec<Settled>,
    },
}

/// One commit's changes, handed to the host to write (see [`Journal::hand_off`]).
#[derive(Debug)]
pub struct Batch {
    /// The commit's number: once it settles, every commit up to it has.
    pub number: u64,
    pub changes: Vec<Change>,
    pub next_job: Option<JobId>,
    /// Program copies to delete once the batch is written (their jobs ended).
    pub unneeded: Vec<JobId>,
}

/// A commit that has settled: written, or tried and failed (its changes are tried again).
#[derive(Debug)]
pub struct Settled {
    /// Every batch up to this one is settled by this write.
    pub batch: u64,
    pub outcome: Result<(), JournalError>,
    /// How long the commit took: the write and its sync for a single MM; under a manager
    /// group, from the batch's proposal until the leader applied it, a majority having
    /// written it to their logs.
    pub took: Duration,
}

pub struct Journal {
    writer: Writer,
    /// Batches handed to the writer so far.
    batches: u64,
    /// Every batch up to this one has settled.
    settled: u64,
    /// Program copies; `None` for a journal that keeps none (in memory).
    programs: Option<ProgramStore>,
    staged: Vec<Change>,
    next_job: Option<JobId>,
    /// Program copies to delete once the commit that ends their job is done.
    unneeded: Vec<JobId>,
}

/// Milliseconds since the Unix epoch, as records store time (the daemon's clock; the
/// manager reads its own clock, see `storm_cluster::clock`).
pub fn now_ms() -> u64 {
    storm_cluster::daemon::unix_ms()
}

impl Journal {
    /// Opens (or creates) the journal in `dir` and reads what it holds. The directory and
    /// `programs/` in it are the MM's alone (mode 0700; users' programs and jobs'
    /// environments, which hold tokens and passwords), reached through their descriptors.
    pub fn open(dir: &Path) -> Result<(Self, Restored), JournalError> {
        let path = dir.join("journal.redb");
        let store = |message: String| JournalError::Store {
            path: path.clone(),
            message,
        };
        let state = DaemonDir::open_or_create(dir, 0o700).map_err(|e| store(e.to_string()))?;
        state
            .set_mode(0o700)
            .map_err(|e| store(format!("cannot restrict {}: {e}", dir.display())))?;
        let programs = state
            .subdir("programs", 0o700)
            .map_err(|e| store(e.to_string()))?;
        // The database is opened through the directory's descriptor, so no path component
        // swapped since the check can lead it elsewhere.
        let db = RedbStore::open_at(&state, "journal.redb", path.clone())?;
        let (journal, restored) = Self::with_store(
            Box::new(db),
            Some(ProgramStore {
                dir: Arc::new(programs),
            }),
        )?;
        journal.remove_stray_programs(&restored);
        Ok((journal, restored))
    }

    /// A journal in `store` (for example [`MemoryStore`]), keeping program copies in
    /// `programs` if given; reads what the store holds.
    pub fn with_store(
        mut store: Box<dyn JournalStore>,
        programs: Option<ProgramStore>,
    ) -> Result<(Self, Restored), JournalError> {
        let mut restored = store.read()?;
        // Ids are never used twice, even if the counter was not committed with a job.
        let highest = restored.jobs.iter().map(|j| j.id).max().unwrap_or(0);
        restored.next_job = restored.next_job.max(highest + 1);
        let journal = Self {
            writer: Writer::InPlace(store),
            ..Self::handed_off(programs)
        };
        Ok((journal, restored))
    }

    /// Stages a job's current record.
    pub fn put_job(&mut self, rec: JobRecord) {
        if matches!(rec.state, JobState::Finished { .. }) {
            self.unneeded.push(rec.id);
        }
        self.staged.push(Change::Job(Box::new(rec)));
    }

    /// Stages the removal of a job's record (an ended job past the history's retention).
    pub fn remove_job(&mut self, id: JobId) {
        self.staged.push(Change::RemoveJob(id));
    }

    /// Stages a node's record.
    pub fn put_node(&mut self, node: NodeId, rec: NodeRecord) {
        self.staged.push(Change::Node(node, rec));
    }

    /// Stages the next job id.
    pub fn set_next_job(&mut self, next: JobId) {
        self.next_job = Some(next);
    }

    /// Whether changes wait for [`Journal::commit`].
    pub fn dirty(&self) -> bool {
        !self.staged.is_empty() || self.next_job.is_some()
    }

    /// From now on hands each commit to the host instead of writing it: [`Journal::commit`]
    /// stages a [`Batch`] that [`Journal::take_handed`] gives out, and [`Journal::persisted`]
    /// takes each outcome back. Returns the store, for the host's writer (the daemon's is a
    /// thread, `crate::committer`, so that the disk's fsync stays off the MM's loop).
    pub fn hand_off(mut self) -> (Self, Option<Box<dyn JournalStore>>) {
        let writer = std::mem::replace(
            &mut self.writer,
            Writer::HandedOff {
                handed: Vec::new(),
                arrived: Vec::new(),
            },
        );
        match writer {
            Writer::InPlace(store) => (self, Some(store)),
            handed => {
                self.writer = handed;
                (self, None)
            }
        }
    }

    /// A journal front whose commits go to the host from the start (as after
    /// [`Journal::hand_off`]), over a store someone else keeps: the one a manager replica's
    /// MM core uses each time it leads again (the replica's thread writes the store).
    pub fn handed_off(programs: Option<ProgramStore>) -> Self {
        Self {
            writer: Writer::HandedOff {
                handed: Vec::new(),
                arrived: Vec::new(),
            },
            batches: 0,
            settled: 0,
            programs,
            staged: Vec::new(),
            next_job: None,
            unneeded: Vec::new(),
        }
    }

    /// The batches committed since the last call, for the host to write in order.
    pub fn take_handed(&mut self) -> Vec<Batch> {
        match &mut self.writer {
            Writer::HandedOff { handed, .. } => std::mem::take(handed),
            Writer::InPlace(_) => Vec::new(),
        }
    }

    /// The host wrote a handed batch (or tried and failed; its changes go again with the
    /// next batch): taken up by the next [`Journal::settle`].
    pub fn persisted(&mut self, settled: Settled) {
        if let Writer::HandedOff { arrived, .. } = &mut self.writer {
            arrived.push(settled);
        }
    }

    /// Commits every staged change in one durable transaction, and returns the commit's
    /// batch number: whatever was staged is settled once [`Journal::settled`] reaches it. In
    /// place, the commit is settled when this returns; on error nothing of it is committed and
    /// the changes stay staged, to be tried again with the next commit. Handed off, the
    /// changes become a [`Batch`] for the host, and the outcome comes from [`Journal::settle`].
    pub fn commit(&mut self) -> Result<u64, JournalError> {
        if !self.dirty() {
            return Ok(self.batches);
        }
        match &mut self.writer {
            Writer::InPlace(store) => {
                store.write(&self.staged, self.next_job)?;
                self.staged.clear();
                self.next_job = None;
                remove_programs(self.programs.as_ref(), std::mem::take(&mut self.unneeded));
                self.batches += 1;
                self.settled = self.batches;
            }
            Writer::HandedOff { handed, .. } => {
                self.batches += 1;
                handed.push(Batch {
                    number: self.batches,
                    changes: std::mem::take(&mut self.staged),
                    next_job: self.next_job.take(),
                    unneeded: std::mem::take(&mut self.unneeded),
                });
            }
        }
        Ok(self.batches)
    }

    /// The handed batches that settled since the last call (none in place), and advances
    /// [`Journal::settled`].
    pub fn settle(&mut self) -> Vec<Settled> {
        let Writer::HandedOff { arrived, .. } = &mut self.writer else {
            return Vec::new();
        };
        let settled = std::mem::take(arrived);
        if let Some(last) = settled.iter().map(|s| s.batch).max() {
            self.settled = self.settled.max(last);
        }
        settled
    }

    /// Every commit up to this batch number has settled.
    pub fn settled(&self) -> u64 {
        self.settled
    }

    /// Removes program copies no unfinished job needs: left by a commit that never happened
    /// (the MM was killed between saving a program and committing its job) or half written.
    fn remove_stray_programs(&self, restored: &Restored) {
        let Some(programs) = &self.programs else {
            return;
        };
        let needed: BTreeSet<String> = restored
            .jobs
            .iter()
            .filter(|j| !matches!(j.state, JobState::Finished { .. }))
            .map(|j| ProgramStore::name(j.id))
            .collect();
        let Ok(names) = programs.dir.names() else {
            return;
        };
        for name in names {
            if !needed.contains(&name) {
                let _ = programs.dir.remove_file(&name);
            }
        }
    }

    /// Where program copies are kept, for the thread that makes them; `None` if this journal
    /// keeps none.
    pub fn program_store(&self) -> Option<ProgramStore> {
        self.programs.clone()
    }

    /// Saves a copy of job `job`'s program (see [`ProgramStore::save`]).
    #[cfg(test)]
    fn save_program(&self, job: JobId, program: &File) -> Result<(), JournalError> {
        let size = program.metadata().unwrap().len();
        self.programs
            .as_ref()
            .expect("a journal on disk")
            .save(job, program, size)
    }

    /// The saved program of job `job`, if there is one (the host reads copies through the
    /// `ProgramStore`; the journal's tests look here).
    #[cfg(test)]
    fn program(&self, job: JobId) -> Option<File> {
        self.programs.as_ref()?.open(job)
    }
}

fn encode<T: Serialize>(value: &T) -> Result<Vec<u8>, bincode::error::EncodeError> {
    bincode::serde::encode_to_vec(value, bincode::config::standard())
}

/// The directory of program copies (`programs/` beside the journal): the programs of jobs
/// that wait for nodes or may be requeued, which a restarted MM sends when they start.
#[derive(Debug, Clone)]
pub struct ProgramStore {
    dir: Arc<DaemonDir>,
}

impl ProgramStore {
    fn name(job: JobId) -> String {
        format!("job-{job}")
    }

    /// Saves a copy of the first `size` bytes of job `job`'s program, the size that was
    /// checked against the limits when it was submitted (written aside, synced, then renamed
    /// into place, so a copy that exists is complete). A program whose size is no longer
    /// `size` (its user changed it after submitting) is refused with
    /// [`JournalError::ProgramChanged`], and no copy is kept.
    pub fn save(&self, job: JobId, program: &File, size: u64) -> Result<(), JournalError> {
        let name = Self::name(job);
        let partial = format!("{name}.partial");
        let err = |source| JournalError::Program {
            job,
            path: self.dir.join(&name),
            source,
        };
        let mut out = self.dir.create_file(&partial).map_err(err)?;
        let copied = copy_program(program, &mut out, size).and_then(|()| out.sync_all());
        let now = program.metadata().map(|m| m.len());
        let result = match (copied, now) {
            (Err(e), _) | (_, Err(e)) => Err(err(e)),
            (Ok(()), Ok(now)) if now != size => Err(JournalError::ProgramChanged {
                job,
                checked: size,
                now,
            }),
            (Ok(()), Ok(_)) => self.dir.rename(&partial, &name).map_err(err),
        };
        if result.is_err() {
            let _ = self.dir.remove_file(&partial);
        }
        result
    }

    /// A new, empty file aside for job `job`'s copy, which arrives in pieces (a replica of a
    /// manager group receiving the leader's copy); [`ProgramStore::complete_partial`] puts it
    /// in place once it is whole and synced.
    pub fn create_partial(&self, job: JobId) -> std::io::Result<File> {
        self.dir
            .create_file(&format!("{}.partial", Self::name(job)))
    }

    /// Deletes the file made by [`ProgramStore::create_partial`], if there is one (a copy
    /// abandoned before its end).
    pub fn remove_partial(&self, job: JobId) {
        let _ = self
            .dir
            .remove_file(&format!("{}.partial", Self::name(job)));
    }

    /// Puts the file made by [`ProgramStore::create_partial`] in place as job `job`'s copy.
    pub fn complete_partial(&self, job: JobId) -> std::io::Result<()> {
        let name = Self::name(job);
        self.dir.rename(&format!("{name}.partial"), &name)
    }

    /// Job `job`'s copy, if there is one.
    pub fn open(&self, job: JobId) -> Option<File> {
        self.dir.open_file(&Self::name(job)).ok()
    }

    /// Deletes job `job`'s copy, if there is one.
    pub fn remove(&self, job: JobId) {
        let _ = self.dir.remove_file(&Self::name(job));
    }
}

/// Copies the first `size` bytes of `program` into `out` (a new, empty file) without moving
/// `program`'s offset, which belongs to whoever else reads it; a program shorter than `size`
/// is an error. The copy is made in the kernel where the two files allow it (a reflink on
/// XFS or btrfs, a page-cache copy on ext4), and through a buffer where they do not (another
/// file system, a pipe).
fn copy_program(program: &File, out: &mut File, size: u64) -> std::io::Result<()> {
    use nix::errno::Errno;
    let short = |at: u64| {
        std::io::Error::new(
            std::io::ErrorKind::UnexpectedEof,
            format!("the program ended at byte {at} of the {size} checked (was it truncated?)"),
        )
    };
    let mut at: i64 = 0;
    while (at as u64) < size {
        let left = ((size - at as u64) as usize).min(1 << 30);
        // `out` is new, so its own offset follows `at`.
        match nix::fcntl::copy_file_range(program, Some(&mut at), &*out, None, left) {
            Ok(0) => return Err(short(at as u64)),
            Ok(_) => {}
            Err(Errno::EINTR) => {}
            Err(Errno::EXDEV | Errno::EINVAL | Errno::ENOSYS | Errno::EOPNOTSUPP) => break,
            Err(e) => return Err(e.into()),
        }
    }
    let mut buf = vec![0u8; 1 << 20];
    let mut at = at as u64;
    while at < size {
        let want = ((size - at) as usize).min(buf.len());
        let n = program.read_at(&mut buf[..want], at)?;
        if n == 0 {
            return Err(short(at));
        }
        out.write_all(&buf[..n])?;
        at += n as u64;
    }
    Ok(())
}

/// Deletes the copies of `jobs` from `programs`, if this journal keeps copies: what a commit
/// does once it has written the ends of those jobs.
pub(crate) fn remove_programs(
    programs: Option<&ProgramStore>,
    jobs: impl IntoIterator<Item = JobId>,
) {
    if let Some(p) = programs {
        for job in jobs {
            p.remove(job);
        }
    }
}

/// Decodes one record read from the journal at `path`; a record that does not decode is
/// [`JournalError::Corrupt`], naming the file and the record.
pub fn decode_record<T: DeserializeOwned>(
    path: &Path,
    record: &str,
    bytes: &[u8],
) -> Result<T, JournalError> {
    storm_primitives::codec::decode(bytes)
        .map(|(v, _)| v)
        .map_err(|e| JournalError::Corrupt {
            path: path.to_path_buf(),
            record: record.to_string(),
            message: e.to_string(),
        })
}

#[cfg(test)]
pub(crate) mod tests;
