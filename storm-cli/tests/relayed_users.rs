//! Root of one compute node against the rest of the cluster, through the control relay
//! (issue 61, findings H2 and H3), on a namespace testbed: the attacker holds the cluster key
//! and the node's identity key, and speaks the relay's link itself, naming whatever user and
//! group it likes. What it gets is what the MM's own host says those users are:
//!
//! * a relayed job runs with its user's own group and groups from the MM host's user
//!   database, never the group the relay named (before: gid 0 or 42, `shadow`, and jobs
//!   read `/etc/shadow` on every node);
//! * system accounts below `[relay] min_uid`, and uids the MM's host does not know, are
//!   refused;
//! * a guest slot (a node another cluster lends this one, whose keys sit on the lender's
//!   node) relays nothing at all (before: root of the lending node ran jobs on the
//!   borrower's nodes as any user, lease or not);
//! * programs on their way through the relay are held on disk, not in memory, and one
//!   user's bytes in transit are bounded (M3; before: memory files of up to 64 GiB a user on
//!   the MM's host, outside any process's RSS).

mod support;

use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use storm_cli::relay::wire::{self, FRAME_LIMIT, Opened, Up, WireError};
use storm_cluster::control::{Delivery, JobRequest, PROTOCOL_VERSION, Reply, Request};
use storm_primitives::tcp::auth::ClusterKey;
use support::testbed::{can_run, in_node_ns, up_with_guest_slot, up_with_limits};
use support::{NOBODY, root_or_say, shared_tempdir, text};

/// What a relay link as node `node` (of `size`) brought, naming `uid` and `gid`.
#[derive(Debug)]
enum Relayed {
    /// The manager side refused the link, or its MM the user.
    Refused(String),
    /// The MM greeted the user; then these replies to `then`.
    Greeted(Vec<Reply>),
}

/// Opens a relay link to `addr` as node `node` with these keys (as the node's root can),
/// names `uid`/`gid`, and sends `then`; collects the MM's replies until a job it started
/// finishes (or the first reply, for a request that is not a submission).
fn relay(
    addr: SocketAddr,
    key: ClusterKey,
    identity: ed25519_dalek::SigningKey,
    (node, size): (u32, u32),
    (uid, gid): (u32, u32),
    then: Request,
) -> Result<Relayed, WireError> {
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    tcp.set_read_timeout(Some(Duration::from_secs(30)))?;
    let mut link = match wire::handshake_as_node(
        tcp.try_clone()?,
        tcp,
        &key,
        node,
        size,
        &identity,
        FRAME_LIMIT,
    ) {
        Ok(l) => l,
        Err(e) => return Ok(Relayed::Refused(e.to_string())),
    };
    link.writer.send(&Up::Open {
        uid,
        gid,
        version: PROTOCOL_VERSION,
    })?;
    match link.reader.recv::<Opened>() {
        Ok(Opened::Ready) => {}
        Ok(other) => return Ok(Relayed::Refused(format!("{other:?}"))),
        Err(e) => return Ok(Relayed::Refused(e.to_string())),
    }
    match link.reader.recv::<Reply>() {
        Ok(Reply::Hello { .. }) => {}
        Ok(Reply::Error(e)) => return Ok(Relayed::Refused(e)),
        Ok(other) => return Ok(Relayed::Refused(format!("{other:?}"))),
        Err(e) => return Ok(Relayed::Refused(e.to_string())),
    }
    let submission = matches!(then, Request::Submit(_));
    link.writer.send(&Up::Request(then))?;
    let mut replies = Vec::new();
    loop {
        let r = link.reader.recv::<Reply>()?;
        let last = !submission || matches!(r, Reply::Finished(_) | Reply::Error(_));
        replies.push(r);
        if last {
            return Ok(Relayed::Greeted(replies));
        }
    }
}

/// The standard output a job's replies carried.
fn output(replies: &[Reply]) -> String {
    replies
        .iter()
        .filter_map(|r| match r {
            Reply::Output(c) => Some(String::from_utf8_lossy(&c.data).into_owned()),
            _ => None,
        })
        .collect()
}

/// A job that says its groups and whether it can read `/etc/shadow`.
fn probe() -> Request {
    Request::Submit(Box::new(JobRequest {
        args: vec![
            "-c".into(),
            "echo gid=$(id -g) groups=$(id -G); \
             if head -c1 /etc/shadow >/dev/null 2>&1; then echo READ-SHADOW; else echo no-shadow; fi"
                .into(),
        ],
        delivery: Delivery::InPlace,
        ..JobRequest::new("probe", "/bin/sh", "/")
    }))
}

#[test]
fn root_of_a_node_acts_through_its_relay_only_as_ordinary_users_with_their_own_groups() {
    let test = "root_of_a_node_acts_through_its_relay_only_as_ordinary_users_with_their_own_groups";
    if !can_run(test) || !root_or_say(test) {
        return;
    }
    let work = shared_tempdir();
    let tb = up_with_guest_slot(2, work.path());
    let cfg = storm_cluster::ClusterConfig::load(&tb.config_path).unwrap();
    let addr = cfg.relay.address.unwrap();
    let key = cfg.load_key().unwrap();
    let size = cfg.node_count();
    let node1 = cfg.load_node_key("node1").unwrap();
    let nogroup = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(NOBODY))
        .unwrap()
        .unwrap()
        .gid
        .as_raw();

    // Named as nobody with group root (0), then shadow (42): the job has nobody's own group
    // and groups, and reads no root-group file.
    for gid in [0u32, 42] {
        let (k, i) = (key.clone(), node1.clone());
        let got = in_node_ns(&tb, 1, move || {
            relay(addr, k, i, (1, size), (NOBODY, gid), probe())
        });
        let replies = match got {
            Ok(Relayed::Greeted(r)) => r,
            other => panic!("nobody through node 1's relay: {other:?}"),
        };
        let out = output(&replies);
        assert!(
            out.contains(&format!("gid={nogroup} groups={nogroup}\n")),
            "a relay naming gid {gid} for nobody gave the job other groups than nobody's: {out:?}"
        );
        assert!(
            out.contains("no-shadow") && !out.contains("READ-SHADOW"),
            "a relayed job read /etc/shadow: {out:?}"
        );
    }

    // A system account below [relay] min_uid (daemon, uid 1), and a uid the MM's host does not
    // know: refused, saying why; nothing runs.
    for (uid, why) in [(1u32, "min_uid"), (54_321, "no account")] {
        let (k, i) = (key.clone(), node1.clone());
        let got = in_node_ns(&tb, 1, move || {
            relay(addr, k, i, (1, size), (uid, uid), probe())
        });
        match got {
            Ok(Relayed::Refused(e)) => assert!(e.contains(why), "uid {uid}: {e}"),
            other => panic!("uid {uid} through node 1's relay was not refused: {other:?}"),
        }
    }

    // The guest slot's own keys (as root of the node lending it holds them): refused at the
    // link, whatever user it names, and nothing reaches the MM.
    let slot = cfg
        .nodes
        .iter()
        .position(|n| n.name == "far-node0")
        .unwrap() as u32;
    let slot_key = cfg.load_node_key("far-node0").unwrap();
    let (k, i) = (key.clone(), slot_key);
    let got = in_node_ns(&tb, 1, move || {
        relay(addr, k, i, (slot, size), (NOBODY, NOBODY), probe())
    });
    match got {
        Ok(Relayed::Refused(_)) | Err(_) => {}
        other => panic!("a guest slot's keys relayed a user: {other:?}"),
    }
    let log = std::fs::read_to_string(tb.dir.join("storm-relay-manager.log")).unwrap();
    assert!(
        log.contains("guest slot"),
        "the relay's log says why: {log}"
    );
    // Nothing ran but the two probes.
    let hist = std::process::Command::new(env!("CARGO_BIN_EXE_storm"))
        .arg("--config")
        .arg(&tb.config_path)
        .arg("history")
        .output()
        .unwrap();
    let listed = text(&hist.stdout)
        .lines()
        .filter(|l| l.contains("probe"))
        .count();
    assert_eq!(listed, 2, "{}", text(&hist.stdout));
}

/// Opens a relay link as node 1 naming nobody, and announces a program of `size` bytes,
/// of which it sends `sent`; returns the link (held open) and the first reply after the
/// MM's greeting that arrived within `wait`, if any.
fn announce_program(
    addr: SocketAddr,
    key: ClusterKey,
    identity: ed25519_dalek::SigningKey,
    size: u32,
    (size_bytes, sent): (u64, usize),
    wait: Duration,
) -> (wire::Link<TcpStream, TcpStream>, Option<Reply>) {
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5)).unwrap();
    let ctl = tcp.try_clone().unwrap();
    let mut link = wire::handshake_as_node(
        tcp.try_clone().unwrap(),
        tcp,
        &key,
        1,
        size,
        &identity,
        FRAME_LIMIT,
    )
    .unwrap();
    link.writer
        .send(&Up::Open {
            uid: NOBODY,
            gid: NOBODY,
            version: PROTOCOL_VERSION,
        })
        .unwrap();
    assert_eq!(link.reader.recv::<Opened>().unwrap(), Opened::Ready);
    assert!(matches!(
        link.reader.recv::<Reply>().unwrap(),
        Reply::Hello { .. }
    ));
    link.writer
        .send(&Up::Program {
            stamp: storm_cluster::messages::ProgramStamp {
                size: size_bytes,
                mtime_s: 0,
                mtime_ns: 0,
                mode: 0o755,
            },
            regular: true,
        })
        .unwrap();
    let chunk = vec![0u8; 1 << 20];
    for _ in 0..sent >> 20 {
        if link.writer.send(&Up::Chunk(chunk.clone())).is_err() {
            break;
        }
    }
    ctl.set_read_timeout(Some(wait)).unwrap();
    let reply = link.reader.recv::<Reply>().ok();
    (link, reply)
}

/// M3. Root of node 1, as nobody, starts sending a 40 MiB program and holds it half sent; a
/// second program of 40 MiB from the same user is refused at once, naming the limit (64 MiB
/// here), while the first is held in a file without a name on disk, not in a memory file.
/// Once the first link goes, the user's bytes are free again.
#[test]
fn a_relayed_users_programs_in_transit_are_bounded_and_on_disk() {
    let test = "a_relayed_users_programs_in_transit_are_bounded_and_on_disk";
    if !can_run(test) || !root_or_say(test) {
        return;
    }
    let work = shared_tempdir();
    let tb = up_with_limits(
        2,
        work.path(),
        storm_cluster::config::LimitsSection {
            max_spooled_bytes_per_user: 64 << 20,
            ..Default::default()
        },
    );
    let cfg = storm_cluster::ClusterConfig::load(&tb.config_path).unwrap();
    let addr = cfg.relay.address.unwrap();
    let (key, node1, size) = (
        cfg.load_key().unwrap(),
        cfg.load_node_key("node1").unwrap(),
        cfg.node_count(),
    );
    let (k, i) = (key.clone(), node1.clone());
    let (first, said) = in_node_ns(&tb, 1, move || {
        announce_program(
            addr,
            k,
            i,
            size,
            (40 << 20, 20 << 20),
            Duration::from_millis(500),
        )
    });
    assert!(said.is_none(), "the first program is taken: {said:?}");
    // What the relay holds it in: a file without a name in its directory, not memory.
    let relay = tb
        .pid("storm-relay manager")
        .expect("the manager-side relay runs");
    let held: Vec<String> = std::fs::read_dir(format!("/proc/{relay}/fd"))
        .unwrap()
        .flatten()
        .filter_map(|e| std::fs::read_link(e.path()).ok())
        .map(|p| p.display().to_string())
        .collect();
    assert!(
        !held.iter().any(|p| p.contains("memfd:")),
        "the relay holds a program in memory: {held:?}"
    );
    assert!(
        held.iter().any(|p| p.contains("relayed-programs")),
        "the relay holds the program on disk: {held:?}"
    );
    let (k, i) = (key.clone(), node1.clone());
    let (_second, said) = in_node_ns(&tb, 1, move || {
        announce_program(addr, k, i, size, (40 << 20, 0), Duration::from_secs(5))
    });
    match said {
        Some(Reply::Error(e)) => assert!(e.contains("max_spooled_bytes_per_user"), "{e}"),
        other => panic!("a second 40 MiB in transit past a 64 MiB bound: {other:?}"),
    }
    drop(first);
    std::thread::sleep(Duration::from_millis(500));
    let (_third, said) = in_node_ns(&tb, 1, move || {
        announce_program(
            addr,
            key,
            node1,
            size,
            (40 << 20, 0),
            Duration::from_millis(500),
        )
    });
    assert!(
        said.is_none(),
        "the bytes of a link gone are free again: {said:?}"
    );
}
