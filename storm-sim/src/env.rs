//! The machine manager's environment in the simulator: the virtual clock, root as the
//! operator, and program transfers that take the launch model's time.
//!
//! A transfer moves no bytes. It completes [`TransferModel::time`] after it starts, in
//! virtual time: then every node of the job that is still reachable acknowledges the program
//! as the NM's receiver does (`file_ack(transfer, true)`), and the MM's worker reports the
//! transfer done. What the MM does around it (placing the job, checking the acknowledgements
//! with COMPARE-AND-WRITE at its heartbeat, launching) is its own code, so a simulated launch
//! is the model's transfer plus the real protocol's rounds: the critical path
//! docs/launch-model.md compares with STORM's Fig. 8.

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crossbeam_channel::Sender;
use storm_cluster::RmLayout;
use storm_cluster::clock::{Clock, VirtualClock};
use storm_mm::MmEnv;
use storm_mm::transfer::{Transfer, TransferDone};
use storm_primitives::Primitives;

/// The parameters of the launch model's transfer time (docs/launch-model.md, "Parameters"),
/// by default those measured for tcp on this project's host.
#[derive(Debug, Clone, Copy)]
pub struct TransferModel {
    /// Reading the program at the MM (bytes/s).
    pub bw_read: f64,
    /// One link (bytes/s).
    pub bw_link: f64,
    /// What one node absorbs: receive, forward, spool write, checksum (bytes/s).
    pub bw_node: f64,
    /// The broadcast tree's fanout.
    pub fanout: u32,
    /// One-way latency of a small frame over one edge.
    pub hop: Duration,
    /// The backend's chunk (`[tcp] chunk_bytes`).
    pub tree_chunk: u64,
    /// The chunk queue's chunk (`transfer_chunk_bytes`) and slots (`transfer_slots`).
    pub queue_chunk: u64,
    pub queue_slots: u64,
}

impl Default for TransferModel {
    fn default() -> Self {
        let cluster = storm_cluster::config::ClusterSection::default();
        Self {
            bw_read: 10e9,
            bw_link: 3.1e9,
            bw_node: 0.8e9,
            fanout: 2,
            hop: Duration::from_micros(37),
            tree_chunk: 256 << 10,
            queue_chunk: cluster.transfer_chunk_bytes as u64,
            queue_slots: cluster.transfer_slots as u64,
        }
    }
}

impl TransferModel {
    /// Depth of the broadcast tree over the MM and `nodes` nodes.
    pub fn depth(&self, nodes: u32) -> u32 {
        let k = self.fanout.max(1) as f64;
        if k <= 1.0 {
            return nodes;
        }
        // floor(log_k(N + 1)), the levels below the MM.
        ((nodes as f64 + 1.0).ln() / k.ln()).floor().max(1.0) as u32
    }

    /// T_transfer(N) = S / min(BW_read, BW_link / k, BW_node) + T_fill + T_flow.
    pub fn time(&self, nodes: u32, bytes: u64) -> Duration {
        let d = self.depth(nodes) as f64;
        let h = self.hop.as_secs_f64();
        let bw = self
            .bw_read
            .min(self.bw_link / self.fanout.max(1) as f64)
            .min(self.bw_node);
        let stream = bytes as f64 / bw;
        // Chunks are applied on arrival: down the tree and `Committed` back up, 2·d hops.
        let fill = d * self.tree_chunk as f64 / self.bw_link + 2.0 * d * h;
        let rounds = bytes.div_ceil(self.queue_slots.max(1) * self.queue_chunk.max(1)) as f64;
        let flow = rounds * (2.0 * d + 2.0) * h;
        Duration::from_secs_f64(stream + fill + flow)
    }
}

/// A transfer in flight: when it completes, and whom to tell.
pub struct Flight {
    pub due: Instant,
    pub transfer: Transfer,
    pub done: Sender<TransferDone>,
}

pub struct SimEnv {
    pub clock: Arc<VirtualClock>,
    pub model: TransferModel,
    /// Transfers in flight, completed by [`crate::Sim::step`] when they are due.
    pub flights: Arc<Mutex<Vec<Flight>>>,
}

impl MmEnv for SimEnv {
    fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    fn operator_uid(&self) -> u32 {
        0
    }

    fn start_transfer(
        &mut self,
        _fabric: Arc<dyn Primitives>,
        _rm: &RmLayout,
        t: Transfer,
        done: Sender<TransferDone>,
    ) {
        let due = self.clock.now() + self.model.time(t.nodes.len() as u32, t.size);
        self.flights.lock().expect("flights").push(Flight {
            due,
            transfer: t,
            done,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The figures of docs/launch-model.md's tcp table, from the same parameters.
    #[test]
    fn the_model_gives_the_documented_transfer_times_for_12_mb() {
        let m = TransferModel::default();
        let s = 12_000_000;
        assert_eq!((m.depth(1), m.depth(64), m.depth(16_384)), (1, 6, 14));
        let ms = |n| m.time(n, s).as_secs_f64() * 1e3;
        // S / BW_node alone is 15 ms; the tree's fill and AWAIT-SPACE rounds grow with depth.
        assert!((15.0..18.0).contains(&ms(1)), "{}", ms(1));
        assert!(ms(64) > ms(1) && ms(16_384) > ms(64));
        assert!((20.0..21.0).contains(&ms(16_384)), "{}", ms(16_384));
    }
}
