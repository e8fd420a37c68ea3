//! Memory as a resource, on the namespace testbed, as users see it (issue 35, item 5):
//!
//! * a job that uses more than its `--mem` is killed by the kernel inside its own cgroup and
//!   ends `out_of_memory`, while another job sharing its node runs to its normal end;
//! * a job whose `--mem` no node has, or whose `--constraint` names a feature no node has,
//!   is refused at once with an error that names what is missing.

mod support;

use std::time::Duration;

use storm_cluster::control::JobState;
use support::testbed::{can_run, finish, logs, spawn, submit, up, wait_job_state};

#[test]
fn a_job_over_its_mem_ends_out_of_memory_and_its_neighbour_finishes() {
    let test = "a_job_over_its_mem_ends_out_of_memory_and_its_neighbour_finishes";
    if !support::root_or_say(test) || !can_run(test) {
        return;
    }
    support::ensure_all_binaries();
    let work = support::shared_tempdir();
    // One node: both jobs share it (one CPU each).
    let tb = up(1, work.path());
    let socket = tb.socket().to_path_buf();
    let limit = Duration::from_secs(30);
    let calm = spawn(
        &tb,
        &[
            "-n",
            "1",
            "--mem",
            "64M",
            "-J",
            "calm",
            "sh",
            "-c",
            "sleep 3; echo calm-done",
        ],
    );
    wait_job_state(&socket, "calm", JobState::Running, limit);
    // `tail` keeps a "line" of 512 MiB of zeroes (no newline) in memory.
    let hog = submit(
        &tb,
        &[
            "-n",
            "1",
            "--mem",
            "64M",
            "-J",
            "hog",
            "sh",
            "-c",
            "head -c 512M /dev/zero | tail > /dev/null",
        ],
    )
    .output()
    .expect("storm-submit runs");
    let hog_err = support::text(&hog.stderr);
    assert_eq!(
        hog.status.code(),
        Some(137),
        "the hog is killed (SIGKILL): {hog_err}\n{}",
        logs(&tb)
    );
    assert!(
        hog_err.contains("out of memory"),
        "its submitter is told why: {hog_err}"
    );
    let calm = finish(calm);
    assert!(
        calm.status.success() && support::text(&calm.stdout).contains("calm-done"),
        "the neighbour runs to its end: {}\n{}",
        support::text(&calm.stderr),
        logs(&tb)
    );
    let out = std::process::Command::new(support::bin_dir().join("storm"))
        .arg("--config")
        .arg(&tb.config_path)
        .args(["history", "--json"])
        .output()
        .expect("storm history runs");
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    let state = |name: &str| {
        v["jobs"]
            .as_array()
            .and_then(|jobs| jobs.iter().find(|j| j["name"] == name))
            .map(|j| j["state"].clone())
            .unwrap_or_else(|| panic!("no job {name} in {v}"))
    };
    assert_eq!(state("hog"), "out_of_memory");
    assert_eq!(state("calm"), "completed");
}

#[test]
fn a_job_that_no_node_can_hold_is_refused_with_what_is_missing() {
    let test = "a_job_that_no_node_can_hold_is_refused_with_what_is_missing";
    if !support::root_or_say(test) || !can_run(test) {
        return;
    }
    support::ensure_all_binaries();
    let work = support::shared_tempdir();
    let tb = up(2, work.path());
    // The NMs tell the MM their memory when they register.
    support::testbed::wait_node_state(
        tb.socket(),
        1,
        storm_cluster::control::NodeState::Idle,
        Duration::from_secs(30),
    );
    let refused = |args: &[&str], says: &str| {
        let out = submit(&tb, args).output().expect("storm-submit runs");
        let err = support::text(&out.stderr);
        assert!(
            !out.status.success() && err.contains(says),
            "{args:?} is refused saying {says:?}: {err}"
        );
    };
    refused(
        &["-N", "2", "--mem", "100T", "true"],
        "the job needs 100 TiB of memory on each of 2 nodes",
    );
    refused(
        &["--mem-per-cpu", "64T", "true"],
        "the job needs 64 TiB of memory on each of 1 nodes",
    );
    refused(&["-C", "gpu", "true"], "has feature \"gpu\" (it has: none)");
    refused(&["--mem", "lots", "true"], "\"lots\" is not a size");
    // What fits runs.
    let ok = submit(&tb, &["-N", "2", "--mem", "16M", "true"])
        .output()
        .expect("storm-submit runs");
    assert!(ok.status.success(), "{}", support::text(&ok.stderr));
}

/// In a user's own instance (`storm start --local`, every daemon the user's), the node
/// managers keep no cgroups, so `--mem` cannot be enforced: the job still runs, and the user
/// is told so on its standard error, once per node, naming the node and why. A job without
/// `--mem` hears nothing.
#[test]
fn a_mem_limit_a_private_instance_cannot_keep_is_said_and_the_job_runs() {
    use std::os::unix::process::CommandExt;
    let test = "a_mem_limit_a_private_instance_cannot_keep_is_said_and_the_job_runs";
    if !support::root_or_say(test) {
        return;
    }
    support::ensure_all_binaries();
    let (uid, gid) = support::test_user("storm-ua");
    let bin = support::bin_dir();
    let submit = bin.join("storm-submit").display().to_string();
    let script = format!("{submit} -N 2 -n 4 --mem 64M echo hi && {submit} -N 2 echo plain");
    let mut cmd = std::process::Command::new(bin.join("storm"));
    cmd.args(["start", "--local", "2", "--", "sh", "-c", &script])
        .current_dir("/tmp")
        .env("STORM_BIN_DIR", &bin)
        .env_remove("STORM_CONFIG")
        .env_remove("STORM_SOCKET")
        .uid(uid)
        .gid(gid);
    let out = support::output_within(cmd, Duration::from_secs(120)).expect("ended in time");
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert_eq!(stdout.matches("hi").count(), 4, "every rank ran: {stdout}");
    assert_eq!(stdout.matches("plain").count(), 2, "{stdout}");
    let said: Vec<&str> = stderr
        .lines()
        .filter(|l| l.contains("--mem is not enforced"))
        .collect();
    assert_eq!(said.len(), 2, "once per node: {stderr}");
    for node in ["node0", "node1"] {
        assert!(
            said.iter()
                .any(|l| l.contains(&format!("node {node}:")) && l.contains("keeps no cgroups")),
            "{node} named, and why: {said:?}"
        );
    }
}
