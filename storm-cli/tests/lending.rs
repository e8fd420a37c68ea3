//! Lending a node, seen from both clusters' terminals (docs/federation.md): two embedded
//! clusters on loopback. `lender` has one node, `node0`; `borrower` has one node of its own
//! and a guest slot for `lender`'s `node0` (`lender-node0`). `lender` runs borrowed jobs as
//! its account `daemon` (its `[[peer]] flock_user`), whoever owns them at `borrower`.
//!
//! * Before any lease, the slot is not a place for jobs: `storm nodes` says whose node it
//!   stands for; a two-node job without `--borrow` is refused with the reason naming
//!   `--borrow`; one with `--borrow` waits.
//! * `storm lend node0 --to borrower --for 10` at `lender`: `lender` shows the node `lent`
//!   and starts none of its own jobs there; the borrowed job runs on both nodes, its task on
//!   the lent node as `daemon` and its task at home as its owner.
//! * Both MMs restart under a running borrowed job: `lender`'s keeps the node lent (its
//!   journal), `borrower`'s finds the job on the slot, and the job runs on.
//! * `storm reclaim node0` at `lender` under a running borrowed job: no agent runs to tell
//!   `borrower`, so the node comes home at once; the job ends at `borrower` with the lost
//!   node named (gone without notice), its guest task is gone from the node, and `lender`'s
//!   waiting job runs there.
//! * A lease of 3 s: the slot is up, then down once the lease ends, and the node takes
//!   `lender`'s jobs again without anyone reclaiming it.
//! * The lent node dies (its NM and guest killed outright) under a `--requeue` borrowed job:
//!   the job is queued again; once the node's NM is back, its lender's MM has it run the
//!   guest again, and the job runs again on the slot.
//! * The lent node's NM alone is killed outright, its guest left running: the NM that starts
//!   next stops that orphan and runs a guest of its own; the `--requeue` job runs again.
//! * The guest freezes under a borrowed job and `storm reclaim --now` takes the node home:
//!   the guest is killed outright after its 3 s, and what its task started in a session of
//!   its own, left behind, is killed by the home NM.
//!
//! Borrowing by asking (two more clusters, both peer agents running) is described at its
//! test; so is a lender whose MM freezes and thaws.
//!
//! Why this file is over 1,000 lines: one test binary. Every integration-test binary links
//! storm's crates anew, so the lending tests share one, and its helpers (two clusters, their
//! terminals, their logs on failure).

mod support;

use std::path::PathBuf;
use std::time::Duration;

use storm_cli::local::LocalOptions;
use storm_cluster::federation::{FederationSection, GuestOf, PeerEntry};
use support::{NOBODY, TestCluster};

fn free_port() -> u16 {
    storm_cli::local::free_loopback_port().expect("a free loopback port")
}

fn peer(name: &str, port: u16, key: &std::path::Path) -> PeerEntry {
    PeerEntry {
        name: name.into(),
        address: format!("127.0.0.1:{port}").parse().unwrap(),
        key_file: key.to_path_buf(),
        lend: false,
        borrow: false,
        flock_user: None,
        same_users: false,
        guest_file: None,
        mm_public_key_file: None,
        priority: 0,
    }
}

/// `child`'s output once it ends, or `None` (it is killed) if it runs past `limit`.
fn output_within(child: std::process::Child, limit: Duration) -> Option<std::process::Output> {
    support::ended_within(child, limit).ok()
}

/// The last lines of every daemon log of `clusters` (`mm.log`, `nodeN.log`), for a failure's
/// message.
fn daemon_logs(clusters: &[&TestCluster]) -> String {
    let mut all = String::new();
    for c in clusters {
        let Ok(dir) = std::fs::read_dir(&c.root) else {
            continue;
        };
        let mut logs: Vec<PathBuf> = dir
            .flatten()
            .map(|e| e.path())
            .filter(|p| p.extension().is_some_and(|e| e == "log"))
            .collect();
        logs.sort();
        for log in logs {
            let text = std::fs::read_to_string(&log).unwrap_or_default();
            let lines: Vec<&str> = text.lines().collect();
            let tail = &lines[lines.len().saturating_sub(30)..];
            all += &format!(
                "--- {} (last {} lines)\n{}\n",
                log.display(),
                tail.len(),
                tail.join("\n")
            );
        }
    }
    all
}

/// Processes of user `uid` alive now (zombies left out: they are dead, waiting for init)
/// whose command line contains every one of `needles`: their pids.
fn live_processes(uid: u32, needles: &[&str]) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let dir = entry.path();
        let (Ok(status), Ok(cmdline)) = (
            std::fs::read_to_string(dir.join("status")),
            std::fs::read(dir.join("cmdline")),
        ) else {
            continue;
        };
        let field = |name: &str| {
            status
                .lines()
                .find_map(|l| l.strip_prefix(name))
                .map(|v| v.split_whitespace().next().unwrap_or("").to_string())
        };
        if field("Uid:").as_deref() == Some(&uid.to_string())
            && field("State:").as_deref() != Some("Z")
            && needles
                .iter()
                .all(|n| String::from_utf8_lossy(&cmdline).contains(n))
        {
            found.push(pid);
        }
    }
    found
}

/// A `--requeue` borrowed job of 2 nodes on `c`, as `nobody`, running its
/// [`support::rerun_script`] once both ranks have started.
fn run_twice(c: &TestCluster, dir: &std::path::Path, name: &str) -> std::process::Child {
    let (script, marker) = support::rerun_script(dir, name);
    let job = c
        .submit_cmd_as(
            NOBODY,
            &["-N", "2", "--borrow", "--requeue", script.to_str().unwrap()],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_until(Duration::from_secs(20), "both ranks run", || {
        (!(marker.with_extension("0").exists() && marker.with_extension("1").exists()))
            .then(|| "markers missing".to_string())
    });
    job
}

fn federation(port: u16) -> FederationSection {
    FederationSection {
        listen: Some(format!("127.0.0.1:{port}").parse().unwrap()),
        ..Default::default()
    }
}

/// What `storm nodes --json` says of node `name` on `c`.
fn node_view(c: &TestCluster, name: &str) -> serde_json::Value {
    let out = c.storm(&["nodes", "--json"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    node_in(&out.stdout, name)
}

/// Node `name` in `storm nodes --json`'s answer `json`.
fn node_in(json: &[u8], name: &str) -> serde_json::Value {
    let v: serde_json::Value = serde_json::from_slice(json).expect("JSON");
    v["nodes"]
        .as_array()
        .and_then(|n| n.iter().find(|n| n["name"] == name).cloned())
        .unwrap_or(serde_json::Value::Null)
}

fn wait_state(c: &TestCluster, node: &str, states: &[&str], what: &str) -> serde_json::Value {
    let mut seen = serde_json::Value::Null;
    support::wait_until(Duration::from_secs(30), what, || {
        // An MM that restarts answers again after a while.
        let out = c.storm(&["nodes", "--json"]);
        if !out.status.success() {
            return Some(support::text(&out.stderr));
        }
        seen = node_in(&out.stdout, node);
        (!states.iter().any(|s| seen["state"] == *s)).then(|| seen.to_string())
    });
    seen
}

#[test]
fn a_lent_node_runs_the_borrowers_jobs_as_the_lenders_account_and_comes_home() {
    if !support::root_or_say("lending") {
        return;
    }
    let daemon_uid = nix::unistd::User::from_name("daemon")
        .unwrap()
        .expect("the daemon account")
        .uid
        .as_raw();
    let keys = tempfile::tempdir().unwrap();
    let pair = keys.path().join("pair.key");
    storm_cluster::key::generate(&pair).unwrap();
    let (borrower_port, lender_port) = (free_port(), free_port());
    let mut borrower = TestCluster::with(LocalOptions {
        cpus: Some(support::TEST_CPUS),
        name: Some("borrower".into()),
        federation: federation(borrower_port),
        peers: vec![PeerEntry {
            borrow: true,
            mm_public_key_file: Some(pair.with_file_name("lender-mm.pub")),
            ..peer("lender", lender_port, &pair)
        }],
        guests: vec![GuestOf {
            cluster: "lender".into(),
            node: "node0".into(),
        }],
        scheduler: rt_set(),
        ..LocalOptions::new(1)
    });
    let borrower_file: PathBuf = support::guest_file_of(&borrower);
    let mut lender = TestCluster::with(LocalOptions {
        cpus: Some(support::TEST_CPUS),
        name: Some("lender".into()),
        federation: federation(lender_port),
        peers: vec![PeerEntry {
            lend: true,
            flock_user: Some("daemon".into()),
            guest_file: Some(borrower_file),
            mm_public_key_file: None,
            ..peer("borrower", borrower_port, &pair)
        }],
        ..LocalOptions::new(1)
    });
    support::install_lender_key(&lender, &pair.with_file_name("lender-mm.pub"));
    // This test's guest NMs: their command line names its lender's file, as the lender's
    // own daemons' do (the other tests of this file run guests of their own meanwhile).
    let our_guests = lender
        .root
        .join("cluster.toml")
        .to_str()
        .unwrap()
        .to_string();
    let shared = support::shared_tempdir();
    let where_ = support::script(
        shared.path(),
        "where.sh",
        "echo \"$STORM_NODENAME uid=$(id -u)\"\n",
    );
    let long = support::script(shared.path(), "long.sh", "echo started; sleep 300\n");

    // Not lent: the slot is no place for jobs.
    let slot = node_view(&borrower, "lender-node0");
    assert_eq!(slot["state"], "unknown", "{slot}");
    assert!(
        slot["reason"]
            .as_str()
            .is_some_and(|r| r.contains("guest slot for node node0 of cluster lender")),
        "{slot}"
    );
    let out = borrower.submit_as(NOBODY, &["-N", "2", where_.to_str().unwrap()]);
    assert!(!out.status.success());
    let err = support::text(&out.stderr);
    assert!(
        err.contains("--borrow"),
        "the refusal names --borrow: {err}"
    );
    let borrowed = borrower
        .submit_cmd_as(NOBODY, &["-N", "2", "--borrow", where_.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();

    // Lent: the borrowed job runs on both nodes, the lent one's task as the lender's account.
    let out = lender.storm(&["lend", "node0", "--to", "borrower", "--for", "10"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    assert!(support::text(&out.stdout).contains("lent 1 node(s) to borrower"));
    let lent = node_view(&lender, "node0");
    assert_eq!(lent["state"], "lent", "{lent}");
    let out = borrowed.wait_with_output().unwrap();
    let stdout = support::text(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        support::text(&out.stderr)
    );
    assert!(
        stdout.contains(&format!("lender-node0 uid={daemon_uid}")),
        "the lent node ran its task as the lender's account: {stdout}"
    );
    assert!(
        stdout.contains(&format!("node0 uid={NOBODY}")),
        "the home node ran its task as its owner: {stdout}"
    );
    let slot = node_view(&borrower, "lender-node0");
    assert!(
        slot["reason"]
            .as_str()
            .is_some_and(|r| r.contains("borrowed from cluster lender")),
        "{slot}"
    );

    // The lender's own job waits while the node is lent.
    let mut own = lender
        .submit_cmd_as(NOBODY, &[where_.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut held = borrower
        .submit_cmd_as(NOBODY, &["-N", "2", "--borrow", long.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_until(Duration::from_secs(20), "the held job runs", || {
        let n = node_view(&borrower, "lender-node0");
        (n["state"] != "allocated").then(|| n.to_string())
    });
    std::thread::sleep(Duration::from_millis(500));
    assert!(
        own.try_wait().unwrap().is_none(),
        "the lender started its own job on a lent node"
    );

    // Both MMs restart, one after the other: the lease and the borrowed job go on.
    lender.cluster.as_mut().unwrap().kill_mm().unwrap();
    lender.cluster.as_mut().unwrap().restart_mm().unwrap();
    wait_state(
        &lender,
        "node0",
        &["lent"],
        "the lender's new MM keeps the node lent",
    );
    borrower.cluster.as_mut().unwrap().kill_mm().unwrap();
    borrower.cluster.as_mut().unwrap().restart_mm().unwrap();
    wait_state(
        &borrower,
        "lender-node0",
        &["allocated"],
        "the borrower's new MM finds its job on the slot",
    );
    assert!(
        held.try_wait().unwrap().is_none(),
        "the borrowed job runs on through both restarts"
    );
    assert!(
        own.try_wait().unwrap().is_none(),
        "the lender's new MM started its own job on a lent node"
    );

    // Reclaimed: the borrowed job ends with the lost node named; the lender's job runs.
    let out = lender.storm(&["reclaim", "node0"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    // No peer agent runs here: the borrower cannot be told, and the node comes home at once.
    assert!(
        support::text(&out.stdout).contains("1 lent node(s) home now"),
        "{}",
        support::text(&out.stdout)
    );
    let out = output_within(held, Duration::from_secs(60))
        .expect("the borrowed job ends once its node is reclaimed");
    assert!(!out.status.success(), "a job that lost a node failed");
    let err = support::text(&out.stderr);
    assert!(
        err.contains("lender-node0")
            && err.contains("borrowed from cluster lender, went silent without notice"),
        "the lost node is named, whose it is, and that nobody said why: {err}"
    );
    let left = live_processes(daemon_uid, &["long.sh"]);
    assert!(left.is_empty(), "the guest's task died with it: {left:?}");
    let out = output_within(own, Duration::from_secs(30))
        .expect("the lender's own job ran once the node came home");
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    assert!(support::text(&out.stdout).contains(&format!("node0 uid={NOBODY}")));
    wait_state(
        &borrower,
        "lender-node0",
        &["down", "unresponsive"],
        "the slot goes down",
    );

    // A short lease ends by itself: the slot goes down and the node is the lender's again.
    let out = lender.storm(&["lend", "node0", "--to", "borrower", "--for", "0:03"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_state(&borrower, "lender-node0", &["idle"], "the slot comes up");
    wait_state(
        &borrower,
        "lender-node0",
        &["down", "unresponsive"],
        "the lease ends",
    );
    wait_state(&lender, "node0", &["idle"], "the node is home");
    let out = lender.submit_as(NOBODY, &[where_.to_str().unwrap()]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));

    // The lent node dies (its NM and its guest, killed outright) under a `--requeue` job:
    // the job is queued again at the borrower; when the node's NM is back, the lender's MM
    // tells it again to run its guest, the slot comes back and the job runs again there.
    let out = lender.storm(&["lend", "node0", "--to", "borrower", "--for", "10"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_state(
        &borrower,
        "lender-node0",
        &["idle"],
        "the slot comes up again",
    );
    let job = run_twice(&borrower, shared.path(), "first-run");
    let guests = lent_guests(&our_guests);
    assert_eq!(guests.len(), 1, "one lent guest NM runs: {guests:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(guests[0] as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    lender.cluster.as_mut().unwrap().kill_nm(0).unwrap();
    wait_state(
        &borrower,
        "lender-node0",
        &["down", "unresponsive"],
        "the dead node's slot goes down",
    );
    lender.cluster.as_mut().unwrap().restart_nm(0).unwrap();
    let out = support::ended_within(job, Duration::from_secs(60)).unwrap_or_else(|e| {
        panic!(
            "the requeued job ends: {e}\n{}",
            daemon_logs(&[&lender, &borrower])
        )
    });
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stderr.contains("requeued: node 1 (lender-node0)"),
        "{stderr}"
    );
    assert!(
        stdout.contains("second run on lender-node0"),
        "the rerun had the node back: {stdout}"
    );
    wait_state(
        &lender,
        "node0",
        &["lent"],
        "the node is still lent, its lease running",
    );

    // The lent node's NM alone is killed outright: its guest is left running. The NM that
    // starts next stops that orphan (it cannot follow it), and runs a guest of its own for
    // the lease; the `--requeue` job on the slot runs again.
    wait_state(
        &borrower,
        "lender-node0",
        &["idle"],
        "the slot is free again",
    );
    let job = run_twice(&borrower, shared.path(), "orphan-run");
    let orphan = lent_guests(&our_guests);
    assert_eq!(orphan.len(), 1, "{orphan:?}");
    lender.cluster.as_mut().unwrap().kill_nm(0).unwrap();
    assert_eq!(
        lent_guests(&our_guests),
        orphan,
        "the guest outlives its NM"
    );
    lender.cluster.as_mut().unwrap().restart_nm(0).unwrap();
    let out = support::ended_within(job, Duration::from_secs(60)).unwrap_or_else(|e| {
        panic!(
            "the job on the orphan's slot ends once the new NM stops the orphan: {e}\n{}",
            daemon_logs(&[&lender, &borrower])
        )
    });
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    assert!(
        stdout.contains("second run on lender-node0"),
        "the new NM's guest ran it again: {stdout}"
    );
    let now = lent_guests(&our_guests);
    assert!(
        now.len() == 1 && now != orphan,
        "one guest, the new NM's: {now:?} (the orphan was {orphan:?})"
    );

    // The guest freezes (SIGSTOP) under a borrowed job, and the lender's operator reclaims
    // the node at once: the guest does not stop within its 3 s and is killed outright. The
    // task itself dies with its launcher (its parent-death signal), but what it started in
    // a session of its own (`setsid`) does not: left in the borrower's group on the node, it
    // is killed by the home NM. (Before, it ran on beside the lender's jobs until another
    // guest for that slot started.)
    wait_state(
        &borrower,
        "lender-node0",
        &["idle"],
        "the slot is free again",
    );
    let frozen = support::script(
        shared.path(),
        "frozen.sh",
        "setsid sleep 301 < /dev/null > /dev/null 2>&1 &\nexec sleep 302\n",
    );
    let held = borrower
        .submit_cmd_as(NOBODY, &["-N", "2", "--borrow", frozen.to_str().unwrap()])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_until(
        Duration::from_secs(30),
        "the task on the lent node runs",
        || {
            live_processes(daemon_uid, &["sleep", "301"])
                .is_empty()
                .then(|| "no task of the guest's yet".to_string())
        },
    );
    let guests = lent_guests(&our_guests);
    assert_eq!(guests.len(), 1, "{guests:?}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(guests[0] as i32),
        nix::sys::signal::Signal::SIGSTOP,
    )
    .unwrap();
    let out = lender.storm(&["reclaim", "--now", "node0"]);
    assert!(
        out.status.success() && support::text(&out.stdout).contains("1 lent node(s) home now"),
        "{}{}",
        support::text(&out.stdout),
        support::text(&out.stderr)
    );
    support::wait_until(
        Duration::from_secs(30),
        "the frozen guest and its task are gone",
        || {
            // The node home, a warm guest starts for its next lend: the frozen one must go.
            let (frozen, tasks) = (
                live_processes(0, &["--guest-of", &our_guests]).contains(&guests[0]),
                live_processes(daemon_uid, &["sleep", "301"]),
            );
            (frozen || !tasks.is_empty()).then(|| {
                format!(
                    "the frozen guest {} there: {frozen}, its tasks {tasks:?}",
                    guests[0]
                )
            })
        },
    );
    let out = output_within(held, Duration::from_secs(60))
        .expect("the borrowed job ends once its slot went silent");
    assert!(!out.status.success(), "{}", support::text(&out.stdout));
    let out = lender.submit_as(NOBODY, &[where_.to_str().unwrap()]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
}

/// The scheduling policy of process `pid` (`/proc/PID/stat`, field 41: 0 normal, 1 FIFO).
fn sched_policy(pid: u32) -> u64 {
    sched_policy_if_alive(pid).unwrap_or_else(|| panic!("process {pid} is gone"))
}

/// The lent guest NMs of the borrower whose cluster file is `file` (their command lines
/// name it): a lent guest runs under the borrower's real-time policy, a warm guest waiting
/// for the next lend under the normal one. (The borrowers of these tests set
/// `daemon_rt_priority`, which is kept on any host, see [`RT_SET`].)
fn lent_guests(file: &str) -> Vec<u32> {
    live_processes(0, &["--guest-of", file])
        .into_iter()
        .filter(|&p| sched_policy_if_alive(p).is_some_and(|policy| policy != 0))
        .collect()
}

/// A borrower's scheduler section that keeps its daemons real-time on any host (a priority
/// other than the default is kept where NMs outnumber cores): [`lent_guests`] tells a lent
/// guest from a waiting one by it.
fn rt_set() -> storm_cluster::config::SchedulerSection {
    storm_cluster::config::SchedulerSection {
        daemon_rt_priority: RT_SET,
        ..Default::default()
    }
}
const RT_SET: u8 = storm_cluster::config::DEFAULT_DAEMON_RT_PRIORITY + 1;

/// `pid`'s scheduling policy, if it still runs.
fn sched_policy_if_alive(pid: u32) -> Option<u64> {
    // After the command's name, in parentheses: fields 3 on.
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 2..];
    rest.split_whitespace().nth(41 - 3)?.parse().ok()
}

/// The processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(child) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        let rest = &stat[stat.rfind(')').unwrap() + 2..];
        if rest.split_whitespace().nth(1) == Some(&pid.to_string()) {
            found.push(child);
        }
    }
    found
}

/// A lent node's guest NM is started ahead of the lend (`[federation] warm_guests`, on for
/// this lender): the node, at home, keeps one set up for its peer, at normal priority, joined to
/// nothing. A lend hands the lease to it, and it joins the borrower's fabric. While the node is
/// lent, a second one waits for the next lend, outside the slot's groups: a job on the lent
/// node lives on while that one is replaced, and a lend right after the return takes it, its
/// jobs in the slot's groups. One that cannot take the lease (the peer's file changed since
/// it read it) is replaced by a fresh guest; it goes with its node's NM; and one that could
/// not start (the peer's file was not there) starts once it can.
#[test]
fn a_node_at_home_keeps_a_warm_guest_that_joins_nothing_until_it_is_lent() {
    if !support::root_or_say("warm guests") {
        return;
    }
    let keys = tempfile::tempdir().unwrap();
    let pair = keys.path().join("pair.key");
    storm_cluster::key::generate(&pair).unwrap();
    let (borrower_port, lender_port) = (free_port(), free_port());
    let borrower = TestCluster::with(LocalOptions {
        cpus: Some(support::TEST_CPUS),
        name: Some("wg-borrow".into()),
        federation: federation(borrower_port),
        peers: vec![PeerEntry {
            borrow: true,
            mm_public_key_file: Some(pair.with_file_name("lender-mm.pub")),
            ..peer("wg-lend", lender_port, &pair)
        }],
        guests: vec![GuestOf {
            cluster: "wg-lend".into(),
            node: "node0".into(),
        }],
        scheduler: rt_set(),
        ..LocalOptions::new(1)
    });
    let borrower_file: PathBuf = support::guest_file_of(&borrower);
    let mut lender = TestCluster::with(LocalOptions {
        cpus: Some(support::TEST_CPUS),
        name: Some("wg-lend".into()),
        federation: FederationSection {
            warm_guests: true,
            ..federation(lender_port)
        },
        peers: vec![PeerEntry {
            lend: true,
            flock_user: Some("daemon".into()),
            guest_file: Some(borrower_file.clone()),
            mm_public_key_file: None,
            ..peer("wg-borrow", borrower_port, &pair)
        }],
        ..LocalOptions::new(1)
    });
    support::install_lender_key(&lender, &pair.with_file_name("lender-mm.pub"));
    // This test's guests name its lender's file.
    let ours = lender
        .root
        .join("cluster.toml")
        .to_str()
        .unwrap()
        .to_string();
    let shared = support::shared_tempdir();
    // Where each task ran, and in which of storm's groups; it sleeps first if asked.
    let where_ = support::script(
        shared.path(),
        "where.sh",
        "sleep \"${1:-0}\"\n\
         echo \"$STORM_NODENAME $(grep -o '/storm/[^ ]*' /proc/self/cgroup | head -n 1)\"\n",
    );
    let where_ = where_.to_str().unwrap();
    let guests = || live_processes(0, &["--guest-of", &ours]);
    let lent_guests = || lent_guests(&ours);
    let waiting_guest = |what: &str, not: &[u32]| -> u32 {
        let mut found = Vec::new();
        support::wait_until(Duration::from_secs(30), what, || {
            found = live_processes(0, &["--warm", &ours])
                .into_iter()
                .filter(|p| !not.contains(p) && sched_policy_if_alive(*p) == Some(0))
                .collect();
            (found.len() != 1).then(|| format!("waiting guests: {found:?}"))
        });
        found[0]
    };
    let one_warm = |what: &str| -> u32 {
        let mut found = Vec::new();
        support::wait_until(Duration::from_secs(30), what, || {
            found = live_processes(0, &["--warm", &ours]);
            (found.len() != 1).then(|| format!("warm guests: {found:?}"))
        });
        found[0]
    };
    // A borrowed job's output: it ran on both nodes, and on the lent one in the slot's
    // groups (where the borrower's own node runs its tasks in groups: cgroups work here).
    let ran_in_groups = |what: &str, out: std::process::Output| {
        let stdout = support::text(&out.stdout);
        assert!(
            out.status.success(),
            "{what}: {stdout}{}",
            support::text(&out.stderr)
        );
        assert_eq!(nodes_of(&stdout), ["node0", "wg-lend-node0"], "{what}");
        let group_of = |node: &str| {
            stdout
                .lines()
                .find_map(|l| l.strip_prefix(node)?.strip_prefix(' '))
                .unwrap_or("")
                .to_string()
        };
        if !group_of("node0").starts_with("/storm/wg-borrow/node0/job-") {
            eprintln!(
                "NOT CHECKED ({what}): the lent node's group; the borrower's own node ran its \
                 task outside storm's groups ({:?}): no cgroups here",
                group_of("node0")
            );
            return;
        }
        assert!(
            group_of("wg-lend-node0").starts_with("/storm/wg-borrow/wg-lend-node0/job-"),
            "{what}: the task on the lent node is not in the slot's group: {stdout}"
        );
    };
    let borrowed_on = |what: &str| {
        let out = support::output_within(
            borrower.submit_cmd_as(NOBODY, &["-N", "2", "--borrow", where_]),
            Duration::from_secs(60),
        )
        .unwrap_or_else(|| panic!("{what}: the borrowed job did not end within 60 s"));
        ran_in_groups(what, out);
    };

    // At home: one warm guest, at normal priority, and the borrower has heard from nobody.
    let warm = one_warm("the node keeps a warm guest");
    assert_eq!(
        sched_policy(warm),
        0,
        "a waiting guest takes no real-time priority"
    );
    std::thread::sleep(Duration::from_secs(1));
    let slot = node_view(&borrower, "wg-lend-node0");
    assert_eq!(
        slot["state"], "unknown",
        "the warm guest joined nothing: {slot}"
    );

    // Lent: that guest takes the lease, as the borrower's own NMs run, and the job runs there.
    let out = lender.storm(&["lend", "node0", "--to", "wg-borrow", "--for", "60"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_state(&borrower, "wg-lend-node0", &["idle"], "the slot comes up");
    assert_eq!(lent_guests(), [warm], "the warm guest took the lease");
    let own_nm = borrower.daemon_pid("storm-nm node0");
    assert_eq!(
        sched_policy(warm),
        sched_policy(own_nm),
        "a lent guest runs under the policy of the borrower's own NMs"
    );
    borrowed_on("on the warm guest");

    // Lent, the node keeps a second guest waiting for the next lend. It joined nothing (the
    // borrower's slot is the lent guest's) and stays out of the slot's groups, which the lent
    // guest owns: a job on the lent node lives on while the waiting guest is replaced (killed
    // here; the NM starts another at its next look, within seconds), where a guest that made
    // the groups as it started would have killed the job's task.
    let second = waiting_guest("a second guest waits while the node is lent", &[warm]);
    let mut job = borrower
        .submit_cmd_as(NOBODY, &["-N", "2", "--borrow", where_, "10"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    wait_state(
        &borrower,
        "wg-lend-node0",
        &["allocated"],
        "the borrowed job runs on the lent node",
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(second as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let third = waiting_guest("the waiting guest is replaced", &[warm, second]);
    assert!(
        job.try_wait().unwrap().is_none(),
        "the job ended before the waiting guest was replaced: lengthen its sleep"
    );
    support::wait_until(Duration::from_secs(60), "the borrowed job ends", || {
        job.try_wait()
            .unwrap()
            .is_none()
            .then(|| "it runs".to_string())
    });
    ran_in_groups(
        "a job on the lent node while its waiting guest was replaced",
        job.wait_with_output().unwrap(),
    );
    assert_eq!(lent_guests(), [warm], "the lent guest ran on");

    // Home again: the lent guest goes, and a lend right after the return takes the guest
    // that waited during the lease; its jobs run in the slot's groups.
    let out = lender.storm(&["reclaim", "--now", "node0"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_state(&lender, "node0", &["idle"], "the node is home");
    let out = lender.storm(&["lend", "node0", "--to", "wg-borrow", "--for", "60"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_state(&borrower, "wg-lend-node0", &["idle"], "the slot comes up");
    assert_eq!(
        lent_guests(),
        [third],
        "the lend right after the return took the guest waiting since the lease"
    );
    borrowed_on("on the guest that waited during the lease");
    let out = lender.storm(&["reclaim", "--now", "node0"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_state(&lender, "node0", &["idle"], "the node is home");
    let next = one_warm("a warm guest once the node is home");
    assert!(![warm, second, third].contains(&next), "{next}");
    assert_eq!(guests(), [next], "the lent guest is gone");

    // The borrower's file changes (its operator edited it): the waiting guest read the old
    // one, so the lend starts a guest that reads it again.
    let mut text = std::fs::read_to_string(&borrower_file).unwrap();
    text.push_str("\n# edited by the borrower's operator\n");
    std::fs::write(&borrower_file, text).unwrap();
    let out = lender.storm(&["lend", "node0", "--to", "wg-borrow", "--for", "60"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_state(&borrower, "wg-lend-node0", &["idle"], "the slot comes up");
    let lent = lent_guests();
    assert!(
        lent.len() == 1 && lent[0] != next,
        "a fresh guest took the lease, not the one that read the old file ({next}): {lent:?}"
    );
    borrowed_on("on a guest started at the lend");
    let out = lender.storm(&["reclaim", "--now", "node0"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_state(&lender, "node0", &["idle"], "the node is home");

    // Its node's NM killed outright, the waiting guest goes too, with its launcher.
    let warm = one_warm("a warm guest again");
    let launchers = children_of(warm);
    assert!(!launchers.is_empty(), "the warm guest started its launcher");
    lender.cluster.as_mut().unwrap().kill_nm(0).unwrap();
    support::wait_until(
        Duration::from_secs(20),
        "the warm guest goes with its NM",
        || {
            let left: Vec<u32> = guests()
                .into_iter()
                .chain(launchers.iter().copied())
                // Gone, or a zombie (its command line is empty then).
                .filter(|p| {
                    !std::fs::read(format!("/proc/{p}/cmdline"))
                        .unwrap_or_default()
                        .is_empty()
                })
                .collect();
            (!left.is_empty()).then(|| format!("left: {left:?}"))
        },
    );
    // The NM back while the peer's file is away (say, being installed): no warm guest can
    // start. Once the file is there, one starts at the NM's next look, and takes the lease.
    let away = borrower_file.with_extension("away");
    std::fs::rename(&borrower_file, &away).unwrap();
    lender.cluster.as_mut().unwrap().restart_nm(0).unwrap();
    std::thread::sleep(Duration::from_secs(2));
    let none = live_processes(0, &["--warm", &ours]);
    std::fs::rename(&away, &borrower_file).unwrap();
    assert!(none.is_empty(), "a warm guest without its file: {none:?}");
    let warm = one_warm("the restarted NM keeps a warm guest once the peer's file is there");
    let out = lender.storm(&["lend", "node0", "--to", "wg-borrow", "--for", "60"]);
    assert!(out.status.success(), "{}", support::text(&out.stderr));
    wait_state(&borrower, "wg-lend-node0", &["idle"], "the slot comes up");
    assert_eq!(lent_guests(), [warm]);
    borrowed_on("after the NM's restart");
}

/// What the lines of a job's output say of where its tasks ran: each task of `where.sh`
/// prints `NODE uid=UID`.
fn nodes_of(stdout: &str) -> Vec<String> {
    let mut nodes: Vec<String> = stdout
        .lines()
        .filter_map(|l| l.split_whitespace().next())
        .map(String::from)
        .collect();
    nodes.sort();
    nodes
}

/// Two clusters on loopback that borrow by asking, both peer agents running (each agent is
/// killed when dropped: bind every field by name, since `..` drops the rest at once).
struct AskingPair {
    _agents: (support::Agent, support::Agent),
    /// One node of its own, and guest slots for the giver's two (`<giver>-node0`, `-node1`).
    asker: TestCluster,
    /// Two nodes, lent to the asker on its asking, its jobs run as `daemon`.
    giver: TestCluster,
    _keys: tempfile::TempDir,
}

/// An [`AskingPair`] named `asker` and `giver` (advertising every 200 ms, a 3 s peer
/// timeout), once the asker sees the giver offer its two idle nodes. `warm`: the giver's
/// nodes keep warm guests (`[federation] warm_guests`).
fn asking_pair(asker: &str, giver: &str, warm: bool) -> AskingPair {
    let keys = tempfile::tempdir().unwrap();
    let pair = keys.path().join("pair.key");
    storm_cluster::key::generate(&pair).unwrap();
    let (asker_port, giver_port) = (free_port(), free_port());
    let fast = |port| FederationSection {
        advertise_ms: 200,
        peer_timeout_ms: 3000,
        warm_guests: warm,
        ..federation(port)
    };
    let asker_cluster = TestCluster::with(LocalOptions {
        cpus: Some(support::TEST_CPUS),
        name: Some(asker.into()),
        federation: fast(asker_port),
        peers: vec![PeerEntry {
            borrow: true,
            mm_public_key_file: Some(pair.with_file_name("lender-mm.pub")),
            ..peer(giver, giver_port, &pair)
        }],
        guests: ["node0", "node1"]
            .iter()
            .map(|n| GuestOf {
                cluster: giver.into(),
                node: n.to_string(),
            })
            .collect(),
        ..LocalOptions::new(1)
    });
    let asker_file: PathBuf = asker_cluster.root.join("cluster.toml");
    let asker_guest_file = support::guest_file_of(&asker_cluster);
    let giver_cluster = TestCluster::with(LocalOptions {
        cpus: Some(support::TEST_CPUS),
        name: Some(giver.into()),
        federation: fast(giver_port),
        peers: vec![PeerEntry {
            lend: true,
            flock_user: Some("daemon".into()),
            guest_file: Some(asker_guest_file),
            mm_public_key_file: None,
            ..peer(asker, asker_port, &pair)
        }],
        ..LocalOptions::new(2)
    });
    support::install_lender_key(&giver_cluster, &pair.with_file_name("lender-mm.pub"));
    let agents = (
        support::start_agent(&asker_file),
        support::start_agent(&giver_cluster.root.join("cluster.toml")),
    );
    wait_offer(&asker_cluster, 2, "the asker sees the giver's offer");
    AskingPair {
        _agents: agents,
        asker: asker_cluster,
        giver: giver_cluster,
        _keys: keys,
    }
}

/// Waits until `c`'s first peer offers `idle` idle nodes.
fn wait_offer(c: &TestCluster, idle: u64, what: &str) {
    support::wait_until(Duration::from_secs(30), what, || {
        let out = c.storm(&["peers", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let offered = v["peers"][0]["offer"]["idle_nodes"].as_u64();
        (offered != Some(idle)).then(|| v.to_string())
    });
}

/// Borrowing by itself, through both clusters' peer agents: `asker` has one node of its own
/// and guest slots for `giver`'s two nodes; `giver` lends to it on its asking, as its account
/// `daemon`. Nobody runs `storm lend`.
///
/// * A `--borrow` job of three nodes waits; `asker`'s MM asks `giver` for two, `giver` lends
///   them, and the job runs on all three. Once it ends, `asker` gives them back and `giver`
///   shows them idle.
/// * `--one-cluster`: a two-node job runs wholly on `giver`'s two nodes (its own cluster has
///   one), a one-node job at home; without `--borrow` the two-node job is refused.
/// * `--less`: `giver` runs a job of its own on one node; a `--borrow --less` job of three
///   nodes gets the other, and starts on two (its output says which). Without `--borrow`, a
///   job of five nodes asked for with `--less` runs on the one own node.
/// * The owner's queue takes its nodes back: under a `--requeue` borrowed job on all three
///   nodes, `giver` queues a job of its own on both its nodes; `giver` calls them home, its
///   job runs, and the borrowed job is queued again at `asker`, told that its owner took
///   them back for a job waiting there; it borrows them again once `giver`'s job ended, and
///   runs to its end.
/// * `storm reclaim node0` at `giver` under a borrowed job without `--requeue`: the job
///   ends, told that `giver`'s operator reclaimed the node, and both nodes come home.
/// * The borrower's MM dies under a borrowed job: `giver` sees `asker` away, and after the
///   peer timeout its nodes come home and take its own jobs; `asker`'s MM, back, ends the
///   job that lost them.
#[test]
fn a_waiting_job_borrows_by_itself_and_its_nodes_go_home_when_it_ends() {
    if !support::root_or_say("borrowing") {
        return;
    }
    // Every field bound by name: `..` would drop the agents at once.
    let AskingPair {
        _agents,
        mut asker,
        giver,
        _keys,
    } = asking_pair("asker", "giver", true);
    let shared = support::shared_tempdir();
    let where_ = support::script(
        shared.path(),
        "where.sh",
        "echo \"$STORM_NODENAME uid=$(id -u)\"\nsleep 1\n",
    );
    let where_ = where_.to_str().unwrap();
    // A job's output, once it ended well (within a minute).
    let ok = |c: &TestCluster, args: &[&str]| {
        let out = support::output_within(c.submit_cmd_as(NOBODY, args), Duration::from_secs(60))
            .unwrap_or_else(|| panic!("{args:?} did not end within 60 s"));
        let stdout = support::text(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            support::text(&out.stderr)
        );
        stdout
    };

    // A job of three nodes borrows two, and gives them back when it ends.
    let stdout = ok(&asker, &["-N", "3", "--borrow", where_]);
    assert_eq!(
        nodes_of(&stdout),
        ["giver-node0", "giver-node1", "node0"],
        "{stdout}"
    );
    for n in ["node0", "node1"] {
        wait_state(&giver, n, &["idle"], "the borrowed node comes home");
    }

    // --one-cluster: wholly on the lender's nodes, or wholly at home.
    let stdout = ok(&asker, &["-N", "2", "--borrow", "--one-cluster", where_]);
    assert_eq!(
        nodes_of(&stdout),
        ["giver-node0", "giver-node1"],
        "{stdout}"
    );
    let stdout = ok(&asker, &["-N", "1", "--borrow", "--one-cluster", where_]);
    assert_eq!(nodes_of(&stdout), ["node0"], "{stdout}");
    let out = asker.submit_as(NOBODY, &["-N", "2", "--one-cluster", where_]);
    assert!(!out.status.success(), "{}", support::text(&out.stdout));
    assert!(
        support::text(&out.stderr).contains("--borrow"),
        "{}",
        support::text(&out.stderr)
    );
    for n in ["node0", "node1"] {
        wait_state(&giver, n, &["idle"], "the borrowed nodes come home");
    }

    // --less: the lender keeps one node for its own job; the job starts on two nodes.
    let busy = support::script(shared.path(), "busy.sh", "sleep 15\n");
    let mut own = giver
        .submit_cmd_as(NOBODY, &[busy.to_str().unwrap()])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    support::wait_until(Duration::from_secs(20), "giver's own job runs", || {
        let states: Vec<serde_json::Value> = ["node0", "node1"]
            .iter()
            .map(|n| node_view(&giver, n)["state"].clone())
            .collect();
        (!states.iter().any(|s| s == "allocated")).then(|| format!("{states:?}"))
    });
    let stdout = ok(&asker, &["-N", "3", "--borrow", "--less", where_]);
    let ran = nodes_of(&stdout);
    assert!(
        ran.len() == 2 && ran[1] == "node0" && ran[0].starts_with("giver-node"),
        "on its own node and the one giver could lend: {stdout}"
    );
    let stdout = ok(&asker, &["-N", "5", "--less", where_]);
    assert_eq!(nodes_of(&stdout), ["node0"], "{stdout}");
    assert!(own.wait().unwrap().success());
    for n in ["node0", "node1"] {
        wait_state(&giver, n, &["idle"], "giver's nodes are idle again");
    }

    // The owner's queue takes its nodes back; the borrowed job runs again after.
    let (script, marker) = support::rerun_script(shared.path(), "taken-back");
    let borrowed = asker
        .submit_cmd_as(
            NOBODY,
            &["-N", "3", "--borrow", "--requeue", script.to_str().unwrap()],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    support::wait_until(Duration::from_secs(30), "the three ranks run", || {
        let missing: Vec<u32> = (0..3)
            .filter(|r| !marker.with_extension(r.to_string()).exists())
            .collect();
        (!missing.is_empty()).then(|| format!("ranks {missing:?} have not started"))
    });
    let stdout = ok(&giver, &["-N", "2", where_]);
    assert_eq!(nodes_of(&stdout), ["node0", "node1"], "{stdout}");
    let out = output_within(borrowed, Duration::from_secs(60))
        .expect("the borrowed job runs again once the lender's job ended");
    let (stdout, stderr) = (support::text(&out.stdout), support::text(&out.stderr));
    assert!(out.status.success(), "{stdout}{stderr}");
    // The giver told the asker why (before, the reason named three causes, the asker seeing
    // only its guests go silent).
    assert!(
        stderr.contains("requeued")
            && stderr.contains("its owner took it back (reclaimed for its job")
            && !stderr.contains("without notice"),
        "{stderr}"
    );
    for n in ["giver-node0", "giver-node1", "node0"] {
        assert!(
            stdout.contains(&format!("second run on {n}")),
            "{stdout}{stderr}"
        );
    }
    for n in ["node0", "node1"] {
        wait_state(&giver, n, &["idle"], "giver's nodes are idle again");
    }

    // The giver's operator reclaims a node under a borrowed job that did not ask to be
    // requeued: it ends, told why, and the node comes home once the asker gives it back.
    // A borrowed job on all three nodes that sleeps, once it runs on both of giver's.
    let long = support::script(shared.path(), "long.sh", "sleep 300\n");
    let borrowed_long = || {
        let held = asker
            .submit_cmd_as(NOBODY, &["-N", "3", "--borrow", long.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        for n in ["giver-node0", "giver-node1"] {
            wait_state(&asker, n, &["allocated"], "the borrowed job runs");
        }
        held
    };
    let held = borrowed_long();
    let out = giver.storm(&["reclaim", "node0"]);
    let said = support::text(&out.stdout);
    assert!(
        out.status.success() && said.contains("called home: 0 home now"),
        "{said}{}",
        support::text(&out.stderr)
    );
    let out = output_within(held, Duration::from_secs(60))
        .expect("the borrowed job ends once its node is called home");
    let stderr = support::text(&out.stderr);
    assert!(!out.status.success(), "a job that lost a node failed");
    assert!(
        stderr.contains("(giver-node0), borrowed from cluster giver: its owner took it back (its owner's operator reclaimed it)"),
        "{stderr}"
    );
    for n in ["node0", "node1"] {
        wait_state(
            &giver,
            n,
            &["idle"],
            "the node called home, and the one given back",
        );
    }
    let listed = support::text(&asker.storm(&["history", "--state", "preempted"]).stdout);
    assert_eq!(
        listed.matches("long.sh").count(),
        1,
        "storm history shows the job preempted: {listed}"
    );

    // The borrower's MM dies under a borrowed job: the lender takes its nodes home.
    let held = borrowed_long();
    asker.cluster.as_mut().unwrap().kill_mm().unwrap();
    for n in ["node0", "node1"] {
        wait_state(
            &giver,
            n,
            &["idle"],
            "the lender takes its node home from a borrower gone for the peer timeout",
        );
    }
    let stdout = ok(&giver, &["-N", "2", where_]);
    assert_eq!(nodes_of(&stdout), ["node0", "node1"], "{stdout}");
    asker.cluster.as_mut().unwrap().restart_mm().unwrap();
    let out = output_within(held, Duration::from_secs(60))
        .expect("the borrower's MM, back, ends the job that lost its borrowed nodes");
    assert!(!out.status.success(), "{}", support::text(&out.stdout));
}

/// The lender's MM freezes (SIGSTOP, as a host swapping or a hung process would) while the
/// borrower needs nodes, then thaws. The borrower schedules on as if it had no peer: jobs of
/// one node run at home, and a `--borrow --less` job of three starts on the one node of its
/// own once its patience with the lender ran out. The borrower's `storm peers` shows the
/// lender not up, its MM not answering; a `--less` job then asks nobody. Thawed, the
/// lender offers its nodes again, and a `--borrow` job of three runs on all three nodes, the
/// lender's two given back when it ends. (A failure of the sharing machinery never stops a
/// cluster from scheduling its own jobs.)
#[test]
fn a_frozen_lender_stalls_no_borrower_and_lends_again_once_thawed() {
    use nix::sys::signal::{Signal, kill};
    if !support::root_or_say("a frozen lender") {
        return;
    }
    let AskingPair {
        _agents,
        asker,
        giver,
        _keys,
    } = asking_pair("fz-ask", "fz-give", false);
    let shared = support::shared_tempdir();
    let where_ = support::script(shared.path(), "where.sh", "echo \"$STORM_NODENAME\"\n");
    let where_ = where_.to_str().unwrap();
    let ok = |args: &[&str]| {
        let out =
            support::output_within(asker.submit_cmd_as(NOBODY, args), Duration::from_secs(60))
                .unwrap_or_else(|| panic!("{args:?} did not end within 60 s"));
        let stdout = support::text(&out.stdout);
        assert!(
            out.status.success(),
            "{stdout}{}",
            support::text(&out.stderr)
        );
        stdout
    };
    let giver_mm = nix::unistd::Pid::from_raw(giver.daemon_pid("storm-mm") as i32);

    kill(giver_mm, Signal::SIGSTOP).unwrap();
    let frozen = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        assert_eq!(nodes_of(&ok(&["-N", "1", where_])), ["node0"]);
        // The --less job asks the frozen lender and waits out its patience: it starts on its
        // own node.
        assert_eq!(
            nodes_of(&ok(&["-N", "3", "--borrow", "--less", where_])),
            ["node0"],
            "the --less job starts on its own node"
        );
        // The lender's agent says its MM does not answer, and the borrower shows it so.
        support::wait_until(
            Duration::from_secs(30),
            "the borrower shows the lender's MM silent",
            || {
                let out = asker.storm(&["peers", "--json"]);
                let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
                let peer = &v["peers"][0];
                let silent = peer["state"] != "up"
                    && peer["reason"]
                        .as_str()
                        .is_some_and(|r| r.contains("machine manager does not answer"));
                (!silent).then(|| v.to_string())
            },
        );
        // Nobody to ask now: the next one starts at once on its own node.
        assert_eq!(
            nodes_of(&ok(&["-N", "3", "--borrow", "--less", where_])),
            ["node0"],
            "the --less job starts on its own node"
        );
        assert_eq!(nodes_of(&ok(&["-N", "1", where_])), ["node0"]);
    }));
    kill(giver_mm, Signal::SIGCONT).unwrap();
    if let Err(e) = frozen {
        std::panic::resume_unwind(e);
    }

    wait_offer(&asker, 2, "the thawed giver offers its nodes again");
    assert_eq!(
        nodes_of(&ok(&["-N", "3", "--borrow", where_])),
        ["fz-give-node0", "fz-give-node1", "node0"]
    );
    for n in ["node0", "node1"] {
        wait_state(&giver, n, &["idle"], "the giver's nodes come home");
    }
    // The giver keeps no warm guest (`warm_guests = false`): its nodes started their guests
    // as they were lent, and none waits now.
    let giver_file = giver.root.join("cluster.toml");
    let warm = live_processes(0, &["--warm", giver_file.to_str().unwrap()]);
    assert!(warm.is_empty(), "warm guests: {warm:?}");
}
