//! The MM's part in MPI wire-up: the root of every PMI fence (docs/mpi.md).
//!
//! Each NM serves its local ranks' PMI requests. When all of them have entered a fence, the
//! NM writes its puts since the last fence into `pmi_up[slot][node]` here by XFER-AND-SIGNAL,
//! raising `pmi_up_event`. When every node of the job has written its part for the same
//! fence, the MM merges them and sends the union to all of the job's nodes in one
//! XFER-AND-SIGNAL (the multicast tree of the primitives) into `pmi_down[slot]`, raising
//! `pmi_down_event` there; each NM then releases its ranks.
//!
//! Why rooted at the MM and not node to node: compute nodes accept writes only from the MM
//! (docs/security.md), so a flat exchange between NMs is refused by design. The data a node
//! writes is in the MM's own memory once its XFER-AND-SIGNAL raised the event, so arrival
//! needs no further COMPARE-AND-WRITE: the MM reads each node's part and checks its job and
//! fence number.
//!
//! A node may instead write an abort (a rank's `MPI_Abort`, a broken protocol, a rank gone
//! without finalize): the job is cancelled with the rank's message and ends with its code.
//! A `--kill-on-bad-exit` job ends the same way when a node's report names a failed rank
//! ([`MachineManager::end_for_failed_ranks`]), MPI or not.

use std::collections::BTreeMap;

use bytes::Bytes;
use storm_cluster::messages::{
    JobId, MpiMode, NodeReport, PmiFenced, PmiUp, RankStatus, decode_sealed, encode_sealed,
};
use storm_primitives::{NodeSet, Wait};

use super::{MachineManager, MmEnv, Phase};

/// What the nodes of one job have written for it.
enum Parts {
    /// Every node is in fence `epoch`; the union of their puts.
    Complete {
        epoch: u32,
        pairs: Vec<(String, String)>,
    },
    Abort {
        node: u32,
        rank: u32,
        code: Option<i32>,
        message: String,
    },
    Waiting,
}

/// The rank whose failure ended a job (an `MPI_Abort`, or leaving without `MPI_Finalize`), as
/// its node said it: the job's exit code and reason are its, the code of an `MPI_Abort` or
/// the rank's own exit code or signal (as mpirun's), never the SIGTERM the others then got.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Culprit {
    pub rank: u32,
    /// Its node.
    pub node: storm_primitives::NodeId,
    /// `MPI_Abort`'s code.
    pub code: Option<i32>,
    /// What its node said of it.
    pub message: String,
}

impl Culprit {
    /// The job's exit code, given the rank's own status: `MPI_Abort`'s code, else its exit
    /// code or 128 + its signal; 1 if it exited 0 (the job failed all the same).
    pub fn exit_code(&self, status: Option<RankStatus>) -> Option<i32> {
        match (self.code, status) {
            (Some(c), _) => Some(c),
            (None, Some(RankStatus::Exited(0))) => Some(1),
            (None, Some(s)) => Some(s.shell_code()),
            (None, None) => None,
        }
    }

    /// The job's reason, naming the rank and its real cause first.
    pub fn reason(&self, status: Option<RankStatus>) -> String {
        let (rank, node, message) = (self.rank, self.node, &self.message);
        match (self.code, status) {
            (Some(c), _) => {
                format!("rank {rank} on node {node} aborted the job with exit code {c}: {message}")
            }
            (None, Some(s)) => format!("rank {rank} on node {node} {}: {message}", what_ended(s)),
            (None, None) => format!("rank {rank} on node {node} ended the job: {message}"),
        }
    }
}

/// How a rank ended, as a user reads it: `exited with code 1`, `was killed by SIGSEGV
/// (signal 11)`.
pub fn what_ended(status: RankStatus) -> String {
    match status {
        RankStatus::Exited(c) => format!("exited with code {c}"),
        RankStatus::Signaled(s) => match nix::sys::signal::Signal::try_from(s) {
            Ok(sig) => format!("was killed by {} (signal {s})", sig.as_str()),
            Err(_) => format!("was killed by signal {s}"),
        },
    }
}

impl<E: MmEnv> MachineManager<E> {
    /// Ends job `id` because of `culprit`'s failure: its other ranks are stopped (a cancel),
    /// but the job ends as failed, with the culprit's code and cause ([`Culprit`]), not as
    /// cancelled.
    pub(super) fn end_for_rank(&mut self, id: JobId, culprit: Culprit) {
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if j.culprit.is_some() {
            return;
        }
        j.abort_code = culprit.code;
        let had_cause = j.end_cause.is_some();
        let why = culprit.reason(None);
        j.culprit = Some(culprit);
        self.cancel(id, why);
        if !had_cause && let Some(j) = self.jobs.get_mut(&id) {
            j.end_cause = None;
        }
    }

    /// Ends every `--kill-on-bad-exit` job a node of which reports a failed rank (its NM has
    /// stopped its other local ranks and raised the termination hint): the job's other
    /// nodes stop too, and the job takes that rank's code and cause.
    pub(super) fn end_for_failed_ranks(&mut self) {
        let watched: Vec<(JobId, usize, NodeSet)> = self
            .jobs
            .values()
            .filter(|j| j.terminating && j.req.kill_on_bad_exit && j.culprit.is_none())
            .filter_map(|j| Some((j.id, j.slot?, j.nodes.clone())))
            .collect();
        for (id, slot, nodes) in watched {
            if let Some((node, rank)) = self.named_rank(id, slot, &nodes, |r| r.culprit) {
                self.end_for_rank(
                    id,
                    Culprit {
                        rank,
                        node,
                        code: None,
                        message: "the job ends when a rank fails (--kill-on-bad-exit)".into(),
                    },
                );
            }
        }
    }

    /// Carries out every fence whose parts have all arrived, and every abort.
    pub(super) fn pmi_exchange(&mut self) {
        let mut signalled = std::mem::take(&mut self.pmi_recheck);
        while let Ok(true) = self.prims.test_event(self.rm.pmi_up_event, Wait::Poll) {
            signalled = true;
        }
        if signalled {
            self.pmix_exchange();
        }
        // Without a part's arrival, only the jobs a node of which just ended are looked at.
        let ended = std::mem::take(&mut self.pmi_ended);
        if !signalled && ended.is_empty() {
            return;
        }
        let mpi_jobs: Vec<(JobId, usize, NodeSet, u32)> = self
            .jobs
            .values()
            .filter(|j| signalled || ended.contains(&j.id))
            .filter(|j| j.req.mpi != MpiMode::None && j.cancel.is_none())
            .filter(|j| matches!(j.phase, Phase::Running | Phase::Recovering))
            .filter_map(|j| Some((j.id, j.slot?, j.nodes.clone(), j.pmi_epoch)))
            .collect();
        for (id, slot, nodes, done) in mpi_jobs {
            match self.pmi_parts(id, slot, &nodes, done) {
                Parts::Waiting => {}
                Parts::Abort {
                    node,
                    rank,
                    code,
                    message,
                } => self.end_for_rank(
                    id,
                    Culprit {
                        rank,
                        node,
                        code,
                        message,
                    },
                ),
                Parts::Complete { epoch, pairs } => {
                    self.pmi_release(id, slot, &nodes, epoch, pairs)
                }
            }
        }
    }

    /// Forgets what the nodes wrote into a job slot's PMI areas before, so that an MPI job
    /// requeued into `slot` on `nodes` cannot take its earlier run's part for its own (other
    /// jobs' parts name another job). Only MPI jobs need it: clearing touches a page of the
    /// MM's memory per node.
    pub(super) fn clear_pmi_parts(&self, slot: usize, nodes: &NodeSet) {
        let mem = self.prims.memory();
        for n in nodes.iter() {
            let _ = mem.write(self.rm.pmi_up_offset(slot, n as usize), &[0u8; 32]);
            let _ = mem.write(self.rm.pmix_up_offset(slot, n as usize), &[0u8; 32]);
            // A node's report of an earlier run would say its ranks ended (see `pmi_parts`).
            let _ = mem.write(self.rm.report_offset(slot, n as usize), &[0u8; 32]);
        }
    }

    /// Reads what each node of job `id` wrote for it.
    fn pmi_parts(&self, id: JobId, slot: usize, nodes: &NodeSet, done: u32) -> Parts {
        let limit = self.rm.pmi_node_bytes;
        let mem = self.prims.memory();
        let mut epoch = None;
        let mut merged = BTreeMap::new();
        let mut complete = true;
        let mut missing = Vec::new();
        for n in nodes.iter() {
            let bytes = mem
                .read_vec(self.rm.pmi_up_offset(slot, n as usize), limit)
                .unwrap_or_default();
            match decode_sealed::<PmiUp>("PMI message", &bytes, limit) {
                Ok(PmiUp::Abort {
                    job,
                    rank,
                    code,
                    message,
                }) if job == id => {
                    return Parts::Abort {
                        node: n,
                        rank,
                        code,
                        message,
                    };
                }
                Ok(PmiUp::Fence {
                    job,
                    epoch: e,
                    pairs,
                }) if job == id && e > done => {
                    if *epoch.get_or_insert(e) != e {
                        complete = false;
                    }
                    merged.extend(pairs);
                }
                // Another job's message from an earlier use of the slot, an older fence, or
                // nothing yet (zeroes decode as nothing valid).
                _ => {
                    complete = false;
                    missing.push(n);
                }
            }
        }
        match epoch {
            Some(epoch) if complete => Parts::Complete {
                epoch,
                pairs: merged.into_iter().collect(),
            },
            // Some nodes wait in a fence: one whose ranks have all ended can never join it
            // (a rank that died before MPI_Init on a node of its own); the job ends, naming
            // it, rather than wait for its time limit.
            Some(_) => missing
                .into_iter()
                .find_map(|n| self.ended_outside_fence(id, slot, n))
                .unwrap_or(Parts::Waiting),
            None => Parts::Waiting,
        }
    }

    /// The first of `nodes` whose report of job `id` names, by `name`, one of the ranks it
    /// reports (a node names only its own: no other node's), with that rank.
    pub(super) fn named_rank(
        &self,
        id: JobId,
        slot: usize,
        nodes: &NodeSet,
        name: impl Fn(&NodeReport) -> Option<u32>,
    ) -> Option<(u32, u32)> {
        nodes.iter().find_map(|n| {
            let report = self.node_report(id, slot, n)?;
            let rank = name(&report)?;
            report.reports(rank).then_some((n, rank))
        })
    }

    /// Node `n`'s report of job `id` in job slot `slot`, if it is in (and decodes).
    pub(super) fn node_report(&self, id: JobId, slot: usize, n: u32) -> Option<NodeReport> {
        let bytes = self
            .prims
            .memory()
            .read_vec(
                self.rm.report_offset(slot, n as usize),
                self.rm.report_bytes,
            )
            .ok()?;
        decode_sealed::<NodeReport>("report", &bytes, self.rm.report_bytes)
            .ok()
            .filter(|r| r.job == id)
    }

    /// If node `n`'s ranks of job `id` have all ended (its report is in), an abort naming
    /// the first of them that failed (else the first).
    fn ended_outside_fence(&self, id: JobId, slot: usize, n: u32) -> Option<Parts> {
        let rank = self.node_report(id, slot, n)?.telling_rank()?;
        Some(Parts::Abort {
            node: n,
            rank,
            code: None,
            message: "its node's ranks ended while the job's other ranks wait for them in an MPI \
                      fence (MPI_Init, or a collective)"
                .to_string(),
        })
    }

    /// Sends the union of fence `epoch` to the job's nodes, which lets their ranks go on.
    fn pmi_release(
        &mut self,
        id: JobId,
        slot: usize,
        nodes: &NodeSet,
        epoch: u32,
        pairs: Vec<(String, String)>,
    ) {
        let count = pairs.len();
        let msg = PmiFenced {
            job: id,
            epoch,
            pairs,
        };
        let bytes = match encode_sealed("PMI fence result", &msg, self.rm.pmi_job_bytes) {
            Ok(b) => b,
            Err(e) => {
                self.cancel(
                    id,
                    format!(
                        "its MPI key space outgrew the cluster's limit ({e}; raise [cluster] pmi_job_bytes)"
                    ),
                );
                return;
            }
        };
        let sent = self.prims.xfer_and_signal(
            nodes,
            self.rm.pmi_down_offset(slot),
            Bytes::from(bytes),
            Some(self.rm.pmi_down_event),
            Some(self.rm.pmi_down_sent),
        );
        let done = sent.and_then(|()| {
            self.prims.test_event(
                self.rm.pmi_down_sent,
                Wait::Timeout(self.cfg.heartbeat_deadline()),
            )
        });
        match done {
            Ok(true) => {
                if let Some(j) = self.jobs.get_mut(&id) {
                    j.pmi_epoch = epoch;
                }
                tracing::debug!(job = id, epoch, keys = count, "PMI fence released");
            }
            // Not confirmed: the nodes' parts stay, and the next tick sends the result again
            // (an NM takes a fence's result once).
            Ok(false) => {
                tracing::warn!(job = id, epoch, "PMI fence result not confirmed in time");
                self.pmi_recheck = true;
            }
            Err(e) => {
                tracing::warn!(job = id, epoch, "cannot send a PMI fence result: {e}");
                self.pmi_recheck = true;
                self.blame(&e);
            }
        }
    }
}
