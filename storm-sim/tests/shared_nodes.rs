//! Nodes shared by CPUs (a job on one node whose tasks leave CPUs free takes only as many as
//! it has tasks) when things go wrong: the shared node stops answering, then comes back.

use std::time::Duration;

use storm_cluster::control::JobInfo;
use storm_cluster::control::{JobState, NodeState};
use storm_sim::{Sim, SimJob, SimOptions};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn info(s: &Sim, job: u64) -> Option<JobInfo> {
    s.mm().queue_view().into_iter().find(|j| j.job == job)
}

fn running(s: &Sim, job: u64) -> bool {
    info(s, job).is_some_and(|j| j.state == JobState::Running)
}

/// Two one-task jobs share a node of two CPUs, each on a CPU of its own. The node freezes
/// until it is declared down: both jobs (submitted with `--requeue`) run again on the other
/// node, again each on a CPU of its own. Once the frozen node is back, it is whole and free:
/// two jobs that each need a whole node run on the two nodes at once, so no CPU was lost or
/// is still counted as held by the jobs that left it.
#[test]
fn jobs_sharing_a_node_that_fails_run_again_elsewhere_and_its_cpus_come_back() {
    let mut s = Sim::new(SimOptions {
        nodes: 2,
        cpus: 2,
        ..SimOptions::default()
    })
    .unwrap();
    s.run_until_up(Duration::from_secs(5)).unwrap();
    let small = SimJob {
        requeue: true,
        ..SimJob::new(1, ms(3_000))
    };
    let a = s.submit(&small).unwrap();
    let b = s.submit(&small).unwrap();
    assert!(s.run_until(ms(2_000), |s| running(s, a) && running(s, b)));
    let (ia, ib) = (info(&s, a).unwrap(), info(&s, b).unwrap());
    assert_eq!(ia.nodes, ib.nodes, "the two small jobs share one node");
    let (ca, cb) = (ia.cpus.clone().unwrap(), ib.cpus.clone().unwrap());
    assert!(
        ca.intersection(&cb).is_empty(),
        "each on CPUs of its own: {ca} and {cb}"
    );
    let shared = ia.nodes.first().unwrap();
    let other = 1 - shared;

    s.freeze(shared, true);
    assert!(
        s.run_until(ms(5_000), |s| {
            [a, b]
                .iter()
                .all(|&j| running(s, j) && info(s, j).is_some_and(|i| i.nodes.contains(other)))
        }),
        "both jobs run again on node {other}: {:?}",
        s.mm().queue_view()
    );
    let (ia, ib) = (info(&s, a).unwrap(), info(&s, b).unwrap());
    let (ca, cb) = (ia.cpus.unwrap(), ib.cpus.unwrap());
    assert!(
        ca.intersection(&cb).is_empty(),
        "on node {other} too, each on CPUs of its own: {ca} and {cb}"
    );
    assert_eq!(s.started(a).len(), 2, "job {a} started again");
    assert_eq!(s.started(b).len(), 2, "job {b} started again");

    s.freeze(shared, false);
    assert!(
        s.run_until(ms(10_000), |s| s.state(shared).state == NodeState::Idle),
        "node {shared} came back: {:?}",
        s.state(shared)
    );
    assert!(s.run_until(ms(10_000), |s| {
        s.outcome(a).is_some() && s.outcome(b).is_some()
    }));
    assert_eq!(s.outcome(a).unwrap().reason, None);
    assert_eq!(s.outcome(b).unwrap().reason, None);
    // Every CPU of both nodes is free again: two jobs that fill a node each run at once.
    let whole = SimJob::new(1, ms(500)).with_tasks(2);
    let c = s.submit(&whole).unwrap();
    let d = s.submit(&whole).unwrap();
    assert!(
        s.run_until(ms(2_000), |s| running(s, c) && running(s, d)),
        "two whole-node jobs run at once: {:?}",
        s.mm().queue_view()
    );
    assert_ne!(info(&s, c).unwrap().nodes, info(&s, d).unwrap().nodes);
}
