//! How jobs end, as `storm history` tells it (sacct's states): completed and failed by
//! their tasks, cancelled, timeout and node_fail by what ended them, each with the exit code
//! its submitter got.

use std::time::Duration;

use storm_cluster::control::JobState;
use storm_sim::{Sim, SimJob, SimOptions};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

#[test]
fn each_way_of_ending_has_its_state() {
    let mut s = Sim::new(SimOptions {
        nodes: 4,
        ..SimOptions::default()
    })
    .expect("simulated cluster");
    s.run_until_up(Duration::from_secs(5)).expect("nodes up");
    let ok = s.submit(&SimJob::new(1, ms(50))).unwrap();
    let failed = s.submit(&SimJob::new(1, ms(50)).with_exit_code(4)).unwrap();
    let cancelled = s.submit(&SimJob::new(1, ms(5_000))).unwrap();
    let mut limited = SimJob::new(1, ms(5_000));
    limited.time_limit = Some(Duration::from_secs(1));
    let timeout = s.submit(&limited).unwrap();
    s.run_for(ms(100));
    s.cancel(cancelled);
    let lost = s.submit(&SimJob::new(1, ms(5_000))).unwrap();
    s.run_for(ms(100));
    let node = (0..4)
        .find(|&n| s.node(n).running(lost))
        .expect("the job runs somewhere");
    s.kill(node);
    let all = [ok, failed, cancelled, timeout, lost];
    assert!(s.run_until(ms(10_000), |s| all.iter().all(|j| s.outcome(*j).is_some())));
    let state = |j| s.outcome(j).unwrap().state();
    assert_eq!(state(ok), JobState::Completed);
    assert_eq!(state(failed), JobState::Failed);
    assert_eq!(s.outcome(failed).unwrap().exit_code(), 4);
    assert_eq!(state(cancelled), JobState::Cancelled);
    assert_eq!(state(timeout), JobState::Timeout);
    assert_eq!(state(lost), JobState::NodeFail);
    for j in [cancelled, timeout, lost] {
        assert_ne!(s.outcome(j).unwrap().exit_code(), 0, "job {j}");
    }
}
