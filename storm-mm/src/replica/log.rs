//! A replica's Raft log on disk: `raft.redb` beside the journal, in the state directory.
//!
//! raft-rs asks for a [`raft::Storage`]; this serves it from raft-rs's own [`MemStorage`]
//! and writes every change there first to a redb database, so that what a replica told its
//! peers (its vote, its term, the entries it acknowledged) survives a crash, as Raft requires.
//! On start the database is read back into memory.
//!
//! The log is never compacted yet: a replica that was away, or a new one that replaces a lost
//! disk, catches up by taking every entry from the leader (docs/operations.md).

use std::path::PathBuf;

use protobuf::Message as _;
use raft::eraftpb::{ConfState, Entry, HardState};
use raft::storage::MemStorage;
use redb::{Database, ReadableDatabase, ReadableTable, TableDefinition};
use storm_cluster::daemon_dir::DaemonDir;

use super::ReplicaError;

const ENTRIES: TableDefinition<u64, &[u8]> = TableDefinition::new("entries");
const META: TableDefinition<&str, &[u8]> = TableDefinition::new("meta");
const HARD_STATE: &str = "hard_state";
const APPLIED: &str = "applied";

/// The log's file in the state directory.
pub const LOG_FILE: &str = "raft.redb";

/// The durable log, and its copy in memory that raft-rs reads.
pub struct DurableLog {
    db: Database,
    path: PathBuf,
    mem: MemStorage,
    applied: u64,
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
        let mem = MemStorage::new_with_conf_state(ConfState::from((voters, vec![])));
        let mut log = Self {
            db,
            path,
            mem,
            applied: 0,
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
        let mut core = self.mem.wl();
        core.append(&loaded).map_err(|e| self.error(e))?;
        if let Some(hs) = hard {
            core.set_hardstate(hs);
        }
        // What was applied was committed.
        self.applied = self.applied.min(core.hard_state().commit);
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
        let w = self.db.begin_write().map_err(|e| self.error(e))?;
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
