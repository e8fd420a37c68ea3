//! The output forwarder tells its host when a task's streams count as drained: the NM then
//! reports the task's end at once instead of at its next heartbeat.

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use storm_cluster::messages::Stream;
use storm_cluster::{ClusterConfig, RmLayout};
use storm_nm::output::{Forwarder, OutputStream};
use storm_primitives::helpers::QueueConsumer;
use storm_primitives::local::LocalFabric;
use storm_primitives::{Primitives, Wait};

fn layout() -> (ClusterConfig, RmLayout) {
    let cfg = ClusterConfig::parse(
        r#"
        [cluster]
        name = "wake"
        [mm]
        address = "127.0.0.1:7000"
        [[node]]
        name = "n0"
        address = "127.0.0.1:0"
        spool = "/nonexistent/wake"
        "#,
    )
    .expect("cluster file");
    let rm = RmLayout::new(&cfg).expect("layout");
    (cfg, rm)
}

/// The wake comes once the stream's data is delivered and it counts as drained, not before;
/// and it ends the NM's wait for its heartbeat, with no heartbeat.
#[test]
fn a_drained_stream_wakes_the_nm_waiting_for_its_heartbeat() {
    let (cfg, rm) = layout();
    let fabric = LocalFabric::new(cfg.node_count() + 1, rm.layout.clone());
    let mm = fabric.node(cfg.mm_id());
    let node: Arc<dyn Primitives> = Arc::new(fabric.node(0));
    let mut output = QueueConsumer::new(&mm, rm.output[0], 1).unwrap();
    let mut heartbeats = QueueConsumer::new(&*node, rm.heartbeat, 1).unwrap();

    let remaining = Arc::new(AtomicU32::new(1));
    let woken_drained = Arc::new(AtomicU32::new(0));
    let mut f = Forwarder::new(node.clone(), &rm, 0, cfg.mm_id(), Duration::from_secs(1));
    {
        let (remaining, woken, node) = (remaining.clone(), woken_drained.clone(), node.clone());
        let arrived = rm.heartbeat.arrived;
        f.wake_on_drained(Box::new(move || {
            // Only once the stream counts as drained.
            assert_eq!(remaining.load(Ordering::Acquire), 0);
            woken.fetch_add(1, Ordering::AcqRel);
            node.wake_local(arrived).unwrap();
        }));
    }
    let now = Instant::now();
    f.new_epoch(1, now);
    let mut s = OutputStream::new(7, 0, Stream::Stdout, remaining.clone());
    f.data(&mut s, b"last words\n");
    f.step(now);
    assert_eq!(woken_drained.load(Ordering::Acquire), 0, "still open");
    f.closed(s);
    for _ in 0..1000 {
        f.step(Instant::now());
        if woken_drained.load(Ordering::Acquire) > 0 {
            break;
        }
    }
    assert_eq!(woken_drained.load(Ordering::Acquire), 1);
    assert!(
        output.dequeue(&mm, Wait::Poll).unwrap().is_some(),
        "the data went first"
    );
    // The NM's wait for its heartbeat ends at once, with no heartbeat.
    let far = Instant::now() + Duration::from_secs(600);
    let waited = heartbeats.dequeue(&*node, Wait::Timeout(Duration::from_secs(600)));
    assert_eq!(waited.unwrap(), None);
    assert!(Instant::now() < far, "the wait ran to its end");
}
