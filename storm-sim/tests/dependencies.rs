//! `--dependency`, in virtual time: a job with a dependency starts only once it is met, as
//! its submitter sees it (when the MM says it started, how it ended); one whose dependency
//! can never be met ends with the reason and never runs; and the whole holds across a
//! restart of the MM.

use std::time::Duration;

use storm_cluster::control::JobState;
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

fn job(nodes: u32, work: u64) -> SimJob {
    SimJob::new(nodes, ms(work))
}

/// When the submitter was told `job` ended.
fn ended_at(s: &Sim, job: JobId) -> std::time::Instant {
    s.finished(job).expect("ended").0
}

/// What `storm queue` says of `job`: its state and reason.
fn queue_line(s: &Sim, job: JobId) -> Option<(JobState, Option<String>)> {
    s.mm()
        .queue_view()
        .into_iter()
        .find(|j| j.job == job)
        .map(|j| (j.state, j.reason))
}

#[test]
fn afterok_starts_only_after_its_job_succeeded_though_nodes_were_free() {
    // Four nodes: the dependent job would fit beside the first at once.
    let mut s = sim(4);
    let first = s.submit(&job(2, 300)).unwrap();
    let then = s
        .submit(&job(2, 50).with_dependency(&format!("afterok:{first}")))
        .unwrap();
    s.run_for(ms(100));
    assert_eq!(s.started(then), [], "it waits for job {first}");
    assert_eq!(
        queue_line(&s, then),
        Some((
            JobState::Queued,
            Some(format!(
                "waiting for its dependency afterok:{first}: job {first} has not ended"
            ))
        ))
    );
    assert!(s.run_until(ms(5_000), |s| !s.started(then).is_empty()));
    // Met once is met for good: the journal's record of the job no longer has it, so that
    // a restarted MM does not judge it again against a history that may have forgotten
    // job {first}.
    let record = s.journaled().jobs.into_iter().find(|r| r.id == then);
    assert_eq!(record.expect("journaled").req.dependency, None);
    assert!(s.run_until(ms(5_000), |s| s.outcome(then).is_some()));
    assert_eq!(s.outcome(then).unwrap().exit_code(), 0);
    let started = s.started(then)[0];
    assert!(
        started >= ended_at(&s, first),
        "it started {:?} before job {first} ended",
        ended_at(&s, first) - started
    );
}

#[test]
fn a_dependency_that_can_never_be_met_ends_the_job_with_the_reason() {
    let mut s = sim(4);
    let failing = s.submit(&job(1, 200).with_exit_code(3)).unwrap();
    let ok_after = s
        .submit(&job(1, 50).with_dependency(&format!("afterok:{failing}")))
        .unwrap();
    let notok_after = s
        .submit(&job(1, 50).with_dependency(&format!("afternotok:{failing}")))
        .unwrap();
    let any_after = s
        .submit(&job(1, 50).with_dependency(&format!("afterany:{failing}")))
        .unwrap();
    assert!(s.run_until(ms(5_000), |s| {
        [ok_after, notok_after, any_after]
            .iter()
            .all(|j| s.outcome(*j).is_some())
    }));
    let never = s.outcome(ok_after).unwrap();
    assert_eq!(
        never.reason.as_deref(),
        Some(
            format!("afterok:{failing} can never be met: job {failing} failed with exit code 3")
                .as_str()
        )
    );
    assert_eq!(never.exit_code(), 1);
    assert_eq!(s.started(ok_after), [], "it never ran");
    for ran in [notok_after, any_after] {
        assert_eq!(s.outcome(ran).unwrap().exit_code(), 0, "job {ran}");
        assert!(s.started(ran)[0] >= ended_at(&s, failing), "job {ran}");
    }
    // A chain settles at once: a job after the impossible one, after it failing.
    let chained = s
        .submit(&job(1, 50).with_dependency(&format!("afternotok:{ok_after}")))
        .unwrap();
    assert!(s.run_until(ms(2_000), |s| s.outcome(chained).is_some()));
    assert_eq!(s.outcome(chained).unwrap().exit_code(), 0);
}

#[test]
fn submissions_naming_unknown_jobs_or_already_impossible_dependencies_are_refused() {
    let mut s = sim(2);
    let e = s
        .submit(&job(1, 10).with_dependency("afterok:99"))
        .unwrap_err();
    assert_eq!(e, "--dependency names job 99, which does not exist yet");
    let ok = s.submit(&job(1, 10)).unwrap();
    assert!(s.run_until(ms(2_000), |s| s.outcome(ok).is_some()));
    let e = s
        .submit(&job(1, 10).with_dependency(&format!("afternotok:{ok}")))
        .unwrap_err();
    assert_eq!(
        e,
        format!("afternotok:{ok} can never be met: job {ok} completed")
    );
    // A refused submission spends no job id.
    let next = s.submit(&job(1, 10)).unwrap();
    assert_eq!(next, ok + 1);
}

#[test]
fn with_a_question_mark_one_met_condition_suffices_and_with_commas_all_must_hold() {
    let mut s = sim(4);
    let short = s.submit(&job(1, 100)).unwrap();
    let long = s.submit(&job(1, 600)).unwrap();
    let either = s
        .submit(&job(1, 10).with_dependency(&format!("afterany:{short}?afterany:{long}")))
        .unwrap();
    let both = s
        .submit(&job(1, 10).with_dependency(&format!("afterany:{short},afterany:{long}")))
        .unwrap();
    assert!(s.run_until(ms(5_000), |s| s.outcome(both).is_some()));
    let either_started = s.started(either)[0];
    assert!(either_started >= ended_at(&s, short));
    assert!(
        either_started < ended_at(&s, long),
        "`?`: the first job's end sufficed"
    );
    assert!(s.started(both)[0] >= ended_at(&s, long), "`,`: both ended");
}

#[test]
fn after_waits_only_for_the_start() {
    let mut s = sim(4);
    let blocker = s.submit(&job(4, 200)).unwrap();
    let first = s.submit(&job(2, 400)).unwrap();
    let after = s
        .submit(&job(2, 10).with_dependency(&format!("after:{first}")))
        .unwrap();
    assert!(s.run_until(ms(5_000), |s| s.outcome(after).is_some()));
    assert!(
        s.started(after)[0] >= s.started(first)[0],
        "it waited for job {first}'s start"
    );
    assert!(
        s.started(first)[0] >= ended_at(&s, blocker),
        "job {first} itself waited for the nodes"
    );
    assert!(s.outcome(first).is_none(), "it ran beside job {first}");
}

#[test]
fn singleton_jobs_of_one_name_run_one_at_a_time_and_others_beside_them() {
    let mut s = sim(4);
    let named: Vec<JobId> = (0..3)
        .map(|_| {
            s.submit(
                &job(1, 100)
                    .with_name("nightly")
                    .with_dependency("singleton"),
            )
            .unwrap()
        })
        .collect();
    let other = s
        .submit(&job(1, 100).with_name("other").with_dependency("singleton"))
        .unwrap();
    assert!(s.run_until(ms(5_000), |s| named.iter().all(|j| s.outcome(*j).is_some())));
    for pair in named.windows(2) {
        assert!(
            s.started(pair[1])[0] >= ended_at(&s, pair[0]),
            "job {} ran beside job {} of the same name",
            pair[1],
            pair[0]
        );
    }
    assert!(
        s.started(other)[0] < ended_at(&s, named[0]),
        "a job of another name did not wait"
    );
}

#[test]
fn a_cancelled_waiting_job_ends_and_its_dependents_learn_it() {
    let mut s = sim(2);
    let running = s.submit(&job(2, 500)).unwrap();
    let waiting = s
        .submit(&job(1, 10).with_dependency(&format!("afterok:{running}")))
        .unwrap();
    let after_waiting = s
        .submit(&job(1, 10).with_dependency(&format!("afterok:{waiting}")))
        .unwrap();
    s.run_for(ms(50));
    s.cancel(waiting);
    assert!(s.run_until(ms(2_000), |s| s.outcome(after_waiting).is_some()));
    let reason = s.outcome(after_waiting).unwrap().reason.clone().unwrap();
    assert!(
        reason.starts_with(&format!(
            "afterok:{waiting} can never be met: job {waiting} ended: cancelled"
        )),
        "{reason}"
    );
    assert!(s.outcome(running).is_none(), "the running job goes on");
}

/// The dependency is journaled with the job: a restarted MM holds the job until it is met,
/// judging it against the outcomes its journal kept.
#[test]
fn dependencies_hold_across_a_restart_of_the_mm() {
    let mut s = sim(4);
    let first = s.submit(&job(2, 600)).unwrap();
    // Fails after the restart.
    let failing = s.submit(&job(1, 800).with_exit_code(2)).unwrap();
    let waits = s
        .submit(&job(2, 50).with_dependency(&format!("afterok:{first}")))
        .unwrap();
    let doomed = s
        .submit(&job(1, 50).with_dependency(&format!("afterok:{first},afterok:{failing}")))
        .unwrap();
    s.run_for(ms(300));
    s.restart_mm().unwrap();
    s.run_for(ms(100));
    assert_eq!(s.started(waits), [], "still waiting after the restart");
    assert_eq!(
        queue_line(&s, waits).map(|(_, r)| r),
        Some(Some(format!(
            "waiting for its dependency afterok:{first}: job {first} has not ended"
        )))
    );
    assert!(s.run_until(ms(5_000), |s| s.outcome(waits).is_some()));
    assert_eq!(s.outcome(waits).unwrap().exit_code(), 0);
    assert!(s.started(waits)[0] >= ended_at(&s, first));
    assert!(s.run_until(ms(5_000), |s| s.outcome(doomed).is_some()));
    assert_eq!(s.started(doomed), [], "it never ran");
    let doomed = s.outcome(doomed).unwrap().reason.clone().unwrap();
    assert_eq!(
        doomed,
        format!("afterok:{failing} can never be met: job {failing} failed with exit code 2")
    );
}
