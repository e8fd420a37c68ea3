//! The tcp backend against peers that misbehave: unreachable, silent, or built for another
//! cluster. Each fails the operation within the configured bound and says why.
//!
//! Why this file is over 1,000 lines: one test binary. Every integration-test binary links the
//! crate anew, so the misbehaving-peer tests share one, and its fake peers.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use bytes::Bytes;
use storm_primitives::conformance::{TestLayout, test_layout};
use storm_primitives::tcp::auth::{Protection, Transcript};
use storm_primitives::tcp::peer::{Membership, RawPeer};
use storm_primitives::tcp::wire::{
    CawMsg, CawRequest, Control, Frame, OpKey, OutFrame, XferBegin, XferMsg, read_frame,
};
use storm_primitives::tcp::{TcpConfig, TcpNode};
use storm_primitives::{Layout, NodeSet, PrimError, Primitives, Relation, Wait};

fn config(timeout_ms: u64) -> TcpConfig {
    TcpConfig {
        op_timeout: Duration::from_millis(timeout_ms),
        connect_timeout: Duration::from_millis(300),
        ..TcpConfig::default()
    }
}

/// Starts nodes 0..n-1 in this process, with node `n` reached at `extra`.
fn cluster_with(n: u32, extra: SocketAddr, layout: &Layout, cfg: &TcpConfig) -> Vec<TcpNode> {
    let listeners: Vec<_> = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let mut dir: Vec<Option<SocketAddr>> = listeners.iter().map(|l| l.local_addr().ok()).collect();
    dir.push(Some(extra));
    listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            TcpNode::start(i as u32, l, dir.clone(), layout.clone(), cfg.clone()).unwrap()
        })
        .collect()
}

fn outcome(node: &TcpNode, ev: storm_primitives::EventId) -> Result<bool, PrimError> {
    node.test_event(ev, Wait::Timeout(Duration::from_secs(30)))
}

/// Real nodes 1..=n in this process, with node 0 left to the test to drive by hand: the
/// nodes, and what node 0 needs to connect to node `i` (`connect(i)`).
struct HandDriven {
    nodes: Vec<TcpNode>,
    dir: Vec<Option<SocketAddr>>,
    me: Membership,
}

impl HandDriven {
    fn start(n: u32, layout: &Layout, cfg: &TcpConfig) -> Self {
        let listeners: Vec<_> = (0..n)
            .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
            .collect();
        let unused = TcpListener::bind("127.0.0.1:0").unwrap().local_addr().ok();
        let dir: Vec<_> = std::iter::once(unused)
            .chain(listeners.iter().map(|l| l.local_addr().ok()))
            .collect();
        let nodes = listeners
            .into_iter()
            .enumerate()
            .map(|(i, l)| TcpNode::start(i as u32 + 1, l, dir.clone(), layout.clone(), cfg.clone()))
            .collect::<Result<_, _>>()
            .unwrap();
        let me = Membership {
            node: 0,
            cluster_size: n + 1,
            layout: layout.clone(),
            key: cfg.key.clone(),
            protection: cfg.protection,
            identity: None,
        };
        Self { nodes, dir, me }
    }

    /// A fresh connection from node 0 to node `i`, past the handshake.
    fn connect(&self, i: u32) -> RawPeer {
        RawPeer::connect(self.dir[i as usize].unwrap(), i, &self.me).unwrap()
    }
}

/// A compute node takes writes from the MM alone (`TcpConfig::writers`): here node 0 is the
/// MM, nodes 1 and 2 compute nodes. Another member's transfer or writing compare-and-write
/// fails at its origin, naming the rule, and leaves the node's memory as it was; the MM's
/// operations, relayed through a compute node, and the compute nodes' writes to the MM go on.
#[test]
fn a_compute_node_takes_writes_from_the_mm_alone() {
    let t = test_layout();
    let listeners: Vec<_> = (0..3)
        .map(|_| TcpListener::bind("127.0.0.1:0").unwrap())
        .collect();
    let dir: Vec<Option<SocketAddr>> = listeners.iter().map(|l| l.local_addr().ok()).collect();
    let shared = TcpConfig {
        fanout: 1,
        ..config(2000)
    };
    let nodes: Vec<TcpNode> = listeners
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            let cfg = TcpConfig {
                writers: (i > 0).then(|| NodeSet::single(0)),
                ..shared.clone()
            };
            TcpNode::start(i as u32, l, dir.clone(), t.layout.clone(), cfg).unwrap()
        })
        .collect();
    let xfer = |from: usize, dest: &str, data: &'static [u8]| {
        nodes[from]
            .xfer_and_signal(
                &dest.parse().unwrap(),
                t.bulk.offset,
                Bytes::from_static(data),
                None,
                Some(t.done),
            )
            .unwrap();
        outcome(&nodes[from], t.done)
    };
    assert_eq!(
        xfer(0, "1-2", b"from mm"),
        Ok(true),
        "the MM writes through node 1"
    );
    assert_eq!(
        xfer(1, "0", b"from 1!"),
        Ok(true),
        "a compute node writes to the MM"
    );
    match xfer(1, "2", b"forged!") {
        Err(PrimError::TransferFailed(why)) => assert!(
            why.contains("node 1 may not write into node 2's memory"),
            "{why}"
        ),
        other => panic!("a compute node wrote into another: {other:?}"),
    }
    assert_eq!(
        nodes[2].memory().read_vec(t.bulk.offset, 7).unwrap(),
        b"from mm".to_vec()
    );
    let caw = |from: usize, write: Option<(storm_primitives::VarId, u64)>| {
        nodes[from].compare_and_write(&"2".parse().unwrap(), t.a, Relation::Eq, 0, write)
    };
    assert_eq!(caw(1, None), Ok(true), "comparing alone writes nothing");
    assert!(
        matches!(caw(1, Some((t.a, 9))), Err(PrimError::TransferFailed(_))),
        "a compute node's compare-and-write wrote into another"
    );
    assert_eq!(nodes[2].memory().load(t.a), 0);
    assert_eq!(caw(0, Some((t.a, 9))), Ok(true));
    assert_eq!(nodes[2].memory().load(t.a), 9);
}

/// A root holds requests in a queue behind the operation it runs. When that operation waits
/// on a silent node past the time a queued request may wait, the request fails, and the
/// sweeper goes back to sleeping until the next deadline: it had kept waking for the expired
/// request, burning a core, for as long as the operation ahead waited.
#[test]
fn a_request_queued_past_its_time_does_not_keep_the_sweeper_awake() {
    let t = test_layout();
    let nodes = TcpNode::local_cluster(3, &t.layout, &config(2000)).unwrap();
    let both: NodeSet = "1-2".parse().unwrap();
    // Connect everything while all answer.
    assert_eq!(
        nodes[0].compare_and_write(&both, t.a, Relation::Eq, 0, None),
        Ok(true)
    );
    nodes[2].freeze(true);
    std::thread::scope(|s| {
        // The root waits up to half the timeout (1 s) for the frozen node; a request queued
        // behind it may wait a quarter (500 ms).
        let start = Instant::now();
        let ahead = s.spawn(|| nodes[0].compare_and_write(&both, t.a, Relation::Eq, 0, None));
        std::thread::sleep(Duration::from_millis(50));
        let queued = s.spawn(|| nodes[0].compare_and_write(&both, t.a, Relation::Eq, 0, None));
        // From past the queued request's time to before the end of the one ahead.
        std::thread::sleep(Duration::from_millis(600).saturating_sub(start.elapsed()));
        let before = nodes[1].sweeps();
        std::thread::sleep(Duration::from_millis(300));
        let woke = nodes[1].sweeps() - before;
        let queued = queued.join().unwrap();
        assert!(
            matches!(&queued, Err(PrimError::Timeout { detail, .. }) if detail.contains("queued too long")),
            "{queued:?}"
        );
        assert!(matches!(
            ahead.join().unwrap(),
            Err(PrimError::Timeout { .. })
        ));
        assert!(
            woke < 50,
            "the root's sweeper woke {woke} times in 300 ms with one deadline ahead"
        );
    });
    nodes[2].freeze(false);
}

/// Every operation gives the sweeper a deadline. Nearly all of them are later than the one it
/// already waits for, and must leave it asleep: a wake-up per operation is a context switch
/// per message on every node (it was most of a node manager's processor time under gang
/// scheduling).
#[test]
fn operations_with_later_deadlines_leave_the_sweeper_asleep() {
    let t = test_layout();
    let nodes = TcpNode::local_cluster(3, &t.layout, &config(5000)).unwrap();
    let both: NodeSet = "1-2".parse().unwrap();
    assert_eq!(
        nodes[0].compare_and_write(&both, t.a, Relation::Eq, 0, None),
        Ok(true)
    );
    let before: Vec<u64> = nodes.iter().map(|n| n.sweeps()).collect();
    let ops = 500;
    for _ in 0..ops {
        nodes[0]
            .xfer_and_signal(&both, t.bulk.offset, Bytes::from_static(b"x"), None, None)
            .unwrap();
        assert_eq!(
            nodes[0].compare_and_write(&both, t.a, Relation::Eq, 0, None),
            Ok(true)
        );
    }
    for (n, before) in nodes.iter().zip(before) {
        let swept = n.sweeps() - before;
        assert!(
            swept < ops / 10,
            "node {} swept {swept} times for {} operations",
            n.node_id(),
            2 * ops
        );
    }
}

#[test]
fn a_node_nobody_listens_for_fails_at_once_naming_it() {
    let t = test_layout();
    // Bind then drop: the port refuses connections.
    let dead = TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let nodes = cluster_with(3, dead, &t.layout, &config(5000));
    let all = NodeSet::first_n(4);
    let start = Instant::now();
    nodes[0]
        .xfer_and_signal(
            &all,
            t.bulk.offset,
            Bytes::from_static(b"x"),
            Some(t.data),
            Some(t.done),
        )
        .unwrap();
    match outcome(&nodes[0], t.done) {
        Err(PrimError::Unreachable { node: 3, reason }) => {
            assert!(reason.contains("connect"), "{reason}")
        }
        other => panic!("expected node 3 unreachable, got {other:?}"),
    }
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "a refused connection is noticed before the timeout"
    );
    for n in &nodes {
        assert_eq!(n.test_event(t.data, Wait::Poll), Ok(false));
    }
    let r = nodes[1].compare_and_write(&all, t.a, Relation::Eq, 0, None);
    assert!(
        matches!(r, Err(PrimError::Unreachable { node: 3, .. })),
        "{r:?}"
    );
}

/// A peer that completes the handshake and then never answers: the operation fails with a
/// timeout that names it, after the configured timeout and not long after.
#[test]
fn a_silent_node_fails_the_operation_within_the_timeout() {
    let t = test_layout();
    let cfg = config(800);
    let silent = TcpListener::bind("127.0.0.1:0").unwrap();
    let silent_addr = silent.local_addr().unwrap();
    let (key, fingerprint) = (cfg.key.clone(), t.layout.fingerprint());
    std::thread::spawn(move || {
        for s in silent.incoming() {
            let Ok(mut s) = s else { continue };
            let key = key.clone();
            std::thread::spawn(move || {
                // A real member (it holds the key, as node 4 of 5), silent after the handshake.
                let Ok(Frame::Control(Control::Hello(h))) = read_frame(&mut s, 1 << 20) else {
                    return;
                };
                let nonce = [5u8; 32];
                let t = Transcript::new(
                    h.node,
                    4,
                    5,
                    fingerprint,
                    Protection::from_code(h.protection).unwrap(),
                    &h.nonce,
                    &nonce,
                );
                let challenge = Control::Challenge {
                    nonce,
                    proof: t.server_proof(&key),
                };
                let _ = s.write_all(&OutFrame::control(&challenge).to_vec());
                if let Ok(Frame::Control(Control::Proof(_))) = read_frame(&mut s, 1 << 20) {
                    let _ = s.write_all(&OutFrame::control(&Control::HelloAck).to_vec());
                    let mut sink = [0u8; 65536];
                    while matches!(s.read(&mut sink), Ok(n) if n > 0) {}
                }
            });
        }
    });
    let timeout = Duration::from_millis(800);
    let nodes = cluster_with(4, silent_addr, &t.layout, &cfg);
    let all = NodeSet::first_n(5);
    for origin in [0usize, 2] {
        let start = Instant::now();
        nodes[origin]
            .xfer_and_signal(
                &all,
                t.bulk.offset,
                Bytes::from(vec![7u8; 100_000]),
                Some(t.data),
                Some(t.done),
            )
            .unwrap();
        let r = outcome(&nodes[origin], t.done);
        let took = start.elapsed();
        match r {
            Err(PrimError::Timeout { detail, .. }) => {
                assert!(detail.contains('4') || detail.contains("node"), "{detail}")
            }
            other => panic!("expected a timeout, got {other:?}"),
        }
        // The node whose child is silent waits at least half the timeout (less the deeper it
        // is, so that it reports before its own parent gives up: tcp::tree::Tree::patience).
        assert!(
            took >= timeout / 2,
            "gave up after {took:?}, before half the timeout"
        );
        assert!(
            took < timeout + Duration::from_secs(5),
            "took {took:?}: the timeout does not bound the wait"
        );
        for n in &nodes {
            assert_eq!(
                n.test_event(t.data, Wait::Poll),
                Ok(false),
                "a node was signalled"
            );
        }
    }
    // Without the silent node everything works.
    let live = NodeSet::first_n(4);
    nodes[0]
        .xfer_and_signal(
            &live,
            t.bulk.offset,
            Bytes::from_static(b"ok"),
            Some(t.data),
            Some(t.done),
        )
        .unwrap();
    assert_eq!(outcome(&nodes[0], t.done), Ok(true));
    let r = nodes[3].compare_and_write(&all, t.a, Relation::Eq, 0, None);
    assert!(matches!(r, Err(PrimError::Timeout { .. })), "{r:?}");
    assert_eq!(
        nodes[3].compare_and_write(&live, t.a, Relation::Eq, 0, None),
        Ok(true)
    );
}

/// Two nodes, 0 with `layout_a` and `cfg_a`, 1 with `layout_b` and `cfg_b`: why a transfer
/// from 0 to 1 could not be made.
fn refusal(layout_a: Layout, cfg_a: TcpConfig, layout_b: Layout, cfg_b: TcpConfig) -> String {
    let t = test_layout();
    let l_a = TcpListener::bind("127.0.0.1:0").unwrap();
    let l_b = TcpListener::bind("127.0.0.1:0").unwrap();
    let dir = vec![l_a.local_addr().ok(), l_b.local_addr().ok()];
    let a = TcpNode::start(0, l_a, dir.clone(), layout_a, cfg_a).unwrap();
    let _b = TcpNode::start(1, l_b, dir, layout_b, cfg_b).unwrap();
    a.xfer_and_signal(&NodeSet::single(1), 0, Bytes::new(), None, Some(t.done))
        .unwrap();
    match outcome(&a, t.done) {
        Err(PrimError::Unreachable { node: 1, reason }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[test]
fn a_node_with_another_layout_is_refused_and_told_nothing_more() {
    let t = test_layout();
    let mut other = Layout::builder();
    other.var("something-else");
    let other = other.build().unwrap();
    let cfg = config(2000);
    let reason = refusal(t.layout.clone(), cfg.clone(), other, cfg);
    assert!(
        reason.contains("refused") && !reason.contains("layout"),
        "{reason}"
    );
}

/// Where this test binary's log lines go (the nodes log from threads of their own), so that a
/// test can read what a node said.
fn captured_logs() -> std::sync::Arc<std::sync::Mutex<Vec<u8>>> {
    use std::sync::{Arc, Mutex, OnceLock};
    struct Shared(Arc<Mutex<Vec<u8>>>);
    impl Write for Shared {
        fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(b);
            Ok(b.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    static LOGS: OnceLock<Arc<Mutex<Vec<u8>>>> = OnceLock::new();
    LOGS.get_or_init(|| {
        let buf = Arc::new(Mutex::new(Vec::new()));
        let sink = buf.clone();
        tracing_subscriber::fmt()
            .with_ansi(false)
            .with_writer(move || Shared(sink.clone()))
            .init();
        buf
    })
    .clone()
}

/// Two nodes with different cluster keys each name the mismatch: the one that connects (it
/// finds the other's proof wrong) and the one that accepts (told its proof was refused),
/// where it used to log only a reset connection.
#[test]
fn a_node_without_the_cluster_key_is_refused_and_both_sides_name_the_mismatch() {
    let logs = captured_logs();
    let t = test_layout();
    // Each config has its own random key.
    let reason = refusal(
        t.layout.clone(),
        config(2000),
        t.layout.clone(),
        config(2000),
    );
    assert!(
        reason.contains("did not prove it holds the cluster key")
            && reason.contains("different cluster keys"),
        "{reason}"
    );
    let accepting_side = "a peer claiming node 0 refused this node's proof: the two nodes hold \
                          different cluster keys";
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = String::from_utf8_lossy(&logs.lock().unwrap()).into_owned();
        if text.contains(accepting_side) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "node 1 never said {accepting_side:?}:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_shut_down_node_refuses_calls_and_wakes_its_waiters() {
    let t = test_layout();
    let nodes = TcpNode::local_cluster(2, &t.layout, &config(2000)).unwrap();
    let n1 = std::sync::Arc::new(nodes.into_iter().nth(1).unwrap());
    let waiter = {
        let n1 = n1.clone();
        std::thread::spawn(move || n1.test_event(t.data, Wait::Block))
    };
    std::thread::sleep(Duration::from_millis(50));
    n1.shutdown();
    assert_eq!(waiter.join().unwrap(), Err(PrimError::ShutDown));
    assert_eq!(
        n1.xfer_and_signal(&NodeSet::single(0), 0, Bytes::new(), None, None),
        Err(PrimError::ShutDown)
    );
}

#[test]
fn bad_configuration_is_rejected_naming_the_field() {
    let t = test_layout();
    for (cfg, field) in [
        (
            TcpConfig {
                fanout: 0,
                ..TcpConfig::default()
            },
            "fanout",
        ),
        (
            TcpConfig {
                chunk_size: 0,
                ..TcpConfig::default()
            },
            "chunk_size",
        ),
        (
            TcpConfig {
                chunk_size: 1 << 30,
                ..TcpConfig::default()
            },
            "max_frame",
        ),
        (
            TcpConfig {
                op_timeout: Duration::ZERO,
                ..TcpConfig::default()
            },
            "timeout",
        ),
    ] {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        let dir = vec![l.local_addr().ok()];
        match TcpNode::start(0, l, dir, t.layout.clone(), cfg) {
            Err(PrimError::InvalidArgument(msg)) => assert!(msg.contains(field), "{msg}"),
            Err(e) => panic!("{e}"),
            Ok(_) => panic!("accepted a config with a bad {field}"),
        }
    }
}

/// Paper Sec. 2.4.3 and DESIGN: when an interior node of the tree dies, leaving it out of the
/// destination set re-attaches its subtree, so operations on the remaining nodes work at once.
#[test]
fn the_tree_heals_when_an_interior_node_dies() {
    let t = test_layout();
    let cfg = TcpConfig {
        fanout: 2,
        ..config(5000)
    };
    let nodes = TcpNode::local_cluster(8, &t.layout, &cfg).unwrap();
    // Binary tree rooted at 0 over 1..7: node 1 is the parent of nodes 3 and 4.
    nodes[1].shutdown();
    let all: NodeSet = "1-7".parse().unwrap();
    nodes[0]
        .xfer_and_signal(
            &all,
            t.bulk.offset,
            Bytes::from_static(b"lost"),
            Some(t.data),
            Some(t.done),
        )
        .unwrap();
    match outcome(&nodes[0], t.done) {
        Err(PrimError::Unreachable { node: 1, .. }) => {}
        other => panic!("the transfer must fail naming node 1, got {other:?}"),
    }
    for n in &nodes[2..] {
        assert_eq!(
            n.test_event(t.data, Wait::Poll),
            Ok(false),
            "nothing signalled"
        );
    }
    // Without node 1, its children hang off the new tree and receive.
    let rest: NodeSet = "2-7".parse().unwrap();
    nodes[0]
        .xfer_and_signal(
            &rest,
            t.bulk.offset,
            Bytes::from_static(b"healed"),
            Some(t.data),
            Some(t.done),
        )
        .unwrap();
    assert_eq!(outcome(&nodes[0], t.done), Ok(true));
    for n in &nodes[2..] {
        assert_eq!(
            n.test_event(t.data, Wait::Timeout(Duration::from_secs(10))),
            Ok(true)
        );
        assert_eq!(
            n.memory().read_vec(t.bulk.offset, 6).unwrap(),
            b"healed".to_vec()
        );
    }
    // Reductions too.
    assert_eq!(
        nodes[0].compare_and_write(&rest, t.a, Relation::Eq, 0, Some((t.a, 9))),
        Ok(true)
    );
    assert_eq!(nodes[4].memory().load(t.a), 9);
}

/// A transfer's data reaches a node's memory only when it commits. Here an earlier transfer
/// from node 0 is stuck behind a frozen node 1 and fails; a later one to the same bytes goes
/// around it and commits on node 2; then node 1 thaws and relays the stale data to node 2,
/// which must not let it overwrite what was committed.
#[test]
fn a_stale_transfer_relayed_late_never_overwrites_a_later_committed_one() {
    stale_relay_case(false);
}

/// The same for transfers applied on arrival, as the MM's heartbeats are: node 2 has applied
/// the later one, so it refuses the stale one when node 1 relays it.
#[test]
fn a_stale_transfer_applied_on_arrival_relayed_late_never_overwrites_a_later_one() {
    stale_relay_case(true);
}

fn stale_relay_case(on_arrival: bool) {
    let t = test_layout();
    let cfg = TcpConfig {
        fanout: 1,
        ..config(500)
    };
    let nodes = TcpNode::local_cluster(3, &t.layout, &cfg).unwrap();
    let both: NodeSet = "1-2".parse().unwrap();
    let send = |dest: &NodeSet, at: u64, data: &'static [u8]| {
        let (offset, data) = (t.bulk.offset + at, Bytes::from_static(data));
        let (remote, local) = (Some(t.data), Some(t.done));
        if on_arrival {
            nodes[0].xfer_and_signal_on_arrival_within(dest, offset, data, remote, local, None)
        } else {
            nodes[0].xfer_and_signal(dest, offset, data, remote, local)
        }
        .unwrap();
        outcome(&nodes[0], t.done)
    };
    // Connect 0 -> 1 -> 2 (the chain for fanout 1), then freeze node 1.
    assert_eq!(send(&both, 64, b"warm"), Ok(true));
    nodes[1].freeze(true);
    assert!(
        matches!(send(&both, 0, b"stale!!!"), Err(PrimError::Timeout { .. })),
        "the transfer through the frozen node fails"
    );
    assert_eq!(send(&NodeSet::single(2), 0, b"healed!!"), Ok(true));
    nodes[1].freeze(false);
    // Frames on each link stay in order: once this transfer over 0 -> 1 -> 2 is done, node 2
    // has handled everything node 1 relayed before it.
    assert_eq!(send(&both, 64, b"sync"), Ok(true));
    assert_eq!(
        nodes[2].memory().read_vec(t.bulk.offset, 8).unwrap(),
        b"healed!!".to_vec(),
        "the stale transfer's data landed after the later one"
    );
}

/// Sends node 1 a transfer applied on arrival, from node 0 (driven by hand) as `seq`, of
/// `data` at the start of the bulk area, and returns its key and node 1's answer.
fn on_arrival_xfer(
    peer: &mut RawPeer,
    t: &TestLayout,
    seq: u64,
    data: &'static [u8],
) -> (OpKey, Control) {
    on_arrival_xfer_at(peer, t, seq, 0, data)
}

/// The same, `at` bytes into the bulk area.
fn on_arrival_xfer_at(
    peer: &mut RawPeer,
    t: &TestLayout,
    seq: u64,
    at: u64,
    data: &'static [u8],
) -> (OpKey, Control) {
    let key = OpKey { origin: 0, seq };
    let begin = XferBegin {
        key,
        dest: NodeSet::single(1),
        fanout: 2,
        offset: t.bulk.offset + at,
        len: data.len() as u64,
        remote_event: Some(t.data.index() as u32),
        timeout_ms: 5000,
        on_arrival: true,
    };
    peer.send_control(&Control::Xfer(XferMsg::Begin(begin)))
        .unwrap();
    peer.send(&OutFrame::data(key, 0, Bytes::from_static(data)))
        .unwrap();
    (key, peer.recv_control().unwrap())
}

/// A transfer applied on arrival takes one round trip: the node writes the data and raises
/// the event as soon as the data is in, and answers `Committed` with no `Ack` and no `Commit`
/// between. An earlier transfer from the same origin that arrives after it (it was overtaken)
/// is refused, and its bytes never land on the later ones.
#[test]
fn a_transfer_applied_on_arrival_takes_one_round_trip_and_an_overtaken_one_is_refused() {
    let t = test_layout();
    let hand = HandDriven::start(1, &t.layout, &config(5000));
    let node = &hand.nodes[0];
    let mut peer = hand.connect(1);
    let mut xfer = |seq, data| on_arrival_xfer(&mut peer, &t, seq, data);
    let (newer, reply) = xfer(5, b"newer!!!");
    assert_eq!(reply, Control::Xfer(XferMsg::Committed(newer)));
    assert_eq!(node.test_event(t.data, Wait::Poll), Ok(true));
    assert_eq!(
        node.memory().read_vec(t.bulk.offset, 8).unwrap(),
        b"newer!!!".to_vec()
    );
    let (older, reply) = xfer(3, b"older!!!");
    match reply {
        Control::Xfer(XferMsg::Nack(key, PrimError::TransferFailed(why))) => {
            assert_eq!(key, older);
            assert!(why.contains("later transfer"), "{why}");
        }
        other => panic!("the overtaken transfer was not refused: {other:?}"),
    }
    assert_eq!(
        node.memory().read_vec(t.bulk.offset, 8).unwrap(),
        b"newer!!!".to_vec(),
        "the overtaken transfer's bytes landed on the later one's"
    );
    assert_eq!(
        node.test_event(t.data, Wait::Poll),
        Ok(false),
        "the node was signalled for the overtaken transfer"
    );
}

/// The order holds per range of bytes: an earlier transfer to other bytes that arrives after
/// a later one (the MM's program chunk passed by a heartbeat its other thread issued just
/// after it) is applied, while one overlapping the later transfer's bytes is still refused.
#[test]
fn an_earlier_transfer_applied_on_arrival_to_other_bytes_is_not_refused() {
    let t = test_layout();
    let hand = HandDriven::start(1, &t.layout, &config(5000));
    let node = &hand.nodes[0];
    let mut peer = hand.connect(1);
    let (later, reply) = on_arrival_xfer_at(&mut peer, &t, 9, 0, b"heartbt!");
    assert_eq!(reply, Control::Xfer(XferMsg::Committed(later)));
    let (earlier, reply) = on_arrival_xfer_at(&mut peer, &t, 8, 64, b"chunk!!!");
    assert_eq!(
        reply,
        Control::Xfer(XferMsg::Committed(earlier)),
        "an earlier transfer to other bytes was refused"
    );
    assert_eq!(
        node.memory().read_vec(t.bulk.offset + 64, 8).unwrap(),
        b"chunk!!!".to_vec()
    );
    let (overlapping, reply) = on_arrival_xfer_at(&mut peer, &t, 7, 4, b"stale!!!");
    assert!(
        matches!(reply, Control::Xfer(XferMsg::Nack(key, _)) if key == overlapping),
        "an overtaken transfer to overlapping bytes was applied: {reply:?}"
    );
    assert_eq!(
        node.memory().read_vec(t.bulk.offset, 8).unwrap(),
        b"heartbt!".to_vec()
    );
}

/// An origin that comes back on a new connection may be a new process (a restarted MM) whose
/// sequence numbers start lower than its old ones (its clock stepped back): its on-arrival
/// transfers are applied, not refused as overtaken by its former self's.
#[test]
fn an_origin_back_on_a_new_connection_starts_a_new_on_arrival_order() {
    let t = test_layout();
    let hand = HandDriven::start(1, &t.layout, &config(5000));
    let node = &hand.nodes[0];
    let mut before = hand.connect(1);
    let (key, reply) = on_arrival_xfer(&mut before, &t, 1_000_000, b"former!!");
    assert_eq!(reply, Control::Xfer(XferMsg::Committed(key)));
    // The origin connects again (the node closes the connection before).
    let mut after = hand.connect(1);
    let (key, reply) = on_arrival_xfer(&mut after, &t, 7, b"reborn!!");
    assert_eq!(
        reply,
        Control::Xfer(XferMsg::Committed(key)),
        "the restarted origin's transfer was refused"
    );
    assert_eq!(
        node.memory().read_vec(t.bulk.offset, 8).unwrap(),
        b"reborn!!".to_vec()
    );
}

/// The commit phase's window: the origin (driven by hand here) gave up on a transfer after
/// sending its `Commit`, which is stuck behind a frozen node 1, and committed a later transfer
/// to the same bytes on node 2 directly. When node 1 thaws and relays the old `Commit`, node 2
/// has already dropped the old transfer: its memory keeps the later data and its event is not
/// raised twice.
#[test]
fn a_late_commit_of_a_superseded_transfer_is_ignored() {
    let t = test_layout();
    let hand = HandDriven::start(2, &t.layout, &config(5000));
    let nodes = &hand.nodes;
    let mut to_1 = hand.connect(1);
    let mut to_2 = hand.connect(2);
    let xfer = |peer: &mut RawPeer, seq: u64, dest: &str, at: u64, data: &'static [u8]| {
        let key = OpKey { origin: 0, seq };
        let begin = XferBegin {
            key,
            dest: dest.parse().unwrap(),
            fanout: 1,
            offset: t.bulk.offset + at,
            len: data.len() as u64,
            remote_event: Some(t.data.index() as u32),
            timeout_ms: 5000,
            on_arrival: false,
        };
        peer.send_control(&Control::Xfer(XferMsg::Begin(begin)))
            .unwrap();
        peer.send(&OutFrame::data(key, 0, Bytes::from_static(data)))
            .unwrap();
        key
    };
    let reply = |peer: &mut RawPeer| match peer.recv_control().unwrap() {
        Control::Xfer(msg) => msg,
        other => panic!("expected a transfer message, got {other:?}"),
    };
    // 1. The old transfer, 0 -> 1 -> 2, is prepared everywhere; its commit waits at node 1.
    let old = xfer(&mut to_1, 1, "1-2", 0, b"stale!!!");
    assert_eq!(reply(&mut to_1), XferMsg::Ack(old));
    nodes[0].freeze(true);
    to_1.send_control(&Control::Xfer(XferMsg::Commit(old)))
        .unwrap();
    // 2. The later one commits on node 2.
    let new = xfer(&mut to_2, 2, "2", 0, b"healed!!");
    assert_eq!(reply(&mut to_2), XferMsg::Ack(new));
    to_2.send_control(&Control::Xfer(XferMsg::Commit(new)))
        .unwrap();
    assert_eq!(reply(&mut to_2), XferMsg::Committed(new));
    assert_eq!(nodes[1].test_event(t.data, Wait::Poll), Ok(true));
    // 3. Node 1 thaws and relays the old commit; a transfer behind it on the same links
    //    tells when node 2 has handled it.
    nodes[0].freeze(false);
    let sync = xfer(&mut to_1, 3, "1-2", 64, b"sync");
    loop {
        match reply(&mut to_1) {
            XferMsg::Ack(k) if k == sync => break,
            _ => continue,
        }
    }
    assert_eq!(
        nodes[1].memory().read_vec(t.bulk.offset, 8).unwrap(),
        b"healed!!".to_vec(),
        "the superseded transfer committed after the later one"
    );
    assert_eq!(
        nodes[1].test_event(t.data, Wait::Poll),
        Ok(false),
        "node 2 was signalled for the superseded transfer"
    );
}

/// A member that starts transfers and COMPARE-AND-WRITEs and never finishes them cannot grow
/// a node's tables past `max_pending_ops`, nor its held data past `max_staged_bytes`: the
/// excess is refused to its origin naming the limit, and the node goes on working.
#[test]
fn pending_operations_and_staged_bytes_are_capped() {
    let t = test_layout();
    let cfg = TcpConfig {
        max_pending_ops: 4,
        max_staged_bytes: 1024,
        ..config(5000)
    };
    let hand = HandDriven::start(1, &t.layout, &cfg);
    let node = &hand.nodes[0];
    let mut peer = hand.connect(1);
    let key = |seq| OpKey { origin: 0, seq };
    let begin = |seq, len| {
        Control::Xfer(XferMsg::Begin(XferBegin {
            key: key(seq),
            dest: NodeSet::single(1),
            fanout: 2,
            offset: t.bulk.offset,
            len,
            remote_event: None,
            timeout_ms: 60_000,
            on_arrival: false,
        }))
    };
    // Four transfers begun and left open; the fifth is refused.
    peer.send_control(&begin(1, 2000)).unwrap();
    for seq in 2..=4 {
        peer.send_control(&begin(seq, 100)).unwrap();
    }
    peer.send_control(&begin(5, 100)).unwrap();
    match peer.recv_control().unwrap() {
        Control::Xfer(XferMsg::Nack(k, PrimError::TransferFailed(why))) => {
            assert_eq!(k, key(5));
            assert!(why.contains("max_pending_ops"), "{why}");
        }
        other => panic!("expected the fifth transfer refused, got {other:?}"),
    }
    // Data past the staged-bytes limit fails its transfer.
    peer.send(&OutFrame::data(key(1), 0, Bytes::from(vec![1u8; 1000])))
        .unwrap();
    peer.send(&OutFrame::data(key(1), 1000, Bytes::from(vec![1u8; 100])))
        .unwrap();
    match peer.recv_control().unwrap() {
        Control::Xfer(XferMsg::Nack(k, PrimError::TransferFailed(why))) => {
            assert_eq!(k, key(1));
            assert!(why.contains("max_staged_bytes"), "{why}");
        }
        other => panic!("expected the transfer past the byte limit failed, got {other:?}"),
    }
    assert_eq!(
        node.memory().read_vec(t.bulk.offset, 4).unwrap(),
        vec![0u8; 4],
        "nothing of a failed transfer reached memory"
    );
    // COMPARE-AND-WRITEs that the parent never finishes: node 1 votes on four and keeps
    // them; the fifth is refused.
    for seq in 10..=14 {
        let req = CawRequest {
            key: key(seq),
            dest: "0-1".parse().unwrap(),
            fanout: 2,
            var: t.a.offset(),
            rel: Relation::Eq,
            value: 0,
            write: Some((t.a.offset(), 1)),
            timeout_ms: 60_000,
        };
        peer.send_control(&Control::Caw(CawMsg::Compare(req)))
            .unwrap();
    }
    let mut votes = 0;
    loop {
        match peer.recv_control().unwrap() {
            Control::Caw(CawMsg::Vote(_, true)) => votes += 1,
            Control::Caw(CawMsg::Nack(k, PrimError::TransferFailed(why))) => {
                assert_eq!(k, key(14));
                assert!(why.contains("max_pending_ops"), "{why}");
                break;
            }
            other => panic!("unexpected {other:?}"),
        }
    }
    assert_eq!(votes, 4);
    // Finishing one makes room, and the node still works for its peer.
    peer.send_control(&Control::Caw(CawMsg::Release(key(10))))
        .unwrap();
    peer.send_control(&begin(20, 2)).unwrap();
    // Transfer 1 failed and left: its place is free too.
    peer.send(&OutFrame::data(key(20), 0, Bytes::from_static(b"ok")))
        .unwrap();
    assert_eq!(
        peer.recv_control().unwrap(),
        Control::Xfer(XferMsg::Ack(key(20)))
    );
}

/// A member holds at most one connection it opened to a node: a newer one closes the one
/// before (a restarted peer's, or a flood of them), so connections and their threads stay
/// bounded by the cluster's size.
#[test]
fn a_members_new_connection_closes_its_previous_one() {
    let t = test_layout();
    let hand = HandDriven::start(1, &t.layout, &config(5000));
    let mut first = hand.connect(1);
    let mut second = hand.connect(1);
    assert!(
        first.recv().is_err(),
        "the first connection is closed once the second is made"
    );
    // The second one works.
    let key = OpKey { origin: 0, seq: 1 };
    let begin = XferBegin {
        key,
        dest: NodeSet::single(1),
        fanout: 2,
        offset: t.bulk.offset,
        len: 2,
        remote_event: None,
        timeout_ms: 5000,
        on_arrival: false,
    };
    second
        .send_control(&Control::Xfer(XferMsg::Begin(begin)))
        .unwrap();
    second
        .send(&OutFrame::data(key, 0, Bytes::from_static(b"ok")))
        .unwrap();
    assert_eq!(
        second.recv_control().unwrap(),
        Control::Xfer(XferMsg::Ack(key))
    );
}

/// A peer that trickles its handshake a byte at a time runs out of time for the whole
/// handshake (not per read), and handshakes beyond `max_handshakes` are closed at once; the
/// node keeps working for real peers.
#[test]
fn slow_and_excess_handshakes_are_cut_off() {
    let t = test_layout();
    let cfg = TcpConfig {
        max_handshakes: 2,
        ..config(2000)
    };
    let nodes = TcpNode::local_cluster(2, &t.layout, &cfg).unwrap();
    let addr = nodes[1].local_addr();
    // Two connections that say nothing hold both handshake places...
    let idle: Vec<std::net::TcpStream> = (0..2)
        .map(|_| std::net::TcpStream::connect(addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(50));
    // ...so a third is closed at once, without a word.
    let mut third = std::net::TcpStream::connect(addr).unwrap();
    third
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut buf = [0u8; 16];
    assert!(
        matches!(third.read(&mut buf), Ok(0) | Err(_)),
        "the connection over the cap is closed"
    );
    drop(idle);
    std::thread::sleep(Duration::from_millis(50));
    // A handshake trickled a byte every 50 ms would take seconds; the node gives it its
    // connect timeout (300 ms here) as a whole.
    let mut slow = std::net::TcpStream::connect(addr).unwrap();
    let hello = OutFrame::control(&Control::Hello(storm_primitives::tcp::wire::Hello {
        node: 0,
        cluster_size: 2,
        layout_fingerprint: t.layout.fingerprint(),
        protection: cfg.protection.code(),
        nonce: [0; 32],
    }))
    .to_vec();
    let start = Instant::now();
    let mut cut = false;
    for b in &hello {
        if slow.write_all(&[*b]).is_err() {
            cut = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
        slow.set_nonblocking(true).unwrap();
        let closed = matches!(slow.read(&mut buf), Ok(0));
        slow.set_nonblocking(false).unwrap();
        if closed {
            cut = true;
            break;
        }
    }
    assert!(cut, "the trickled handshake was allowed to finish");
    assert!(
        start.elapsed() < Duration::from_millis(50) * hello.len() as u32,
        "cut off before the whole handshake was sent"
    );
    // Real peers still connect.
    nodes[0]
        .xfer_and_signal(&NodeSet::single(1), 0, Bytes::new(), None, Some(t.done))
        .unwrap();
    assert_eq!(outcome(&nodes[0], t.done), Ok(true));
}

/// Finding 5 of issue 31: a host without the key that held every handshake place kept the
/// cluster's own nodes out. Places are now capped per source address too: one host holding
/// connections open that never handshake gets `max_handshakes_per_source` of them (the rest
/// are closed at once), and a member from another address still gets in and is served.
#[test]
fn one_host_cannot_hold_every_handshake_place() {
    let t = test_layout();
    let cfg = TcpConfig {
        max_handshakes: 16,
        max_handshakes_per_source: 4,
        connect_timeout: Duration::from_secs(30),
        ..config(2000)
    };
    let nodes = TcpNode::local_cluster(2, &t.layout, &cfg).unwrap();
    let addr = nodes[1].local_addr();
    // A flood of silent connections from 127.0.0.2.
    let mut flood: Vec<std::net::TcpStream> = (0..64)
        .map(|_| storm_primitives::tcp::peer::connect_from([127, 0, 0, 2].into(), addr).unwrap())
        .collect();
    std::thread::sleep(Duration::from_millis(200));
    let open = flood
        .iter_mut()
        .map(|s| {
            s.set_nonblocking(true).unwrap();
            let mut b = [0u8; 1];
            !matches!(s.read(&mut b), Ok(0))
        })
        .filter(|&still| still)
        .count();
    assert_eq!(
        open, 4,
        "the flooding host keeps exactly its per-source places"
    );
    // The cluster's own node (from 127.0.0.1) is still served at once.
    nodes[0]
        .xfer_and_signal(&NodeSet::single(1), 0, Bytes::new(), None, Some(t.done))
        .unwrap();
    assert_eq!(outcome(&nodes[0], t.done), Ok(true));
}

/// Issue 31, a compromised compute node: it holds the cluster key, so it could claim to be
/// any node. A node that asks its peers for their identity (the MM) takes a connection only
/// from a peer that signs the handshake with the key enrolled for the node it claims; on that
/// link it carries out operations only for that node (`bind_origins`), and only writes the
/// check allows (`write_check`, here: the first half of the bulk area for node 0).
#[test]
fn a_node_that_asks_for_identities_takes_each_peer_only_as_itself() {
    use ed25519_dalek::SigningKey;
    let t = test_layout();
    let zero = SigningKey::from_bytes(&[10; 32]);
    let two = SigningKey::from_bytes(&[12; 32]);
    let keys = [Some(zero.verifying_key()), None, Some(two.verifying_key())];
    let half = t.bulk.len as u64 / 2;
    let bulk = t.bulk.offset;
    let cfg = TcpConfig {
        peer_keys: Some(storm_primitives::tcp::PeerKeys(std::sync::Arc::new(
            move |n| keys.get(n as usize).copied().flatten(),
        ))),
        bind_origins: true,
        write_check: Some(storm_primitives::tcp::WriteCheck(std::sync::Arc::new(
            move |origin, offset, len| origin == 0 && offset >= bulk && offset + len <= bulk + half,
        ))),
        ..config(2000)
    };
    let hand = HandDriven::start(1, &t.layout, &cfg);
    let addr = hand.dir[1].unwrap();
    // Claiming node 0 without its key, or with another node's: refused.
    assert!(RawPeer::connect(addr, 1, &hand.me).is_err(), "no identity");
    let mut wrong = hand.me.clone();
    wrong.identity = Some(two.clone());
    assert!(
        RawPeer::connect(addr, 1, &wrong).is_err(),
        "node 2's key as node 0"
    );
    // As itself: taken.
    let mut me = hand.me.clone();
    me.identity = Some(zero.clone());
    let mut peer = RawPeer::connect(addr, 1, &me).expect("node 0 with its own key");
    let mut send = |origin: u32, seq: u64, at: u64| {
        let key = OpKey { origin, seq };
        // From `origin` down the chain 0, 1 (for origin 2: 2, 0, 1): node 0 is node 1's
        // parent either way, as the tree rule asks.
        let begin = XferBegin {
            key,
            dest: "0-1".parse().unwrap(),
            fanout: 1,
            offset: bulk + at,
            len: 8,
            remote_event: Some(t.data.index() as u32),
            timeout_ms: 5000,
            on_arrival: true,
        };
        peer.send_control(&Control::Xfer(XferMsg::Begin(begin)))
            .unwrap();
        peer.send(&OutFrame::data(key, 0, Bytes::from_static(b"written!")))
            .unwrap();
        peer.recv_control().unwrap()
    };
    // Its own write lands; one for node 2, or outside its area, is refused.
    assert!(
        matches!(send(0, 1, 0), Control::Xfer(XferMsg::Committed(_))),
        "node 0's own write"
    );
    let as_two = send(2, 2, 8);
    assert!(
        matches!(&as_two, Control::Xfer(XferMsg::Nack(_, e)) if e.to_string().contains("may not act for node 2")),
        "{as_two:?}"
    );
    let outside = send(0, 3, half + 8);
    assert!(
        matches!(&outside, Control::Xfer(XferMsg::Nack(_, e)) if e.to_string().contains("not its own area")),
        "{outside:?}"
    );
    let mut seen = [0u8; 8];
    hand.nodes[0].memory().read(bulk + 8, &mut seen).unwrap();
    assert_eq!(seen, [0; 8], "the write for node 2 did not land");
}
