//! How a replica's journal is compared with the group's (the reports of [`super::checksum`]
//! counted into verdicts), and how a replica that diverged, lacks entries the log dropped, or
//! joined takes the leader's state ([`super::resync`]'s messages).

use std::time::Instant;

use raft::{GetEntriesContext, StateRole, Storage};
use storm_primitives::NodeId;

use super::checksum::{Report, Verdict};
use super::resync::{self, Fetch, Image, Offer, Stage, Standing, Want, Why};
use super::{Applied, Host, ReplicaError, checksum, program};
use crate::journal::Restored;

impl Host {
    /// Counts a replica's report of its state, and acts on what it settles.
    pub(super) fn judge(&mut self, report: &Report) {
        for verdict in self.windows.record(report) {
            match verdict {
                Verdict::Diverged {
                    replica,
                    window,
                    theirs,
                    majority,
                } if replica as usize == self.me => {
                    match self.standing {
                        Standing::Taking(_) => continue,
                        Standing::InStep { resynced_at } if window <= resynced_at => continue,
                        Standing::InStep { .. } => {}
                    }
                    tracing::error!(
                        window,
                        "THIS REPLICA'S STATE DIVERGED from the manager group's: after log entry \
                         {window} its journal hashes to {}, a majority's to {}. It stops \
                         standing for election and takes the leader's state",
                        checksum::short(&theirs),
                        checksum::short(&majority),
                    );
                    self.standing = Standing::taking(Why::Diverged, 0);
                    if self.leading.is_some() {
                        self.transfer_leadership();
                    }
                }
                Verdict::Diverged {
                    replica,
                    window,
                    theirs,
                    majority,
                } => {
                    if self.peers_diverged.insert(replica) {
                        tracing::error!(
                            window,
                            replica = %self.names[replica as usize],
                            "a replica's state diverged from the manager group's: after log \
                             entry {window} its journal hashes to {}, a majority's to {}; it \
                             takes the leader's state",
                            checksum::short(&theirs),
                            checksum::short(&majority),
                        );
                    }
                }
                Verdict::Agrees { replica, window } if replica as usize == self.me => {
                    if let Standing::InStep { resynced_at } = &mut self.standing
                        && *resynced_at > 0
                        && window > *resynced_at
                    {
                        tracing::warn!(
                            window,
                            "this replica's state agrees with the manager group's again"
                        );
                        *resynced_at = 0;
                    }
                }
                Verdict::Agrees { replica, window } => {
                    if self.peers_diverged.remove(&replica) {
                        tracing::warn!(
                            window,
                            replica = %self.names[replica as usize],
                            "a replica's state agrees with the manager group's again"
                        );
                    }
                }
                Verdict::NoMajority { window } => tracing::error!(
                    window,
                    "NO MAJORITY of the manager group holds the same state after log entry \
                     {window}: every replica hashes its journal differently"
                ),
            }
        }
    }

    /// Proposes this replica's reports (a follower's go through the leader; without a leader
    /// they are dropped, and the window is judged on the others').
    pub(super) fn propose_reports(&mut self) {
        for report in std::mem::take(&mut self.reports) {
            if let Err(e) = self.node.propose(checksum::CONTEXT.to_vec(), report) {
                tracing::debug!("a report of this replica's state was not proposed: {e}");
            }
        }
    }

    /// A diverged replica's way back: a leader hands the group over first (and steps down if
    /// no one took it within an election timeout); a follower takes the leader's state.
    pub(super) fn resync(&mut self) -> Result<(), ReplicaError> {
        let Standing::Taking(taking) = &mut self.standing else {
            return Ok(());
        };
        let raft = &mut self.node.raft;
        if raft.state == StateRole::Leader {
            if taking.since.elapsed() > self.election_timeout {
                let term = raft.term;
                raft.become_follower(term, raft::INVALID_ID);
            }
            return Ok(());
        }
        if let Stage::Holding(image) = &taking.stage {
            if self.applied >= image.index {
                let Stage::Holding(image) = std::mem::replace(&mut taking.stage, Stage::Idle)
                else {
                    unreachable!("matched above")
                };
                return self.install(image);
            }
            return Ok(());
        }
        if raft.leader_id == raft::INVALID_ID {
            return Ok(());
        }
        let leader = raft.leader_id as usize - 1;
        if leader == self.me {
            return Ok(());
        }
        let want = match &mut taking.stage {
            Stage::Fetching(f) if f.from == leader && f.asked.elapsed() < self.election_timeout => {
                return Ok(());
            }
            Stage::Fetching(f) if f.from == leader => f,
            stage => {
                tracing::warn!(from = %self.names[leader], "asking the leader for its state");
                let at_least = taking.at_least.max(self.log.compacted());
                *stage = Stage::Fetching(Fetch::new(leader, at_least));
                let Stage::Fetching(f) = stage else {
                    unreachable!("set above")
                };
                f
            }
        };
        want.asked = Instant::now();
        let want = want.want();
        self.outbox
            .send(&*self.fabric, &self.group, leader as NodeId, &want.encode());
        Ok(())
    }

    /// The largest part of a state that a mailbox slot holds.
    pub(super) fn part_bytes(&self) -> usize {
        self.group.max_message() - 32
    }

    /// Replica `to` (diverged) asks for this one's state: sends the part it wants of the image
    /// being sent, or of a new one of the journal as it stands now.
    pub(super) fn offer_state(&mut self, to: usize, want: Want) -> Result<(), ReplicaError> {
        if self.standing.is_taking() || self.applied < want.at_least {
            // Asked again once this replica applied as far (or another leads).
            return Ok(());
        }
        let current = self.offer.as_ref().is_some_and(|o| {
            o.id == want.id
                || (want.id == 0
                    && o.index >= want.at_least
                    && o.made.elapsed() < self.election_timeout)
        });
        if !current {
            let state = self
                .store
                .read()
                .map_err(|e| ReplicaError::Raft(format!("reading the journal: {e}")))?;
            self.offers_made += 1;
            let mut image = Image::new(self.applied, state);
            image.programs = self.waiting_programs(&image.state)?;
            let bytes = image.encode();
            tracing::warn!(
                to = %self.names[to],
                entry = self.applied,
                bytes = bytes.len(),
                "sending this replica's state to a replica that asked for it (it diverged, lacks entries the log dropped, or joined)"
            );
            self.offer = Some(Offer {
                id: self.outbox.incarnation() ^ self.offers_made,
                index: self.applied,
                bytes,
                made: Instant::now(),
                asked: Instant::now(),
            });
        }
        let limit = self.part_bytes();
        let offer = self.offer.as_mut().expect("made above");
        offer.asked = Instant::now();
        let offset = if want.id == offer.id { want.offset } else { 0 };
        let part = offer.part(offset, limit);
        self.outbox
            .send(&*self.fabric, &self.group, to as NodeId, &part.encode());
        Ok(())
    }

    /// The program copies this replica holds of the jobs in `state` that a leader may have
    /// to run from their beginning ([`crate::journal::JobRecord::needs_program_copy`]).
    pub(super) fn waiting_programs(
        &self,
        state: &Restored,
    ) -> Result<Vec<(storm_cluster::messages::JobId, Vec<u8>)>, ReplicaError> {
        let Some(store) = &self.programs else {
            return Ok(Vec::new());
        };
        let mut out = Vec::new();
        for rec in &state.jobs {
            if !rec.needs_program_copy() {
                continue;
            }
            let Some(mut copy) = store.open(rec.id) else {
                continue;
            };
            let mut bytes = Vec::new();
            std::io::Read::read_to_end(&mut copy, &mut bytes).map_err(|e| {
                ReplicaError::Raft(format!("reading job {}'s program copy: {e}", rec.id))
            })?;
            out.push((rec.id, bytes));
        }
        Ok(out)
    }

    /// A part of the state this replica asked for.
    pub(super) fn take_state(&mut self, from: usize, part: resync::Part) {
        let Some(fetch) = self.standing.fetch_from(from) else {
            return;
        };
        let stage = match fetch.take(part) {
            None => {
                let want = fetch.want();
                fetch.asked = Instant::now();
                self.outbox
                    .send(&*self.fabric, &self.group, from as NodeId, &want.encode());
                return;
            }
            Some(Ok(image)) => Stage::Holding(image),
            Some(Err(why)) => {
                tracing::error!(from = %self.names[from], "refused the state sent: {why}");
                Stage::Idle
            }
        };
        if let Standing::Taking(taking) = &mut self.standing {
            taking.stage = stage;
        }
    }

    /// Replaces this replica's journal with `image` (taken once this replica applied the log
    /// as far), then applies again, from its own log, what it applied beyond the image.
    pub(super) fn install(&mut self, image: Image) -> Result<(), ReplicaError> {
        let err = |e: &dyn std::fmt::Display| ReplicaError::Raft(format!("taking a state: {e}"));
        let at_least = match &self.standing {
            Standing::Taking(t) => t.at_least,
            Standing::InStep { .. } => 0,
        };
        if image.index < at_least.max(self.log.compacted()) {
            // Older than this replica's log reaches back: it cannot be brought up to date.
            tracing::warn!(
                taken = image.index,
                "the state sent is older than this replica's log: asking again"
            );
            return Ok(());
        }
        self.store
            .replace(&image.state, image.index)
            .map_err(|e| err(&e))?;
        if self.applied > image.index {
            let again = self
                .node
                .store()
                .entries(
                    image.index + 1,
                    self.applied + 1,
                    None,
                    GetEntriesContext::empty(false),
                )
                .map_err(|e| err(&e))?;
            for e in again {
                if let Some(Ok(Applied::Part(part))) = Applied::of(&e) {
                    self.store
                        .write_applied(&part.changes, part.next_job, e.index, false)
                        .map_err(|e| err(&e))?;
                }
            }
        }
        if let Some(store) = &self.programs {
            for (job, bytes) in image.programs {
                let chunk = program::Chunk {
                    job,
                    offset: 0,
                    total: bytes.len() as u64,
                    bytes,
                };
                if let Err(e) = self.receiving.take(store, chunk) {
                    tracing::error!(job, "cannot keep the program copy here: {e}");
                }
            }
        }
        self.checkpointed.0 = 0;
        self.checkpoint()?;
        tracing::warn!(
            taken = image.index,
            applied = self.applied,
            "took the leader's state (after log entry {}) in place of this replica's, and \
             applied this replica's log after it: standing for election again",
            image.index
        );
        self.log.state_taken()?;
        self.standing = Standing::InStep {
            resynced_at: self.applied,
        };
        Ok(())
    }
}
