//! Program transfers (paper Algorithms 6 and 7): the MM hands each job's program to a sending
//! worker once its nodes are free of other transfers, tells the submitter how far it is, and
//! checks every node's acknowledgement with COMPARE-AND-WRITE before the job may launch.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use storm_cluster::control::Reply;
use storm_cluster::messages::{Command, FileInfo, JobId, file_ack};
use storm_primitives::{NodeSet, Relation};

use crate::env::MmEnv;
use crate::transfer::{Transfer, TransferDone};

use super::{MachineManager, Phase};

/// How often a submitter hears how far its program transfer is.
pub(super) const PROGRESS_INTERVAL: Duration = Duration::from_millis(100);

impl<E: MmEnv> MachineManager<E> {
    /// Starts the program transfers of allocated jobs, as workers and nodes allow: each node
    /// receives one program at a time (it has one chunk queue).
    pub(super) fn begin_transfers(&mut self) {
        let waiting: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.phase == Phase::Allocated)
            .map(|j| j.id)
            .collect();
        for id in waiting {
            let Some(worker) = self.workers.iter().position(Option::is_none) else {
                return;
            };
            if !self.jobs[&id].nodes.is_disjoint(&self.transferring) {
                continue;
            }
            self.begin_transfer(id, worker);
        }
    }

    pub(super) fn begin_transfer(&mut self, id: JobId, worker: usize) {
        let op_timeout = Duration::from_millis(self.cfg.tcp.op_timeout_ms);
        let transfer = self.next_transfer;
        let now = self.now();
        let j = self.jobs.get_mut(&id).expect("job");
        if !j.req.bcast {
            return;
        }
        // The submitted descriptor while it is held, else the copy beside the journal.
        let file = match &j.program {
            Some(f) => f.try_clone().map_err(|e| e.to_string()),
            None if j.program_saved => self
                .journal
                .program(id)
                .ok_or_else(|| "its copy beside the journal is missing".to_string()),
            None => Err("it is no longer at hand".to_string()),
        };
        let file = match file {
            Ok(f) => f,
            Err(e) => {
                self.fail(id, format!("cannot read the program: {e}"));
                return;
            }
        };
        self.next_transfer += 1;
        let name = j
            .req
            .program
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "program".into());
        let cancel = Arc::new(AtomicBool::new(false));
        j.worker_cancel = Some(cancel.clone());
        j.phase = Phase::Sending { transfer, worker };
        let delivered = Arc::new(AtomicU64::new(0));
        j.transfer_progress = Some((delivered.clone(), now, 0));
        let progress = j.client.map(|c| {
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
        if let Some((c, r)) = progress {
            self.reply(c, r);
        }
        self.workers[worker] = Some((id, nodes.clone()));
        self.transferring = self.transferring.union(&nodes);
        self.commands.push_back(Command::ReceiveFile(info));
        self.env.start_transfer(
            self.prims.clone(),
            &self.rm,
            Transfer {
                job: id,
                transfer,
                nodes,
                file,
                size,
                worker,
                event: self.rm.chunk_sent[worker],
                cancel,
                delivered,
                timeout: op_timeout * 6,
                file_ack: self.rm.file_ack,
                ack_wait: self.cfg.heartbeat_deadline(),
                wake: self.waker(),
            },
            self.worker_tx.clone(),
        );
    }

    /// Tells submitters how far their program transfer is, at most every
    /// [`PROGRESS_INTERVAL`] and only when it moved.
    pub(super) fn report_transfer_progress(&mut self) {
        let now = self.now();
        let mut due = Vec::new();
        for j in self.jobs.values_mut() {
            let (Some(client), Some((delivered, last_at, last))) =
                (j.client, j.transfer_progress.as_mut())
            else {
                continue;
            };
            let sent = delivered.load(Ordering::Relaxed);
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
        let mut any = false;
        while let Ok(done) = self.worker_rx.try_recv() {
            self.transfer_done(done);
            any = true;
        }
        any
    }

    pub(super) fn transfer_done(&mut self, done: TransferDone) {
        // The worker slot frees only now, even for a job that ended meanwhile: until its
        // worker is done, late completions may still land on the slot's event.
        let sent_to = match &self.workers[done.worker] {
            Some((job, nodes)) if *job == done.job => nodes.clone(),
            _ => NodeSet::new(),
        };
        self.workers[done.worker] = None;
        let current = self.jobs.get(&done.job).is_some_and(
            |j| matches!(j.phase, Phase::Sending { transfer, .. } if transfer == done.transfer),
        );
        if !current {
            // The job ended, or was requeued, while its worker still sent: only now are its
            // nodes free for another transfer (nothing of this one can reach them any more).
            self.transferring = self.transferring.difference(&sent_to);
            return;
        }
        let j = self.jobs.get_mut(&done.job).expect("current");
        let Phase::Sending { transfer, .. } = j.phase else {
            return;
        };
        j.transfer_progress = None;
        if done.result.is_err() {
            // The worker has stopped: the nodes are free for another transfer, this job's
            // again included. (A successful transfer keeps them until it is verified.)
            self.transferring = self.transferring.difference(&sent_to);
        }
        let j = self.jobs.get_mut(&done.job).expect("current");
        match done.result {
            Ok(hash) => {
                j.program_hash = Some(hash);
                j.phase = Phase::Verifying { transfer };
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
        let verifying: Vec<(JobId, u32, NodeSet)> = self
            .jobs
            .values()
            .filter_map(|j| match j.phase {
                Phase::Verifying { transfer } => Some((j.id, transfer, j.nodes.clone())),
                _ => None,
            })
            .collect();
        for (id, transfer, nodes) in verifying {
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
                self.transferring = self.transferring.difference(&nodes);
                self.queue_launch(id);
            } else {
                self.fail(
                    id,
                    format!("the program did not arrive intact on nodes {bad}"),
                );
            }
        }
    }

    // ---------------------------------------------------------------- cancellation
}
