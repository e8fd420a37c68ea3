//! Journals of the previous formats, read once and written again in this one.
//!
//! * **Format 16** is this format but for the job request and the node record: format 17
//!   added whether a job may run on borrowed nodes (`borrow`, `--borrow`) and whether a node
//!   is lent to a peer (`lent`). A job of format 16 comes over running on its own cluster's
//!   nodes only, and a node as not lent, as they were: no earlier storm lent nodes. Node
//!   records of every older format are format 16's.
//! * **Format 15** is this format but for the job request: format 16 added where it may run
//!   (`flock`: `--flock`, `--clusters`, `--no-flock`). A job of format 15 comes over asking
//!   for the default (at home, flocking only after `[federation] flock_after_ms`), as it was
//!   submitted before a cluster could flock.
//! * **Format 14** is format 15 but for the job request: format 15 added its memory
//!   (`--mem`, `--mem-per-cpu`) and features (`--constraint`). A job of format 14 comes over
//!   asking for neither, as it was submitted.
//! * **Format 13** is format 14 but for a started job's `launched_to` (the NM process each
//!   node's launch went to). A record of format 13 comes over with none: after the restart
//!   that upgrades the MM, a node that lacks such a job is counted as having lost it (the job
//!   ends, or is requeued with `--requeue`), never as one the launch missed, since no record
//!   says which NM process the launch went to.
//!
//! Nothing else changed, so every other record reads as it is.

use std::ffi::OsString;
use std::path::PathBuf;

use serde::Deserialize;
use storm_cluster::control::{
    ArrayElement, ArraySpec, Delivery, JobOutcome, JobRequest, MemRequest,
};
use storm_cluster::dependency::Dependency;
use storm_cluster::messages::{BatchOutput, InputTarget, JobId, MpiMode};
use storm_cluster::tasks::TaskRequest;
use storm_primitives::NodeSet;

use super::{JobRecord, JobState, NodeRecord};

/// The formats this module reads.
pub(super) const READS: [u64; 4] = [13, 14, 15, 16];

/// A job request as formats 13 and 14 wrote it (the tests write one, too).
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct JobRequest14 {
    name: String,
    #[serde(with = "storm_cluster::os_bytes::path")]
    program: PathBuf,
    args: Vec<OsString>,
    env: Vec<(OsString, OsString)>,
    #[serde(with = "storm_cluster::os_bytes::path")]
    cwd: PathBuf,
    tasks: TaskRequest,
    delivery: Delivery,
    time_limit_ms: Option<u64>,
    requeue: bool,
    mpi: MpiMode,
    input: InputTarget,
    dependency: Option<Dependency>,
    batch: Option<BatchOutput>,
    step_of: Option<JobId>,
    array: Option<ArraySpec>,
    element: Option<ArrayElement>,
    token: Option<u64>,
}

/// A job request as format 15 wrote it: format 14's, then its memory and features (bincode
/// writes a struct's fields one after the other, so the nested struct reads the same bytes).
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct JobRequest15 {
    head: JobRequest14,
    mem: Option<MemRequest>,
    constraint: Vec<String>,
}

impl From<JobRequest15> for JobRequest {
    fn from(r: JobRequest15) -> Self {
        JobRequest {
            mem: r.mem,
            constraint: r.constraint,
            ..r.head.into()
        }
    }
}

/// A job request as format 16 wrote it: format 15's, then where it may run.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct JobRequest16 {
    head: JobRequest15,
    flock: storm_cluster::flock::Flock,
}

impl From<JobRequest16> for JobRequest {
    fn from(r: JobRequest16) -> Self {
        JobRequest {
            flock: r.flock,
            ..r.head.into()
        }
    }
}

/// A job record as format 16 wrote it.
#[derive(Deserialize)]
struct JobRecord16 {
    id: JobId,
    uid: u32,
    gid: u32,
    req: JobRequest16,
    submitted_ms: u64,
    state: JobState,
}

/// A node record as formats 16 and older wrote it.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct NodeRecord16 {
    drain: Option<String>,
}

/// A node record of a format of [`READS`], as this format holds it.
pub(super) fn node_from(bytes: &[u8]) -> Result<NodeRecord, String> {
    let (old, _) =
        storm_primitives::codec::decode::<NodeRecord16>(bytes).map_err(|e| e.to_string())?;
    Ok(NodeRecord {
        drain: old.drain,
        lent: None,
    })
}

/// A job record as format 15 wrote it.
#[derive(Deserialize)]
struct JobRecord15 {
    id: JobId,
    uid: u32,
    gid: u32,
    req: JobRequest15,
    submitted_ms: u64,
    state: JobState,
}

impl From<JobRequest14> for JobRequest {
    fn from(r: JobRequest14) -> Self {
        JobRequest {
            name: r.name,
            program: r.program,
            args: r.args,
            env: r.env,
            cwd: r.cwd,
            tasks: r.tasks,
            delivery: r.delivery,
            time_limit_ms: r.time_limit_ms,
            requeue: r.requeue,
            mpi: r.mpi,
            input: r.input,
            dependency: r.dependency,
            batch: r.batch,
            step_of: r.step_of,
            array: r.array,
            element: r.element,
            token: r.token,
            mem: None,
            constraint: Vec::new(),
            flock: Default::default(),
            borrow: false,
        }
    }
}

/// A job record as format 14 wrote it.
#[derive(Deserialize)]
struct JobRecord14 {
    id: JobId,
    uid: u32,
    gid: u32,
    req: JobRequest14,
    submitted_ms: u64,
    state: JobState,
}

/// A job record as format 13 wrote it.
#[derive(Deserialize)]
struct JobRecord13 {
    id: JobId,
    uid: u32,
    gid: u32,
    req: JobRequest14,
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

/// A job record of `format` (one of [`READS`]), as this format holds it; the error says why
/// it does not decode.
pub(super) fn job_from(format: u64, bytes: &[u8]) -> Result<JobRecord, String> {
    if format == 16 {
        let (old, _) =
            storm_primitives::codec::decode::<JobRecord16>(bytes).map_err(|e| e.to_string())?;
        return Ok(JobRecord {
            id: old.id,
            uid: old.uid,
            gid: old.gid,
            req: old.req.into(),
            submitted_ms: old.submitted_ms,
            state: old.state,
        });
    }
    if format == 15 {
        let (old, _) =
            storm_primitives::codec::decode::<JobRecord15>(bytes).map_err(|e| e.to_string())?;
        return Ok(JobRecord {
            id: old.id,
            uid: old.uid,
            gid: old.gid,
            req: old.req.into(),
            submitted_ms: old.submitted_ms,
            state: old.state,
        });
    }
    if format == 14 {
        let (old, _) =
            storm_primitives::codec::decode::<JobRecord14>(bytes).map_err(|e| e.to_string())?;
        return Ok(JobRecord {
            id: old.id,
            uid: old.uid,
            gid: old.gid,
            req: old.req.into(),
            submitted_ms: old.submitted_ms,
            state: old.state,
        });
    }
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
        req: old.req.into(),
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

    /// `r` as formats 13 and 14 wrote it (it must ask for no memory and no features, which
    /// they could not hold).
    fn request_14(r: &JobRequest) -> JobRequest14 {
        assert!(r.mem.is_none() && r.constraint.is_empty());
        assert_eq!(r.flock, Default::default());
        let r = r.clone();
        JobRequest14 {
            name: r.name,
            program: r.program,
            args: r.args,
            env: r.env,
            cwd: r.cwd,
            tasks: r.tasks,
            delivery: r.delivery,
            time_limit_ms: r.time_limit_ms,
            requeue: r.requeue,
            mpi: r.mpi,
            input: r.input,
            dependency: r.dependency,
            batch: r.batch,
            step_of: r.step_of,
            array: r.array,
            element: r.element,
            token: r.token,
        }
    }

    /// A record as format 16 wrote it.
    #[derive(Serialize)]
    struct Written16<'a> {
        id: JobId,
        uid: u32,
        gid: u32,
        req: JobRequest16,
        submitted_ms: u64,
        state: &'a JobState,
    }

    fn written_16(rec: &JobRecord) -> Vec<u8> {
        assert!(!rec.req.borrow, "format 16 could not borrow");
        let r = &rec.req;
        let old = Written16 {
            id: rec.id,
            uid: rec.uid,
            gid: rec.gid,
            req: JobRequest16 {
                head: JobRequest15 {
                    head: request_14(&JobRequest {
                        mem: None,
                        constraint: Vec::new(),
                        flock: Default::default(),
                        ..r.clone()
                    }),
                    mem: r.mem,
                    constraint: r.constraint.clone(),
                },
                flock: r.flock.clone(),
            },
            submitted_ms: rec.submitted_ms,
            state: &rec.state,
        };
        bincode::serde::encode_to_vec(&old, bincode::config::standard()).unwrap()
    }

    /// A record as format 15 wrote it.
    #[derive(Serialize)]
    struct Written15<'a> {
        id: JobId,
        uid: u32,
        gid: u32,
        req: JobRequest15,
        submitted_ms: u64,
        state: &'a JobState,
    }

    fn written_15(rec: &JobRecord) -> Vec<u8> {
        let old = Written15 {
            id: rec.id,
            uid: rec.uid,
            gid: rec.gid,
            req: JobRequest15 {
                head: request_14(&JobRequest {
                    mem: None,
                    constraint: Vec::new(),
                    ..rec.req.clone()
                }),
                mem: rec.req.mem,
                constraint: rec.req.constraint.clone(),
            },
            submitted_ms: rec.submitted_ms,
            state: &rec.state,
        };
        bincode::serde::encode_to_vec(&old, bincode::config::standard()).unwrap()
    }

    /// A record as format 14 wrote it.
    #[derive(Serialize)]
    struct Written14<'a> {
        id: JobId,
        uid: u32,
        gid: u32,
        req: JobRequest14,
        submitted_ms: u64,
        state: &'a JobState,
    }

    fn written_14(rec: &JobRecord) -> Vec<u8> {
        let old = Written14 {
            id: rec.id,
            uid: rec.uid,
            gid: rec.gid,
            req: request_14(&rec.req),
            submitted_ms: rec.submitted_ms,
            state: &rec.state,
        };
        bincode::serde::encode_to_vec(&old, bincode::config::standard()).unwrap()
    }

    /// A record as format 13 wrote it.
    #[derive(Serialize)]
    struct Written13<'a> {
        id: JobId,
        uid: u32,
        gid: u32,
        req: JobRequest14,
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
            JobState::Flocked { .. } => panic!("format 13 had no flocked jobs"),
        };
        let old = Written13 {
            id: rec.id,
            uid: rec.uid,
            gid: rec.gid,
            req: request_14(&rec.req),
            submitted_ms: rec.submitted_ms,
            state,
        };
        bincode::serde::encode_to_vec(&old, bincode::config::standard()).unwrap()
    }

    /// A journal of `format` written with `encode`, holding a queued, a started and a
    /// finished job, opened by this MM: every job is found, the journal is of this format
    /// from then on, and opens again as it is.
    fn upgrade_from(format: u64, encode: fn(&JobRecord) -> Vec<u8>) {
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
                meta.insert("format", format).unwrap();
                meta.insert("next_job", 4).unwrap();
                let mut jobs = w.open_table(JOBS).unwrap();
                for rec in &records {
                    jobs.insert(rec.id, encode(rec).as_slice()).unwrap();
                }
            }
            w.commit().unwrap();
        }
        let (journal, restored) = Journal::open(dir.path()).expect("the old format is read");
        drop(journal);
        assert_eq!(restored.jobs, records, "format {format}");
        assert_eq!(restored.next_job, 4);
        {
            let db = Database::create(dir.path().join("journal.redb")).unwrap();
            let r = db.begin_read().unwrap();
            let now = r.open_table(META).unwrap().get("format").unwrap().unwrap();
            assert_eq!(now.value(), FORMAT, "rewritten in this format");
        }
        let (_, again) = Journal::open(dir.path()).expect("opens again as it is");
        assert_eq!(again.jobs, records);
    }

    /// Format 13: a started job comes over with no NM process named for its launch (a node
    /// that lacks it has lost it), and every request asks for no memory and no features.
    #[test]
    fn a_journal_of_format_13_is_read_and_rewritten_in_this_format() {
        upgrade_from(13, written_13);
    }

    /// Format 16: requests come over with where they may run, running on their own
    /// cluster's nodes only.
    #[test]
    fn a_journal_of_format_16_is_read_and_rewritten_in_this_format() {
        upgrade_from(16, written_16);
    }

    /// A drained node of format 16 comes over drained, and lent to nobody.
    #[test]
    fn a_node_record_of_format_16_keeps_its_drain_and_is_not_lent() {
        let dir = tempfile::tempdir().unwrap();
        {
            drop(Journal::open(dir.path()).unwrap());
            let db = Database::create(dir.path().join("journal.redb")).unwrap();
            let w = db.begin_write().unwrap();
            {
                w.open_table(META).unwrap().insert("format", 16).unwrap();
                let old = NodeRecord16 {
                    drain: Some("bad fan".into()),
                };
                let bytes =
                    bincode::serde::encode_to_vec(&old, bincode::config::standard()).unwrap();
                w.open_table(crate::journal::NODES)
                    .unwrap()
                    .insert(3, bytes.as_slice())
                    .unwrap();
            }
            w.commit().unwrap();
        }
        let (journal, restored) = Journal::open(dir.path()).expect("format 16 is read");
        drop(journal);
        let want = NodeRecord {
            drain: Some("bad fan".into()),
            lent: None,
        };
        assert_eq!(restored.nodes.get(&3), Some(&want));
        let (_, again) = Journal::open(dir.path()).expect("opens again as it is");
        assert_eq!(again.nodes.get(&3), Some(&want), "rewritten in this format");
    }

    /// Format 15: requests come over with their memory and features, asking to run where
    /// the default says (at home, flocking only after `flock_after_ms`).
    #[test]
    fn a_journal_of_format_15_is_read_and_rewritten_in_this_format() {
        upgrade_from(15, written_15);
    }

    /// Format 14: requests come over asking for no memory and no features.
    #[test]
    fn a_journal_of_format_14_is_read_and_rewritten_in_this_format() {
        upgrade_from(14, written_14);
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
                w.open_table(META).unwrap().insert("format", 13).unwrap();
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
        assert_eq!(format.value(), 13, "nothing was rewritten");
    }
}
