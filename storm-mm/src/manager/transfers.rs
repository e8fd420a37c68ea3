//! Program transfers (paper Algorithms 6 and 7): the MM hands each job's program to a sending
//! worker once its nodes are free of other transfers, tells the submitter how far it is, and
//! checks every node's acknowledgement with COMPARE-AND-WRITE before the job may launch.
//!
//! Before a program is copied (`Delivery::Auto`, the default) the MM looks whether it is
//! already in place: a heartbeat asks the job's nodes for the digest of the file at the
//! program's path (`Command::CheckProgram`: size, modification time, permissions and BLAKE3
//! hash, read with the user's rights), a worker hashes the submitted program meanwhile, and
//! one COMPARE-AND-WRITE over the nodes' `program.digest` says whether all of them have it.
//! If they do, the job runs the program from its path, and files next to it are found as
//! under srun; if one does not, or does not answer within [`CHECK_WAIT`], it is copied. The
//! check takes a transfer's number and holds its nodes as a transfer does: a node answers in
//! `file.ack` for one check or transfer at a time.

use std::collections::BTreeSet;
use std::time::Duration;

use storm_cluster::control::{Delivery, Reply};
use storm_cluster::messages::{CheckProgram, Command, FileInfo, JobId, file_ack, program_digest};
use storm_primitives::{NodeSet, Relation};

use crate::env::{MmEnv, ProgramSource, TransferDone, TransferSpec};

use super::job::InPlaceCheck;
use super::{MachineManager, Phase};

/// The program transfers' bookkeeping.
pub(super) struct Transfers {
    /// Transfer workers at work: the job and the nodes each sends to.
    pub(super) workers: Vec<Option<(JobId, NodeSet)>>,
    /// Nodes receiving a program now (each has one chunk queue).
    pub(super) busy_nodes: NodeSet,
    /// The number of the next transfer.
    pub(super) next: u32,
    /// Transfers that ended, as their inputs came, not yet taken up.
    pub(super) finished: Vec<TransferDone>,
}

impl Transfers {
    pub(super) fn new(workers: usize) -> Self {
        Self {
            workers: vec![None; workers],
            busy_nodes: NodeSet::new(),
            next: 1,
            finished: Vec::new(),
        }
    }

    /// Whether no transfer runs and none ended untaken.
    pub(super) fn is_idle(&self) -> bool {
        self.workers.iter().all(Option::is_none) && self.finished.is_empty()
    }
}

/// How long every node has to answer whether a program is in place before it is copied
/// instead (a node whose file system hangs must not hold the job).
pub(super) const CHECK_WAIT: Duration = Duration::from_secs(10);

/// How often a submitter hears how far its program transfer is.
pub(super) const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

impl<E: MmEnv> MachineManager<E> {
    /// Starts the program transfers of allocated jobs, as workers and nodes allow: each node
    /// receives one program at a time (it has one chunk queue).
    ///
    /// A requeued job's transfer waits until the `Forget` of its last placement has gone to
    /// the heartbeat: a node that took the new placement's check or transfer first would
    /// have it cancelled, and its spool directory removed, by that `Forget` (it names the
    /// job, not the placement), and the job then waited out [`CHECK_WAIT`] (10 s) for an
    /// answer that never came. The `Forget` waits only for the journal's commit of the
    /// requeue.
    pub(super) fn begin_transfers(&mut self) {
        let forgetting: BTreeSet<JobId> = self.outbox.forgets.iter().map(|(j, _)| *j).collect();
        let waiting: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.phase == Phase::Allocated && !forgetting.contains(&j.id))
            .map(|j| j.id)
            .collect();
        for id in waiting {
            let Some(worker) = self.transfers.workers.iter().position(Option::is_none) else {
                return;
            };
            if !self.jobs[&id].nodes.is_disjoint(&self.transfers.busy_nodes) {
                continue;
            }
            self.begin_transfer(id, worker);
        }
    }

    pub(super) fn begin_transfer(&mut self, id: JobId, worker: usize) {
        let op_timeout = Duration::from_millis(self.cfg.tcp.op_timeout_ms);
        let transfer = self.transfers.next;
        let now = self.now();
        let j = self.jobs.get_mut(&id).expect("job");
        if j.in_place {
            return;
        }
        // Auto: first look whether the nodes have it in place (the stamp is unknown after a
        // restart of the MM: then it is copied).
        let check = j.req.delivery == Delivery::Auto && !j.checked && j.stamp.is_some();
        // The submitted descriptor while it is held, else the copy beside the journal.
        let source = match j.program {
            Some(p) => ProgramSource::Submitted(p),
            None if j.program_saved => ProgramSource::Saved(id),
            None => {
                self.fail(
                    id,
                    "cannot read the program: it is no longer at hand".into(),
                );
                return;
            }
        };
        self.transfers.next += 1;
        let name = j
            .req
            .program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "program".into());
        j.phase = if check {
            Phase::Checking {
                transfer,
                worker,
                since: now,
            }
        } else {
            Phase::Sending {
                transfer,
                worker,
                reported: (now, 0),
            }
        };
        let progress = (!check).then_some(j.client).flatten().map(|c| {
            let total = j.size;
            (
                c,
                Reply::Progress {
                    job: id,
                    sent: 0,
                    total,
                },
            )
        });
        let nodes = j.nodes.clone();
        let info = FileInfo {
            transfer,
            job: id,
            nodes: nodes.clone(),
            size: j.size,
            name,
            uid: j.uid,
            gid: j.gid,
        };
        let size = j.size;
        let spec = TransferSpec {
            job: id,
            transfer,
            nodes: nodes.clone(),
            program: source,
            size,
            worker,
            event: self.rm.chunk_sent[worker],
            chunks: self.rm.chunks,
            timeout: op_timeout * 6,
            file_ack: self.rm.file_ack,
            ack_wait: self.cfg.heartbeat_deadline(),
            check_only: check,
        };
        if let Err(e) = self.env.start_transfer(spec) {
            // Nothing was sent: the job ends as one that never left its allocation.
            if let Some(j) = self.jobs.get_mut(&id) {
                j.phase = Phase::Allocated;
            }
            self.fail(id, format!("cannot read the program: {e}"));
            return;
        }
        if let Some((c, r)) = progress {
            self.reply(c, r);
        }
        self.transfers.workers[worker] = Some((id, nodes.clone()));
        self.transfers.busy_nodes = self.transfers.busy_nodes.union(&nodes);
        self.hb.commands.push_back(if check {
            Command::CheckProgram(CheckProgram {
                transfer,
                job: id,
                nodes: info.nodes,
                path: self.jobs[&id].req.program.clone(),
                uid: info.uid,
                gid: info.gid,
            })
        } else {
            Command::ReceiveFile(info)
        });
    }

    /// Tells submitters how far their program transfer is, at most every
    /// [`PROGRESS_INTERVAL`] and only when it moved.
    pub(super) fn report_transfer_progress(&mut self) {
        let now = self.now();
        let mut due = Vec::new();
        for j in self.jobs.values_mut() {
            let (
                Some(client),
                Phase::Sending {
                    transfer,
                    reported: (last_at, last),
                    ..
                },
            ) = (j.client, &mut j.phase)
            else {
                continue;
            };
            let transfer = *transfer;
            let Some(sent) = self.env.transfer_delivered(transfer) else {
                continue;
            };
            if sent != *last && now.duration_since(*last_at) >= PROGRESS_INTERVAL {
                (*last_at, *last) = (now, sent);
                due.push((
                    client,
                    Reply::Progress {
                        job: j.id,
                        sent,
                        total: j.size,
                    },
                ));
            }
        }
        for (client, r) in due {
            self.reply(client, r);
        }
    }

    /// Takes what the transfer workers reported; true if any did.
    pub(super) fn take_finished_transfers(&mut self) -> bool {
        let finished = std::mem::take(&mut self.transfers.finished);
        let any = !finished.is_empty();
        for done in finished {
            self.transfer_done(done);
        }
        any
    }

    pub(super) fn transfer_done(&mut self, done: TransferDone) {
        // The worker slot frees only now, even for a job that ended meanwhile: until its
        // worker is done, late completions may still land on the slot's event.
        let sent_to = match &self.transfers.workers[done.worker] {
            Some((job, nodes)) if *job == done.job => nodes.clone(),
            _ => NodeSet::new(),
        };
        self.transfers.workers[done.worker] = None;
        let current = self.jobs.get(&done.job).is_some_and(|j| {
            matches!(j.phase, Phase::Sending { transfer, .. } | Phase::Checking { transfer, .. }
                if transfer == done.transfer)
        });
        if !current {
            // The job ended, or was requeued, while its worker still sent: only now are its
            // nodes free for another transfer (nothing of this one can reach them any more).
            self.transfers.busy_nodes = self.transfers.busy_nodes.difference(&sent_to);
            return;
        }
        let j = self.jobs.get_mut(&done.job).expect("current");
        let (transfer, checking) = match j.phase {
            Phase::Sending { transfer, .. } => (transfer, None),
            Phase::Checking {
                transfer, since, ..
            } => (transfer, Some(since)),
            _ => return,
        };
        if done.result.is_err() {
            // The worker has stopped: the nodes are free for another transfer, this job's
            // again included. (A successful transfer keeps them until it is verified.)
            self.transfers.busy_nodes = self.transfers.busy_nodes.difference(&sent_to);
        }
        let j = self.jobs.get_mut(&done.job).expect("current");
        match done.result {
            Ok(hash) if let (Some(since), Some(stamp)) = (checking, j.stamp) => {
                j.phase = Phase::Verifying {
                    transfer,
                    check: Some(InPlaceCheck {
                        digest: program_digest(&stamp, &hash),
                        since,
                    }),
                };
            }
            Ok(hash) => {
                self.metrics.transfer_took(done.took);
                let j = self.jobs.get_mut(&done.job).expect("current");
                j.program_hash = Some(hash);
                j.phase = Phase::Verifying {
                    transfer,
                    check: None,
                };
                if let Some(c) = j.client {
                    let (job, total) = (j.id, j.size);
                    self.reply(
                        c,
                        Reply::Progress {
                            job,
                            sent: total,
                            total,
                        },
                    );
                }
            }
            Err(e) => match j.cancel.as_ref().map(|c| c.reason.clone()) {
                Some(reason) => self.fail(done.job, reason),
                // Nodes that did not take the program: they leave the heartbeat, and the job,
                // none of whose tasks started, is placed again.
                None if !e.blamed.is_empty() => {
                    self.blame_nodes(&e.blamed, &e.message);
                    self.node_lost_job(done.job, format!("program transfer failed: {e}"));
                }
                None => self.fail(done.job, format!("program transfer failed: {e}")),
            },
        }
    }

    pub(super) fn verify_transfers(&mut self) {
        let verifying: Vec<(JobId, u32, Option<InPlaceCheck>, NodeSet)> = self
            .jobs
            .values()
            .filter_map(|j| match j.phase {
                Phase::Verifying { transfer, check } => {
                    Some((j.id, transfer, check, j.nodes.clone()))
                }
                _ => None,
            })
            .collect();
        for (id, transfer, check, nodes) in verifying {
            let good = file_ack(transfer, true);
            let ack = self.rm.file_ack;
            let deadline = Some(self.cfg.heartbeat_deadline());
            let answered = match self.prims.compare_and_write_within(
                &nodes,
                ack,
                Relation::Ge,
                good - 1,
                None,
                deadline,
            ) {
                Ok(a) => a,
                Err(e) => {
                    self.blame(&e);
                    let why = format!("cannot check the program on the nodes: {e}");
                    if e.blamed().is_empty() {
                        self.fail(id, why);
                    } else {
                        self.node_lost_job(id, why);
                    }
                    continue;
                }
            };
            if let Some(check) = check {
                self.checked_in_place(id, &nodes, answered, check);
                continue;
            }
            if !answered {
                continue;
            }
            // Every node has answered; find those that did not verify the program.
            let bad: NodeSet = nodes
                .iter()
                .filter(|&n| {
                    let one = NodeSet::single(n);
                    !matches!(
                        self.prims.compare_and_write_within(
                            &one,
                            ack,
                            Relation::Eq,
                            good,
                            None,
                            deadline
                        ),
                        Ok(true)
                    )
                })
                .collect();
            if bad.is_empty() {
                let now = self.now();
                let j = self.jobs.get_mut(&id).expect("job");
                j.ready = Some(now);
                self.metrics.program_delivered(j.size, nodes.len() as u64);
                self.transfers.busy_nodes = self.transfers.busy_nodes.difference(&nodes);
                self.queue_launch(id);
            } else {
                self.fail(
                    id,
                    format!("the program did not arrive intact on nodes {bad}"),
                );
            }
        }
    }

    /// Takes up the nodes' answers to whether job `id`'s program is in place: with one
    /// COMPARE-AND-WRITE over their digests once all answered; it runs in place if every node
    /// has it, and is copied if one has not, or has not answered in [`CHECK_WAIT`].
    fn checked_in_place(
        &mut self,
        id: JobId,
        nodes: &NodeSet,
        answered: bool,
        check: InPlaceCheck,
    ) {
        let now = self.now();
        let everywhere = answered
            && match self.prims.compare_and_write_within(
                nodes,
                self.rm.program_digest,
                Relation::Eq,
                check.digest,
                None,
                Some(self.cfg.heartbeat_deadline()),
            ) {
                Ok(same) => same,
                Err(e) => {
                    self.blame(&e);
                    self.node_lost_job(id, format!("cannot check the program on the nodes: {e}"));
                    return;
                }
            };
        if !answered && now.saturating_duration_since(check.since) < CHECK_WAIT {
            return;
        }
        self.transfers.busy_nodes = self.transfers.busy_nodes.difference(nodes);
        let j = self.jobs.get_mut(&id).expect("job");
        j.checked = true;
        if everywhere {
            tracing::info!(job = id, "the program is in place on every node: no copy");
            j.in_place = true;
            j.ready = Some(now);
            self.metrics.program_in_place();
            self.queue_launch(id);
        } else {
            tracing::info!(
                job = id,
                answered,
                "the program is not the same at its path on every node: copying it"
            );
            j.phase = Phase::Allocated;
        }
    }
}
