//! The tcp backend with every node but one in its own process: transfers verified in each
//! process's memory, `kill -9` in the middle of a transfer, SIGSTOP of a process, compare-and-
//! swap across processes, and garbage sent to a node's port.

mod support;

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

use bytes::Bytes;
use storm_primitives::conformance::pattern;
use storm_primitives::tcp::TcpConfig;
use storm_primitives::tcp::wire::{Control, Hello, OutFrame};
use storm_primitives::{NodeSet, Primitives, Relation, Wait, fnv1a64};
use support::ProcessCluster;

fn config() -> TcpConfig {
    TcpConfig {
        op_timeout: Duration::from_secs(3),
        ..TcpConfig::default()
    }
}

#[test]
fn megabytes_reach_every_process_byte_for_byte() {
    let mut c = ProcessCluster::start(7, &config());
    let data = pattern((9 << 20) + 77, 5);
    let offset = c.t.bulk.offset + 3;
    assert_eq!(
        c.xfer(&c.all(), offset, Bytes::from(data.clone())),
        Ok(true)
    );
    assert!(
        c.command(&format!("checksum {offset} {}", data.len()), fnv1a64(&data)),
        "some process holds different bytes"
    );
    assert_eq!(c.node0.memory().read_vec(offset, data.len()).unwrap(), data);
    assert!(
        c.await_value(&c.agent_ids(), c.t.signals, 1),
        "each process saw one signal"
    );
}

/// A stopped process (SIGSTOP: its kernel still acknowledges TCP, so no connection breaks)
/// fails the operations that include it within their own timeout, naming it and not the
/// processes behind it, while operations around it go on; SIGCONT brings it back.
#[test]
fn a_stopped_process_is_named_within_the_timeout_and_the_rest_go_on() {
    use nix::sys::signal::Signal;
    let c = ProcessCluster::start(6, &config());
    // Node 5 sits behind node 2 in the binary tree from node 0.
    c.signal(5, Signal::SIGSTOP);
    let timeout = Duration::from_millis(200);
    let began = std::time::Instant::now();
    c.node0
        .xfer_and_signal_within(
            &c.all(),
            c.t.small.offset,
            Bytes::from_static(b"stopped"),
            Some(c.t.data),
            Some(c.t.done),
            Some(timeout),
        )
        .unwrap();
    let err = c
        .node0
        .test_event(c.t.done, Wait::Timeout(Duration::from_secs(10)))
        .expect_err("a transfer including a stopped process fails");
    assert!(
        began.elapsed() < Duration::from_secs(2),
        "failed after {:?}, not within its own timeout (the configured one is 3 s): {err}",
        began.elapsed()
    );
    assert_eq!(err.blamed(), NodeSet::single(5), "{err}");
    let without: NodeSet = "0-4".parse().unwrap();
    assert_eq!(
        c.node0
            .compare_and_write_within(&without, c.t.a, Relation::Eq, 0, None, Some(timeout)),
        Ok(true),
        "the others answer at once"
    );
    let err = c
        .node0
        .compare_and_write_within(&c.all(), c.t.a, Relation::Eq, 0, None, Some(timeout))
        .expect_err("a compare-and-write including a stopped process fails");
    assert_eq!(err.blamed(), NodeSet::single(5), "{err}");
    c.signal(5, Signal::SIGCONT);
    assert!(
        c.await_value(&c.all(), c.t.a, 0),
        "the resumed process answers again"
    );
}

#[test]
fn kill_9_mid_transfer_fails_it_and_signals_no_process() {
    let mut caught = false;
    for attempt in 0..5 {
        let mut c = ProcessCluster::start(6, &config());
        let data = Bytes::from(pattern(32 << 20, attempt));
        c.node0
            .xfer_and_signal(
                &c.all(),
                c.t.bulk.offset,
                data,
                Some(c.t.data),
                Some(c.t.done),
            )
            .unwrap();
        std::thread::sleep(Duration::from_millis(3 + 4 * attempt));
        c.kill(4);
        let survivors: NodeSet = "1-3,5".parse().unwrap();
        match c.node0.test_event(
            c.t.done,
            Wait::Timeout(storm_primitives::conformance::PATIENCE),
        ) {
            Err(e) => {
                caught = true;
                let text = e.to_string();
                assert!(text.contains("node"), "the error names a node: {text}");
                std::thread::sleep(Duration::from_millis(200));
                assert!(
                    c.node0
                        .compare_and_write(&survivors, c.t.signals, Relation::Eq, 0, None)
                        .unwrap(),
                    "a surviving process raised the event of a failed transfer"
                );
                assert_eq!(
                    c.node0.test_event(c.t.data, Wait::Poll),
                    Ok(false),
                    "node 0 signalled"
                );
                // The survivors carry on.
                let with0 = survivors.union(&NodeSet::single(0));
                assert_eq!(
                    c.xfer(&with0, c.t.small.offset, Bytes::from_static(b"after")),
                    Ok(true)
                );
                assert!(c.await_value(&survivors, c.t.signals, 1));
                break;
            }
            Ok(true) => continue, // finished before the kill landed; try again with a later kill
            Ok(false) => panic!("the transfer's outcome never arrived"),
        }
    }
    assert!(caught, "never killed a process mid-transfer");
}

#[test]
fn compare_and_swap_from_many_processes_counts_exactly() {
    let mut c = ProcessCluster::start(5, &config());
    let all = c.all().to_string();
    // Each of the 4 processes does 30 increments on all 5 nodes.
    assert!(c.command(&format!("cas 30 {all}"), 30));
    assert!(
        c.node0
            .compare_and_write(&c.all(), c.t.counter, Relation::Eq, 120, None)
            .unwrap()
    );
}

fn expect_closed(mut s: TcpStream) {
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let mut buf = [0u8; 64];
    // Either a rejection frame then EOF, or EOF at once; never a hang.
    loop {
        match s.read(&mut buf) {
            Ok(0) => return,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return,
            Err(e) => panic!("node kept a garbage connection open: {e}"),
        }
    }
}

#[test]
fn garbage_on_a_nodes_port_is_refused_and_the_node_keeps_working() {
    let c = ProcessCluster::start(4, &config());
    for addr in [c.agents[0].addr, c.agents[2].addr, c.node0.local_addr()] {
        // Random bytes.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(&pattern(5000, 1)).unwrap();
        expect_closed(s);
        // A header claiming a 4 GB body.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"STRM\x02\x01\x00\x00\xff\xff\xff\xff")
            .unwrap();
        expect_closed(s);
        // A handshake from a node with another layout: refused, and told nothing more (the
        // reason is logged where it was decided).
        let mut s = TcpStream::connect(addr).unwrap();
        let hello = Control::Hello(Hello {
            node: 2,
            cluster_size: 4,
            layout_fingerprint: 1,
            protection: 1,
            nonce: [0; 32],
        });
        s.write_all(&OutFrame::control(&hello).to_vec()).unwrap();
        let mut reply = Vec::new();
        s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let _ = s.read_to_end(&mut reply);
        let reply = String::from_utf8_lossy(&reply);
        assert!(
            reply.contains("refused") && !reply.contains("layout") && !reply.contains("size"),
            "the rejection says only \"refused\": {reply:?}"
        );
        // Truncated frame, then the connection closes.
        let mut s = TcpStream::connect(addr).unwrap();
        s.write_all(b"STRM\x01").unwrap();
        drop(s);
    }
    let data = pattern(1 << 20, 3);
    assert_eq!(
        c.xfer(&c.all(), c.t.bulk.offset, Bytes::from(data)),
        Ok(true)
    );
    assert!(c.await_value(&c.agent_ids(), c.t.signals, 1));
}
