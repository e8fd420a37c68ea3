//! Only the cluster's own daemons can talk to its daemons: the cluster key.
//!
//! * Daemons refuse to start without a private key of their own user, naming the file and the
//!   fix.
//! * A process that has the cluster file but not the key (as any local user has) connects to
//!   every daemon's port and tries its luck: a handshake with a made-up proof, a replay of a
//!   handshake a key holder made, frames without a handshake. Every attempt is refused and
//!   logged, and afterwards every node is still up and a job runs.
//! * A key holder posing as one compute node cannot write into another's memory (where the
//!   MM's commands arrive): only the MM writes there.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use storm_cluster::config::ClusterConfig;
use storm_primitives::NodeSet;
use storm_primitives::tcp::auth::ClusterKey;
use storm_primitives::tcp::peer::{Membership, RawPeer};
use storm_primitives::tcp::wire::{Control, OpKey, OutFrame, XferBegin, XferMsg};
use support::handshake::{client_proof, daemons, handshake, member_hello as hello};
use support::{TestCluster, ensure_daemons, text};

/// Runs daemon `bin` (`storm-mm`, or `storm-nm` for node0) on `config` and returns its exit
/// code and standard error.
fn start_daemon(bin: &str, config: &Path) -> (Option<i32>, String) {
    let mut cmd = Command::new(support::bin_dir().join(bin));
    cmd.arg("--config").arg(config);
    if bin == "storm-nm" {
        cmd.args(["--node", "node0"]);
    }
    let out = cmd.output().expect("run the daemon");
    (out.status.code(), text(&out.stderr))
}

#[test]
fn daemons_refuse_a_missing_exposed_or_foreign_key_naming_the_file_and_fix() {
    ensure_daemons();
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("cluster.toml");
    std::fs::write(
        &config,
        format!(
            "[cluster]\nname = \"t\"\ncontrol_socket = \"{0}/mm.sock\"\nstate_dir = \"{0}/state\"\n\
             [mm]\naddress = \"127.0.0.1:1\"\n[[node]]\nname = \"node0\"\naddress = \
             \"127.0.0.1:2\"\nspool = \"{0}/node0\"\n",
            dir.path().display()
        ),
    )
    .unwrap();
    let key = dir.path().join("storm.key");
    for bin in ["storm-mm", "storm-nm"] {
        let (code, err) = start_daemon(bin, &config);
        assert_eq!(code, Some(1), "{bin}: {err}");
        assert!(
            err.contains(&key.display().to_string()) && err.contains("storm keygen"),
            "{bin} names the missing key and how to make one: {err}"
        );
    }
    storm_cluster::key::generate(&key).unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    for bin in ["storm-mm", "storm-nm"] {
        let (code, err) = start_daemon(bin, &config);
        assert_eq!(code, Some(1), "{bin}: {err}");
        assert!(
            err.contains("can be read by other users") && err.contains("chmod 600"),
            "{bin} refuses a key others can read: {err}"
        );
    }
    if nix::unistd::geteuid().is_root() {
        std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o600)).unwrap();
        std::os::unix::fs::chown(&key, Some(65534), None).unwrap();
        let (code, err) = start_daemon("storm-nm", &config);
        assert_eq!(code, Some(1), "{err}");
        assert!(err.contains("belongs to uid 65534"), "{err}");
    } else {
        support::say_not_tested(
            "daemons_refuse_..._foreign_key (the chown part)",
            "needs root",
        );
    }
}

#[test]
fn a_process_without_the_key_is_refused_everywhere_and_the_cluster_runs_on() {
    let c = TestCluster::start(3);
    let cfg = c.cluster.as_ref().unwrap().config.clone();
    let key = cfg.load_key().unwrap();
    let targets = daemons(&cfg);
    let proof = client_proof;
    for &(target, addr) in &targets {
        // Claim to be another member (the MM, to a node; node 0, to the MM).
        let claim = if target == cfg.mm_id() {
            0
        } else {
            cfg.mm_id()
        };
        // 1. A guessed proof.
        let (was_refused, _) = handshake(addr, &hello(&cfg, claim, [1; 32]), |_| [0xAB; 32]);
        assert!(was_refused, "a made-up proof is refused by node {target}");
        // 2. The right proof under another key.
        let wrong = ClusterKey::random();
        let h = hello(&cfg, claim, [2; 32]);
        let (was_refused, _) = handshake(addr, &h, |n| proof(&wrong, &h, target, n));
        assert!(
            was_refused,
            "a proof under another key is refused by {target}"
        );
        // 3. A key holder's handshake, recorded, then replayed word for word: the daemon's
        //    fresh nonce makes the recorded proof worthless.
        let h = hello(&cfg, claim, [3; 32]);
        let (_, recorded) = handshake(addr, &h, |n| proof(&key, &h, target, n));
        let (was_refused, _) = handshake(addr, &h, |_| recorded);
        assert!(was_refused, "a replayed handshake is refused by {target}");
        // 4. Commands without any handshake.
        let mut s = TcpStream::connect(addr).unwrap();
        let _ = s.write_all(&OutFrame::control(&Control::HelloAck).to_vec());
        let mut sink = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.read_to_end(&mut sink);
    }
    // Every attempt was logged, with the reason, where it was refused (the refusal goes out
    // before the daemon writes its log line).
    let logs = || -> String {
        std::fs::read_dir(&c.root)
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().ends_with(".log"))
            .map(|e| std::fs::read_to_string(e.path()).unwrap_or_default())
            .collect()
    };
    let logged = || {
        logs()
            .matches("did not prove it holds the cluster key")
            .count()
    };
    let since = std::time::Instant::now();
    while logged() < 3 * targets.len() && since.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        logged() >= 3 * targets.len(),
        "each refused proof is logged:\n{}",
        logs()
    );
    // Nothing came of it: every node is up, and a job runs on all of them.
    let out = c.submit(&["-N", "3", "/bin/echo", "still here"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).matches("still here").count(), 3);
    let nodes = c.storm(&["nodes"]);
    assert!(
        !text(&nodes.stdout).contains("down"),
        "{}",
        text(&nodes.stdout)
    );
}

/// What a holder of the cluster key presents claiming to be node `node`: the key, the
/// cluster's layout and link protection, and `identity`, the node key it proves, if any.
fn posing_as(
    cfg: &ClusterConfig,
    node: u32,
    identity: Option<ed25519_dalek::SigningKey>,
) -> Membership {
    Membership {
        node,
        cluster_size: cfg.node_count() + 1,
        layout: storm_cluster::layout::RmLayout::new(cfg).unwrap().layout,
        key: cfg.load_key().unwrap(),
        protection: cfg.protection(),
        identity,
    }
}

#[test]
fn a_compute_node_cannot_write_commands_into_another() {
    let c = TestCluster::start(2);
    let cfg = c.cluster.as_ref().unwrap().config.clone();
    let rm = storm_cluster::layout::RmLayout::new(&cfg).unwrap();
    // Node 1, as far as node 0 can tell: it holds the key and proves it.
    let me = posing_as(&cfg, 1, None);
    let mut peer = RawPeer::connect(cfg.nodes[0].address, 0, &me).unwrap();
    let op = OpKey { origin: 1, seq: 1 };
    peer.send_control(&Control::Xfer(XferMsg::Begin(XferBegin {
        key: op,
        dest: NodeSet::single(0),
        fanout: 2,
        offset: rm.heartbeat.slots.offset,
        len: 64,
        remote_event: Some(rm.heartbeat.arrived.index() as u32),
        timeout_ms: 5000,
        on_arrival: false,
    })))
    .unwrap();
    // The refusal goes back to the origin over node 0's own connection to node 1 (the real
    // one, which drops it): the log says what happened.
    let log = || std::fs::read_to_string(c.root.join("node0.log")).unwrap_or_default();
    let since = std::time::Instant::now();
    while !log().contains("node 1 may not write into node 0's memory")
        && since.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        log().contains("refusing a transfer") && log().contains("node 1 may not write"),
        "node 0 refuses and logs the transfer:\n{}",
        log()
    );
    // Node 0 took the impostor's connection as node 1's (a key holder may claim any id):
    // hang up, so node 0 reaches the real node 1 again.
    drop(peer);
    let out = c.submit(&["-N", "2", "/bin/echo", "still here"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).matches("still here").count(), 2);
}

/// Finding 5 of issue 31: a host without the key held all 64 handshake places of the MM, so a
/// restarted NM could not rejoin (down for 15 s), and each refusal wrote a warning (0.8 MB/s
/// of log). Now a flood from one host (127.0.0.2: 200 connections held silent, and new ones
/// sending garbage as fast as it can) takes only that host's few places: a node restarted
/// meanwhile rejoins, and the MM's log grows by a bounded number of lines.
#[test]
fn a_handshake_flood_from_one_host_keeps_no_node_out_and_fills_no_log() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use storm_primitives::tcp::peer::connect_from;
    let mut c = TestCluster::start(2);
    let mm_addr = c.cluster.as_ref().unwrap().config.mm.address;
    let log = c.root.join("mm.log");
    let log_size = || std::fs::metadata(&log).map_or(0, |m| m.len());
    let before = log_size();
    let attacker: std::net::Ipv4Addr = [127, 0, 0, 2].into();
    let held: Vec<TcpStream> = (0..200)
        .filter_map(|_| connect_from(attacker, mm_addr).ok())
        .collect();
    let stop = Arc::new(AtomicBool::new(false));
    let tries = Arc::new(AtomicU64::new(0));
    let flood = {
        let (stop, tries) = (stop.clone(), tries.clone());
        std::thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                if let Ok(mut s) = connect_from(attacker, mm_addr) {
                    let _ = s.write_all(b"GET / HTTP/1.0\r\n\r\n not a storm hello at all");
                }
                tries.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    std::thread::sleep(Duration::from_millis(500));
    // A node restarts during the flood, and must get back in.
    let cluster = c.cluster.as_mut().unwrap();
    cluster.kill_nm(1).unwrap();
    cluster.restart_nm(1).unwrap();
    let since = std::time::Instant::now();
    let rejoined = loop {
        let nodes = text(&c.storm(&["nodes"]).stdout);
        let node1 = nodes.lines().find(|l| l.contains("node1")).unwrap_or("");
        if node1.contains("idle") {
            break true;
        }
        if since.elapsed() > Duration::from_secs(30) {
            break false;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_secs(2));
    stop.store(true, Ordering::Relaxed);
    flood.join().unwrap();
    drop(held);
    let grew = log_size() - before;
    let tries = tries.load(Ordering::Relaxed);
    assert!(
        rejoined,
        "a restarted node did not rejoin during the flood: {}",
        text(&c.storm(&["nodes"]).stdout)
    );
    assert!(tries > 500, "the flood made only {tries} connections");
    // Refusals are logged up to 20 lines per 10 s each, with the counts in between.
    assert!(
        grew < 32 << 10,
        "{tries} refused connections grew the MM's log by {grew} bytes"
    );
    let out = c.submit(&["-N", "2", "/bin/echo", "still here"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}

/// Finding 9 of issue 31: `encrypt = false` was the default, so every job's environment
/// (API tokens) crossed the network in clear text. Encryption is the default now: a job
/// whose environment holds a secret runs on two nodes, and everything on loopback meanwhile
/// (captured as any host on the network could) never shows the secret, which the job's own
/// output also carries. With `encrypt = false` (an explicit opt-out) the same capture finds
/// it, and the daemons warn at start.
#[test]
fn a_jobs_secrets_never_cross_the_network_in_clear_by_default() {
    let test = "a_jobs_secrets_never_cross_the_network_in_clear_by_default";
    if !support::root_or_say(test) {
        return;
    }
    let secret = format!("tok-{:016x}", rand_u64());
    let run = |encrypt: bool| -> (bool, String) {
        let c = TestCluster::with(storm_cli::local::LocalOptions {
            encrypt,
            ..storm_cli::local::LocalOptions::new(2)
        });
        let capture = std::thread::spawn(|| {
            storm_cli::testbed::capture::capture_here("lo", Duration::from_secs(4))
        });
        std::thread::sleep(Duration::from_millis(300));
        let out = c.submit_env(
            &[("API_TOKEN", &secret)],
            &["-N", "2", "/usr/bin/printenv", "API_TOKEN"],
        );
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).matches(&secret).count(), 2);
        let segments = capture.join().unwrap().expect("capture on lo");
        let seen = segments.iter().any(|s| {
            s.payload
                .windows(secret.len())
                .any(|w| w == secret.as_bytes())
        });
        let log = std::fs::read_to_string(c.root.join("mm.log")).unwrap_or_default();
        (seen, log)
    };
    let (seen, log) = run(true);
    assert!(
        !seen,
        "the secret crossed loopback in clear with the default settings"
    );
    assert!(!log.contains("encrypt = false"), "{log}");
    let (seen, log) = run(false);
    assert!(
        seen,
        "with encrypt = false the capture should find the secret: the capture sees nothing"
    );
    assert!(
        log.contains("[tcp] encrypt = false"),
        "the opt-out is warned about: {log}"
    );
}

/// A process stopped (SIGSTOP) until this is dropped, whatever happens in between.
struct StoppedUntilDropped(i32);

impl StoppedUntilDropped {
    fn stop(pid: u32) -> Self {
        // SAFETY: stopping a process of this test's own cluster.
        unsafe { libc::kill(pid as i32, libc::SIGSTOP) };
        Self(pid as i32)
    }
}

impl Drop for StoppedUntilDropped {
    fn drop(&mut self) {
        // SAFETY: continuing the process stopped above.
        unsafe { libc::kill(self.0, libc::SIGCONT) };
    }
}

/// A random number from the kernel, for a secret no earlier run could have left anywhere.
fn rand_u64() -> u64 {
    let mut b = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| f.read_exact(&mut b))
        .unwrap();
    u64::from_le_bytes(b)
}

/// Finding 2 of issue 31: a holder of the cluster key (root on one compute node has it) sent
/// on-arrival transfers "from the MM", relayed as node 1, into node 2's heartbeat slot, and
/// node 2 launched what they said as uid 0. With the MM stopped (so nothing races it), a key
/// holder posing as node 1 (node 2's parent in a chain of the three nodes, as relays are)
/// writes the heartbeat node 2 expects next (its sequence number read from node 2's heartbeat
/// log, as a relay would see it go by) with a launch of a root command: first with no seal,
/// then sealed with a key of the attacker's own. Node 2 refuses both and says why; the
/// command never runs; the cluster runs jobs once node 2 has rejoined.
#[test]
fn a_key_holder_cannot_make_a_node_launch_anything() {
    use storm_cluster::messages::{Command, Heartbeat, LaunchSpec, MpiMode, Program, encode};
    if !support::root_or_say("a_key_holder_cannot_make_a_node_launch_anything") {
        return;
    }
    let c = TestCluster::with(storm_cli::local::LocalOptions {
        scheduler: storm_cluster::config::SchedulerSection {
            heartbeat_log: true,
            ..Default::default()
        },
        ..storm_cli::local::LocalOptions::new(3)
    });
    let cluster = c.cluster.as_ref().unwrap();
    let cfg = cluster.config.clone();
    let rm = storm_cluster::layout::RmLayout::new(&cfg).unwrap();
    let marker = c.root.join("pwned");
    let mm = cluster
        .daemon_pids()
        .into_iter()
        .find_map(|(n, p)| (n == "storm-mm").then_some(p))
        .unwrap();
    let hb_log = cfg.nodes[2].spool.join("heartbeats.log");
    let taken = || std::fs::read_to_string(&hb_log).unwrap_or_default();
    let since = std::time::Instant::now();
    while taken().lines().count() < 3 && since.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let stopped = StoppedUntilDropped::stop(mm);
    std::thread::sleep(Duration::from_millis(300));
    let last: u64 = taken()
        .lines()
        .last()
        .and_then(|l| l.split_whitespace().next()?.parse().ok())
        .expect("node 0 has taken heartbeats");
    let me = posing_as(&cfg, 1, None);
    let attacker_key = ed25519_dalek::SigningKey::from_bytes(&[0xee; 32]);
    let forger = storm_cluster::identity::MmSigner::new(attacker_key, &cfg.cluster.name);
    for (i, sealed) in [false, true].into_iter().enumerate() {
        // A new connection each time: node 2 takes it as node 1's, and the real node 1's
        // next connection closes it.
        let mut peer = RawPeer::connect(cfg.nodes[2].address, 2, &me).unwrap();
        let seq = last + 1 + i as u64;
        let launch = Command::Launch(LaunchSpec {
            job: 999,
            slot: 0,
            nodes: NodeSet::single(2),
            ntasks: 1,
            program: Program::Path("/bin/sh".into()),
            program_hash: None,
            args: vec!["-c".into(), format!("id -u > {}", marker.display()).into()],
            env: vec![],
            cwd: "/".into(),
            uid: 0,
            gid: 0,
            reporter: 2,
            mpi: MpiMode::None,
            input: Default::default(),
            batch: None,
            mem: None,
            kill_on_bad_exit: false,
            exit_wait_s: 0,
            cpu_bind: Default::default(),
            cpus: None,
        });
        let mut hb = Heartbeat {
            seq,
            commands: vec![launch],
            seal: None,
        };
        if sealed {
            // Whatever incarnation the node holds, this key is not the MM's.
            hb.seal = forger.seal_commands(0, seq, &hb.commands, storm_cluster::daemon::unix_ms());
        }
        let payload = encode("heartbeat", &hb, cfg.cluster.heartbeat_bytes).unwrap();
        let absolute = storm_primitives::helpers::epoch_base(1) + seq;
        let mut image = (payload.len() as u64).to_le_bytes().to_vec();
        image.extend(absolute.to_le_bytes());
        image.extend(&payload);
        let slot = (seq % rm.heartbeat.slot_count as u64) as usize;
        let op = OpKey {
            origin: cfg.mm_id(),
            seq: u64::MAX / 2 + i as u64,
        };
        // From the MM down the chain 0, 1, 2: node 1 relays to node 2.
        peer.send_control(&Control::Xfer(XferMsg::Begin(XferBegin {
            key: op,
            dest: "0-2".parse().unwrap(),
            fanout: 1,
            offset: rm.heartbeat.slot_offset(slot),
            len: image.len() as u64,
            remote_event: Some(rm.heartbeat.arrived.index() as u32),
            timeout_ms: 5000,
            on_arrival: true,
        })))
        .unwrap();
        // Node 2 answers its parent (this connection); nothing is read here.
        peer.send(&OutFrame::data(op, 0, bytes::Bytes::from(image)))
            .unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let log = || std::fs::read_to_string(c.root.join("node2.log")).unwrap_or_default();
    let since = std::time::Instant::now();
    while log().matches("refusing a heartbeat's commands").count() < 2
        && since.elapsed() < Duration::from_secs(10)
    {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(500));
    let ran = marker.exists();
    drop(stopped);
    assert!(
        !ran,
        "node 2 launched the key holder's command as uid {}",
        std::fs::read_to_string(&marker).unwrap_or_default()
    );
    let refusals = log();
    assert!(
        refusals.contains("without the MM's seal") && refusals.contains("did not make"),
        "node 2 says why it refused both:\n{refusals}"
    );
    // The forged entries took node 2's places in the heartbeat's order (a node claiming to
    // relay can always disturb the nodes it relays to; docs/security.md): a restarted node 2
    // joins again, and the cluster runs jobs on every node.
    let mut c = c;
    let cluster = c.cluster.as_mut().unwrap();
    cluster.kill_nm(2).unwrap();
    cluster.restart_nm(2).unwrap();
    let out = c.submit(&["-N", "3", "/bin/echo", "still here"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).matches("still here").count(), 3);
}

/// Issue 31, a compromised compute node impersonates nobody at the MM. Root on node 0 has the
/// cluster key and node 0's identity key, not node 1's. Claiming node 1 it is refused (it
/// cannot sign as node 1); as node 0 it is taken, but its write into node 1's report area (a
/// forged "node 1's tasks ended") is refused. The MM says why each time, and runs jobs on both
/// nodes after.
#[test]
fn a_compromised_node_impersonates_nobody_at_the_mm() {
    let c = TestCluster::start(2);
    let cfg = c.cluster.as_ref().unwrap().config.clone();
    let rm = storm_cluster::layout::RmLayout::new(&cfg).unwrap();
    let own = cfg.load_node_key("node0").unwrap();
    let me = |node| posing_as(&cfg, node, Some(own.clone()));
    let mm = cfg.mm_id();
    let log = || std::fs::read_to_string(c.root.join("mm.log")).unwrap_or_default();
    let wait_for = |text: &str| {
        let since = std::time::Instant::now();
        while !log().contains(text) && since.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(50));
        }
        log().contains(text)
    };
    assert!(
        RawPeer::connect(cfg.mm.address, mm, &me(1)).is_err(),
        "the MM took node 0's key for node 1"
    );
    assert!(
        wait_for("a peer claiming node 1 did not prove its identity"),
        "{}",
        log()
    );
    // Node 0's own NM is connected too: the MM takes the newer connection, and the real NM,
    // finding its link gone, connects again and may replace this one before the write is
    // read (seen in CI). The forged write is sent again on a new connection until the MM
    // has read it: what is checked is that it refuses it, whenever it reads it.
    let wait_a_while = |text: &str| {
        let since = std::time::Instant::now();
        while !log().contains(text) && since.elapsed() < Duration::from_secs(2) {
            std::thread::sleep(Duration::from_millis(50));
        }
        log().contains(text)
    };
    let mut refused = false;
    for attempt in 0..5u64 {
        let mut peer = RawPeer::connect(cfg.mm.address, mm, &me(0)).expect("node 0 as itself");
        let op = OpKey {
            origin: 0,
            seq: u64::MAX / 2 + attempt,
        };
        peer.send_control(&Control::Xfer(XferMsg::Begin(XferBegin {
            key: op,
            dest: NodeSet::single(mm),
            fanout: 2,
            offset: rm.report_offset(0, 1),
            len: 8,
            remote_event: Some(rm.term_event.index() as u32),
            timeout_ms: 5000,
            on_arrival: false,
        })))
        .unwrap();
        refused = wait_a_while("node 0 may not write 8 bytes");
        drop(peer);
        if refused {
            break;
        }
    }
    assert!(
        refused,
        "the MM refuses node 0's write into node 1's report:\n{}",
        log()
    );
    let out = c.submit(&["-N", "2", "/bin/echo", "still here"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout).matches("still here").count(), 2);
}

fn daemon_pid(c: &TestCluster, name: &str) -> i32 {
    c.daemon_pid(name) as i32
}

fn sighup(pid: i32) {
    // SAFETY: signalling a daemon of this test's own cluster.
    unsafe { libc::kill(pid, libc::SIGHUP) };
}

fn wait_log(path: &Path, text: &str, count: usize) -> bool {
    let since = std::time::Instant::now();
    loop {
        let n = std::fs::read_to_string(path)
            .unwrap_or_default()
            .matches(text)
            .count();
        if n >= count {
            return true;
        }
        if since.elapsed() > Duration::from_secs(15) {
            return false;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Finding 2 of issue 31: running daemons never looked at their key files again, so after a
/// `chmod 644` a user copied the cluster key. Now each daemon looks again every
/// `key_check_interval_s` (1 s here) and on SIGHUP: the file is made private again, and the
/// daemon says the key must be rotated.
#[test]
fn a_key_file_exposed_while_the_daemons_run_is_made_private_again() {
    use std::os::unix::fs::PermissionsExt;
    let c = TestCluster::with(storm_cli::local::LocalOptions {
        security: storm_cluster::config::SecuritySection {
            key_check_interval_s: 1,
            ..Default::default()
        },
        ..storm_cli::local::LocalOptions::new(1)
    });
    let key = c.root.join("storm.key");
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    // The MM and the NM read the same file here: whichever looks first makes it private.
    let logs = || {
        ["mm.log", "node0.log"]
            .iter()
            .map(|l| std::fs::read_to_string(c.root.join(l)).unwrap_or_default())
            .collect::<String>()
    };
    let since = std::time::Instant::now();
    while !logs().contains("could be read by others") && since.elapsed() < Duration::from_secs(15) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let log = logs();
    assert!(log.contains("could be read by others"), "no daemon noticed");
    let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600, "the key file is private again");
    assert!(log.contains("rotate it"), "{log}");
}

/// Issue 61, N2b: with the default look every 60 s, a key file made readable stayed so for up
/// to a minute unless the daemon got SIGHUP (anyone could copy it meanwhile). Now the daemons
/// follow their key files' directories and make an exposed one private again at once: here
/// within two seconds, with the timer a minute away.
#[test]
fn a_key_file_exposed_is_made_private_again_at_once_not_at_the_next_look() {
    use std::os::unix::fs::PermissionsExt;
    let c = TestCluster::start(1);
    let key = c.root.join("storm.key");
    // The daemons are up and watching.
    assert!(c.submit(&["/bin/true"]).status.success());
    std::fs::set_permissions(&key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let since = std::time::Instant::now();
    let mode = || std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
    while mode() != 0o600 && since.elapsed() < Duration::from_secs(2) {
        std::thread::sleep(Duration::from_millis(5));
    }
    assert_eq!(
        mode(),
        0o600,
        "the key file stayed readable by others for {:?} (the next timed look is 60 s away)",
        since.elapsed()
    );
}

/// Keys are rotated without a restart and without harming a running job: the MM's signing
/// key (its new public key beside the old on the nodes, SIGHUP to the nodes, the new secret
/// key on the MM, SIGHUP to the MM, the old public key removed) and node 1's identity key
/// (`storm enroll --replace`, SIGHUP to the MM, the new key on the node, SIGHUP to the node).
/// Jobs run at every step; after the MM restarts (every node shakes hands again) node 1
/// rejoins with its new key, and its old one is refused.
#[test]
fn the_mms_key_and_a_nodes_key_are_rotated_without_a_restart() {
    use storm_cluster::identity;
    let mut c = TestCluster::with(storm_cli::local::LocalOptions {
        cpus: Some(support::TEST_CPUS),
        log_filter: Some("info".into()),
        ..storm_cli::local::LocalOptions::new(2)
    });
    let cfg = c.cluster.as_ref().unwrap().config.clone();
    let (mm, nm0, nm1) = (
        daemon_pid(&c, "storm-mm"),
        daemon_pid(&c, "storm-nm node0"),
        daemon_pid(&c, "storm-nm node1"),
    );
    let running = c.spawn(&["-N", "2", "/bin/sh", "-c", "sleep 4; echo survived"]);
    let job = |c: &TestCluster| {
        let out = c.submit(&["-N", "2", "-n", "2", "/bin/echo", "ran"]);
        assert!(out.status.success(), "{}", text(&out.stderr));
        assert_eq!(text(&out.stdout).matches("ran").count(), 2);
    };
    // The MM's key.
    let (secret, public) = cfg.mm_key_paths();
    let new_secret = secret.with_extension("new");
    let new_public = identity::generate(&new_secret, storm_cluster::key::MM_KEY).unwrap();
    let old_public = std::fs::read_to_string(&public).unwrap();
    std::fs::write(
        &public,
        format!("{old_public}{}\n", identity::public_hex(&new_public)),
    )
    .unwrap();
    sighup(nm0);
    sighup(nm1);
    for n in ["node0.log", "node1.log"] {
        assert!(wait_log(
            &c.root.join(n),
            "read the MM's public keys again",
            1
        ));
    }
    std::fs::rename(&new_secret, &secret).unwrap();
    sighup(mm);
    assert!(wait_log(
        &c.root.join("mm.log"),
        &identity::public_hex(&new_public),
        1
    ));
    job(&c);
    std::fs::write(&public, format!("{}\n", identity::public_hex(&new_public))).unwrap();
    sighup(nm0);
    sighup(nm1);
    for n in ["node0.log", "node1.log"] {
        assert!(wait_log(
            &c.root.join(n),
            "read the MM's public keys again",
            2
        ));
    }
    job(&c);
    // Node 1's key.
    let node1 = cfg.node_key_path("node1");
    let old_node1 = cfg.load_node_key("node1").unwrap();
    let fresh = node1.with_extension("new");
    let new_node1 = identity::generate(&fresh, storm_cluster::key::NODE_KEY).unwrap();
    let enroll = std::process::Command::new(env!("CARGO_BIN_EXE_storm"))
        .arg("--config")
        .arg(c.root.join("cluster.toml"))
        .args([
            "enroll",
            "--replace",
            "node1",
            &identity::public_hex(&new_node1),
        ])
        .output()
        .unwrap();
    assert!(enroll.status.success(), "{}", text(&enroll.stderr));
    sighup(mm);
    assert!(wait_log(
        &c.root.join("mm.log"),
        "read the enrolled nodes' keys again",
        2
    ));
    std::fs::rename(&fresh, &node1).unwrap();
    sighup(nm1);
    assert!(wait_log(
        &c.root.join("node1.log"),
        "read this node's identity key again",
        2
    ));
    job(&c);
    let out = running.wait_with_output().unwrap();
    assert!(
        out.status.success() && text(&out.stdout).matches("survived").count() == 2,
        "the job that ran through the rotation: {}",
        text(&out.stderr)
    );
    // Every node shakes hands with a restarted MM: node 1 with its new key.
    let cluster = c.cluster.as_mut().unwrap();
    cluster.kill_mm().unwrap();
    cluster.restart_mm().unwrap();
    let since = std::time::Instant::now();
    loop {
        let nodes = c.storm(&["nodes"]);
        let listing = text(&nodes.stdout);
        if nodes.status.success() && listing.matches("idle").count() == 2 {
            break;
        }
        assert!(
            since.elapsed() < Duration::from_secs(30),
            "the nodes did not rejoin the restarted MM: {listing}{}",
            text(&nodes.stderr)
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    job(&c);
    let rm = storm_cluster::layout::RmLayout::new(&cfg).unwrap();
    let old = Membership {
        node: 1,
        cluster_size: cfg.node_count() + 1,
        layout: rm.layout.clone(),
        key: cfg.load_key().unwrap(),
        protection: cfg.protection(),
        identity: Some(old_node1),
    };
    assert!(
        RawPeer::connect(cfg.mm.address, cfg.mm_id(), &old).is_err(),
        "node 1's old key is still taken"
    );
}

/// Issue 61, L4: `mm.pub` says whose seals a node obeys. Left writable by others (mode
/// 0666), a local user (`nobody`) appends a key of their own, and the node manager is told to
/// read its keys again (SIGHUP, as in a rotation). Before, any owner and mode were taken, and
/// the user's key would have been the MM's to that node. Now the node refuses the file,
/// saying why, keeps the keys it had, and the cluster runs on.
#[test]
fn a_public_key_file_others_may_write_is_not_trusted() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let test = "a_public_key_file_others_may_write_is_not_trusted";
    if !support::root_or_say(test) {
        return;
    }
    let c = TestCluster::with(storm_cli::local::LocalOptions {
        cpus: Some(support::TEST_CPUS),
        log_filter: Some("info".into()),
        ..storm_cli::local::LocalOptions::new(1)
    });
    let cfg = c.cluster.as_ref().unwrap().config.clone();
    let (_, public) = cfg.mm_key_paths();
    std::fs::set_permissions(&public, std::fs::Permissions::from_mode(0o666)).unwrap();
    let theirs = storm_cluster::identity::public_hex(
        &ed25519_dalek::SigningKey::from_bytes(&[9; 32]).verifying_key(),
    );
    let appended = std::process::Command::new("sh")
        .args(["-c", &format!("echo {theirs} >> '{}'", public.display())])
        .uid(support::NOBODY)
        .gid(support::NOBODY)
        .status()
        .unwrap();
    assert!(
        appended.success(),
        "nobody can write the file, as the test sets it"
    );
    sighup(daemon_pid(&c, "storm-nm node0"));
    let log = c.root.join("node0.log");
    assert!(
        wait_log(&log, "can be written by other users", 1),
        "{}",
        std::fs::read_to_string(&log).unwrap_or_default()
    );
    assert!(
        !std::fs::read_to_string(&log)
            .unwrap_or_default()
            .contains("read the MM's public keys again"),
        "the node took a public key file others may write"
    );
    let out = c.submit(&["/bin/echo", "still obeys its MM"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
