//! A replica's Raft log on disk: `raft.wal` beside the journal, in the state directory
//! ([`super::wal`] has its format).
//!
//! raft-rs asks for a [`raft::Storage`]; this serves it from raft-rs's own [`MemStorage`]
//! and appends every change to the file first, so that what a replica told its peers (its
//! vote, its term, the entries it acknowledged) survives a crash, as Raft requires. On start
//! the file's records are replayed into memory.
//!
//! The log is compacted once it holds twice `[replication] log_entries_kept` entries that the
//! journal holds durably: the oldest are dropped (the file is written anew without them), and
//! the log records the last one dropped (its index and term, as a Raft snapshot's metadata). A
//! replica that lacks entries the leader dropped (it was away, or replaces a lost disk) gets a
//! Raft snapshot of that metadata only ([`DurableLog::apply_snapshot`]); the log then records
//! that its journal wants a state ([`DurableLog::wants_state`]) until it took the leader's
//! (`super::resync`).
//!
//! Until 28 November 2026 the log was a redb database, `raft.redb`; a replica that finds one
//! and no `raft.wal` moves its contents into a new `raft.wal` and removes it
//! ([`legacy_records`]).

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::storage::MemStorage;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use storm_cluster::daemon_dir::DaemonDir;

use super::ReplicaError;
use super::wal::{Record, Wal};
use super::writer::{Wake, Writer};

/// The log's file in the state directory.
pub const LOG_FILE: &str = "raft.wal";
/// The log's file until 28 November 2026 (a redb database), moved into [`LOG_FILE`].
pub const LEGACY_LOG_FILE: &str = "raft.redb";

/// What a log's records add up to.
#[derive(Debug, Default)]
struct Replayed {
    entries: Vec<Entry>,
    hard: Option<HardState>,
    applied: u64,
    /// The last entry dropped: index and term.
    compacted: Option<(u64, u64)>,
    wants_state: Option<u64>,
    conf: Option<ConfState>,
    identity: Option<u64>,
}

impl Replayed {
    /// Replays `records` in order; the error says which one does not follow.
    fn of(records: Vec<Record>) -> Result<Self, String> {
        let mut r = Replayed::default();
        for (i, record) in records.into_iter().enumerate() {
            match record {
                Record::Entries { entries, hard } => {
                    if let Some(first) = entries.first() {
                        let base = r.compacted.map_or(0, |c| c.0);
                        let next = r.entries.last().map_or(base, |e| e.index) + 1;
                        if first.index <= base || first.index > next {
                            return Err(format!(
                                "record {i} writes entries from {} where the log holds {} to {}",
                                first.index,
                                base + 1,
                                next - 1
                            ));
                        }
                        // A new leader's entries replace a tail this replica had from an old
                        // one.
                        r.entries.truncate((first.index - base - 1) as usize);
                        for (k, e) in entries.iter().enumerate() {
                            if e.index != first.index + k as u64 {
                                return Err(format!("record {i} holds entries out of order"));
                            }
                        }
                        r.entries.extend(entries);
                    }
                    if let Some(hs) = hard {
                        r.hard = Some(hs);
                    }
                }
                Record::Hard(hs) => r.hard = Some(hs),
                Record::Applied(index) => r.applied = index,
                Record::Compacted { index, term } => {
                    r.entries.retain(|e| e.index > index);
                    if r.entries.first().is_some_and(|e| e.index != index + 1) {
                        return Err(format!("record {i} drops entries the log did not hold"));
                    }
                    r.compacted = Some((index, term));
                }
                Record::Snapshot { index, term, hard } => {
                    r.entries.clear();
                    r.compacted = Some((index, term));
                    r.wants_state = Some(index);
                    r.hard = Some(hard);
                }
                Record::WantsState(index) => r.wants_state = Some(index),
                Record::StateTaken => r.wants_state = None,
                Record::Conf(conf) => r.conf = Some(conf),
                Record::Identity(id) => r.identity = Some(id),
            }
        }
        Ok(r)
    }

    /// Whether the log holds nothing at all (a new state directory).
    fn is_empty(&self) -> bool {
        self.entries.is_empty()
            && self.hard.is_none()
            && self.compacted.is_none()
            && self.conf.is_none()
            && self.identity.is_none()
    }
}

/// The records that hold what a log of the old format (a redb database) holds.
pub fn legacy_records(dir: &DaemonDir) -> Result<Vec<Record>, String> {
    const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
    const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
    let word = |v: &[u8], i: usize| -> Result<u64, String> {
        v.get(i * 8..i * 8 + 8)
            .and_then(|b| b.try_into().ok())
            .map(u64::from_le_bytes)
            .ok_or_else(|| "a log position is cut short".to_string())
    };
    let db = Database::open(dir.via_descriptor(LEGACY_LOG_FILE)).map_err(|e| e.to_string())?;
    let r = db.begin_read().map_err(|e| e.to_string())?;
    let mut records = Vec::new();
    let meta = match r.open_table(META) {
        Ok(t) => Some(t),
        Err(redb::TableError::TableDoesNotExist(_)) => None,
        Err(e) => return Err(e.to_string()),
    };
    if let Some(meta) = &meta
        && let Some(v) = meta.get("compacted").map_err(|e| e.to_string())?
    {
        records.push(Record::Compacted {
            index: word(v.value(), 0)?,
            term: word(v.value(), 1)?,
        });
    }
    let mut entries = Vec::new();
    match r.open_table(ENTRIES) {
        Ok(table) => {
            for row in table.iter().map_err(|e| e.to_string())? {
                let (k, v) = row.map_err(|e| e.to_string())?;
                entries.push(
                    Entry::parse_from_bytes(v.value())
                        .map_err(|e| format!("entry {}: {e}", k.value()))?,
                );
            }
        }
        Err(redb::TableError::TableDoesNotExist(_)) => {}
        Err(e) => return Err(e.to_string()),
    }
    records.push(Record::Entries {
        entries,
        hard: None,
    });
    if let Some(meta) = &meta {
        if let Some(v) = meta.get("hard_state").map_err(|e| e.to_string())? {
            let hs =
                HardState::parse_from_bytes(v.value()).map_err(|e| format!("hard state: {e}"))?;
            records.push(Record::Hard(hs));
        }
        if let Some(v) = meta.get("applied").map_err(|e| e.to_string())? {
            records.push(Record::Applied(word(v.value(), 0)?));
        }
        if let Some(v) = meta.get("wants_state").map_err(|e| e.to_string())? {
            records.push(Record::WantsState(word(v.value(), 0)?));
        }
    }
    Ok(records)
}

/// What raft-rs reads: the log in memory, whose snapshots are taken at the last entry applied.
/// raft-rs's `MemStorage` takes them at the commit index, with the group's configuration as
/// it stands, which is as of the last entry applied: a change of the group committed but not
/// yet applied would be in neither the snapshot's configuration nor the log it precedes, and
/// the replica that takes the snapshot would never learn of it.
#[derive(Clone)]
pub struct LogStorage {
    mem: MemStorage,
    applied: Arc<AtomicU64>,
}

impl raft::Storage for LogStorage {
    fn initial_state(&self) -> raft::Result<raft::RaftState> {
        self.mem.initial_state()
    }

    fn entries(
        &self,
        low: u64,
        high: u64,
        max_size: impl Into<Option<u64>>,
        context: raft::GetEntriesContext,
    ) -> raft::Result<Vec<Entry>> {
        self.mem.entries(low, high, max_size, context)
    }

    fn term(&self, idx: u64) -> raft::Result<u64> {
        self.mem.term(idx)
    }

    fn first_index(&self) -> raft::Result<u64> {
        self.mem.first_index()
    }

    fn last_index(&self) -> raft::Result<u64> {
        self.mem.last_index()
    }

    fn snapshot(&self, request_index: u64, to: u64) -> raft::Result<Snapshot> {
        let mut snap = self.mem.snapshot(request_index, to)?;
        let applied = self.applied.load(Ordering::Acquire);
        let compacted = self.mem.first_index()? - 1;
        let meta = snap.mut_metadata();
        if applied < meta.index && applied >= compacted.max(request_index).max(1) {
            meta.term = self.mem.term(applied)?;
            meta.index = applied;
        }
        Ok(snap)
    }
}

/// The durable log, and its copy in memory that raft-rs reads.
pub struct DurableLog {
    /// The thread that writes `raft.wal`, in the order it is given records.
    writer: Writer,
    path: PathBuf,
    mem: MemStorage,
    /// The last entry applied, as [`LogStorage`] takes its snapshots there.
    applied_now: Arc<AtomicU64>,
    applied: u64,
    /// The group's configuration, as last applied (see [`super::member`]).
    conf: ConfState,
    /// This replica's Raft id, if the leader gave it one when it joined.
    identity: Option<u64>,
    wants_state: Option<u64>,
    /// Whether appends are synced to disk (off only with `[replication] unsafe_no_log_sync`).
    sync: bool,
}

impl DurableLog {
    /// Opens (or creates) the log in `dir`. A new log starts with `voters` as the group; with
    /// `join`, with no group at all (the replica waits to be admitted: [`super::member`]).
    pub fn open(dir: &DaemonDir, voters: Vec<u64>, join: bool) -> Result<Self, ReplicaError> {
        let path = dir.join(LOG_FILE);
        let err = |m: String| ReplicaError::Log {
            path: path.clone(),
            message: m,
        };
        let (wal, records) = if dir.contains(LOG_FILE) {
            if dir.contains(LEGACY_LOG_FILE) {
                // A move into `raft.wal` that a crash cut short after the rename.
                dir.remove_file(LEGACY_LOG_FILE)
                    .map_err(|e| err(format!("cannot remove {LEGACY_LOG_FILE}: {e}")))?;
            }
            Wal::open(dir, LOG_FILE).map_err(|e| err(e.to_string()))?
        } else if dir.contains(LEGACY_LOG_FILE) {
            let records = legacy_records(dir).map_err(|e| ReplicaError::Log {
                path: dir.join(LEGACY_LOG_FILE),
                message: format!("cannot read the log of the old format: {e}"),
            })?;
            let wal = Wal::create(dir, LOG_FILE, &records).map_err(|e| err(e.to_string()))?;
            dir.remove_file(LEGACY_LOG_FILE)
                .and_then(|()| dir.sync())
                .map_err(|e| err(format!("cannot remove {LEGACY_LOG_FILE}: {e}")))?;
            tracing::info!(
                "the Raft log moved from {LEGACY_LOG_FILE} (the old format) to {LOG_FILE}"
            );
            (wal, records)
        } else {
            let wal = Wal::create(dir, LOG_FILE, &[]).map_err(|e| err(e.to_string()))?;
            (wal, Vec::new())
        };
        let mut replayed = Replayed::of(records).map_err(&err)?;
        let conf = match replayed.conf.take() {
            Some(conf) => conf,
            None if join && replayed.is_empty() => ConfState::default(),
            None => ConfState::from((voters, vec![])),
        };
        let mem = MemStorage::new_with_conf_state(conf.clone());
        let writer = Writer::start(wal)
            .map_err(|e| err(format!("cannot start the log's writer thread: {e}")))?;
        let mut log = Self {
            writer,
            path: path.clone(),
            mem,
            applied_now: Arc::new(AtomicU64::new(replayed.applied)),
            applied: replayed.applied,
            conf,
            identity: replayed.identity,
            wants_state: replayed.wants_state,
            sync: true,
        };
        {
            let mut core = log.mem.wl();
            if let Some((index, term)) = replayed.compacted {
                core.apply_snapshot(log.snapshot_of(index, term))
                    .map_err(|e| err(e.to_string()))?;
            }
            core.append(&replayed.entries)
                .map_err(|e| err(e.to_string()))?;
            if let Some(hs) = replayed.hard {
                core.set_hardstate(hs);
            }
            // What was applied was committed.
            log.applied = log.applied.min(core.hard_state().commit);
        }
        Ok(log)
    }

    fn error(&self, e: impl std::fmt::Display) -> ReplicaError {
        ReplicaError::Log {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// A snapshot that holds only the position of entry `index` of `term`.
    fn snapshot_of(&self, index: u64, term: u64) -> Snapshot {
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(self.conf.clone());
        let mut snap = Snapshot::default();
        snap.set_metadata(meta);
        snap
    }

    /// The last entry dropped from the log (0: none).
    pub fn compacted(&self) -> u64 {
        use raft::Storage;
        self.mem.first_index().unwrap_or(1) - 1
    }

    /// Entries the log holds.
    pub fn held(&self) -> u64 {
        use raft::Storage;
        let last = self.mem.last_index().unwrap_or(0);
        last.saturating_sub(self.compacted())
    }

    /// Drops the entries up to `upto` (which the journal holds durably), on disk and in memory.
    pub fn compact(&mut self, upto: u64) -> Result<(), ReplicaError> {
        use raft::Storage;
        if upto <= self.compacted() {
            return Ok(());
        }
        let term = self.mem.term(upto).map_err(|e| self.error(e))?;
        let last = self.mem.last_index().map_err(|e| self.error(e))?;
        let kept = self
            .mem
            .entries(
                upto + 1,
                last + 1,
                None,
                raft::GetEntriesContext::empty(false),
            )
            .map_err(|e| self.error(e))?;
        let hard = self.mem.rl().hard_state().clone();
        let mut records = vec![
            Record::Compacted { index: upto, term },
            Record::Hard(hard.clone()),
            Record::Applied(self.applied),
            Record::Conf(self.conf.clone()),
        ];
        records.extend(self.identity.map(Record::Identity));
        if let Some(index) = self.wants_state {
            records.push(Record::WantsState(index));
        }
        records.push(Record::Entries {
            entries: kept.clone(),
            hard: None,
        });
        let ticket = self.writer.rewrite(records).map_err(|e| self.error(e))?;
        self.writer.wait(ticket).map_err(|e| self.error(e))?;
        // raft-rs's memory log drops a prefix only with a snapshot's position, which also
        // clears it and its commit index: the rest goes back in, and the hard state with it.
        let mut core = self.mem.wl();
        core.apply_snapshot(self.snapshot_of(upto, term))
            .map_err(|e| self.error(e))?;
        core.append(&kept).map_err(|e| self.error(e))?;
        core.set_hardstate(hard);
        Ok(())
    }

    /// Takes the leader's snapshot (a position only: every entry up to it is committed, and
    /// this replica lacks some the leader dropped): drops the whole log, and records that the
    /// journal wants a state as of that position.
    pub fn apply_snapshot(&mut self, snap: &Snapshot) -> Result<(), ReplicaError> {
        let (index, term) = (snap.get_metadata().index, snap.get_metadata().term);
        let mut hard = self.mem.rl().hard_state().clone();
        hard.commit = hard.commit.max(index);
        hard.term = hard.term.max(term);
        let conf = snap.get_metadata().get_conf_state().clone();
        self.write_now(vec![
            Record::Snapshot { index, term, hard },
            Record::Conf(conf.clone()),
        ])?;
        self.mem
            .wl()
            .apply_snapshot(snap.clone())
            .map_err(|e| self.error(e))?;
        self.conf = conf;
        self.wants_state = Some(index);
        Ok(())
    }

    /// The group's configuration, as last applied.
    pub fn conf(&self) -> &ConfState {
        &self.conf
    }

    /// This replica's Raft id, if the leader gave it one ([`DurableLog::join`]).
    pub fn identity(&self) -> Option<u64> {
        self.identity
    }

    /// Whether the group has no member at all, as this log knows it: a replica that waits to
    /// be admitted.
    pub fn has_no_group(&self) -> bool {
        super::member::members(&self.conf).next().is_none()
    }

    /// The leader admitted this replica as `id`: its log starts after entry `index` of
    /// `term`, where the group is `conf`, and its journal wants the leader's state as of it.
    pub fn join(
        &mut self,
        id: u64,
        index: u64,
        term: u64,
        conf: ConfState,
    ) -> Result<(), ReplicaError> {
        self.write_now(vec![Record::Identity(id)])?;
        self.identity = Some(id);
        let mut snap = self.snapshot_of(index, term);
        snap.mut_metadata().set_conf_state(conf);
        self.apply_snapshot(&snap)
    }

    /// A change of the group's configuration was applied: it is `conf` from now on.
    pub fn set_conf(&mut self, conf: ConfState) -> Result<(), ReplicaError> {
        self.write_now(vec![Record::Conf(conf.clone())])?;
        self.mem.wl().set_conf_state(conf.clone());
        self.conf = conf;
        Ok(())
    }

    /// The position as of which the journal wants another replica's state, if it does.
    pub fn wants_state(&self) -> Option<u64> {
        self.wants_state
    }

    /// The journal took another replica's state.
    pub fn state_taken(&mut self) -> Result<(), ReplicaError> {
        if self.wants_state.is_none() {
            return Ok(());
        }
        self.write_now(vec![Record::StateTaken])?;
        self.wants_state = None;
        Ok(())
    }

    /// What raft-rs reads.
    pub fn storage(&self) -> LogStorage {
        LogStorage {
            mem: self.mem.clone(),
            applied: self.applied_now.clone(),
        }
    }

    /// Entries up to `index` are applied (to the journal and the group's configuration): a
    /// snapshot raft-rs takes from now on is at that entry.
    pub fn applied_to(&self, index: u64) {
        self.applied_now.store(index, Ordering::Release);
    }

    /// Index of the last entry applied to the journal, as last recorded.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The commit index, as last recorded.
    pub fn committed(&self) -> u64 {
        self.mem.rl().hard_state().commit
    }

    /// Writes `records` in one synced append, after everything given before, and waits for
    /// it.
    fn write_now(&mut self, records: Vec<Record>) -> Result<(), ReplicaError> {
        let ticket = self
            .writer
            .append(records, true)
            .map_err(|e| self.error(e))?;
        self.writer.wait(ticket).map_err(|e| self.error(e))
    }

    /// Sets what wakes the replica's thread once a write given by
    /// [`DurableLog::append_queued`] is done.
    pub fn set_wake(&self, wake: Wake) {
        self.writer.set_wake(wake);
    }

    /// Writes `entries` (replacing any from the first one's index on) and the hard state, in
    /// one synced append, and waits for it.
    pub fn append(
        &mut self,
        entries: &[Entry],
        hard: Option<&HardState>,
    ) -> Result<(), ReplicaError> {
        let ticket = self.append_queued(entries, hard)?;
        self.writer.wait(ticket).map_err(|e| self.error(e))
    }

    /// The last write given out: once [`DurableLog::written`] reaches it, everything given so
    /// far is on disk.
    pub fn given(&self) -> u64 {
        self.writer.given()
    }

    /// Waits until every write given so far is done.
    pub fn flush(&mut self) -> Result<(), ReplicaError> {
        let given = self.writer.given();
        self.writer.wait(given).map_err(|e| self.error(e))
    }

    /// The last write done (every one before it too), without waiting; or the error of a
    /// write that failed.
    pub fn written(&mut self) -> Result<u64, ReplicaError> {
        self.writer.written().map_err(|e| self.error(e))
    }

    /// Puts `entries` (replacing any from the first one's index on) and the hard state in
    /// memory at once, where raft-rs reads them, and gives them to the writer thread for one
    /// synced append after everything given before: the ticket that says when they are on
    /// disk (compare with [`DurableLog::written`]). What needs nothing written gets the last
    /// ticket given: it is durable once everything before it is.
    pub fn append_queued(
        &mut self,
        entries: &[Entry],
        hard: Option<&HardState>,
    ) -> Result<u64, ReplicaError> {
        if entries.is_empty() && hard.is_none() {
            return Ok(self.writer.given());
        }
        if let Some(hs) = hard
            && entries.is_empty()
            && self.only_commit_differs(hs)
        {
            // A follower learns each new commit index in a message of its own (the leader
            // tells it as soon as a majority has an entry): writing it down would cost a
            // synced write per batch for nothing Raft needs, as a lost commit index is
            // learnt again from the leader. It goes to disk with the next vote, entries or
            // applied index.
            self.set_commit(hs.commit);
            return Ok(self.writer.given());
        }
        if let Some(first) = entries.first() {
            // Checked here, as raft-rs's memory log panics on it.
            let (base, last) = (self.compacted(), self.compacted() + self.held());
            if first.index <= base || first.index > last + 1 {
                return Err(self.error(format!(
                    "entries from {} cannot follow a log that holds {} to {last}",
                    first.index,
                    base + 1
                )));
            }
        }
        let record = Record::Entries {
            entries: entries.to_vec(),
            hard: hard.cloned(),
        };
        {
            let mut core = self.mem.wl();
            core.append(entries).map_err(|e| self.error(e))?;
            if let Some(hs) = hard {
                core.set_hardstate(hs.clone());
            }
        }
        let sync = self.sync;
        self.writer
            .append(vec![record], sync)
            .map_err(|e| self.error(e))
    }

    /// Whether `hs` differs from the hard state held only in its commit index.
    fn only_commit_differs(&self, hs: &HardState) -> bool {
        let held = self.mem.rl();
        let held = held.hard_state();
        held.term == hs.term && held.vote == hs.vote
    }

    /// Whether appends are synced to disk before they return (on unless `[replication]
    /// unsafe_no_log_sync`).
    pub fn set_sync(&mut self, sync: bool) {
        self.sync = sync;
    }

    /// Records a new commit index (in memory at once; on disk with the next hard state or
    /// applied index: a lost commit index is learnt again from the leader).
    pub fn set_commit(&mut self, commit: u64) {
        self.mem.wl().mut_hard_state().commit = commit;
    }

    /// Records that every entry up to `index` is in the journal durably, and the commit index
    /// with it.
    pub fn set_applied(&mut self, index: u64) -> Result<(), ReplicaError> {
        if index <= self.applied {
            return Ok(());
        }
        let hard = self.mem.rl().hard_state().clone();
        self.write_now(vec![Record::Hard(hard), Record::Applied(index)])?;
        self.applied = index;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::super::wal::tests::entry;
    use super::*;
    use raft::Storage;

    /// A hard state of `term`, `vote` and `commit`.
    fn hs(term: u64, vote: u64, commit: u64) -> HardState {
        HardState {
            term,
            vote,
            commit,
            ..Default::default()
        }
    }

    #[test]
    fn entries_hard_state_and_applied_index_survive_a_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
            let hs = hs(2, 3, 2);
            log.append(&[entry(1, 1, b"a"), entry(2, 2, b"b")], Some(&hs))
                .unwrap();
            log.set_applied(2).unwrap();
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        let s = log.storage();
        let state = s.initial_state().unwrap();
        assert_eq!((state.hard_state.term, state.hard_state.vote), (2, 3));
        assert_eq!(state.conf_state.voters, vec![1, 2, 3]);
        assert_eq!(s.last_index().unwrap(), 2);
        let got = s
            .entries(1, 3, None, raft::GetEntriesContext::empty(false))
            .unwrap();
        assert_eq!(got[1].data.as_ref(), b"b");
        assert_eq!(log.applied(), 2);
    }

    /// raft-rs reads queued entries at once (`advance_append_async` needs that); the
    /// tickets tell when each write is on disk, in the order given, and a checkpoint given
    /// after queued entries lands after them, so that the hard state read back is the newest.
    #[test]
    fn queued_entries_are_read_at_once_and_written_in_the_order_given() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
            let first = log
                .append_queued(&[entry(1, 1, b"a")], Some(&hs(1, 1, 0)))
                .unwrap();
            let second = log
                .append_queued(&[entry(2, 2, b"b"), entry(3, 2, b"c")], Some(&hs(2, 2, 1)))
                .unwrap();
            assert!(first < second, "tickets go up: {first} {second}");
            // In memory before it is known on disk.
            assert_eq!(log.storage().last_index().unwrap(), 3);
            // Nothing to write: durable once what came before is.
            assert_eq!(log.append_queued(&[], None).unwrap(), second);
            assert!(log.written().unwrap() <= second);
            // Given after the entries: written after them.
            log.set_applied(1).unwrap();
            assert_eq!(log.written().unwrap(), log.given());
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        let state = log.storage().initial_state().unwrap().hard_state;
        assert_eq!((state.term, state.vote), (2, 2), "the newest hard state");
        assert_eq!(log.storage().last_index().unwrap(), 3);
        assert_eq!(log.applied(), 1);
    }

    /// A log dropped with writes still queued writes them before its thread ends.
    #[test]
    fn queued_writes_reach_the_disk_when_the_log_is_dropped() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
            for i in 1..=50u64 {
                log.append_queued(&[entry(i, 1, b"x")], None).unwrap();
            }
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        assert_eq!(log.storage().last_index().unwrap(), 50);
    }

    #[test]
    fn a_vote_is_durable_at_once_and_a_commit_index_alone_is_learnt_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
            log.append(&[entry(1, 1, b"a"), entry(2, 1, b"b")], Some(&hs(1, 2, 1)))
                .unwrap();
            // A new commit index alone: raft-rs reads it at once.
            log.append(&[], Some(&hs(1, 2, 2))).unwrap();
            assert_eq!(log.storage().initial_state().unwrap().hard_state.commit, 2);
            // A vote in a new term, without entries: on disk before it is sent.
            log.append(&[], Some(&hs(2, 3, 2))).unwrap();
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        let state = log.storage().initial_state().unwrap().hard_state;
        assert_eq!((state.term, state.vote), (2, 3), "the vote survives");
        assert_eq!(state.commit, 2, "written with the vote");
        assert!(log.applied() <= state.commit);
    }

    #[test]
    fn an_applied_index_is_never_above_the_commit_index_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let hs = |commit| hs(1, 1, commit);
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
            log.append(&[entry(1, 1, b"a"), entry(2, 1, b"b")], Some(&hs(1)))
                .unwrap();
            log.append(&[], Some(&hs(2))).unwrap();
            // The checkpoint records the applied index with the commit index in memory.
            log.set_applied(2).unwrap();
            log.append(&[entry(3, 1, b"c")], None).unwrap();
            log.append(&[], Some(&hs(3))).unwrap();
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        let state = log.storage().initial_state().unwrap().hard_state;
        assert_eq!(
            state.commit, 2,
            "the last commit index alone was not written"
        );
        assert_eq!(log.applied(), 2, "but the applied index is never above it");
        assert_eq!(
            log.storage().last_index().unwrap(),
            3,
            "and entry 3 is kept"
        );
    }

    /// A replica started with `--join` on a new state directory has no group until the
    /// leader admits it; then its id, the group and the position it starts from survive a
    /// restart (with or without `--join`), as does a later change of the group, through a
    /// compaction too. An old log given `--join` keeps the group it had.
    #[test]
    fn a_joining_replicas_id_and_group_survive_restarts_and_compaction() {
        use super::super::member::raft_id;
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let me = raft_id(2, 40);
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3], true).unwrap();
            assert!(log.has_no_group() && log.identity().is_none());
            log.join(me, 39, 4, ConfState::from((vec![1, 2], vec![me])))
                .unwrap();
        }
        for join in [true, false] {
            let log = DurableLog::open(&dir, vec![1, 2, 3], join).unwrap();
            assert_eq!(log.identity(), Some(me));
            assert_eq!(log.wants_state(), Some(39));
            let state = log.storage().initial_state().unwrap();
            assert_eq!(state.conf_state.voters, vec![1, 2]);
            assert_eq!(state.conf_state.learners, vec![me]);
            assert_eq!(log.storage().first_index().unwrap(), 40);
        }
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
            log.set_conf(ConfState::from((vec![1, 2, me], vec![])))
                .unwrap();
            let entries: Vec<Entry> = (40..=45).map(|i| entry(i, 4, b"x")).collect();
            log.append(&entries, Some(&hs(4, 1, 45))).unwrap();
            log.set_applied(45).unwrap();
            log.compact(43).unwrap();
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        assert_eq!(log.identity(), Some(me));
        let state = log.storage().initial_state().unwrap();
        assert_eq!(state.conf_state.voters, vec![1, 2, me]);
        assert!(state.conf_state.learners.is_empty());
        assert_eq!(log.storage().first_index().unwrap(), 44);
        let snap = log.storage().snapshot(0, 0).unwrap();
        assert_eq!(snap.get_metadata().get_conf_state().voters, vec![1, 2, me]);

        let old = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(old.path(), 0o700).unwrap();
        DurableLog::open(&dir, vec![1, 2, 3], false)
            .unwrap()
            .append(&[entry(1, 1, b"a")], Some(&hs(1, 1, 1)))
            .unwrap();
        let log = DurableLog::open(&dir, vec![1, 2, 3], true).unwrap();
        assert!(!log.has_no_group() && log.identity().is_none());
    }

    /// A snapshot sent to a replica that lacks dropped entries is at the last entry applied,
    /// with the group as of that entry: a change committed but not yet applied then reaches
    /// it in the log that follows, instead of being skipped by a snapshot at the commit index.
    #[test]
    fn a_snapshot_is_taken_at_the_last_entry_applied_not_the_commit_index() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        let entries: Vec<Entry> = (1..=6).map(|i| entry(i, 1 + i / 4, b"x")).collect();
        log.append(&entries, Some(&hs(2, 1, 6))).unwrap();
        log.applied_to(4);
        let snap = log.storage().snapshot(0, 2).unwrap();
        assert_eq!(snap.get_metadata().index, 4);
        assert_eq!(snap.get_metadata().term, 2);
        assert_eq!(snap.get_metadata().get_conf_state().voters, vec![1, 2, 3]);
        // Never before what the log dropped (its entries would be gone).
        log.set_applied(4).unwrap();
        log.compact(5).unwrap();
        assert_eq!(
            log.storage().snapshot(0, 2).unwrap().get_metadata().index,
            6
        );
    }

    #[test]
    fn a_compacted_log_keeps_its_tail_and_position_across_a_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let hs = hs(2, 1, 4);
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
            let entries: Vec<Entry> = (1..=5).map(|i| entry(i, 1 + i / 4, b"x")).collect();
            log.append(&entries, Some(&hs)).unwrap();
            log.compact(3).unwrap();
            assert_eq!((log.compacted(), log.held()), (3, 2));
            let s = log.storage();
            assert_eq!(s.first_index().unwrap(), 4);
            assert_eq!(
                s.term(3).unwrap(),
                1,
                "the last dropped entry's term is kept"
            );
            assert_eq!(s.initial_state().unwrap().hard_state, hs);
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        let s = log.storage();
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (4, 5));
        assert_eq!(s.term(3).unwrap(), 1);
        assert_eq!(s.term(5).unwrap(), 2);
        assert_eq!(s.initial_state().unwrap().hard_state.commit, 4);
        assert_eq!(log.wants_state(), None);
    }

    #[test]
    fn a_snapshot_empties_the_log_and_the_journal_wants_a_state_until_taken() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
            log.append(&[entry(1, 1, b"a")], None).unwrap();
            let snap = log.snapshot_of(9, 3);
            log.apply_snapshot(&snap).unwrap();
            assert_eq!(log.wants_state(), Some(9));
        }
        let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        assert_eq!(log.wants_state(), Some(9), "it survives a restart");
        let s = log.storage();
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (10, 9));
        assert_eq!(log.committed(), 9);
        log.state_taken().unwrap();
        drop(log);
        assert_eq!(
            DurableLog::open(&dir, vec![1, 2, 3], false)
                .unwrap()
                .wants_state(),
            None
        );
    }

    #[test]
    fn a_new_leaders_entries_replace_the_old_tail_on_disk_too() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
            log.append(
                &[entry(1, 1, b"a"), entry(2, 1, b"old"), entry(3, 1, b"old")],
                None,
            )
            .unwrap();
            log.append(&[entry(2, 2, b"new")], None).unwrap();
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        let s = log.storage();
        assert_eq!(s.last_index().unwrap(), 2);
        assert_eq!(s.term(2).unwrap(), 2);
    }

    #[test]
    fn a_log_of_the_old_format_moves_into_the_new_file_whole() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        // What the redb log held: entries 4 and 5 (3 dropped, of term 1), a vote and an
        // applied index.
        {
            const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
            const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
            let db = Database::create(tmp.path().join(LEGACY_LOG_FILE)).unwrap();
            let w = db.begin_write().unwrap();
            {
                let mut t = w.open_table(ENTRIES).unwrap();
                for e in [entry(4, 1, b"four"), entry(5, 2, b"five")] {
                    t.insert(e.index, e.write_to_bytes().unwrap().as_slice())
                        .unwrap();
                }
                let mut m = w.open_table(META).unwrap();
                let mut pos = [0u8; 16];
                pos[..8].copy_from_slice(&3u64.to_le_bytes());
                pos[8..].copy_from_slice(&1u64.to_le_bytes());
                m.insert("compacted", pos.as_slice()).unwrap();
                let hs = hs(2, 3, 5);
                m.insert("hard_state", hs.write_to_bytes().unwrap().as_slice())
                    .unwrap();
                m.insert("applied", 4u64.to_le_bytes().as_slice()).unwrap();
            }
            w.commit().unwrap();
        }
        for reopen in [false, true] {
            if reopen {
                // A crash between the rename and the removal leaves both files.
                std::fs::write(tmp.path().join(LEGACY_LOG_FILE), b"stale").unwrap();
            }
            let log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
            assert!(!dir.contains(LEGACY_LOG_FILE), "the old file is gone");
            let s = log.storage();
            let state = s.initial_state().unwrap().hard_state;
            assert_eq!(
                (state.term, state.vote, state.commit),
                (2, 3, 5),
                "{reopen}"
            );
            assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (4, 5));
            assert_eq!(s.term(3).unwrap(), 1);
            let got = s
                .entries(4, 6, None, raft::GetEntriesContext::empty(false))
                .unwrap();
            assert_eq!(got[1].data.as_ref(), b"five");
            assert_eq!(log.applied(), 4);
        }
    }

    #[test]
    fn entries_that_would_leave_a_gap_are_refused_not_a_panic() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let mut log = DurableLog::open(&dir, vec![1, 2, 3], false).unwrap();
        log.append(&[entry(1, 1, b"a")], None).unwrap();
        let err = log.append(&[entry(3, 1, b"c")], None).unwrap_err();
        assert!(err.to_string().contains("entries from 3"), "{err}");
        // Nor does a file that says so panic when it is read back.
        let records = vec![
            Record::Entries {
                entries: vec![entry(1, 1, b"a")],
                hard: None,
            },
            Record::Entries {
                entries: vec![entry(3, 1, b"c")],
                hard: None,
            },
        ];
        assert!(Replayed::of(records).unwrap_err().contains("from 3"));
    }
}
