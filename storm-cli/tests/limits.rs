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
    // The waiting job first: cancelled second, it could start and end in between (its
    // program is a two-line script), and there would be nothing left to cancel.
    for job in ["2", "1"] {
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
            delivery: storm_cluster::control::Delivery::InPlace,
            ..JobRequest::new("true", "/bin/true", "/")
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

/// Resident memory of process `pid`, in bytes.
fn rss(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let kb: u64 = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .expect("VmRSS");
    kb * 1024
}

/// A job of `/bin/true` named `name`, run in place.
fn named_job(name: String, cwd: &Path) -> JobRequest {
    JobRequest {
        tasks: TaskRequest {
            nodes: Some(1),
            ..Default::default()
        },
        delivery: storm_cluster::control::Delivery::InPlace,
        ..JobRequest::new(name, "/bin/true", cwd.to_path_buf())
    }
}

/// Finding 8 of issue 31: the unread-reply limit counted replies, so a client sending small
/// `Queue` requests and never reading grew the MM by the size of a long queue a thousand
/// times over (20 KB of requests, 2 GB). The limit is in bytes now: the client is dropped
/// once its unread replies pass `max_unread_reply_bytes`, the MM's memory grows by about that
/// much (seen from outside, in its resident size), and the waiting jobs (its own too) and
/// other users are unharmed.
#[test]
fn a_client_that_does_not_read_is_dropped_by_the_bytes_it_left_unread() {
    let limit: u64 = 1 << 20;
    let c = cluster(LimitsSection {
        max_unread_reply_bytes: limit,
        max_queued_jobs_per_user: 100_000,
        max_job_name_bytes: 1024,
        ..Default::default()
    });
    let work = tempfile::tempdir().unwrap();
    // A long queue: one job holds the node, 300 wait behind it, each with a 500-byte name,
    // so that one `storm queue` answer is about 200 KB.
    let (running, _) = running_and_waiting(&c, &["/bin/true"]);
    let owner = Client::connect(&c.socket).unwrap();
    for i in 0..300 {
        let name = format!("{i:04}-{}", "q".repeat(500));
        let reply = owner
            .call(&Request::Submit(Box::new(named_job(name, work.path()))))
            .unwrap();
        assert!(
            matches!(reply, storm_cluster::control::Reply::Accepted { .. }),
            "{reply:?}"
        );
    }
    let mm = c.daemon_pid("storm-mm");
    let before = rss(mm);
    let reader = Client::connect(&c.socket).unwrap();
    // The dropped client's own job goes on without it.
    let marker = work.path().join("finished");
    let mut own = named_job("unread".into(), work.path());
    own.program = "/bin/sh".into();
    own.args = vec![
        "-c".into(),
        format!("echo whole > {}", marker.display()).into(),
    ];
    reader
        .request(&Request::Submit(Box::new(own)), None)
        .unwrap();
    let since = Instant::now();
    let mut sent = 0u64;
    while reader.request(&Request::Queue, None).is_ok() {
        sent += 1;
        assert!(
            since.elapsed() < Duration::from_secs(60),
            "still connected after {sent} unread requests"
        );
    }
    let grew = rss(mm).saturating_sub(before);
    let log = std::fs::read_to_string(c.root.join("mm.log")).unwrap_or_default();
    assert!(
        log.contains("max_unread_reply_bytes = 1048576"),
        "the MM says why it dropped the client: {log}"
    );
    // A count of 1024 replies let this grow by 1024 answers of 200 KB each.
    assert!(
        grew < 48 << 20,
        "the MM grew by {} MiB for a client that read nothing ({sent} requests)",
        grew >> 20
    );
    // The queue and the other users are unharmed.
    assert!(
        c.queued_jobs().len() >= 300,
        "the waiting jobs are still there"
    );
    let other = c.storm(&["queue"]);
    assert!(other.status.success(), "{}", text(&other.stderr));
    drop(owner);
    end_running(&c, running);
    wait_for_file(&marker);
    assert_eq!(std::fs::read_to_string(&marker).unwrap(), "whole\n");
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

/// Issue 33: arguments and environment were limited by one heartbeat (64 KiB) and the
/// refusal blamed "the job description". A job whose environment and arguments take 1.4 MB
/// (near the kernel's ARG_MAX of 2 MiB) now runs, its launch going to the nodes in pieces, and
/// its task gets every byte; one over the cluster's limit is told which limit it hit and what
/// raises it.
#[test]
fn arguments_and_environment_up_to_arg_max_reach_the_task_and_more_is_refused_naming_the_limit() {
    // The kernel takes at most 128 KiB per string: 20 variables of 64 KiB, and an argument.
    let vars: Vec<(String, String)> = (0..20)
        .map(|i| {
            (
                format!("BIG_{i}"),
                char::from(b'a' + i as u8).to_string().repeat(64 << 10),
            )
        })
        .collect();
    let arg = "z".repeat(100_000);
    let c = cluster(LimitsSection::default());
    let script = r#"n=0; for i in $(seq 0 19); do eval "v=\$BIG_$i"; n=$((n + ${#v})); done; printf '%s %s %s' "$n" "${#1}" "$(printenv BIG_7 | cut -c1-3)""#;
    let out = c
        .submit_cmd(&["-N", "1", "sh", "-c", script, "sh", &arg])
        .envs(vars.iter().map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("{} 100000 hhh", 20 * (64 << 10)));

    let small = cluster(LimitsSection {
        max_argument_bytes: 300_000,
        ..Default::default()
    });
    let out = small
        .submit_cmd(&["-N", "1", "/bin/true"])
        .envs(vars.iter().take(6).map(|(k, v)| (k, v)))
        .output()
        .unwrap();
    refused_naming(&out, "max_argument_bytes");
    assert!(
        text(&out.stderr).contains("ARG_MAX"),
        "{}",
        text(&out.stderr)
    );
}
