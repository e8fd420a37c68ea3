//! The global-memory layout of storm's resource management.
//!
//! Every node holds the *shared* part: what the NMs use (the heartbeat queue, the chunk queue of
//! program transfers, readiness and termination flags, MPI fence results). Its size depends on
//! the `[cluster]` settings, never on the number of nodes. The MM alone also holds the layout's
//! home section: one output queue, report, registration and MPI area per compute node
//! (docs/operations.md gives both sizes as formulas). Pages a node never touches are never
//! backed by memory (the region is allocated zeroed, which large allocations get lazily from
//! the kernel).

use storm_primitives::{Area, EventId, Layout, LayoutError, QueueLayout, VarArray, VarId};

use crate::config::ClusterConfig;

/// Room each node's records take at the MM, in records of [`crate::sample::RECORD_BYTES`]:
/// its sample, its health verdict, its usage (two: [`crate::usage::USAGE_BYTES`]) and its
/// inventory. The first three are neighbours, so that one transfer carries them.
pub const RECORDS_PER_NODE: usize = 5;

/// Bytes of one node's report for one job: job id, count, one status per task, the timing.
pub fn report_bytes(max_tasks_per_node: usize) -> usize {
    16 + 16 * max_tasks_per_node + 96
}

/// Offsets of everything the daemons share.
#[derive(Debug, Clone)]
pub struct RmLayout {
    pub layout: Layout,
    // --- written to the NMs ---
    /// MM to all NMs (Algorithms 4 and 5).
    pub heartbeat: QueueLayout,
    /// MM to a job's NMs: program chunks (Algorithms 6 and 7).
    pub chunks: QueueLayout,
    /// MM to one NM: a [`crate::messages::Membership`] message, signalled with `joined`.
    pub join: Area,
    pub joined: EventId,
    /// Set by an NM to `2*transfer+1` when a received program checks out, `2*transfer` when
    /// it does not.
    pub file_ack: VarId,
    /// Set by an NM asked whether a program is already in place
    /// ([`crate::messages::Command::CheckProgram`]): the [`crate::messages::program_digest`]
    /// of the file it found at that path, 0 if none it could read, written before its
    /// answer in `file_ack`.
    pub program_digest: VarId,
    /// `terminated[slot] = job id` once every local process of that job has ended
    /// (Algorithm 9).
    pub terminated: VarArray,
    // --- written to the MM ---
    /// One output queue per compute node, NM to MM.
    /// One per node, shared by clones (see [`Layout`]'s event names).
    pub output: std::sync::Arc<[QueueLayout]>,
    /// Reports: `reports[slot][node]` holds one node's exit statuses for the job in `slot`.
    pub reports: Area,
    pub report_bytes: usize,
    /// `term_hint[slot] = job id`: the job's last node announces that its processes ended.
    pub term_hint: VarArray,
    /// Raised at the MM with every termination announcement.
    pub term_event: EventId,
    /// `registry[node]`: the stamp of the NM's current registration (NM to MM).
    pub registry: VarArray,
    /// `inventory[node]`: the jobs the NM held when it registered (NM to MM, written just
    /// before its stamp).
    pub inventory: Area,
    pub inventory_bytes: usize,
    /// Bytes of the `join` area.
    pub membership_bytes: usize,
    /// `join_ack[node]`: the stamp whose `Welcome` the NM has carried out (NM to MM).
    pub join_ack: VarArray,
    /// Raised at the MM with every registration and acknowledgement.
    pub registered: EventId,
    /// `node_records[node]`: the node's last sample, its health verdict, its usage, then its
    /// inventory (NM to MM; see [`RmLayout::sample_offset`]).
    pub node_records: Area,
    // --- MPI (PMI) key exchange ---
    /// `pmi_up[slot][node]`: a node's [`crate::messages::PmiUp`] for the job in `slot` (NM
    /// to MM), signalled with `pmi_up_event`.
    pub pmi_up: Area,
    pub pmi_node_bytes: usize,
    pub pmi_up_event: EventId,
    /// `pmi_down[slot]`: the MM's [`crate::messages::PmiFenced`] for the job in `slot`, on
    /// each of its nodes, signalled with `pmi_down_event`.
    pub pmi_down: Area,
    pub pmi_job_bytes: usize,
    pub pmi_down_event: EventId,
    /// `pmix_up[slot][node]`: a node's [`crate::messages::PmixUp`] for the PMIx job in
    /// `slot` (NM to MM, `pmi_node_bytes` each), signalled with `pmi_up_event` too.
    pub pmix_up: Area,
    /// `pmix_down[slot]`: the MM's [`crate::messages::PmixDown`] for the job in `slot`, on
    /// each of its nodes (`pmi_job_bytes`), signalled with `pmi_down_event` too.
    pub pmix_down: Area,
    // --- local completion events (each used by one thread) ---
    /// MM main loop: heartbeat transfers.
    pub hb_sent: EventId,
    /// MM transfer workers, one event each.
    pub chunk_sent: Vec<EventId>,
    /// NM main loop: reports and announcements.
    pub report_sent: EventId,
    /// NM output thread.
    pub output_sent: EventId,
    /// MM main loop: membership messages.
    pub join_sent: EventId,
    /// NM PMI thread: contributions; MM main loop: fence results.
    pub pmi_up_sent: EventId,
    pub pmi_down_sent: EventId,
    /// NM main loop: registrations and acknowledgements.
    pub register_sent: EventId,
    /// NM sampling thread: its records.
    pub record_sent: EventId,
    max_jobs: usize,
    nodes: usize,
}

impl RmLayout {
    pub fn new(cfg: &ClusterConfig) -> Result<Self, LayoutError> {
        let c = &cfg.cluster;
        let nodes = cfg.nodes.len();
        let mut b = Layout::builder();
        // --- shared: on every node, the same size whatever the cluster's ---
        let heartbeat = b.queue("heartbeat", c.heartbeat_slots, c.heartbeat_bytes);
        let chunks = b.queue("chunks", c.transfer_slots, c.transfer_chunk_bytes);
        let membership_bytes = crate::messages::membership_bytes(c.max_jobs);
        let join = b.area("join", membership_bytes);
        let joined = b.event("joined");
        let file_ack = b.var("file.ack");
        let program_digest = b.var("program.digest");
        let terminated = b.array("terminated", c.max_jobs);
        let pmi_job_bytes = c.pmi_job_bytes;
        let pmi_down = b.area("pmi.down", c.max_jobs * pmi_job_bytes);
        let pmi_down_event = b.event("pmi.down.signal");
        let pmix_down = b.area("pmix.down", c.max_jobs * pmi_job_bytes);
        let hb_sent = b.event("heartbeat.sent");
        let chunk_sent = (0..c.max_transfers)
            .map(|i| b.event(&format!("chunk.sent.{i}")))
            .collect();
        let report_sent = b.event("report.sent");
        let output_sent = b.event("output.sent");
        let join_sent = b.event("join.sent");
        let register_sent = b.event("register.sent");
        let pmi_up_sent = b.event("pmi.up.sent");
        let pmi_down_sent = b.event("pmi.down.sent");
        let record_sent = b.event("record.sent");
        // --- the MM's home section: what the MM keeps about every node ---
        b.home_section(cfg.mm_id());
        let output = (0..nodes)
            .map(|i| b.queue(&format!("output.{i}"), c.output_slots, c.output_bytes))
            .collect();
        let report_bytes = report_bytes(c.max_tasks_per_node);
        let reports = b.area("reports", c.max_jobs * nodes * report_bytes);
        let term_hint = b.array("term.hint", c.max_jobs);
        let term_event = b.event("term.event");
        let registry = b.array("registry", nodes);
        let inventory_bytes = crate::messages::inventory_bytes(c.max_jobs);
        let inventory = b.area("inventory", nodes * inventory_bytes);
        let join_ack = b.array("join.ack", nodes);
        let registered = b.event("registered");
        let pmi_node_bytes = c.pmi_node_bytes;
        let pmi_up = b.area("pmi.up", c.max_jobs * nodes * pmi_node_bytes);
        let pmi_up_event = b.event("pmi.up.signal");
        let pmix_up = b.area("pmix.up", c.max_jobs * nodes * pmi_node_bytes);
        let node_records = b.area(
            "node.records",
            nodes * RECORDS_PER_NODE * crate::sample::RECORD_BYTES,
        );
        Ok(Self {
            layout: b.build()?,
            heartbeat,
            chunks,
            join,
            joined,
            file_ack,
            program_digest,
            terminated,
            output,
            reports,
            report_bytes,
            term_hint,
            term_event,
            registry,
            inventory,
            inventory_bytes,
            membership_bytes,
            join_ack,
            registered,
            node_records,
            pmi_up,
            pmi_node_bytes,
            pmi_up_event,
            pmi_down,
            pmi_job_bytes,
            pmi_down_event,
            pmix_up,
            pmix_down,
            hb_sent,
            chunk_sent,
            report_sent,
            output_sent,
            join_sent,
            register_sent,
            record_sent,
            pmi_up_sent,
            pmi_down_sent,
            max_jobs: c.max_jobs,
            nodes,
        })
    }

    /// Offset of node `node`'s inventory area.
    pub fn inventory_offset(&self, node: usize) -> u64 {
        debug_assert!(node < self.nodes);
        self.inventory.offset + (node * self.inventory_bytes) as u64
    }

    /// Offset of node `node`'s sample record at the MM; its health verdict and its usage
    /// follow at once (one transfer carries the three).
    pub fn sample_offset(&self, node: usize) -> u64 {
        debug_assert!(node < self.nodes);
        self.node_records.offset + (node * RECORDS_PER_NODE * crate::sample::RECORD_BYTES) as u64
    }

    /// Offset of node `node`'s health verdict at the MM.
    pub fn health_record_offset(&self, node: usize) -> u64 {
        self.sample_offset(node) + crate::sample::RECORD_BYTES as u64
    }

    /// Offset of node `node`'s usage record at the MM ([`crate::usage::USAGE_BYTES`]).
    pub fn usage_record_offset(&self, node: usize) -> u64 {
        self.sample_offset(node) + 2 * crate::sample::RECORD_BYTES as u64
    }

    /// Offset of node `node`'s inventory record at the MM.
    pub fn inventory_record_offset(&self, node: usize) -> u64 {
        self.usage_record_offset(node) + crate::usage::USAGE_BYTES as u64
    }

    /// Offset of node `node`'s PMI message for the job in `slot` (at the MM).
    pub fn pmi_up_offset(&self, slot: usize, node: usize) -> u64 {
        debug_assert!(slot < self.max_jobs && node < self.nodes);
        self.pmi_up.offset + ((slot * self.nodes + node) * self.pmi_node_bytes) as u64
    }

    /// Offset of the MM's PMI fence result for the job in `slot` (at its nodes).
    pub fn pmi_down_offset(&self, slot: usize) -> u64 {
        debug_assert!(slot < self.max_jobs);
        self.pmi_down.offset + (slot * self.pmi_job_bytes) as u64
    }

    /// Offset of node `node`'s PMIx exchange state for the job in `slot` (at the MM).
    pub fn pmix_up_offset(&self, slot: usize, node: usize) -> u64 {
        debug_assert!(slot < self.max_jobs && node < self.nodes);
        self.pmix_up.offset + ((slot * self.nodes + node) * self.pmi_node_bytes) as u64
    }

    /// Offset of the MM's PMIx exchange answer for the job in `slot` (at its nodes).
    pub fn pmix_down_offset(&self, slot: usize) -> u64 {
        debug_assert!(slot < self.max_jobs);
        self.pmix_down.offset + (slot * self.pmi_job_bytes) as u64
    }

    /// Whether node `node` may write `len` bytes at `offset` in the MM's memory: only in its
    /// own areas there (its output queue's slots, its reports, inventory, PMI messages,
    /// registration and acknowledgement, sample records), or in the termination hints any node of a job
    /// announces with.
    pub fn may_write(&self, node: usize, offset: u64, len: u64) -> bool {
        if node >= self.nodes || len == 0 {
            return false;
        }
        let Some(end) = offset.checked_add(len) else {
            return false;
        };
        let within = |start: u64, bytes: u64| offset >= start && end <= start + bytes;
        // One entry of an area of (slot, node) entries: node `node`'s, whole.
        let entry = |area: &storm_primitives::Area, bytes: usize| {
            if !within(area.offset, area.len as u64) {
                return false;
            }
            let i = (offset - area.offset) / bytes as u64;
            let start = area.offset + i * bytes as u64;
            (i as usize) % self.nodes == node && end <= start + bytes as u64
        };
        let queue = &self.output[node].slots;
        within(queue.offset, queue.len as u64)
            || entry(&self.reports, self.report_bytes)
            || entry(&self.pmi_up, self.pmi_node_bytes)
            || entry(&self.pmix_up, self.pmi_node_bytes)
            || within(self.inventory_offset(node), self.inventory_bytes as u64)
            || within(
                self.sample_offset(node),
                (RECORDS_PER_NODE * crate::sample::RECORD_BYTES) as u64,
            )
            || within(self.registry.at(node).offset(), 8)
            || within(self.join_ack.at(node).offset(), 8)
            || within(self.term_hint.at(0).offset(), 8 * self.max_jobs as u64)
    }

    /// Offset of node `node`'s report for the job in `slot`.
    pub fn report_offset(&self, slot: usize, node: usize) -> u64 {
        debug_assert!(slot < self.max_jobs && node < self.nodes);
        self.reports.offset + ((slot * self.nodes + node) * self.report_bytes) as u64
    }
}

/// A cluster key from the cluster's name: nodes of differently named clusters refuse each
/// other's connections.
pub fn name_key(name: &str) -> u64 {
    storm_primitives::fnv1a64(name.as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::tests::hostlist_file;
    use storm_primitives::NodeSet;

    fn layout(nodes: usize) -> (ClusterConfig, RmLayout) {
        let cfg = ClusterConfig::parse(&hostlist_file(nodes)).unwrap();
        let rm = RmLayout::new(&cfg).unwrap();
        (cfg, rm)
    }

    #[test]
    fn an_nm_holds_the_same_memory_and_events_at_4_and_at_16384_nodes() {
        let (_, small) = layout(4);
        let (cfg, large) = layout(16_384);
        for node in [0, 3] {
            assert_eq!(small.layout.extent_at(node), large.layout.extent_at(node));
        }
        assert_eq!(large.layout.extent_at(16_383), small.layout.extent_at(0));
        assert_eq!(large.layout.home(), Some(cfg.mm_id()));
        let nm = large.layout.size_at(0);
        let mm = large.layout.size_at(cfg.mm_id());
        assert!(
            mm > 16_384 * nm.min(1 << 16),
            "the MM holds the per-node areas"
        );
    }

    /// The formulas of docs/operations.md ("Global memory"), to within the alignment padding
    /// of each entry (64 bytes at most, so 128 bytes per node at the MM).
    #[test]
    fn the_documented_size_formulas_match_the_layout() {
        for nodes in [1, 4, 2048] {
            let (cfg, rm) = layout(nodes);
            let c = &cfg.cluster;
            let nm = c.heartbeat_slots * (c.heartbeat_bytes + 16)
                + c.transfer_slots * (c.transfer_chunk_bytes + 16)
                + crate::messages::membership_bytes(c.max_jobs)
                + c.max_jobs * (8 + 2 * c.pmi_job_bytes);
            let per_node = c.output_slots * (c.output_bytes + 16)
                + c.max_jobs * (report_bytes(c.max_tasks_per_node) + 2 * c.pmi_node_bytes)
                + crate::messages::inventory_bytes(c.max_jobs)
                + RECORDS_PER_NODE * crate::sample::RECORD_BYTES;
            let mm = nm + nodes * per_node + 8 * c.max_jobs;
            let (got_nm, got_mm) = (rm.layout.size_at(0), rm.layout.size_at(cfg.mm_id()));
            assert!((nm..nm + 2048).contains(&got_nm), "NM: {got_nm} vs {nm}");
            let slack = 2048 + 128 * nodes;
            assert!((mm..mm + slack).contains(&got_mm), "MM: {got_mm} vs {mm}");
        }
    }

    #[test]
    fn what_an_nm_writes_to_the_mm_lies_in_the_mms_home_section() {
        let (cfg, rm) = layout(4);
        let mm = NodeSet::single(cfg.mm_id());
        let nm = NodeSet::single(2);
        let writes = [
            (rm.report_offset(3, 2), rm.report_bytes),
            (rm.inventory_offset(2), rm.inventory_bytes),
            (rm.pmi_up_offset(1, 2), rm.pmi_node_bytes),
            (rm.pmix_up_offset(1, 2), rm.pmi_node_bytes),
            (rm.registry.at(2).offset(), 8),
            (rm.join_ack.at(2).offset(), 8),
            (rm.term_hint.at(0).offset(), 8),
            (rm.output[2].slots.offset, rm.output[2].slots.len),
            (rm.sample_offset(2), crate::sample::RECORD_BYTES),
            (rm.inventory_record_offset(2), crate::sample::RECORD_BYTES),
            (rm.health_record_offset(2), crate::sample::RECORD_BYTES),
            (rm.usage_record_offset(2), crate::usage::USAGE_BYTES),
            // The transfer an NM's sampling thread makes: sample, verdict and usage.
            (
                rm.sample_offset(2),
                2 * crate::sample::RECORD_BYTES + crate::usage::USAGE_BYTES,
            ),
        ];
        for (offset, len) in writes {
            assert!(rm.layout.fits(&mm, offset, len as u64));
            assert!(
                !rm.layout.fits(&nm, offset, len as u64),
                "{offset}: NMs hold none"
            );
        }
        // Node 2 writes those (its own), and none of another node's.
        for (offset, len) in writes {
            assert!(rm.may_write(2, offset, len as u64), "{offset}");
        }
        let others = [
            (rm.report_offset(3, 1), rm.report_bytes),
            (rm.inventory_offset(1), rm.inventory_bytes),
            (rm.pmi_up_offset(1, 3), rm.pmi_node_bytes),
            (rm.pmix_up_offset(1, 3), rm.pmi_node_bytes),
            (rm.pmix_up_offset(1, 2) + 8, rm.pmi_node_bytes),
            (rm.registry.at(1).offset(), 8),
            (rm.join_ack.at(3).offset(), 8),
            (rm.output[1].slots.offset, 16),
            // Straddling its own report and the next node's.
            (rm.report_offset(3, 2) + 8, rm.report_bytes),
            (rm.sample_offset(1), crate::sample::RECORD_BYTES),
            (rm.inventory_record_offset(3), crate::sample::RECORD_BYTES),
            (rm.health_record_offset(1), crate::sample::RECORD_BYTES),
            (rm.usage_record_offset(3), crate::usage::USAGE_BYTES),
            (
                rm.inventory_record_offset(2) + 8,
                crate::sample::RECORD_BYTES,
            ),
        ];
        for (offset, len) in others {
            assert!(!rm.may_write(2, offset, len as u64), "{offset}");
        }
        let reads = [
            (rm.pmi_down_offset(2), rm.pmi_job_bytes),
            (rm.pmix_down_offset(2), rm.pmi_job_bytes),
            (rm.join.offset, rm.join.len),
            (rm.terminated.at(5).offset(), 8),
        ];
        for (offset, len) in reads {
            assert!(
                rm.layout.fits(&nm, offset, len as u64),
                "{offset}: every NM"
            );
        }
    }
}
