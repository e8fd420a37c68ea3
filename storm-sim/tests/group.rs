//! A replicated MM in the simulator, at issue 16's 16,384 nodes: three replicas keep the
//! journal through raft-rs (`storm_sim::group`), and the leader is killed while a job on the
//! whole machine runs and jobs wait behind it. Another replica is elected, and its MM core
//! takes the cluster over in the next term from its own copy of the journal: every node
//! joins it, the running job goes on undisturbed (one task per node, never launched again)
//! and ends with every task's status, the waiting jobs run once each, and a job submitted
//! after the failover runs.

use std::time::Duration;

use storm_cluster::messages::RankStatus;
use storm_sim::{Sim, SimJob, SimOptions};

const NODES: u32 = 16_384;

#[test]
fn a_group_of_three_loses_its_leader_at_16384_nodes_and_no_job_is_lost_or_run_twice() {
    let mut s = Sim::new(SimOptions {
        nodes: NODES,
        managers: 3,
        ..SimOptions::default()
    })
    .expect("a 16,384-node simulated cluster with three MM replicas");
    s.run_until_up(Duration::from_secs(5))
        .expect("all nodes up");
    let first = s.leader_replica().expect("a replica leads");
    let running = s
        .submit(&SimJob::new(NODES, Duration::from_millis(800)))
        .expect("a full-machine job is accepted");
    assert!(s.run_until(Duration::from_secs(5), |s| !s.started(running).is_empty()));
    let waiting: Vec<_> = (0..2)
        .map(|_| {
            s.submit(&SimJob::new(NODES / 2, Duration::from_millis(50)))
                .expect("a waiting job is accepted")
        })
        .collect();
    let elected_after = s.kill_leader().expect("another replica is elected");
    let next = s.leader_replica().expect("a replica leads");
    assert_ne!(next, first, "the killed replica cannot lead");
    let killed_at = s.now() - elected_after;
    s.run_until_up(Duration::from_secs(5))
        .expect("every node joins the new leader");
    let rejoined_after = s.now() - killed_at;
    // The running job's tasks were not launched again: one task on each node.
    for n in [0, NODES / 2, NODES - 1] {
        assert_eq!(
            s.node(n).run_windows(running).len(),
            1,
            "node {n} holds one task of the running job"
        );
    }
    let after = s
        .submit(&SimJob::new(1, Duration::from_millis(10)))
        .expect("a job submitted after the failover is accepted");
    let all: Vec<_> = [running, after].into_iter().chain(waiting).collect();
    assert!(
        s.run_until(Duration::from_secs(20), |s| all
            .iter()
            .all(|&j| s.outcome(j).is_some())),
        "not every job ended"
    );
    for &job in &all {
        let out = s.outcome(job).unwrap();
        assert_eq!(out.reason, None, "job {job}: {out:?}");
        assert!(
            out.ranks.iter().all(|r| *r == Some(RankStatus::Exited(0))),
            "job {job}: every task's status arrives"
        );
    }
    assert_eq!(s.outcome(running).unwrap().ranks.len(), NODES as usize);
    // The new leader's journal holds each job once, under the id it was given.
    let journaled = s.journaled();
    let mut ids: Vec<_> = journaled.jobs.iter().map(|r| r.id).collect();
    ids.sort_unstable();
    let mut want = all.clone();
    want.sort_unstable();
    assert_eq!(ids, want);
    eprintln!(
        "leader killed: replica {next} elected and its MM running after {elected_after:?}, every \
         node joined after {rejoined_after:?} (virtual time)"
    );
}
