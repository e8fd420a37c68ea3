//! The replica as leader: journal commits and program copies proposed to the log, when it
//! begins and stops to lead, its lease, the leadership handed over, and how it sees the group
//! (`storm managers`).

use std::sync::atomic::Ordering;
use std::time::Instant;

use raft::StateRole;

use super::member;
use super::{Host, PART_BYTES, ReplicaError, RoleEvent, entry, program};
use crate::journal::Batch;

impl Host {
    pub(super) fn propose(&mut self, term: u64, batch: Batch) -> Result<(), ReplicaError> {
        if self.leading != Some(term) {
            // Sent by a core that stopped leading before it learned of it.
            tracing::debug!(
                batch = batch.number,
                term,
                "a journal commit of a term this replica does not lead: dropped"
            );
            return Ok(());
        }
        if self.node.raft.lead_transferee.is_some() {
            // Raft takes no proposal while it hands leadership over; the core stopped.
            tracing::warn!(
                batch = batch.number,
                "a journal commit came while handing the group over: dropped, as in a crash"
            );
            return Ok(());
        }
        self.proposed_at.insert(batch.number, Instant::now());
        self.propose_programs(&batch)?;
        for part in entry::split(&batch, PART_BYTES) {
            self.node
                .propose(entry::CONTEXT.to_vec(), part)
                .map_err(|e| ReplicaError::Raft(format!("proposing a journal commit: {e}")))?;
        }
        if !batch.unneeded.is_empty() {
            self.unneeded.insert(batch.number, batch.unneeded);
        }
        Ok(())
    }

    /// Proposes, ahead of `batch`, the program copies of the jobs it records for the first
    /// time that a next leader may have to run from their beginning: waiting, or started with
    /// no launch out yet (a job given nodes at once), or requeueable (see [`program`]).
    pub(super) fn propose_programs(&mut self, batch: &Batch) -> Result<(), ReplicaError> {
        let Some(store) = self.programs.clone() else {
            return Ok(());
        };
        for change in &batch.changes {
            let crate::journal::Change::Job(rec) = change else {
                continue;
            };
            if !rec.needs_program_copy() || !self.shipped.insert(rec.id) {
                continue;
            }
            let Some(mut copy) = store.open(rec.id) else {
                continue;
            };
            let len = copy.metadata().map(|m| m.len()).unwrap_or(0);
            if len > program::MAX_REPLICATED {
                // Too large for every replica's log in memory: the others fetch it.
                let far = program::Far {
                    job: rec.id,
                    total: len,
                };
                self.node
                    .propose(program::FAR_CONTEXT.to_vec(), far.encode())
                    .map_err(|e| ReplicaError::Raft(format!("proposing a program note: {e}")))?;
                continue;
            }
            let mut bytes = Vec::with_capacity(len as usize);
            std::io::Read::read_to_end(&mut copy, &mut bytes).map_err(|e| {
                ReplicaError::Raft(format!("reading job {}'s program copy: {e}", rec.id))
            })?;
            for chunk in program::chunks(rec.id, &bytes, PART_BYTES) {
                self.node
                    .propose(program::CONTEXT.to_vec(), chunk.encode())
                    .map_err(|e| ReplicaError::Raft(format!("proposing a program copy: {e}")))?;
            }
        }
        // Jobs that ended need no memory of having been shipped.
        for change in &batch.changes {
            match change {
                crate::journal::Change::RemoveJob(id) => {
                    self.shipped.remove(id);
                }
                crate::journal::Change::Job(rec)
                    if matches!(rec.state, crate::journal::JobState::Finished { .. }) =>
                {
                    self.shipped.remove(&rec.id);
                }
                _ => {}
            }
        }
        Ok(())
    }

    /// Starts Raft's leadership transfer to the most up-to-date replica heard from within an
    /// election timeout (Raft brings it up to date first, then tells it to campaign at once).
    pub(super) fn transfer_leadership(&mut self) {
        let raft = &self.node.raft;
        if raft.state != StateRole::Leader {
            return;
        }
        let conf = self.log.conf();
        let best = (0..self.replicas)
            .filter(|&i| i != self.me && !self.peers_diverged.contains(&(i as u32)))
            .filter(|&i| self.heard[i].is_some_and(|h| h.elapsed() < self.election_timeout))
            .filter_map(|i| Some((i, member::member_at(conf, i)?)))
            .filter(|&(_, id)| member::is_voter(conf, id))
            .max_by_key(|&(_, id)| raft.prs().get(id).map_or(0, |p| p.matched));
        match best {
            Some((i, id)) => {
                tracing::warn!(to = %self.names[i], "handing the manager group over");
                self.node.transfer_leader(id);
            }
            None => tracing::error!("no other replica answers: nobody to hand the group over to"),
        }
    }

    /// Says when this replica begins to lead (its journal caught up), and when it stops; keeps
    /// the leader's lease.
    pub(super) fn roles(&mut self) -> Result<(), ReplicaError> {
        let raft = &self.node.raft;
        let is_leader = raft.state == StateRole::Leader;
        match self.leading {
            None if is_leader
                && raft.commit_to_current_term()
                && raft.raft_log.applied == raft.raft_log.committed =>
            {
                let term = raft.term;
                let restored = self
                    .store
                    .read()
                    .map_err(|e| ReplicaError::Raft(format!("reading the journal: {e}")))?;
                // The lease runs from the majority's acknowledgements of this term's first
                // entry, as heard (a replica never heard from counts for nothing).
                self.leading = Some(term);
                self.renew_lease();
                tracing::warn!(replica = self.me, term, "leading the manager group");
                let _ = self.tell.send(RoleEvent::Leads { term, restored });
            }
            Some(term) if !is_leader || raft.term != term => {
                let why = match raft.leader_id {
                    0 => format!("deposed: term {} has begun", raft.term),
                    l => format!(
                        "deposed: {} leads term {}",
                        member::position_of(l)
                            .and_then(|p| self.names.get(p))
                            .map_or("another replica", |n| n.as_str()),
                        raft.term
                    ),
                };
                tracing::warn!(term, "{why}; following the group");
                self.stop_leading();
                let _ = self.tell.send(RoleEvent::Deposed { term, why });
            }
            Some(_) => self.renew_lease(),
            None => {}
        }
        Ok(())
    }

    /// The core leading `term` stopped: if this replica still leads that term, it steps down
    /// to a follower (always safe in Raft; the group elects a leader once its election
    /// timeout passes, which may be this replica again, with a new core).
    pub(super) fn step_down(&mut self, term: u64) {
        if self.leading != Some(term) {
            return;
        }
        let raft = &mut self.node.raft;
        if raft.state == StateRole::Leader && raft.term == term {
            raft.become_follower(term, raft::INVALID_ID);
        }
        tracing::warn!(term, "stepped down: following the group");
        self.stop_leading();
    }

    /// Forgets what only the leader of a term keeps.
    pub(super) fn stop_leading(&mut self) {
        self.leading = None;
        self.shared.lease_until_us.store(0, Ordering::Release);
        self.unneeded.clear();
        self.proposed_at.clear();
        self.shipped.clear();
    }

    /// The lease runs `lease` past the time by which a majority (this replica counting) was
    /// last heard from.
    pub(super) fn renew_lease(&self) {
        let conf = self.log.conf();
        let me = self.id.unwrap_or_default();
        // The other members, newest word first: the lease runs from the moment by which
        // those heard since make a majority with this replica.
        let mut heard: Vec<(Instant, u64)> = (0..self.replicas)
            .filter(|&i| i != self.me)
            .filter_map(|i| Some((self.heard[i]?, member::member_at(conf, i)?)))
            .collect();
        heard.sort_unstable_by_key(|&(at, _)| std::cmp::Reverse(at));
        let mut counted = vec![me];
        let since = if member::has_quorum(conf, |id| counted.contains(&id)) {
            Some(Instant::now())
        } else {
            heard.iter().find_map(|&(at, id)| {
                counted.push(id);
                member::has_quorum(conf, |v| counted.contains(&v)).then_some(at)
            })
        };
        let until = since.map_or(0, |t| {
            (t + self.lease)
                .saturating_duration_since(self.shared.epoch)
                .as_micros() as u64
        });
        self.shared.lease_until_us.store(until, Ordering::Release);
    }

    pub(super) fn publish_status(&self) {
        let raft = &self.node.raft;
        let mut s = self.shared.status.lock();
        s.role = self
            .standing
            .role()
            .unwrap_or(match raft.state {
                StateRole::Leader => "leader",
                StateRole::Follower if self.log.conf().learners.contains(&raft.id) => "learner",
                StateRole::Follower => "follower",
                StateRole::Candidate => "candidate",
                StateRole::PreCandidate => "pre-candidate",
            })
            .into();
        s.term = raft.term;
        s.leader = member::position_of(raft.leader_id);
        s.applied = raft.raft_log.applied;
        s.committed = raft.raft_log.committed;
        s.group.clear();
        if raft.state != StateRole::Leader {
            return;
        }
        let last = raft.raft_log.last_index();
        let conf = self.log.conf();
        for (i, name) in self.names.iter().enumerate() {
            let id = member::member_at(conf, i);
            let matched = if i == self.me {
                last
            } else {
                id.and_then(|id| raft.prs().get(id))
                    .map_or(0, |p| p.matched)
            };
            let heard = self.heard[i].map(|t| t.elapsed());
            let role = if i == self.me {
                "leader"
            } else if id.is_none() {
                "removed"
            } else if self.peers_diverged.contains(&(i as u32)) {
                "diverged"
            } else if heard.is_some_and(|h| h < self.election_timeout)
                && id.is_some_and(|id| conf.learners.contains(&id))
            {
                "learner"
            } else if heard.is_some_and(|h| h < self.election_timeout) {
                "follower"
            } else {
                "unreachable"
            };
            s.group.push(storm_cluster::control::ManagerInfo {
                name: name.clone(),
                role: role.into(),
                term: raft.term,
                matched,
                lag: last.saturating_sub(matched),
                heard_ms_ago: heard.filter(|_| i != self.me).map(|h| h.as_millis() as u64),
            });
        }
    }
}
