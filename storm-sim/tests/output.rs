//! The tasks' output in virtual time: simulated tasks write lines that cross the NM's own
//! forwarder, the node's output queue and the MM to the client.

use std::time::Duration;

use storm_cluster::control::Reply;
use storm_cluster::messages::Stream;
use storm_sim::{Sim, SimJob, SimOptions};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

/// What a simulated task of rank `rank` writing `lines` lines prints.
fn lines_of(rank: u32, lines: u32) -> String {
    (1..=lines)
        .map(|i| format!("rank {rank} line {i}\n"))
        .collect()
}

/// Every line reaches the client, in order, and before the job's outcome: the NM reports a
/// task's end only once its output was delivered.
#[test]
fn every_line_a_task_writes_reaches_the_client_before_its_job_ends() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let job = s.submit(&SimJob::new(4, ms(300)).with_lines(400)).unwrap();
    assert!(s.run_until(ms(3_000), |s| s.outcome(job).is_some()));
    assert_eq!(s.outcome(job).unwrap().reason, None);
    assert_every_line(&s, job, 4, 400);
    assert!(s.output(job, Stream::Stderr).is_empty());
    assert_output_before_outcome(&s, job);
}

/// Every rank of `ranks` wrote its `lines` lines, and the client has them all, in order.
fn assert_every_line(s: &Sim, job: u64, ranks: u32, lines: u32) {
    let out = s.output(job, Stream::Stdout);
    for rank in 0..ranks {
        assert_eq!(
            out.get(&rank).map(String::as_str),
            Some(lines_of(rank, lines).as_str()),
            "rank {rank}"
        );
    }
}

/// The client had the job's last output before its outcome.
fn assert_output_before_outcome(s: &Sim, job: u64) {
    let position = |want: &dyn Fn(&Reply) -> bool| s.replies().iter().rposition(|(_, r)| want(r));
    let last_output = position(&|r| matches!(r, Reply::Output(c) if c.job == job)).unwrap();
    let finished = position(&|r| matches!(r, Reply::Finished(o) if o.job == job)).unwrap();
    assert!(
        last_output < finished,
        "output came after the outcome: reply {last_output} after {finished}"
    );
}

/// The MM's memory, with the output entries it had not passed on yet, goes with its process.
/// The NM keeps what the MM has not released and sends it again in the epoch the new MM
/// begins: nothing is lost.
#[test]
fn output_written_while_the_mm_restarts_reaches_the_client_once_and_in_order() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let job = s
        .submit(&SimJob::new(2, ms(1_000)).with_lines(2_000))
        .unwrap();
    s.run_for(ms(300));
    let before = s.output(job, Stream::Stdout);
    assert!(
        before.values().all(|text| !text.is_empty()),
        "every rank wrote before the restart: {before:?}"
    );
    s.restart_mm().unwrap();
    assert!(s.run_until(ms(10_000), |s| s.outcome(job).is_some()));
    assert_eq!(s.outcome(job).unwrap().reason, None, "{:?}", s.outcome(job));
    assert_every_line(&s, job, 2, 2_000);
}

/// A task that writes more at its end than the node's output queue holds (8 slots of 16 KiB
/// here) and exits at once: the NM waits for the MM to take it all, slot by slot, before it
/// reports the task's end.
#[test]
fn a_burst_larger_than_the_output_queue_arrives_whole_before_the_outcome() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    // About 22 bytes a line: 10,000 lines are 220 KB.
    let job = s.submit(&SimJob::new(2, ms(0)).with_lines(10_000)).unwrap();
    assert!(s.run_until(ms(3_000), |s| s.outcome(job).is_some()));
    assert_eq!(s.outcome(job).unwrap().reason, None);
    assert_every_line(&s, job, 2, 10_000);
    assert_output_before_outcome(&s, job);
}

/// A job's output may still be on its way to the submitter when the MM journals the job's
/// end and goes (killed before its socket writer wrote the reply; a leader that lost the
/// group): the entry was never released, so the node sends it again to the next MM, which
/// knows the job only as ended. That MM holds it for the submitter, and the submitter that
/// follows the job again gets every line, then the outcome.
#[test]
fn output_of_a_job_that_ended_as_its_mm_went_reaches_the_submitter_that_follows_it() {
    let mut s = Sim::up(SimOptions::default()).expect("a simulated cluster, every node up");
    let job = s.submit(&SimJob::new(2, ms(50)).with_lines(5)).unwrap();
    // The client's socket writer falls behind: the MM ends the job and journals its end,
    // but the replies with its output (and its outcome) are still unwritten.
    assert!(s.run_until(ms(2_000), |s| !s.started(job).is_empty()));
    s.stop_reading(true);
    assert!(s.run_until(ms(3_000), |s| {
        s.journaled()
            .jobs
            .iter()
            .any(|r| r.id == job && matches!(r.state, storm_mm::journal::JobState::Finished { .. }))
    }));
    s.run_for(ms(50));
    // The MM goes with what it had not written; the client follows the job at the next.
    s.restart_mm().unwrap();
    s.stop_reading(false);
    assert!(s.run_until(ms(10_000), |s| s.outcome(job).is_some()));
    assert_eq!(s.outcome(job).unwrap().reason, None, "{:?}", s.outcome(job));
    assert_every_line(&s, job, 2, 5);
    assert_output_before_outcome(&s, job);
}
