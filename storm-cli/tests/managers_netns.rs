//! A replicated MM on the namespace testbed, each replica in a namespace of its own: the
//! leader cut off from the other replicas (but not from the nodes) stops acting, and so does
//! a leader cut off from the nodes (but not from the replicas); either way a replica that
//! reaches both takes the cluster over, and a job running throughout delivers all of its
//! output once.
//!
//! These tests need root (network namespaces). Where namespaces cannot be made they fail and
//! say why, unless STORM_ALLOW_NO_NETNS=1 is set, in which case they print NOT TESTED.

mod support;

use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use storm_cli::testbed::Testbed;
use support::testbed::{can_run, gone_within, submit, up_group};
use support::{
    assert_counter_job_whole, bin_dir, counter_script, text, wait_for_text, wait_new_leader,
};

fn storm(tb: &Testbed, args: &[&str]) -> std::process::Output {
    Command::new(bin_dir().join("storm"))
        .arg("--config")
        .arg(&tb.config_path)
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn a_leader_cut_off_from_the_other_replicas_stops_and_the_majority_takes_the_cluster_over() {
    let test =
        "a_leader_cut_off_from_the_other_replicas_stops_and_the_majority_takes_the_cluster_over";
    if !can_run(test) {
        return;
    }
    leader_partitioned(Cut::FromReplicas, "lost its lease");
}

/// The reverse cut: the leader still hears the other replicas, so Raft alone would keep it
/// leading, but it hears none of its nodes. Left alone it would mark them all DOWN after K
/// heartbeat periods and end every job on them. It hands the group to a replica that the
/// nodes reach instead, and stops; the nodes join the new leader, which adopts their jobs.
#[test]
fn a_leader_cut_off_from_its_nodes_hands_the_group_over_and_no_job_ends() {
    let test = "a_leader_cut_off_from_its_nodes_hands_the_group_over_and_no_job_ends";
    if !can_run(test) {
        return;
    }
    leader_partitioned(Cut::FromNodes, "cut off from its nodes");
}

/// Which side the leader is cut from.
#[derive(Clone, Copy, PartialEq)]
enum Cut {
    FromReplicas,
    FromNodes,
}

/// Cuts the leader of a three-replica group off from one side while a two-node job runs:
/// the old leader stops acting (its log saying `why`) but stays in the group, another
/// replica leads, a new job runs, the running job delivers every line of both ranks once and
/// in order and ends as it would have, and the old leader, once healed, follows.
fn leader_partitioned(cut: Cut, why: &str) {
    let work = tempfile::tempdir().unwrap();
    let tb = up_group(2, work.path());
    let leader = tb.leader().expect("a leader");
    let j: u32 = leader.trim_start_matches('m').parse().unwrap();
    let leader_pid = tb.pid(&format!("storm-mm {leader}")).unwrap();
    let counter = counter_script(work.path(), 40);
    let log = work.path().join("submit.log");
    let running = submit(&tb, &["-N", "2", "-l", "--reconnect", "60", &counter])
        .stdout(Stdio::piped())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    wait_for_text(&log, "tick 5", Duration::from_secs(20));
    tb.partition_manager(j, Some(cut == Cut::FromReplicas))
        .unwrap();
    // Cut from the replicas, the old leader hears no majority: it stops acting within half
    // an election timeout. Cut from the nodes, it hands the group over and stops acting.
    // Either way its control socket goes, the process stays as a follower, and one of the
    // two others is elected and takes the nodes over.
    let leader_log = tb.dir.join(format!("storm-mm-{leader}.log"));
    wait_for_text(
        &leader_log,
        "no longer leads the manager group",
        Duration::from_secs(10),
    );
    let said = std::fs::read_to_string(&leader_log).unwrap_or_default();
    assert!(
        said.contains(why),
        "the old leader's log does not say {why:?}:\n{said}"
    );
    let old_socket = &tb.config.control_sockets()[j as usize];
    assert!(
        storm_cluster::control::Client::connect(old_socket).is_err(),
        "the cut-off leader still answers clients"
    );
    assert!(
        !gone_within(leader_pid, Duration::from_millis(100)),
        "the cut-off leader exited instead of following the group"
    );
    let (next, _) = wait_new_leader(&leader, || tb.leader());
    let out = submit(&tb, &["-N", "2", "echo", "after the partition"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        "after the partition\nafter the partition\n"
    );
    // The running job ran on: every line of both ranks, once and in order.
    assert_counter_job_whole(running, 2, 40, &log);
    // The cut is healed: the old leader, which followed all along, catches up and shows
    // as a follower of the new one.
    tb.partition_manager(j, None).unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let out = storm(&tb, &["managers"]);
        let table = text(&out.stdout);
        let rejoined = table
            .lines()
            .any(|l| l.starts_with(&leader) && l.contains("follower"));
        if rejoined
            && table
                .lines()
                .any(|l| l.starts_with(&next) && l.contains("leader"))
        {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "{leader} did not rejoin:\n{table}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    tb.down().unwrap();
}
