//! The MM between its timeslices. Its journal hands its commits over to be written, as the
//! daemon's does (the disk's fsync stays off the MM's loop): its timeslices go on while a
//! commit is under way, and a reply still waits until the journal holds what it tells. The
//! daemon's loop waits on the fabric between timeslices, and its threads wake it. Everything
//! here runs in virtual time: a held journal is written when the test lets it go.

use std::time::Duration;

use storm_cluster::control::{JobState, Reply};
use storm_mm::journal::JobState as RecordState;
use storm_sim::{Sim, SimJob, SimOptions};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// A simulated cluster, up, whose journal hands its commits over, with the journal's writes
/// held (a disk that stopped answering).
fn up_with_journal_held() -> Sim {
    let mut s = Sim::new(SimOptions {
        background_journal: true,
        ..SimOptions::default()
    })
    .unwrap();
    s.run_until_up(Duration::from_secs(5)).unwrap();
    s.hold_journal(true);
    s
}

/// Steps until the first job in the queue is placed and waits for its launch; its id.
fn until_launching(s: &mut Sim) -> u64 {
    assert!(s.run_until(ms(1_000), |s| {
        s.mm()
            .queue_view()
            .first()
            .is_some_and(|j| j.state == JobState::Launching)
    }));
    s.mm().queue_view()[0].job
}

/// Steps until `job`'s outcome reaches its submitter (or 10 s of virtual time passed).
fn step_until_outcome(s: &mut Sim, job: u64) {
    s.run_until(ms(10_000), |s| s.outcome(job).is_some());
}

/// With the journal's writes held (a disk that stopped answering), the MM's timeslices go
/// on and a job is accepted and placed, but its submitter hears nothing and its launch does
/// not go out: a restarted MM would not know the job, so none of its tasks may run yet
/// (write-ahead). Once the writes go through, the job runs, and its submitter hears of every
/// step, in order, and the journal holds the job's end.
#[test]
fn replies_and_launches_wait_for_the_journal_while_timeslices_go_on() {
    let mut s = up_with_journal_held();
    let heard = s.replies.len();
    assert!(
        s.submit(&SimJob::new(2, ms(50))).is_err(),
        "accepted before the journal held the job"
    );
    let job = until_launching(&mut s);
    let ticks = s.ticks();
    s.run_for(ms(500));
    assert!(
        s.ticks() > ticks + 10,
        "the timeslices went on ({} more)",
        s.ticks() - ticks
    );
    assert_eq!(s.mm().queue_view()[0].state, JobState::Launching);
    let reached: Vec<u32> = (0..s.config().node_count())
        .filter(|&n| s.node(n).job_state(job).is_some())
        .collect();
    assert!(
        reached.is_empty(),
        "the launch reached nodes {reached:?} before the journal held the job's start"
    );
    assert!(
        s.replies[heard..].is_empty(),
        "replies went before the journal held what they tell: {:?}",
        &s.replies[heard..]
    );
    assert!(s.journaled().jobs.is_empty());

    s.hold_journal(false);
    step_until_outcome(&mut s, job);
    let outcome = s
        .outcome(job)
        .expect("the outcome once the journal is written");
    assert_eq!(outcome.reason, None);
    let kinds: Vec<&str> = s.replies[heard..]
        .iter()
        .filter_map(|(_, r)| match r {
            Reply::Accepted { .. } => Some("accepted"),
            Reply::Started { .. } => Some("started"),
            Reply::Finished(_) => Some("finished"),
            _ => None,
        })
        .collect();
    assert_eq!(kinds, ["accepted", "started", "finished"]);
    let rec = s
        .journaled()
        .jobs
        .into_iter()
        .find(|r| r.id == job)
        .unwrap();
    assert!(matches!(rec.state, RecordState::Finished { .. }), "{rec:?}");
}

/// A job cancelled while its launch waits for the journal ends as one that never started:
/// its launch never goes out, not even once the journal's writes go through.
#[test]
fn a_job_cancelled_while_its_start_is_recorded_is_never_launched() {
    let mut s = up_with_journal_held();
    let _ = s.submit(&SimJob::new(2, ms(50)));
    let job = until_launching(&mut s);
    s.cancel(job);
    assert!(s.run_until(ms(1_000), |s| s.mm().queue_view().is_empty()));
    s.hold_journal(false);
    step_until_outcome(&mut s, job);
    let reason = s.outcome(job).expect("its outcome").reason.clone();
    assert!(
        reason
            .as_deref()
            .is_some_and(|r| r.contains("before it started")),
        "{reason:?}"
    );
    s.run_for(ms(200));
    let reached: Vec<u32> = (0..s.config().node_count())
        .filter(|&n| s.node(n).job_state(job).is_some())
        .collect();
    assert!(
        reached.is_empty(),
        "launched on {reached:?} after its cancel"
    );
}

/// Between timeslices the daemon's loop waits on the fabric, and a wake-up (a request, a
/// settled commit) ends the wait long before the next timeslice would.
#[test]
fn a_wake_up_ends_the_mms_wait_between_timeslices() {
    let mut s = Sim::new(SimOptions::default()).unwrap();
    let (fabric, rm) = s.mm().fabric();
    let (fabric, event) = (fabric.clone(), rm.term_event);
    let waker = storm_mm::Waker::new(fabric.clone(), event);
    let ringer = std::thread::spawn(move || {
        std::thread::sleep(ms(20));
        waker.wake();
    });
    let far = std::time::Instant::now() + Duration::from_secs(600);
    let woken = storm_mm::waker::wait_until(&*fabric, event, far);
    assert!(std::time::Instant::now() < far, "the wait ran to its end");
    assert_eq!(
        woken,
        storm_mm::waker::Woken::Woken,
        "nothing was signalled"
    );
    ringer.join().unwrap();
    // Nothing was announced: the MM's look at terminations finds nothing to end.
    s.mm_mut().between_ticks();
    assert!(s.mm().queue_view().is_empty());
}

/// A launch waits for the commit that records its job's start, and no longer: once that
/// commit settles, the MM's look between timeslices brings the next timeslice forward to now,
/// instead of leaving the launch to wait out the rest of this one (the simulated clock stands
/// still between steps: without this, the next timeslice stays a whole one ahead).
#[test]
fn a_settled_start_brings_the_next_timeslice_forward() {
    // Held until the job waits for its record, so that the commit cannot settle first.
    let mut s = up_with_journal_held();
    let _ = s.submit(&SimJob::new(1, ms(50)));
    let job = until_launching(&mut s);
    assert!(s.mm().poll_timeout() > s.now(), "a timeslice is ahead");
    // The commit is written now; the MM hears of it between timeslices, with no time passing.
    s.hold_journal(false);
    s.wake_at(s.now());
    assert!(
        s.mm().poll_timeout() <= s.now(),
        "the next timeslice stayed {:?} ahead after the start was recorded",
        s.mm().poll_timeout() - s.now()
    );
    s.step();
    assert_ne!(
        s.mm().queue_view()[0].state,
        JobState::Launching,
        "its launch went out"
    );
    assert!(s.run_until(ms(1_000), |s| s.node(0).job_state(job).is_some()));
}

/// A program transfer that ends between two timeslices is verified there, as soon as the
/// MM's loop is woken for it (its worker wakes it once every node answered): the launch is
/// recorded at once and brings the next timeslice forward, instead of waiting for the next
/// one to find the nodes' acknowledgements.
#[test]
fn the_launch_follows_the_acknowledgement_of_the_program_at_once() {
    let slice = ms(20);
    let mut s = Sim::new(SimOptions {
        timeslice: slice,
        ..SimOptions::default()
    })
    .unwrap();
    s.run_until_up(Duration::from_secs(5)).unwrap();
    // Not waiting for its acceptance, which comes once its program's copy is made, a
    // timeslice after it began: the transfer may have landed by then.
    s.send_submission(&SimJob::new(4, Duration::ZERO).with_program(12_000_000));
    assert!(s.run_until(ms(1_000), |s| s.next_landing().is_some()));
    let job = s.mm().queue_view()[0].job;
    let landing = s.next_landing().unwrap();
    let next_tick = s.mm().poll_timeout();
    assert!(
        landing < next_tick,
        "the transfer ({:?} left) must end before the next timeslice ({:?} left) for this test",
        landing - s.now(),
        next_tick - s.now()
    );
    s.wake_at(landing);
    assert_eq!(s.mm().queue_view()[0].state, JobState::Launching);
    assert_eq!(
        s.mm().poll_timeout(),
        landing,
        "the launch waits for the timeslice due {:?} after the acknowledgement",
        next_tick - landing
    );
    assert!(s.run_until(ms(1_000), |s| s.outcome(job).is_some()));
    let t = s.outcome(job).unwrap().timing;
    assert_eq!(t.launch_us, 0, "{t:?}");
}
