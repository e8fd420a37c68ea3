//! A node whose NM comes back (a fresh process: its memory starts empty) while a job waits for
//! it joins the heartbeat and runs that job at once. Seen from outside: the job runs to its
//! end, its task started once on the node, whenever in the MM's receipt-check cycle the NM
//! comes back.

use std::time::Duration;

use storm_sim::{Sim, SimJob, SimOptions};

fn two_nodes() -> Sim {
    Sim::up(SimOptions {
        nodes: 2,
        ..SimOptions::default()
    })
    .unwrap()
}

/// Node 1 dies; a two-node job waits for it; its NM starts again `offset` later than 100 ms
/// after the submission, and the job is placed on it as soon as the MM admits it. How the job
/// ended, if not to its end with its task started once on node 1.
fn lost_when_back_after(offset: Duration) -> Option<String> {
    let mut sim = two_nodes();
    sim.kill(1);
    sim.run_for(Duration::from_secs(1));
    let job = sim
        .submit(&SimJob::new(2, Duration::from_millis(200)))
        .unwrap();
    sim.run_for(Duration::from_millis(100) + offset);
    sim.restart_nm(1, 0);
    if !sim.run_until(Duration::from_secs(10), |s| s.outcome(job).is_some()) {
        return Some("it never ended".into());
    }
    let outcome = sim.outcome(job).unwrap();
    let started = sim.node(1).tasks_started(job);
    match (&outcome.reason, outcome.exit_code(), started) {
        (None, 0, 1) => None,
        (reason, code, started) => Some(format!(
            "{reason:?}, exit {code}, its task started {started} times on node 1"
        )),
    }
}

/// Every offset over a receipt check's period and a bit. Before the MM passed over, at the
/// next check, a member admitted since the last one, a check between the MM's admitting the
/// node and its NM's taking `Start` found the fresh NM's heartbeat counter at zero, "behind",
/// and the node was lost with the job ("stopped taking heartbeats (behind at a receipt
/// check)"): for 10 of every 100 ms of offsets here.
#[test]
fn a_node_back_while_a_job_waits_for_it_runs_it_whenever_in_the_check_cycle_it_returns() {
    let period = two_nodes().config().failure.check_interval_ms;
    let lost: Vec<(u64, String)> = (0..period + 10)
        .filter_map(|ms| Some((ms, lost_when_back_after(Duration::from_millis(ms))?)))
        .collect();
    assert!(lost.is_empty(), "jobs lost, by offset (ms): {lost:#?}");
}
