//! Namespace testbeds for integration tests, and what the tests ask of them.

use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use storm_cli::testbed::{Testbed, TestbedOptions, namespaces_available};
use storm_cluster::config::{FailureSection, SchedulerSection};
use storm_cluster::control::{Client, JobState, NodeInfo, NodeState, Reply, Request};
use storm_cluster::health::HealthSection;

use super::{bin_dir, ensure_daemons};

/// A short unique testbed name (namespace prefix): tests run in parallel, and in other
/// processes.
pub fn unique_name() -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "t{:05}{:02}",
        std::process::id() % 100_000,
        N.fetch_add(1, Ordering::Relaxed) % 100
    )
}

/// Whether the test can run here; panics (with the reason) if it cannot and skipping was not
/// asked for.
pub fn can_run(test: &str) -> bool {
    match namespaces_available() {
        Ok(()) => true,
        Err(why) if std::env::var_os("STORM_ALLOW_NO_NETNS").is_some() => {
            super::say_not_tested(test, &format!("network namespaces unavailable ({why})"));
            false
        }
        Err(why) => panic!(
            "{test} needs network namespaces, which cannot be made here ({why}); run as root, \
             or set STORM_ALLOW_NO_NETNS=1 to skip it visibly"
        ),
    }
}

/// A testbed of `nodes` nodes under `work`, 1 ms timeslice, FCFS.
pub fn up(nodes: u32, work: &Path) -> Testbed {
    up_with(
        nodes,
        work,
        SchedulerSection::default(),
        FailureSection::default(),
    )
}

/// A testbed of `nodes` nodes under `work`, 1 ms timeslice, with these scheduler and failure
/// settings.
pub fn up_with(
    nodes: u32,
    work: &Path,
    scheduler: SchedulerSection,
    failure: FailureSection,
) -> Testbed {
    testbed(nodes, work, scheduler, failure, 1)
}

/// A testbed of `nodes` nodes under `work` with `managers` MM replicas (1: a single MM).
fn testbed(
    nodes: u32,
    work: &Path,
    scheduler: SchedulerSection,
    failure: FailureSection,
    managers: u32,
) -> Testbed {
    up_options(TestbedOptions {
        scheduler,
        failure,
        managers,
        ..options(nodes, work)
    })
}

/// A testbed of `nodes` nodes under `work` (1 ms timeslice, FCFS, a single MM) whose nodes
/// are judged by `health`.
pub fn up_with_health(nodes: u32, work: &Path, health: HealthSection) -> Testbed {
    up_options(TestbedOptions {
        health,
        ..options(nodes, work)
    })
}

/// A testbed of `nodes` nodes under `work` whose NMs read fabric port counters under
/// `sysfs` (`[monitoring] sysfs`).
pub fn up_with_sysfs(nodes: u32, work: &Path, sysfs: &Path) -> Testbed {
    up_options(TestbedOptions {
        sysfs: Some(sysfs.to_path_buf()),
        ..options(nodes, work)
    })
}

/// A testbed of `nodes` nodes under `work` with these `[limits]`.
pub fn up_with_limits(
    nodes: u32,
    work: &Path,
    limits: storm_cluster::config::LimitsSection,
) -> Testbed {
    up_options(TestbedOptions {
        limits,
        ..options(nodes, work)
    })
}

/// What [`up`] builds, for a test to change before [`up_options`].
pub fn options(nodes: u32, work: &Path) -> TestbedOptions {
    TestbedOptions {
        name: unique_name(),
        nodes,
        cpus: storm_cli::local::host_cpus(),
        dir: work.join("testbed"),
        timeslice_ms: 1.0,
        scheduler: Default::default(),
        failure: Default::default(),
        managers: 1,
        replication: Default::default(),
        health: Default::default(),
        sysfs: None,
        cluster_name: None,
        federation: Default::default(),
        peers: Vec::new(),
        net: storm_cli::testbed::SINGLE_NET,
        guests: Vec::new(),
        limits: Default::default(),
    }
}

/// `clusters` clusters of `nodes` nodes each under `work` that share
/// (`storm-testbed up --clusters`), with this peer timeout (adverts five times as often).
pub fn up_clusters(
    clusters: u32,
    nodes: u32,
    work: &Path,
    peer_timeout_ms: u64,
) -> storm_cli::testbed::federation::Federation {
    // storm-peer too.
    super::ensure_all_binaries();
    static N: AtomicU32 = AtomicU32::new(0);
    let opts = TestbedOptions {
        // Seven characters: each cluster's testbed gets its number after it.
        name: format!(
            "f{:04}{:02}",
            std::process::id() % 10_000,
            N.fetch_add(1, Ordering::Relaxed) % 100
        ),
        federation: storm_cluster::federation::FederationSection {
            advertise_ms: peer_timeout_ms / 5,
            peer_timeout_ms,
            ..Default::default()
        },
        ..options(nodes, work)
    };
    storm_cli::testbed::federation::Federation::up(&opts, clusters)
        .unwrap_or_else(|e| panic!("{clusters} clusters up: {e:#}"))
}

/// The testbed `opts` describe, up.
fn up_options(opts: TestbedOptions) -> Testbed {
    ensure_daemons();
    let managers = opts.managers;
    Testbed::up(&opts).unwrap_or_else(|e| panic!("testbed with {managers} MM(s) up: {e:#}"))
}

/// A testbed of `nodes` nodes under `work` whose file also names a guest slot, `far-node0`
/// (node 0 of a cluster `far` that may lend it; nothing stands behind it here): its identity
/// key is made and enrolled as every node's is, as a borrower's operator does for a slot.
pub fn up_with_guest_slot(nodes: u32, work: &Path) -> Testbed {
    let opts = options(nodes, work);
    let guest = storm_cluster::config::NodeEntry {
        name: "far-node0".into(),
        address: std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
            storm_cli::testbed::node_addr_in(opts.net, nodes + 8),
            7002,
        )),
        spool: opts.dir.join("guest-far-node0"),
        cpus: 1,
        mem: None,
        features: vec!["guest".into()],
        guest_of: Some(storm_cluster::federation::GuestOf {
            cluster: "far".into(),
            node: "node0".into(),
        }),
    };
    std::fs::create_dir_all(work).unwrap();
    let pair = work.join("far.pair");
    storm_cluster::key::generate(&pair).unwrap();
    let agent = |net: u8| {
        std::net::SocketAddr::V4(std::net::SocketAddrV4::new(
            storm_cli::testbed::node_addr_in(net, nodes + 9),
            7100,
        ))
    };
    up_options(TestbedOptions {
        guests: vec![guest],
        federation: storm_cluster::federation::FederationSection {
            listen: Some(agent(opts.net)),
            ..Default::default()
        },
        peers: vec![storm_cluster::federation::PeerEntry {
            name: "far".into(),
            address: agent(opts.net),
            key_file: pair,
            lend: false,
            borrow: true,
            priority: 0,
            flock_user: None,
            same_users: false,
            guest_file: None,
            // Never read: the slot's node is lent by no one here.
            mm_public_key_file: Some(work.join("far-mm.pub")),
        }],
        ..opts
    })
}

/// A testbed of `nodes` nodes under `work` with a replicated MM of three replicas, each in a
/// namespace of its own with a manager-side relay beside it; 1 ms timeslice, FCFS.
pub fn up_group(nodes: u32, work: &Path) -> Testbed {
    testbed(nodes, work, Default::default(), Default::default(), 3)
}

/// The MM's view of the nodes.
pub fn nodes(socket: &Path) -> Vec<NodeInfo> {
    let client = Client::connect(socket).expect("connect to the MM");
    match client.call(&Request::Nodes).expect("nodes") {
        Reply::Nodes(n) => n,
        other => panic!("unexpected reply {other:?}"),
    }
}

/// Waits until node `node` is in `state`; returns how long it took, or panics with what the
/// MM reported last.
pub fn wait_node_state(socket: &Path, node: u32, state: NodeState, limit: Duration) -> Duration {
    let start = Instant::now();
    loop {
        let all = nodes(socket);
        let n = &all[node as usize];
        if n.state == state {
            return start.elapsed();
        }
        if start.elapsed() > limit {
            panic!("node {node} is not {state} after {limit:?}: {all:#?}");
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Waits until `storm queue` shows `job` in `state`.
pub fn wait_job_state(socket: &Path, job_name: &str, state: JobState, limit: Duration) {
    let start = Instant::now();
    loop {
        let client = Client::connect(socket).expect("connect to the MM");
        let jobs = match client.call(&Request::Queue).expect("queue") {
            Reply::Queue(j) => j,
            other => panic!("unexpected reply {other:?}"),
        };
        if jobs.iter().any(|j| j.name == job_name && j.state == state) {
            return;
        }
        if start.elapsed() > limit {
            panic!("job {job_name} is not {state} after {limit:?}: {jobs:#?}");
        }
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The id of the job named `job_name` in the MM's queue (panics if there is none).
pub fn job_id(socket: &Path, job_name: &str) -> u64 {
    let client = Client::connect(socket).expect("connect to the MM");
    let jobs = match client.call(&Request::Queue).expect("queue") {
        Reply::Queue(j) => j,
        other => panic!("unexpected reply {other:?}"),
    };
    jobs.iter()
        .find(|j| j.name == job_name)
        .unwrap_or_else(|| panic!("no job named {job_name}: {jobs:#?}"))
        .job
}

/// The last lines of every daemon log of a testbed, for assertion messages.
pub fn logs(tb: &storm_cli::testbed::Testbed) -> String {
    let mut out = String::new();
    let mut entries: Vec<_> = std::fs::read_dir(&tb.dir)
        .map(|d| d.filter_map(Result::ok).map(|e| e.path()).collect())
        .unwrap_or_default();
    entries.sort();
    for path in entries
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log"))
    {
        let text = std::fs::read_to_string(path).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        out.push_str(&format!("==> {} <==\n", path.display()));
        for l in &lines[lines.len().saturating_sub(25)..] {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// storm-submit against testbed `tb`, with `args`.
pub fn submit(tb: &Testbed, args: &[&str]) -> Command {
    let mut c = Command::new(bin_dir().join("storm-submit"));
    c.arg("--config").arg(&tb.config_path).args(args);
    c
}

/// storm-submit against testbed `tb`, started with its output piped (see [`finish`]).
pub fn spawn(tb: &Testbed, args: &[&str]) -> Child {
    submit(tb, args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// Waits for a storm-submit started by [`spawn`] and takes its output.
pub fn finish(child: Child) -> Output {
    child.wait_with_output().unwrap()
}

/// Waits up to `limit` for a task to write its pid into `path`, and returns the pid.
pub fn wait_pid(path: &Path, limit: Duration) -> u32 {
    let deadline = Instant::now() + limit;
    loop {
        if let Ok(t) = std::fs::read_to_string(path)
            && let Ok(pid) = t.trim().parse()
        {
            return pid;
        }
        assert!(
            Instant::now() < deadline,
            "{} never appeared",
            path.display()
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Whether process `pid` ends (exits, or is a zombie) within `limit`.
pub fn gone_within(pid: u32, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
            Err(_) => return true,
            Ok(stat)
                if stat
                    .rsplit(')')
                    .next()
                    .is_some_and(|s| s.trim_start().starts_with('Z')) =>
            {
                return true;
            }
            Ok(_) => {}
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    eprintln!(
        "process {pid}: {:?}",
        std::fs::read_to_string(format!("/proc/{pid}/status"))
    );
    false
}

/// Runs `f` on a thread inside node `node`'s network namespace of `tb` (root may enter it):
/// what a process on that node reaches, from that node's address.
pub fn in_node_ns<T: Send + 'static>(
    tb: &Testbed,
    node: u32,
    f: impl FnOnce() -> T + Send + 'static,
) -> T {
    let ns = std::fs::File::open(Path::new("/run/netns").join(tb.node_ns(node))).unwrap();
    std::thread::spawn(move || {
        nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNET)
            .expect("enter the node's namespace");
        f()
    })
    .join()
    .unwrap()
}
