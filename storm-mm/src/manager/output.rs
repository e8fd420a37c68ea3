//! The tasks' output, from the nodes' output queues to the submitters, with flow control from
//! end to end.
//!
//! Each node's output queue is read in order, and an entry is *released* (the queue's
//! `dequeued` counter, which the node's producer checks before it reuses a slot, moves past
//! it) only once the reply that carries it has been written to its submitter's socket, or it
//! has nobody to go to. So what an NM sees released has reached storm-submit:
//!
//! * the NM keeps the entries it sent that are not released yet and sends them again in the
//!   next queue epoch (a new membership, or a restarted MM): output survives both;
//! * a submitter that reads slowly slows its job's tasks down (the queue fills, the NM stops
//!   reading their pipes) instead of growing the MM's memory.
//!
//! Entries sent again may have been passed on already; each chunk carries its offset in its
//! stream, and storm-submit keeps each byte once.
//!
//! After a restart of the MM, the output of a restored job whose submitter has not reattached
//! yet is taken and held, unreleased, until it does (the queue's slots bound what is held), or
//! until the reattach window ends; then it is dropped. A job that ends meanwhile keeps what
//! was held for it (`finished_output`) for its submitter, who gets it before the outcome.
//!
//! A job may also have ended under the MM before this one while some of its output was still
//! on its way to the submitter: that MM journaled the end, and went before its reply reached
//! the socket (killed, or a leader that lost the group), so the entry was never released. Its
//! nodes send it again to this MM, which knows the job only as ended. For a while after it
//! took over (the reattach grace), such output is held as for a restored job, and a
//! submitter that follows such a job is told its outcome only once the job's nodes have
//! joined this MM (and sent again what they kept), or the grace has passed: the last words
//! before the outcome, as always.

use std::collections::VecDeque;

use storm_cluster::control::JobOutcome;
use storm_cluster::control::Reply;
use storm_cluster::messages::{JobId, OutputChunk, decode};
use storm_primitives::helpers::QueueConsumer;
use storm_primitives::{NodeId, NodeSet, Wait};

use super::{ClientId, MachineManager, MmEnv};

/// What releases an entry taken from an output queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ack {
    /// Its chunk went to `client` as that client's reply number `n`.
    Reply { client: ClientId, n: u64 },
    /// Held for the submitter of `job` to reattach.
    Held(JobId),
    /// Nobody to send it to (or unreadable).
    Done,
}

/// A submitter that followed a job which ended under the MM before this one, waiting for
/// the job's nodes to join this MM before it is told the outcome.
pub(super) struct ParkedOutcome {
    client: ClientId,
    job: JobId,
    nodes: NodeSet,
    outcome: JobOutcome,
}

/// One node's output queue as the MM reads it.
pub(super) struct NodeOutput {
    consumer: QueueConsumer,
    /// Entries taken and not released yet, in order: (the sequence number after the entry,
    /// what releases it).
    pending: VecDeque<(u64, Ack)>,
}

impl NodeOutput {
    pub(super) fn new(consumer: QueueConsumer) -> Self {
        Self {
            consumer,
            pending: VecDeque::new(),
        }
    }

    /// A new queue epoch (a new membership of the node): what is pending belongs to the old
    /// one, whose entries the NM sends again.
    pub(super) fn restart(&mut self, consumer: QueueConsumer) {
        *self = Self::new(consumer);
    }
}

impl<E: MmEnv> MachineManager<E> {
    /// Passes on what `nodes` wrote into their output queues, and releases what reached its
    /// submitter.
    pub(super) fn forward_output(&mut self, nodes: impl IntoIterator<Item = NodeId>) {
        for n in nodes {
            self.take_output(n);
            self.release_output(n);
            if self.outputs[n as usize].pending.is_empty() {
                self.attention.output_waiting.remove(&n);
            } else {
                self.attention.output_waiting.insert(n);
            }
        }
    }

    fn take_output(&mut self, n: NodeId) {
        loop {
            let taken = self.outputs[n as usize]
                .consumer
                .take(&*self.prims, Wait::Poll);
            let (seq, entry) = match taken {
                Ok(Some(e)) => e,
                Ok(None) => break,
                Err(e) => {
                    tracing::error!(node = n, "output queue: {e}");
                    break;
                }
            };
            let ack = match decode::<OutputChunk>("output", &entry, self.cfg.cluster.output_bytes) {
                Ok(chunk) => {
                    self.metrics.output_forwarded(chunk.data.len());
                    self.pass_on(n, seq, chunk)
                }
                Err(e) => {
                    tracing::error!(node = n, "{e}");
                    Ack::Done
                }
            };
            self.outputs[n as usize].pending.push_back((seq + 1, ack));
        }
    }

    /// Sends a chunk to its job's submitter, or holds it for one who may reattach.
    fn pass_on(&mut self, n: NodeId, seq: u64, chunk: OutputChunk) -> Ack {
        let job = chunk.job;
        let reattaching = self.reattach.until.is_some();
        let Some(j) = self.jobs.get_mut(&job) else {
            return self.hold_for_ended(n, seq, chunk);
        };
        match j.client {
            Some(client) => match self.reply(client, Reply::Output(chunk)) {
                Some(k) => Ack::Reply { client, n: k },
                None => Ack::Done,
            },
            // A batch job's tasks write to files: what comes here is the node's word that
            // a task could not start, kept for the job's outcome.
            None if j.req.batch.is_some() => {
                j.keep_unsent(&chunk.data);
                Ack::Done
            }
            None if j.restored && reattaching => {
                j.held_output.push((n, seq, chunk));
                Ack::Held(job)
            }
            None => Ack::Done,
        }
    }

    /// A chunk of a job this MM knows only as ended: sent again by its node, the MM before
    /// this one having journaled the job's end before the chunk reached its submitter. Held
    /// for the submitter to reattach while such chunks may come (see the module's overview);
    /// otherwise nobody is left to take it.
    fn hold_for_ended(&mut self, n: NodeId, seq: u64, chunk: OutputChunk) -> Ack {
        let job = chunk.job;
        let now = self.now();
        let Some(until) = self.reattach.resends_until.filter(|&u| now < u) else {
            return Ack::Done;
        };
        // A batch job's tasks wrote to files: nobody follows it.
        let followed = self.finished.get(&job).map(|r| r.req.batch.is_none());
        if followed != Some(true) {
            return Ack::Done;
        }
        // Dropped with the rest of the held output if nobody follows it in time.
        self.reattach.until.get_or_insert(until);
        self.reattach
            .finished_output
            .entry(job)
            .or_default()
            .push((n, seq, chunk));
        Ack::Held(job)
    }

    /// Tells `client`, which follows `job` (ended, on `nodes`), the job's outcome after its
    /// held output; while the job's nodes may still send output again and have not all
    /// joined this MM, the client waits for them (see the module's overview).
    pub(super) fn tell_outcome_after_output(
        &mut self,
        client: ClientId,
        job: JobId,
        nodes: NodeSet,
        outcome: JobOutcome,
    ) {
        let parked = ParkedOutcome {
            client,
            job,
            nodes,
            outcome,
        };
        if self.resends_may_come() && !self.joined_all(&parked.nodes) {
            // One wait per connection (storm-submit follows one job): a client that asks
            // again, for this job or another, replaces its wait, so what waits is bounded
            // by the connections the control socket admits.
            self.reattach.parked.retain(|p| p.client != client);
            self.reattach.parked.push(parked);
            return;
        }
        self.tell_parked(parked);
    }

    /// Tells the parked followers whose jobs' nodes have all joined, or all of them once
    /// the grace has passed.
    pub(super) fn release_parked_outcomes(&mut self) {
        if self.reattach.parked.is_empty() {
            return;
        }
        let late = !self.resends_may_come();
        for parked in std::mem::take(&mut self.reattach.parked) {
            if late || self.joined_all(&parked.nodes) {
                self.tell_parked(parked);
            } else {
                self.reattach.parked.push(parked);
            }
        }
    }

    /// Whether nodes may still send again output of jobs that ended under an earlier MM.
    fn resends_may_come(&self) -> bool {
        self.reattach
            .resends_until
            .is_some_and(|until| self.now() < until)
    }

    /// Whether every node of `nodes` is up in this MM (or is not one of its nodes).
    fn joined_all(&self, nodes: &NodeSet) -> bool {
        nodes
            .iter()
            .all(|n| (n as usize) >= self.outputs.len() || self.nodes.is_up(n))
    }

    /// What the job's nodes sent again is taken, then the held output and the outcome go.
    fn tell_parked(&mut self, p: ParkedOutcome) {
        let nodes: Vec<NodeId> = p
            .nodes
            .iter()
            .filter(|&n| (n as usize) < self.outputs.len())
            .collect();
        self.forward_output(nodes);
        self.send_finished_output(p.client, p.job);
        self.reply(p.client, Reply::Finished(p.outcome));
    }

    /// Releases node `n`'s entries, in order, up to the first still on its way.
    fn release_output(&mut self, n: NodeId) {
        let (out, clients, jobs, env) = (
            &mut self.outputs[n as usize],
            &self.outbox.clients,
            &self.jobs,
            &self.env,
        );
        let mut upto = None;
        while let Some(&(after, ack)) = out.pending.front() {
            let done = match ack {
                Ack::Done => true,
                Ack::Reply { client, n } => clients
                    .get(&client)
                    .is_none_or(|_| env.replies_written(client) >= n),
                Ack::Held(job) => {
                    !jobs.contains_key(&job) && !self.reattach.finished_output.contains_key(&job)
                }
            };
            if !done {
                break;
            }
            upto = Some(after);
            out.pending.pop_front();
        }
        if let Some(upto) = upto {
            out.consumer.release(&*self.prims, upto);
        }
    }

    /// A restored job's submitter reattached: it gets the output held for it.
    pub(super) fn send_held_output(&mut self, job: JobId) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let Some(client) = j.client else {
            return;
        };
        for (n, seq, chunk) in std::mem::take(&mut j.held_output) {
            let ack = match self.reply(client, Reply::Output(chunk)) {
                Some(k) => Ack::Reply { client, n: k },
                None => Ack::Done,
            };
            self.set_ack(n, seq, job, ack);
        }
    }

    /// A restored job that ended before its submitter reattached: the output held for it
    /// goes to `client`, who reattached.
    pub(super) fn send_finished_output(&mut self, client: ClientId, job: JobId) {
        for (n, seq, chunk) in self
            .reattach
            .finished_output
            .remove(&job)
            .unwrap_or_default()
        {
            let ack = match self.reply(client, Reply::Output(chunk)) {
                Some(k) => Ack::Reply { client, n: k },
                None => Ack::Done,
            };
            self.set_ack(n, seq, job, ack);
        }
    }

    /// Nobody reattached to follow `job`: the output held for it goes.
    pub(super) fn drop_held_output(&mut self, job: JobId) {
        let held = match self.jobs.get_mut(&job) {
            Some(j) => std::mem::take(&mut j.held_output),
            None => self
                .reattach
                .finished_output
                .remove(&job)
                .unwrap_or_default(),
        };
        for (n, seq, _) in held {
            self.set_ack(n, seq, job, Ack::Done);
        }
    }

    /// What releases entry `seq` of node `n`'s queue, held for `job`, from now on.
    fn set_ack(&mut self, n: NodeId, seq: u64, job: JobId, ack: Ack) {
        if let Some(entry) = self.outputs[n as usize]
            .pending
            .iter_mut()
            .find(|(after, a)| *after == seq + 1 && *a == Ack::Held(job))
        {
            entry.1 = ack;
        }
    }

    /// A new membership of node `n` starts its output queue at `epoch`.
    pub(super) fn restart_output(&mut self, n: NodeId, epoch: u32) {
        match QueueConsumer::new(&*self.prims, self.rm.output[n as usize], epoch) {
            Ok(c) => self.outputs[n as usize].restart(c),
            Err(e) => tracing::error!(node = n, "cannot reset the output queue: {e}"),
        }
    }
}
