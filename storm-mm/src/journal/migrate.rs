//! Journals of the previous formats, read once and written again in this one.
//!
//! * **Format 19** is this format but for the job request: format 20 added whether a rank's
//!   failure ends the job at once (`kill_on_bad_exit`, `--kill-on-bad-exit`), how long
//!   its ranks may outlive the first to end (`exit_wait_s`, `--wait`), and how they are
//!   bound to CPUs (`cpu_bind`, `--cpu-bind`). A job of format 19 comes over without them,
//!   as it was submitted (its ranks bound by the cluster's default). Format 18's jobs are format 19's.
//! * **Format 18** is format 19 but for the lease: format 19 added whether the owner calls
//!   a lent node home (`recall`). A lease of format 18 comes over not called home, as it was:
//!   no earlier storm called a node home with notice.
//! * **Format 17** is this format but for the job request and the lease: format 18 added
//!   whether a job may start on fewer nodes (`less`, `--less`) or must stay on one cluster
//!   (`one_cluster`, `--one-cluster`), and whether a lease was asked for by the peer
//!   (`asked`). A job of format 17 comes over asking for neither, and a lease as the
//!   operator's (`storm lend`), as they were: no earlier storm borrowed by itself.
//! * **Format 16** is this format but for the job request and the node record: format 17
//!   added whether a job may run on borrowed nodes (`borrow`, `--borrow`) and whether a node
//!   is lent to a peer (`lent`). A job of format 16 comes over running on its own cluster's
//!   nodes only, and a node as not lent, as they were: no earlier storm lent nodes. Node
//!   records of formats 13 to 15 are format 16's.
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
pub(super) const READS: [u64; 7] = [13, 14, 15, 16, 17, 18, 19];

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

/// A job request as format 17 wrote it: format 16's, then whether it may borrow.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct JobRequest17 {
    head: JobRequest16,
    borrow: bool,
}

impl From<JobRequest17> for JobRequest {
    fn from(r: JobRequest17) -> Self {
        JobRequest {
            borrow: r.borrow,
            ..r.head.into()
        }
    }
}

/// A job request as formats 18 and 19 wrote it: format 17's, then `less` and `one_cluster`.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct JobRequest19 {
    head: JobRequest17,
    less: bool,
    one_cluster: bool,
}

impl From<JobRequest19> for JobRequest {
    fn from(r: JobRequest19) -> Self {
        JobRequest {
            less: r.less,
            one_cluster: r.one_cluster,
            ..r.head.into()
        }
    }
}

/// A job record as formats 14 to 19 wrote it, with their request `R` (the state is this
/// format's: it last changed in format 14).
#[derive(Deserialize)]
struct JobRecordOf<R> {
    id: JobId,
    uid: u32,
    gid: u32,
    req: R,
    submitted_ms: u64,
    state: JobState,
}

impl<R: Into<JobRequest>> JobRecordOf<R> {
    fn read(bytes: &[u8]) -> Result<JobRecord, String>
    where
        R: serde::de::DeserializeOwned,
    {
        let (old, _) = storm_primitives::codec::decode::<Self>(bytes).map_err(|e| e.to_string())?;
        Ok(JobRecord {
            id: old.id,
            uid: old.uid,
            gid: old.gid,
            req: old.req.into(),
            submitted_ms: old.submitted_ms,
            state: old.state,
        })
    }
}

/// A node record as formats 13 to 16 wrote it.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct NodeRecord16 {
    drain: Option<String>,
}

/// A lease as format 17 wrote it: every lease was the operator's.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct Lease17 {
    peer: String,
    until_ms: u64,
}

/// A lease as format 18 wrote it: none was called home with notice.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct Lease18 {
    peer: String,
    until_ms: u64,
    asked: bool,
}

/// A node record as format 18 wrote it.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct NodeRecord18 {
    drain: Option<String>,
    lent: Option<Lease18>,
}

/// A node record as format 17 wrote it.
#[derive(Deserialize)]
#[cfg_attr(test, derive(serde::Serialize))]
struct NodeRecord17 {
    drain: Option<String>,
    lent: Option<Lease17>,
}

/// A node record of `format` (one of [`READS`]), as this format holds it.
pub(super) fn node_from(format: u64, bytes: &[u8]) -> Result<NodeRecord, String> {
    if format == 19 {
        // Format 19's node records are this format's: only its job requests differ.
        return storm_primitives::codec::decode::<NodeRecord>(bytes)
            .map(|(r, _)| r)
            .map_err(|e| e.to_string());
    }
    if format == 18 {
        let (old, _) =
            storm_primitives::codec::decode::<NodeRecord18>(bytes).map_err(|e| e.to_string())?;
        return Ok(NodeRecord {
            drain: old.drain,
            lent: old.lent.map(|l| storm_cluster::federation::Lease {
                peer: l.peer,
                until_ms: l.until_ms,
                asked: l.asked,
                recall: None,
            }),
        });
    }
    if format == 17 {
        let (old, _) =
            storm_primitives::codec::decode::<NodeRecord17>(bytes).map_err(|e| e.to_string())?;
        return Ok(NodeRecord {
            drain: old.drain,
            lent: old.lent.map(|l| storm_cluster::federation::Lease {
                peer: l.peer,
                until_ms: l.until_ms,
                asked: false,
                recall: None,
            }),
        });
    }
    let (old, _) =
        storm_primitives::codec::decode::<NodeRecord16>(bytes).map_err(|e| e.to_string())?;
    Ok(NodeRecord {
        drain: old.drain,
        lent: None,
    })
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
            less: false,
            one_cluster: false,
            kill_on_bad_exit: false,
            exit_wait_s: 0,
            cpu_bind: None,
        }
    }
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
    match format {
        // Format 18's jobs are format 19's: only its leases differ.
        18 | 19 => return JobRecordOf::<JobRequest19>::read(bytes),
        17 => return JobRecordOf::<JobRequest17>::read(bytes),
        16 => return JobRecordOf::<JobRequest16>::read(bytes),
        15 => return JobRecordOf::<JobRequest15>::read(bytes),
        14 => return JobRecordOf::<JobRequest14>::read(bytes),
        _ => {}
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

    /// A record as formats 14 to 17 wrote it, with their request `R`.
    #[derive(Serialize)]
    struct WrittenOf<'a, R> {
        id: JobId,
        uid: u32,
        gid: u32,
        req: R,
        submitted_ms: u64,
        state: &'a JobState,
    }

    fn encode<R: Serialize>(rec: &JobRecord, req: R) -> Vec<u8> {
        let old = WrittenOf {
            id: rec.id,
            uid: rec.uid,
            gid: rec.gid,
            req,
            submitted_ms: rec.submitted_ms,
            state: &rec.state,
        };
        bincode::serde::encode_to_vec(&old, bincode::config::standard()).unwrap()
    }

    /// `r` as format 15 wrote it (it must not say where it may run, nor borrow).
    fn request_15(r: &JobRequest) -> JobRequest15 {
        JobRequest15 {
            head: request_14(&JobRequest {
                mem: None,
                constraint: Vec::new(),
                ..r.clone()
            }),
            mem: r.mem,
            constraint: r.constraint.clone(),
        }
    }

    /// `r` as format 16 wrote it.
    fn request_16(r: &JobRequest) -> JobRequest16 {
        assert!(!r.borrow, "format 16 could not borrow");
        JobRequest16 {
            head: request_15(&JobRequest {
                flock: Default::default(),
                ..r.clone()
            }),
            flock: r.flock.clone(),
        }
    }

    /// `r` as format 17 wrote it.
    fn request_17(r: &JobRequest) -> JobRequest17 {
        assert!(!r.less && !r.one_cluster, "format 17 had neither");
        JobRequest17 {
            head: request_16(&JobRequest {
                borrow: false,
                ..r.clone()
            }),
            borrow: r.borrow,
        }
    }

    /// `r` as formats 18 and 19 wrote it.
    fn request_19(r: &JobRequest) -> JobRequest19 {
        assert!(!r.kill_on_bad_exit, "format 19 had no --kill-on-bad-exit");
        assert_eq!(r.exit_wait_s, 0, "format 19 had no --wait");
        assert_eq!(r.cpu_bind, None, "format 19 had no --cpu-bind");
        JobRequest19 {
            head: request_17(&JobRequest {
                less: false,
                one_cluster: false,
                ..r.clone()
            }),
            less: r.less,
            one_cluster: r.one_cluster,
        }
    }

    fn written_19(rec: &JobRecord) -> Vec<u8> {
        encode(rec, request_19(&rec.req))
    }

    fn written_18(rec: &JobRecord) -> Vec<u8> {
        encode(rec, request_19(&rec.req))
    }

    fn written_17(rec: &JobRecord) -> Vec<u8> {
        encode(rec, request_17(&rec.req))
    }

    fn written_16(rec: &JobRecord) -> Vec<u8> {
        encode(rec, request_16(&rec.req))
    }

    fn written_15(rec: &JobRecord) -> Vec<u8> {
        encode(rec, request_15(&rec.req))
    }

    fn written_14(rec: &JobRecord) -> Vec<u8> {
        encode(rec, request_14(&rec.req))
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

    /// Format 17: requests come over with whether they may borrow, asking for neither
    /// `--less` nor `--one-cluster`.
    #[test]
    fn a_journal_of_format_17_is_read_and_rewritten_in_this_format() {
        upgrade_from(17, written_17);
    }

    /// Format 18: jobs are read as they were written (only leases changed shape).
    #[test]
    fn a_journal_of_format_18_is_read_and_rewritten_in_this_format() {
        upgrade_from(18, written_18);
    }

    /// Format 19: requests come over without `--kill-on-bad-exit`.
    #[test]
    fn a_journal_of_format_19_is_read_and_rewritten_in_this_format() {
        upgrade_from(19, written_19);
    }

    /// Node record `old`, written by `format`, is read as `want`, and rewritten so.
    fn node_upgrade<T: Serialize>(format: u64, old: &T, want: &NodeRecord) {
        let dir = tempfile::tempdir().unwrap();
        {
            drop(Journal::open(dir.path()).unwrap());
            let db = Database::create(dir.path().join("journal.redb")).unwrap();
            let w = db.begin_write().unwrap();
            {
                w.open_table(META)
                    .unwrap()
                    .insert("format", format)
                    .unwrap();
                let bytes =
                    bincode::serde::encode_to_vec(old, bincode::config::standard()).unwrap();
                w.open_table(crate::journal::NODES)
                    .unwrap()
                    .insert(3, bytes.as_slice())
                    .unwrap();
            }
            w.commit().unwrap();
        }
        let (journal, restored) = Journal::open(dir.path()).expect("the old format is read");
        drop(journal);
        assert_eq!(restored.nodes.get(&3), Some(want), "format {format}");
        let (_, again) = Journal::open(dir.path()).expect("opens again as it is");
        assert_eq!(again.nodes.get(&3), Some(want), "rewritten in this format");
    }

    /// A drained node of format 16 comes over drained, and lent to nobody.
    #[test]
    fn a_node_record_of_format_16_keeps_its_drain_and_is_not_lent() {
        let old = NodeRecord16 {
            drain: Some("bad fan".into()),
        };
        let want = NodeRecord {
            drain: Some("bad fan".into()),
            lent: None,
        };
        node_upgrade(16, &old, &want);
    }

    /// A node lent in format 17 comes over lent to the same peer until the same time, as
    /// the operator's lease (no peer asked for leases then).
    #[test]
    fn a_lease_of_format_17_comes_over_as_the_operators() {
        let old = NodeRecord17 {
            drain: None,
            lent: Some(Lease17 {
                peer: "c0".into(),
                until_ms: 1_700_000_000_000,
            }),
        };
        let want = NodeRecord {
            drain: None,
            lent: Some(storm_cluster::federation::Lease {
                peer: "c0".into(),
                until_ms: 1_700_000_000_000,
                asked: false,
                recall: None,
            }),
        };
        node_upgrade(17, &old, &want);
    }

    /// A node lent in format 18 comes over lent to the same peer until the same time, asked
    /// for as it was, and not called home.
    #[test]
    fn a_lease_of_format_18_comes_over_not_called_home() {
        let old = NodeRecord18 {
            drain: None,
            lent: Some(Lease18 {
                peer: "c0".into(),
                until_ms: 1_700_000_000_000,
                asked: true,
            }),
        };
        let want = NodeRecord {
            drain: None,
            lent: Some(storm_cluster::federation::Lease {
                peer: "c0".into(),
                until_ms: 1_700_000_000_000,
                asked: true,
                recall: None,
            }),
        };
        node_upgrade(18, &old, &want);
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
