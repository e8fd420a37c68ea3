//! The manager group's members changing while it runs, as the replica's thread does it: a
//! replica without a place asks to join and is admitted by the leader, which promotes it to a
//! voter once its log holds everything committed; an operator removes a replica
//! (`storm managers remove`); every replica applies the changes Raft commits, and one that
//! finds itself removed stops. The ids and messages are [`super::member`]'s.

use std::time::Instant;

use raft::StateRole;
use raft::eraftpb::{ConfChange, ConfChangeType, ConfState, Entry};
use storm_primitives::NodeId;

use super::member::{self, Welcome};
use super::resync::{Standing, Why, Wire};
use super::{Host, ReplicaError, raft_node};

impl Host {
    /// A step of a replica that waits to be admitted: it asks every other replica to let it
    /// join (only the leader answers) until the leader welcomes it.
    pub(super) fn join_step(&mut self) -> Result<(), ReplicaError> {
        for (_, answer) in self.removal.try_iter() {
            let _ = answer.send(Err("this replica has not joined the group yet".into()));
        }
        for (from, bytes) in self.inbox.take(&*self.fabric, &self.group) {
            match Wire::decode(&bytes) {
                Ok(Wire::Welcome(Welcome::Admitted {
                    id,
                    index,
                    term,
                    conf,
                })) if member::position_of(id) == Some(self.me) => {
                    return self.admitted(id, index, term, conf);
                }
                Ok(Wire::Welcome(Welcome::Refused { id: 0, why })) if why != self.refusal => {
                    tracing::warn!(
                        leader = %self.names[from as usize],
                        "not admitted to the manager group yet: {why}"
                    );
                    self.refusal = why;
                }
                _ => {}
            }
        }
        if self
            .asked_to_join
            .is_none_or(|t| t.elapsed() >= self.election_timeout / 2)
        {
            for to in (0..self.replicas).filter(|&p| p != self.me) {
                self.outbox
                    .send(&*self.fabric, &self.group, to as NodeId, &Wire::join());
            }
            self.asked_to_join = Some(Instant::now());
        }
        let mut s = self.shared.status.lock();
        s.role = "joining".into();
        Ok(())
    }

    /// The leader admitted this replica as `id`: its log starts after entry `index`, where
    /// the group is `conf`, and its journal takes the leader's state as of that entry (as a
    /// replica that lacks dropped entries does).
    fn admitted(
        &mut self,
        id: u64,
        index: u64,
        term: u64,
        conf: ConfState,
    ) -> Result<(), ReplicaError> {
        let group = member::describe(&conf, &self.names);
        self.log.join(id, index, term, conf)?;
        self.node = raft_node(&self.replication, id, index, self.log.storage())?;
        self.id = Some(id);
        self.applied = index;
        self.log.applied_to(index);
        self.standing = Standing::taking(Why::Behind, index);
        tracing::warn!(
            raft_id = id,
            "admitted to the manager group as Raft id {id} (the group: {group}); it takes the \
             leader's state (as of log entry {index}), then votes once its log holds \
             everything committed"
        );
        Ok(())
    }

    /// Replica `position` asks to join: the leader adds it as a learner of a new generation
    /// if its place is free, welcomes it if it is a learner already, and tells it why not if
    /// a voter holds its place. Other replicas let the leader answer.
    pub(super) fn admit(&mut self, position: usize) {
        if self.leading.is_none() || self.node.raft.state != StateRole::Leader {
            return;
        }
        let name = self.names[position].clone();
        let conf = self.log.conf().clone();
        let welcome = match member::member_at(&conf, position) {
            Some(id) if conf.learners.contains(&id) => Welcome::Admitted {
                id,
                index: self.applied,
                term: self.node.raft.raft_log.term(self.applied).unwrap_or(0),
                conf,
            },
            Some(id) => Welcome::Refused {
                id: 0,
                why: format!(
                    "{name}'s place in the group is held by Raft id {id}, which votes: if that \
                     replica is lost, remove it first (`storm managers remove {name}`)"
                ),
            },
            // Raft takes one change at a time; the replica asks again.
            None if self.node.raft.has_pending_conf() => return,
            None => {
                let id = member::raft_id(position, self.node.raft.raft_log.last_index() + 1);
                let cc = ConfChange {
                    change_type: ConfChangeType::AddLearnerNode,
                    node_id: id,
                    ..Default::default()
                };
                match self.node.propose_conf_change(Vec::new(), cc) {
                    Ok(()) => tracing::warn!(
                        replica = %name,
                        raft_id = id,
                        "{name} asks to join the manager group: adding it as a learner (Raft \
                         id {id})"
                    ),
                    Err(e) => tracing::error!(replica = %name, "cannot add {name}: {e}"),
                }
                return;
            }
        };
        self.send_welcome(position, &welcome);
    }

    fn send_welcome(&mut self, to: usize, welcome: &Welcome) {
        match Wire::welcome(welcome) {
            Ok(bytes) => {
                self.outbox
                    .send(&*self.fabric, &self.group, to as NodeId, &bytes);
            }
            Err(e) => tracing::error!("cannot encode an answer to a join: {e}"),
        }
    }

    /// A Raft message from `id` at `position`, which is not a member of the group as this
    /// replica knows it: dropped. If it was removed (not merely added by an entry this
    /// replica has not applied yet), it is told so, and stops.
    pub(super) fn not_a_member(&mut self, position: usize, id: u64) {
        let name = self.names[position].clone();
        if !member::was_removed(self.log.conf(), id, self.applied) {
            return;
        }
        if self.not_members.insert(id) {
            tracing::warn!(
                replica = %name,
                raft_id = id,
                "dropping messages from {name} as Raft id {id}, which is not a member of the \
                 manager group (it was removed): it is told so"
            );
        }
        let held = member::member_at(self.log.conf(), position)
            .map(|now| format!(", and Raft id {now} holds its place"))
            .unwrap_or_default();
        let why = format!(
            "this replica (Raft id {id}) is not a member of the manager group: it was \
             removed{held}. To add it again, start it on an empty state directory with \
             `storm-mm --manager {name} --join`"
        );
        self.send_welcome(position, &Welcome::Refused { id, why });
    }

    /// `storm managers remove NAME`: proposes the removal of `name`'s Raft id, if this replica
    /// leads, it is not `name`, no other change is under way, and the voters left that answer
    /// still make a majority of them.
    pub(super) fn remove(&mut self, name: &str) -> Result<String, String> {
        let position = self.names.iter().position(|n| n == name).ok_or_else(|| {
            format!(
                "no replica is named {name:?} (the cluster file names {})",
                self.names.join(", ")
            )
        })?;
        if self.leading.is_none() {
            return Err("this replica no longer leads the group: ask again".into());
        }
        if position == self.me {
            return Err(format!(
                "{name} leads the group, and a leader does not remove itself: stop it (another \
                 replica takes over), then ask again"
            ));
        }
        let conf = self.log.conf().clone();
        let Some(id) = member::member_at(&conf, position) else {
            return Err(format!(
                "{name} is not a member of the group (removed already); to add it again, start \
                 it on an empty state directory with `storm-mm --manager {name} --join`"
            ));
        };
        if self.node.raft.has_pending_conf() {
            return Err(
                "a change of the group's members is under way: ask again once `storm managers` \
                 shows it done"
                    .into(),
            );
        }
        if member::is_voter(&conf, id) {
            let mut left = conf.clone();
            left.voters.retain(|&v| v != id);
            let me = self.id.unwrap_or_default();
            let answers = |v: u64| {
                v == me
                    || member::position_of(v).is_some_and(|p| {
                        self.heard[p].is_some_and(|h| h.elapsed() < self.election_timeout)
                    })
            };
            if !member::has_quorum(&left, answers) {
                return Err(format!(
                    "without {name}, the group's {} other voters would need a majority of them \
                     up, and too few answer: removing it would stop the group. Bring the others \
                     back first",
                    left.voters.len()
                ));
            }
        }
        let cc = ConfChange {
            change_type: ConfChangeType::RemoveNode,
            node_id: id,
            ..Default::default()
        };
        self.node
            .propose_conf_change(Vec::new(), cc)
            .map_err(|e| format!("cannot propose the change: {e}"))?;
        tracing::warn!(replica = %name, raft_id = id, "removing {name} (Raft id {id}) from the manager group");
        Ok(format!(
            "{name} (Raft id {id}) leaves the manager group once the change commits, and no \
             longer counts toward its majority. To replace it, start a replica on an empty \
             state directory with: storm-mm --manager {name} --join"
        ))
    }

    /// The leader makes a learner a voter once its log holds everything committed (one
    /// change at a time).
    pub(super) fn promote_learners(&mut self) {
        if self.leading.is_none() || self.node.raft.has_pending_conf() {
            return;
        }
        let committed = self.node.raft.raft_log.committed;
        let ready = self.log.conf().learners.iter().copied().find(|&l| {
            self.node
                .raft
                .prs()
                .get(l)
                .is_some_and(|p| p.matched >= committed)
        });
        let Some(id) = ready else {
            return;
        };
        let cc = ConfChange {
            change_type: ConfChangeType::AddNode,
            node_id: id,
            ..Default::default()
        };
        let name = member::position_of(id)
            .and_then(|p| self.names.get(p))
            .cloned()
            .unwrap_or_default();
        match self.node.propose_conf_change(Vec::new(), cc) {
            Ok(()) => tracing::warn!(
                replica = %name,
                raft_id = id,
                "{name} (Raft id {id}) holds the whole log: it votes from now on"
            ),
            Err(e) => tracing::error!(replica = %name, "cannot make {name} a voter: {e}"),
        }
    }

    /// Applies a change of the group's configuration (log entry `e`) to Raft and the log.
    /// A replica that finds itself removed stops.
    pub(super) fn apply_conf_change(&mut self, e: &Entry) -> Result<(), ReplicaError> {
        let Some(change) = member::conf_change(e) else {
            return Ok(());
        };
        let cc = change.map_err(|err| {
            ReplicaError::Raft(format!("log entry {} (a group change): {err}", e.index))
        })?;
        let applied = self.node.apply_conf_change(&cc);
        let conf = applied.map_err(|err| {
            ReplicaError::Raft(format!(
                "applying the group change of log entry {}: {err}",
                e.index
            ))
        })?;
        if conf != *self.log.conf() {
            tracing::warn!(
                entry = e.index,
                "the manager group is now: {}",
                member::describe(&conf, &self.names)
            );
        }
        self.log.set_conf(conf.clone())?;
        if let Some(me) = self.id
            && !member::is_member(&conf, me)
        {
            let name = &self.names[self.me];
            return Err(ReplicaError::Raft(format!(
                "this replica (Raft id {me}) was removed from the manager group (log entry {}). \
                 To add it again, start it on an empty state directory with `storm-mm \
                 --manager {name} --join`",
                e.index
            )));
        }
        Ok(())
    }
}
