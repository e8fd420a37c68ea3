//! The MM's part in a PMIx job's exchange beyond its fences (docs/mpi.md, "Direct modex and
//! ranks' ends"): it reads what each node of the job wrote of its state
//! (`pmix_up[slot][node]`: the remote ranks its clients want, the data of its own ranks it
//! was asked for, its ranks that ended badly), derives what goes down
//! ([`storm_cluster::messages::pmix_down`]: ranks to ask for, data to deliver, failures, every
//! node's ends) and, when that changed, sends it to the job's nodes in one XFER-AND-SIGNAL
//! (`pmix_down[slot]`, raising `pmi_down_event`).
//!
//! Rooted at the MM for the reason fences are (compute nodes accept writes only from the
//! MM). Every message is a whole state, so a lost or overwritten one costs a round, never a
//! request.

use std::collections::BTreeSet;

use bytes::Bytes;
use storm_cluster::messages::{JobId, PmixUp, decode_sealed, encode_sealed, pmix_down};
use storm_primitives::{NodeSet, Wait};

use super::{MachineManager, MmEnv, Phase};

/// A sealed message's length and checksum, which name what was sent.
const SEAL_BYTES: usize = 12;

impl<E: MmEnv> MachineManager<E> {
    /// Sends each running multi-node PMIx job's nodes what changed of its exchange (called
    /// when a node wrote to the MM, or a send is to be retried).
    pub(super) fn pmix_exchange(&mut self) {
        let jobs: Vec<(JobId, usize, NodeSet, u32)> = self
            .jobs
            .values()
            .filter(|j| j.req.mpi.serves_pmix())
            .filter(|j| j.nodes.len() > 1 && j.cancel.is_none())
            .filter(|j| matches!(j.phase, Phase::Running | Phase::Recovering))
            .filter_map(|j| Some((j.id, j.slot?, j.nodes.clone(), j.plan.ntasks)))
            .collect();
        let live: BTreeSet<JobId> = jobs.iter().map(|(id, ..)| *id).collect();
        self.pmix_sent.retain(|id, _| live.contains(id));
        for (id, slot, nodes, ntasks) in jobs {
            let parts: Vec<Option<PmixUp>> = nodes
                .iter()
                .map(|n| self.pmix_part(slot, n as usize))
                .collect();
            if parts.iter().all(Option::is_none) {
                continue;
            }
            let limit = self.rm.pmi_job_bytes - SEAL_BYTES - 64;
            let down = pmix_down(id, &parts, ntasks, limit);
            let bytes = match encode_sealed("PMIx exchange", &down, self.rm.pmi_job_bytes) {
                Ok(b) => b,
                Err(e) => {
                    tracing::error!(job = id, "PMIx exchange: {e}");
                    continue;
                }
            };
            let mut seal = [0u8; SEAL_BYTES];
            seal.copy_from_slice(&bytes[..SEAL_BYTES]);
            if self.pmix_sent.get(&id) == Some(&seal) {
                continue;
            }
            let sent = self
                .prims
                .xfer_and_signal(
                    &nodes,
                    self.rm.pmix_down_offset(slot),
                    Bytes::from(bytes),
                    Some(self.rm.pmi_down_event),
                    Some(self.rm.pmi_down_sent),
                )
                .and_then(|()| {
                    self.prims.test_event(
                        self.rm.pmi_down_sent,
                        Wait::Timeout(self.cfg.heartbeat_deadline()),
                    )
                });
            match sent {
                Ok(true) => {
                    self.pmix_sent.insert(id, seal);
                    tracing::debug!(
                        job = id,
                        asks = down.asks.len(),
                        blobs = down.blobs.len(),
                        ended = down.ended.len(),
                        "PMIx exchange sent"
                    );
                }
                Ok(false) => {
                    tracing::warn!(job = id, "PMIx exchange not confirmed in time");
                    self.pmi_recheck = true;
                }
                Err(e) => {
                    tracing::warn!(job = id, "cannot send a PMIx exchange: {e}");
                    self.pmi_recheck = true;
                    self.blame(&e);
                }
            }
        }
    }

    /// What node `node` wrote of its state for the job in `slot`, if anything (the job is
    /// checked by [`pmix_down`]).
    fn pmix_part(&self, slot: usize, node: usize) -> Option<PmixUp> {
        let limit = self.rm.pmi_node_bytes;
        let mem = self.prims.memory();
        let offset = self.rm.pmix_up_offset(slot, node);
        let mut seal = [0u8; SEAL_BYTES];
        mem.read(offset, &mut seal).ok()?;
        if seal == [0; SEAL_BYTES] {
            return None;
        }
        let len = u32::from_le_bytes([seal[0], seal[1], seal[2], seal[3]]) as usize;
        let bytes = mem.read_vec(offset, (SEAL_BYTES + len).min(limit)).ok()?;
        decode_sealed("PMIx exchange", &bytes, limit).ok()
    }
}
