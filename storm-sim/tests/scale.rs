//! The real MM core driving 16,384 simulated nodes (issue 16's target machine), in one
//! process: every node registers and comes up, a job on the whole machine runs and ends with
//! every task's status, and a stopped node is DOWN at exactly K missed heartbeats.

use std::time::Duration;

use storm_cluster::control::NodeState;
use storm_cluster::messages::RankStatus;
use storm_sim::{Sim, SimJob, SimOptions};

const NODES: u32 = 16_384;

#[test]
fn the_mm_drives_16384_nodes_through_a_full_machine_job_and_a_failure() {
    let k = 3;
    let mut s = Sim::new(SimOptions {
        nodes: NODES,
        missed_heartbeats: k,
        ..SimOptions::default()
    })
    .expect("a 16,384-node simulated cluster");
    s.run_until_up(Duration::from_secs(5))
        .expect("all nodes up");
    let job = s
        .submit(&SimJob::new(NODES, Duration::from_millis(50)))
        .expect("a full-machine job is accepted");
    assert!(
        s.run_until(Duration::from_secs(5), |s| s.outcome(job).is_some()),
        "the full-machine job did not end"
    );
    let out = s.outcome(job).unwrap();
    assert_eq!(out.reason, None);
    assert_eq!(out.ranks.len(), NODES as usize);
    assert!(
        out.ranks.iter().all(|r| *r == Some(RankStatus::Exited(0))),
        "every task's status arrives"
    );
    let victim = NODES - 1;
    s.freeze(victim, true);
    let frozen_at = s.now();
    assert!(
        s.run_until(Duration::from_secs(5), |s| s.state(victim).state
            == NodeState::Down)
    );
    let slice = s.config().timeslice();
    // The node took the heartbeat of the timeslice it was frozen in.
    assert_eq!(
        s.now() - frozen_at,
        slice * k,
        "DOWN K = {k} timeslices after its last heartbeat"
    );
    assert_eq!(
        s.state(0).state,
        NodeState::Idle,
        "another node is not blamed"
    );
}
