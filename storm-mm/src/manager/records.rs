//! The records sweep: once per sample period the MM looks at every node's sample and health
//! verdict, which the NMs put into its own memory (`storm_cluster::sample`, no message and no
//! connection). The sample goes into the node's history ([`crate::node_history`]); the
//! verdict drains or lifts the node ([`super::health`]).
//!
//! The sweep is spread over the period's timeslices: at each one the MM looks at the share
//! of the nodes that is due, so that a cluster of 16,384 nodes costs a timeslice 16 nodes'
//! worth (1 ms timeslices, 1 s samples), never all of them at once.

use std::time::{Duration, Instant};

use storm_cluster::health::NodeHealth;
use storm_cluster::sample::{NodeSample, RECORD_BYTES, RecordError};
use storm_cluster::usage::{NodeUsage, USAGE_BYTES, USAGE_HEADER_BYTES};
use storm_primitives::NodeId;

use super::{MachineManager, MmEnv};

/// Where the sweep of this period stands.
#[derive(Debug, Clone, Copy)]
pub(super) struct Sweep {
    /// When this period's sweep began.
    began: Instant,
    /// Nodes looked at so far in it.
    done: usize,
}

impl Sweep {
    pub(super) fn new(now: Instant) -> Self {
        Self {
            began: now,
            done: 0,
        }
    }
}

/// How many of `nodes` nodes are due `elapsed` into a sweep of `period`.
fn due(nodes: usize, elapsed: Duration, period: Duration) -> usize {
    if elapsed >= period || period.is_zero() {
        return nodes;
    }
    let share = nodes as u128 * elapsed.as_nanos();
    share.div_ceil(period.as_nanos()) as usize
}

impl<E: MmEnv> MachineManager<E> {
    /// Looks at the records of the nodes due by `now`.
    pub(super) fn sweep_records(&mut self, now: Instant) {
        let period = self.cfg.monitoring.period();
        let nodes = self.nodes.len();
        let elapsed = now.saturating_duration_since(self.sweep.began);
        let target = due(nodes, elapsed, period);
        if target > self.sweep.done {
            let now_ms = self.unix_ms();
            for n in self.sweep.done..target {
                self.look_at_records(n as NodeId, now_ms);
            }
            self.sweep.done = target;
        }
        if elapsed >= period {
            self.sweep = Sweep::new(now);
        }
    }

    /// Node `n`'s sample into its history, and its health verdict acted on.
    fn look_at_records(&mut self, n: NodeId, now_ms: u64) {
        let at = self.rm.sample_offset(n as usize);
        match read_twice(|| self.read_record(at).and_then(|b| NodeSample::decode(&b))) {
            Ok(Some(sample)) => self.node_history.record(n as usize, &sample),
            Ok(None) => {}
            Err(e) => tracing::debug!(node = n, "sample unreadable: {e}"),
        }
        let at = self.rm.health_record_offset(n as usize);
        match read_twice(|| self.read_record(at).and_then(|b| NodeHealth::decode(&b))) {
            Ok(Some(verdict)) => self.act_on_health(n, verdict, now_ms),
            Ok(None) => {}
            Err(e) => tracing::debug!(node = n, "health verdict unreadable: {e}"),
        }
    }

    /// The record at `offset` of the MM's memory, as bytes.
    pub(super) fn read_record(&self, offset: u64) -> Result<[u8; RECORD_BYTES], RecordError> {
        self.read_bytes(offset)
    }

    /// The usage record at `offset` of the MM's memory, as bytes: its header, the jobs' figures
    /// its count says it holds, and its closing sequence number (read last, so that a record
    /// that changed meanwhile is seen torn). The bytes between are zeros in a well-formed
    /// record and are not read: a gather of every node reads a job's worth, not 512 bytes,
    /// per node.
    pub(super) fn read_usage(&self, offset: u64) -> Result<[u8; USAGE_BYTES], RecordError> {
        let mut buf = [0u8; USAGE_BYTES];
        self.read_into(offset, &mut buf[..USAGE_HEADER_BYTES])?;
        let used = NodeUsage::used_bytes(&buf[..USAGE_HEADER_BYTES]).min(USAGE_BYTES - 8);
        if used > USAGE_HEADER_BYTES {
            self.read_into(
                offset + USAGE_HEADER_BYTES as u64,
                &mut buf[USAGE_HEADER_BYTES..used],
            )?;
        }
        self.read_into(
            offset + (USAGE_BYTES - 8) as u64,
            &mut buf[USAGE_BYTES - 8..],
        )?;
        Ok(buf)
    }

    fn read_bytes<const N: usize>(&self, offset: u64) -> Result<[u8; N], RecordError> {
        let mut buf = [0u8; N];
        self.read_into(offset, &mut buf).map(|()| buf)
    }

    fn read_into(&self, offset: u64, buf: &mut [u8]) -> Result<(), RecordError> {
        self.prims
            .memory()
            .read(offset, buf)
            .map_err(|e| RecordError::Field {
                field: "slot",
                value: e.to_string(),
            })
    }
}

/// A record read again once if it was caught while the next one landed.
pub(super) fn read_twice<T>(read: impl Fn() -> Result<T, RecordError>) -> Result<T, RecordError> {
    match read() {
        Err(RecordError::Torn(..)) => read(),
        other => other,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sweep_spreads_the_nodes_over_its_period() {
        let p = Duration::from_secs(1);
        assert_eq!(due(16_384, Duration::ZERO, p), 0);
        assert_eq!(due(16_384, Duration::from_millis(1), p), 17);
        assert_eq!(due(16_384, Duration::from_millis(500), p), 8_192);
        assert_eq!(due(16_384, p, p), 16_384);
        assert_eq!(due(3, Duration::from_millis(1), p), 1);
        assert_eq!(due(3, Duration::from_secs(9), p), 3, "an MM that stalled");
    }
}
