//! `storm-submit --dependency`, as a user runs it: what the jobs' own tasks record of their
//! order, what storm-submit prints and returns, and what `storm queue` says meanwhile.

mod support;

use std::time::{Duration, Instant};

use support::{TestCluster, script, text};

/// Waits (at most 20 s) until `storm queue` lists a job whose name is `name`; its id.
fn job_named(c: &TestCluster, name: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = c.storm(&["queue", "--json"]);
        let list: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        if let Some(id) = list["jobs"]
            .as_array()
            .into_iter()
            .flatten()
            .find_map(|j| (j["name"] == name).then(|| j["job"].as_u64()).flatten())
        {
            return id;
        }
        assert!(Instant::now() < deadline, "no job {name:?} in the queue");
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_dependent_job_runs_after_its_dependency_and_an_impossible_one_never_runs() {
    let c = TestCluster::start(2);
    let work = tempfile::tempdir().unwrap();
    let log = work.path().join("order.log");
    let gate = work.path().join("gate");
    let log_s = log.to_str().unwrap();
    let gate_s = gate.to_str().unwrap();
    // The first job runs until the test lets it end, then exits `$1`.
    let first = script(
        work.path(),
        "first.sh",
        &format!(
            "echo first-start >> {log_s}\nwhile [ ! -e {gate_s} ]; do sleep 0.05; done\n\
             echo first-end >> {log_s}\nexit $1\n"
        ),
    );
    let record = script(work.path(), "record.sh", &format!("echo $1 >> {log_s}\n"));
    let a = c.spawn(&["-N", "1", "-J", "dep-a", first.to_str().unwrap(), "0"]);
    let a_id = job_named(&c, "dep-a");
    let dep = format!("afterok:{a_id}");
    let b = c.spawn(&["-N", "1", "-d", &dep, record.to_str().unwrap(), "second"]);
    // The second job waits, with the reason in `storm queue`, although a node is free.
    let b_id = job_named(&c, "record.sh");
    let deadline = Instant::now() + Duration::from_secs(10);
    let queue = loop {
        let q = text(&c.storm(&["queue"]).stdout);
        if q.contains("waiting for its dependency") || Instant::now() > deadline {
            break q;
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        queue.contains(&format!(
            "waiting for its dependency afterok:{a_id}: job {a_id} has not ended"
        )),
        "{queue}"
    );
    std::thread::sleep(Duration::from_millis(300));
    std::fs::write(&gate, "").unwrap();
    let a = a.wait_with_output().unwrap();
    assert!(a.status.success(), "{}", text(&a.stderr));
    let b = b.wait_with_output().unwrap();
    assert!(b.status.success(), "{}", text(&b.stderr));
    assert!(
        text(&b.stderr).contains(&format!("job {b_id} queued: waiting for its dependency")),
        "storm-submit says why it waits: {}",
        text(&b.stderr)
    );
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "first-start\nfirst-end\nsecond\n",
        "the tasks ran in dependency order"
    );

    // A job after one that fails never runs: storm-submit says why and exits 1.
    std::fs::remove_file(&log).unwrap();
    let failing = c.submit(&["-N", "1", "-J", "dep-fail", first.to_str().unwrap(), "3"]);
    assert_eq!(failing.status.code(), Some(3));
    let history: serde_json::Value =
        serde_json::from_slice(&c.storm(&["history", "--json"]).stdout).unwrap();
    let fail_id = history["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .find(|j| j["name"] == "dep-fail")
        .and_then(|j| j["job"].as_u64())
        .expect("the failed job in the history");
    let refused = c.submit(&[
        "-N",
        "1",
        "-d",
        &format!("afterok:{fail_id}"),
        record.to_str().unwrap(),
        "never",
    ]);
    assert_eq!(refused.status.code(), Some(1));
    assert!(
        text(&refused.stderr).contains(&format!(
            "afterok:{fail_id} can never be met: job {fail_id} failed with exit code 3"
        )),
        "{}",
        text(&refused.stderr)
    );
    let after_fail = c.submit(&[
        "-N",
        "1",
        "-d",
        &format!("afternotok:{fail_id}"),
        record.to_str().unwrap(),
        "cleanup",
    ]);
    assert!(after_fail.status.success(), "{}", text(&after_fail.stderr));
    assert_eq!(
        std::fs::read_to_string(&log).unwrap(),
        "first-start\nfirst-end\ncleanup\n",
        "only the afternotok job ran"
    );
}

#[test]
fn malformed_dependencies_are_refused_before_anything_is_submitted() {
    let c = TestCluster::start(1);
    for (dep, says) in [
        ("afterok", "names no job"),
        ("before:1", "unknown --dependency condition \"before\""),
        ("afterok:1?afterany:2,after:3", "mixes"),
    ] {
        let out = c.submit(&["-d", dep, "true"]);
        assert_eq!(out.status.code(), Some(2), "{dep}: a usage error");
        assert!(
            text(&out.stderr).contains(says),
            "{dep}: {}",
            text(&out.stderr)
        );
    }
    let out = c.submit(&["-d", "afterany:4242", "true"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        text(&out.stderr).contains("--dependency names job 4242, which does not exist yet"),
        "{}",
        text(&out.stderr)
    );
    assert!(c.queued_jobs().is_empty());
}
