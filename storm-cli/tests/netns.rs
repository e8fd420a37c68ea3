//! The namespace testbed: every node a network namespace with its own address, joined by a
//! bridge; jobs run across them; teardown leaves nothing behind, whether by drop or by
//! `storm-testbed down`.
//!
//! These tests need root (network namespaces). Where namespaces cannot be made they fail and
//! say why, unless STORM_ALLOW_NO_NETNS=1 is set, in which case they print NOT TESTED.

mod support;

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;

use support::testbed::{can_run, unique_name, up};
use support::{bin_dir, ensure_daemons, script, text};

fn netns_of(pid: u32) -> String {
    std::fs::read_link(format!("/proc/{pid}/ns/net"))
        .unwrap()
        .display()
        .to_string()
}

fn namespace_exists(ns: &str) -> bool {
    Path::new("/run/netns").join(ns).exists()
}

#[test]
fn a_job_runs_every_rank_in_its_own_nodes_namespace() {
    if !can_run("a_job_runs_every_rank_in_its_own_nodes_namespace") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let tb = up(4, work.path());
    let prog = script(
        work.path(),
        "where.sh",
        "echo \"$STORM_NODEID $(readlink /proc/self/ns/net)\"\n",
    );
    let out = Command::new(bin_dir().join("storm-submit"))
        .arg("--config")
        .arg(&tb.config_path)
        .args(["-N", "4", prog.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let seen: BTreeMap<u32, String> = text(&out.stdout)
        .lines()
        .map(|l| {
            let (node, ns) = l.split_once(' ').expect("NODEID NS");
            (node.parse().unwrap(), ns.to_string())
        })
        .collect();
    assert_eq!(seen.len(), 4, "one line per node: {seen:?}");
    let mine = netns_of(std::process::id());
    for (node, ns) in &seen {
        let nm = tb.pid(&format!("storm-nm node{node}")).unwrap();
        assert_eq!(
            ns,
            &netns_of(nm),
            "rank on node {node} runs in its NM's namespace"
        );
        assert_ne!(ns, &mine, "node {node} is not in the host's namespace");
    }
    let distinct: std::collections::BTreeSet<&String> = seen.values().collect();
    assert_eq!(distinct.len(), 4, "four nodes, four namespaces");
    let mm = tb.pid("storm-mm").unwrap();
    assert!(
        !distinct.contains(&netns_of(mm)),
        "the MM has a namespace of its own"
    );
}

#[test]
fn dropping_a_testbed_kills_its_daemons_and_deletes_its_namespaces() {
    if !can_run("dropping_a_testbed_kills_its_daemons_and_deletes_its_namespaces") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let tb = up(2, work.path());
    let namespaces = [
        tb.switch_ns(),
        format!("{}-mm", tb.name),
        tb.node_ns(0),
        tb.node_ns(1),
    ];
    let pids: Vec<u32> = ["storm-mm", "storm-nm node0", "storm-nm node1"]
        .iter()
        .map(|d| tb.pid(d).unwrap())
        .collect();
    assert!(namespaces.iter().all(|ns| namespace_exists(ns)));
    drop(tb);
    for ns in &namespaces {
        assert!(!namespace_exists(ns), "namespace {ns} left behind");
    }
    for pid in pids {
        assert!(
            !Path::new(&format!("/proc/{pid}")).exists(),
            "daemon {pid} left running"
        );
    }
}

#[test]
fn storm_testbed_up_and_down_by_hand() {
    if !can_run("storm_testbed_up_and_down_by_hand") {
        return;
    }
    ensure_daemons();
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().join("tb");
    let name = unique_name();
    let testbed = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_storm-testbed"))
            .args(["--name", &name, "--dir", dir.to_str().unwrap()])
            .args(args)
            .output()
            .unwrap()
    };
    let started = testbed(&["up", "--nodes", "2"]);
    assert!(started.status.success(), "{}", text(&started.stderr));
    assert!(text(&started.stdout).contains("storm-submit --config"));
    // A second `up` of the same testbed is refused, and says why.
    let again = testbed(&["up", "--nodes", "2"]);
    assert!(!again.status.success());
    assert!(
        text(&again.stderr).contains("exists"),
        "{}",
        text(&again.stderr)
    );
    let job = Command::new(bin_dir().join("storm-submit"))
        .arg("--config")
        .arg(dir.join("cluster.toml"))
        .args(["-N", "2", "--label", "/bin/echo", "hello"])
        .output()
        .unwrap();
    assert!(job.status.success(), "{}", text(&job.stderr));
    let out = text(&job.stdout);
    assert!(
        out.contains("0: hello") && out.contains("1: hello"),
        "{out}"
    );
    let stopped = testbed(&["down"]);
    assert!(stopped.status.success(), "{}", text(&stopped.stderr));
    assert!(!namespace_exists(&format!("{name}-sw")));
    assert!(!namespace_exists(&format!("{name}-n1")));
    assert!(!dir.exists());
    // No daemon of it runs on: not the MM, the NMs, nor the relays.
    let left: Vec<String> = std::fs::read_dir("/proc")
        .unwrap()
        .filter_map(|e| std::fs::read(e.ok()?.path().join("cmdline")).ok())
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
        .filter(|c| c.contains(dir.to_str().unwrap()) && !c.contains("storm-testbed"))
        .collect();
    assert!(left.is_empty(), "still running: {left:?}");
    let missing = testbed(&["down"]);
    assert!(!missing.status.success());
    assert!(text(&missing.stderr).contains("no testbed"));
}
