//! Flocking, seen from the user's terminal and the operators' `storm queue`: two embedded
//! clusters on loopback, each MM with its peers in its cluster file, each with its peer agent
//! (`storm-peer`). `home` (1 node) may borrow from `away` (2 nodes), which lends to it and
//! runs its flocked jobs as the same user (`nobody`, on this one host).
//!
//! * With `home`'s node busy, `--flock` runs the job on `away`: storm-submit says where,
//!   prints its output and returns its exit code.
//! * A job that asks nothing flocks once it has waited `flock_after_ms`; a `--no-flock` job
//!   stays queued at home.
//! * `--clusters away`: `storm queue` at home shows the job running on `away`, and `away`'s
//!   queue holds it; `storm cancel` at home ends it on `away` too.
//! * `--clusters away -N 2`, larger than home: it runs on away's two nodes (each rank's line
//!   and the exit code come home); `-N 3`, larger than away too, is refused naming away's
//!   size.
//! * Either MM, or both at once, restart while a flocked job runs: the job goes on, and its
//!   submitter gets the rest of its output and its exit code.
//! * The peers link up (`storm peers`): home sees away `up`, offering its idle nodes and
//!   CPUs, with the link's lag; away sees home up, offering nothing (home lends nothing).
//! * `away`'s agent dies: home sees away `down`, offering nothing; away gives its copy of the
//!   job up (nobody follows it for home); after `peer_timeout_ms` the job is queued at home again, says so, and runs at home once the node is free (a failure
//!   of the flocking machinery never stops home from scheduling its own jobs).
//! * `away`'s agent comes back holding another key: home sees it `refused`, the reason naming
//!   the key; with the right key, `up` again.
//! * `away`'s agent freezes (SIGSTOP) under a flocked job while home is full: away gives its
//!   copy up, home queues the job again, and when the agent thaws home sends the job to away
//!   again; it runs to its end there (the thawed agent takes home's new link while it still
//!   holds the first sending's follower: that used to hang it for good).

mod support;

use std::path::PathBuf;
use std::process::{Child, Output, Stdio};
use std::time::{Duration, Instant};

use storm_cli::local::LocalOptions;
use storm_cluster::ClusterConfig;
use storm_cluster::federation::{FederationSection, PeerEntry};
use support::{NOBODY, TestCluster, start_agent};

const PEER_TIMEOUT_MS: u64 = 3000;

fn free_port() -> u16 {
    storm_cli::local::free_loopback_port().expect("a free loopback port")
}

/// A cluster of `nodes` nodes named `name`, its agent listening on `listen`, with `peer`.
fn cluster(
    name: &str,
    nodes: u32,
    listen: u16,
    flock_after_ms: Option<u64>,
    peer: PeerEntry,
) -> TestCluster {
    TestCluster::with(LocalOptions {
        cpus: Some(support::TEST_CPUS),
        name: Some(name.into()),
        federation: FederationSection {
            listen: Some(format!("127.0.0.1:{listen}").parse().unwrap()),
            advertise_ms: 200,
            peer_timeout_ms: PEER_TIMEOUT_MS,
            flock_after_ms,
            ..Default::default()
        },
        peers: vec![peer],
        ..LocalOptions::new(nodes)
    })
}

fn config_of(c: &TestCluster) -> PathBuf {
    c.root.join("cluster.toml")
}

/// `storm queue --json`'s entry for job `id` on `c` (null if it is not there).
fn queued(c: &TestCluster, id: u64) -> serde_json::Value {
    let out = c.storm(&["queue", "--json"]);
    assert!(
        out.status.success(),
        "storm queue: {}",
        support::text(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["jobs"]
        .as_array()
        .and_then(|j| j.iter().find(|j| j["job"] == id).cloned())
        .unwrap_or(serde_json::Value::Null)
}

/// What `storm peers --json` on `c` says of peer `name` (null if it is not listed).
fn peer_view(c: &TestCluster, name: &str) -> serde_json::Value {
    let out = c.storm(&["peers", "--json"]);
    assert!(
        out.status.success(),
        "storm peers: {}",
        support::text(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["peers"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name).cloned())
        .unwrap_or(serde_json::Value::Null)
}

/// Waits up to 20 s for `check` to hold of what `c` says of peer `name`, and returns it.
fn wait_peer(
    c: &TestCluster,
    name: &str,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let mut seen = serde_json::Value::Null;
    support::wait_until(Duration::from_secs(20), what, || {
        seen = peer_view(c, name);
        (!check(&seen)).then(|| seen.to_string())
    });
    seen
}

/// Every job in `c`'s queue.
fn queue(c: &TestCluster) -> Vec<serde_json::Value> {
    let out = c.storm(&["queue", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("JSON");
    v["jobs"].as_array().cloned().unwrap_or_default()
}

/// The id of the job that showed up in `c`'s queue after `before` (the newest).
fn new_job(c: &TestCluster, before: &[u64]) -> u64 {
    let mut id = None;
    support::wait_until(Duration::from_secs(10), "the job is queued", || {
        id = queue(c)
            .iter()
            .filter_map(|j| j["job"].as_u64())
            .filter(|j| !before.contains(j))
            .max();
        id.is_none().then(|| "no new job".to_string())
    });
    id.unwrap()
}

/// Waits until `c`'s queue shows job `id` running (here or on a peer).
fn wait_running(c: &TestCluster, id: u64, limit: Duration, what: &str) {
    support::wait_until(limit, what, || {
        let j = queued(c, id);
        (j["state"] != "running").then(|| j.to_string())
    });
}

fn ids(c: &TestCluster) -> Vec<u64> {
    queue(c).iter().filter_map(|j| j["job"].as_u64()).collect()
}

fn finish(mut child: Child, limit: Duration) -> Output {
    let deadline = Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!(
                "storm-submit did not end within {limit:?}; stderr: {}",
                support::text(&out.stderr)
            );
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

fn spawn_as_nobody(c: &TestCluster, args: &[&str]) -> Child {
    c.submit_cmd_as(NOBODY, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn storm-submit")
}

/// Takes `home`'s one node whole with a job that stays home (`--no-flock`), running; its
/// storm-submit and id.
fn take_home_node(home: &TestCluster) -> (Child, u64) {
    let before = ids(home);
    let blocker = spawn_as_nobody(
        home,
        &[
            "--no-flock",
            "--exclusive",
            "-N",
            "1",
            "-D",
            "/tmp",
            "sleep",
            "300",
        ],
    );
    let id = new_job(home, &before);
    wait_running(
        home,
        id,
        Duration::from_secs(10),
        "the blocker runs at home",
    );
    (blocker, id)
}

/// Submits `script` to `home` with `--flock` (one node, as nobody) and waits until it runs,
/// on the peer while home's node is taken; its storm-submit and id.
fn flock_running(home: &TestCluster, script: &str) -> (Child, u64) {
    let before = ids(home);
    let job = spawn_as_nobody(
        home,
        &["--flock", "-N", "1", "-D", "/tmp", "sh", "-c", script],
    );
    let id = new_job(home, &before);
    wait_running(home, id, Duration::from_secs(15), "it runs on away");
    (job, id)
}

#[test]
fn jobs_flock_to_a_peer_with_room_and_come_back_when_it_goes() {
    let test = "jobs_flock_to_a_peer_with_room_and_come_back_when_it_goes";
    if !support::root_or_say(test) {
        return;
    }
    support::ensure_all_binaries();
    let keys = tempfile::tempdir().unwrap();
    let pair = keys.path().join("pair.key");
    storm_cluster::key::generate(&pair).unwrap();
    let (p_home, p_away) = (free_port(), free_port());
    let entry = |name: &str, port: u16, lend: bool| PeerEntry {
        name: name.into(),
        address: format!("127.0.0.1:{port}").parse().unwrap(),
        key_file: pair.clone(),
        lend,
        borrow: !lend,
        // The dedicated account: the default (same_users off) whatever owner home names.
        flock_user: Some("nobody".into()),
        same_users: false,
        guest_file: None,
        mm_public_key_file: None,
        priority: 0,
    };
    let mut home = cluster(
        "fl-home",
        1,
        p_home,
        Some(1000),
        entry("fl-away", p_away, false),
    );
    let mut away = cluster("fl-away", 2, p_away, None, entry("fl-home", p_home, true));
    let _home_agent = start_agent(&config_of(&home));
    let mut away_agent = Some(start_agent(&config_of(&away)));
    // The peers link up: away lends to home its two idle nodes and their CPUs, and home
    // lends nothing to away. Both sides measure the link's lag.
    let up = |v: &serde_json::Value| v["state"] == "up" && v["lag_us"].is_u64();
    let seen = wait_peer(
        &home,
        "fl-away",
        "home sees away up, offering 2 nodes",
        |v| up(v) && v["offer"]["idle_nodes"] == 2,
    );
    assert_eq!(seen["offer"]["idle_cpus"], 2 * support::TEST_CPUS, "{seen}");
    assert_eq!(seen["offer"]["nodes"], 2, "{seen}");
    assert_eq!(seen["borrow"], true, "{seen}");
    let back = wait_peer(&away, "fl-home", "away sees home up", up);
    assert!(
        back["offer"].is_null(),
        "home lends nothing to away: {back}"
    );
    let table = support::text(&home.storm(&["peers"]).stdout);
    assert!(
        table.contains("fl-away") && table.contains("up"),
        "storm peers: {table}"
    );

    // Home's one node is taken whole by a job that stays home.
    let (blocker, blocker_id) = take_home_node(&home);

    // --flock: runs on away; output and exit code come home. It also tries to submit a job
    // of its own at away (issue 61, L1): refused, as the account away runs home's jobs as
    // (before, it ran as an ordinary job of away's, and outlived the flocked job).
    let inner = format!(
        "echo hello from afar; env -u STORM_JOB_ID {} --socket \"$STORM_SOCKET\" /bin/true 2>&1; \
         exit 3",
        env!("CARGO_BIN_EXE_storm-submit")
    );
    let out = home.submit_as(
        NOBODY,
        &["--flock", "-N", "1", "-D", "/tmp", "sh", "-c", &inner],
    );
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert_eq!(
        out.status.code(),
        Some(3),
        "the job's exit code; stderr: {stderr}"
    );
    assert!(
        stdout.contains("hello from afar"),
        "its output: {stdout:?}; stderr: {stderr}"
    );
    assert!(
        stdout.contains("submits no jobs of its own"),
        "a flocked job's own submission at away: {stdout:?}"
    );
    assert!(
        stderr.contains("flocked to peer cluster fl-away"),
        "{stderr}"
    );

    // Its submitter's standard input reaches the flocked job's task (rank 0), through both
    // agents: a line, then more than storm-submit sends ahead of the task's reading (the
    // window), so the task's acknowledgements must come home for the rest to go.
    let mut input = b"alpha\n".to_vec();
    input.extend(std::iter::repeat_n(b'x', 200_000));
    let mut job = home
        .submit_cmd_as(
            NOBODY,
            &[
                "--flock",
                "-N",
                "1",
                "-D",
                "/tmp",
                "sh",
                "-c",
                "read first; echo \"first: $first\"; echo \"rest: $(wc -c)\"",
            ],
        )
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn storm-submit");
    let mut stdin = job.stdin.take().unwrap();
    let writer = std::thread::spawn(move || std::io::Write::write_all(&mut stdin, &input));
    let out = finish(job, Duration::from_secs(60));
    let written = writer.join().unwrap();
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(
        stdout.contains("first: alpha") && stdout.contains("rest: 200000"),
        "the flocked task read its submitter's input: {stdout:?}; stderr: {stderr}"
    );
    assert!(out.status.success(), "stdout: {stdout:?}; stderr: {stderr}");
    assert!(
        stderr.contains("flocked to peer cluster fl-away"),
        "{stderr}"
    );
    written.expect("storm-submit read all its input");

    // --no-flock waits at home, past flock_after_ms; a job that asks nothing flocks then.
    let before = ids(&home);
    let stay = spawn_as_nobody(&home, &["--no-flock", "-N", "1", "-D", "/tmp", "true"]);
    let stay_id = new_job(&home, &before);
    let out = home.submit_as(
        NOBODY,
        &["-N", "1", "-D", "/tmp", "sh", "-c", "echo waited"],
    );
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    assert!(support::text(&out.stdout).contains("waited"));
    assert!(support::text(&out.stderr).contains("flocked to peer cluster fl-away"));
    let j = queued(&home, stay_id);
    assert_eq!(j["state"], "queued", "--no-flock stays home: {j}");
    assert!(j["cluster"].is_null(), "{j}");
    assert!(
        home.storm(&["cancel", &stay_id.to_string()])
            .status
            .success()
    );
    let _ = finish(stay, Duration::from_secs(10));

    // --clusters away: home's queue shows where it runs, away's queue holds it, and a cancel
    // at home ends it there.
    let before = ids(&home);
    let far = spawn_as_nobody(
        &home,
        &[
            "--clusters",
            "fl-away",
            "-N",
            "1",
            "-D",
            "/tmp",
            "sleep",
            "300",
        ],
    );
    let far_id = new_job(&home, &before);
    support::wait_until(
        Duration::from_secs(15),
        "home shows it running on away",
        || {
            let j = queued(&home, far_id);
            (j["state"] != "running" || j["cluster"] != "fl-away").then(|| j.to_string())
        },
    );
    let table = support::text(&home.storm(&["queue"]).stdout);
    assert!(table.contains("on peer cluster fl-away"), "{table}");
    let table = support::text(&away.storm(&["queue"]).stdout);
    assert!(table.contains("for peer cluster fl-home"), "{table}");
    let theirs = queue(&away);
    assert!(
        theirs.iter().any(|j| j["uid"] == NOBODY
            && j["state"] == "running"
            && j["from_cluster"] == "fl-home"),
        "away runs it, as nobody, for fl-home: {theirs:?}"
    );
    assert!(
        home.storm(&["cancel", &far_id.to_string()])
            .status
            .success()
    );
    let out = finish(far, Duration::from_secs(15));
    assert!(!out.status.success());
    support::wait_until(
        Duration::from_secs(10),
        "away cancels the withdrawn job",
        || {
            let q = queue(&away);
            (!q.is_empty()).then(|| format!("{q:?}"))
        },
    );

    // Larger than home (1 node), naming only away (2 nodes): sized against away, runs there
    // on both nodes; 3 nodes, larger than away too, is refused with both sizes named.
    let out = home.submit_as(
        NOBODY,
        &[
            "--clusters",
            "fl-away",
            "-N",
            "2",
            "-D",
            "/tmp",
            "sh",
            "-c",
            "echo rank $STORM_RANK on $STORM_NODENAME; exit 4",
        ],
    );
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert_eq!(out.status.code(), Some(4), "{stdout}{stderr}");
    for rank in ["rank 0 on", "rank 1 on"] {
        assert!(stdout.contains(rank), "{rank} in {stdout:?}; {stderr}");
    }
    assert!(
        stderr.contains("flocked to peer cluster fl-away"),
        "{stderr}"
    );
    let out = home.submit_as(
        NOBODY,
        &["--clusters", "fl-away", "-N", "3", "-D", "/tmp", "true"],
    );
    let stderr = support::text(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(
            "the job needs 3 nodes, and no cluster it may run on has that many (fl-away has 2)"
        ),
        "{stderr}"
    );

    // Either MM, then both at once, restart while a flocked job runs: it goes on, and its
    // submitter gets the rest of its output and its exit code.
    let script = support::script(
        &std::env::temp_dir(),
        "storm-flock-restarts.sh",
        "echo first\nsleep 4\necho second\nexit 5\n",
    );
    for restarted in ["home", "away", "both"] {
        let before = ids(&home);
        let job = spawn_as_nobody(
            &home,
            &["--flock", "-N", "1", "-D", "/tmp", script.to_str().unwrap()],
        );
        let id = new_job(&home, &before);
        wait_running(&home, id, Duration::from_secs(15), "it runs on away");
        let mut which = Vec::new();
        if restarted != "away" {
            which.push(&mut home);
        }
        if restarted != "home" {
            which.push(&mut away);
        }
        for c in &mut which {
            c.cluster.as_mut().unwrap().kill_mm().unwrap();
        }
        std::thread::sleep(Duration::from_millis(300));
        for c in &mut which {
            c.cluster.as_mut().unwrap().restart_mm().unwrap();
        }
        let out = finish(job, Duration::from_secs(40));
        let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
        assert_eq!(
            out.status.code(),
            Some(5),
            "{restarted} MM(s) restarted; stderr: {stderr}"
        );
        assert!(
            stdout.contains("second"),
            "{restarted} MM(s) restarted; stdout: {stdout:?}"
        );
        assert!(
            !stderr.contains("requeued"),
            "a restart is no departure: {stderr}"
        );
    }

    // Away's agent dies: the job comes home after the timeout, and runs here once the node
    // is free.
    let (job, id) = flock_running(&home, "sleep 4; echo done where it ran");
    drop(away_agent.take());
    let down = wait_peer(&home, "fl-away", "home sees away down", |v| {
        v["state"] == "down"
    });
    assert!(
        down["offer"].is_null(),
        "a down peer offers nothing: {down}"
    );
    // Away gives its copy up, since nobody follows it for home any more: home will run the
    // job again, and it must not run twice.
    support::wait_until(
        Duration::from_millis(PEER_TIMEOUT_MS * 2),
        "away gives up its copy of the job",
        || {
            let hist = away.storm(&["history", "--json"]);
            let v: serde_json::Value = serde_json::from_slice(&hist.stdout).unwrap_or_default();
            let given_up = v["jobs"].as_array().is_some_and(|jobs| {
                jobs.iter().any(|j| {
                    j["state"] == "cancelled"
                        && j["from_cluster"] == "fl-home"
                        && j["reason"]
                            .as_str()
                            .is_some_and(|r| r.contains("has not reported"))
                })
            });
            (!given_up).then(|| v.to_string())
        },
    );
    support::wait_until(
        Duration::from_millis(PEER_TIMEOUT_MS * 3),
        "home queues it again",
        || {
            let j = queued(&home, id);
            (j["state"] != "queued" || !j["cluster"].is_null()).then(|| j.to_string())
        },
    );
    assert!(
        home.storm(&["cancel", &blocker_id.to_string()])
            .status
            .success()
    );
    let _ = finish(blocker, Duration::from_secs(15));
    let out = finish(job, Duration::from_secs(30));
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stderr}");
    assert!(stdout.contains("done where it ran"), "{stdout:?}");
    assert!(stderr.contains("fl-away has been down"), "{stderr}");
    assert!(stderr.contains("queued at home again"), "{stderr}");
    let hist = home.storm(&["history", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&hist.stdout).unwrap();
    let ran = v["jobs"]
        .as_array()
        .and_then(|j| j.iter().find(|j| j["job"] == id).cloned())
        .unwrap_or_default();
    assert_eq!(ran["nodes"], "0", "it ran on home's node: {ran}");

    // Away's agent comes back holding another key: home sees it refused, the reason naming
    // the key; with the right key again, up and offering its nodes.
    let wrong_key = keys.path().join("wrong.key");
    storm_cluster::key::generate(&wrong_key).unwrap();
    let wrong = away.root.join("cluster-wrong-key.toml");
    let mut cfg = ClusterConfig::load(&config_of(&away)).expect("away's cluster file");
    cfg.peers[0].key_file = wrong_key;
    std::fs::write(&wrong, cfg.to_toml()).unwrap();
    let wrong_agent = start_agent(&wrong);
    let refused = wait_peer(&home, "fl-away", "away refused", |v| {
        v["state"] == "refused"
    });
    assert!(
        refused["reason"]
            .as_str()
            .is_some_and(|r| r.contains("does not hold the key")),
        "{refused}"
    );
    drop(wrong_agent);
    let away_agent = start_agent(&config_of(&away));
    wait_peer(&home, "fl-away", "away up again with the right key", |v| {
        up(v) && v["offer"]["idle_nodes"] == 2
    });

    // Away's agent freezes (SIGSTOP) under a flocked job while home's node is busy. Away
    // gives its copy up; home queues the job again after the timeout. The agent thaws, away
    // offers room again, and home sends the job there again: a new sending, which must run
    // to its end (the thawed agent, taking home's new link while it held the first
    // sending's follower, used to hang for good).
    let (blocker, blocker_id) = take_home_node(&home);
    let given_up_on_away = || {
        let hist = away.storm(&["history", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&hist.stdout).unwrap_or_default();
        v["jobs"].as_array().map_or(0, |jobs| {
            jobs.iter()
                .filter(|j| {
                    j["state"] == "cancelled"
                        && j["reason"]
                            .as_str()
                            .is_some_and(|r| r.contains("has not reported"))
                })
                .count()
        })
    };
    let given_up_before = given_up_on_away();
    let (job, id) = flock_running(&home, "sleep 3; echo ran to its end");
    let agent_pid = nix::unistd::Pid::from_raw(away_agent.0.id() as i32);
    nix::sys::signal::kill(agent_pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    support::wait_until(
        Duration::from_millis(PEER_TIMEOUT_MS * 2),
        "away gives up its copy while its agent is frozen",
        || {
            let n = given_up_on_away();
            (n <= given_up_before).then(|| format!("{n} given up"))
        },
    );
    support::wait_until(
        Duration::from_millis(PEER_TIMEOUT_MS * 3),
        "home queues it again",
        || {
            let j = queued(&home, id);
            (j["state"] != "queued" || !j["cluster"].is_null()).then(|| j.to_string())
        },
    );
    nix::sys::signal::kill(agent_pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let out = finish(job, Duration::from_secs(60));
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(
        out.status.success(),
        "the job sent again runs to its end; stdout: {stdout:?}; stderr: {stderr}"
    );
    assert!(stdout.contains("ran to its end"), "{stdout:?}; {stderr}");
    assert!(stderr.contains("queued at home again"), "{stderr}");
    assert!(
        home.storm(&["cancel", &blocker_id.to_string()])
            .status
            .success()
    );
    let _ = finish(blocker, Duration::from_secs(15));
}
