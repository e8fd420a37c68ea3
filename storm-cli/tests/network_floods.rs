//! A host on the network without any key against storm's listeners (issue 61, finding M2):
//! it opens connections from one address and says nothing, or garbage, again and again. Each
//! listener holds at most a few of its places for one address (`storm_cluster::accept_gate`),
//! so the cluster's own nodes, peers and Prometheus still get in, and refusals are logged
//! within a rate, so the disk does not fill:
//!
//! * the control relay's manager side (64 handshakes in all before, none per source: about
//!   80 idle connections cut every relayed user off from the MM);
//! * the peer agent (16 in all before: a flood kept peer clusters apart after a link drop,
//!   and every refusal was logged, 2.6 MB in 40 s);
//! * the metrics exporter (a thread for every idle connection before).

mod support;

use std::net::{SocketAddr, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use storm_cli::relay::wire::{self, FRAME_LIMIT, Opened, Up};
use storm_cluster::control::{PROTOCOL_VERSION, Reply};
use support::testbed::{can_run, in_node_ns, up};
use support::{NOBODY, TestCluster, text};

/// Keeps `count` idle connections to `to` open from `from` (each one closed by the far side
/// is opened again at once) until `stop`; on a thread of its own (and in the calling
/// thread's network namespace: `spawn` is called there).
fn flood(from: std::net::IpAddr, to: SocketAddr, count: usize, stop: Arc<AtomicBool>) {
    use std::io::Read;
    let connect = move || -> Option<TcpStream> {
        let sock = socket2_connect(from, to)?;
        sock.set_nonblocking(true).ok()?;
        Some(sock)
    };
    let mut held: Vec<Option<TcpStream>> = (0..count).map(|_| connect()).collect();
    while !stop.load(Ordering::Acquire) {
        for slot in held.iter_mut() {
            let closed = match slot {
                Some(s) => match s.read(&mut [0u8; 64]) {
                    Ok(0) => true,
                    Ok(_) => false,
                    Err(e) => e.kind() != std::io::ErrorKind::WouldBlock,
                },
                None => true,
            };
            if closed {
                *slot = connect();
            }
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A TCP connection from address `from` (any port) to `to`.
fn socket2_connect(from: std::net::IpAddr, to: SocketAddr) -> Option<TcpStream> {
    use std::os::fd::FromRawFd;
    // SAFETY: a new socket, bound and connected through libc with valid addresses; the
    // descriptor is handed to a TcpStream that owns it from then on.
    unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let stream = TcpStream::from_raw_fd(fd);
        let sin = |ip: std::net::IpAddr, port: u16| -> libc::sockaddr_in {
            let std::net::IpAddr::V4(v4) = ip else {
                panic!("IPv4 only")
            };
            libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: port.to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(v4.octets()),
                },
                sin_zero: [0; 8],
            }
        };
        let local = sin(from, 0);
        let remote = sin(to.ip(), to.port());
        let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
        if libc::bind(fd, (&local as *const libc::sockaddr_in).cast(), len) != 0
            || libc::connect(fd, (&remote as *const libc::sockaddr_in).cast(), len) != 0
        {
            return None;
        }
        Some(stream)
    }
}

/// Lines of `path` that say something was refused or closed.
fn refusal_lines(path: &std::path::Path) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("refus") || l.contains("closed") || l.contains("dropp"))
        .count()
}

/// The control relay: a host of the cluster's network without the keys (on node 1's
/// address) keeps 80 connections open to the manager side; a node relay with the keys (node
/// 0's) still opens its link and is greeted, and the relay's log holds a bounded count of
/// refusals.
#[test]
fn a_host_without_keys_keeps_no_node_from_the_relay() {
    let test = "a_host_without_keys_keeps_no_node_from_the_relay";
    if !can_run(test) || !support::root_or_say(test) {
        return;
    }
    let work = support::shared_tempdir();
    let tb = up(2, work.path());
    let cfg = storm_cluster::ClusterConfig::load(&tb.config_path).unwrap();
    let addr = cfg.relay.address.unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let attacker = storm_cli::testbed::node_addr(1);
    let s = stop.clone();
    let flooding = in_node_ns(&tb, 1, move || {
        std::thread::spawn(move || flood(attacker.into(), addr, 80, s))
    });
    std::thread::sleep(Duration::from_secs(1));
    let (key, node0, size) = (
        cfg.load_key().unwrap(),
        cfg.load_node_key("node0").unwrap(),
        cfg.node_count(),
    );
    let greeted = in_node_ns(&tb, 0, move || -> Result<Reply, String> {
        let tcp =
            TcpStream::connect_timeout(&addr, Duration::from_secs(5)).map_err(|e| e.to_string())?;
        tcp.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut link = wire::handshake_as_node(
            tcp.try_clone().unwrap(),
            tcp,
            &key,
            0,
            size,
            &node0,
            FRAME_LIMIT,
        )
        .map_err(|e| e.to_string())?;
        link.writer
            .send(&Up::Open {
                uid: NOBODY,
                gid: NOBODY,
                version: PROTOCOL_VERSION,
            })
            .map_err(|e| e.to_string())?;
        match link.reader.recv::<Opened>().map_err(|e| e.to_string())? {
            Opened::Ready => {}
            other => return Err(format!("{other:?}")),
        }
        link.reader.recv::<Reply>().map_err(|e| e.to_string())
    });
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Release);
    flooding.join().unwrap();
    assert!(
        matches!(greeted, Ok(Reply::Hello { .. })),
        "node 0's relay link during a flood from node 1's address: {greeted:?}"
    );
    let lines = refusal_lines(&tb.dir.join("storm-relay-manager.log"));
    assert!(lines <= 60, "{lines} lines of refusals in 3 s of flood");
}

/// The peer agent: a host without the pair key keeps 40 connections open to `pf-b`'s agent
/// from its own address. `pf-a`'s agent restarts meanwhile (a link drop): its link to
/// `pf-b` is up again, and `pf-b`'s log holds a bounded count of refusals.
#[test]
fn a_host_without_the_pair_key_keeps_no_peer_out() {
    use storm_cluster::federation::{FederationSection, PeerEntry};
    let test = "a_host_without_the_pair_key_keeps_no_peer_out";
    if !support::root_or_say(test) {
        return;
    }
    support::ensure_all_binaries();
    let keys = tempfile::tempdir().unwrap();
    let pair = keys.path().join("pair.key");
    storm_cluster::key::generate(&pair).unwrap();
    let port = || {
        std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port()
    };
    let (pa, pb) = (port(), port());
    let fed = |p: u16| FederationSection {
        listen: Some(format!("127.0.0.1:{p}").parse().unwrap()),
        advertise_ms: 200,
        peer_timeout_ms: 1000,
        ..Default::default()
    };
    let peer = |name: &str, p: u16| PeerEntry {
        name: name.into(),
        address: format!("127.0.0.1:{p}").parse().unwrap(),
        key_file: pair.clone(),
        lend: true,
        borrow: true,
        flock_user: Some("nobody".into()),
        same_users: false,
        guest_file: None,
        mm_public_key_file: None,
        priority: 0,
    };
    let cluster = |name: &str, me: u16, other: (&str, u16)| {
        TestCluster::with(storm_cli::local::LocalOptions {
            cpus: Some(support::TEST_CPUS),
            name: Some(name.into()),
            federation: fed(me),
            peers: vec![peer(other.0, other.1)],
            ..storm_cli::local::LocalOptions::new(1)
        })
    };
    let a = cluster("pf-a", pa, ("pf-b", pb));
    let b = cluster("pf-b", pb, ("pf-a", pa));
    let (a_file, b_file) = (a.root.join("cluster.toml"), b.root.join("cluster.toml"));
    let agent_a = support::start_agent(&a_file);
    let _agent_b = support::start_agent(&b_file);
    let b_up_at_a = |a: &TestCluster| {
        let out = a.storm(&["peers", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        v["peers"][0]["state"] == "up"
    };

    support::wait_until(Duration::from_secs(20), "the peers link up", || {
        (!b_up_at_a(&a)).then(|| text(&a.storm(&["peers"]).stdout))
    });
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let to: SocketAddr = format!("127.0.0.1:{pb}").parse().unwrap();
    let flooding = std::thread::spawn(move || flood("127.0.0.9".parse().unwrap(), to, 40, s));
    std::thread::sleep(Duration::from_secs(1));
    // A link drop: a's agent goes and comes back, and must dial b again through the flood.
    drop(agent_a);
    std::thread::sleep(Duration::from_millis(500));
    let _agent_a = support::start_agent(&a_file);
    let since = Instant::now();
    let mut back = false;
    while since.elapsed() < Duration::from_secs(15) {
        // Said by the agent started now (its reports are younger than it), not the last.
        let out = a.storm(&["peers", "--json"]);
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_default();
        let fresh = v["reported_ms_ago"]
            .as_u64()
            .is_some_and(|ms| (ms as u128) < since.elapsed().as_millis());
        if fresh && v["peers"][0]["state"] == "up" {
            back = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    stop.store(true, Ordering::Release);
    flooding.join().unwrap();
    assert!(
        back,
        "a's link to b did not come back within 15 s of a flood on b's port: {}",
        text(&a.storm(&["peers"]).stdout)
    );
    let lines = refusal_lines(&b_file.with_extension("peer.log"));
    assert!(lines <= 120, "{lines} lines of refusals in b's agent log");
}

/// Threads of process `pid`.
fn threads(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/task")).map_or(0, |d| d.count())
}

/// The metrics exporter: 100 idle connections from one address hold at most its share of
/// threads, and a scrape from another address is answered.
#[test]
fn a_host_without_the_token_holds_no_more_than_its_share_of_the_exporter() {
    let c = TestCluster::start(1);
    let (mut child, addr) = support::exporter(&c, &["--listen", "127.0.0.1:0"]);
    let addr = addr.expect("the exporter serves");
    let pid = child.id();
    let before = threads(pid);
    let stop = Arc::new(AtomicBool::new(false));
    let s = stop.clone();
    let to: SocketAddr = addr.parse().unwrap();
    let flooding = std::thread::spawn(move || flood("127.0.0.9".parse().unwrap(), to, 100, s));
    std::thread::sleep(Duration::from_secs(1));
    let during = threads(pid);
    let status = support::scrape(&addr, None);
    stop.store(true, Ordering::Release);
    flooding.join().unwrap();
    let _ = child.kill();
    let _ = child.wait();
    assert_eq!(status, 200, "a scrape during the flood");
    assert!(
        during <= before + 8 + 1,
        "100 idle connections from one address gave the exporter {} threads more",
        during - before
    );
}
