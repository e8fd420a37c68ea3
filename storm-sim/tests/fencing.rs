//! A replicated MM's leaders are fenced at the nodes by their Raft term: once the leader of a
//! term has welcomed a node, the MM of an older term (a deposed leader that still runs) gets
//! no node back, so it can neither schedule nor command anything; a later term's leader does.

use std::time::Duration;

use storm_cluster::control::NodeState;
use storm_sim::{Sim, SimJob, SimOptions};

fn up(s: &Sim) -> usize {
    (0..s.config().node_count())
        .filter(|&n| matches!(s.state(n).state, NodeState::Idle | NodeState::Allocated))
        .count()
}

#[test]
fn the_mm_of_an_older_term_gets_no_node_and_a_newer_term_gets_them_all() {
    let mut s = Sim::new(SimOptions {
        nodes: 4,
        ..SimOptions::default()
    })
    .expect("simulated cluster");
    s.run_until_up(Duration::from_secs(10)).unwrap();
    // The leader of term 5 takes the cluster up; a job runs under it.
    s.restart_mm_in_term(5).unwrap();
    s.run_until_up(Duration::from_secs(10)).unwrap();
    let job = s
        .submit(&SimJob::new(4, Duration::from_millis(50)))
        .unwrap();
    assert!(s.run_until(Duration::from_secs(10), |s| s.outcome(job).is_some()));
    // A deposed leader of term 3 comes back: every node refuses its welcome.
    s.restart_mm_in_term(3).unwrap();
    s.run_for(Duration::from_secs(3));
    assert_eq!(up(&s), 0, "no node may join the MM of an older term");
    let stale = s
        .submit(&SimJob::new(1, Duration::from_millis(10)))
        .unwrap();
    s.run_for(Duration::from_secs(1));
    assert!(
        s.started(stale).is_empty(),
        "an older term's MM launched a job"
    );
    // The leader of term 6 gets every node back.
    s.restart_mm_in_term(6).unwrap();
    s.run_until_up(Duration::from_secs(10)).unwrap();
    assert_eq!(up(&s), 4);
}
