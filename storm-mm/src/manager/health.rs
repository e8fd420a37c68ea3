//! The nodes' health verdicts (`storm_cluster::health`): once per sample period the MM looks
//! at the verdict each NM put beside its sample, in the MM's own memory (no message, no
//! connection). A sick verdict takes the node out of allocation with the verdict's reason
//! (`storm nodes` shows it as drained, or draining while jobs run there); a fresh healthy
//! verdict puts it back. This drain is the node's own: it does not touch an operator's
//! `storm drain`, which stays until `storm resume` whatever the node says.
//!
//! A verdict older than [`STALE_PERIODS`] sample periods is not acted on either way: the
//! node stopped sampling, and the heartbeat's rules judge a silent node.

use std::time::Instant;

use storm_cluster::health::NodeHealth;
use storm_cluster::sample::{RECORD_BYTES, RecordError, STALE_PERIODS};
use storm_primitives::NodeId;

use super::{MachineManager, MmEnv};

impl<E: MmEnv> MachineManager<E> {
    /// Acts on the verdicts, once per sample period.
    pub(super) fn check_health(&mut self, now: Instant) {
        if now < self.next_health_check {
            return;
        }
        self.next_health_check = now + self.cfg.monitoring.period();
        let now_ms = self.unix_ms();
        let stale_ms = STALE_PERIODS * self.cfg.monitoring.sample_ms;
        for n in 0..self.nodes.len() as NodeId {
            let offset = self.rm.health_record_offset(n as usize);
            let verdict = match read_twice(|| {
                self.read_record(offset)
                    .and_then(|b| NodeHealth::decode(&b))
            }) {
                Ok(Some(v)) if now_ms.saturating_sub(v.taken_ms) <= stale_ms => v,
                Ok(_) => continue,
                Err(e) => {
                    tracing::debug!(node = n, "health record unreadable: {e}");
                    continue;
                }
            };
            if self.nodes.get(n).sick == verdict.sick {
                continue;
            }
            let name = self.node_name(n).to_string();
            match verdict.sick {
                Some(reason) => {
                    tracing::warn!(node = n, %name, "node is sick, out of allocation: {reason}");
                    self.nodes.get_mut(n).sick = Some(reason);
                    self.policy.set_unavailable(n);
                }
                None => {
                    tracing::info!(node = n, %name, "node is healthy again");
                    self.nodes.get_mut(n).sick = None;
                    if self.nodes.is_available(n) {
                        self.policy.set_available(n);
                    }
                }
            }
        }
    }

    /// The record at `offset` of the MM's memory, as bytes.
    pub(super) fn read_record(&self, offset: u64) -> Result<[u8; RECORD_BYTES], RecordError> {
        let mut buf = [0u8; RECORD_BYTES];
        self.prims
            .memory()
            .read(offset, &mut buf)
            .map(|()| buf)
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
