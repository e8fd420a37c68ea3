//! A job given its nodes the moment it is submitted, while its program is on its way to
//! them: the MM restarts, or its disk is slow. Seen from outside: the job runs once, to its
//! end, and its submitter hears of it as usual.
//!
//! Since 8 December such a job is journaled with its launch and makes no copy of its program
//! unless its program travels longer than a quarter of a second (`COPY_WAITS_AT_MOST`): the
//! copy's write and sync slowed every broadcast launch, and nothing reads it once the launch
//! is recorded.
//!
//! Until 1 December such a job had no program copy beside the journal (only jobs that waited
//! in the queue got one). Its first record said it had nodes and no launch out, so a
//! restarted MM (or the next leader of a manager group) put it back in the queue, found no
//! copy, and ended it: "the machine manager restarted and the copy of its program is
//! missing" (CI, `managers.rs`, a leader killed under fifty submitters).

use std::time::Duration;

use storm_cluster::control::Reply;
use storm_cluster::messages::Command;
use storm_mm::journal::JobState;
use storm_sim::{Sim, SimJob, SimOptions};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn two_nodes() -> Sim {
    Sim::up(SimOptions {
        nodes: 2,
        ..Default::default()
    })
    .expect("a simulated cluster, every node up")
}

/// 100 MB: about an eighth of a second to send to the nodes with the default model.
const LARGE: u64 = 100_000_000;

/// 400 MB: about half a second, longer than a copy waits for a launch.
const HUGE: u64 = 400_000_000;

/// The MM restarts while the program of a job that got both nodes at once is still being
/// sent. Such a job is journaled with its launch, and its submitter told only then: the new
/// MM knows nothing of it, and the submitter, told nothing, sends it again (with its token,
/// as storm-submit does). It runs once, to its end; no launch of the first went out.
#[test]
fn a_job_whose_program_was_being_sent_when_the_mm_restarted_is_sent_again_and_runs_once() {
    let mut s = two_nodes();
    let job = SimJob::new(2, ms(50)).with_program(LARGE).with_token(7);
    s.send_submission(&job);
    s.run_for(ms(60));
    assert!(
        (0..2).all(|n| s.node(n).jobs().is_empty()),
        "no launch reached its nodes yet: its program is still on its way"
    );
    assert!(
        !s.replies
            .iter()
            .any(|(_, r)| matches!(r, Reply::Accepted { .. })),
        "its submitter was told of it before its launch was journaled"
    );
    assert!(
        s.journaled().jobs.is_empty(),
        "journaled before its launch, though no copy of its program was made"
    );
    assert_eq!(
        s.mm().env().copies_begun(),
        0,
        "a copy was made of a program on its way to its nodes for less than a quarter second"
    );
    s.restart_mm().unwrap();
    let again = s.submit(&job).unwrap();
    s.assert_ran_once_to_its_end(again, 2, ms(10_000));
}

/// A program that takes longer than a quarter of a second to reach its nodes gets its copy
/// beside the journal after all, and the job is journaled as given nodes: the MM restarts
/// while it is still being sent, and the new MM queues it again from its copy; its
/// submitter, told of it, reattaches, and it runs once, to its end.
#[test]
fn a_job_whose_long_transfer_was_cut_by_a_restart_runs_once_from_its_copy() {
    let mut s = two_nodes();
    let job = s
        .submit(&SimJob::new(2, ms(50)).with_program(HUGE))
        .unwrap();
    let starting = |s: &Sim| {
        s.journaled().jobs.iter().any(|r| {
            r.id == job
                && matches!(
                    r.state,
                    JobState::Started {
                        launched_ms: None,
                        ..
                    }
                )
        })
    };
    assert!(
        s.run_until(ms(1_000), starting),
        "the journal holds the job as given nodes"
    );
    assert!(
        (0..2).all(|n| s.node(n).job_state(job).is_none()),
        "no launch reached its nodes yet: its program is still on its way"
    );
    s.restart_mm().unwrap();
    s.assert_ran_once_to_its_end(job, 2, ms(10_000));
}

/// Who gets a program copy beside the journal, seen from the disk: a job given nodes at
/// once needs none (its launch is its first record); a job that waits for nodes gets one,
/// and so does a job that may be requeued, even given nodes at once.
#[test]
fn only_a_job_that_waits_or_may_run_again_has_its_program_copied() {
    let mut s = two_nodes();
    let at_once = s
        .submit(&SimJob::new(2, ms(300)).with_program(8_000_000))
        .unwrap();
    assert_eq!(
        s.mm().env().copies_begun(),
        0,
        "copied a job given nodes at once"
    );
    let waits = s
        .submit(&SimJob::new(2, ms(20)).with_program(8_000_000))
        .unwrap();
    assert_eq!(
        s.mm().env().copies_begun(),
        1,
        "a job that waits for nodes has no copy"
    );
    s.assert_ran_once_to_its_end(at_once, 2, ms(5_000));
    s.assert_ran_once_to_its_end(waits, 2, ms(5_000));
    let requeue = s
        .submit(&SimJob {
            requeue: true,
            ..SimJob::new(2, ms(20)).with_program(8_000_000)
        })
        .unwrap();
    assert_eq!(
        s.mm().env().copies_begun(),
        2,
        "a job that may be requeued has no copy"
    );
    s.assert_ran_once_to_its_end(requeue, 2, ms(5_000));
}

/// The disk never finishes a program copy. A job given nodes at once launches all the same
/// once its program is on its nodes: its first record is its launch's, after which no MM
/// needs the copy (it cannot be requeued). Its submitter hears of it only once the journal
/// holds it. A job that may be requeued needs its copy, so its launch waits for the disk.
#[test]
fn a_slow_disk_holds_the_launch_only_of_a_job_that_may_run_again() {
    let mut s = two_nodes();
    s.allow_copies(Some(0));
    s.send_submission(&SimJob::new(2, ms(20)).with_program(8_000_000));
    let accepted = |s: &Sim| {
        s.replies.iter().find_map(|(_, r)| match r {
            Reply::Accepted { job, .. } => Some(*job),
            _ => None,
        })
    };
    assert!(
        s.run_until(ms(2_000), |s| accepted(s).is_some()),
        "the job is accepted while its copy is still being made"
    );
    let job = accepted(&s).unwrap();
    let record = s.journaled().jobs.into_iter().find(|r| r.id == job);
    assert!(
        matches!(
            record.as_ref().map(|r| &r.state),
            Some(JobState::Started {
                launched_ms: Some(_),
                ..
            })
        ),
        "accepted once the journal holds its launch: {record:?}"
    );
    assert!(
        s.run_until(ms(2_000), |s| s.finished(job).is_some()),
        "the job runs without its copy"
    );
    assert_eq!(s.outcome(job).unwrap().exit_code(), 0);

    let before = s.replies.len();
    s.send_submission(&SimJob {
        requeue: true,
        ..SimJob::new(2, ms(20)).with_program(8_000_000)
    });
    s.run_for(ms(500));
    assert!(
        !s.replies[before..]
            .iter()
            .any(|(_, r)| matches!(r, Reply::Accepted { .. })),
        "a requeueable job is accepted before its copy is made"
    );
    assert!(
        (0..2).all(|n| s.node(n).jobs().iter().all(|&(j, _)| j == job)),
        "a requeueable job launched before its copy was made"
    );
    s.allow_copies(None);
    assert!(
        s.run_until(ms(2_000), |s| s.replies[before..]
            .iter()
            .any(|(_, r)| matches!(r, Reply::Finished(o) if o.exit_code() == 0))),
        "once its copy is made it runs to its end"
    );
}

/// A job that may be requeued loses a node while its program is on its way, and runs again
/// on the nodes left and a fifth. Each node hears, in order: the first placement's transfer,
/// the `Forget` of that placement, then the new placement's transfer and its launch. A
/// `Forget` names the job, not the placement: one heard after the new transfer began cancels
/// it and removes the job's spool directory, and the job then waited out a 10 s wait for an
/// answer that never came (about one run in five with a node frozen under a job on a
/// 5-node embedded cluster). A `Forget` waits for the journal's commit of the requeue, so
/// the disk is held meanwhile: the new transfer must wait for the `Forget`, however long.
#[test]
fn a_requeued_job_is_forgotten_on_its_nodes_before_its_next_transfer_begins() {
    // The journal commits on a thread of its own, as the daemon's does.
    let mut s = Sim::up(SimOptions {
        nodes: 5,
        record: true,
        background_journal: true,
        ..Default::default()
    })
    .expect("a simulated cluster, every node up");
    let job = s
        .submit(&SimJob {
            requeue: true,
            ..SimJob::new(4, ms(20)).with_program(LARGE)
        })
        .unwrap();
    let placed = s
        .mm()
        .queue_view()
        .into_iter()
        .find(|j| j.job == job)
        .map(|j| j.nodes)
        .unwrap();
    let lost = placed.iter().last().unwrap();
    s.run_for(ms(20));
    s.hold_journal(true);
    s.kill(lost);
    s.run_for(ms(1_500));
    s.hold_journal(false);
    assert!(
        s.run_until(ms(10_000), |s| s.outcome(job).is_some()),
        "the job ends"
    );
    let o = s.outcome(job).unwrap();
    assert_eq!((o.reason.clone(), o.exit_code()), (None, 0), "{o:?}");
    for n in (0..5).filter(|&n| n != lost) {
        // Every command of the job in a heartbeat this node took (a heartbeat carries the
        // commands of every node).
        let told: Vec<&'static str> = s
            .node(n)
            .heard()
            .iter()
            .flat_map(|h| &h.commands)
            .filter_map(|c| match c {
                Command::ReceiveFile(info) if info.job == job => Some("receive"),
                Command::Forget { job: j } if *j == job => Some("forget"),
                Command::Launch(spec) if spec.job == job => Some("launch"),
                _ => None,
            })
            .collect();
        assert_eq!(
            told,
            ["receive", "forget", "receive", "launch"],
            "node {n} heard the job's commands out of order"
        );
    }
}
