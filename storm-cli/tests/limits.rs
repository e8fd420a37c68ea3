//! Per-user limits at the MM (`[limits]`, docs/security.md): each refuses the new request
//! with a message naming the limit, and nothing accepted before is lost.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use storm_cli::local::LocalOptions;
use storm_cluster::config::LimitsSection;
use storm_cluster::control::{Client, JobRequest, Request};
use storm_cluster::tasks::TaskRequest;
use support::{TestCluster, text};

fn cluster(limits: LimitsSection) -> TestCluster {
    TestCluster::with(LocalOptions {
        cpus: Some(support::TEST_CPUS),
        limits,
        ..LocalOptions::new(1)
    })
}

/// Waits until `storm queue` shows a running job.
fn wait_running(c: &TestCluster) {
    let since = Instant::now();
    while !text(&c.storm(&["queue"]).stdout).contains("running") {
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "no job started: {}",
            text(&c.storm(&["queue"]).stdout)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// On the one node: job 1, `sleep 300` holding the whole node, running, and the job `args`
/// waiting behind it (both in `storm queue`). Job 1 runs until [`end_running`] (a job that
/// ended by itself would let the tests' next request in under the limit they test).
fn running_and_waiting(
    c: &TestCluster,
    args: &[&str],
) -> (std::process::Child, std::process::Child) {
    let running = c.spawn(&["-N", "1", "--exclusive", "/bin/sleep", "300"]);
    wait_running(c);
    let waiting = c.spawn(&[&["-N", "1"], args].concat());
    let since = Instant::now();
    while c.queued_jobs().len() < 2 {
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "the second job never showed in the queue"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    (running, waiting)
}

/// Cancels job 1 of [`running_and_waiting`] and waits for its submitter.
fn end_running(c: &TestCluster, running: std::process::Child) {
    let out = c.storm(&["cancel", "1"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    running.wait_with_output().unwrap();
}

fn refused_naming(out: &std::process::Output, limit: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains(limit),
        "the refusal names {limit}: {}",
        text(&out.stderr)
    );
}

#[test]
fn a_user_over_the_queued_jobs_limit_is_refused_and_the_queued_jobs_run() {
    let c = cluster(LimitsSection {
        max_queued_jobs_per_user: 1,
        ..Default::default()
    });
    let (running, waiting) = running_and_waiting(&c, &["/bin/echo", "second"]);
    refused_naming(
        &c.submit(&["-N", "1", "/bin/echo", "third"]),
        "max_queued_jobs_per_user = 1",
    );
    end_running(&c, running);
    let waiting = waiting.wait_with_output().unwrap();
    assert!(waiting.status.success(), "{}", text(&waiting.stderr));
    assert_eq!(text(&waiting.stdout), "second\n");
}

#[test]
fn a_program_over_the_size_limit_is_refused_and_runs_without_bcast() {
    let size = std::fs::metadata("/bin/true").unwrap().len();
    let c = cluster(LimitsSection {
        max_program_bytes: size - 1,
        ..Default::default()
    });
    refused_naming(
        &c.submit(&["-N", "1", "/bin/true"]),
        &format!("max_program_bytes = {}", size - 1),
    );
    let out = c.submit(&["-N", "1", "--no-bcast", "/bin/true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

#[test]
fn programs_held_for_a_user_past_the_spool_limit_are_refused_until_jobs_finish() {
    let size = std::fs::metadata("/bin/sleep").unwrap().len();
    let c = cluster(LimitsSection {
        max_spooled_bytes_per_user: 2 * size + size / 2,
        ..Default::default()
    });
    let (first, second) = running_and_waiting(&c, &["/bin/sleep", "0"]);
    refused_naming(
        &c.submit(&["-N", "1", "/bin/sleep", "0"]),
        "max_spooled_bytes_per_user",
    );
    end_running(&c, first);
    let out = second.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let after = c.submit(&["-N", "1", "/bin/sleep", "0"]);
    assert!(after.status.success(), "{}", text(&after.stderr));
}

/// A waiting job's program is copied beside the journal (so a restarted MM can send it) on a
/// thread, not on the MM's main loop: on the main loop, copying a program near the size limit
/// stopped every heartbeat for seconds. Here no tick of the main loop takes a second
/// (`storm_main_loop_tick_seconds`), far above a timeslice's work and far below the copy.
#[test]
fn a_large_waiting_program_is_copied_without_stalling_the_main_loop() {
    let c = cluster(LimitsSection::default());
    let work = tempfile::tempdir().unwrap();
    let big = support::script(work.path(), "big.sh", "echo big\nexit 0\n");
    let size: u64 = 1000 << 20;
    // Sparse: costs no disk here, but every byte is read and written by the copy.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&big)
        .unwrap()
        .set_len(size)
        .unwrap();
    let running = c.spawn(&["-N", "1", "--exclusive", "/bin/sleep", "300"]);
    wait_running(&c);
    let waiting = c.spawn(&["-N", "1", big.to_str().unwrap()]);
    // The copy is renamed into place when complete.
    let copy = c.root.join("mm-state/programs/job-2");
    let since = Instant::now();
    while std::fs::metadata(&copy).map(|m| m.len()).unwrap_or(0) != size {
        assert!(
            since.elapsed() < Duration::from_secs(120),
            "the program was never copied"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let metrics = text(&c.storm(&["metrics"]).stdout);
    let series = |name: &str| -> f64 {
        metrics
            .lines()
            .find_map(|l| l.strip_prefix(name)?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {name} in\n{metrics}"))
    };
    let ticks = series("storm_main_loop_tick_seconds_count");
    let within_a_second = series("storm_main_loop_tick_seconds_bucket{le=\"1.0\"}");
    assert!(ticks > 0.0);
    assert_eq!(
        within_a_second, ticks,
        "a tick of the main loop took more than a second while the program was copied"
    );
    for job in ["1", "2"] {
        assert!(c.storm(&["cancel", job]).status.success());
    }
    for job in [running, waiting] {
        job.wait_with_output().unwrap();
    }
}

/// A program that follows jobs with the library (`storm_cli::submit::run_job`, as
/// storm-bench and tools built on storm do) gives each job's connection back when the job
/// ends; before, its reader thread kept the socket open and a few jobs used up the limit.
#[test]
fn jobs_followed_in_process_give_their_connections_back() {
    struct Quiet;
    impl storm_cli::submit::Progress for Quiet {}
    let c = cluster(LimitsSection {
        max_connections_per_user: 3,
        ..Default::default()
    });
    for n in 0..8 {
        let req = JobRequest {
            name: "true".into(),
            program: "/bin/true".into(),
            args: Vec::new(),
            env: Vec::new(),
            cwd: "/".into(),
            tasks: TaskRequest::default(),
            bcast: false,
            time_limit_ms: None,
            requeue: false,
            mpi: Default::default(),
        };
        let client = Client::connect(&c.socket)
            .unwrap_or_else(|e| panic!("job {n}: the connections of earlier jobs linger: {e}"));
        let (outcome, _, _) = storm_cli::submit::run_job(client, req, None, &mut Quiet).unwrap();
        assert_eq!(outcome.exit_code(), 0, "{outcome:?}");
    }
}

#[test]
fn a_user_over_the_connection_limit_is_refused_and_others_are_not() {
    let c = cluster(LimitsSection {
        max_connections_per_user: 2,
        ..Default::default()
    });
    // A connection made while the cluster started (its readiness check) is counted out when
    // the MM sees it close, which may be a moment later.
    let since = Instant::now();
    let held: Vec<Client> = loop {
        match (0..2)
            .map(|_| Client::connect(&c.socket))
            .collect::<Result<Vec<_>, _>>()
        {
            Ok(held) => break held,
            Err(e) => assert!(
                since.elapsed() < Duration::from_secs(10),
                "two connections within the limit: {e}"
            ),
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let refused = Client::connect(&c.socket)
        .err()
        .expect("a third is refused");
    assert!(
        refused.contains("max_connections_per_user = 2"),
        "{refused}"
    );
    if support::root_or_say("a_user_over_the_connection_limit_is_refused_and_others_are_not") {
        use std::os::unix::process::CommandExt;
        let other = Command::new(env!("CARGO_BIN_EXE_storm"))
            .arg("--socket")
            .arg(&c.socket)
            .arg("queue")
            .uid(support::NOBODY)
            .gid(support::NOBODY)
            .output()
            .unwrap();
        assert!(
            other.status.success(),
            "another user is not limited: {}",
            text(&other.stderr)
        );
    }
    drop(held);
    let since = Instant::now();
    while Client::connect(&c.socket).is_err() {
        assert!(
            since.elapsed() < Duration::from_secs(10),
            "closed connections are counted out"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_request_over_the_size_limit_is_refused_naming_it() {
    let c = cluster(LimitsSection {
        max_request_bytes: 4096,
        ..Default::default()
    });
    // storm-submit passes its environment on, as srun does.
    let out = Command::new(env!("CARGO_BIN_EXE_storm-submit"))
        .arg("--socket")
        .arg(&c.socket)
        .args(["-N", "1", "/bin/true"])
        .env("STORM_TEST_BIG", "x".repeat(8192))
        .output()
        .unwrap();
    refused_naming(&out, "max_request_bytes");
    let fine = c.submit(&["-N", "1", "/bin/true"]);
    assert!(fine.status.success(), "{}", text(&fine.stderr));
}

/// A client that asks and never reads the answers is disconnected once it leaves more than
/// `max_unread_replies` unread; the job it submitted runs to its end all the same.
#[test]
fn a_client_that_does_not_read_is_dropped_and_its_job_is_not_harmed() {
    let c = cluster(LimitsSection {
        max_unread_replies: 8,
        ..Default::default()
    });
    let work = tempfile::tempdir().unwrap();
    let marker = work.path().join("finished");
    let client = Client::connect(&c.socket).unwrap();
    let job = JobRequest {
        name: "unread".into(),
        program: "/bin/sh".into(),
        args: vec![
            "-c".into(),
            format!("sleep 1; echo whole > {}", marker.display()),
        ],
        env: vec![],
        cwd: work.path().to_path_buf(),
        tasks: TaskRequest {
            nodes: Some(1),
            ..Default::default()
        },
        bcast: false,
        time_limit_ms: None,
        requeue: false,
        mpi: Default::default(),
    };
    client.request(&Request::Submit(job), None).unwrap();
    let since = Instant::now();
    let mut sent = 0u64;
    while client.request(&Request::Queue, None).is_ok() {
        sent += 1;
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "still connected after {sent} unread requests"
        );
    }
    wait_for_file(&marker);
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "whole\n");
    let log = std::fs::read_to_string(c.root.join("mm.log")).unwrap_or_default();
    assert!(
        log.contains("max_unread_replies = 8"),
        "the MM says why it dropped the client: {log}"
    );
    let after = c.submit(&["-N", "1", "/bin/true"]);
    assert!(after.status.success(), "{}", text(&after.stderr));
}

fn wait_for_file(path: &Path) {
    let since = Instant::now();
    while !path.exists() {
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "{} never appeared: the job did not run to its end",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    // Written by `echo >`: give the write a moment to complete.
    std::thread::sleep(Duration::from_millis(50));
}
