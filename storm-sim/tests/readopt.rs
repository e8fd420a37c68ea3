//! After a restart of the MM, a node that registers without a job whose launch had gone out
//! is judged by which NM process it is: the very process the launch went to never got it (the
//! launch goes again), any other may have run some of it (the job ends). Seen from outside:
//! whether the job's code runs again on the node, and how the job ends, whatever the nodes'
//! clocks read.

use std::time::Duration;

use storm_cluster::control::JobState as ControlState;
use storm_mm::journal::JobState;
use storm_sim::{Sim, SimJob, SimOptions};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// The MM restarts after its journal recorded a job's launch but before the launch went out
/// (its commit had not settled), and the nodes' clocks read 10 s ahead of the MM's: by their
/// clocks their NMs started after the launch. The same NM processes register again without
/// the job, so the launch never reached them: it goes again, and the job runs once, to its
/// end. (Judged by the NMs' start against the launch's time, on two hosts' clocks, the job
/// failed, "its processes ... were gone", though none of its code had run.)
#[test]
fn a_launch_lost_with_the_mm_goes_again_to_the_same_nms_whatever_their_clocks_read() {
    let mut s = Sim::up(SimOptions {
        nodes: 2,
        background_journal: true,
        node_clock_ahead_ms: 10_000,
        ..Default::default()
    })
    .expect("a simulated cluster, every node up");
    let blocker = s.submit(&SimJob::new(2, ms(300))).unwrap();
    let job = s.submit(&SimJob::new(2, ms(200))).unwrap();
    // The disk stops answering: the job's start is recorded but never settles, so its launch
    // waits for it.
    s.hold_journal(true);
    assert!(
        s.run_until(ms(5_000), |s| {
            s.mm()
                .queue_view()
                .iter()
                .any(|j| j.job == job && j.state == ControlState::Launching)
        }),
        "the blocker ends and the job is placed"
    );
    s.run_for(ms(100));
    assert!((0..2).all(|n| s.node(n).tasks_started(blocker) == 1));
    assert!(
        (0..2).all(|n| s.node(n).job_state(job).is_none()),
        "its launch has not reached its nodes"
    );
    // What it handed its journal's thread is written as it goes.
    s.restart_mm().unwrap();
    let record = s.journaled().jobs.into_iter().find(|r| r.id == job);
    assert!(
        matches!(
            record.as_ref().map(|r| &r.state),
            Some(JobState::Started {
                launched_ms: Some(_),
                ..
            })
        ),
        "the journal holds its launch: {record:?}"
    );
    s.assert_ran_once_to_its_end(job, 2, ms(10_000));
}

/// A job runs on two nodes; node 0's NM restarts (its tasks die with it) with the same pid,
/// as an NM in a container would, and with its clock 10 s behind the MM's, and the MM
/// restarts too before it hears of it. Node 0 registers without the job from another NM
/// process than the one the launch went to: the job's code may have run there, so it is not
/// launched there again and the job ends, naming the node. (Judged by the NM's start against
/// the launch's time, node 0's clock said its NM ran since before the launch, and the job's
/// code ran a second time there.)
#[test]
fn a_job_whose_nm_restarted_with_the_mm_is_not_run_again_whatever_the_nodes_clock_reads() {
    let mut s = Sim::up(SimOptions {
        nodes: 2,
        ..Default::default()
    })
    .expect("a simulated cluster, every node up");
    let job = s.submit(&SimJob::new(2, ms(2_000))).unwrap();
    assert!(s.run_until(ms(2_000), |s| (0..2).all(|n| s.node(n).running(job))));
    s.restart_nm(0, -10_000);
    s.restart_mm().unwrap();
    assert!(
        s.run_until(ms(10_000), |s| s.outcome(job).is_some()),
        "the job ends"
    );
    let outcome = s.outcome(job).unwrap();
    let reason = outcome.reason.clone().unwrap_or_default();
    assert!(
        reason.contains("nodes 0") && reason.contains("were gone"),
        "{outcome:?}"
    );
    assert!(
        s.node(0).tasks_started(job) == 0 && s.node(0).job_state(job).is_none(),
        "none of its code ran again on node 0"
    );
}

/// The same NM restart with the MM running: the NM registers again with the pid it had, but
/// it is another process (its start differs), so the node lost its processes. It is marked
/// DOWN and the job ends; its code is not launched there again as if the node had only
/// missed its launch. (The pid alone named the process until 29 November: an NM restarted
/// with the pid it had was taken for the same process, and the job launched again there.)
#[test]
fn an_nm_restarted_with_the_same_pid_is_a_new_process() {
    let mut s = Sim::up(SimOptions {
        nodes: 2,
        ..Default::default()
    })
    .expect("a simulated cluster, every node up");
    let job = s.submit(&SimJob::new(2, ms(2_000))).unwrap();
    assert!(s.run_until(ms(2_000), |s| (0..2).all(|n| s.node(n).running(job))));
    s.restart_nm(0, 0);
    assert!(
        s.run_until(ms(10_000), |s| s.outcome(job).is_some()),
        "the job ends"
    );
    let outcome = s.outcome(job).unwrap();
    assert!(outcome.reason.is_some(), "{outcome:?}");
    assert!(
        s.node(0).tasks_started(job) == 0 && s.node(0).job_state(job).is_none(),
        "none of its code ran again on node 0"
    );
}
