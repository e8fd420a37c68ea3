//! Flocking (docs/federation.md): this cluster's queued jobs that go to a peer cluster, and
//! jobs that peers flock here.
//!
//! **Home side.** After each scheduling decision, a queued job that may flock and has not
//! started goes to the peer that offers the most idle nodes it may use, if one offers room
//! for it: at once for `--flock` and `--clusters`, after `[federation] flock_after_ms` of
//! waiting for the others. The job stays in this MM's table and journal (`Flocked`), out of
//! the scheduling policy; the peer agent fetches the flocked jobs ([`Request::FlockOut`]),
//! passes each to its peer, and reports back what the peer's MM said of it
//! ([`Request::FlockReport`]): its start, output and end go to the job's storm-submit as if
//! it ran here. A job whose peer has not been `up` for `peer_timeout_ms` (or whose agent has
//! not reported for as long) is queued here again and runs from the start; so is a job the
//! peer refused, unless it may run nowhere else.
//!
//! **Peer side.** The agent submits a job flocked here as its owner's local account
//! ([`Request::SubmitFlocked`]); it is an ordinary job of this cluster from then on, run
//! under this cluster's policy. It never flocks again.
//!
//! [`Request::FlockOut`]: storm_cluster::control::Request::FlockOut
//! [`Request::FlockReport`]: storm_cluster::control::Request::FlockReport
//! [`Request::SubmitFlocked`]: storm_cluster::control::Request::SubmitFlocked

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use storm_cluster::control::{JobOutcome, JobRequest, Reply};
use storm_cluster::federation::{PeerInfo, PeerState};
use storm_cluster::flock::{Flock, FlockEvent, FlockOrder, FlockUpdate, InputPiece};
use storm_cluster::messages::JobId;
use storm_primitives::NodeSet;

use super::{ClientId, MachineManager, MmEnv, Phase};
use crate::env::SubmittedProgram;

/// How often the queue is looked at for jobs to flock (and flocked jobs whose peer went
/// away): adverts come every `advertise_ms`, so a decision a timeslice would be wasted work.
const FLOCK_PASS_EVERY: Duration = Duration::from_millis(50);

/// A job of this cluster that a peer runs.
#[derive(Debug, Clone)]
pub(super) struct Flocked {
    pub(super) peer: String,
    /// When it was sent (milliseconds since the Unix epoch).
    pub(super) since_ms: u64,
    /// The peer's id of it, once its MM took it.
    pub(super) remote: Option<JobId>,
    /// Its start on the peer reached its submitter.
    pub(super) started: bool,
    /// Output replies sent to its submitter and maybe not written yet: (reply number,
    /// bytes).
    pub(super) unread: std::collections::VecDeque<(u64, usize)>,
    /// Its submitter's standard input, until the peer agent takes it (at most
    /// `INPUT_WINDOW` bytes).
    pub(super) input: Vec<InputPiece>,
}

/// What this MM knows of its peers for flocking, from its agent's reports.
#[derive(Debug, Default)]
pub(super) struct PeerRoom {
    /// Since when each peer has been away (not `up`, from when it was last heard), without a
    /// break (absent: `up`).
    down_since: BTreeMap<String, Instant>,
    /// Idle nodes and CPUs each `up` peer offered in the last report, less what the jobs
    /// flocked to it since have taken.
    room: BTreeMap<String, (u32, u32)>,
    /// The `up` peers whose last report had a queue of their own: nodes a flocked job frees
    /// there go to that queue first, not back into this cluster's room.
    queued: std::collections::BTreeSet<String>,
    /// When the queue was last looked at for flocking.
    last_pass: Option<Instant>,
    /// Jobs flocked here that no connection follows, since when (see
    /// [`MachineManager::give_up_guests_nobody_follows`]).
    unfollowed_since: BTreeMap<JobId, Instant>,
}

/// In the reason of a job flocked here and given up (its cancel's while it stops, its
/// record's once it ended, kept across restarts): the mark by which the MM knows it again.
const GIVEN_UP: &str = "given up, so that its home can run it again";

impl PeerRoom {
    /// Idle nodes peer `peer` offers this cluster now (0: it is not up, or offers none).
    pub(super) fn offered_nodes(&self, peer: &str) -> u32 {
        self.room.get(peer).map_or(0, |(n, _)| *n)
    }

    /// A job flocked to `peer` ended there: the nodes it held are idle again, and count as
    /// room at once rather than at the peer's next report (up to `advertise_ms` later, a
    /// wait the next queued job would spend idle). Only a job that started there held any,
    /// and only a peer with no queue of its own gives them to this cluster's jobs.
    fn freed_by(&mut self, peer: &str, j: &super::job::Job) {
        if !j.flocked.as_ref().is_some_and(|f| f.started) || self.queued.contains(peer) {
            return;
        }
        if let Some((n, c)) = self.room.get_mut(peer) {
            *n += j.plan.nodes;
            *c += j.plan.ntasks;
        }
    }

    /// How long peer `peer` has been away (not `up`) without a break, as of `now`.
    pub(super) fn away_for(&self, peer: &str, now: Instant) -> Option<Duration> {
        self.down_since
            .get(peer)
            .map(|since| now.saturating_duration_since(*since))
    }
}

impl<E: MmEnv> MachineManager<E> {
    /// The peer agent's report: kept for `storm peers`, and for flocking.
    ///
    /// A peer's room is what it offered, less what the jobs flocked to it and not started
    /// there yet will take: its offer was counted before they reached it (without this, every
    /// report offered the same idle nodes again, more jobs went than the peer could start,
    /// and they waited in its queue while this cluster's nodes freed up). A peer with a queue
    /// of its own has no room.
    pub(super) fn peer_report(&mut self, peers: Vec<PeerInfo>) {
        let now = self.now();
        let mut in_flight: BTreeMap<&str, (u32, u32)> = BTreeMap::new();
        for j in self.jobs.values() {
            if let Some(f) = j.flocked.as_ref().filter(|f| !f.started) {
                let t = in_flight.entry(f.peer.as_str()).or_default();
                t.0 += j.plan.nodes;
                t.1 += j.plan.ntasks;
            }
        }
        let room = &mut self.peer_room;
        room.room.clear();
        room.queued.clear();
        for p in &peers {
            if p.state == PeerState::Up {
                room.down_since.remove(&p.name);
                if p.borrow
                    && let Some(o) = &p.offer
                {
                    let (nodes, cpus) = if o.queued > 0 {
                        room.queued.insert(p.name.clone());
                        (0, 0)
                    } else {
                        let (n, c) = in_flight.get(p.name.as_str()).copied().unwrap_or_default();
                        (
                            o.idle_nodes.saturating_sub(n),
                            o.idle_cpus.saturating_sub(c),
                        )
                    };
                    room.room.insert(p.name.clone(), (nodes, cpus));
                }
            } else {
                // Away since it was last heard (a silent link is `down` only once it has been
                // silent for the timeout), or since now (its agent said its MM is gone).
                let heard = p
                    .heard_ms_ago
                    .and_then(|ms| now.checked_sub(Duration::from_millis(ms)))
                    .unwrap_or(now);
                room.down_since.entry(p.name.clone()).or_insert(heard);
            }
        }
        self.peers = Some((now, peers));
    }

    /// Home side, at most every [`FLOCK_PASS_EVERY`]: queues again at home the jobs whose
    /// peer went away, and flocks the queued jobs that may go to a peer with room. A job
    /// held here (its array's throttle, a dependency) is held from peers too: only a job in
    /// the scheduling policy's queue, or one that may not run here, goes.
    pub(super) fn flock_jobs(&mut self) {
        if self.cfg.peers.is_empty() {
            return;
        }
        let now = self.now();
        if self
            .peer_room
            .last_pass
            .is_some_and(|t| now.saturating_duration_since(t) < FLOCK_PASS_EVERY)
        {
            return;
        }
        self.peer_room.last_pass = Some(now);
        self.take_back_from_gone_peers();
        self.give_up_unfollowed_guests();
        self.give_up_guests_nobody_follows();
        if self.reattach.held.is_some() || self.peer_room.room.is_empty() {
            return;
        }
        // An agent that stopped reporting takes no orders, and the peers' last offers are
        // stale: a job sent now would only come back after the peer timeout. (Three missed
        // reports, or half the timeout: a slow report on a loaded host is no silence.)
        let fed = &self.cfg.federation;
        let stale = (3 * fed.advertise_every()).max(fed.peer_timeout() / 2);
        if self
            .peers
            .as_ref()
            .is_none_or(|(at, _)| now.saturating_duration_since(*at) > stale)
        {
            return;
        }
        let after = self
            .cfg
            .federation
            .flock_after_ms
            .map(Duration::from_millis);
        let home = self.cfg.cluster.name.clone();
        let candidates: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| {
                j.phase == Phase::Queued
                    && (j.admitted || !j.req.flock.may_run_at_home(&home))
                    && self.throttle_wait(j).is_none()
                    && j.flocked.is_none()
                    && j.cancel.is_none()
                    && j.req.step_of.is_none()
                    && j.req.dependency.is_none()
                    && (j.req.flock.at_once()
                        || (j.req.flock == Flock::AfterWait
                            && after
                                .is_some_and(|a| now.saturating_duration_since(j.submitted) >= a)))
            })
            .map(|j| j.id)
            .collect();
        for id in candidates {
            let j = &self.jobs[&id];
            let (nodes, cpus) = (j.plan.nodes, j.plan.ntasks);
            let peer = self
                .peer_room
                .room
                .iter()
                .filter(|(name, (n, c))| {
                    j.req.flock.may_run_on(name)
                        && !j.flock_refused.contains(name)
                        && *n >= nodes
                        && *c >= cpus
                })
                .max_by_key(|(_, (n, _))| *n)
                .map(|(name, _)| name.clone());
            let Some(peer) = peer else {
                continue;
            };
            if let Some((n, c)) = self.peer_room.room.get_mut(&peer) {
                *n -= nodes;
                *c -= cpus;
            }
            self.flock_to(id, peer);
        }
    }

    /// `--clusters`: every name is this cluster or a peer it may use (`borrow`), and a job
    /// that may run only on peers fits one of them: of `nodes` nodes, refused only if every
    /// peer it names has reported its size and none is that large. (A peer not heard from
    /// yet may be: the job waits for it.) Such a job is not sized against this cluster, nor
    /// held to its features and memory: the peer it goes to checks its own.
    pub(super) fn check_clusters(&self, req: &JobRequest, nodes: u32) -> Result<(), String> {
        let Flock::Only(names) = &req.flock else {
            return Ok(());
        };
        let home = &self.cfg.cluster.name;
        let usable: Vec<&str> = std::iter::once(home.as_str())
            .chain(
                self.cfg
                    .peers
                    .iter()
                    .filter(|p| p.borrow)
                    .map(|p| p.name.as_str()),
            )
            .collect();
        if let Some(bad) = names.iter().find(|n| !usable.contains(&n.as_str())) {
            return Err(format!(
                "--clusters: {bad:?} is neither this cluster nor a peer it may run jobs on \
                 (those are: {})",
                usable.join(", ")
            ));
        }
        if req.flock.may_run_at_home(home) {
            return Ok(());
        }
        let reported = self.peers.as_ref().map(|(_, peers)| peers.as_slice());
        let sizes: Vec<(&str, Option<u32>)> = names
            .iter()
            .map(|n| {
                let size = reported
                    .and_then(|ps| ps.iter().find(|p| p.name == *n))
                    .and_then(|p| p.offer.as_ref())
                    .map(|o| o.nodes);
                (n.as_str(), size)
            })
            .collect();
        if sizes.iter().any(|(_, s)| s.is_none_or(|s| s >= nodes)) {
            return Ok(());
        }
        let said: Vec<String> = sizes
            .iter()
            .map(|(n, s)| format!("{n} has {}", s.unwrap_or(0)))
            .collect();
        Err(format!(
            "the job needs {nodes} nodes, and no cluster it may run on has that many ({})",
            said.join(", ")
        ))
    }

    /// Sends queued job `id` to `peer`: out of the policy, journaled as flocked.
    fn flock_to(&mut self, id: JobId, peer: String) {
        let unix_ms = self.unix_ms();
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        if std::mem::take(&mut j.admitted) {
            self.policy.withdraw(id);
        }
        j.flocked = Some(Flocked {
            peer: peer.clone(),
            since_ms: unix_ms,
            remote: None,
            started: false,
            unread: Default::default(),
            input: Vec::new(),
        });
        let client = j.client;
        self.held.remove(&id);
        self.outbox.unrecorded.insert(id);
        tracing::info!(job = id, %peer, "job flocked to a peer cluster");
        if let Some(c) = client {
            self.reply(c, Reply::Flocked { job: id, peer });
        }
    }

    /// Queues flocked job `id` at home again (`why`: what its submitter is told), or ends it
    /// if it may run nowhere else.
    fn take_back(&mut self, id: JobId, why: String) {
        let home = self.cfg.cluster.name.clone();
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        let Some(f) = j.flocked.take() else {
            return;
        };
        let elsewhere = match &j.req.flock {
            Flock::Only(names) => names
                .iter()
                .any(|n| *n == home || (!j.flock_refused.contains(n) && *n != f.peer)),
            _ => true,
        };
        let client = j.client;
        self.outbox.unrecorded.insert(id);
        if !elsewhere {
            self.fail(
                id,
                format!("{why}, and it may run on no other cluster (--clusters)"),
            );
            return;
        }
        tracing::warn!(job = id, peer = %f.peer, "{why}: queued at home again");
        if let Some(c) = client {
            self.reply(
                c,
                Reply::Requeued {
                    job: id,
                    reason: format!("{why}: queued at home again"),
                },
            );
        }
        if self.jobs[&id].req.flock.may_run_at_home(&home) {
            self.admit_job(id);
        }
    }

    /// Jobs flocked to a peer that has not been `up` for `peer_timeout_ms`, or whose agent
    /// has not reported for as long, come back.
    fn take_back_from_gone_peers(&mut self) {
        let now = self.now();
        let timeout = self.cfg.federation.peer_timeout();
        // No report since this MM started: its start is when the silence began.
        let reported = self.peers.as_ref().map_or(self.epoch, |(at, _)| *at);
        let agent_silent = now.saturating_duration_since(reported) >= timeout;
        let gone: Vec<(JobId, String)> =
            self.jobs
                .values()
                .filter_map(|j| {
                    let peer = &j.flocked.as_ref()?.peer;
                    let down = self
                        .peer_room
                        .down_since
                        .get(peer)
                        .is_some_and(|since| now.saturating_duration_since(*since) >= timeout);
                    (agent_silent || down).then(|| {
                    let why = if agent_silent {
                        format!(
                            "this cluster's peer agent has not reported for {} ms, so nothing is \
                             heard of the job on peer {peer}",
                            timeout.as_millis()
                        )
                    } else {
                        format!("peer cluster {peer} has been down for {} ms", timeout.as_millis())
                    };
                    (j.id, why)
                })
                })
                .collect();
        for (id, why) in gone {
            self.take_back(id, why);
        }
    }

    /// Peer side: the jobs flocked here are cancelled once this cluster's peer agent, which
    /// follows them for their home, has not reported for half `peer_timeout_ms`. Their home
    /// hears nothing of them from then on, and queues them again after the whole timeout:
    /// the copy here is gone (given its kill grace) before the one at home starts, so a dead
    /// or frozen agent does not make a job run twice.
    fn give_up_unfollowed_guests(&mut self) {
        let now = self.now();
        let limit = self.cfg.federation.peer_timeout() / 2;
        // No report since this MM started: its start is when the silence began.
        let reported = self.peers.as_ref().map_or(self.epoch, |(at, _)| *at);
        if now.saturating_duration_since(reported) < limit {
            return;
        }
        let guests: Vec<(JobId, String)> = self
            .jobs
            .values()
            .filter(|j| j.cancel.is_none() && j.req.step_of.is_none())
            .filter_map(|j| Some((j.id, j.req.flock.flocked_from()?.to_string())))
            .collect();
        for (id, home) in guests {
            self.cancel(
                id,
                format!(
                    "this cluster's peer agent, which follows the job for its home cluster \
                     {home}, has not reported for {} ms: {GIVEN_UP}",
                    limit.as_millis()
                ),
            );
        }
    }

    /// Peer side: a job flocked here that no connection has followed for `peer_timeout_ms` is
    /// cancelled. The agent's follower of it is gone for good: the agent withdrew the job
    /// while this MM was down (its cancel could not reach the MM), or a restarted agent's
    /// home no longer lists it. Nobody else would end it, and its home has queued it again
    /// or ended it (a live follower comes back within a second or two of this MM's restart,
    /// its submission recognised by its token).
    fn give_up_guests_nobody_follows(&mut self) {
        let now = self.now();
        let limit = self.cfg.federation.peer_timeout();
        let mut unfollowed = BTreeMap::new();
        for j in self.jobs.values() {
            if j.client.is_some() || j.cancel.is_some() || j.req.step_of.is_some() {
                continue;
            }
            let Some(home) = j.req.flock.flocked_from() else {
                continue;
            };
            let since = self
                .peer_room
                .unfollowed_since
                .get(&j.id)
                .copied()
                .unwrap_or(now);
            unfollowed.insert(j.id, (since, home.to_string()));
        }
        self.peer_room.unfollowed_since = unfollowed.iter().map(|(&id, (t, _))| (id, *t)).collect();
        for (id, (since, home)) in unfollowed {
            if now.saturating_duration_since(since) >= limit {
                self.cancel(
                    id,
                    format!(
                        "this cluster's peer agent has not followed the job for its home \
                         cluster {home} for {} ms: {GIVEN_UP}",
                        limit.as_millis()
                    ),
                );
            }
        }
    }

    /// Why job `id`, flocked here, was given up (its agent fell silent), if it was: its
    /// reason says so, while it stops (its cancel) or once it ended (its record in the
    /// history, kept across restarts; a queued job's has " before it started" added).
    pub(super) fn given_up_reason(&self, id: JobId) -> Option<String> {
        let reason = match self.jobs.get(&id) {
            Some(j) => j.cancel.as_ref().map(|c| c.reason.as_str()),
            None => match self.finished.get(&id).map(|r| &r.state) {
                Some(crate::journal::JobState::Finished { outcome, .. }) => {
                    outcome.reason.as_deref()
                }
                _ => None,
            },
        };
        reason.is_some_and(|r| r.contains(GIVEN_UP)).then(|| {
            format!(
                "this cluster gave up job {id} while its peer agent was silent or did not \
                 follow it; it runs at its home again"
            )
        })
    }

    /// The flocked jobs, for the peer agent (`Request::FlockOut`), each with the standard
    /// input that came since the agent last asked: the agent takes it (the agent is the one
    /// client that asks).
    pub(super) fn flock_orders(&mut self) -> Vec<FlockOrder> {
        self.jobs
            .values_mut()
            .filter_map(|j| {
                let f = j.flocked.as_mut()?;
                Some(FlockOrder {
                    job: j.id,
                    peer: f.peer.clone(),
                    since_ms: f.since_ms,
                    uid: j.uid,
                    req: j.req.clone(),
                    input: std::mem::take(&mut f.input),
                })
            })
            .collect()
    }

    /// What the peers said of this cluster's flocked jobs (`Request::FlockReport`): how many
    /// events of each update were taken. Events of a job no longer flocked to that peer are
    /// old news, taken and dropped. Output stops being taken while the job's submitter has
    /// more than `[limits] max_unread_reply_bytes` of it unread: the peer sends it again.
    pub(super) fn flock_report(&mut self, updates: Vec<FlockUpdate>) -> Vec<usize> {
        let mut taken = Vec::with_capacity(updates.len());
        for u in updates {
            let total = u.events.len();
            let mut n = 0;
            for event in u.events {
                let current = self
                    .jobs
                    .get(&u.job)
                    .and_then(|j| j.flocked.as_ref())
                    .is_some_and(|f| f.peer == u.peer);
                if !current {
                    n = total;
                    break;
                }
                if matches!(event, FlockEvent::Output(_)) && self.output_backlog(u.job) {
                    break;
                }
                self.flock_event(u.job, &u.peer, event);
                n += 1;
            }
            taken.push(n);
        }
        taken
    }

    /// Whether flocked job `id`'s submitter has more of its output unread than it may.
    fn output_backlog(&mut self, id: JobId) -> bool {
        let Some(client) = self.jobs.get(&id).and_then(|j| j.client) else {
            return false;
        };
        let written = self.env.replies_written(client);
        let limit = self.cfg.limits.max_unread_reply_bytes as usize;
        let Some(f) = self.jobs.get_mut(&id).and_then(|j| j.flocked.as_mut()) else {
            return false;
        };
        while f.unread.front().is_some_and(|(n, _)| *n <= written) {
            f.unread.pop_front();
        }
        f.unread.iter().map(|(_, b)| b).sum::<usize>() > limit
    }

    fn flock_event(&mut self, id: JobId, peer: &str, event: FlockEvent) {
        let unix_ms = self.unix_ms();
        let Some(j) = self.jobs.get_mut(&id) else {
            return;
        };
        let client = j.client;
        let f = j.flocked.as_mut().expect("checked by the caller");
        match event {
            FlockEvent::Accepted { remote } => {
                if f.remote != Some(remote) {
                    tracing::info!(job = id, %peer, remote, "the peer took the flocked job");
                    f.remote = Some(remote);
                }
            }
            FlockEvent::Started { ntasks, node_names } => {
                if f.started {
                    return;
                }
                f.started = true;
                j.launched_ms = Some(unix_ms);
                if let Some(c) = client {
                    let node_names = node_names.iter().map(|n| format!("{peer}:{n}")).collect();
                    self.reply(
                        c,
                        Reply::Started {
                            job: id,
                            ntasks,
                            nodes: NodeSet::new(),
                            node_names,
                            time_slot: None,
                        },
                    );
                }
            }
            FlockEvent::Output(mut chunk) => {
                if let Some(c) = client {
                    chunk.job = id;
                    let bytes = chunk.data.len();
                    if let Some(n) = self.reply(c, Reply::Output(chunk))
                        && let Some(f) = self.jobs.get_mut(&id).and_then(|j| j.flocked.as_mut())
                    {
                        f.unread.push_back((n, bytes));
                    }
                }
            }
            FlockEvent::Requeued { reason } => {
                f.started = false;
                // Its next run reads an empty input (as a job requeued at home does).
                f.input.clear();
                j.launched_ms = None;
                if let Some(c) = client {
                    self.reply(
                        c,
                        Reply::Requeued {
                            job: id,
                            reason: format!("on peer cluster {peer}: {reason}"),
                        },
                    );
                }
            }
            FlockEvent::Finished(outcome) => self.finish_flocked(id, peer, outcome),
            FlockEvent::NotHere => {
                self.take_back(
                    id,
                    format!(
                        "peer cluster {peer} no longer holds the job (it gave it up while this \
                         cluster was away)"
                    ),
                );
            }
            FlockEvent::Refused(why) => {
                j.flock_refused.push(peer.to_string());
                self.take_back(id, format!("peer cluster {peer} refused the job: {why}"));
            }
        }
    }

    /// Ends flocked job `id` as peer `peer` says it ended there.
    fn finish_flocked(&mut self, id: JobId, peer: &str, mut outcome: JobOutcome) {
        let Some(mut j) = self.remove_job(id) else {
            return;
        };
        self.queue_changed = true;
        if let Some(p) = j.program.take() {
            self.let_go_of_program(p);
        }
        outcome.job = id;
        // Its wait here counts as queued time.
        let total_us = self
            .now()
            .saturating_duration_since(j.submitted)
            .as_micros() as u64;
        let t = &mut outcome.timing;
        t.queued_us += total_us.saturating_sub(t.total_us);
        t.total_us = total_us.max(t.total_us);
        if let Some(r) = &mut outcome.reason {
            *r = format!("on peer cluster {peer}: {r}");
        }
        tracing::info!(job = id, %peer, code = outcome.exit_code(), "flocked job ended on its peer");
        self.peer_room.freed_by(peer, &j);
        // It held no nodes here: its record names none.
        self.record_end(j, outcome);
    }

    /// Peer side: a job flocked here from `origin`, for local user `uid`/`gid`, submitted by
    /// this cluster's peer agent (an operator's connection, checked by the caller).
    pub(super) fn submit_flocked(
        &mut self,
        client: ClientId,
        origin: &str,
        (uid, gid): (u32, u32),
        mut req: JobRequest,
        program: Option<Result<SubmittedProgram, String>>,
    ) -> Result<JobId, String> {
        if uid == 0 || uid == self.env.operator_uid() {
            return Err(format!(
                "a job flocked from {origin} may not run as root or the MM's own user"
            ));
        }
        if !self.cfg.peers.iter().any(|p| p.name == origin && p.lend) {
            return Err(format!("this cluster does not lend to {origin}"));
        }
        // It runs here or nowhere; its program is at its path here (the agent holds no
        // descriptor of a user's file); it belongs to no array or allocation of this cluster.
        // Its submitter's standard input comes through the agent, as the submitter's does
        // (its `input` is kept).
        req.flock = Flock::From(origin.to_string());
        // This cluster's own nodes: a node lent here is not its to pass on.
        req.borrow = false;
        req.delivery = storm_cluster::control::Delivery::InPlace;
        req.step_of = None;
        req.array = None;
        req.element = None;
        req.dependency = None;
        self.submit_as(client, (uid, gid), req, program)
    }
}
