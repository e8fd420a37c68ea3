//! The MM's job table and its policy's queue never disagree: a job the MM drops while it
//! waits leaves the queue with it, so the policy never starts a job the MM no longer holds.
//!
//! Issue 61, finding H1: a user submitted a job that had to wait, with its program sent
//! along, and grew the program while it waited. The copy beside the journal found the size
//! changed and the MM ended the job, dropping it from its table but not from the policy's
//! queue; when the job ahead ended, the policy started the dropped job and the MM panicked
//! (`expect("job")` in `start_job`). Any local user could crash the MM, and a user who
//! rebuilt their binary right after submitting did it by accident. This runs the real MM core
//! through exactly that, under each policy (each keeps a queue of its own).

use std::time::Duration;

use storm_cluster::config::PolicyKind;
use storm_sim::{Sim, SimJob, SimOptions};

fn ms(n: u64) -> Duration {
    Duration::from_millis(n)
}

fn one_node(policy: PolicyKind) -> Sim {
    Sim::up(SimOptions {
        nodes: 1,
        policy,
        mpl: 1,
        ..Default::default()
    })
    .expect("a simulated cluster, its node up")
}

/// A job waits behind another with its program sent along; its user changes the program
/// while its copy is made: the job ends, saying why, and the MM goes on: the job ahead ends,
/// and the next job runs. Without the job leaving the policy's queue this panics in the MM
/// (under every policy) the moment the job ahead ends.
#[test]
fn a_job_whose_program_changed_while_it_waited_ends_and_the_mm_goes_on() {
    for policy in [PolicyKind::Fcfs, PolicyKind::Easy, PolicyKind::Gang] {
        let mut s = one_node(policy);
        let ahead = s.submit(&SimJob::new(1, ms(200))).unwrap();
        assert!(
            s.run_until(ms(1_000), |s| !s.started(ahead).is_empty()),
            "{policy:?}: the first job starts"
        );
        // The copy of the waiting job's program does not complete before its user changes it.
        s.allow_copies(Some(0));
        s.send_submission(&SimJob::new(1, ms(10)).with_program(4_000_000));
        s.run_for(ms(20));
        // Job ids are given in order.
        let waiting = ahead + 1;
        assert!(
            s.change_program_during_copy(waiting),
            "{policy:?}: a copy of job {waiting}'s program was under way"
        );
        s.allow_copies(None);
        assert!(
            s.run_until(ms(1_000), |s| s.finished(waiting).is_some()),
            "{policy:?}: the job whose program changed ends"
        );
        let reason = s
            .outcome(waiting)
            .unwrap()
            .reason
            .clone()
            .unwrap_or_default();
        assert!(
            reason.contains("changed"),
            "{policy:?}: the reason says the program changed: {reason}"
        );
        // The job ahead ends, and with it the policy's next decision: the MM takes it.
        assert!(
            s.run_until(ms(2_000), |s| s.finished(ahead).is_some()),
            "{policy:?}: the first job ends"
        );
        s.run_for(ms(50));
        assert!(
            s.started(waiting).is_empty(),
            "{policy:?}: the ended job never starts"
        );
        let next = s.submit(&SimJob::new(1, ms(5))).unwrap();
        s.assert_ran_once_to_its_end(next, 1, ms(2_000));
    }
}
