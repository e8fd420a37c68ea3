//! The MM killed with SIGKILL and started again, on a namespace testbed, checked as users see
//! it: nothing it had accepted is lost, and running jobs run on with all their output.
//!
//! These tests need root (network namespaces). Where namespaces cannot be made they fail and
//! say why, unless STORM_ALLOW_NO_NETNS=1 is set, in which case they print NOT TESTED.

mod support;

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use storm_cli::testbed::Testbed;
use storm_cluster::config::{FailureSection, SchedulerSection};
use storm_cluster::control::{Client, JobInfo, Reply, Request};
use storm_cluster::control::{JobState, NodeState};
use support::testbed::{
    can_run, gone_within, logs, nodes, submit, up, up_with, wait_node_state, wait_pid,
};
use support::{bin_dir, counter_script, script, text, wait_for_text};

/// Starts storm-submit with standard error going to `log` (read with [`wait_for`] while it runs).
fn spawn_logged(tb: &Testbed, args: &[&str], log: &Path) -> Child {
    submit(tb, args)
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(log).unwrap())
        .spawn()
        .unwrap()
}

fn storm(tb: &Testbed, args: &[&str]) -> Output {
    Command::new(bin_dir().join("storm"))
        .arg("--config")
        .arg(&tb.config_path)
        .args(args)
        .output()
        .unwrap()
}

/// Waits until the MM answers on its control socket again.
fn wait_mm(socket: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Client::connect(socket).is_err() {
        assert!(Instant::now() < deadline, "the MM did not come back");
        std::thread::sleep(Duration::from_millis(10));
    }
}

fn history(socket: &Path) -> Vec<JobInfo> {
    let client = Client::connect(socket).expect("connect to the MM");
    match client.call(&Request::History).expect("history") {
        Reply::History(h) => h,
        other => panic!("unexpected reply {other:?}"),
    }
}

/// The lines a counter job printed, in order, each once.
fn assert_counted(stdout: &str, lines: u32) {
    let want: Vec<String> = (1..=lines).map(|i| format!("line {i}")).collect();
    let got: Vec<&str> = stdout.lines().collect();
    assert_eq!(got, want, "every line exactly once, in order");
}

#[test]
fn running_jobs_survive_a_restarted_mm_with_all_their_output_and_queued_jobs_results_and_drains_are_kept()
 {
    if !can_run(
        "running_jobs_survive_a_restarted_mm_with_all_their_output_and_queued_jobs_results_and_drains_are_kept",
    ) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut tb = up(2, work.path());
    let socket = tb.socket().to_path_buf();

    // A job that ended before the restart, and a drain.
    let done = submit(&tb, &["-N", "1", "-J", "done", "/bin/sh", "-c", "exit 3"])
        .output()
        .unwrap();
    assert_eq!(done.status.code(), Some(3), "{}", text(&done.stderr));
    let drained = storm(&tb, &["drain", "1", "--reason", "disk check"]);
    assert!(drained.status.success(), "{}", text(&drained.stderr));

    // A job running on node 0 across the restart (on some of its CPUs, if it has several:
    // the restarted MM takes back exactly those), and one waiting for the whole node.
    let (running_log, waiting_log) = (
        work.path().join("running.err"),
        work.path().join("waiting.err"),
    );
    let running = spawn_logged(
        &tb,
        &[
            "-v",
            "-N",
            "1",
            "-J",
            "running",
            &counter_script(work.path(), 60),
        ],
        &running_log,
    );
    // The waiting job is submitted only once the running one holds node 0, so that it waits.
    wait_for_text(&running_log, "tick 1", Duration::from_secs(10));
    let waiting_prog = script(work.path(), "waiting.sh", "echo hello from the queue\n");
    let waiting = spawn_logged(
        &tb,
        &[
            "-N",
            "1",
            "--exclusive",
            "-J",
            "waiting",
            waiting_prog.to_str().unwrap(),
        ],
        &waiting_log,
    );
    // Killed once the submitters know their jobs (before that, a submitter cannot follow its
    // job across the restart: it does not know its id).
    wait_for_text(
        &waiting_log,
        "queued: waiting for 1 free nodes",
        Duration::from_secs(10),
    );
    wait_for_text(&running_log, "tick 5", Duration::from_secs(10));

    tb.kill("storm-mm").unwrap();
    // The job prints on while no MM is there: its NM holds the output.
    std::thread::sleep(Duration::from_millis(500));
    tb.start_mm().unwrap();
    wait_mm(&socket);

    // The running job ran on: every line once, its exit code, told across the restart.
    let out = running.wait_with_output().unwrap();
    let stderr = std::fs::read_to_string(&running_log).unwrap();
    assert_eq!(out.status.code(), Some(5), "{stderr}\n{}", logs(&tb));
    assert_counted(&text(&out.stdout), 60);
    assert!(
        stderr.contains("the machine manager is back; following job"),
        "storm-submit said it reattached: {stderr}"
    );

    // The queued job ran once node 0 was free; its submitter followed it across the restart.
    let out = waiting.wait_with_output().unwrap();
    let stderr = std::fs::read_to_string(&waiting_log).unwrap();
    assert!(out.status.success(), "{stderr}\n{}", logs(&tb));
    assert_eq!(text(&out.stdout), "hello from the queue\n");
    assert!(
        stderr.contains("the machine manager is back; following job"),
        "storm-submit said it reattached: {stderr}"
    );

    // Results from before and across the restart.
    let past = history(&socket);
    let find = |name: &str| {
        past.iter()
            .find(|j| j.name == name)
            .unwrap_or_else(|| panic!("{name} is not in the history: {past:#?}"))
            .clone()
    };
    assert_eq!(find("done").exit_code, Some(3));
    assert_eq!(find("done").state, JobState::Failed);
    assert_eq!(find("running").exit_code, Some(5), "{past:#?}");
    assert_eq!(find("waiting").exit_code, Some(0));

    // The drain held; job ids go on from where they were.
    wait_node_state(&socket, 0, NodeState::Idle, Duration::from_secs(10));
    let node1 = &nodes(&socket)[1];
    assert_eq!(node1.state, NodeState::Drained, "{node1:?}");
    assert_eq!(node1.reason.as_deref(), Some("disk check"));
    let next = submit(&tb, &["-v", "-N", "1", "/bin/true"])
        .output()
        .unwrap();
    assert!(next.status.success(), "{}", text(&next.stderr));
    let highest = past.iter().map(|j| j.job).max().unwrap();
    assert!(
        text(&next.stderr).contains(&format!("job {} ", highest + 1)),
        "a new job takes the next id after {highest}: {}",
        text(&next.stderr)
    );
}

#[test]
fn a_running_job_whose_node_does_not_come_back_after_an_mm_restart_ends_naming_it() {
    if !can_run("a_running_job_whose_node_does_not_come_back_after_an_mm_restart_ends_naming_it") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let failure = FailureSection {
        readopt_within_ms: 3000,
        ..FailureSection::default()
    };
    let mut tb = up_with(2, work.path(), SchedulerSection::default(), failure);
    let socket = tb.socket().to_path_buf();
    let sleeper = script(
        work.path(),
        "sleeper.sh",
        &format!(
            "echo $$ > {}/pid.$STORM_NODEID\nexec sleep 600\n",
            work.path().display()
        ),
    );
    let log = work.path().join("job.err");
    let job = spawn_logged(
        &tb,
        &["-v", "-N", "2", "-J", "stranded", sleeper.to_str().unwrap()],
        &log,
    );
    let survivor = wait_pid(&work.path().join("pid.0"), Duration::from_secs(10));
    wait_pid(&work.path().join("pid.1"), Duration::from_secs(10));
    // Killed once the submitter knows its job (before that it cannot follow the job across
    // the restart; its tasks can run before it is told, see issue 17's note).
    wait_for_text(&log, "job 1 accepted", Duration::from_secs(10));

    tb.kill("storm-mm").unwrap();
    tb.kill("storm-nm node1").unwrap();
    tb.start_mm().unwrap();
    wait_mm(&socket);

    let out = job.wait_with_output().unwrap();
    let stderr = std::fs::read_to_string(&log).unwrap();
    assert_eq!(out.status.code(), Some(1), "{stderr}\n{}", logs(&tb));
    assert!(
        stderr
            .contains("nodes 1 did not come back within 3000 ms of the machine manager's restart"),
        "the job's end names the node that did not come back: {stderr}"
    );
    assert!(
        gone_within(survivor, Duration::from_secs(10)),
        "the job's task on node 0 was killed\n{}",
        logs(&tb)
    );
    wait_node_state(&socket, 0, NodeState::Idle, Duration::from_secs(10));
}

#[test]
fn storm_history_lists_finished_jobs_with_their_exit_codes() {
    if !can_run("storm_history_lists_finished_jobs_with_their_exit_codes") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let tb = up(1, work.path());
    for code in ["0", "7"] {
        let _ = submit(&tb, &["-J", &format!("exit{code}"), "/bin/sh", "-c"])
            .arg(format!("exit {code}"))
            .output()
            .unwrap();
    }
    let out = storm(&tb, &["history"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listing = text(&out.stdout);
    let line = |name: &str| {
        listing
            .lines()
            .find(|l| l.contains(name))
            .unwrap_or_else(|| panic!("no {name} in:\n{listing}"))
            .to_string()
    };
    assert!(line("exit0").contains("completed"), "{listing}");
    let failed = line("exit7");
    assert!(
        failed.contains("failed") && failed.split_whitespace().any(|w| w == "7"),
        "{listing}"
    );
}

/// The MM's queue: every job it holds, with its state and time slot.
fn queue(socket: &Path) -> Vec<JobInfo> {
    let client = Client::connect(socket).expect("connect to the MM");
    match client.call(&Request::Queue).expect("queue") {
        Reply::Queue(q) => q,
        other => panic!("unexpected reply {other:?}"),
    }
}

#[test]
fn gang_jobs_keep_their_time_slots_and_fifty_queued_submitters_get_their_jobs_across_an_mm_restart()
{
    if !can_run(
        "gang_jobs_keep_their_time_slots_and_fifty_queued_submitters_get_their_jobs_across_an_mm_restart",
    ) {
        return;
    }
    const SUBMITTERS: usize = 50;
    let work = tempfile::tempdir().unwrap();
    let scheduler = SchedulerSection {
        policy: storm_cluster::config::PolicyKind::Gang,
        mpl: 2,
        ..SchedulerSection::default()
    };
    let mut tb = up_with(4, work.path(), scheduler, FailureSection::default());
    let socket = tb.socket().to_path_buf();

    // Two gang-scheduled jobs fill the matrix (both on all 4 nodes, one time slot each): at
    // any instant one runs and the other is suspended.
    let gang_log = |i: usize| work.path().join(format!("gang{i}.err"));
    let gangs: Vec<Child> = (0..2)
        .map(|i| {
            spawn_logged(
                &tb,
                &[
                    "-N",
                    "4",
                    "-J",
                    &format!("gang{i}"),
                    &counter_script(work.path(), 60),
                ],
                &gang_log(i),
            )
        })
        .collect();
    for i in 0..2 {
        wait_for_text(&gang_log(i), "tick 3", Duration::from_secs(10));
    }
    // Fifty submitters whose jobs wait behind them.
    let submitter_log = |i: usize| work.path().join(format!("q{i}.err"));
    let submitters: Vec<Child> = (0..SUBMITTERS)
        .map(|i| {
            spawn_logged(
                &tb,
                &[
                    "-N",
                    "1",
                    "-J",
                    &format!("q{i}"),
                    "/bin/echo",
                    &format!("queued job {i}"),
                ],
                &submitter_log(i),
            )
        })
        .collect();
    let deadline = Instant::now() + Duration::from_secs(30);
    let before = loop {
        let q = queue(&socket);
        if q.iter().filter(|j| j.state == JobState::Queued).count() == SUBMITTERS {
            break q;
        }
        assert!(
            Instant::now() < deadline,
            "the submitters' jobs never all queued: {q:#?}"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    let slot_of = |q: &[JobInfo], name: &str| {
        q.iter()
            .find(|j| j.name == name)
            .and_then(|j| j.time_slot)
            .unwrap_or_else(|| panic!("{name} has no time slot: {q:#?}"))
    };
    let slots = [slot_of(&before, "gang0"), slot_of(&before, "gang1")];
    assert_ne!(slots[0], slots[1], "one time slot each: {before:#?}");
    // Each submitter has heard that its job was accepted (and queued): only then is the job
    // its to follow across the restart.
    for i in 0..SUBMITTERS {
        wait_for_text(&submitter_log(i), "queued", Duration::from_secs(10));
    }

    tb.kill("storm-mm").unwrap();
    std::thread::sleep(Duration::from_millis(300));
    tb.start_mm().unwrap();
    wait_mm(&socket);

    // The gang jobs are back in their own time slots.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let q = queue(&socket);
        let placed = |name: &str| {
            q.iter()
                .find(|j| j.name == name)
                .is_some_and(|j| matches!(j.state, JobState::Running | JobState::Suspended))
        };
        if placed("gang0") && placed("gang1") {
            assert_eq!(
                [slot_of(&q, "gang0"), slot_of(&q, "gang1")],
                slots,
                "time slots kept across the restart"
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the gang jobs were not re-adopted: {q:#?}\n{}",
            logs(&tb)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    for (i, g) in gangs.into_iter().enumerate() {
        let out = g.wait_with_output().unwrap();
        let stderr = std::fs::read_to_string(gang_log(i)).unwrap();
        assert_eq!(
            out.status.code(),
            Some(5),
            "gang{i}: {stderr}\n{}",
            logs(&tb)
        );
        // Four ranks, each printing every line once (in order within a rank).
        let stdout = text(&out.stdout);
        for n in 1..=60 {
            assert_eq!(
                stdout.lines().filter(|l| *l == format!("line {n}")).count(),
                4,
                "gang{i}: line {n} from each of the 4 ranks, once"
            );
        }
    }
    for (i, s) in submitters.into_iter().enumerate() {
        let out = s.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "submitter {i}: {}\n{}",
            std::fs::read_to_string(submitter_log(i)).unwrap_or_default(),
            logs(&tb)
        );
        assert_eq!(text(&out.stdout).trim(), format!("queued job {i}"));
    }
}

/// Jobs killed with the MM as soon as they show as running (their launch may still be on its
/// way to some nodes, while their start is in the journal): each is re-adopted, or launched
/// again where the launch never arrived; none is lost or run twice. Several rounds, since the
/// window is a heartbeat's delivery.
#[test]
fn jobs_that_just_started_on_every_node_are_re_adopted_after_an_mm_restart() {
    if !can_run("jobs_that_just_started_on_every_node_are_re_adopted_after_an_mm_restart") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut tb = up(4, work.path());
    let socket = tb.socket().to_path_buf();
    // A restarted MM tells "the launch never arrived" from "the node manager restarted since"
    // by the NM's start time, with a second's margin for clocks: a launch within a second of
    // an NM's start counts as lost, and its job ends. Start the rounds past that second.
    std::thread::sleep(Duration::from_millis(1500));
    let running = |q: &[JobInfo]| q.len() == 4 && q.iter().all(|j| j.state == JobState::Running);
    for round in 0..5 {
        let mut submitters: Vec<Child> = (0..4)
            .map(|_| {
                submit(
                    &tb,
                    &["-N", "1", "--exclusive", "-J", "held", "sleep", "600"],
                )
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
            })
            .collect();
        let deadline = Instant::now() + Duration::from_secs(20);
        while !running(&queue(&socket)) {
            assert!(Instant::now() < deadline, "{:?}", queue(&socket));
        }
        let before: Vec<u64> = queue(&socket).iter().map(|j| j.job).collect();
        tb.kill("storm-mm").unwrap();
        tb.start_mm().unwrap();
        wait_mm(&socket);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !running(&queue(&socket)) {
            assert!(
                Instant::now() < deadline,
                "round {round}: not every job re-adopted: queue {:?}\nhistory {:?}\n{}",
                queue(&socket),
                history(&socket),
                logs(&tb)
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let after: Vec<u64> = queue(&socket).iter().map(|j| j.job).collect();
        assert_eq!(before, after, "round {round}: the same jobs, each once");
        // Cancelled (their submitters may not have reattached yet: a job whose submitter is
        // gone runs on), so that the next round starts on idle nodes.
        let client = Client::connect(&socket).unwrap();
        for job in after {
            client.call(&Request::Cancel { job }).unwrap();
        }
        for s in &mut submitters {
            let _ = s.wait();
        }
        for n in 0..4 {
            wait_node_state(&socket, n, NodeState::Idle, Duration::from_secs(30));
        }
    }
}

/// A job's standard input goes on across a restart of the MM, every byte once and in order:
/// storm-submit keeps what its task has not acknowledged and sends it again to the new MM,
/// and the node keeps each byte once by its offset. Input typed while no MM runs is not lost.
#[test]
fn standard_input_goes_on_across_an_mm_restart_every_byte_once() {
    use std::io::{BufRead, Write};
    if !can_run("standard_input_goes_on_across_an_mm_restart_every_byte_once") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut tb = up(1, work.path());
    let socket = tb.socket().to_path_buf();
    let log = work.path().join("cat.err");
    let mut child = submit(&tb, &["-v", "-N", "1", "cat"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let stdout = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    let next_line = |what: &str| {
        rx.recv_timeout(Duration::from_secs(20))
            .unwrap_or_else(|_| panic!("the task never echoed {what}: {}", logs(&tb)))
    };
    stdin.write_all(b"before\n").unwrap();
    assert_eq!(next_line("before"), "before");

    tb.kill("storm-mm").unwrap();
    stdin.write_all(b"during\n").unwrap();
    std::thread::sleep(Duration::from_millis(500));
    tb.start_mm().unwrap();
    wait_mm(&socket);
    wait_for_text(
        &log,
        "the machine manager is back; following job",
        Duration::from_secs(10),
    );
    stdin.write_all(b"after\n").unwrap();
    drop(stdin);

    // A byte lost would leave cat waiting for the rest: a hang is the failure.
    let deadline = Instant::now() + Duration::from_secs(60);
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!(
                "storm-submit never ended (input lost?): {}\n{}",
                std::fs::read_to_string(&log).unwrap_or_default(),
                logs(&tb)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let rest: Vec<String> = rx.iter().collect();
    assert!(
        status.success(),
        "{}\n{}",
        std::fs::read_to_string(&log).unwrap_or_default(),
        logs(&tb)
    );
    assert_eq!(rest, ["during", "after"], "every line once, in order");
}
