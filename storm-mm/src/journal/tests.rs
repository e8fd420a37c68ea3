//! Tests of `journal`, apart so that its own file stays short.

use super::*;
use std::os::unix::fs::PermissionsExt;
use storm_cluster::control::Timing;

fn request(name: &str) -> JobRequest {
    JobRequest {
        args: vec!["a".into()],
        env: vec![("K".into(), "V".into())],
        delivery: storm_cluster::control::Delivery::Broadcast,
        time_limit_ms: Some(60_000),
        ..JobRequest::new(name, "/bin/true", "/")
    }
}

pub(crate) fn job(id: JobId, state: JobState) -> JobRecord {
    JobRecord {
        id,
        uid: 1000,
        gid: 100,
        req: request(&format!("job{id}")),
        submitted_ms: 1_700_000_000_000 + id,
        state,
    }
}

pub(crate) fn finished(id: JobId) -> JobRecord {
    job(
        id,
        JobState::Finished {
            nodes: "0-1".parse().unwrap(),
            outcome: JobOutcome {
                job: id,
                ranks: vec![],
                reason: Some("cancelled".into()),
                abort_code: None,
                timing: Timing::default(),
                usage: Default::default(),
                cause: Some(storm_cluster::control::EndCause::Cancelled),
                broadcast: false,
            },
            ended_ms: 1,
        },
    )
}

/// The simulator restarts its MM on a memory store: what was committed (and only that)
/// must be there for the next MM, as with the store on disk.
#[test]
fn a_memory_store_hands_its_commits_to_the_next_journal_on_it() {
    let store = MemoryStore::default();
    {
        let (mut j, restored) = Journal::with_store(Box::new(store.clone()), None).unwrap();
        assert_eq!(restored.next_job, 1);
        j.put_job(job(2, JobState::Queued));
        j.put_job(job(1, JobState::Queued));
        j.put_node(
            3,
            NodeRecord {
                drain: Some("disk".into()),
                lent: None,
            },
        );
        j.set_next_job(3);
        j.commit().unwrap();
        j.put_job(finished(1));
        j.commit().unwrap();
        j.put_job(job(9, JobState::Queued));
        // Not committed: lost with this MM.
    }
    let (j, restored) = Journal::with_store(Box::new(store), None).unwrap();
    assert_eq!(restored.jobs, vec![finished(1), job(2, JobState::Queued)]);
    assert_eq!(restored.next_job, 3);
    assert_eq!(restored.nodes[&3].drain.as_deref(), Some("disk"));
    assert!(j.program(2).is_none(), "a memory journal keeps no programs");
}

/// A manager group ships a job's copy to every replica with the job's first record, and a
/// new leader readmits from it: which records need one. A job that got its nodes the
/// moment it was submitted is first recorded as started with no launch out yet, and needs
/// its copy as much as a waiting one (until 1 December only waiting records were shipped,
/// and a failover in that moment ended the job, saying its copy was missing).
#[test]
fn a_record_needs_its_program_copy_until_its_launch_went_out_or_while_it_may_be_requeued() {
    let started = |launched_ms: Option<u64>| JobState::Started {
        nodes: "0".parse().unwrap(),
        cpus: None,
        slot: 0,
        time_slot: 0,
        launched_ms,
        launched_to: Vec::new(),
        program_hash: None,
    };
    let flocked = JobState::Flocked {
        peer: "c1".into(),
        since_ms: 1,
    };
    for state in [JobState::Queued, flocked, started(None)] {
        assert!(job(1, state.clone()).needs_program_copy(), "{state:?}");
    }
    assert!(!job(1, started(Some(5))).needs_program_copy());
    let mut requeue = job(1, started(Some(5)));
    requeue.req.requeue = true;
    assert!(
        requeue.needs_program_copy(),
        "it may run again from its beginning"
    );
    assert!(!finished(1).needs_program_copy());
    let mut in_place = job(1, JobState::Queued);
    in_place.req.delivery = storm_cluster::control::Delivery::InPlace;
    assert!(
        !in_place.needs_program_copy(),
        "it runs from its path: it has no copy"
    );
}

/// Jobs' environments hold users' secrets: only the MM may read the journal.
#[test]
fn the_state_directory_and_journal_are_private_to_the_mm() {
    let dir = tempfile::tempdir().unwrap();
    let state = dir.path().join("state");
    std::fs::create_dir(&state).unwrap();
    std::fs::set_permissions(&state, std::fs::Permissions::from_mode(0o755)).unwrap();
    let _ = Journal::open(&state).unwrap();
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&state), 0o700);
    assert_eq!(mode(&state.join("journal.redb")), 0o600);
    assert_eq!(mode(&state.join("programs")), 0o700);
}

#[test]
fn a_replicas_journal_says_which_log_entry_it_holds_up_to() {
    let dir = tempfile::tempdir().unwrap();
    let state = DaemonDir::open_or_create(dir.path(), 0o700).unwrap();
    {
        let mut store =
            RedbStore::open_at(&state, "journal.redb", dir.path().join("journal.redb")).unwrap();
        store.read().unwrap();
        assert_eq!(store.applied().unwrap(), 0, "a new journal holds no entry");
        store
            .write_applied(
                &[Change::Job(Box::new(job(1, JobState::Queued)))],
                Some(2),
                7,
                false,
            )
            .unwrap();
        store.write_applied(&[], None, 9, true).unwrap();
    }
    let mut store =
        RedbStore::open_at(&state, "journal.redb", dir.path().join("journal.redb")).unwrap();
    assert_eq!(store.applied().unwrap(), 9);
    let r = store.read().unwrap();
    assert_eq!(r.jobs.len(), 1);
    assert_eq!(r.next_job, 2);
}

#[test]
fn committed_records_are_read_back_after_reopening() {
    let dir = tempfile::tempdir().unwrap();
    let records = vec![
        job(1, JobState::Queued),
        job(
            2,
            JobState::Started {
                nodes: "2-3".parse().unwrap(),
                cpus: None,
                slot: 5,
                time_slot: 1,
                launched_ms: Some(1_700_000_000_000),
                launched_to: vec![(
                    2,
                    NmProcess {
                        pid: 41,
                        started_ms: 1_699_999_000_000,
                    },
                )],
                program_hash: None,
            },
        ),
        finished(3),
        job(
            4,
            JobState::Started {
                nodes: "1".parse().unwrap(),
                cpus: Some("0-1".parse().unwrap()),
                slot: 6,
                time_slot: 0,
                launched_ms: Some(1_700_000_000_001),
                launched_to: vec![],
                program_hash: None,
            },
        ),
    ];
    {
        let (mut j, restored) = Journal::open(dir.path()).unwrap();
        assert!(restored.jobs.is_empty());
        assert_eq!(restored.next_job, 1, "a new journal starts at job 1");
        for r in &records {
            j.put_job(r.clone());
        }
        j.put_node(
            4,
            NodeRecord {
                drain: Some("fan".into()),
                lent: None,
            },
        );
        j.set_next_job(7);
        j.commit().unwrap();
    }
    let (_, restored) = Journal::open(dir.path()).unwrap();
    assert_eq!(restored.jobs, records);
    assert_eq!(restored.next_job, 7);
    assert_eq!(restored.nodes[&4].drain.as_deref(), Some("fan"));
}

#[test]
fn staged_changes_are_lost_without_a_commit_and_ids_never_go_back() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        j.put_job(job(5, JobState::Queued));
        j.commit().unwrap();
        j.put_job(job(6, JobState::Queued));
        j.set_next_job(7);
        // Dropped without committing: as if the MM was killed here.
    }
    let (_, restored) = Journal::open(dir.path()).unwrap();
    assert_eq!(restored.jobs.iter().map(|j| j.id).collect::<Vec<_>>(), [5]);
    assert_eq!(
        restored.next_job, 6,
        "the next id follows the highest job even if the counter was not committed"
    );
}

#[test]
fn a_removed_job_is_gone_after_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    {
        let (mut j, _) = Journal::open(dir.path()).unwrap();
        j.put_job(job(1, JobState::Queued));
        for id in 2..6 {
            j.put_job(finished(id));
        }
        j.commit().unwrap();
        j.remove_job(2);
        j.remove_job(4);
        j.commit().unwrap();
    }
    let (_, restored) = Journal::open(dir.path()).unwrap();
    let ids: Vec<u64> = restored.jobs.iter().map(|j| j.id).collect();
    assert_eq!(ids, [1, 3, 5]);
}

#[test]
fn a_saved_program_is_a_complete_copy_and_goes_when_its_job_ends() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("prog");
    let bytes: Vec<u8> = (0..3_000_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    let (mut j, _) = Journal::open(&dir.path().join("state")).unwrap();
    j.save_program(9, &File::open(&src).unwrap()).unwrap();
    let mut copy = Vec::new();
    std::io::Read::read_to_end(&mut j.program(9).unwrap(), &mut copy).unwrap();
    assert!(copy == bytes, "the copy differs from the program");
    j.put_job(finished(9));
    j.commit().unwrap();
    assert!(
        j.program(9).is_none(),
        "the copy of a finished job is removed"
    );
}

#[test]
fn saving_a_program_leaves_its_descriptors_offset_alone() {
    // The MM sends the program through the same descriptor while the copy is made.
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("prog");
    let bytes: Vec<u8> = (0..1_000_000u32).map(|i| (i % 253) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    let mut program = File::open(&src).unwrap();
    std::io::Seek::seek(&mut program, std::io::SeekFrom::Start(1234)).unwrap();
    let (j, _) = Journal::open(&dir.path().join("state")).unwrap();
    j.save_program(3, &program).unwrap();
    let at = std::io::Seek::stream_position(&mut program).unwrap();
    assert_eq!(at, 1234, "the copy moved the descriptor's offset");
    let mut copy = Vec::new();
    std::io::Read::read_to_end(&mut j.program(3).unwrap(), &mut copy).unwrap();
    assert!(copy == bytes, "the copy is not the whole program");
}

/// Finding 7 of issue 31: a user grew their program after the MM checked its size, and
/// the MM copied all of it (3 GiB against a 1 GiB limit). The copy now stops at the size
/// checked, and a program whose size changed is refused, naming both sizes; nothing of
/// it is kept.
#[test]
fn a_program_that_grew_after_its_check_is_refused_and_not_kept() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("prog");
    std::fs::write(&src, vec![7u8; 1000]).unwrap();
    let program = File::open(&src).unwrap();
    let (j, _) = Journal::open(&dir.path().join("state")).unwrap();
    let store = j.program_store().unwrap();
    // Checked at 1000 bytes; then the user appends.
    std::fs::OpenOptions::new()
        .append(true)
        .open(&src)
        .unwrap()
        .write_all(&vec![8u8; 50_000])
        .unwrap();
    let err = store.save(5, &program, 1000).unwrap_err();
    assert!(
        matches!(
            err,
            JournalError::ProgramChanged {
                checked: 1000,
                now: 51_000,
                ..
            }
        ),
        "{err}"
    );
    assert!(err.to_string().contains("submit it again"), "{err}");
    assert!(j.program(5).is_none(), "no copy is kept");
    let left = std::fs::read_dir(dir.path().join("state/programs"))
        .unwrap()
        .count();
    assert_eq!(left, 0, "nothing of the copy is left behind");
    // And one that shrank is refused too.
    std::fs::write(&src, vec![1u8; 10]).unwrap();
    let err = store.save(6, &program, 1000).unwrap_err().to_string();
    assert!(err.contains("ended at byte 10 of the 1000"), "{err}");
}

#[test]
fn a_program_on_another_file_system_is_copied_whole() {
    // /dev/shm is a tmpfs; the journal's directory is not, where this runs.
    let Ok(shm) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("SKIPPED: no /dev/shm here to hold a program on another file system");
        return;
    };
    let src = shm.path().join("prog");
    let bytes: Vec<u8> = (0..2_500_000u32).map(|i| (i % 241) as u8).collect();
    std::fs::write(&src, &bytes).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let (j, _) = Journal::open(&dir.path().join("state")).unwrap();
    j.save_program(4, &File::open(&src).unwrap()).unwrap();
    let mut copy = Vec::new();
    std::io::Read::read_to_end(&mut j.program(4).unwrap(), &mut copy).unwrap();
    assert!(copy == bytes, "the copy is not the whole program");
}

#[test]
fn program_copies_no_waiting_job_needs_are_removed_at_open() {
    let dir = tempfile::tempdir().unwrap();
    let src = dir.path().join("prog");
    std::fs::write(&src, b"#!/bin/sh\n").unwrap();
    let state = dir.path().join("state");
    {
        let (mut j, _) = Journal::open(&state).unwrap();
        j.save_program(1, &File::open(&src).unwrap()).unwrap();
        j.put_job(job(1, JobState::Queued));
        j.commit().unwrap();
        // Saved, but the MM died before the job's record was committed.
        j.save_program(2, &File::open(&src).unwrap()).unwrap();
    }
    let (j, _) = Journal::open(&state).unwrap();
    assert!(j.program(1).is_some(), "a queued job keeps its program");
    assert!(j.program(2).is_none(), "a copy no job needs is removed");
}

#[test]
fn a_damaged_record_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    {
        drop(Journal::open(dir.path()).unwrap());
        let db = Database::create(dir.path().join("journal.redb")).unwrap();
        let w = db.begin_write().unwrap();
        {
            let mut jobs = w.open_table(JOBS).unwrap();
            jobs.insert(42u64, [0xffu8, 0xff, 0xff].as_slice()).unwrap();
        }
        w.commit().unwrap();
    }
    let err = Journal::open(dir.path()).err().expect("refused");
    let text = err.to_string();
    assert!(text.contains("record job 42"), "{text}");
    assert!(text.contains("journal.redb"), "{text}");
}

#[test]
fn a_journal_of_another_format_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    {
        drop(Journal::open(dir.path()).unwrap());
        let db = Database::create(dir.path().join("journal.redb")).unwrap();
        let w = db.begin_write().unwrap();
        w.open_table(META)
            .unwrap()
            .insert("format", FORMAT + 1)
            .unwrap();
        w.commit().unwrap();
    }
    let err = Journal::open(dir.path()).err().expect("refused");
    assert!(err.to_string().contains("format"), "{err}");
}
