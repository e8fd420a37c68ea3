//! The nodes' health verdicts (`storm_cluster::health`), as the records sweep finds them
//! ([`super::records`]). A sick verdict takes the node out of allocation with the verdict's
//! reason (`storm nodes` shows it as drained, or draining while jobs run there); a fresh
//! healthy verdict puts it back. This drain is the node's own: it does not touch an
//! operator's `storm drain`, which stays until `storm resume` whatever the node says.
//!
//! A verdict older than [`STALE_PERIODS`] sample periods is not acted on either way: the
//! node stopped sampling, and the heartbeat's rules judge a silent node.

use storm_cluster::health::NodeHealth;
use storm_cluster::sample::STALE_PERIODS;
use storm_primitives::NodeId;

use super::{MachineManager, MmEnv};

impl<E: MmEnv> MachineManager<E> {
    /// Drains node `n` or lifts its drain as `verdict` says, if it is fresh at `now_ms`.
    pub(super) fn act_on_health(&mut self, n: NodeId, verdict: NodeHealth, now_ms: u64) {
        let stale_ms = STALE_PERIODS * self.cfg.monitoring.sample_ms;
        if now_ms.saturating_sub(verdict.taken_ms) > stale_ms
            || self.nodes.get(n).sick == verdict.sick
        {
            return;
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
