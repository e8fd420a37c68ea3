//! A replicated MM's group in virtual time ([`crate::SimOptions::managers`]): 2f+1 replicas,
//! each a raft-rs [`RawNode`] over memory storage with a journal store of its own, as
//! `storm_mm::replica` runs them, with the same entries (`storm_mm::replica::entry`).
//!
//! What is modelled and what is not:
//! * Raft is raft-rs's, driven by the simulation: its ticks come every `heartbeat_ms` of
//!   virtual time, and its messages reach a replica that is up within the same step (the
//!   managers' network is ideal; a replica that is down neither sends nor receives).
//! * The leader's MM core hands its journal commits to the group ([`Group::propose`]); a
//!   commit settles once a majority holds it and the leader applied it to its journal, in its
//!   own term, as in the daemon. Every replica applies every committed entry to its journal.
//! * A killed leader ([`Group::kill`]) stops at once, with what it had not proposed. The
//!   others elect one after their election timeout; each replica's timeout is its own fixed
//!   number of ticks (raft-rs would draw them at random: fixed, the simulation stays
//!   deterministic, and distinct, no election is split).
//! * Not modelled: the replicas' disks (the log is durable as soon as it is appended), the
//!   lease, and the leader's threads.

use std::time::{Duration, Instant};

use raft::eraftpb::{ConfState, Entry, EntryType, Message};
use raft::storage::MemStorage;
use raft::{RawNode, StateRole};
use storm_mm::journal::{Batch, JournalStore, MemoryStore, Settled};
use storm_mm::replica::{PART_BYTES, entry};

struct Replica {
    node: RawNode<MemStorage>,
    store: MemoryStore,
    up: bool,
}

/// The replicas of a simulated MM group (see the module's overview).
pub struct Group {
    replicas: Vec<Replica>,
    tick: Duration,
    next_tick: Instant,
    /// Raft's messages sent and not yet delivered.
    in_flight: Vec<Message>,
    /// Raft's messages delivered so far.
    delivered: u64,
    /// Commits settled since the last look.
    settled: Vec<Settled>,
    /// The replica whose MM core runs, and the term it leads.
    leading: Option<(usize, u64)>,
}

impl Group {
    /// A group of `replicas` whose Raft ticks every `heartbeat` and whose election timeout is
    /// `election_ticks` of them (replica `i` waits `election_ticks + 2i`); replica 0 campaigns
    /// at once. `now` is the simulation's time.
    pub fn new(
        replicas: usize,
        heartbeat: Duration,
        election_ticks: usize,
        now: Instant,
    ) -> anyhow::Result<Self> {
        let voters: Vec<u64> = (1..=replicas as u64).collect();
        let logger = slog::Logger::root(slog::Discard, slog::o!());
        let replicas = (0..replicas)
            .map(|i| {
                let timeout = election_ticks + 2 * i;
                let cfg = raft::Config {
                    min_election_tick: timeout,
                    max_election_tick: timeout + 1,
                    ..storm_mm::replica::raft_config(i as u64 + 1, election_ticks)
                };
                cfg.validate()?;
                let storage =
                    MemStorage::new_with_conf_state(ConfState::from((voters.clone(), vec![])));
                Ok(Replica {
                    node: RawNode::new(&cfg, storage, &logger)?,
                    store: MemoryStore::default(),
                    up: true,
                })
            })
            .collect::<Result<Vec<_>, raft::Error>>()?;
        let mut group = Self {
            replicas,
            tick: heartbeat,
            next_tick: now + heartbeat,
            in_flight: Vec::new(),
            settled: Vec::new(),
            delivered: 0,
            leading: None,
        };
        group.replicas[0].node.campaign()?;
        group.exchange();
        Ok(group)
    }

    /// The replica that leads with every committed entry applied to its journal, and its
    /// term: one whose MM core may start.
    pub fn ready_leader(&self) -> Option<(usize, u64)> {
        self.replicas.iter().enumerate().find_map(|(i, r)| {
            let raft = &r.node.raft;
            (r.up
                && raft.state == StateRole::Leader
                && raft.commit_to_current_term()
                && raft.raft_log.applied == raft.raft_log.committed)
                .then_some((i, raft.term))
        })
    }

    /// Replica `i`'s journal store.
    pub fn store(&self, i: usize) -> MemoryStore {
        self.replicas[i].store.clone()
    }

    /// The MM core of replica `i` runs now, leading `term`: its commits settle.
    pub fn lead(&mut self, i: usize, term: u64) {
        self.leading = Some((i, term));
    }

    /// The replica whose MM core runs.
    pub fn leader(&self) -> Option<usize> {
        self.leading.map(|(i, _)| i)
    }

    /// Replica `i` stops (a `kill -9` of its host's storm-mm): it neither sends nor receives.
    pub fn kill(&mut self, i: usize) {
        self.replicas[i].up = false;
        if self.leading.is_some_and(|(l, _)| l == i) {
            self.leading = None;
        }
    }

    /// Hands a journal commit of the leading MM core to the group.
    pub fn propose(&mut self, batch: &Batch) -> anyhow::Result<()> {
        let (i, _) = self
            .leading
            .ok_or_else(|| anyhow::anyhow!("a journal commit with no MM core leading"))?;
        for part in entry::split(batch, PART_BYTES) {
            self.replicas[i]
                .node
                .propose(entry::CONTEXT.to_vec(), part)?;
        }
        Ok(())
    }

    /// Runs the group up to `now`: Raft's ticks due by then, and every message and Ready
    /// they lead to.
    pub fn run_to(&mut self, now: Instant) {
        while self.next_tick <= now {
            for r in self.replicas.iter_mut().filter(|r| r.up) {
                r.node.tick();
            }
            self.next_tick += self.tick;
            self.exchange();
        }
        self.exchange();
    }

    /// How many of Raft's messages were delivered so far.
    pub fn messages_delivered(&self) -> u64 {
        self.delivered
    }

    /// The commits settled since the last call.
    pub fn take_settled(&mut self) -> Vec<Settled> {
        std::mem::take(&mut self.settled)
    }

    /// Delivers messages and handles Readys until nothing more happens.
    fn exchange(&mut self) {
        loop {
            for m in std::mem::take(&mut self.in_flight) {
                let (from, to) = (m.from as usize - 1, m.to as usize - 1);
                if self.replicas[from].up && self.replicas.get(to).is_some_and(|r| r.up) {
                    self.delivered += 1;
                    let _ = self.replicas[to].node.step(m);
                }
            }
            let mut any = false;
            for i in 0..self.replicas.len() {
                if self.replicas[i].up && self.replicas[i].node.has_ready() {
                    self.handle_ready(i);
                    any = true;
                }
            }
            if !any && self.in_flight.is_empty() {
                return;
            }
        }
    }

    /// raft-rs's Ready for replica `i`: send, persist, apply (as `storm_mm::replica` does).
    fn handle_ready(&mut self, i: usize) {
        let mut rd = self.replicas[i].node.ready();
        self.in_flight.extend(rd.take_messages());
        let committed = rd.take_committed_entries();
        self.apply(i, committed);
        {
            let store = self.replicas[i].node.mut_store();
            if !rd.entries().is_empty() {
                store
                    .wl()
                    .append(rd.entries())
                    .expect("appending to a memory log");
            }
            if let Some(hs) = rd.hs() {
                store.wl().set_hardstate(hs.clone());
            }
        }
        self.in_flight.extend(rd.take_persisted_messages());
        let mut light = self.replicas[i].node.advance(rd);
        if let Some(commit) = light.commit_index() {
            self.replicas[i]
                .node
                .mut_store()
                .wl()
                .mut_hard_state()
                .set_commit(commit);
        }
        self.in_flight.extend(light.take_messages());
        let committed = light.take_committed_entries();
        self.apply(i, committed);
        self.replicas[i].node.advance_apply();
    }

    /// Writes committed entries into replica `i`'s journal; for the leading core, settles the
    /// commits whose last part it proposed in its term.
    fn apply(&mut self, i: usize, entries: Vec<Entry>) {
        for e in entries {
            if e.get_entry_type() != EntryType::EntryNormal || e.data.is_empty() {
                continue;
            }
            let part = entry::decode(&e.data).expect("the simulation's entries decode");
            let outcome =
                self.replicas[i]
                    .store
                    .write_applied(&part.changes, part.next_job, e.index, false);
            if part.last && self.leading == Some((i, e.term)) {
                self.settled.push(Settled {
                    batch: part.batch,
                    outcome,
                    took: Duration::ZERO,
                });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use storm_mm::journal::{Change, NodeRecord};

    use super::*;

    /// With the daemon's Raft settings, a commit costs each follower its entries and its
    /// answer, and nothing more: followers learn that the entry is committed with the next
    /// heartbeat, and apply it then.
    #[test]
    fn a_commit_costs_two_messages_per_follower_and_followers_apply_it_at_the_next_heartbeat() {
        let tick = Duration::from_millis(10);
        let start = Instant::now();
        let mut g = Group::new(3, tick, 10, start).expect("a group of three");
        let (leader, term) = g.ready_leader().expect("replica 0 was elected at once");
        g.lead(leader, term);
        let node = NodeRecord {
            drain: Some("a reason".into()),
            lent: None,
        };
        let before = g.messages_delivered();
        g.propose(&Batch {
            number: 1,
            changes: vec![Change::Node(5, node.clone())],
            next_job: None,
            unneeded: vec![],
        })
        .expect("the leading core proposes");
        g.run_to(start);
        let settled = g.take_settled();
        assert_eq!(settled.len(), 1, "the commit settles without a heartbeat");
        assert_eq!(
            g.messages_delivered() - before,
            4,
            "the entries to each follower and each one's answer"
        );
        let followers: Vec<usize> = (0..3).filter(|&i| i != leader).collect();
        for &f in &followers {
            let held = g.store(f).read().expect("a memory store").nodes;
            assert!(
                !held.contains_key(&5),
                "follower {f} applied before it was told of the commit"
            );
        }
        g.run_to(start + tick);
        for &f in &followers {
            let held = g.store(f).read().expect("a memory store").nodes;
            assert_eq!(held.get(&5), Some(&node), "follower {f} after a heartbeat");
        }
    }
}
