//! raft-rs's Readies: messages sent, entries written to the log (by its writer thread) and
//! applied to the journal, in the order Raft needs; a leader settles the batches the group
//! committed.

use std::time::Instant;

use raft::eraftpb::{Entry, MessageType};
use storm_primitives::NodeId;

use super::checksum::Report;
use super::resync::{Standing, Why, Wire};
use super::{Applied, Host, ReplicaError, checksum, entry, member};
use crate::journal::{Settled, remove_programs};

impl Host {
    pub(super) fn send(&mut self, msgs: Vec<raft::eraftpb::Message>) {
        for m in msgs {
            let Some(to) = member::position_of(m.to).map(|p| p as NodeId) else {
                tracing::error!(
                    raft_id = m.to,
                    "a message to a Raft id that names no replica"
                );
                continue;
            };
            if m.get_msg_type() == MessageType::MsgSnapshot {
                tracing::warn!(
                    to = %self.names.get(to as usize).map_or("?", |n| n.as_str()),
                    entry = m.get_snapshot().get_metadata().index,
                    "a replica lacks log entries this one dropped: it takes this one's state"
                );
                self.snapshots_sent.push(m.to);
            }
            match Wire::raft(&m) {
                Ok(bytes) => {
                    if !self.outbox.send(&*self.fabric, &self.group, to, &bytes) {
                        tracing::error!(
                            to,
                            len = bytes.len(),
                            "a replica message is too large to send"
                        );
                    }
                }
                Err(e) => tracing::error!("cannot encode a replica message: {e}"),
            }
        }
    }

    /// raft-rs's Ready: send, apply, and give the log's writer thread what to persist; what
    /// may go only once that is durable waits for [`Host::persisted`]. A Ready with a
    /// snapshot is handled whole, once everything before it is written (see raft-rs's own
    /// examples for the order).
    pub(super) fn handle_ready(&mut self) -> Result<(), ReplicaError> {
        if !self.node.has_ready() {
            return Ok(());
        }
        let mut rd = self.node.ready();
        self.send(rd.take_messages());
        if !rd.snapshot().is_empty() {
            return self.handle_snapshot_ready(rd);
        }
        // New entries go to the log's writer thread first, so that their write (on which a
        // commit waits) runs while the committed ones are applied.
        let started = Instant::now();
        let ticket = self.log.append_queued(rd.entries(), rd.hs())?;
        self.timed("giving entries to the Raft log", started);
        let started = Instant::now();
        self.apply(rd.take_committed_entries())?;
        self.timed("applying entries to the journal", started);
        // A heartbeat's answer acknowledges no entry and no vote: it goes at once, so that a
        // slow sync of this replica's log does not cost the leader its lease. Everything
        // else waits for the write.
        let (now, later): (Vec<_>, Vec<_>) = rd
            .take_persisted_messages()
            .into_iter()
            .partition(|m| m.get_msg_type() == MessageType::MsgHeartbeatResponse);
        self.send(now);
        self.unpersisted.push_back((rd.number(), ticket, later));
        self.node.advance_append_async(rd);
        self.node.advance_apply();
        Ok(())
    }

    /// Tells raft-rs which Readies the log's writer thread has made durable, and sends the
    /// messages that waited for them.
    pub(super) fn persisted(&mut self) -> Result<(), ReplicaError> {
        let written = self.log.written()?;
        let mut last = None;
        while self
            .unpersisted
            .front()
            .is_some_and(|&(_, ticket, _)| ticket <= written)
        {
            let (number, _, msgs) = self.unpersisted.pop_front().expect("checked");
            self.send(msgs);
            last = Some(number);
        }
        if let Some(number) = last {
            self.node.on_persist_ready(number);
        }
        Ok(())
    }

    /// A Ready with a snapshot: handled whole, in order, once every write given before is
    /// done (a snapshot is rare: a replica that lacks entries the leader dropped).
    pub(super) fn handle_snapshot_ready(
        &mut self,
        mut rd: raft::Ready,
    ) -> Result<(), ReplicaError> {
        self.log.flush()?;
        self.persisted()?;
        {
            let snap = rd.snapshot().clone();
            let index = snap.get_metadata().index;
            self.log.apply_snapshot(&snap)?;
            tracing::warn!(
                index,
                "this replica lacks log entries the leader dropped: it takes the leader's state \
                 (as of log entry {index} or later) before it stands for election"
            );
            self.applied = index;
            self.log.applied_to(index);
            self.standing = Standing::taking(Why::Behind, index);
        }
        let started = Instant::now();
        self.apply(rd.take_committed_entries())?;
        self.timed("applying entries to the journal", started);
        let started = Instant::now();
        self.log.append(rd.entries(), rd.hs())?;
        self.timed("appending to the Raft log", started);
        self.send(rd.take_persisted_messages());
        let mut light = self.node.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.log.set_commit(commit);
        }
        self.send(light.take_messages());
        self.apply(light.take_committed_entries())?;
        self.node.advance_apply();
        Ok(())
    }

    /// Writes committed entries into this replica's journal; on the leader, settles the
    /// batches whose last part it proposed in its term. Counts the replicas' reports of their
    /// state, and makes this replica's own at the end of each window.
    pub(super) fn apply(&mut self, entries: Vec<Entry>) -> Result<(), ReplicaError> {
        for e in entries {
            self.apply_conf_change(&e)?;
            if let Some(applied) = Applied::of(&e) {
                let applied = applied.map_err(|why| {
                    ReplicaError::Raft(format!("log entry {} does not decode: {why}", e.index))
                })?;
                match applied {
                    Applied::Part(part) => self.apply_part(&e, part)?,
                    Applied::Program(chunk) => {
                        let job = chunk.job;
                        if let Some(store) = &self.programs
                            && let Err(err) = self.receiving.take(store, chunk)
                        {
                            tracing::error!(job, "cannot keep the program copy here: {err}");
                        }
                    }
                    Applied::Checksum(report) => self.judge(&report),
                    Applied::FarProgram(far) => self.note_far_copy(far),
                }
            }
            self.applied = e.index;
            self.log.applied_to(e.index);
            if self.checksum_every > 0
                && e.index % self.checksum_every == 0
                && !self.standing.is_taking()
            {
                let state = self
                    .store
                    .read()
                    .map_err(|err| ReplicaError::Raft(format!("reading the journal: {err}")))?;
                self.reports.push(
                    Report {
                        replica: self.me as u32,
                        window: e.index,
                        digest: checksum::digest(&state),
                    }
                    .encode(),
                );
            }
        }
        Ok(())
    }

    /// Applies a part of a journal commit (entry `e`).
    pub(super) fn apply_part(&mut self, e: &Entry, part: entry::Part) -> Result<(), ReplicaError> {
        // A follower deletes the copies of jobs that ended (the leader deletes its own once
        // their batch settles), and every replica stops fetching theirs.
        let ended = part.changes.iter().filter_map(|change| match change {
            crate::journal::Change::RemoveJob(id) => Some(*id),
            crate::journal::Change::Job(rec)
                if matches!(rec.state, crate::journal::JobState::Finished { .. }) =>
            {
                Some(rec.id)
            }
            _ => None,
        });
        for job in ended.collect::<Vec<_>>() {
            self.forget_far_copy(job);
            if self.leading.is_none()
                && let Some(store) = &self.programs
            {
                store.remove(job);
            }
        }
        // A batch is durable once the group committed its entries: the leader settles it
        // before writing it to its own journal store, which a restarted replica fills again
        // from the log.
        if part.last && Some(e.term) == self.leading {
            remove_programs(
                self.programs.as_ref(),
                self.unneeded.remove(&part.batch).unwrap_or_default(),
            );
            let proposed = self
                .proposed_at
                .remove(&part.batch)
                .unwrap_or_else(Instant::now);
            // Batches proposed before this one settle with it.
            self.proposed_at = self.proposed_at.split_off(&part.batch);
            let _ = self.settle.send(Settled {
                batch: part.batch,
                outcome: Ok(()),
                took: proposed.elapsed(),
            });
            if let Some(w) = &*self.shared.waker.lock() {
                w.wake();
            }
        }
        self.store
            .write_applied(&part.changes, part.next_job, e.index, false)
            .map_err(|err| ReplicaError::Raft(format!("applying entry {}: {err}", e.index)))?;
        Ok(())
    }
}
