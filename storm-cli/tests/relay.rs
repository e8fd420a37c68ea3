//! The control relay, seen from outside, on a namespace testbed (each node and the MM in a
//! network namespace of their own, joined by a bridge): users on a node that cannot see the
//! MM's Unix socket run jobs and commands through their node's relay; a batch script's
//! steps reach the MM through it; and the relay refuses what it must: a peer without the
//! cluster key, a peer without the identity of the node it claims to be, root of a node
//! acting for the cluster, a user who greets the MM as a relay, and garbage on its port.

mod support;

use std::net::{SocketAddr, TcpStream};
use std::os::unix::net::UnixStream;
use std::process::Command;
use std::time::Duration;

use storm_cli::relay::wire::WireError;
use storm_cli::testbed::Testbed;
use storm_cluster::control::{self, PROTOCOL_VERSION, Reply, Request};
use storm_primitives::tcp::auth::ClusterKey;
use support::handshake::relay_as;
use support::testbed::{can_run, in_node_ns, up, up_group};
use support::{NOBODY, bin_dir, root_or_say, script, shared_tempdir, text};

/// A command run in node `node`'s namespace as user nobody, whose view of the files has no
/// MM socket: it is covered by `/dev/null` in a mount namespace of its own, as on a compute
/// node of a real cluster.
fn on_node_as_nobody(tb: &Testbed, node: u32, program: &str, args: &[&str]) -> Command {
    // Every MM control socket there is (a replicated MM's leader's, and any left behind).
    let sockets: Vec<String> = tb
        .config
        .control_sockets()
        .iter()
        .map(|s| format!("'{}'", s.display()))
        .collect();
    let hide = format!(
        "for s in {}; do if [ -e \"$s\" ]; then mount --bind /dev/null \"$s\" || exit 1; fi; \
         done; exec setpriv --reuid={NOBODY} --regid={NOBODY} --clear-groups -- \"$@\"",
        sockets.join(" ")
    );
    let mut c = Command::new("ip");
    c.args([
        "netns",
        "exec",
        &tb.node_ns(node),
        "unshare",
        "-m",
        "sh",
        "-c",
    ])
    .arg(hide)
    .arg("sh")
    .arg(bin_dir().join(program))
    .args(args);
    c
}

#[test]
fn a_user_on_a_node_without_the_mm_socket_runs_jobs_through_its_relay() {
    let test = "a_user_on_a_node_without_the_mm_socket_runs_jobs_through_its_relay";
    if !can_run(test) || !root_or_say(test) {
        return;
    }
    let work = shared_tempdir();
    let tb = up(2, work.path());
    let relay = tb.relay_socket(1).display().to_string();

    // The MM's socket is out of reach there: without the relay nothing works.
    let direct = on_node_as_nobody(
        &tb,
        1,
        "storm",
        &["--config", &tb.config_path.display().to_string(), "queue"],
    )
    .output()
    .unwrap();
    assert!(
        !direct.status.success(),
        "the MM's own socket is hidden on the node: {}",
        text(&direct.stdout)
    );

    // Through the relay: a job of two ranks, as the user who asked, on both nodes.
    let out = on_node_as_nobody(
        &tb,
        1,
        "storm-submit",
        &[
            "--socket",
            &relay,
            "-N",
            "2",
            "sh",
            "-c",
            "echo $(id -u) $STORM_NODENAME",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        support::testbed::logs(&tb)
    );
    let mut lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    lines.sort();
    assert_eq!(
        lines,
        [format!("{NOBODY} node0"), format!("{NOBODY} node1")]
    );

    // A script that reads a file next to itself, on a path every node sees: the relay
    // carries its descriptor as bytes and stamp, so the MM finds it in place and it runs
    // from its own path.
    let shared = work.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::write(shared.join("data"), "payload\n").unwrap();
    let s = script(
        &shared,
        "reads-beside.sh",
        "echo \"$0 $(cat \"$(dirname \"$0\")/data\")\"\n",
    );
    let out = on_node_as_nobody(
        &tb,
        1,
        "storm-submit",
        &["--socket", &relay, "-N", "2", s.to_str().unwrap()],
    )
    .output()
    .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        text(&out.stdout),
        format!("{0} payload\n{0} payload\n", s.display()),
        "ran in place, from its own path"
    );

    // Root of the node is an ordinary user of the cluster there: no new jobs as root, no
    // drains.
    let as_root = |program: &str, args: &[&str]| {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &tb.node_ns(1)])
            .arg(bin_dir().join(program))
            .args(["--socket", &relay])
            .args(args);
        c.output().unwrap()
    };
    for out in [
        as_root("storm-submit", &["id", "-u"]),
        as_root("storm", &["drain", "node0", "--reason", "from a node"]),
    ] {
        assert!(!out.status.success());
        let err = text(&out.stderr);
        assert!(err.contains("root_from_nodes"), "{err}");
    }
    let nodes = support::testbed::nodes(tb.socket());
    assert!(
        nodes
            .iter()
            .all(|n| n.state == storm_cluster::control::NodeState::Idle),
        "nothing was drained: {nodes:?}"
    );

    // `storm queue` and `storm history` answer there too, naming the user.
    let out = on_node_as_nobody(&tb, 1, "storm", &["--socket", &relay, "history"])
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert!(
        text(&out.stdout).contains("nobody"),
        "{}",
        text(&out.stdout)
    );
}

/// A replicated MM has a manager-side relay beside each replica, and a node's relay tries
/// them in turn: only the leader's takes a user's connection. Users on a node go on working
/// through their relay when the leader is killed (its relay stays up, as on a host whose MM
/// crashed, and says it has no MM): a job followed through the relay across the failover
/// delivers every line of both ranks once and in order, and the next job runs.
#[test]
fn users_on_a_node_follow_a_failover_of_a_replicated_mm_through_their_relay() {
    let test = "users_on_a_node_follow_a_failover_of_a_replicated_mm_through_their_relay";
    if !can_run(test) || !root_or_say(test) {
        return;
    }
    let work = shared_tempdir();
    let mut tb = up_group(2, work.path());
    let relay = tb.relay_socket(1).display().to_string();
    let leader = tb.leader().expect("a leader");
    let counter = support::counter_script(work.path(), 40);
    let log = work.path().join("submit.log");
    let running = on_node_as_nobody(
        &tb,
        1,
        "storm-submit",
        &[
            "--socket",
            &relay,
            "-N",
            "2",
            "-l",
            "--reconnect",
            "60",
            &counter,
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::fs::File::create(&log).unwrap())
    .spawn()
    .unwrap();
    support::wait_for_text(&log, "tick 5", Duration::from_secs(20));
    tb.kill(&format!("storm-mm {leader}")).unwrap();
    support::wait_new_leader(&leader, || tb.leader());
    let out = on_node_as_nobody(
        &tb,
        1,
        "storm-submit",
        &[
            "--socket",
            &relay,
            "-N",
            "2",
            "sh",
            "-c",
            "echo $(id -u) after",
        ],
    )
    .output()
    .unwrap();
    assert!(
        out.status.success(),
        "{}\n{}",
        text(&out.stderr),
        support::testbed::logs(&tb)
    );
    assert_eq!(
        text(&out.stdout),
        format!("{NOBODY} after\n{NOBODY} after\n")
    );
    support::assert_counter_job_whole(running, 2, 40, &log);
    tb.down().unwrap();
}

#[test]
fn a_batch_scripts_steps_reach_the_mm_through_its_nodes_relay() {
    let test = "a_batch_scripts_steps_reach_the_mm_through_its_nodes_relay";
    if !can_run(test) || !root_or_say(test) {
        return;
    }
    let work = shared_tempdir();
    let mut tb = up(2, work.path());
    let submit = bin_dir().join("storm-submit");
    let body = format!(
        "#STORM -N 2\necho socket=$STORM_SOCKET\n{} -N 2 sh -c 'echo step $(id -u) $STORM_NODENAME'\necho step rc=$?\n",
        submit.display()
    );
    let config = tb.config_path.clone();
    let batch = |name: &str| {
        let s = script(work.path(), name, &body);
        let out = Command::new("setpriv")
            .arg(format!("--reuid={NOBODY}"))
            .arg(format!("--regid={NOBODY}"))
            .args(["--clear-groups", "--"])
            .arg(bin_dir().join("storm"))
            .arg("--config")
            .arg(&config)
            .args(["batch", "--wait", "-o"])
            .arg(work.path().join(format!("{name}.out")))
            .arg(&s)
            .current_dir(work.path())
            .output()
            .unwrap();
        let said =
            std::fs::read_to_string(work.path().join(format!("{name}.out"))).unwrap_or_default();
        (out, said)
    };
    let (out, said) = batch("steps");
    assert!(out.status.success(), "{}\n{}", text(&out.stderr), said);
    assert!(
        said.contains(&format!("socket={}", tb.relay_socket(0).display())),
        "the script's node gives it its relay: {said}"
    );
    assert!(said.contains(&format!("step {NOBODY} node0")), "{said}");
    assert!(said.contains(&format!("step {NOBODY} node1")), "{said}");
    assert!(said.contains("step rc=0"), "{said}");

    // Root's batch job runs steps in its own allocation through the relay as well (root of
    // a node may not start new jobs through it, but a step is part of root's job).
    let s = script(work.path(), "as-root", &body);
    let out = Command::new(bin_dir().join("storm"))
        .arg("--config")
        .arg(&config)
        .args(["batch", "--wait", "-o"])
        .arg(work.path().join("as-root.out"))
        .arg(&s)
        .output()
        .unwrap();
    let said = std::fs::read_to_string(work.path().join("as-root.out")).unwrap_or_default();
    assert!(out.status.success(), "{}\n{said}", text(&out.stderr));
    assert!(
        said.contains("step 0 node1") && said.contains("step rc=0"),
        "{said}"
    );

    // Without the manager side of the relay, the step has no way to the MM, and says so: the
    // steps went through the relay, not around it.
    tb.kill("storm-relay manager").unwrap();
    let (_, said) = batch("cut");
    assert!(
        said.contains("cannot reach the machine manager's relay"),
        "{said}"
    );
    assert!(!said.contains("step rc=0"), "{said}");
}

/// The manager side's address, and the cluster's key and node 1's identity key.
fn relay_keys(tb: &Testbed) -> (SocketAddr, ClusterKey, ed25519_dalek::SigningKey) {
    let cfg = storm_cluster::ClusterConfig::load(&tb.config_path).unwrap();
    (
        cfg.relay.address.unwrap(),
        cfg.load_key().unwrap(),
        cfg.load_node_key("node1").unwrap(),
    )
}

#[test]
fn the_relay_refuses_peers_without_the_key_or_the_nodes_identity_and_roots_orders() {
    let test = "the_relay_refuses_peers_without_the_key_or_the_nodes_identity_and_roots_orders";
    if !can_run(test) || !root_or_say(test) {
        return;
    }
    let work = shared_tempdir();
    let tb = up(2, work.path());
    let (addr, key, identity) = relay_keys(&tb);

    // The real node's keys, for an ordinary user: the MM greets them.
    let (k, i) = (key.clone(), identity.clone());
    let reply = in_node_ns(&tb, 1, move || {
        relay_as(addr, (1, 2), k, i, NOBODY, Some(Request::Queue))
    });
    assert!(
        matches!(reply.as_deref(), Ok([Reply::Hello { .. }, Reply::Queue(_)])),
        "{reply:?}"
    );

    // Another cluster's key: the node side finds out at once, and nothing reaches the MM.
    let i = identity.clone();
    let reply = in_node_ns(&tb, 1, move || {
        relay_as(addr, (1, 2), ClusterKey::random(), i, NOBODY, None)
    });
    let err = reply
        .expect_err("a wrong cluster key is refused")
        .to_string();
    assert!(err.contains("does not hold this cluster's key"), "{err}");

    // The cluster's key but not node 1's identity key: the manager side hangs up before
    // any request, and says why in its log.
    let k = key.clone();
    let forged = ed25519_dalek::SigningKey::from_bytes(&[7; 32]);
    let reply = in_node_ns(&tb, 1, move || {
        relay_as(addr, (1, 2), k, forged, NOBODY, None)
    });
    // (Closed, or reset: the manager side closed with the node's first frame unread.)
    assert!(
        matches!(reply, Err(WireError::Closed | WireError::Io(_))),
        "{reply:?}"
    );
    let log = std::fs::read_to_string(tb.dir.join("storm-relay-manager.log")).unwrap();
    assert!(log.contains("did not prove its identity"), "{log}");

    // Root of a node is not root of the cluster: greeted, but refused an operator's request.
    let (k, i) = (key.clone(), identity.clone());
    let drain = Request::Drain {
        nodes: storm_primitives::NodeSet::single(0),
        reason: "relayed".into(),
    };
    let reply = in_node_ns(&tb, 1, move || relay_as(addr, (1, 2), k, i, 0, Some(drain)));
    match reply.as_deref() {
        Ok([Reply::Hello { .. }, Reply::Error(e)]) => assert!(e.contains("root_from_nodes"), "{e}"),
        other => panic!("root through the relay: {other:?}"),
    }

    // Garbage on the port: the link is dropped, and the relay goes on serving.
    in_node_ns(&tb, 1, move || {
        use std::io::{Read, Write};
        let mut tcp = TcpStream::connect(addr).unwrap();
        tcp.set_read_timeout(Some(Duration::from_secs(15))).unwrap();
        tcp.write_all(&[0xff; 4096]).unwrap();
        let mut buf = [0u8; 16];
        assert!(matches!(tcp.read(&mut buf), Ok(0) | Err(_)), "dropped");
    });
    let reply = in_node_ns(&tb, 1, move || {
        relay_as(addr, (1, 2), key, identity, NOBODY, None)
    });
    assert!(
        matches!(reply.as_deref(), Ok([Reply::Hello { .. }])),
        "{reply:?}"
    );
}

#[test]
fn a_user_who_greets_the_mm_as_a_relay_is_refused() {
    let test = "a_user_who_greets_the_mm_as_a_relay_is_refused";
    if !can_run(test) || !root_or_say(test) {
        return;
    }
    let work = shared_tempdir();
    let tb = up(1, work.path());
    let socket = tb.socket().to_path_buf();
    // On a thread of its own that runs as nobody (the kernel takes a socket's credentials
    // from the thread that connects).
    let reply = std::thread::spawn(move || {
        // SAFETY: raw setresgid/setresuid change this thread's credentials only.
        unsafe {
            assert_eq!(
                libc::syscall(libc::SYS_setresgid, NOBODY, NOBODY, NOBODY),
                0
            );
            assert_eq!(
                libc::syscall(libc::SYS_setresuid, NOBODY, NOBODY, NOBODY),
                0
            );
        }
        let sock = UnixStream::connect(&socket).unwrap();
        let hello = Request::RelayHello {
            version: PROTOCOL_VERSION,
            uid: 0,
            gid: 0,
            node: "node0".into(),
        };
        control::send(&sock, &hello, None).unwrap();
        control::recv::<Reply>(&sock).unwrap().0
    })
    .join()
    .unwrap();
    match reply {
        Reply::Error(e) => assert!(e.contains("only a control relay running as root"), "{e}"),
        other => panic!("a user acted as a relay: {other:?}"),
    }
}

/// Waits up to 15 s for `path` to say `text` at least `count` times.
fn wait_log(path: &std::path::Path, text: &str, count: usize) -> bool {
    let since = std::time::Instant::now();
    while since.elapsed() < Duration::from_secs(15) {
        let n = std::fs::read_to_string(path)
            .unwrap_or_default()
            .matches(text)
            .count();
        if n >= count {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    false
}

/// Issue 61, L3: a node's identity key rotated as docs/security.md says (a new key enrolled
/// with `storm enroll --replace`, the MM's side told with SIGHUP, the new key moved over the
/// old and the node's daemons told with SIGHUP). The node-side relay died on SIGHUP, and
/// would have kept the old key: that node's users were locked out. Now it reads the key
/// again, and a user's next command through it is carried with the new one.
#[test]
fn a_nodes_relay_takes_its_rotated_key_on_sighup() {
    use storm_cluster::identity;
    let test = "a_nodes_relay_takes_its_rotated_key_on_sighup";
    if !can_run(test) || !root_or_say(test) {
        return;
    }
    let work = shared_tempdir();
    let tb = up(2, work.path());
    let relay = tb.relay_socket(1).display().to_string();
    let queue = || {
        on_node_as_nobody(&tb, 1, "storm", &["--socket", &relay, "queue"])
            .output()
            .unwrap()
    };
    assert!(queue().status.success(), "before the rotation");
    let signal = |daemon: &str| {
        let pid = tb.pid(daemon).unwrap_or_else(|| panic!("{daemon} runs"));
        // SAFETY: signalling a daemon of this test's own testbed.
        unsafe { libc::kill(pid as i32, libc::SIGHUP) };
    };
    let cfg = storm_cluster::ClusterConfig::load(&tb.config_path).unwrap();
    let key_path = cfg.node_key_path("node1");
    let fresh = key_path.with_extension("new");
    let new_key = identity::generate(&fresh, storm_cluster::key::NODE_KEY).unwrap();
    let enroll = Command::new(bin_dir().join("storm"))
        .arg("--config")
        .arg(&tb.config_path)
        .args([
            "enroll",
            "--replace",
            "node1",
            &identity::public_hex(&new_key),
        ])
        .output()
        .unwrap();
    assert!(enroll.status.success(), "{}", text(&enroll.stderr));
    signal("storm-relay manager");
    assert!(wait_log(
        &tb.dir.join("storm-relay-manager.log"),
        "read the enrolled nodes' keys again",
        1
    ));
    std::fs::rename(&fresh, &key_path).unwrap();
    signal("storm-relay node1");
    assert!(
        wait_log(
            &tb.dir.join("storm-relay-node1.log"),
            "read this node's identity key again",
            1
        ) || queue().status.success(),
        "the relay said nothing of the key"
    );
    let out = queue();
    assert!(
        out.status.success(),
        "node 1's user after the key's rotation: {}\n{}",
        text(&out.stderr),
        support::testbed::logs(&tb)
    );
}
