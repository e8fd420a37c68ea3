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

use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use storm_cluster::clock::{Clock, VirtualClock};
use storm_cluster::control::Reply;
use storm_cluster::messages::JobId;
use storm_mm::MmEnv;
use storm_mm::env::{ClientId, ProgramId, ProgramSource, SubmittedProgram, TransferSpec};
use storm_mm::journal::Batch;

use crate::journal::JournalWriter;

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

/// A transfer in flight: when it started and completes, and whether the MM cancelled it.
pub struct Flight {
    pub started: Instant,
    pub due: Instant,
    pub transfer: TransferSpec,
    pub cancelled: bool,
}

/// The copies of programs "beside the journal": kept by the simulation across MM restarts,
/// as the state directory is, by job.
pub type ProgramCopies = Arc<Mutex<BTreeMap<JobId, u64>>>;

/// The simulated MM's environment: the virtual clock; clients whose replies wait in memory
/// until the simulation reads them; programs that are only sizes; transfers that take the
/// launch model's time; program copies made at once.
pub struct SimEnv {
    pub clock: Arc<VirtualClock>,
    pub model: TransferModel,
    /// Transfers in flight, completed by [`crate::Sim::step`] when they are due.
    flights: Vec<Flight>,
    /// Replies sent and not yet read, in order.
    sent: Vec<(ClientId, Reply)>,
    /// Replies each client has read.
    read: HashMap<ClientId, u64>,
    /// Submitted programs the MM holds, by their size.
    programs: BTreeMap<ProgramId, u64>,
    next_program: ProgramId,
    copies: ProgramCopies,
    /// Copies made, whose outcome the MM has not been handed yet.
    saved: Vec<JobId>,
    /// Copies the MM began, in all.
    copies_begun: usize,
    /// How many more copies may complete (a slow disk); `None`: every copy completes at the
    /// next timeslice.
    copies_allowed: Option<usize>,
    /// Writes the journal's batches, for a journal that hands them off.
    pub(crate) journal: Option<JournalWriter>,
}

impl SimEnv {
    /// An environment over `copies`, the program copies earlier MMs of the simulation made,
    /// writing a handed-off journal's batches with `journal`.
    pub(crate) fn new(
        clock: Arc<VirtualClock>,
        model: TransferModel,
        copies: ProgramCopies,
        journal: Option<JournalWriter>,
    ) -> Self {
        Self {
            clock,
            model,
            flights: Vec::new(),
            sent: Vec::new(),
            read: HashMap::new(),
            programs: BTreeMap::new(),
            next_program: 1,
            copies,
            saved: Vec::new(),
            copies_begun: 0,
            copies_allowed: None,
            journal,
        }
    }

    /// Holds a submitted program of `len` bytes, as the daemon holds a descriptor.
    pub fn hold_program(&mut self, len: u64) -> SubmittedProgram {
        let id = self.next_program;
        self.next_program += 1;
        self.programs.insert(id, len);
        SubmittedProgram {
            id,
            len,
            regular: true,
            mode: 0o700,
            stamp: storm_cluster::messages::ProgramStamp {
                size: len,
                mtime_s: 0,
                mtime_ns: 0,
                mode: 0o700,
            },
        }
    }

    /// Submitted programs the MM still holds.
    pub fn programs_held(&self) -> usize {
        self.programs.len()
    }

    /// Takes the replies sent to `client` (it reads them); other clients' stay for them.
    pub fn read_replies(&mut self, client: ClientId) -> Vec<Reply> {
        let (mine, others): (Vec<_>, Vec<_>) = std::mem::take(&mut self.sent)
            .into_iter()
            .partition(|(c, _)| *c == client);
        // Another client's replies wait for it (a client that has gone reads none).
        self.sent = others;
        let replies: Vec<Reply> = mine.into_iter().map(|(_, r)| r).collect();
        *self.read.entry(client).or_default() += replies.len() as u64;
        replies
    }

    /// Takes the transfers due by `now`.
    pub fn landed(&mut self, now: Instant) -> Vec<Flight> {
        let (due, later) = std::mem::take(&mut self.flights)
            .into_iter()
            .partition(|f| f.due <= now);
        self.flights = later;
        due
    }

    /// When the next transfer in flight lands.
    pub fn next_landing(&self) -> Option<Instant> {
        self.flights.iter().map(|f| f.due).min()
    }

    /// The program copies made since the last call (each succeeded), oldest first, no more
    /// than [`SimEnv::allow_copies`] lets complete.
    pub fn copies_made(&mut self) -> Vec<JobId> {
        let n = self
            .copies_allowed
            .map_or(self.saved.len(), |n| n.min(self.saved.len()));
        if let Some(allowed) = &mut self.copies_allowed {
            *allowed -= n;
        }
        self.saved.drain(..n).collect()
    }

    /// Takes job `job`'s copy out of those under way (it will not complete), with the size
    /// it was to copy; `None` if none was under way.
    pub fn take_copy(&mut self, job: JobId) -> Option<u64> {
        let at = self.saved.iter().position(|&j| j == job)?;
        self.saved.remove(at);
        self.copies.lock().expect("copies").remove(&job)
    }

    /// How many program copies beside the journal this MM began.
    pub fn copies_begun(&self) -> usize {
        self.copies_begun
    }

    /// Lets only `n` more program copies complete (`None`: all of them, as they are made).
    pub fn allow_copies(&mut self, n: Option<usize>) {
        self.copies_allowed = n;
    }
}

impl MmEnv for SimEnv {
    fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    fn operator_uid(&self) -> u32 {
        0
    }

    /// Every simulated lender's MM signs with [`crate::lender_signing_key`].
    fn lender_keys(&mut self, _peer: &str) -> Vec<storm_cluster::identity::VerifyingKey> {
        vec![crate::lender_signing_key().verifying_key()]
    }

    fn send(&mut self, client: ClientId, reply: Reply) {
        self.sent.push((client, reply));
    }

    fn replies_written(&self, client: ClientId) -> u64 {
        self.read.get(&client).copied().unwrap_or(0)
    }

    /// Nothing to close: the core has forgotten the client and sends it nothing more.
    fn hang_up(&mut self, _client: ClientId) {}

    fn start_transfer(&mut self, t: TransferSpec) -> Result<(), String> {
        match t.program {
            ProgramSource::Submitted(p) if !self.programs.contains_key(&p) => {
                return Err("it is no longer at hand".into());
            }
            ProgramSource::Saved(job) if self.saved_program_len(job).is_none() => {
                return Err("its copy beside the journal is missing".into());
            }
            _ => {}
        }
        let now = self.clock.now();
        let due = now + self.model.time(t.nodes.len() as u32, t.size);
        self.flights.push(Flight {
            started: now,
            due,
            transfer: t,
            cancelled: false,
        });
        Ok(())
    }

    fn cancel_transfer(&mut self, transfer: u32) {
        for f in &mut self.flights {
            if f.transfer.transfer == transfer {
                f.cancelled = true;
            }
        }
    }

    fn transfer_delivered(&self, transfer: u32) -> Option<u64> {
        let f = self
            .flights
            .iter()
            .find(|f| f.transfer.transfer == transfer)?;
        // The model's stream is steady: bytes arrive in proportion to the time spent.
        let total = f.due.saturating_duration_since(f.started).as_secs_f64();
        let spent = self
            .clock
            .now()
            .saturating_duration_since(f.started)
            .as_secs_f64();
        let part = if total > 0.0 {
            (spent / total).min(1.0)
        } else {
            1.0
        };
        Some((f.transfer.size as f64 * part) as u64)
    }

    fn save_program(&mut self, job: JobId, program: ProgramId, size: u64) -> bool {
        if !self.programs.contains_key(&program) {
            return false;
        }
        self.copies.lock().expect("copies").insert(job, size);
        self.saved.push(job);
        self.copies_begun += 1;
        true
    }

    fn saved_program_len(&self, job: JobId) -> Option<u64> {
        self.copies.lock().expect("copies").get(&job).copied()
    }

    fn remove_saved_program(&mut self, job: JobId) {
        self.copies.lock().expect("copies").remove(&job);
    }

    fn release_program(&mut self, program: ProgramId) {
        self.programs.remove(&program);
    }

    fn persist(&mut self, batch: Batch) {
        match &mut self.journal {
            Some(w) => w.persist(batch),
            None => unreachable!("only a handed-off journal hands batches over"),
        }
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
