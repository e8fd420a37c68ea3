//! The heartbeat (paper Algorithm 4): every timeslice the MM issues one XFER-AND-SIGNAL to
//! every member with the commands due (among them the launches the journal released) and,
//! under gang scheduling, the strobe, and takes its outcome (a failure is `failure`'s). A
//! heartbeat with nothing new to say waits for the quiet period (see `quiet`).

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use bytes::Bytes;
use storm_cluster::messages::{Command, Heartbeat, JobId, LaunchSpec, encode, launch_commands};
use storm_cluster::{ClusterConfig, RmLayout};
use storm_primitives::helpers::{QueueProducer, epoch_base};
use storm_primitives::{NodeSet, PrimError, Wait};

use crate::env::MmEnv;
use crate::log_limit::LogLimit;

use super::{MachineManager, Phase, SEAL_ROOM};

/// What the heartbeat (Algorithm 4) keeps from one timeslice to the next.
pub(super) struct HeartbeatSender {
    /// Producer of the heartbeat queue; its node set is the members (the UP nodes).
    pub(super) queue: QueueProducer,
    /// Sequence number of the next new heartbeat.
    pub(super) seq: u64,
    pub(super) in_flight: Option<InFlight>,
    /// A heartbeat whose transfer failed, to send again before any new one.
    pub(super) resend: Option<Bytes>,
    /// Every heartbeat before this sequence number reached every member.
    pub(super) delivered: u64,
    /// When the next receipt check (COMPARE-AND-WRITE on the heartbeat counters) is due, and
    /// what it checks: that every member took every heartbeat before `check_target`.
    pub(super) next_check: Instant,
    pub(super) check_target: u64,
    /// Members admitted since the last receipt check, which that check's target predates:
    /// until its NM takes `Start` (a moment after the MM admits it), a new member's counter
    /// still holds its last process's value (zero, for a fresh NM), so the next check passes
    /// them over; the one after judges them.
    pub(super) joined_since_check: NodeSet,
    /// Commands waiting for a heartbeat, in order.
    pub(super) commands: VecDeque<Command>,
    /// Heartbeat failures recur every timeslice while a node is unreachable: log them at most
    /// once a second.
    pub(super) errors: LogLimit,
    /// What the last heartbeat issued told the members, to skip one that would tell them
    /// nothing new (see [`Quiet`]).
    pub(super) last: Option<Quiet>,
    /// How often a heartbeat that tells the members nothing new goes all the same: the
    /// quiet period in whole timeslices (at least one).
    pub(super) quiet_stretch: Duration,
    /// Since when most members have looked unresponsive at once (see
    /// [`super::MachineManager::hand_over_due`]).
    pub(super) cut_since: Option<Instant>,
}

/// What the last heartbeat issued said and to whom. The next one may be skipped while it
/// would carry no command and the same strobe to the same members, until the quiet period has
/// passed since this one: an idle cluster is not woken every timeslice. Failure detection is
/// not slowed past what its own bounds allow ([`ClusterConfig::quiet_heartbeat_period`]).
pub(super) struct Quiet {
    /// The timeslice it went in.
    pub(super) tick: Instant,
    pub(super) members: NodeSet,
    /// The strobe it carried (under gang scheduling).
    pub(super) strobe: Option<Command>,
}

impl HeartbeatSender {
    pub(super) fn new(cfg: &ClusterConfig, rm: &RmLayout, now: Instant) -> Self {
        Self {
            // No member yet: nodes join as their NMs register. AWAIT-SPACE waits at most a
            // timeslice, so a node that stops taking heartbeats never stalls the others (the
            // receipt check finds it). A heartbeat applies at each node as it arrives (one
            // round trip, not two): a failed one goes again, and nodes that took it skip it.
            queue: QueueProducer::new(rm.heartbeat, NodeSet::new(), 1)
                .applied_on_arrival()
                .with_space_timeout(cfg.timeslice().max(Duration::from_millis(1)))
                .with_op_timeout(cfg.heartbeat_deadline()),
            seq: 0,
            in_flight: None,
            resend: None,
            delivered: epoch_base(1),
            next_check: now,
            check_target: epoch_base(1),
            joined_since_check: NodeSet::new(),
            commands: VecDeque::new(),
            errors: LogLimit::new(Duration::from_secs(1)),
            last: None,
            quiet_stretch: whole_timeslices(cfg.quiet_heartbeat_period(), cfg.timeslice()),
            cut_since: None,
        }
    }

    /// When the timeslice is due that sends a heartbeat after `last` even if it has nothing
    /// new to say: whole timeslices after the one `last` went in.
    pub(super) fn next_quiet(&self, last: &Quiet) -> Instant {
        last.tick + self.quiet_stretch
    }
}

/// `period` rounded down to whole timeslices of `slice`, at least one.
fn whole_timeslices(period: Duration, slice: Duration) -> Duration {
    let n = (period.as_nanos() / slice.as_nanos().max(1)).clamp(1, u32::MAX as u128);
    slice * n as u32
}

/// The heartbeat whose transfer has not completed yet.
pub(super) struct InFlight {
    /// The heartbeat as sent, sent again as it is if it fails.
    pub(super) bytes: Bytes,
    pub(super) issued: Instant,
}

impl<E: MmEnv> MachineManager<E> {
    /// Issues this timeslice's heartbeat to the members, once the previous one has completed.
    /// One heartbeat is in flight at a time, so a failed one can be sent again, byte for byte
    /// under the same sequence number, with nothing after it to overtake it.
    pub(super) fn issue_heartbeat(&mut self) {
        if !self.heartbeat_completed() {
            return;
        }
        if self.hb.queue.dest().is_empty() {
            return;
        }
        let strobe = self.strobe();
        if self.hb.resend.is_none() && self.heartbeat_says_nothing_new(&strobe) {
            return;
        }
        let (bytes, fresh) = match self.hb.resend.take() {
            Some(bytes) => (bytes, None),
            None => match self.next_heartbeat() {
                Some((bytes, taken)) => (bytes, Some(taken)),
                None => return,
            },
        };
        match self
            .hb
            .queue
            .enqueue(&*self.prims, &bytes, Some(self.rm.hb_sent))
        {
            Ok(()) => {
                let now = self.now();
                self.hb.last = Some(Quiet {
                    tick: self.last_tick,
                    members: self.hb.queue.dest().clone(),
                    strobe,
                });
                if let Some(taken) = fresh {
                    self.hb.seq += 1;
                    let mut unneeded = Vec::new();
                    for cmd in self.hb.commands.drain(..taken) {
                        // A launch in pieces has gone out with its last piece.
                        let launched = match cmd {
                            Command::Launch(spec) => Some(spec.job),
                            Command::LaunchPiece {
                                job, index, count, ..
                            } if index + 1 == count => Some(job),
                            _ => None,
                        };
                        if let Some(job) = launched
                            && let Some(j) = self.jobs.get_mut(&job)
                            && j.phase == Phase::Launching
                        {
                            // Its record (with the time its launch was readied) was
                            // written before this heartbeat: a restarted MM re-adopts it.
                            j.launched = Some(now);
                            j.phase = Phase::Running;
                            // A job that is never placed again needs its program no more.
                            if !j.req.requeue
                                && let Some(p) = j.program.take()
                            {
                                unneeded.push(p);
                            }
                        }
                    }
                    for p in unneeded {
                        self.let_go_of_program(p);
                    }
                }
                self.hb.in_flight = Some(InFlight { bytes, issued: now });
            }
            Err(e) => {
                // AWAIT-SPACE found no room in time (a node that just joined, or one that no
                // longer takes heartbeats, which the receipt check finds), or could not ask a
                // node: one that did not answer by the heartbeat's deadline (or whose
                // connection failed) misses this heartbeat, as if the transfer had failed.
                if fresh.is_none() {
                    self.hb.resend = Some(bytes);
                }
                if let Some(more) = self.hb.errors.allow(self.now()) {
                    tracing::warn!(suppressed = more, "cannot issue the heartbeat yet: {e}");
                }
                if !matches!(e, PrimError::QueueFull { .. }) {
                    self.blame(&e);
                }
            }
        }
    }

    /// The next heartbeat: as many queued commands as fit and, under gang scheduling, the
    /// schedule of this timeslice (the strobe). Also returns how many commands it carries.
    pub(super) fn next_heartbeat(&self) -> Option<(Bytes, usize)> {
        let limit = self.cfg.cluster.heartbeat_bytes;
        let mut hb = Heartbeat {
            seq: self.hb.seq,
            commands: Vec::new(),
            seal: None,
        };
        // Room for the seal, which covers the commands chosen.
        let room = limit.saturating_sub(SEAL_ROOM);
        let mut taken = 0;
        for cmd in &self.hb.commands {
            hb.commands.push(cmd.clone());
            if encode("heartbeat", &hb, room).is_err() {
                hb.commands.pop();
                break;
            }
            taken += 1;
        }
        hb.commands.extend(self.strobe());
        hb.seal = self.signer.seal_commands(
            self.reattach.incarnation,
            hb.seq,
            &hb.commands,
            self.unix_ms(),
        );
        match encode("heartbeat", &hb, limit) {
            Ok(b) => Some((Bytes::from(b), taken)),
            Err(e) => {
                tracing::error!("cannot encode a heartbeat: {e}");
                None
            }
        }
    }

    /// Under gang scheduling, the schedule of this timeslice (the strobe).
    fn strobe(&self) -> Option<Command> {
        self.gang.then(|| {
            let lease = self.cfg.slot_lease().filter(|_| self.run_rotates);
            Command::Schedule {
                run: self.run_set.clone(),
                lease_us: lease.map_or(0, |l| l.as_micros().clamp(1, u32::MAX as u128) as u32),
            }
        })
    }

    /// Whether this timeslice's heartbeat may be skipped: it would carry no command and the
    /// strobe the same members took last (one without a lease: a leased slot stops on a node
    /// whose next heartbeat is late), and the quiet period has not passed since.
    fn heartbeat_says_nothing_new(&self, strobe: &Option<Command>) -> bool {
        let Some(last) = &self.hb.last else {
            return false;
        };
        let leased = matches!(strobe, Some(Command::Schedule { lease_us, .. }) if *lease_us > 0);
        self.hb.commands.is_empty()
            && !leased
            && last.strobe == *strobe
            && last.members == *self.hb.queue.dest()
            && self.last_tick < self.hb.next_quiet(last)
    }

    /// Takes the outcome of the heartbeat in flight, if it has one; true when none is in
    /// flight any more.
    pub(super) fn heartbeat_completed(&mut self) -> bool {
        let now = self.now();
        let Some(flight) = &self.hb.in_flight else {
            return true;
        };
        match self.prims.test_event(self.rm.hb_sent, Wait::Poll) {
            Ok(false) => false,
            Ok(true) => {
                let issued = flight.issued;
                self.metrics
                    .heartbeat_delivered(now.saturating_duration_since(issued));
                self.hb.in_flight = None;
                self.hb.delivered = self.hb.queue.next_seq();
                self.nodes.heard_all(issued);
                true
            }
            Err(e) => {
                let flight = self.hb.in_flight.take().expect("in flight");
                self.heartbeat_failed(e, flight.bytes);
                true
            }
        }
    }
}

impl<E: MmEnv> MachineManager<E> {
    /// Queues the launch of every job whose start the journal now holds.
    pub(super) fn release_launches(&mut self) {
        let now = self.now();
        let settled = self.outbox.journal.settled();
        let mut ready: Vec<JobId> = self
            .jobs
            .values()
            .filter(|j| j.phase.may_launch(settled))
            .map(|j| j.id)
            .collect();
        // In the order they became ready to launch.
        ready.sort_by_key(|id| self.jobs[id].ready);
        for id in ready {
            // `after:ID` waits for this.
            self.queue_changed = true;
            let j = self.jobs.get_mut(&id).expect("listed");
            j.phase = Phase::Launching;
            j.recorded = Some(now);
            let spec = j.launch_spec(self.cfg.capacity().cpus_per_node);
            self.launch_in_heartbeats(spec);
            self.release_held_input(id);
        }
    }

    /// Queues a job's launch for the heartbeats: whole, or in pieces when it is too large
    /// for one (its arguments and environment approach `ARG_MAX`).
    pub(super) fn launch_in_heartbeats(&mut self, spec: LaunchSpec) {
        let job = spec.job;
        match launch_commands(spec, self.cfg.cluster.heartbeat_bytes) {
            Ok(cmds) => self.hb.commands.extend(cmds),
            // Submission checked the size: not reached.
            Err(e) => tracing::error!(job, "cannot encode the launch: {e}"),
        }
    }
}
