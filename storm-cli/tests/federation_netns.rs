//! Clusters that share, on the namespace testbed (`storm-testbed up --clusters 2 --nodes 2`):
//! c0 and c1, each with its own MM, key, nodes and bridge, their peer agents joined by one
//! more bridge. What is checked is what a user's terminal and `storm queue` show.
//!
//! * A job of c0 asking `--clusters c1` runs on c1's two nodes (each answers with its own
//!   address on c1's bridge); storm-submit on c0 prints that output and returns its exit code.
//! * The link between the clusters is cut for less than the peer timeout, then restored: a
//!   flocked job runs on, and its output and exit code still reach its submitter.
//! * The link drops 5 % of its packets both ways: a flocked job's 20,000 lines of output and
//!   its exit code reach its submitter whole and in order, and it is not taken back.
//! * The link is cut for longer: c0 queues the job at home again and runs it on its own
//!   nodes once they are free, and c1 cancels its copy (either side walks away at the same
//!   rule).
//!
//! Lending, on a testbed of its own: c1 lends its node0 to c0 (`storm lend`).
//!
//! * A `--borrow` job of c0 on three nodes runs on its two and on the lent one, which answers
//!   with its own address on c1's bridge.
//! * The link between the clusters is cut under a `--requeue` borrowed job until c0 counts
//!   the lent node down: c0 queues the job again; once the link is back, the lent node's
//!   guest joins c0 again and the job runs again there. c1 keeps the node lent throughout.
//! * The lent node's own cable is cut (the node is gone for both clusters) under another
//!   such job: the same, and c1 sees its node go silent too.
//! * `storm reclaim`: c1's node takes c1's jobs again, and c0's slot goes down.
//! * c1 lends the node again, and c0's MM dies (a peer MM dies): once c0 has been away for
//!   the peer timeout, c1 takes its node home and runs its own jobs on it.
//!
//! Borrowing with nobody running `storm lend`, and MM failures under flocking, each on a
//! testbed of its own with a 4 s peer timeout (see each test): a waiting job borrows through
//! both MMs restarting and the owner's need; a flocked job through both MMs restarting, its
//! peer's MM dying, and the peer's whole host restarting.

mod support;

use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::time::Duration;

use support::NOBODY;
use support::testbed::{can_run, up_clusters};

const PEER_TIMEOUT_MS: u64 = 2000;

/// Held by each test while its clusters run: both name their clusters c0 and c1, and a
/// cluster's cgroups are named after it (`storm/c0/node0`), so two at once would tear down
/// each other's.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The share of packets the lossy link drops, each way.
const LOSS_PERCENT: u32 = 5;

fn storm(config: &std::path::Path, args: &[&str]) -> Output {
    std::process::Command::new(support::bin_dir().join("storm"))
        .arg("--config")
        .arg(config)
        .args(args)
        .output()
        .expect("run storm")
}

fn queue(config: &std::path::Path) -> Vec<serde_json::Value> {
    let out = storm(config, &["queue", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["jobs"].as_array().cloned().unwrap_or_default()
}

fn submit(config: &std::path::Path, args: &[&str]) -> Child {
    use std::os::unix::process::CommandExt;
    std::process::Command::new(support::bin_dir().join("storm-submit"))
        .arg("--config")
        .arg(config)
        .args(args)
        .current_dir("/tmp")
        .uid(NOBODY)
        .gid(NOBODY)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run storm-submit")
}

/// Two clusters of two nodes, c0 and c1, up on the testbed for `test` with this peer
/// timeout: the directory of their files, the testbed, and c0's and c1's cluster files.
/// `None` (and says why) where the test cannot run here. The caller holds [`ONE_AT_A_TIME`].
fn two_clusters(
    test: &str,
    peer_timeout_ms: u64,
) -> Option<(
    tempfile::TempDir,
    storm_cli::testbed::federation::Federation,
    PathBuf,
    PathBuf,
)> {
    if !support::root_or_say(test) || !can_run(test) {
        return None;
    }
    let work = support::shared_tempdir();
    let fed = up_clusters(2, 2, work.path(), peer_timeout_ms);
    let paths = fed.config_paths();
    let (c0, c1) = (paths[0].clone(), paths[1].clone());
    Some((work, fed, c0, c1))
}

/// Waits until c0's newest job runs on c1; returns its id.
fn running_on_c1(c0: &std::path::Path) -> u64 {
    let mut id = 0;
    support::wait_until(Duration::from_secs(20), "the job runs on c1", || {
        let q = queue(c0);
        let j = q.iter().max_by_key(|j| j["job"].as_u64());
        match j {
            Some(j) if j["state"] == "running" && j["cluster"] == "c1" => {
                id = j["job"].as_u64().unwrap();
                None
            }
            _ => Some(format!("{q:?}")),
        }
    });
    id
}

#[test]
fn jobs_flock_between_namespaced_clusters_and_survive_or_leave_a_cut_link() {
    let test = "jobs_flock_between_namespaced_clusters_and_survive_or_leave_a_cut_link";
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((_work, fed, c0, c1)) = two_clusters(test, PEER_TIMEOUT_MS) else {
        return;
    };
    let (c0, c1) = (&c0, &c1);
    assert!(c0.ends_with("c0/cluster.toml") && c1.ends_with("c1/cluster.toml"));

    // On c1's two nodes: each prints its address on c1's bridge.
    let out = submit(
        c0,
        &[
            "--clusters",
            "c1",
            "-N",
            "2",
            "sh",
            "-c",
            "ip -o -4 addr show eth0 | awk '{print \"at \" $4}'; exit 4",
        ],
    )
    .wait_with_output()
    .unwrap();
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "{stderr}");
    assert!(stderr.contains("flocked to peer cluster c1"), "{stderr}");
    // c1's addresses are 10.201.0.0/16 (c0's, 10.200.0.0/16).
    for addr in ["at 10.201.0.2/16", "at 10.201.0.3/16"] {
        assert!(stdout.contains(addr), "{addr} in {stdout:?}");
    }
    assert!(
        stderr.contains("on c1:node0"),
        "a failed rank names its node on the peer: {stderr}"
    );

    // c0's nodes are taken by a job that stays home: the next ones flock.
    let blocker = submit(
        c0,
        &["--no-flock", "--exclusive", "-N", "2", "sleep", "300"],
    );
    support::wait_until(Duration::from_secs(20), "the blocker runs on c0", || {
        let q = queue(c0);
        (!q.iter().any(|j| j["state"] == "running")).then(|| format!("{q:?}"))
    });
    let blocker_id = queue(c0)[0]["job"].as_u64().unwrap();

    // A short cut: the job runs on, and its output and exit code arrive once it is over.
    let job = submit(
        c0,
        &[
            "--flock",
            "-N",
            "2",
            "sh",
            "-c",
            "echo before; sleep 3; echo after; exit 6",
        ],
    );
    running_on_c1(c0);
    fed.set_link(1, false).unwrap();
    std::thread::sleep(Duration::from_millis(PEER_TIMEOUT_MS / 2));
    fed.set_link(1, true).unwrap();
    let out = job.wait_with_output().unwrap();
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert_eq!(out.status.code(), Some(6), "{stderr}");
    assert!(
        stdout.contains("before") && stdout.contains("after"),
        "{stdout:?}"
    );
    assert!(!stderr.contains("requeued"), "{stderr}");

    // A lossy link: c1's link to the others drops 5 % of its packets, both ways. A flocked
    // job's 20,000 lines and its exit code reach c0's storm-submit whole and in order, and
    // the job is not taken back (TCP resends what the link drops; the agents number and
    // resend what a broken link loses).
    fed.set_loss(1, LOSS_PERCENT).unwrap();
    let job = submit(
        c0,
        &["--flock", "-N", "1", "sh", "-c", "seq 1 20000; exit 7"],
    );
    let out = job.wait_with_output().unwrap();
    fed.set_loss(1, 0).unwrap();
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert_eq!(out.status.code(), Some(7), "{stderr}");
    assert!(stderr.contains("flocked to peer cluster c1"), "{stderr}");
    let lines: Vec<&str> = stdout.lines().collect();
    let whole = lines.len() == 20_000
        && lines
            .iter()
            .enumerate()
            .all(|(i, l)| l.parse::<usize>() == Ok(i + 1));
    assert!(
        whole,
        "{} lines, first {:?}, last {:?}",
        lines.len(),
        lines.first(),
        lines.last()
    );
    assert!(!stderr.contains("requeued"), "{stderr}");

    // A long cut: home takes the job back and runs it itself; c1 cancels its copy.
    let job = submit(
        c0,
        &["--flock", "-N", "2", "sh", "-c", "sleep 6; echo finished"],
    );
    let id = running_on_c1(c0);
    fed.set_link(1, false).unwrap();
    support::wait_until(
        Duration::from_millis(PEER_TIMEOUT_MS * 4),
        "c0 queues the job at home again",
        || {
            let q = queue(c0);
            let j = q.iter().find(|j| j["job"] == id);
            match j {
                Some(j) if j["cluster"].is_null() && j["state"] == "queued" => None,
                _ => Some(format!("{q:?}")),
            }
        },
    );
    let cancelled = storm(c0, &["cancel", &blocker_id.to_string()]);
    assert!(cancelled.status.success());
    let _ = blocker.wait_with_output();
    support::wait_until(
        Duration::from_millis(PEER_TIMEOUT_MS * 4),
        "c0 takes the job back and runs it at home",
        || {
            let q = queue(c0);
            let j = q.iter().find(|j| j["job"] == id);
            match j {
                Some(j) if j["cluster"].is_null() && j["state"] == "running" => None,
                _ => Some(format!("{q:?}")),
            }
        },
    );
    support::wait_until(
        Duration::from_millis(PEER_TIMEOUT_MS * 4),
        "c1 cancels its copy",
        || {
            let q = queue(c1);
            (!q.is_empty()).then(|| format!("{q:?}"))
        },
    );
    let out = job.wait_with_output().unwrap();
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("finished"), "{stdout:?}");
    assert!(stderr.contains("queued at home again"), "{stderr}");
    let hist = storm(c1, &["history", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&hist.stdout).unwrap();
    let last = v["jobs"]
        .as_array()
        .and_then(|j| j.last())
        .cloned()
        .unwrap_or_default();
    assert_eq!(last["state"], "cancelled", "c1's copy: {last}");
    fed.set_link(1, true).unwrap();
    fed.wait_all_up(Duration::from_secs(20)).unwrap();
}

/// What `storm nodes --json` on `config` says of node `name` (null if it does not answer).
fn node_state(config: &std::path::Path, name: &str) -> serde_json::Value {
    let out = storm(config, &["nodes", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
    v["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["name"] == name))
        .map(|n| n["state"].clone())
        .unwrap_or_default()
}

fn wait_node(config: &std::path::Path, name: &str, states: &[&str], what: &str) {
    support::wait_until(Duration::from_secs(30), what, || {
        let s = node_state(config, name);
        (!states.iter().any(|w| s == *w)).then(|| s.to_string())
    });
}

/// A `--requeue` borrowed job on 3 nodes whose first run is cut off by `cut`, then `heal`:
/// it is queued again, and runs again on the lent node once it is back.
fn requeued_across(
    c0: &std::path::Path,
    dir: &std::path::Path,
    name: &str,
    cut: impl FnOnce(),
    heal: impl FnOnce(),
) {
    let (script, marker) = support::rerun_script(dir, name);
    let job = submit(
        c0,
        &["--borrow", "--requeue", "-N", "3", script.to_str().unwrap()],
    );
    support::wait_until(Duration::from_secs(30), "every rank runs", || {
        let missing: Vec<u32> = (0..3)
            .filter(|r| !marker.with_extension(r.to_string()).exists())
            .collect();
        (!missing.is_empty()).then(|| format!("ranks {missing:?}; c0's queue: {:?}", queue(c0)))
    });
    cut();
    // Held until c0 counts the node DOWN (no heartbeat for K periods), which is what ends
    // the run. `unresponsive` is not enough: it may be from a late answer just before the
    // cut, and a node back from a short cut rightly keeps its job.
    wait_node(c0, "c1-node0", &["down"], "c0 counts the lent node down");
    heal();
    let out = job.wait_with_output().unwrap();
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("requeued"), "{stderr}");
    assert!(
        stdout.contains("second run on c1-node0"),
        "the rerun had the lent node back: {stdout}{stderr}"
    );
}

/// The peer timeout of the lending test: the default. Its cuts must be shorter, and each
/// lasts until c0 counts the lent node down (1 s without a heartbeat) and then until the
/// healed link's TCP retransmission and the next report: 2 s was crossed by some.
const LENDING_PEER_TIMEOUT_MS: u64 = 5000;

#[test]
fn a_node_lent_across_namespaced_clusters_survives_cuts_and_comes_home() {
    let test = "a_node_lent_across_namespaced_clusters_survives_cuts_and_comes_home";
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((work, mut fed, c0, c1)) = two_clusters(test, LENDING_PEER_TIMEOUT_MS) else {
        return;
    };
    assert_eq!(node_state(&c0, "c1-node0"), "unknown", "not lent yet");
    let out = storm(&c1, &["lend", "node0", "--to", "c0", "--for", "10"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    assert_eq!(node_state(&c1, "node0"), "lent");
    wait_node(&c0, "c1-node0", &["idle"], "the lent node joins c0");

    let out = submit(
        &c0,
        &[
            "--borrow",
            "-N",
            "3",
            "sh",
            "-c",
            "ip -o -4 addr show eth0 | awk '{print \"at \" $4}'",
        ],
    )
    .wait_with_output()
    .unwrap();
    let stdout = support::text(&out.stdout);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    for addr in ["at 10.200.0.2/16", "at 10.200.0.3/16", "at 10.201.0.2/16"] {
        assert!(stdout.contains(addr), "{addr} in {stdout:?}");
    }

    // The link between the clusters: cut, then restored.
    requeued_across(
        &c0,
        work.path(),
        "link",
        || fed.set_link(1, false).unwrap(),
        || fed.set_link(1, true).unwrap(),
    );
    assert_eq!(node_state(&c1, "node0"), "lent", "c1 kept its node lent");

    // The lent node's own cable: cut, then restored.
    let lent_node = &fed.clusters[1];
    requeued_across(
        &c0,
        work.path(),
        "cable",
        || {
            lent_node.set_link(0, false).unwrap();
            wait_node(
                &c1,
                "node0",
                &["unresponsive", "down"],
                "c1 loses its node too",
            );
        },
        || lent_node.set_link(0, true).unwrap(),
    );
    wait_node(&c1, "node0", &["lent"], "c1's node is back, still lent");

    // Home again.
    let out = storm(&c1, &["reclaim", "node0"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_node(&c1, "node0", &["idle"], "c1's node is home");
    wait_node(
        &c0,
        "c1-node0",
        &["down", "unresponsive"],
        "c0's slot goes down",
    );

    // The borrower's MM dies with the node lent: c1 sees c0 away, and takes its node home
    // after the peer timeout.
    let out = storm(&c1, &["lend", "node0", "--to", "c0", "--for", "60"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_node(&c0, "c1-node0", &["idle"], "the lent node joins c0 again");
    fed.clusters[0].kill("storm-mm").unwrap();
    wait_node(
        &c1,
        "node0",
        &["idle"],
        "c1 takes its node home from a borrower gone for the peer timeout",
    );
    fed.clusters[0].start_mm().unwrap();
    let out = submit(&c1, &["-N", "2", "true"])
        .wait_with_output()
        .unwrap();
    assert!(out.status.success(), "{}", support::text(&out.stderr));
}

/// The peer timeout of the tests below, in which MMs are killed and started again: long
/// enough that a restart of both (a second or so) is no departure, even on a loaded host.
const RESTART_PEER_TIMEOUT_MS: u64 = 4000;

/// `child`'s output once it has ended, within `limit` (it is killed, and the test fails,
/// if it has not).
fn ended(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "{what}: not ended within {limit:?}\n{}{}",
                support::text(&out.stdout),
                support::text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

/// The addresses a job's ranks printed (`at 10.201.0.2/16`), sorted.
fn addresses(stdout: &str) -> Vec<&str> {
    let mut a: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("at "))
        .collect();
    a.sort();
    a
}

/// Prints the rank's address on its cluster's bridge (`at 10.200.0.2/16`).
const PRINT_ADDRESS: &str = "ip -o -4 addr show eth0 | awk '{print \"at \" $4}'";

/// Kills both clusters' MMs, as a crash would, and starts them again.
fn restart_both_mms(fed: &mut storm_cli::testbed::federation::Federation) {
    for c in fed.clusters.iter_mut() {
        c.kill("storm-mm").unwrap();
    }
    for c in fed.clusters.iter_mut() {
        c.start_mm().unwrap();
    }
}

/// Borrowing with nobody running `storm lend`, on the namespace testbed: c0's waiting
/// `--borrow` job asks c1 through the peer agents, runs on c0's two nodes and on one of c1's
/// (which answers with its address on c1's bridge), and c0 gives the node back when the job
/// ends. Both MMs are killed and started again under such a job: it runs on to its end on
/// all three nodes. A `--requeue` borrowed job is preempted when c1's own job needs the
/// node: c1's job runs on both its nodes, and c0's job is queued again, told its borrowed
/// node's owner may have taken it back, and runs again (borrowing again) once c1's job ends.
#[test]
fn a_waiting_job_borrows_across_namespaced_clusters_through_restarts_and_its_owners_need() {
    let test =
        "a_waiting_job_borrows_across_namespaced_clusters_through_restarts_and_its_owners_need";
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((_work, mut fed, c0, c1)) = two_clusters(test, RESTART_PEER_TIMEOUT_MS) else {
        return;
    };
    support::wait_until(
        Duration::from_secs(30),
        "c0 sees c1 offer two nodes",
        || {
            let out = storm(&c0, &["peers", "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            (v["peers"][0]["offer"]["idle_nodes"].as_u64() != Some(2)).then(|| v.to_string())
        },
    );

    // Three nodes asked of a cluster of two: c1 lends one, by itself.
    let out = ended(
        submit(&c0, &["--borrow", "-N", "3", "sh", "-c", PRINT_ADDRESS]),
        Duration::from_secs(90),
        "the borrowing job",
    );
    let stdout = support::text(&out.stdout);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    let at = addresses(&stdout);
    assert!(
        at.len() == 3
            && at[0] == "10.200.0.2/16"
            && at[1] == "10.200.0.3/16"
            && at[2].starts_with("10.201.0."),
        "c0's two nodes and one of c1's: {stdout}"
    );
    for n in ["node0", "node1"] {
        wait_node(&c1, n, &["idle"], "c1's node comes home after the job");
    }

    // Both MMs restart under a borrowed job: it runs on, on all three nodes, to its end.
    let shared = support::shared_tempdir();
    let (started, go_on) = (shared.path().join("started"), shared.path().join("go-on"));
    let body = format!(
        "touch {s}.$STORM_RANK\nwhile [ ! -e {g} ]; do sleep 0.1; done\necho end on $STORM_NODENAME\n",
        s = started.display(),
        g = go_on.display()
    );
    let script = support::script(shared.path(), "restarts.sh", &body);
    let job = submit(&c0, &["--borrow", "-N", "3", script.to_str().unwrap()]);
    let ranks_run = |marker: &std::path::Path, c0: &std::path::Path| {
        support::wait_until(Duration::from_secs(60), "every rank runs", || {
            let missing: Vec<u32> = (0..3)
                .filter(|r| !marker.with_extension(r.to_string()).exists())
                .collect();
            (!missing.is_empty()).then(|| format!("ranks {missing:?}; c0's queue: {:?}", queue(c0)))
        });
    };
    ranks_run(&started, &c0);
    let lent: Vec<&str> = ["node0", "node1"]
        .into_iter()
        .filter(|n| node_state(&c1, n) == "lent")
        .collect();
    assert_eq!(lent.len(), 1, "c1 lent one node");
    restart_both_mms(&mut fed);
    support::wait_until(Duration::from_secs(30), "both MMs answer again", || {
        let (q0, q1) = (
            storm(&c0, &["queue", "--json"]),
            storm(&c1, &["queue", "--json"]),
        );
        (!q0.status.success() || !q1.status.success()).then(|| support::text(&q0.stderr))
    });
    support::wait_until(Duration::from_secs(30), "the borrowed job runs on", || {
        let q = queue(&c0);
        (!(q.len() == 1 && q[0]["state"] == "running")).then(|| format!("{q:?}"))
    });
    wait_node(&c1, lent[0], &["lent"], "c1 keeps its node lent");
    std::fs::write(&go_on, "").unwrap();
    let out = ended(
        job,
        Duration::from_secs(60),
        "the job the MMs restarted under",
    );
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    let mut ends: Vec<&str> = stdout
        .lines()
        .filter_map(|l| l.strip_prefix("end on "))
        .collect();
    ends.sort();
    assert!(
        ends.len() == 3 && ends[0].starts_with("c1-node") && ends[1..] == ["node0", "node1"],
        "one run on c0's two nodes and c1's lent one: {stdout}{stderr}"
    );
    assert!(!stderr.contains("requeued"), "{stderr}");
    wait_node(
        &c1,
        lent[0],
        &["idle"],
        "c1's node comes home after the job",
    );

    // c1's own job needs both its nodes: it takes the lent one back from c0's job.
    let (script, marker) = support::rerun_script(shared.path(), "taken-back");
    let job = submit(
        &c0,
        &["--borrow", "--requeue", "-N", "3", script.to_str().unwrap()],
    );
    ranks_run(&marker, &c0);
    let out = ended(
        submit(&c1, &["-N", "2", "sh", "-c", PRINT_ADDRESS]),
        Duration::from_secs(60),
        "c1's own job",
    );
    let stdout = support::text(&out.stdout);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    assert_eq!(
        addresses(&stdout),
        ["10.201.0.2/16", "10.201.0.3/16"],
        "{stdout}"
    );
    let out = ended(job, Duration::from_secs(90), "the preempted borrowed job");
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("requeued")
            && stderr.contains("its owner took it back (reclaimed for its job")
            && !stderr.contains("without notice"),
        "c0 is told why c1 took its node: {stderr}"
    );
    assert_eq!(
        stdout.matches("second run on c1-node").count(),
        1,
        "the rerun borrowed again: {stdout}{stderr}"
    );
    for n in ["node0", "node1"] {
        wait_node(&c1, n, &["idle"], "c1's nodes are home at the end");
    }
}

/// A flocked job on the namespace testbed through MM failures. Both MMs are killed and
/// started again under it: it runs on at c1, and its output and exit code reach c0's
/// storm-submit. Then c1's MM dies (its agent lives and says so) under another flocked job
/// while c0 is full: after the peer timeout c0 queues the job at home again, runs it on its
/// own nodes once they are free. Then c1's host restarts (its agent and MM): c1's MM, back
/// with the copy from its journal and no follower for it, gives it up after the peer
/// timeout, and its tasks stop.
#[test]
fn a_flocked_job_survives_both_mms_restarting_and_comes_home_when_its_peers_mm_dies() {
    let test = "a_flocked_job_survives_both_mms_restarting_and_comes_home_when_its_peers_mm_dies";
    let _alone = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let Some((_work, mut fed, c0, c1)) = two_clusters(test, RESTART_PEER_TIMEOUT_MS) else {
        return;
    };

    // Both MMs restart under a flocked job.
    let shared = support::shared_tempdir();
    let go_on = shared.path().join("go-on");
    let body = format!(
        "echo before\nwhile [ ! -e {} ]; do sleep 0.1; done\necho after\nexit 3\n",
        go_on.display()
    );
    let script = support::script(shared.path(), "restarts.sh", &body);
    let job = submit(
        &c0,
        &["--clusters", "c1", "-N", "2", script.to_str().unwrap()],
    );
    running_on_c1(&c0);
    restart_both_mms(&mut fed);
    support::wait_until(
        Duration::from_secs(30),
        "c0 shows the job on c1 again",
        || {
            let q = queue(&c0);
            (!(q.len() == 1 && q[0]["state"] == "running" && q[0]["cluster"] == "c1"))
                .then(|| format!("{q:?}"))
        },
    );
    std::fs::write(&go_on, "").unwrap();
    let out = ended(job, Duration::from_secs(60), "the flocked job");
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert_eq!(out.status.code(), Some(3), "{stdout}{stderr}");
    assert_eq!(stdout.matches("before").count(), 2, "{stdout}{stderr}");
    assert_eq!(stdout.matches("after").count(), 2, "{stdout}{stderr}");
    assert!(!stderr.contains("queued at home again"), "{stderr}");

    // c1's MM dies under a flocked job while c0 is full.
    let blocker = submit(
        &c0,
        &["--no-flock", "--exclusive", "-N", "2", "sleep", "300"],
    );
    support::wait_until(Duration::from_secs(20), "the blocker runs on c0", || {
        let q = queue(&c0);
        (!q.iter().any(|j| j["state"] == "running")).then(|| format!("{q:?}"))
    });
    let blocker_id = queue(&c0)[0]["job"].as_u64().unwrap();
    // On c1 it waits for good; at home it prints where it ran.
    let body = format!(
        "case \"$(ip -o -4 addr show eth0)\" in *10.201.*) exec sleep 300;; esac\n{PRINT_ADDRESS}\n"
    );
    let script = support::script(shared.path(), "home-only.sh", &body);
    let job = submit(&c0, &["--flock", "-N", "2", script.to_str().unwrap()]);
    let id = running_on_c1(&c0);
    fed.clusters[1].kill("storm-mm").unwrap();
    support::wait_until(
        Duration::from_millis(RESTART_PEER_TIMEOUT_MS * 4),
        "c0 queues the job at home again",
        || {
            let q = queue(&c0);
            match q.iter().find(|j| j["job"] == id) {
                Some(j) if j["cluster"].is_null() && j["state"] == "queued" => None,
                _ => Some(format!("{q:?}")),
            }
        },
    );
    assert!(
        storm(&c0, &["cancel", &blocker_id.to_string()])
            .status
            .success()
    );
    let _ = ended(blocker, Duration::from_secs(30), "the cancelled blocker");
    let out = ended(job, Duration::from_secs(60), "the job queued at home again");
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(stderr.contains("queued at home again"), "{stderr}");
    assert_eq!(
        addresses(&stdout),
        ["10.200.0.2/16", "10.200.0.3/16"],
        "it ran at home: {stdout}"
    );

    // c1's host restarts (its agent too, which forgets what it followed): its MM, back,
    // has the copy from its journal, still running on its nodes, and no follower of it
    // comes (the home no longer lists the job). It gives the copy up after the peer
    // timeout, and its tasks stop.
    fed.clusters[1].kill("storm-peer").unwrap();
    fed.clusters[1].start_mm().unwrap();
    fed.clusters[1].start_peer_agent().unwrap();
    support::wait_until(
        Duration::from_millis(RESTART_PEER_TIMEOUT_MS * 4),
        "c1, answering again, cancels its copy",
        || {
            let out = storm(&c1, &["queue", "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
            let empty = out.status.success() && v["jobs"].as_array().is_some_and(|j| j.is_empty());
            (!empty).then(|| format!("{v} {}", support::text(&out.stderr)))
        },
    );
    let hist = storm(&c1, &["history", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&hist.stdout).unwrap();
    let copy = v["jobs"]
        .as_array()
        .and_then(|j| j.iter().find(|j| j["name"] == "home-only.sh"))
        .cloned()
        .unwrap_or_default();
    assert_eq!(copy["state"], "cancelled", "c1's copy: {v}");
    assert!(
        copy["reason"]
            .as_str()
            .is_some_and(|r| r.contains("has not followed the job")),
        "c1's copy: {copy}"
    );
    for n in ["node0", "node1"] {
        wait_node(&c1, n, &["idle"], "c1's nodes run nothing of c0's");
    }
}
