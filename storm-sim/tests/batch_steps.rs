//! Batch jobs and steps in virtual time: a batch job runs its one task on the first node of
//! its allocation and outlives its submitter; a step runs on its allocation's nodes, in its
//! time slot (seen from the tasks' own run windows), and ends with it.

use std::time::{Duration, Instant};

use storm_cluster::config::PolicyKind;
use storm_cluster::control::JobOutcome;
use storm_cluster::messages::JobId;
use storm_mm::journal::JobState as Recorded;
use storm_sim::{Sim, SimJob, SimOptions};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

type Windows = Vec<(Instant, Instant)>;

/// Runs until `done`, keeping the last run windows each node's tasks of `jobs` showed
/// (a node forgets a job's tasks once the job ends): per job, per node.
fn run_watching(
    s: &mut Sim,
    jobs: &[JobId],
    limit: Duration,
    done: impl Fn(&Sim) -> bool,
) -> Vec<Vec<Windows>> {
    let nodes = s.config().node_count();
    let mut seen = vec![vec![Windows::new(); nodes as usize]; jobs.len()];
    let until = s.now() + limit;
    while !done(s) {
        assert!(s.now() < until, "not done within {limit:?}");
        s.step();
        for (j, job) in jobs.iter().enumerate() {
            for n in 0..nodes {
                let w: Windows = s.node(n).run_windows(*job).into_iter().flatten().collect();
                if !w.is_empty() {
                    seen[j][n as usize] = w;
                }
            }
        }
    }
    seen
}

/// How job `job` ended, as `storm history` keeps it (whoever followed it).
fn history(s: &Sim, job: JobId) -> Option<JobOutcome> {
    s.journaled()
        .jobs
        .into_iter()
        .find(|r| r.id == job)
        .and_then(|r| match r.state {
            Recorded::Finished { outcome, .. } => Some(outcome),
            _ => None,
        })
}

#[test]
fn a_batch_job_outlives_its_submitter_and_runs_one_task_on_its_first_node() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let batch = s.submit(&SimJob::new(3, ms(300)).as_batch()).unwrap();
    let interactive = s.submit(&SimJob::new(1, ms(300))).unwrap();
    s.run_for(ms(50));
    s.hang_up().unwrap();
    let seen = run_watching(&mut s, &[batch], ms(5_000), |s| history(s, batch).is_some());
    let out = history(&s, batch).unwrap();
    assert_eq!(
        (out.reason.as_deref(), out.exit_code()),
        (None, 0),
        "{out:?}"
    );
    assert_eq!(out.ranks.len(), 1, "one task: the script");
    let ran = out.timing.run_us;
    assert!(ran >= 300_000, "it ran its whole work ({ran} us)");
    // Its one task ran on its first node; the others held no task of it.
    assert!(!seen[0][0].is_empty());
    for n in [1, 2] {
        assert!(seen[0][n].is_empty(), "node {n}");
    }
    let cancelled = history(&s, interactive).expect("ended");
    assert_eq!(
        cancelled.reason.as_deref(),
        Some("storm-submit went away"),
        "a job that is not a batch job ends with its submitter"
    );
}

/// Under gang scheduling a step runs exactly when its allocation does: from its tasks' own
/// view, never beside the other time slot's job, always on the allocation's nodes.
#[test]
fn a_step_runs_in_its_allocations_time_slot_on_its_nodes() {
    let mut s = Sim::up(SimOptions {
        nodes: 4,
        policy: PolicyKind::Gang,
        mpl: 2,
        ..SimOptions::default()
    })
    .expect("a simulated cluster, every node up");
    let alloc = s.submit(&SimJob::new(2, ms(2_000)).as_batch()).unwrap();
    let other = s.submit(&SimJob::new(4, ms(2_000))).unwrap();
    s.run_for(ms(100));
    let step = s
        .submit(&SimJob::new(2, ms(300)).as_step_of(alloc))
        .unwrap();
    let view = s.mm().queue_view();
    let slot_of = |j: JobId| view.iter().find(|i| i.job == j).and_then(|i| i.time_slot);
    assert!(slot_of(alloc).is_some() && slot_of(alloc) != slot_of(other));
    let seen = run_watching(&mut s, &[step, other], ms(10_000), |s| {
        s.outcome(step).is_some()
    });
    assert_eq!(s.outcome(step).unwrap().exit_code(), 0);
    for (n, step_windows) in seen[0].iter().enumerate() {
        if n >= 2 {
            assert!(step_windows.is_empty(), "node {n} is not the allocation's");
            continue;
        }
        assert!(!step_windows.is_empty(), "node {n} ran the step");
        // The last look before the node let go of the step's tasks saw most of its work.
        let ran: Duration = step_windows.iter().map(|(a, b)| *b - *a).sum();
        assert!(
            ran >= ms(250),
            "node {n}: the step ran {ran:?} of its 300 ms"
        );
        for (a, b) in step_windows {
            for (c, d) in &seen[1][n] {
                assert!(
                    b <= c || d <= a,
                    "node {n}: the step ran beside the other slot's job for {:?}",
                    (*b).min(*d) - (*a).max(*c)
                );
            }
        }
    }
}

#[test]
fn a_step_ends_with_its_allocation() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let alloc = s.submit(&SimJob::new(2, ms(200)).as_batch()).unwrap();
    s.run_for(ms(50));
    let step = s
        .submit(&SimJob::new(2, ms(5_000)).as_step_of(alloc))
        .unwrap();
    assert!(s.run_until(ms(3_000), |s| s.outcome(step).is_some()));
    let out = s.outcome(step).unwrap();
    assert_eq!(
        out.reason.as_deref(),
        Some(format!("its job {alloc} ended").as_str()),
        "{out:?}"
    );
    assert_ne!(out.exit_code(), 0);
}

#[test]
fn steps_must_fit_a_running_allocation_of_their_own_user() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let e = s
        .submit(&SimJob::new(1, ms(10)).as_step_of(77))
        .unwrap_err();
    assert_eq!(
        e,
        "job 77, whose step this would be, is not running (it may have ended)"
    );
    let alloc = s.submit(&SimJob::new(2, ms(1_000)).as_batch()).unwrap();
    s.run_for(ms(50));
    let e = s
        .submit(&SimJob::new(3, ms(10)).as_step_of(alloc))
        .unwrap_err();
    assert_eq!(
        e,
        format!("the step asks for 3 nodes; its job {alloc} holds 2")
    );
    // A step of a step is a step of the same allocation.
    let step = s
        .submit(&SimJob::new(1, ms(500)).as_step_of(alloc))
        .unwrap();
    s.run_for(ms(50));
    let nested = s.submit(&SimJob::new(2, ms(10)).as_step_of(step)).unwrap();
    assert!(s.run_until(ms(2_000), |s| s.outcome(nested).is_some()));
    assert_eq!(s.outcome(nested).unwrap().exit_code(), 0);
}

/// A queued batch job needs no submitter to reattach after a restart of the MM: the queue
/// does not wait for one.
#[test]
fn after_a_restart_a_queued_batch_job_starts_without_waiting_for_a_submitter() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let blocker = s.submit(&SimJob::new(4, ms(300)).as_batch()).unwrap();
    let queued = s.submit(&SimJob::new(4, ms(100)).as_batch()).unwrap();
    s.hang_up().unwrap();
    s.run_for(ms(100));
    s.restart_mm().unwrap();
    let restarted = s.now();
    assert!(s.run_until(ms(5_000), |s| history(s, queued).is_some()));
    assert_eq!(history(&s, blocker).unwrap().exit_code(), 0);
    assert_eq!(history(&s, queued).unwrap().exit_code(), 0);
    let took = s.now() - restarted;
    assert!(
        took < ms(1_000),
        "the queue waited {took:?} for submitters batch jobs do not have"
    );
}
