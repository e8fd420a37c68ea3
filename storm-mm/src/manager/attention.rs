//! Which nodes the MM looks at in a timeslice: the ones that signalled, not all of them.
//!
//! Every NM writes into its own part of the MM's memory (an output queue, a registry entry)
//! and raises an event there. Scanning every node's part each timeslice costs O(N) whether
//! anything happened or not; instead the MM asks its endpoint which events were raised
//! ([`Primitives::ready_events`]) and looks only at those nodes, plus the few it is waiting
//! on (output not yet released, a welcome not yet acknowledged). Once a second it sweeps
//! every node anyway, which bounds the cost of any signal it did not act on, and is when
//! the nodes outside the heartbeat are nudged.

use std::collections::{BTreeSet, HashMap};
use std::time::{Duration, Instant};

use storm_cluster::RmLayout;
use storm_primitives::{EventId, NodeId, Primitives};

/// How often every node is looked at, signal or not.
pub(super) const SWEEP_EVERY: Duration = Duration::from_secs(1);

pub(super) struct Attention {
    /// The MM's output queue events, by node.
    output_event: HashMap<EventId, NodeId>,
    registered: EventId,
    ready: Vec<EventId>,
    /// Nodes whose output queue was signalled this timeslice.
    pub output_signalled: BTreeSet<NodeId>,
    /// Nodes with output taken but not released (it waits for a submitter to read).
    pub output_waiting: BTreeSet<NodeId>,
    /// Some NM registered or acknowledged a welcome this timeslice.
    pub registrations: bool,
    /// Nodes welcomed and not yet admitted.
    pub joining: BTreeSet<NodeId>,
    next_sweep: Instant,
    /// This timeslice is a sweep.
    pub sweep: bool,
}

impl Attention {
    pub fn new(rm: &RmLayout, now: Instant) -> Self {
        Self {
            output_event: rm
                .output
                .iter()
                .enumerate()
                .map(|(n, q)| (q.arrived, n as NodeId))
                .collect(),
            registered: rm.registered,
            ready: Vec::new(),
            output_signalled: BTreeSet::new(),
            output_waiting: BTreeSet::new(),
            registrations: false,
            joining: BTreeSet::new(),
            next_sweep: now,
            sweep: true,
        }
    }

    /// Takes the events raised since the last timeslice, and whether this one is a sweep.
    pub fn collect(&mut self, prims: &dyn Primitives, now: Instant) {
        self.sweep = now >= self.next_sweep;
        if self.sweep {
            self.next_sweep = now + SWEEP_EVERY;
        }
        self.output_signalled.clear();
        self.registrations = false;
        prims.ready_events(&mut self.ready);
        for ev in self.ready.drain(..) {
            if ev == self.registered {
                self.registrations = true;
            } else if let Some(&n) = self.output_event.get(&ev) {
                self.output_signalled.insert(n);
            }
        }
    }

    /// The nodes whose output to look at: all of them in a sweep, else those signalled or
    /// waiting.
    pub fn output_nodes(&self, all: u32) -> Vec<NodeId> {
        if self.sweep {
            return (0..all).collect();
        }
        self.output_signalled
            .union(&self.output_waiting)
            .copied()
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;
    use storm_cluster::ClusterConfig;
    use storm_primitives::NodeSet;
    use storm_primitives::local::LocalFabric;

    fn cluster() -> (ClusterConfig, RmLayout) {
        let cfg = ClusterConfig::parse(
            r#"
            [cluster]
            name = "t"
            [mm]
            address = "127.0.0.1:7000"
            [[node]]
            name = "n[0-7]"
            address = "127.0.0.1:0"
            spool = "/nonexistent"
            "#,
        )
        .unwrap();
        let rm = RmLayout::new(&cfg).unwrap();
        (cfg, rm)
    }

    #[test]
    fn only_the_nodes_that_signalled_are_looked_at_between_sweeps() {
        let (cfg, rm) = cluster();
        let fabric = LocalFabric::new(cfg.node_count() + 1, rm.layout.clone());
        let mm = fabric.node(cfg.mm_id());
        let start = Instant::now();
        let mut a = Attention::new(&rm, start);
        a.collect(&mm, start);
        assert!(a.sweep, "the first timeslice looks at every node");
        assert_eq!(a.output_nodes(8).len(), 8);
        let to_mm = NodeSet::single(cfg.mm_id());
        for n in [2, 5] {
            let q = rm.output[n];
            fabric
                .node(n as NodeId)
                .xfer_and_signal(&to_mm, q.slots.offset, Bytes::new(), Some(q.arrived), None)
                .unwrap();
        }
        let later = start + Duration::from_millis(10);
        a.collect(&mm, later);
        assert!(!a.sweep);
        assert!(!a.registrations);
        assert_eq!(
            a.output_nodes(8),
            vec![2, 5],
            "the signalled queues, no others"
        );
        a.output_waiting.insert(7);
        a.collect(&mm, later + Duration::from_millis(10));
        assert_eq!(
            a.output_nodes(8),
            vec![7],
            "signals are taken once; waiting stays"
        );
        fabric
            .node(3)
            .xfer_and_signal(
                &to_mm,
                rm.registry.at(3).offset(),
                Bytes::from_static(&[1; 8]),
                Some(rm.registered),
                None,
            )
            .unwrap();
        a.collect(&mm, later + Duration::from_millis(20));
        assert!(
            a.registrations,
            "a registration asks for the registry to be read"
        );
        a.collect(&mm, start + SWEEP_EVERY);
        assert!(a.sweep, "a sweep once a second");
        assert_eq!(a.output_nodes(8).len(), 8);
    }
}
