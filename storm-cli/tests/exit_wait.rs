//! `storm-submit --wait SECONDS` (srun's `-W`, Flux's `exit-timeout`, default 30 s): a job
//! whose other ranks still run that long after its first rank ended ends, on every node, with
//! the first rank's code (1 if it was 0) and a reason naming it. `--wait 0` lets them run on.
//! Seen from outside: storm-submit's exit code, its standard error, when it ends, and what
//! the ranks left behind.

mod support;

use std::process::Stdio;
use std::time::{Duration, Instant};

use support::{TestCluster, ended_within, script, text, wait_until};

/// A job whose rank 1 marks its end and exits with `code` at once, while every other rank
/// runs `rest` (a shell command).
fn rank_1_ends_first(dir: &std::path::Path, code: i32, rest: &str) -> std::path::PathBuf {
    script(
        dir,
        "first_ends.sh",
        &format!(
            "if [ \"$STORM_RANK\" = 1 ]; then touch {marker}; exit {code}; fi\n{rest}\n",
            marker = dir.join("ended").display()
        ),
    )
}

/// Submits `args` then `prog`, and returns storm-submit's output and how long after rank 1's
/// marker appeared it ended.
fn run(
    c: &TestCluster,
    dir: &std::path::Path,
    args: &[&str],
    prog: &std::path::Path,
) -> (std::process::Output, Duration) {
    let mut all = args.to_vec();
    all.push(prog.to_str().unwrap());
    let job = c
        .submit_cmd(&all)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_until(Duration::from_secs(60), "rank 1 ends", || {
        (!dir.join("ended").exists()).then(|| "no marker yet".to_string())
    });
    let first_ended = Instant::now();
    let out = ended_within(job, Duration::from_secs(120)).unwrap_or_else(|e| {
        panic!("the job ends after its wait, not after its other ranks' five minutes: {e}")
    });
    (out, first_ended.elapsed())
}

/// Across nodes: rank 1, alone on node 1, exits 0 at once; rank 0 on node 0 sleeps five
/// minutes. The MM counts the wait from node 1's report and ends the job: code 1 (the job
/// failed though its first rank did not), the reason naming rank 1 and the wait.
#[test]
fn ranks_that_outlive_the_first_on_another_node_end_after_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let prog = rank_1_ends_first(dir.path(), 0, "exec sleep 300");
    let c = TestCluster::start(2);
    let (out, after) = run(
        &c,
        dir.path(),
        &["--wait", "2", "-N", "2", "-n", "2"],
        &prog,
    );
    let err = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(1),
        "the first rank exited 0, the job failed: {err}"
    );
    assert!(
        err.contains("rank 1 on node 1 exited with code 0") && err.contains("--wait 2"),
        "the reason names the first rank, its cause and the wait: {err}"
    );
    assert!(
        after >= Duration::from_millis(1900),
        "rank 0 ran on for the wait: the job ended {after:?} after rank 1"
    );
}

/// On one node: rank 1 exits 4 while ranks 0 and 2 sleep; their NM counts the wait itself and
/// stops them. A rank that ignores SIGTERM (rank 2) is killed after `[cluster] kill_wait_ms`.
/// The job takes rank 1's code, never the signal the others got.
#[test]
fn local_ranks_that_outlive_the_first_are_stopped_by_their_node_even_ignoring_sigterm() {
    let dir = tempfile::tempdir().unwrap();
    let prog = rank_1_ends_first(
        dir.path(),
        4,
        "if [ \"$STORM_RANK\" = 2 ]; then trap '' TERM; fi\nsleep 300",
    );
    let c = TestCluster::start(1);
    let (out, _) = run(&c, dir.path(), &["-W", "2", "-N", "1", "-n", "3"], &prog);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "rank 1's code: {err}");
    assert!(
        err.contains("rank 1 on node 0 exited with code 4") && err.contains("--wait 2"),
        "the reason names the first rank, its cause and the wait: {err}"
    );
}

/// `--wait 0`: rank 0 outlives rank 1 by four seconds, finishes its work, and the job
/// succeeds; with `--wait 1` the same job ends before rank 0's work is done (the control).
#[test]
fn wait_0_lets_the_others_finish_and_a_short_wait_does_not() {
    for (wait, code, finished) in [("0", 0, true), ("1", 1, false)] {
        let dir = tempfile::tempdir().unwrap();
        let done = dir.path().join("rank0_done");
        let prog = rank_1_ends_first(dir.path(), 0, &format!("sleep 4; touch {}", done.display()));
        let c = TestCluster::start(2);
        let (out, _) = run(
            &c,
            dir.path(),
            &["--wait", wait, "-N", "2", "-n", "2"],
            &prog,
        );
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(code), "--wait {wait}: {err}");
        assert_eq!(
            done.exists(),
            finished,
            "--wait {wait}: rank 0 finished its work: {err}"
        );
    }
}

/// The default is Flux's 30 s: a job whose rank 1 exits at once while rank 0 sleeps five
/// minutes ends about half a minute later, naming the wait.
#[test]
fn the_default_wait_is_thirty_seconds() {
    let dir = tempfile::tempdir().unwrap();
    let prog = rank_1_ends_first(dir.path(), 0, "exec sleep 300");
    let c = TestCluster::start(2);
    let (out, after) = run(&c, dir.path(), &["-N", "2", "-n", "2"], &prog);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("--wait 30"),
        "the reason names the default wait: {err}"
    );
    assert!(
        after >= Duration::from_secs(29),
        "rank 0 ran on for the default wait: the job ended {after:?} after rank 1"
    );
}
