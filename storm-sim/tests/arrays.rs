//! Job arrays (`storm batch --array`) in virtual time: one job per index, at most the
//! throttle's number running at once (from when their submitter was told they started and
//! ended), `afterok` on an array waits for every element, and all of it holds across a
//! restart of the MM.

use std::time::{Duration, Instant};

use storm_cluster::control::{JobState, Reply};
use storm_cluster::messages::JobId;
use storm_sim::{Sim, SimJob, SimOptions};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn sim(nodes: u32) -> Sim {
    let mut s = Sim::new(SimOptions {
        nodes,
        ..SimOptions::default()
    })
    .expect("simulated cluster");
    s.run_until_up(Duration::from_secs(5)).expect("nodes up");
    s
}

/// When each job was told it started and ended (the submitter's view).
fn spans(s: &Sim, jobs: &[JobId]) -> Vec<(Instant, Instant)> {
    jobs.iter()
        .map(|&j| (s.started(j)[0], s.finished(j).expect("ended").0))
        .collect()
}

/// The most spans that overlap at one instant.
fn most_at_once(spans: &[(Instant, Instant)]) -> usize {
    spans
        .iter()
        .map(|&(start, _)| {
            spans
                .iter()
                .filter(|&&(a, b)| a <= start && start < b)
                .count()
        })
        .max()
        .unwrap_or(0)
}

#[test]
fn an_array_runs_one_job_per_index_and_at_most_its_throttle_at_once() {
    let mut s = sim(4);
    let array = s
        .submit(&SimJob::new(1, ms(100)).with_array("0-4,9%2"))
        .unwrap();
    let elements: Vec<JobId> = (array..array + 6).collect();
    s.run_for(ms(20));
    let view = s.mm().queue_view();
    let indices: Vec<u32> = view
        .iter()
        .filter_map(|j| j.element.filter(|e| e.array == array).map(|e| e.index))
        .collect();
    assert_eq!(
        indices,
        [0, 1, 2, 3, 4, 9],
        "one job per index, ids in order"
    );
    let waiting = view.iter().find(|j| j.job == array + 2).unwrap();
    assert_eq!(waiting.state, JobState::Queued);
    assert_eq!(
        waiting.reason.as_deref(),
        Some(
            format!("waiting: array job {array} runs at most 2 of its elements at once (%2)")
                .as_str()
        ),
        "four nodes are free: the throttle holds it"
    );
    assert!(s.run_until(ms(5_000), |s| {
        elements.iter().all(|j| s.outcome(*j).is_some())
    }));
    let spans = spans(&s, &elements);
    assert_eq!(most_at_once(&spans), 2, "{spans:?}");
    for pair in spans.windows(2) {
        assert!(pair[0].0 <= pair[1].0, "elements start in index order");
    }
}

#[test]
fn afterok_on_an_array_waits_for_every_element() {
    let mut s = sim(4);
    let array = s
        .submit(&SimJob::new(1, ms(100)).with_array("0-2"))
        .unwrap();
    let after = s
        .submit(&SimJob::new(1, ms(10)).with_dependency(&format!("afterok:{array}")))
        .unwrap();
    assert!(s.run_until(ms(5_000), |s| s.outcome(after).is_some()));
    let last_end = (array..array + 3)
        .map(|j| s.finished(j).expect("ended").0)
        .max()
        .unwrap();
    assert!(s.started(after)[0] >= last_end);
    assert_eq!(s.outcome(after).unwrap().exit_code(), 0);
}

#[test]
fn arrays_are_batch_jobs_within_the_clusters_limit() {
    let mut s = sim(2);
    let mut plain = SimJob::new(1, ms(10)).with_array("0-3");
    plain.batch = false;
    assert_eq!(
        s.submit(&plain).unwrap_err(),
        "a job array is a batch job: use storm batch --array"
    );
    let e = s
        .submit(&SimJob::new(1, ms(10)).with_array("0-5000"))
        .unwrap_err();
    assert_eq!(
        e,
        "--array asks for 5001 elements, over the limit ([limits] max_array_size = 1001)"
    );
}

/// How job `job` ended, as `storm history` keeps it (whoever followed it).
fn history(s: &Sim, job: JobId) -> Option<storm_cluster::control::JobOutcome> {
    s.journaled()
        .jobs
        .into_iter()
        .find(|r| r.id == job)
        .and_then(|r| match r.state {
            storm_mm::journal::JobState::Finished { outcome, .. } => Some(outcome),
            _ => None,
        })
}

/// A restarted MM holds every element still to run, keeps the throttle, and runs them all,
/// none twice; the submitter (gone, as a batch job's is) is not waited for. Seen from the
/// nodes: at no step do more than two elements run.
#[test]
fn an_array_survives_a_restart_of_the_mm_with_its_throttle() {
    let mut s = sim(4);
    let array = s
        .submit(&SimJob::new(1, ms(200)).with_array("0-5%2"))
        .unwrap();
    let elements: Vec<JobId> = (array..array + 6).collect();
    let running = |s: &Sim| {
        elements
            .iter()
            .filter(|&&j| (0..4).any(|n| s.node(n).running(j)))
            .count()
    };
    let mut most = 0;
    let until = s.now() + ms(250);
    while s.now() < until {
        s.step();
        most = most.max(running(&s));
    }
    s.hang_up().unwrap();
    s.restart_mm().unwrap();
    let until = s.now() + ms(10_000);
    while !elements.iter().all(|j| history(&s, *j).is_some()) {
        assert!(s.now() < until, "not every element ended");
        s.step();
        most = most.max(running(&s));
    }
    assert_eq!(most, 2, "at most the throttle's two at once, and that many");
    for j in &elements {
        let out = history(&s, *j).unwrap();
        assert_eq!(
            (out.exit_code(), out.reason.as_deref()),
            (0, None),
            "job {j}"
        );
        assert_eq!(out.ranks.len(), 1, "job {j} ran once");
    }
}

/// CI saw `storm queue` list elements 0 to 2 of an array, and element 0 running, while the
/// copy of element 7's program was still being made: the array had not been accepted (its
/// submitter had no answer yet), and an MM restarted then would have known a part of it. An
/// array is accepted as one: while any element's copy is under way, no listing names any of
/// its elements, no node runs one, and its submitter hears nothing; once the last copy is
/// made, every element is listed and they run, each once.
#[test]
fn an_array_is_accepted_whole_once_every_elements_copy_is_made() {
    let mut s = sim(4);
    s.allow_copies(Some(0));
    s.send_submission(
        &SimJob::new(1, ms(30))
            .with_program(4096)
            .with_array("0-2,7%1"),
    );
    s.run_for(ms(20));
    // A slow disk: two of the four copies are made (element 0 starts at once, and its
    // copy is made all the same: a restart before its launch would queue it again), element
    // 7's is not.
    s.allow_copies(Some(2));
    s.run_for(ms(50));
    let listed = s.queue_listing().unwrap();
    assert!(
        listed.is_empty(),
        "a listing names elements of an array whose last copy is still being made: {listed:?}"
    );
    let ran: Vec<_> = (0..4).flat_map(|n| s.node(n).jobs()).collect();
    assert!(
        ran.is_empty(),
        "nodes run elements of an array not yet accepted: {ran:?}"
    );
    assert!(
        !s.replies()
            .iter()
            .any(|(_, r)| matches!(r, Reply::Accepted { .. })),
        "the submitter was told of the array before it was whole"
    );
    // The last copy is made: the array is accepted, whole.
    s.allow_copies(None);
    s.run_for(ms(5));
    let array = s
        .replies()
        .iter()
        .find_map(|(_, r)| match r {
            Reply::Accepted { job, .. } => Some(*job),
            _ => None,
        })
        .expect("the array is accepted once its copies are made");
    let indices: Vec<u32> = s
        .queue_listing()
        .unwrap()
        .iter()
        .filter_map(|j| j.element.filter(|e| e.array == array).map(|e| e.index))
        .collect();
    assert_eq!(indices, [0, 1, 2, 7], "every element is listed at once");
    let elements: Vec<JobId> = (array..array + 4).collect();
    assert!(s.run_until(Duration::from_secs(5), |s| {
        elements.iter().all(|&j| s.finished(j).is_some())
    }));
    for &j in &elements {
        assert_eq!(s.started(j).len(), 1, "element {j} ran once");
    }
}
