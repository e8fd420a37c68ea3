//! `storm batch`, as a user runs it: the command returns the job id at once, the script runs
//! on the first node of its allocation with its output in a file, `storm-submit` inside it
//! runs steps on the allocation's nodes, and the job outlives its submitter and a restart of
//! the machine manager. Everything is checked from the files the script and its steps wrote
//! and from what `storm` prints.

mod support;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use support::{TestCluster, text};

/// Writes `body` as file `name` in `dir`, executable, exactly as given.
fn script(dir: &Path, name: &str, body: &str) {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, body).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn storm_batch(c: &TestCluster, dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_storm"))
        .arg("--socket")
        .arg(&c.socket)
        .arg("batch")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run storm batch")
}

/// The job id `storm batch --parsable` printed.
fn batch_id(out: &std::process::Output) -> u64 {
    assert!(out.status.success(), "{}", text(&out.stderr));
    text(&out.stdout).trim().parse().expect("a job id")
}

/// Waits (at most `limit`) until `storm history` has job `id`; its JSON record.
fn ended(c: &TestCluster, id: u64, limit: Duration) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        // Nothing to parse while a restarted MM does not answer yet: ask again.
        let h: serde_json::Value =
            serde_json::from_slice(&c.storm(&["history", "--json"]).stdout).unwrap_or_default();
        if let Some(j) = h["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|j| j["job"] == id)
        {
            return j.clone();
        }
        assert!(
            Instant::now() < deadline,
            "job {id} did not end; the queue:\n{}\nthe history:\n{}\nthe MM's log:\n{}",
            text(&c.storm(&["queue"]).stdout),
            text(&c.storm(&["history"]).stdout),
            std::fs::read_to_string(c.root.join("mm.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_batch_script_runs_on_its_allocation_with_steps_and_its_output_in_a_file() {
    let c = TestCluster::start(3);
    let work = tempfile::tempdir().unwrap();
    let gate = work.path().join("gate");
    let body = format!(
        "#!/bin/sh\n\
         #SBATCH --mem=1G\n\
         #SBATCH -p debug\n\
         #SBATCH -N 3\n\
         #STORM -N 2 -n 4 -o out-%x-%j.txt -J batchy\n\
         echo \"script: job $STORM_JOB_ID on $STORM_NODENAME, $STORM_NNODES nodes, $STORM_NTASKS tasks, args $*\"\n\
         echo to-stderr >&2\n\
         while [ ! -e {gate} ]; do sleep 0.05; done\n\
         {submit} -l sh -c 'echo step rank $STORM_RANK of $STORM_SIZE in job $STORM_JOB_ID on $STORM_NODENAME'\n\
         echo \"step exit $?\"\n",
        gate = gate.display(),
        submit = env!("CARGO_BIN_EXE_storm-submit"),
    );
    script(work.path(), "job.sh", &body);
    let out = storm_batch(&c, work.path(), &["--parsable", "job.sh", "a1", "a2"]);
    let id = batch_id(&out);
    assert!(
        text(&out.stderr).contains("ignoring `#SBATCH -p debug`")
            && !text(&out.stderr).contains("--mem"),
        "{}",
        text(&out.stderr)
    );
    // storm batch returned while the job waits for the gate: it runs without its submitter.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let q = text(&c.storm(&["queue"]).stdout);
        if q.contains("running") {
            break;
        }
        assert!(Instant::now() < deadline, "the batch job never ran: {q}");
        std::thread::sleep(Duration::from_millis(50));
    }
    std::fs::write(&gate, "").unwrap();
    let rec = ended(&c, id, Duration::from_secs(30));
    assert_eq!(rec["exit_code"], 0, "{rec}");
    assert_eq!(rec["name"], "batchy");
    let file = work.path().join(format!("out-batchy-{id}.txt"));
    let written = std::fs::read_to_string(&file).unwrap();
    let lines: Vec<&str> = written.lines().collect();
    assert_eq!(
        lines[0],
        format!("script: job {id} on node0, 2 nodes, 4 tasks, args a1 a2"),
        "#STORM overrides #SBATCH; the script runs on the allocation's first node"
    );
    assert_eq!(lines[1], "to-stderr", "stderr joins stdout without -e");
    assert_eq!(lines.last(), Some(&"step exit 0"));
    // The step: the allocation's shape by default, on its nodes, as a job of its own.
    let mut steps: Vec<String> = lines[2..lines.len() - 1]
        .iter()
        .map(|l| l.to_string())
        .collect();
    steps.sort();
    let step_id: u64 = steps[0]
        .split_whitespace()
        .nth(8)
        .and_then(|j| j.parse().ok())
        .unwrap_or_else(|| panic!("{steps:?}"));
    assert_ne!(step_id, id);
    let expected: Vec<String> = (0..4)
        .map(|r| format!("{r}: step rank {r} of 4 in job {step_id} on node{}", r / 2))
        .collect();
    assert_eq!(steps, expected);
}

#[test]
fn output_patterns_default_and_unopenable_files() {
    let c = TestCluster::start(1);
    let work = tempfile::tempdir().unwrap();
    script(
        work.path(),
        "hello.sh",
        "#!/bin/sh\necho hello from $STORM_JOB_ID\n",
    );
    // The default: storm-%j.out in the submit directory.
    let id = batch_id(&storm_batch(&c, work.path(), &["--parsable", "hello.sh"]));
    let rec = ended(&c, id, Duration::from_secs(20));
    assert_eq!(rec["exit_code"], 0, "{rec}");
    assert_eq!(
        std::fs::read_to_string(work.path().join(format!("storm-{id}.out"))).unwrap(),
        format!("hello from {id}\n")
    );
    // Separate error file, with the user's name and the node's.
    script(
        work.path(),
        "both.sh",
        "#!/bin/sh\necho out; echo err >&2; exit 3\n",
    );
    let id = batch_id(&storm_batch(
        &c,
        work.path(),
        &[
            "--parsable",
            "-o",
            "o-%u-%N.txt",
            "-e",
            "e-%j.txt",
            "both.sh",
        ],
    ));
    let rec = ended(&c, id, Duration::from_secs(20));
    assert_eq!(rec["exit_code"], 3);
    let user = storm_cli::batch::user_name();
    assert_eq!(
        std::fs::read_to_string(work.path().join(format!("o-{user}-node0.txt"))).unwrap(),
        "out\n"
    );
    assert_eq!(
        std::fs::read_to_string(work.path().join(format!("e-{id}.txt"))).unwrap(),
        "err\n"
    );
    // A file that cannot be opened ends the job, saying why, in storm history.
    let id = batch_id(&storm_batch(
        &c,
        work.path(),
        &["--parsable", "-o", "no/such/dir/%j.out", "hello.sh"],
    ));
    let rec = ended(&c, id, Duration::from_secs(20));
    assert_eq!(rec["exit_code"], 127);
    let reason = rec["reason"].as_str().unwrap_or_default().to_string();
    assert!(
        reason.contains(&format!(
            "cannot open the output file {}/no/such/dir/{id}.out",
            work.path().display()
        )),
        "{rec}"
    );
    // --wait follows the job to its end and exits with its exit code; a node's word on a
    // script that could not start reaches its terminal.
    let out = storm_batch(&c, work.path(), &["--wait", "both.sh"]);
    assert_eq!(out.status.code(), Some(3), "{}", text(&out.stderr));
    assert!(text(&out.stdout).starts_with("Submitted batch job "));
    let out = storm_batch(&c, work.path(), &["-W", "-o", "/no/such/dir/x", "both.sh"]);
    assert_eq!(out.status.code(), Some(127));
    assert!(
        text(&out.stderr).contains("cannot open the output file /no/such/dir/x on node 0"),
        "{}",
        text(&out.stderr)
    );
    // Scripts only, and what storm batch refuses, it says.
    script(work.path(), "plain", "echo no interpreter line\n");
    let out = storm_batch(&c, work.path(), &["plain"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("does not start with #!"),
        "{}",
        text(&out.stderr)
    );
    script(
        work.path(),
        "bad.sh",
        "#!/bin/sh\n#STORM --frobnicate\ntrue\n",
    );
    let out = storm_batch(&c, work.path(), &["bad.sh"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("bad.sh:2: #STORM --frobnicate: unexpected argument"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn a_queued_batch_job_survives_a_restart_of_the_mm_and_runs_without_a_submitter() {
    let mut c = TestCluster::start(1);
    let work = tempfile::tempdir().unwrap();
    let gate = work.path().join("gate");
    script(
        work.path(),
        "blocker.sh",
        &format!(
            "#!/bin/sh\nwhile [ ! -e {} ]; do sleep 0.05; done\necho blocker done\n",
            gate.display()
        ),
    );
    script(
        work.path(),
        "after.sh",
        "#!/bin/sh\necho ran after the restart\n",
    );
    let blocker = batch_id(&storm_batch(
        &c,
        work.path(),
        &["--parsable", "--exclusive", "blocker.sh"],
    ));
    let queued = batch_id(&storm_batch(
        &c,
        work.path(),
        &["--parsable", "--exclusive", "after.sh"],
    ));
    let dependent = batch_id(&storm_batch(
        &c,
        work.path(),
        &["--parsable", "-d", &format!("afterok:{queued}"), "after.sh"],
    ));
    // The scripts as submitted run, whatever happens to the files later.
    std::fs::write(work.path().join("after.sh"), "#!/bin/sh\necho edited\n").unwrap();
    let cluster = c.cluster.as_mut().unwrap();
    cluster.kill_mm().unwrap();
    cluster.restart_mm().unwrap();
    std::fs::write(&gate, "").unwrap();
    for id in [blocker, queued, dependent] {
        let rec = ended(&c, id, Duration::from_secs(40));
        assert_eq!(rec["exit_code"], 0, "job {id}: {rec}");
    }
    for (id, says) in [
        (blocker, "blocker done\n"),
        (queued, "ran after the restart\n"),
        (dependent, "ran after the restart\n"),
    ] {
        assert_eq!(
            std::fs::read_to_string(work.path().join(format!("storm-{id}.out"))).unwrap(),
            says
        );
    }
}

fn storm_alloc(c: &TestCluster, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_storm"))
        .arg("--socket")
        .arg(&c.socket)
        .arg("alloc")
        .args(args)
        .output()
        .expect("run storm alloc")
}

#[test]
fn storm_alloc_runs_a_command_with_an_allocation_whose_steps_run_on_its_nodes() {
    let c = TestCluster::start(3);
    let inner = format!(
        "{} -l sh -c 'echo step $STORM_JOB_ID on $STORM_NODENAME'; echo shell in $STORM_JOB_ID; exit 7",
        env!("CARGO_BIN_EXE_storm-submit")
    );
    let out = storm_alloc(&c, &["-N", "2", "sh", "-c", &inner]);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(7),
        "the command's exit code: {stderr}"
    );
    let alloc: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("shell in "))
        .and_then(|id| id.parse().ok())
        .unwrap_or_else(|| panic!("{stdout}"));
    assert!(
        stderr.contains(&format!("granted job allocation {alloc} on node0,node1")),
        "{stderr}"
    );
    assert!(stderr.contains(&format!("relinquishing job allocation {alloc}")));
    let mut steps: Vec<&str> = stdout.lines().filter(|l| l.contains(": step ")).collect();
    steps.sort();
    assert_eq!(steps.len(), 2, "{stdout}");
    for (rank, line) in steps.iter().enumerate() {
        let words: Vec<&str> = line.split_whitespace().collect();
        assert_ne!(words[2], alloc.to_string(), "the step is a job of its own");
        assert_eq!(
            words[4],
            format!("node{rank}"),
            "on the allocation's nodes: {line}"
        );
    }
    // Given back: nothing is left in the queue.
    let deadline = Instant::now() + Duration::from_secs(10);
    while !c.queued_jobs().is_empty() {
        assert!(
            Instant::now() < deadline,
            "the allocation was not given back"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    // An allocation that ends first (its time limit) ends the command, saying why.
    let out = storm_alloc(&c, &["-N", "1", "-t", "0:02", "sleep", "60"]);
    assert_eq!(out.status.code(), Some(143), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("was revoked: time limit of 2s exceeded"),
        "{}",
        text(&out.stderr)
    );
}

#[test]
fn an_array_writes_one_file_per_element_and_storm_queue_shows_the_waiting_ones_together() {
    let c = TestCluster::start(2);
    let work = tempfile::tempdir().unwrap();
    let gate = work.path().join("gate");
    let wrap = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; echo $STORM_ARRAY_TASK_ID of $STORM_ARRAY_TASK_COUNT in $STORM_ARRAY_JOB_ID",
        gate.display()
    );
    let waiter = Command::new(env!("CARGO_BIN_EXE_storm"))
        .arg("--socket")
        .arg(&c.socket)
        .args([
            "batch",
            "--wait",
            "--array",
            "0-2,7%1",
            "-o",
            "arr-%A_%a.out",
            "--wrap",
        ])
        .arg(&wrap)
        .current_dir(work.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // One element runs (the throttle is 1); the other three wait on one line, squeue's way.
    let deadline = Instant::now() + Duration::from_secs(20);
    let (array, queue) = loop {
        let q = text(&c.storm(&["queue"]).stdout);
        let array = q
            .lines()
            .find(|l| l.contains("_["))
            .map(|l| l.trim().split('_').next().unwrap().to_string());
        if let Some(array) = array
            && q.lines()
                .any(|l| l.trim().starts_with(&format!("{array}_0 ")) && l.contains("running"))
        {
            break (array, q);
        }
        assert!(
            Instant::now() < deadline,
            "no running element 0 and waiting line in: {q}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    // What ended already, if anything did, says why it is not waiting.
    let ended = || text(&c.storm(&["history"]).stdout);
    assert!(
        queue.contains(&format!("{array}_[1-2,7]")),
        "{queue}\nhistory:\n{}",
        ended()
    );
    assert!(queue.contains(&format!("{array}_0 ")), "{queue}");
    assert!(
        queue.contains(&format!(
            "array job {array} runs at most 1 of its elements at once (%1)"
        )),
        "{queue}"
    );
    std::fs::write(&gate, "").unwrap();
    let out = waiter.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), format!("Submitted batch job {array}\n"));
    for index in [0, 1, 2, 7] {
        assert_eq!(
            std::fs::read_to_string(work.path().join(format!("arr-{array}_{index}.out"))).unwrap(),
            format!("{index} of 4 in {array}\n")
        );
    }
    let history = text(&c.storm(&["history"]).stdout);
    assert!(history.contains(&format!("{array}_7 ")), "{history}");
}

/// The history's record of element `index` of array `array`.
fn element(c: &TestCluster, array: u64, index: u64) -> Option<serde_json::Value> {
    let h: serde_json::Value =
        serde_json::from_slice(&c.storm(&["history", "--json"]).stdout).unwrap_or_default();
    h["jobs"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|j| j["array_job_id"] == array && j["array_task_id"] == index)
        .cloned()
}

#[test]
fn an_array_is_cancelled_whole_by_its_id_or_one_element_by_index_and_a_dependency_names_one() {
    let c = TestCluster::start(2);
    let work = tempfile::tempdir().unwrap();
    let gate = work.path().join("gate");
    let wrap = format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display());
    let array = batch_id(&storm_batch(
        &c,
        work.path(),
        &[
            "--parsable",
            "--array",
            "0-3%1",
            "-o",
            "/dev/null",
            "--wrap",
            &wrap,
        ],
    ));

    // Element 9 does not exist: neither a dependency nor a cancel can name it.
    let no_such = storm_batch(
        &c,
        work.path(),
        &["-d", &format!("afterok:{array}_9"), "--wrap", "true"],
    );
    assert!(!no_such.status.success());
    assert!(
        text(&no_such.stderr).contains("has no element 9"),
        "{}",
        text(&no_such.stderr)
    );
    let out = c.storm(&["cancel", &format!("{array}_9")]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("no element 9"),
        "{}",
        text(&out.stderr)
    );

    // A job that waits for element 1 only, whatever its end.
    let after_one = batch_id(&storm_batch(
        &c,
        work.path(),
        &[
            "--parsable",
            "-d",
            &format!("afterany:{array}_1"),
            "-o",
            "after-one.out",
            "--wrap",
            "echo after element 1",
        ],
    ));

    // Cancelling element 1 ends it alone; the job that waited for it runs.
    let out = c.storm(&["cancel", &format!("{array}_1")]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let one = ended_element(&c, array, 1);
    assert_eq!(one["state"], "cancelled", "{one}");
    assert_eq!(
        ended(&c, after_one, Duration::from_secs(20))["state"],
        "completed"
    );
    assert_eq!(
        std::fs::read_to_string(work.path().join("after-one.out")).unwrap(),
        "after element 1\n"
    );
    for index in [0, 2, 3] {
        assert!(
            element(&c, array, index).is_none(),
            "element {index} still runs or waits"
        );
    }

    // The array's id cancels every element that has not ended: the running one and the
    // waiting ones.
    let out = c.storm(&["cancel", &array.to_string()]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    for index in [0, 2, 3] {
        let e = ended_element(&c, array, index);
        assert_eq!(e["state"], "cancelled", "element {index}: {e}");
    }
}

/// Waits (at most 20 s) for element `index` of `array` to be in the history.
fn ended_element(c: &TestCluster, array: u64, index: u64) -> serde_json::Value {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(e) = element(c, array, index) {
            return e;
        }
        assert!(
            Instant::now() < deadline,
            "element {index} of {array} did not end"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn storm_batch_wait_follows_an_array_across_a_restart_of_the_mm() {
    let mut c = TestCluster::start(2);
    let work = tempfile::tempdir().unwrap();
    let gate = work.path().join("gate");
    let wrap = format!(
        "while [ ! -e {} ]; do sleep 0.05; done; exit $STORM_ARRAY_TASK_ID",
        gate.display()
    );
    let waiter = Command::new(env!("CARGO_BIN_EXE_storm"))
        .arg("--socket")
        .arg(&c.socket)
        .args([
            "batch",
            "--wait",
            "--array",
            "0,3",
            "-o",
            "/dev/null",
            "--wrap",
        ])
        .arg(&wrap)
        .current_dir(work.path())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    // Both elements run; then the MM restarts under them.
    let deadline = Instant::now() + Duration::from_secs(20);
    while text(&c.storm(&["queue"]).stdout).matches("running").count() < 2 {
        assert!(Instant::now() < deadline, "the elements did not start");
        std::thread::sleep(Duration::from_millis(50));
    }
    let cluster = c.cluster.as_mut().unwrap();
    cluster.kill_mm().unwrap();
    cluster.restart_mm().unwrap();
    std::fs::write(&gate, "").unwrap();
    let out = waiter.wait_with_output().unwrap();
    let err = text(&out.stderr);
    // The highest exit code of the elements, as sbatch --wait: it followed both to their
    // ends on the new connection.
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("the machine manager is back"), "{err}");
}

/// `storm shutdown` ends the jobs that wait, and answers. Its answer waits for the journal
/// to hold those ends; the MM used to exit before that answer went out, and the command
/// said "lost the machine manager: connection closed" (seen at the end of CI's log of a
/// test that left an array waiting).
#[test]
fn storm_shutdown_ends_the_waiting_jobs_and_answers() {
    let c = TestCluster::start(1);
    let work = tempfile::tempdir().unwrap();
    let gate = work.path().join("gate");
    let wrap = format!("while [ ! -e {} ]; do sleep 0.05; done", gate.display());
    let first = batch_id(&storm_batch(
        &c,
        work.path(),
        &["--parsable", "-o", "/dev/null", "--wrap", &wrap],
    ));
    // Waiting for the first, whatever room the node has.
    let waiting: Vec<u64> = (0..3)
        .map(|_| {
            batch_id(&storm_batch(
                &c,
                work.path(),
                &[
                    "--parsable",
                    "-d",
                    &format!("afterok:{first}"),
                    "-o",
                    "/dev/null",
                    "--wrap",
                    "true",
                ],
            ))
        })
        .collect();
    let queue = text(&c.storm(&["queue"]).stdout);
    for id in &waiting {
        assert!(
            queue
                .lines()
                .any(|l| l.trim().starts_with(&format!("{id} ")) && l.contains("queued")),
            "{queue}"
        );
    }
    let out = c.storm(&["shutdown"]);
    assert!(
        out.status.success() && out.stderr.is_empty(),
        "storm shutdown: {}",
        text(&out.stderr)
    );
}
