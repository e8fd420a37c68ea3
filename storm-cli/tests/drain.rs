//! Draining: an operator keeps nodes out of allocation (jobs on them run to their end) until
//! resumed, and `storm nodes` says so.

mod support;

use std::time::{Duration, Instant};

use support::{TestCluster, script, text};

fn node_line(c: &TestCluster, node: &str) -> String {
    text(&c.storm(&["nodes"]).stdout)
        .lines()
        .find(|l| l.split_whitespace().nth(1) == Some(node))
        .unwrap_or_default()
        .to_string()
}

fn wait_line(c: &TestCluster, node: &str, want: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let line = node_line(c, node);
        if line.contains(want) {
            return line;
        }
        assert!(
            Instant::now() < deadline,
            "{node} never showed {want:?}: {line}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_drained_node_finishes_its_job_takes_no_new_one_and_resumes() {
    let c = TestCluster::start(2);
    let work = tempfile::tempdir().unwrap();
    let prog = script(work.path(), "slow.sh", "sleep 1\necho slow done\n");
    let running = c.spawn(&["-N", "2", prog.to_str().unwrap()]);
    let deadline = Instant::now() + Duration::from_secs(10);
    while !text(&c.storm(&["queue"]).stdout).contains("running") {
        assert!(Instant::now() < deadline, "the job never ran");
        std::thread::sleep(Duration::from_millis(10));
    }
    let drained = c.storm(&["drain", "node1", "--reason", "fan failure"]);
    assert!(drained.status.success(), "{}", text(&drained.stderr));
    let line = node_line(&c, "node1");
    assert!(
        line.contains("draining") && line.contains("fan failure"),
        "{line}"
    );
    // The job on it runs to its end.
    let out = running.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).matches("slow done").count(), 2);
    wait_line(&c, "node1", "drained");
    // New work avoids it: one node fits, two wait.
    let one = c.submit(&["-N", "1", "/bin/echo", "on one"]);
    assert!(one.status.success(), "{}", text(&one.stderr));
    let two = c.spawn(&["-N", "2", "-J", "pair", "/bin/echo", "pair ran"]);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let queue = text(&c.storm(&["queue"]).stdout);
        if queue.contains("pair") && queue.contains("waiting for 2 nodes: 1 of 2") {
            break;
        }
        assert!(Instant::now() < deadline, "{queue}");
        std::thread::sleep(Duration::from_millis(10));
    }
    let resumed = c.storm(&["resume", "1"]);
    assert!(resumed.status.success(), "{}", text(&resumed.stderr));
    let out = two.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).matches("pair ran").count(), 2);
    wait_line(&c, "node1", "idle");
}

#[test]
fn drain_names_what_is_wrong_with_its_arguments() {
    let c = TestCluster::start(2);
    let unknown = c.storm(&["drain", "node7"]);
    assert!(!unknown.status.success());
    assert!(
        text(&unknown.stderr).contains("no node is called \"node7\""),
        "{}",
        text(&unknown.stderr)
    );
    let out_of_range = c.storm(&["drain", "5"]);
    assert!(!out_of_range.status.success());
    assert!(
        text(&out_of_range.stderr).contains("node 5 is not in cluster"),
        "{}",
        text(&out_of_range.stderr)
    );
}
