//! Peer clusters, seen as their operators see them (`storm peers --json`): two embedded
//! clusters on loopback, each with its peer agent (`storm-peer`) and a pair key the two
//! share.
//!
//! * Both agents link up: c0 sees c1 `up`, with the idle nodes and CPUs c1 offers it (c1
//!   lends to c0) and the link's lag; c1 sees c0 `up` offering nothing (c0 does not lend).
//! * c1's agent is killed: c0 sees c1 `down` within the peer timeout, and c0 runs its own
//!   jobs as before (the agents are apart from the MMs).
//! * c1's agent comes back holding another key: c0 sees c1 `refused`, the reason naming the
//!   key; with the right key again, `up`.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use storm_cluster::ClusterConfig;
use storm_cluster::federation::{FederationSection, PeerEntry};
use support::TestCluster;

/// A free loopback port (bound, then released for the agent to take).
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Writes the agent's cluster file for `cluster` (named `name`): its own file, with
/// `[federation]` and one `[[peer]]`.
fn agent_config(cluster: &TestCluster, name: &str, listen: u16, peer: PeerEntry) -> PathBuf {
    let path = cluster.root.join("cluster.toml");
    let mut cfg = ClusterConfig::load(&path).expect("the embedded cluster's file");
    cfg.cluster.name = name.into();
    cfg.federation = FederationSection {
        listen: Some(format!("127.0.0.1:{listen}").parse().unwrap()),
        advertise_ms: 200,
        peer_timeout_ms: 1000,
        flock_after_ms: None,
    };
    // A file per key: the test starts one agent again with another key, then the first.
    let key = peer
        .key_file
        .file_stem()
        .unwrap()
        .to_string_lossy()
        .to_string();
    cfg.peers = vec![peer];
    let out = cluster.root.join(format!("peer-agent-{key}.toml"));
    std::fs::write(&out, cfg.to_toml()).unwrap();
    out
}

fn start_agent(config: &Path) -> Child {
    Command::new(support::bin_dir().join("storm-peer"))
        .arg("--config")
        .arg(config)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start storm-peer")
}

/// What `storm peers --json` says of peer `name` on `cluster`.
fn peer_view(cluster: &TestCluster, name: &str) -> serde_json::Value {
    let out = cluster.storm(&["peers", "--json"]);
    assert!(
        out.status.success(),
        "storm peers: {}",
        support::text(&out.stderr)
    );
    let v: serde_json::Value =
        serde_json::from_str(&support::text(&out.stdout)).expect("storm peers --json is JSON");
    v["peers"]
        .as_array()
        .and_then(|p| p.iter().find(|p| p["name"] == name).cloned())
        .unwrap_or(serde_json::Value::Null)
}

/// Waits up to `limit` for `check` to hold of what `cluster` says of peer `name`.
fn wait_peer(
    cluster: &TestCluster,
    name: &str,
    limit: Duration,
    what: &str,
    check: impl Fn(&serde_json::Value) -> bool,
) -> serde_json::Value {
    let deadline = Instant::now() + limit;
    loop {
        let v = peer_view(cluster, name);
        if check(&v) {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "{what}: not within {limit:?}; storm peers says {v}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

struct Agent(Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn peers_link_up_offer_what_they_lend_and_a_dead_or_wrong_keyed_peer_shows_so() {
    let test = "peers_link_up_offer_what_they_lend_and_a_dead_or_wrong_keyed_peer_shows_so";
    if !support::root_or_say(test) {
        return;
    }
    support::ensure_all_binaries();
    let (c0, c1) = (TestCluster::start(2), TestCluster::start(2));
    let (p0, p1) = (free_port(), free_port());
    let keys = tempfile::tempdir().unwrap();
    let pair = keys.path().join("c0-c1.key");
    storm_cluster::key::generate(&pair).unwrap();
    let peer = |name: &str, port: u16, key: &Path, lend: bool| PeerEntry {
        name: name.into(),
        address: format!("127.0.0.1:{port}").parse().unwrap(),
        key_file: key.to_path_buf(),
        lend,
        borrow: !lend,
        flock_user: None,
        same_users: false,
    };
    let cfg0 = agent_config(&c0, "c0", p0, peer("c1", p1, &pair, false));
    let cfg1 = agent_config(&c1, "c1", p1, peer("c0", p0, &pair, true));
    let _a0 = Agent(start_agent(&cfg0));
    let a1 = Agent(start_agent(&cfg1));
    let up = |v: &serde_json::Value| v["state"] == "up" && v["lag_us"].is_u64();
    // c1 lends to c0: its two idle nodes of 4 CPUs each.
    let seen = wait_peer(&c0, "c1", Duration::from_secs(20), "c0 sees c1 up", |v| {
        up(v) && v["offer"]["idle_nodes"] == 2
    });
    assert_eq!(seen["offer"]["idle_cpus"], 2 * support::TEST_CPUS, "{seen}");
    assert_eq!(seen["offer"]["nodes"], 2, "{seen}");
    assert_eq!(seen["borrow"], true, "{seen}");
    // c0 does not lend to c1: c1 hears it, and is offered nothing.
    let back = wait_peer(&c1, "c0", Duration::from_secs(20), "c1 sees c0 up", up);
    assert!(back["offer"].is_null(), "c0 lends nothing to c1: {back}");
    let table = support::text(&c0.storm(&["peers"]).stdout);
    assert!(
        table.contains("c1") && table.contains("up"),
        "storm peers: {table}"
    );

    // c1's agent dies: c0 sees it down within the timeout, and runs its own jobs.
    drop(a1);
    let down = wait_peer(&c0, "c1", Duration::from_secs(10), "c1 down", |v| {
        v["state"] == "down"
    });
    assert!(
        down["offer"].is_null(),
        "a down peer offers nothing: {down}"
    );
    let out = c0.submit(&["-N", "2", "true"]);
    assert!(
        out.status.success(),
        "c0 schedules its own jobs without its peer: {}",
        support::text(&out.stderr)
    );

    // c1's agent comes back with another key: refused, by name.
    let wrong = keys.path().join("wrong.key");
    storm_cluster::key::generate(&wrong).unwrap();
    let cfg1_wrong = agent_config(&c1, "c1", p1, peer("c0", p0, &wrong, true));
    let a1 = Agent(start_agent(&cfg1_wrong));
    let refused = wait_peer(&c0, "c1", Duration::from_secs(20), "c1 refused", |v| {
        v["state"] == "refused"
    });
    assert!(
        refused["reason"]
            .as_str()
            .is_some_and(|r| r.contains("does not hold the key")),
        "{refused}"
    );
    drop(a1);
    let _a1 = Agent(start_agent(&cfg1));
    wait_peer(
        &c0,
        "c1",
        Duration::from_secs(20),
        "c1 up again with the right key",
        |v| up(v) && v["offer"]["idle_nodes"] == 2,
    );
}
