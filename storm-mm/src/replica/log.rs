//! A replica's Raft log on disk: `raft.redb` beside the journal, in the state directory.
//!
//! raft-rs asks for a [`raft::Storage`]; this serves it from raft-rs's own [`MemStorage`]
//! and writes every change there first to a redb database, so that what a replica told its
//! peers (its vote, its term, the entries it acknowledged) survives a crash, as Raft requires.
//! On start the database is read back into memory.
//!
//! The log is compacted once it holds twice `[replication] log_entries_kept` entries that the
//! journal holds durably: the oldest are dropped, and the log records the last one dropped
//! (its index and term, as a Raft snapshot's metadata). A replica that lacks entries the
//! leader dropped (it was away, or replaces a lost disk) gets a Raft snapshot of that
//! metadata only ([`DurableLog::apply_snapshot`]); the log then records that its journal
//! wants a state ([`DurableLog::wants_state`]) until it took the leader's (`super::resync`).

use std::path::PathBuf;

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState, Snapshot, SnapshotMetadata};
use raft::storage::MemStorage;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use storm_cluster::daemon_dir::DaemonDir;

use super::ReplicaError;

const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const HARD_STATE: &str = "hard_state";
const APPLIED: &str = "applied";
/// The last entry dropped: index and term.
const COMPACTED: &str = "compacted";
/// The entry as of which the journal wants another replica's state.
const WANTS_STATE: &str = "wants_state";

/// The log's file in the state directory.
pub const LOG_FILE: &str = "raft.redb";

/// How [`COMPACTED`] holds the last entry dropped: its index, then its term.
fn position(index: u64, term: u64) -> [u8; 16] {
    let mut pos = [0; 16];
    pos[..8].copy_from_slice(&index.to_le_bytes());
    pos[8..].copy_from_slice(&term.to_le_bytes());
    pos
}

/// The durable log, and its copy in memory that raft-rs reads.
pub struct DurableLog {
    db: Database,
    path: PathBuf,
    mem: MemStorage,
    applied: u64,
    voters: Vec<u64>,
    wants_state: Option<u64>,
    /// Whether appends are synced to disk (off only with `[replication] unsafe_no_log_sync`).
    sync: bool,
}

impl DurableLog {
    /// Opens (or creates) the log in `dir`. A new log starts with `voters` as the group.
    pub fn open(dir: &DaemonDir, voters: Vec<u64>) -> Result<Self, ReplicaError> {
        let path = dir.join(LOG_FILE);
        let err = |m: String| ReplicaError::Log {
            path: path.clone(),
            message: m,
        };
        if !dir.contains(LOG_FILE) {
            dir.create_file(LOG_FILE)
                .map_err(|e| err(format!("cannot create it: {e}")))?;
        }
        let db = Database::create(dir.via_descriptor(LOG_FILE)).map_err(|e| err(e.to_string()))?;
        let mem = MemStorage::new_with_conf_state(ConfState::from((voters.clone(), vec![])));
        let mut log = Self {
            db,
            path,
            mem,
            applied: 0,
            voters,
            wants_state: None,
            sync: true,
        };
        log.load()?;
        Ok(log)
    }

    fn error(&self, e: impl std::fmt::Display) -> ReplicaError {
        ReplicaError::Log {
            path: self.path.clone(),
            message: e.to_string(),
        }
    }

    /// Reads what the database holds into memory.
    fn load(&mut self) -> Result<(), ReplicaError> {
        let w = self.db.begin_write().map_err(|e| self.error(e))?;
        w.open_table(ENTRIES).map_err(|e| self.error(e))?;
        w.open_table(META).map_err(|e| self.error(e))?;
        w.commit().map_err(|e| self.error(e))?;
        let r = self.db.begin_read().map_err(|e| self.error(e))?;
        let entries = r.open_table(ENTRIES).map_err(|e| self.error(e))?;
        let mut loaded = Vec::new();
        for row in entries.iter().map_err(|e| self.error(e))? {
            let (k, v) = row.map_err(|e| self.error(e))?;
            let entry = Entry::parse_from_bytes(v.value())
                .map_err(|e| self.error(format!("entry {}: {e}", k.value())))?;
            loaded.push(entry);
        }
        let meta = r.open_table(META).map_err(|e| self.error(e))?;
        let hard = match meta.get(HARD_STATE).map_err(|e| self.error(e))? {
            Some(v) => Some(
                HardState::parse_from_bytes(v.value())
                    .map_err(|e| self.error(format!("hard state: {e}")))?,
            ),
            None => None,
        };
        if let Some(v) = meta.get(APPLIED).map_err(|e| self.error(e))? {
            let bytes: [u8; 8] = v
                .value()
                .try_into()
                .map_err(|_| self.error("applied index: not 8 bytes"))?;
            self.applied = u64::from_le_bytes(bytes);
        }
        let word = |v: &[u8], i: usize| -> Result<u64, ReplicaError> {
            v.get(i * 8..i * 8 + 8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_le_bytes)
                .ok_or_else(|| self.error("a log position is cut short"))
        };
        let compacted = match meta.get(COMPACTED).map_err(|e| self.error(e))? {
            Some(v) => Some((word(v.value(), 0)?, word(v.value(), 1)?)),
            None => None,
        };
        if let Some(v) = meta.get(WANTS_STATE).map_err(|e| self.error(e))? {
            self.wants_state = Some(word(v.value(), 0)?);
        }
        let mut core = self.mem.wl();
        if let Some((index, term)) = compacted {
            core.apply_snapshot(self.snapshot_of(index, term))
                .map_err(|e| self.error(e))?;
        }
        core.append(&loaded).map_err(|e| self.error(e))?;
        if let Some(hs) = hard {
            core.set_hardstate(hs);
        }
        // What was applied was committed.
        self.applied = self.applied.min(core.hard_state().commit);
        Ok(())
    }

    /// A snapshot that holds only the position of entry `index` of `term`.
    fn snapshot_of(&self, index: u64, term: u64) -> Snapshot {
        let mut meta = SnapshotMetadata {
            index,
            term,
            ..Default::default()
        };
        meta.set_conf_state(ConfState::from((self.voters.clone(), vec![])));
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
        let w = self.db.begin_write().map_err(|e| self.error(e))?;
        {
            let mut table = w.open_table(ENTRIES).map_err(|e| self.error(e))?;
            table
                .retain_in(..=upto, |_, _| false)
                .map_err(|e| self.error(e))?;
            let mut meta = w.open_table(META).map_err(|e| self.error(e))?;
            meta.insert(COMPACTED, position(upto, term).as_slice())
                .map_err(|e| self.error(e))?;
        }
        w.commit().map_err(|e| self.error(e))?;
        // raft-rs's memory log drops a prefix only with a snapshot's position, which also
        // clears it and its commit index: the rest goes back in, and the hard state with it.
        let mut core = self.mem.wl();
        let hard = core.hard_state().clone();
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
        let w = self.db.begin_write().map_err(|e| self.error(e))?;
        {
            let mut table = w.open_table(ENTRIES).map_err(|e| self.error(e))?;
            table.retain(|_, _| false).map_err(|e| self.error(e))?;
            let mut meta = w.open_table(META).map_err(|e| self.error(e))?;
            meta.insert(COMPACTED, position(index, term).as_slice())
                .map_err(|e| self.error(e))?;
            meta.insert(WANTS_STATE, index.to_le_bytes().as_slice())
                .map_err(|e| self.error(e))?;
            let bytes = hard.write_to_bytes().map_err(|e| self.error(e))?;
            meta.insert(HARD_STATE, bytes.as_slice())
                .map_err(|e| self.error(e))?;
        }
        w.commit().map_err(|e| self.error(e))?;
        self.mem
            .wl()
            .apply_snapshot(snap.clone())
            .map_err(|e| self.error(e))?;
        self.wants_state = Some(index);
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
        let w = self.db.begin_write().map_err(|e| self.error(e))?;
        {
            let mut meta = w.open_table(META).map_err(|e| self.error(e))?;
            meta.remove(WANTS_STATE).map_err(|e| self.error(e))?;
        }
        w.commit().map_err(|e| self.error(e))?;
        self.wants_state = None;
        Ok(())
    }

    /// What raft-rs reads.
    pub fn storage(&self) -> MemStorage {
        self.mem.clone()
    }

    /// Index of the last entry applied to the journal, as last recorded.
    pub fn applied(&self) -> u64 {
        self.applied
    }

    /// The commit index, as last recorded.
    pub fn committed(&self) -> u64 {
        self.mem.rl().hard_state().commit
    }

    /// Writes `entries` (replacing any from the first one's index on) and the hard state, in
    /// one durable transaction, then into memory.
    pub fn append(
        &mut self,
        entries: &[Entry],
        hard: Option<&HardState>,
    ) -> Result<(), ReplicaError> {
        if entries.is_empty() && hard.is_none() {
            return Ok(());
        }
        if let Some(hs) = hard
            && entries.is_empty()
            && self.only_commit_differs(hs)
        {
            // A follower learns each new commit index in a message of its own (the leader
            // tells it as soon as a majority has an entry): writing it down would cost a
            // synced transaction per batch for nothing Raft needs, as a lost commit index is
            // learnt again from the leader. It goes to disk with the next vote, entries or
            // applied index.
            self.set_commit(hs.commit);
            return Ok(());
        }
        let mut w = self.db.begin_write().map_err(|e| self.error(e))?;
        if !self.sync {
            w.set_durability(redb::Durability::None)
                .map_err(|e| self.error(e))?;
        }
        {
            let mut table = w.open_table(ENTRIES).map_err(|e| self.error(e))?;
            if let Some(first) = entries.first() {
                // A new leader's entries replace a tail this replica had from an old one.
                table
                    .retain_in(first.index.., |_, _| false)
                    .map_err(|e| self.error(e))?;
            }
            for e in entries {
                let bytes = e.write_to_bytes().map_err(|e| self.error(e))?;
                table
                    .insert(e.index, bytes.as_slice())
                    .map_err(|e| self.error(e))?;
            }
            if let Some(hs) = hard {
                let bytes = hs.write_to_bytes().map_err(|e| self.error(e))?;
                let mut meta = w.open_table(META).map_err(|e| self.error(e))?;
                meta.insert(HARD_STATE, bytes.as_slice())
                    .map_err(|e| self.error(e))?;
            }
        }
        w.commit().map_err(|e| self.error(e))?;
        let mut core = self.mem.wl();
        core.append(entries).map_err(|e| self.error(e))?;
        if let Some(hs) = hard {
            core.set_hardstate(hs.clone());
        }
        Ok(())
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
        let w = self.db.begin_write().map_err(|e| self.error(e))?;
        {
            let mut meta = w.open_table(META).map_err(|e| self.error(e))?;
            meta.insert(APPLIED, index.to_le_bytes().as_slice())
                .map_err(|e| self.error(e))?;
            let bytes = hard.write_to_bytes().map_err(|e| self.error(e))?;
            meta.insert(HARD_STATE, bytes.as_slice())
                .map_err(|e| self.error(e))?;
        }
        w.commit().map_err(|e| self.error(e))?;
        self.applied = index;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use raft::Storage;

    fn entry(index: u64, term: u64, data: &[u8]) -> Entry {
        Entry {
            index,
            term,
            data: data.to_vec().into(),
            ..Default::default()
        }
    }

    #[test]
    fn entries_hard_state_and_applied_index_survive_a_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
            let hs = HardState {
                term: 2,
                vote: 3,
                commit: 2,
                ..Default::default()
            };
            log.append(&[entry(1, 1, b"a"), entry(2, 2, b"b")], Some(&hs))
                .unwrap();
            log.set_applied(2).unwrap();
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
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

    #[test]
    fn a_vote_is_durable_at_once_and_a_commit_index_alone_is_learnt_again() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let hs = |term, vote, commit| HardState {
            term,
            vote,
            commit,
            ..Default::default()
        };
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
            log.append(&[entry(1, 1, b"a"), entry(2, 1, b"b")], Some(&hs(1, 2, 1)))
                .unwrap();
            // A new commit index alone: raft-rs reads it at once.
            log.append(&[], Some(&hs(1, 2, 2))).unwrap();
            assert_eq!(log.storage().initial_state().unwrap().hard_state.commit, 2);
            // A vote in a new term, without entries: on disk before it is sent.
            log.append(&[], Some(&hs(2, 3, 2))).unwrap();
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
        let state = log.storage().initial_state().unwrap().hard_state;
        assert_eq!((state.term, state.vote), (2, 3), "the vote survives");
        assert_eq!(state.commit, 2, "written with the vote");
        assert!(log.applied() <= state.commit);
    }

    #[test]
    fn an_applied_index_is_never_above_the_commit_index_read_back() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let hs = |commit| HardState {
            term: 1,
            vote: 1,
            commit,
            ..Default::default()
        };
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
            log.append(&[entry(1, 1, b"a"), entry(2, 1, b"b")], Some(&hs(1)))
                .unwrap();
            log.append(&[], Some(&hs(2))).unwrap();
            // The checkpoint records the applied index with the commit index in memory.
            log.set_applied(2).unwrap();
            log.append(&[entry(3, 1, b"c")], None).unwrap();
            log.append(&[], Some(&hs(3))).unwrap();
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
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

    #[test]
    fn a_compacted_log_keeps_its_tail_and_position_across_a_reopen() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        let hs = HardState {
            term: 2,
            vote: 1,
            commit: 4,
            ..Default::default()
        };
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
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
        let log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
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
            let mut log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
            log.append(&[entry(1, 1, b"a")], None).unwrap();
            let snap = log.snapshot_of(9, 3);
            log.apply_snapshot(&snap).unwrap();
            assert_eq!(log.wants_state(), Some(9));
        }
        let mut log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
        assert_eq!(log.wants_state(), Some(9), "it survives a restart");
        let s = log.storage();
        assert_eq!((s.first_index().unwrap(), s.last_index().unwrap()), (10, 9));
        assert_eq!(log.committed(), 9);
        log.state_taken().unwrap();
        drop(log);
        assert_eq!(
            DurableLog::open(&dir, vec![1, 2, 3]).unwrap().wants_state(),
            None
        );
    }

    #[test]
    fn a_new_leaders_entries_replace_the_old_tail_on_disk_too() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = DaemonDir::open_or_create(tmp.path(), 0o700).unwrap();
        {
            let mut log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
            log.append(
                &[entry(1, 1, b"a"), entry(2, 1, b"old"), entry(3, 1, b"old")],
                None,
            )
            .unwrap();
            log.append(&[entry(2, 2, b"new")], None).unwrap();
        }
        let log = DurableLog::open(&dir, vec![1, 2, 3]).unwrap();
        let s = log.storage();
        assert_eq!(s.last_index().unwrap(), 2);
        assert_eq!(s.term(2).unwrap(), 2);
    }
}
