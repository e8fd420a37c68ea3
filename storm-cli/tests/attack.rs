//! An attacker on the cluster's network (docs/security.md): on the namespace testbed, an
//! unprivileged process on node 0 that knows the cluster file but not the key, and has seen
//! what passed on node 1's link, connects to every NM and to the MM and tries:
//!
//! * a handshake with a made-up proof, and one with a proof under another key;
//! * a key holder's handshake, recorded, replayed word for word;
//! * the bytes the MM sent node 1 (its heartbeats), replayed on a new connection, as they were
//!   and with one byte altered.
//!
//! Every attempt is refused, each refused proof is logged with the peer's address, no job
//! runs but ours, and afterwards every node is up and a job runs on all of them.

mod support;

use std::io::{Read, Write};
use std::net::{SocketAddr, SocketAddrV4, TcpStream};
use std::process::Command;
use std::time::{Duration, Instant};

use storm_cluster::control::NodeState;
use storm_primitives::tcp::auth::ClusterKey;
use storm_primitives::tcp::wire::{Control, Frame, Hello, read_frame};
use support::handshake::{client_proof, daemons, handshake};
use support::testbed::{can_run, finish, logs, nodes, spawn, up, wait_node_state};
use support::{NOBODY, text};

/// What the attacker is given: everything but the key.
struct Plan {
    cluster_size: u32,
    fingerprint: u64,
    /// (node id, address) of every daemon.
    targets: Vec<(u32, SocketAddr)>,
    /// Per target: the hello and proof a key holder sent in a handshake with it.
    recorded: Vec<(Hello, [u8; 32])>,
    /// Bytes the MM sent to node 1 on an established connection.
    captured: Vec<u8>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

fn unhex(s: &str) -> Vec<u8> {
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).unwrap())
        .collect()
}

impl Plan {
    fn write(&self) -> String {
        let mut out = format!("cluster {} {}\n", self.cluster_size, self.fingerprint);
        for ((id, addr), (hello, proof)) in self.targets.iter().zip(&self.recorded) {
            out += &format!(
                "target {id} {addr} {} {} {} {}\n",
                hello.node,
                hex(&hello.nonce),
                hex(proof),
                hello.protection
            );
        }
        out += &format!("captured {}\n", hex(&self.captured));
        out
    }

    fn read(text: &str) -> Plan {
        let mut plan = Plan {
            cluster_size: 0,
            fingerprint: 0,
            targets: Vec::new(),
            recorded: Vec::new(),
            captured: Vec::new(),
        };
        for line in text.lines() {
            let w: Vec<&str> = line.split(' ').collect();
            match w[0] {
                "cluster" => {
                    plan.cluster_size = w[1].parse().unwrap();
                    plan.fingerprint = w[2].parse().unwrap();
                }
                "target" => {
                    plan.targets
                        .push((w[1].parse().unwrap(), w[2].parse().unwrap()));
                    let hello = Hello {
                        node: w[3].parse().unwrap(),
                        cluster_size: plan.cluster_size,
                        layout_fingerprint: plan.fingerprint,
                        protection: w[6].parse().unwrap(),
                        nonce: unhex(w[4]).try_into().unwrap(),
                    };
                    plan.recorded.push((hello, unhex(w[5]).try_into().unwrap()));
                }
                "captured" => plan.captured = unhex(w[1]),
                other => panic!("unknown plan line {other}"),
            }
        }
        plan
    }
}

/// Sends `bytes` on a new connection to `addr` and reads until the daemon hangs up: `Ok` if
/// it did without accepting the connection; else what happened.
fn hung_up_on(addr: SocketAddr, bytes: &[u8]) -> Result<(), String> {
    let mut s = TcpStream::connect(addr).map_err(|e| format!("connect: {e}"))?;
    // The daemon may hang up before taking all of it.
    let _ = s.write_all(bytes);
    s.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
    let mut answer = Vec::new();
    match s.read_to_end(&mut answer) {
        Ok(_) => {}
        // A daemon that hangs up with the attacker's bytes unread resets the connection.
        Err(e)
            if matches!(
                e.kind(),
                std::io::ErrorKind::ConnectionReset | std::io::ErrorKind::ConnectionAborted
            ) => {}
        Err(e) => return Err(format!("still connected after 15 s: {e}")),
    }
    // The bytes may hold a handshake the MM made (the capture can catch a reconnection):
    // the daemon may then challenge them, but must never let them in.
    let mut frames = std::io::Cursor::new(&answer);
    while let Ok(frame) = read_frame(&mut frames, 1 << 20) {
        if frame == Frame::Control(Control::HelloAck) {
            return Err(format!("let in (answered {} bytes)", answer.len()));
        }
    }
    Ok(())
}

fn outcome(result: Result<(), String>) -> String {
    match result {
        Ok(()) => "refused=true".into(),
        Err(e) => format!("refused=false ({e})"),
    }
}

/// The attacker (run by `an_attacker_on_the_network_without_the_key_achieves_nothing`, as an
/// unprivileged user in node 0's namespace): tries everything in its plan and prints one
/// outcome per attempt.
#[test]
#[ignore = "the attacker that an_attacker_on_the_network_without_the_key_achieves_nothing runs"]
fn attacker() {
    let Some(path) = std::env::var_os("STORM_ATTACK_PLAN") else {
        println!("no plan: nothing to attack");
        return;
    };
    let plan = Plan::read(&std::fs::read_to_string(path).unwrap());
    for (&(target, addr), (recorded, recorded_proof)) in plan.targets.iter().zip(&plan.recorded) {
        let hello = |nonce: [u8; 32]| Hello {
            nonce,
            ..recorded.clone()
        };
        let (refused, _) = handshake(addr, &hello([1; 32]), |_| [0xAB; 32]);
        println!("{target} made-up-proof refused={refused}");
        let h = hello([2; 32]);
        let wrong = ClusterKey::random();
        let (refused, _) = handshake(addr, &h, |n| client_proof(&wrong, &h, target, n));
        println!("{target} other-key refused={refused}");
        let (refused, _) = handshake(addr, recorded, |_| *recorded_proof);
        println!("{target} replayed-handshake refused={refused}");
        println!(
            "{target} replayed-heartbeats {}",
            outcome(hung_up_on(addr, &plan.captured))
        );
        let mut altered = plan.captured.clone();
        let mid = altered.len() / 2;
        altered[mid] ^= 0x40;
        println!(
            "{target} altered-heartbeats {}",
            outcome(hung_up_on(addr, &altered))
        );
    }
}

#[test]
fn an_attacker_on_the_network_without_the_key_achieves_nothing() {
    if !can_run("an_attacker_on_the_network_without_the_key_achieves_nothing") {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let tb = up(3, work.path());
    let cfg = tb.config.clone();
    let key = cfg.load_key().unwrap();
    let rm = storm_cluster::layout::RmLayout::new(&cfg).unwrap();
    let size = cfg.node_count() + 1;
    let targets = daemons(&cfg);

    // What a host on the network sees: the MM's heartbeats to node 1. The cluster is idle, so
    // they go once per quiet period (`[failure] quiet_heartbeat_ms`, 50 ms), not every
    // timeslice: three seconds of them.
    let to_node1 = SocketAddr::V4(SocketAddrV4::new(storm_cli::testbed::node_addr(1), 7000));
    let seen = tb.capture(1, Duration::from_secs(3)).unwrap();
    let captured: Vec<u8> = seen
        .iter()
        .filter(|s| SocketAddr::V4(s.dst) == to_node1)
        .flat_map(|s| s.payload.clone())
        .collect();
    assert!(
        captured.len() > 1000,
        "the traffic to node 1's port was seen ({} bytes), in: {:?}",
        captured.len(),
        seen.iter()
            .map(|s| (s.src, s.dst, s.payload.len()))
            .collect::<Vec<_>>()
    );

    // A key holder's handshake with each daemon, recorded for replay (claiming to be the MM
    // to a node, node 0 to the MM).
    let recorded: Vec<(Hello, [u8; 32])> = targets
        .iter()
        .map(|&(target, addr)| {
            let claim = if target == cfg.mm_id() {
                0
            } else {
                cfg.mm_id()
            };
            let hello = Hello {
                node: claim,
                cluster_size: size,
                layout_fingerprint: rm.layout.fingerprint(),
                protection: cfg.protection().code(),
                nonce: [target as u8 + 3; 32],
            };
            let key = key.clone();
            let h = hello.clone();
            let (_, proof) = tb
                .in_node(0, move || {
                    handshake(addr, &h, |n| client_proof(&key, &h, target, n))
                })
                .unwrap();
            (hello, proof)
        })
        .collect();

    // A key holder claiming a member's id replaces that member's connection (as a restarted
    // daemon does): let the nodes settle before the attack.
    let socket = tb.socket().to_path_buf();
    for n in 0..cfg.node_count() {
        wait_node_state(&socket, n, NodeState::Idle, Duration::from_secs(20));
    }

    let plan = Plan {
        cluster_size: size,
        fingerprint: rm.layout.fingerprint(),
        targets: targets.clone(),
        recorded,
        captured,
    };
    // Somewhere the unprivileged attacker can read.
    let plan_dir = tempfile::Builder::new().prefix("attack").tempdir().unwrap();
    std::fs::set_permissions(
        plan_dir.path(),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
    let plan_file = plan_dir.path().join("plan");
    std::fs::write(&plan_file, plan.write()).unwrap();
    std::fs::set_permissions(
        &plan_file,
        std::os::unix::fs::PermissionsExt::from_mode(0o644),
    )
    .unwrap();

    let me = std::env::current_exe().unwrap();
    let out = Command::new("ip")
        .args(["netns", "exec", &tb.node_ns(0), "setpriv"])
        .arg(format!("--reuid={NOBODY}"))
        .arg(format!("--regid={NOBODY}"))
        .args(["--clear-groups", "--"])
        .arg(&me)
        .args(["--exact", "attacker", "--ignored", "--nocapture"])
        .env("STORM_ATTACK_PLAN", &plan_file)
        .output()
        .unwrap();
    let said = text(&out.stdout);
    assert!(
        out.status.success(),
        "the attacker ran to its end: {said}\n{}",
        text(&out.stderr)
    );
    let outcomes: Vec<&str> = said.lines().filter(|l| l.contains(" refused=")).collect();
    assert_eq!(outcomes.len(), 5 * targets.len(), "{said}");
    let let_in: Vec<&&str> = outcomes
        .iter()
        .filter(|l| !l.contains("refused=true"))
        .collect();
    assert!(let_in.is_empty(), "attempts not refused: {let_in:?}");

    // Each refused proof is logged where it was refused, with the attacker's address.
    let attacker_ip = storm_cli::testbed::node_addr(0).to_string();
    let since = Instant::now();
    let refusals = || {
        logs(&tb)
            .lines()
            .filter(|l| {
                l.contains("did not prove it holds the cluster key") && l.contains(&attacker_ip)
            })
            .count()
    };
    while refusals() < 3 * targets.len() && since.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        refusals() >= 3 * targets.len(),
        "each refused proof is logged with the peer's address:\n{}",
        logs(&tb)
    );

    // Nothing came of it: every node is up, no job ran, and ours runs everywhere.
    for n in nodes(&socket) {
        assert_eq!(n.state, NodeState::Idle, "{n:?}");
    }
    let out = finish(spawn(&tb, &["-N", "3", "/bin/echo", "still here"]));
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).matches("still here").count(), 3);
    let history = Command::new(support::bin_dir().join("storm"))
        .arg("--config")
        .arg(&tb.config_path)
        .arg("history")
        .output()
        .unwrap();
    let jobs = text(&history.stdout)
        .lines()
        .filter(|l| l.trim_start().starts_with(char::is_numeric))
        .count();
    assert_eq!(jobs, 1, "only our job ran: {}", text(&history.stdout));
}
