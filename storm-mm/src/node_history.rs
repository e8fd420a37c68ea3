//! Each node's recent samples, in a bounded ring (`[monitoring] history_s`, an hour by
//! default): what `storm nodes --history` returns and `--plot` draws.
//!
//! The MM reads every node's sample once per sample period (the records sweep, spread over
//! the timeslices) and keeps the figures a history is read for: CPU utilization, the 1-minute
//! load and memory available. A point is 12 bytes (a time offset, the figures packed), so an
//! hour at 1 s costs 42 KiB per node: 690 MiB at 16,384 nodes. An operator of a cluster that
//! size keeps a shorter history, or none (`history_s = 0`). Pure bookkeeping: no I/O.

use std::collections::VecDeque;

use storm_cluster::sample::{HistoryPoint, NodeSample};

/// One point as kept.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Packed {
    /// Milliseconds after the ring's base.
    dt_ms: u32,
    /// CPU utilization in hundredths of a percent.
    cpu: u16,
    /// 1-minute load in hundredths (at most 655.35).
    load1: u16,
    /// Memory available, MiB.
    mem_avail_mib: u32,
}

#[derive(Debug, Clone, Default)]
struct Ring {
    base_ms: u64,
    points: VecDeque<Packed>,
    /// The sequence number of the last sample kept (a sample is kept once).
    last_seq: u64,
    /// The node's memory at its last sample.
    mem_total: u64,
}

/// Every node's ring.
#[derive(Debug, Clone)]
pub struct NodeHistory {
    /// Points kept per node (0: none).
    cap: usize,
    rings: Vec<Ring>,
}

impl NodeHistory {
    /// Rings of `cap` points for `nodes` nodes (allocated as they fill).
    pub fn new(nodes: usize, cap: usize) -> Self {
        Self {
            cap,
            rings: vec![Ring::default(); if cap == 0 { 0 } else { nodes }],
        }
    }

    /// Keeps `sample` of node `node`, unless it was kept already (the same sequence number)
    /// or history is off.
    pub fn record(&mut self, node: usize, sample: &NodeSample) {
        let cap = self.cap;
        let Some(ring) = self.rings.get_mut(node) else {
            return;
        };
        if sample.seq == ring.last_seq {
            return;
        }
        ring.last_seq = sample.seq;
        ring.mem_total = sample.mem_total;
        let t = sample.taken_ms;
        let last = ring
            .points
            .back()
            .map(|p| ring.base_ms + u64::from(p.dt_ms));
        if last.is_some_and(|last| t < last) {
            // The node's clock went back (or another NM took over): start again from here.
            ring.points.clear();
        }
        if ring.points.is_empty() {
            ring.base_ms = t;
        } else if t - ring.base_ms > u64::from(u32::MAX) {
            // 49 days past the base: points that much older go, and the ring is rebased on
            // the oldest one left.
            let base = ring.base_ms;
            while ring
                .points
                .front()
                .is_some_and(|p| t - (base + u64::from(p.dt_ms)) > u64::from(u32::MAX))
            {
                ring.points.pop_front();
            }
            match ring.points.front().map(|p| p.dt_ms) {
                Some(shift) => {
                    for p in ring.points.iter_mut() {
                        p.dt_ms -= shift;
                    }
                    ring.base_ms = base + u64::from(shift);
                }
                None => ring.base_ms = t,
            }
        }
        if ring.points.len() == cap {
            ring.points.pop_front();
        }
        ring.points.push_back(Packed {
            dt_ms: (t - ring.base_ms) as u32,
            cpu: (sample.cpu_util.clamp(0.0, 1.0) * 10_000.0).round() as u16,
            load1: (sample.load[0] * 100.0)
                .round()
                .clamp(0.0, f32::from(u16::MAX)) as u16,
            mem_avail_mib: (sample.mem_avail >> 20).min(u64::from(u32::MAX)) as u32,
        });
    }

    /// Node `node`'s points taken at `since_ms` or later, oldest first, and its memory.
    pub fn since(&self, node: usize, since_ms: u64) -> (Vec<HistoryPoint>, u64) {
        let Some(ring) = self.rings.get(node) else {
            return (Vec::new(), 0);
        };
        let points = ring
            .points
            .iter()
            .map(|p| HistoryPoint {
                taken_ms: ring.base_ms + u64::from(p.dt_ms),
                cpu_util: f32::from(p.cpu) / 10_000.0,
                load1: f32::from(p.load1) / 100.0,
                mem_avail: u64::from(p.mem_avail_mib) << 20,
            })
            .filter(|p| p.taken_ms >= since_ms)
            .collect();
        (points, ring.mem_total)
    }

    /// How many points node `node` has at `since_ms` or later.
    pub fn count_since(&self, node: usize, since_ms: u64) -> usize {
        self.rings.get(node).map_or(0, |ring| {
            ring.points
                .iter()
                .filter(|p| ring.base_ms + u64::from(p.dt_ms) >= since_ms)
                .count()
        })
    }

    /// Points kept per node.
    pub fn capacity(&self) -> usize {
        self.cap
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample(seq: u64, taken_ms: u64, cpu: f32) -> NodeSample {
        NodeSample {
            seq,
            taken_ms,
            cpu_util: cpu,
            load: [1.25, 0.0, 0.0],
            mem_total: 8 << 30,
            mem_avail: 3 << 30,
            ..Default::default()
        }
    }

    #[test]
    fn the_ring_keeps_the_last_points_once_each() {
        let mut h = NodeHistory::new(2, 3);
        for i in 1..=5u64 {
            h.record(1, &sample(i, 1000 * i, 0.25));
            h.record(1, &sample(i, 1000 * i, 0.25)); // the same sample, looked at again
        }
        let (points, mem) = h.since(1, 0);
        assert_eq!(mem, 8 << 30);
        assert_eq!(
            points.iter().map(|p| p.taken_ms).collect::<Vec<_>>(),
            [3000, 4000, 5000],
            "the oldest went"
        );
        assert_eq!(points[0].cpu_util, 0.25);
        assert_eq!(points[0].load1, 1.25);
        assert_eq!(points[0].mem_avail, 3 << 30);
        assert_eq!(h.since(1, 4000).0.len(), 2);
        assert_eq!(h.count_since(1, 4000), 2);
        assert!(h.since(0, 0).0.is_empty(), "node 0 sent nothing");
    }

    #[test]
    fn a_clock_that_goes_back_or_far_ahead_keeps_the_times_right() {
        let mut h = NodeHistory::new(1, 10);
        h.record(0, &sample(1, 10_000, 0.1));
        h.record(0, &sample(2, 5_000, 0.2));
        assert_eq!(h.since(0, 0).0.len(), 1, "back in time: started again");
        let far = 5_000 + u64::from(u32::MAX) + 7;
        h.record(0, &sample(3, 6_000, 0.3));
        h.record(0, &sample(4, far, 0.4));
        let times: Vec<u64> = h.since(0, 0).0.iter().map(|p| p.taken_ms).collect();
        assert_eq!(
            times,
            [6_000, far],
            "points more than 49 days older are dropped"
        );
        let mut h = NodeHistory::new(1, 10);
        h.record(0, &sample(1, 1_000, 0.1));
        h.record(0, &sample(2, u64::from(u32::MAX) - 10, 0.1));
        h.record(0, &sample(3, u64::from(u32::MAX) + 2_000, 0.1));
        let times: Vec<u64> = h.since(0, 0).0.iter().map(|p| p.taken_ms).collect();
        assert_eq!(
            times,
            [u64::from(u32::MAX) - 10, u64::from(u32::MAX) + 2_000],
            "rebased on the oldest point it could keep"
        );
    }

    #[test]
    fn no_history_keeps_nothing() {
        let mut h = NodeHistory::new(4, 0);
        h.record(2, &sample(1, 1, 0.5));
        assert!(h.since(2, 0).0.is_empty());
    }
}
