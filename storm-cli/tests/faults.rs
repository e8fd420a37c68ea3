//! Faults on a namespace testbed, each checked as a user sees it: an NM killed while idle,
//! during a job and during a program broadcast (the job, not started, is requeued); a node's link cut and restored; garbage sent
//! to every listening port. (MM restarts: see mm_restart.rs.)
//!
//! These tests need root (network namespaces). Where namespaces cannot be made they fail and
//! say why, unless STORM_ALLOW_NO_NETNS=1 is set, in which case they print NOT TESTED.

mod support;

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use storm_cluster::control::{JobState, NodeState};
use support::testbed::{
    can_run, finish, gone_within, logs, nodes, spawn, submit, up, wait_job_state, wait_node_state,
    wait_pid,
};
use support::{script, text};

/// Failure of a node shows within this long: the rule is K = 1000 heartbeat periods (1 s at the
/// testbed's 1 ms) plus a few deadlines; the rest is slack for a loaded CI machine. The chaos
/// tests (chaos.rs) check the rule itself.
const DETECT: Duration = Duration::from_secs(10);

/// A task that records its pid in `dir/pid.<node>` and then sleeps until killed.
fn sleeper(dir: &Path) -> String {
    script(
        dir,
        "sleeper.sh",
        &format!(
            "echo $$ > {}/pid.$STORM_NODEID\necho started $STORM_NODEID\nexec sleep 600\n",
            dir.display()
        ),
    )
    .display()
    .to_string()
}

fn pid_in(dir: &Path, node: u32) -> u32 {
    wait_pid(&dir.join(format!("pid.{node}")), Duration::from_secs(20))
}

#[test]
fn an_idle_node_manager_killed_is_marked_down_and_rejoins_when_restarted() {
    if !can_run("an_idle_node_manager_killed_is_marked_down_and_rejoins_when_restarted") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut tb = up(4, work.path());
    let socket = tb.socket().to_path_buf();
    tb.kill("storm-nm node2").unwrap();
    wait_node_state(&socket, 2, NodeState::Down, DETECT);
    let down = &nodes(&socket)[2];
    assert!(
        down.reason
            .as_deref()
            .unwrap_or("")
            .contains("took no heartbeat for 1000 heartbeat periods"),
        "the reason says what was seen: {down:?}"
    );
    // The other nodes work on; a job as large as the cluster waits and says why.
    let small = submit(&tb, &["-N", "3", "/bin/true"]).output().unwrap();
    assert!(small.status.success(), "{}", text(&small.stderr));
    let big = spawn(&tb, &["-N", "4", "-J", "big", "/bin/echo", "all four"]);
    wait_job_state(&socket, "big", JobState::Queued, Duration::from_secs(10));
    tb.start_nm(2).unwrap();
    wait_node_state(&socket, 2, NodeState::Idle, Duration::from_secs(20));
    let out = finish(big);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("waiting for 4 nodes: 3 of 4 are up"),
        "storm-submit said why the job waited: {}",
        text(&out.stderr)
    );
    assert_eq!(text(&out.stdout).matches("all four").count(), 4);
}

#[test]
fn a_job_on_a_node_that_dies_ends_naming_it_and_other_jobs_run_on() {
    if !can_run("a_job_on_a_node_that_dies_ends_naming_it_and_other_jobs_run_on") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut tb = up(4, work.path());
    let socket = tb.socket().to_path_buf();
    let hit_dir = work.path().join("hit");
    std::fs::create_dir(&hit_dir).unwrap();
    let hit = spawn(&tb, &["-N", "2", &sleeper(&hit_dir)]);
    let survivor_pid = pid_in(&hit_dir, 0);
    let stranded_pid = pid_in(&hit_dir, 1);
    let other = script(work.path(), "other.sh", "sleep 3\necho other done\n");
    let bystander = spawn(&tb, &["-N", "2", other.to_str().unwrap()]);
    wait_job_state(
        &socket,
        "other.sh",
        JobState::Running,
        Duration::from_secs(10),
    );
    tb.kill("storm-nm node1").unwrap();
    let out = finish(hit);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("node 1 (node1) failed"),
        "the job's end names the node: {}",
        text(&out.stderr)
    );
    assert!(
        gone_within(survivor_pid, Duration::from_secs(10)),
        "the job's task on the surviving node 0 was killed\n{}",
        logs(&tb)
    );
    assert!(
        gone_within(stranded_pid, Duration::from_secs(10)),
        "the task on node 1 died with its NM"
    );
    let out = finish(bystander);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).matches("other done").count(), 2);
    // Node 0 is free again.
    wait_node_state(&socket, 0, NodeState::Idle, Duration::from_secs(5));
    assert_eq!(nodes(&socket)[1].state, NodeState::Down);
}

#[test]
fn a_requeue_job_runs_again_on_other_nodes_when_its_node_dies() {
    if !can_run("a_requeue_job_runs_again_on_other_nodes_when_its_node_dies") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut tb = up(4, work.path());
    let marker = work.path().join("first-run");
    let prog = script(
        work.path(),
        "twice.sh",
        &format!(
            "if [ -e {m}.$STORM_RANK ]; then echo second run on $STORM_NODEID; exit 0; fi\n\
             touch {m}.$STORM_RANK\necho first run\nexec sleep 600\n",
            m = marker.display()
        ),
    );
    let job = spawn(&tb, &["-N", "2", "--requeue", prog.to_str().unwrap()]);
    wait_job_state(
        tb.socket(),
        "twice.sh",
        JobState::Running,
        Duration::from_secs(10),
    );
    while !(marker.with_extension("0").exists() && marker.with_extension("1").exists()) {
        std::thread::sleep(Duration::from_millis(10));
    }
    tb.kill("storm-nm node0").unwrap();
    let out = finish(job);
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(
        stderr.contains("requeued: node 0 (node0) failed"),
        "{stderr}"
    );
    assert_eq!(stdout.matches("second run").count(), 2, "{stdout}");
    assert!(
        !stdout.contains("second run on 0"),
        "the rerun avoids the dead node: {stdout}"
    );
}

#[test]
fn a_job_whose_node_dies_during_the_program_broadcast_is_requeued_by_itself() {
    if !can_run("a_job_whose_node_dies_during_the_program_broadcast_is_requeued_by_itself") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let mut tb = up(4, work.path());
    let socket = tb.socket().to_path_buf();
    // A large program: a script followed by 96 MB of comment.
    let prog = work.path().join("big.sh");
    {
        let mut f = std::fs::File::create(&prog).unwrap();
        f.write_all(b"#!/bin/sh\necho big ran\nexit 0\n").unwrap();
        let line = [b'#'; 1023];
        for _ in 0..96 * 1024 {
            f.write_all(&line).unwrap();
            f.write_all(b"\n").unwrap();
        }
    }
    std::fs::set_permissions(&prog, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let job = spawn(&tb, &["-N", "4", "--bcast", prog.to_str().unwrap()]);
    wait_job_state(
        &socket,
        "big.sh",
        JobState::Sending,
        Duration::from_secs(10),
    );
    tb.kill("storm-nm node3").unwrap();
    wait_node_state(&socket, 3, NodeState::Down, DETECT);
    // None of its tasks started, so the job went back to the head of the queue by itself and
    // waits for a fourth node.
    wait_job_state(&socket, "big.sh", JobState::Queued, Duration::from_secs(10));
    // A job submitted meanwhile queues behind it (FCFS), and nothing is lost.
    let next = spawn(&tb, &["-N", "3", "/bin/echo", "next"]);
    tb.start_nm(3).unwrap();
    let out = finish(job);
    let stderr = text(&out.stderr);
    assert!(out.status.success(), "{stderr}\n{}", logs(&tb));
    assert!(
        stderr.contains("requeued: node 3 (node3)")
            && stderr.contains("(none of its tasks had started)"),
        "storm-submit says why the job went back to the queue: {stderr}"
    );
    assert_eq!(text(&out.stdout).matches("big ran").count(), 4);
    let next = finish(next);
    assert!(next.status.success(), "{}", text(&next.stderr));
    assert_eq!(text(&next.stdout).matches("next").count(), 3);
}

#[test]
fn a_cut_link_makes_the_node_down_and_it_rejoins_when_the_link_returns() {
    if !can_run("a_cut_link_makes_the_node_down_and_it_rejoins_when_the_link_returns") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let tb = up(4, work.path());
    let socket = tb.socket().to_path_buf();
    let dir = work.path().join("cut");
    std::fs::create_dir(&dir).unwrap();
    let job = spawn(&tb, &["-N", "2", &sleeper(&dir)]);
    let stranded = pid_in(&dir, 1);
    pid_in(&dir, 0);
    tb.set_link(1, false).unwrap();
    let out = finish(job);
    assert_eq!(out.status.code(), Some(1), "{}", text(&out.stderr));
    assert!(
        text(&out.stderr).contains("node 1 (node1) failed"),
        "{}",
        text(&out.stderr)
    );
    wait_node_state(&socket, 1, NodeState::Down, DETECT);
    tb.set_link(1, true).unwrap();
    wait_node_state(&socket, 1, NodeState::Idle, Duration::from_secs(30));
    // Rejoining, the NM ended the job's task it had kept running while cut off.
    assert!(
        gone_within(stranded, Duration::from_secs(5)),
        "the stranded task on node 1 was killed when it rejoined"
    );
    let all = submit(&tb, &["-N", "4", "/bin/echo", "together"])
        .output()
        .unwrap();
    assert!(all.status.success(), "{}", text(&all.stderr));
    assert_eq!(text(&all.stdout).matches("together").count(), 4);
}

#[test]
fn garbage_on_every_port_changes_nothing() {
    if !can_run("garbage_on_every_port_changes_nothing") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let tb = up(4, work.path());
    let socket = tb.socket().to_path_buf();
    let mut targets: Vec<SocketAddr> = tb.config.nodes.iter().map(|n| n.address).collect();
    targets.push(tb.config.mm.address);
    // Send from inside the MM's namespace, which reaches every node over the bridge.
    let mm_ns = format!("/run/netns/{}-mm", tb.name);
    std::thread::spawn(move || {
        let ns = std::fs::File::open(&mm_ns).unwrap();
        nix::sched::setns(ns, nix::sched::CloneFlags::CLONE_NEWNET).unwrap();
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        for round in 0..20 {
            for addr in &targets {
                let Ok(mut s) = TcpStream::connect_timeout(addr, Duration::from_secs(1)) else {
                    continue;
                };
                let bytes: Vec<u8> = (0..4096 * (round % 4 + 1))
                    .map(|_| {
                        seed ^= seed << 13;
                        seed ^= seed >> 7;
                        seed ^= seed << 17;
                        seed as u8
                    })
                    .collect();
                let _ = s.write_all(&bytes);
            }
        }
    })
    .join()
    .unwrap();
    // And on the control socket.
    for len in [1usize, 4, 100, 70_000] {
        if let Ok(mut s) = std::os::unix::net::UnixStream::connect(&socket) {
            let _ = s.write_all(&vec![0xA5; len]);
        }
    }
    std::thread::sleep(Duration::from_millis(500));
    for n in nodes(&socket) {
        assert_eq!(n.state, NodeState::Idle, "{n:?}");
    }
    let job = submit(&tb, &["-N", "4", "/bin/echo", "still fine"])
        .output()
        .unwrap();
    assert!(job.status.success(), "{}", text(&job.stderr));
    assert_eq!(text(&job.stdout).matches("still fine").count(), 4);
}
