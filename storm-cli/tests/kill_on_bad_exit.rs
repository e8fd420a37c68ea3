//! `storm-submit -K` (`--kill-on-bad-exit`, srun's `-K`): a rank that exits with a non-zero
//! code or is killed by a signal ends the whole job at once, on every node, and the job exits
//! with that rank's code, its reason naming the rank and its cause. Without the flag the
//! other ranks run on (the control). Seen from outside: storm-submit's exit code, its
//! standard error, and whether it is still running.

mod support;

use std::process::Stdio;
use std::time::Duration;

use support::{TestCluster, ended_within, script, text};

/// A job whose rank 1 fails with `fail` (a shell command) once it has written its marker,
/// while every other rank waits for five minutes.
fn one_rank_fails(dir: &std::path::Path, fail: &str) -> std::path::PathBuf {
    script(
        dir,
        "one_fails.sh",
        &format!(
            "if [ \"$STORM_RANK\" = 1 ]; then touch {marker}; {fail}; fi\nexec sleep 300\n",
            marker = dir.join("failed").display()
        ),
    )
}

#[test]
fn a_failed_rank_ends_the_job_on_every_node_with_its_code() {
    let dir = tempfile::tempdir().unwrap();
    let prog = one_rank_fails(dir.path(), "exit 3");
    let c = TestCluster::start(2);
    let job = c
        .submit_cmd(&["-K", "-N", "2", "-n", "2", prog.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = ended_within(job, Duration::from_secs(60)).unwrap_or_else(|e| {
        panic!("the job ends once rank 1 fails, not after rank 0's five minutes: {e}")
    });
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "rank 1's code: {err}");
    assert!(
        err.contains("rank 1 on node 1 exited with code 3") && err.contains("--kill-on-bad-exit"),
        "the reason names the rank and its cause: {err}"
    );
}

#[test]
fn a_rank_killed_by_a_signal_ends_the_job_beside_its_own_node_s_ranks() {
    let dir = tempfile::tempdir().unwrap();
    let prog = one_rank_fails(dir.path(), "kill -SEGV $$");
    let c = TestCluster::start(1);
    let job = c
        .submit_cmd(&[
            "--kill-on-bad-exit",
            "-N",
            "1",
            "-n",
            "3",
            prog.to_str().unwrap(),
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let out = ended_within(job, Duration::from_secs(60)).unwrap_or_else(|e| {
        panic!("the job ends once rank 1 is killed, not after the others' five minutes: {e}")
    });
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(139), "128 + SIGSEGV: {err}");
    assert!(
        err.contains("rank 1 on node 0 was killed by SIGSEGV"),
        "the reason names the rank and its signal: {err}"
    );
}

/// The control: without `-K`, the same failure leaves the other rank running (as srun's
/// default does), so the tests above see the flag's doing.
#[test]
fn without_the_flag_the_other_ranks_run_on() {
    let dir = tempfile::tempdir().unwrap();
    let prog = one_rank_fails(dir.path(), "exit 3");
    let c = TestCluster::start(2);
    let mut job = c
        .submit_cmd(&["-N", "2", "-n", "2", prog.to_str().unwrap()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_until(Duration::from_secs(30), "rank 1 fails", || {
        (!dir.path().join("failed").exists()).then(|| "no marker yet".to_string())
    });
    std::thread::sleep(Duration::from_secs(3));
    assert!(
        job.try_wait().unwrap().is_none(),
        "without -K the job runs on after rank 1 failed"
    );
    let _ = job.kill();
    let _ = job.wait();
}
