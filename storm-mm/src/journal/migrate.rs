//! Journals of the previous format, read once and written again in this one.
//!
//! Format 13's job records are this format's but for a started job's `launched_to` (the NM
//! process each node's launch went to), which format 14 added. A record of format 13 comes
//! over with none: after the restart that upgrades the MM, a node that lacks such a job is
//! counted as having lost it (the job ends, or is requeued with `--requeue`), never as one
//! the launch missed, since no record says which NM process the launch went to. Nothing else
//! changed, so every other record reads as it is.

use serde::Deserialize;
use storm_cluster::control::{JobOutcome, JobRequest};
use storm_cluster::messages::JobId;
use storm_primitives::NodeSet;

use super::{JobRecord, JobState};

/// The format this module reads.
pub(super) const FROM: u64 = 13;

/// A job record as format 13 wrote it.
#[derive(Deserialize)]
struct JobRecord13 {
    id: JobId,
    uid: u32,
    gid: u32,
    req: JobRequest,
    submitted_ms: u64,
    state: JobState13,
}

/// [`JobState`] as format 13 wrote it: the same variants, in the same order.
#[derive(Deserialize)]
enum JobState13 {
    Queued,
    Started {
        nodes: NodeSet,
        cpus: Option<NodeSet>,
        slot: u32,
        time_slot: u32,
        launched_ms: Option<u64>,
        program_hash: Option<[u8; 32]>,
    },
    Finished {
        nodes: NodeSet,
        outcome: JobOutcome,
        ended_ms: u64,
    },
}

/// A job record of format 13, as this format holds it; the error says why it does not decode.
pub(super) fn job_from_13(bytes: &[u8]) -> Result<JobRecord, String> {
    let (old, _) =
        storm_primitives::codec::decode::<JobRecord13>(bytes).map_err(|e| e.to_string())?;
    let state = match old.state {
        JobState13::Queued => JobState::Queued,
        JobState13::Started {
            nodes,
            cpus,
            slot,
            time_slot,
            launched_ms,
            program_hash,
        } => JobState::Started {
            nodes,
            cpus,
            slot,
            time_slot,
            launched_ms,
            launched_to: Vec::new(),
            program_hash,
        },
        JobState13::Finished {
            nodes,
            outcome,
            ended_ms,
        } => JobState::Finished {
            nodes,
            outcome,
            ended_ms,
        },
    };
    Ok(JobRecord {
        id: old.id,
        uid: old.uid,
        gid: old.gid,
        req: old.req,
        submitted_ms: old.submitted_ms,
        state,
    })
}

#[cfg(test)]
mod tests {
    use redb::{Database, ReadableDatabase};
    use serde::Serialize;

    use super::*;
    use crate::journal::tests::{finished, job};
    use crate::journal::{FORMAT, JOBS, Journal, META};

    /// A record as format 13 wrote it (this module only ever reads one otherwise).
    #[derive(Serialize)]
    struct Written13<'a> {
        id: JobId,
        uid: u32,
        gid: u32,
        req: &'a JobRequest,
        submitted_ms: u64,
        state: State13<'a>,
    }

    #[derive(Serialize)]
    enum State13<'a> {
        Queued,
        Started {
            nodes: &'a NodeSet,
            cpus: &'a Option<NodeSet>,
            slot: u32,
            time_slot: u32,
            launched_ms: Option<u64>,
            program_hash: Option<[u8; 32]>,
        },
        Finished {
            nodes: &'a NodeSet,
            outcome: &'a JobOutcome,
            ended_ms: u64,
        },
    }

    fn written_13(rec: &JobRecord) -> Vec<u8> {
        let state = match &rec.state {
            JobState::Queued => State13::Queued,
            JobState::Started {
                nodes,
                cpus,
                slot,
                time_slot,
                launched_ms,
                program_hash,
                ..
            } => State13::Started {
                nodes,
                cpus,
                slot: *slot,
                time_slot: *time_slot,
                launched_ms: *launched_ms,
                program_hash: *program_hash,
            },
            JobState::Finished {
                nodes,
                outcome,
                ended_ms,
            } => State13::Finished {
                nodes,
                outcome,
                ended_ms: *ended_ms,
            },
        };
        let old = Written13 {
            id: rec.id,
            uid: rec.uid,
            gid: rec.gid,
            req: &rec.req,
            submitted_ms: rec.submitted_ms,
            state,
        };
        bincode::serde::encode_to_vec(&old, bincode::config::standard()).unwrap()
    }

    /// An MM upgraded over a journal of format 13 finds every job in it: queued, started
    /// (with no NM process named for its launch: a node that lacks it has lost it) and
    /// finished; the journal is of this format from then on, and opens again as it is.
    #[test]
    fn a_journal_of_format_13_is_read_and_rewritten_in_this_format() {
        let dir = tempfile::tempdir().unwrap();
        let started = job(
            2,
            JobState::Started {
                nodes: "0-1".parse().unwrap(),
                cpus: None,
                slot: 3,
                time_slot: 1,
                launched_ms: Some(1_700_000_000_000),
                launched_to: vec![],
                program_hash: Some([7; 32]),
            },
        );
        let records = vec![job(1, JobState::Queued), started, finished(3)];
        {
            drop(Journal::open(dir.path()).unwrap());
            let db = Database::create(dir.path().join("journal.redb")).unwrap();
            let w = db.begin_write().unwrap();
            {
                let mut meta = w.open_table(META).unwrap();
                meta.insert("format", FROM).unwrap();
                meta.insert("next_job", 4).unwrap();
                let mut jobs = w.open_table(JOBS).unwrap();
                for rec in &records {
                    jobs.insert(rec.id, written_13(rec).as_slice()).unwrap();
                }
            }
            w.commit().unwrap();
        }
        let (journal, restored) = Journal::open(dir.path()).expect("format 13 is read");
        drop(journal);
        assert_eq!(restored.jobs, records);
        assert_eq!(restored.next_job, 4);
        {
            let db = Database::create(dir.path().join("journal.redb")).unwrap();
            let r = db.begin_read().unwrap();
            let format = r.open_table(META).unwrap().get("format").unwrap().unwrap();
            assert_eq!(format.value(), FORMAT, "rewritten in this format");
        }
        let (_, again) = Journal::open(dir.path()).expect("opens again as it is");
        assert_eq!(again.jobs, records);
    }

    /// A record of format 13 that does not decode stops the upgrade with the record named,
    /// and the journal is left as it was (still format 13) for the operator to look at.
    #[test]
    fn an_unreadable_record_of_format_13_is_named_and_nothing_is_rewritten() {
        let dir = tempfile::tempdir().unwrap();
        {
            drop(Journal::open(dir.path()).unwrap());
            let db = Database::create(dir.path().join("journal.redb")).unwrap();
            let w = db.begin_write().unwrap();
            {
                w.open_table(META).unwrap().insert("format", FROM).unwrap();
                let mut jobs = w.open_table(JOBS).unwrap();
                jobs.insert(1, written_13(&job(1, JobState::Queued)).as_slice())
                    .unwrap();
                jobs.insert(5, [0xffu8; 5].as_slice()).unwrap();
            }
            w.commit().unwrap();
        }
        let err = Journal::open(dir.path())
            .err()
            .expect("refused")
            .to_string();
        assert!(err.contains("job 5 (format 13)"), "{err}");
        let db = Database::create(dir.path().join("journal.redb")).unwrap();
        let r = db.begin_read().unwrap();
        let format = r.open_table(META).unwrap().get("format").unwrap().unwrap();
        assert_eq!(format.value(), FROM, "nothing was rewritten");
    }
}
