//! The NM's side of membership: registering with the MM, joining the heartbeat, and noticing
//! when the MM no longer counts this node as a member.
//!
//! The NM writes its inventory (the jobs it holds) and then its stamp (pid and generation)
//! into the MM's memory. The MM answers `Welcome` with the jobs the node keeps: the NM drops
//! the others, discards stale heartbeat signals, and acknowledges. `Start` tells it the
//! sequence number of its first heartbeat. An NM that hears no heartbeat for
//! `rejoin_after_ms`, or that the MM tells it was evicted (it missed a heartbeat's deadline,
//! was marked DOWN, or the MM restarted), registers again with a new stamp; so does one whose
//! output could not be delivered ([`Registration::rejoin`]). Registering again loses nothing:
//! the MM lets the node keep every job it still knows there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use storm_cluster::RmLayout;
use storm_cluster::clock::{Clock, SystemClock};
use storm_cluster::identity::MmVerifier;
use storm_cluster::messages::{
    HeldJob, Inventory, JobId, Membership, SealedMembership, decode_sealed, encode_sealed,
};
use storm_primitives::helpers::QueueConsumer;
use storm_primitives::log_limit::LogLimit;
use storm_primitives::{NodeId, NodeSet, PrimError, Primitives, Wait};

/// How often an unanswered registration is sent again.
const REGISTER_RETRY: Duration = Duration::from_millis(500);

enum Standing {
    /// Registered (or about to) with `stamp`; waiting for the welcome.
    Registering { stamp: u64, sent: Option<Instant> },
    /// Welcomed and acknowledged; waiting for the first heartbeat's sequence number.
    Welcomed { stamp: u64, since: Instant },
    /// A member: takes every heartbeat.
    Member {
        stamp: u64,
        heartbeats: QueueConsumer,
        last_heard: Instant,
    },
}

/// What the manager must do next.
pub enum Event {
    /// A heartbeat to carry out.
    Heartbeat(Bytes),
    /// A new membership begins: keep only the jobs of `keep`, and send output at this epoch
    /// of the output queue. `incarnation` names the MM process. The welcome is acknowledged
    /// through [`Registration::acknowledge`] once that is done.
    Welcomed {
        output_epoch: u32,
        incarnation: u64,
        keep: Vec<JobId>,
    },
    /// Nothing arrived in time.
    Idle,
}

/// When this NM process started (Unix time, milliseconds), for the inventory.
static PROCESS_STARTED_MS: std::sync::LazyLock<u64> =
    std::sync::LazyLock::new(storm_cluster::daemon::unix_ms);

/// Who registers, and the clock it reads: the NM process (its pid, its start time, the system
/// clock), or a simulated one.
#[derive(Clone)]
pub struct Identity {
    pub clock: Arc<dyn Clock>,
    /// Goes into every stamp; with `started_ms` it names this NM process to the MM, and
    /// another process means the node lost its processes.
    pub pid: u32,
    /// When the NM started (Unix time, milliseconds, by this node's clock), for the
    /// inventory: the MM only ever compares it with itself.
    pub started_ms: u64,
    /// The node's memory (bytes), as detected, for the inventory.
    pub mem: u64,
    /// The MM's public key: membership messages and commands count only with its seal.
    pub mm: MmVerifier,
    /// A guest NM's lease: its lender's grant, shown in every registration (the borrower
    /// admits no guest slot without one).
    pub lease: Option<storm_cluster::identity::LeaseGrant>,
}

impl Identity {
    /// This NM process on a node of `mem` bytes, taking orders from the MM whose seals `mm`
    /// checks.
    pub fn this_process(mm: MmVerifier, mem: u64) -> Self {
        Self {
            clock: Arc::new(SystemClock),
            pid: std::process::id(),
            started_ms: *PROCESS_STARTED_MS,
            mem,
            mm,
            lease: None,
        }
    }
}

pub struct Registration {
    prims: Arc<dyn Primitives>,
    rm: RmLayout,
    node: NodeId,
    mm: NodeId,
    rejoin_after: Duration,
    identity: Identity,
    generation: u32,
    standing: Standing,
    /// Membership messages refused for their seal, logged at most 20 times every 10 s.
    refused: LogLimit,
    /// The latest Raft term of an MM that welcomed this node (0: a single MM). A replicated
    /// MM deposed since (its term is older) is fenced: its welcome is refused.
    term: u64,
}

impl Registration {
    pub fn new(
        prims: Arc<dyn Primitives>,
        rm: RmLayout,
        node: NodeId,
        mm: NodeId,
        rejoin_after: Duration,
        identity: Identity,
    ) -> Self {
        // Counted on from the start time's low bits, so that an NM restarted with the pid it
        // had (in a container, say) does not repeat its predecessor's first stamp, which the
        // MM would take for a registration it already acted on.
        let generation = identity.started_ms as u32;
        let mut m = Self {
            prims,
            rm,
            node,
            mm,
            rejoin_after,
            identity,
            generation,
            standing: Standing::Registering {
                stamp: 0,
                sent: None,
            },
            refused: LogLimit::with_burst(Duration::from_secs(10), 20),
            term: 0,
        };
        m.standing = Standing::Registering {
            stamp: m.next_stamp(),
            sent: None,
        };
        m
    }

    /// Checks membership messages with `mm` from now on.
    pub fn set_mm_keys(&mut self, mm: MmVerifier) {
        self.identity.mm = mm;
    }

    /// A stamp no earlier registration of this node used: the pid and a generation.
    fn next_stamp(&mut self) -> u64 {
        self.generation = self.generation.wrapping_add(1);
        (self.identity.pid as u64) << 32 | self.generation as u64
    }

    /// Waits up to `wait` for the next thing to do. `held` lists the jobs this node holds (sent
    /// with each registration).
    pub fn next(
        &mut self,
        wait: Duration,
        held: &dyn Fn() -> Vec<HeldJob>,
    ) -> Result<Event, PrimError> {
        // Completions of registrations and acknowledgements: failures are retried anyway.
        let now = self.identity.clock.now();
        while let Ok(true) = self.prims.test_event(self.rm.register_sent, Wait::Poll) {}
        if self.prims.test_event(self.rm.joined, Wait::Poll)? {
            return Ok(self.on_message());
        }
        match &mut self.standing {
            Standing::Registering { stamp, sent } => {
                if sent.is_none_or(|t| now.saturating_duration_since(t) >= REGISTER_RETRY) {
                    *sent = Some(now);
                    let stamp = *stamp;
                    self.send_inventory(stamp, held());
                    let at = self.rm.registry.at(self.node as usize).offset();
                    self.send_to_mm(at, stamp);
                }
                self.wait_message(wait)
            }
            Standing::Welcomed { since, .. } => {
                if now.saturating_duration_since(*since) > self.rejoin_after {
                    tracing::warn!(
                        node = self.node,
                        "welcomed but never started; registering again"
                    );
                    self.register_again();
                    return Ok(Event::Idle);
                }
                self.wait_message(wait)
            }
            Standing::Member {
                heartbeats,
                last_heard,
                ..
            } => match heartbeats.dequeue(&*self.prims, Wait::Timeout(wait))? {
                Some(bytes) => {
                    *last_heard = now;
                    Ok(Event::Heartbeat(bytes))
                }
                None if now.saturating_duration_since(*last_heard) > self.rejoin_after => {
                    tracing::warn!(
                        node = self.node,
                        "no heartbeat for {:?}; registering with the MM again",
                        now.saturating_duration_since(*last_heard)
                    );
                    self.register_again();
                    Ok(Event::Idle)
                }
                None => Ok(Event::Idle),
            },
        }
    }

    fn wait_message(&mut self, wait: Duration) -> Result<Event, PrimError> {
        if self.prims.test_event(self.rm.joined, Wait::Timeout(wait))? {
            Ok(self.on_message())
        } else {
            Ok(Event::Idle)
        }
    }

    fn stamp(&self) -> u64 {
        match self.standing {
            Standing::Registering { stamp, .. }
            | Standing::Welcomed { stamp, .. }
            | Standing::Member { stamp, .. } => stamp,
        }
    }

    fn register_again(&mut self) {
        self.standing = Standing::Registering {
            stamp: self.next_stamp(),
            sent: None,
        };
    }

    /// Whether this node is registering with the MM (and not yet welcomed).
    pub fn registering(&self) -> bool {
        matches!(self.standing, Standing::Registering { .. })
    }

    /// Registers again (unless a registration is under way already): the MM then starts a new
    /// membership, which keeps this node's jobs and starts a new output queue epoch.
    pub fn rejoin(&mut self, why: &str) {
        if !matches!(self.standing, Standing::Registering { .. }) {
            tracing::warn!(node = self.node, "registering with the MM again: {why}");
            self.register_again();
        }
    }

    /// Handles the membership message in the join area. Messages for another stamp are
    /// left over from an earlier registration and ignored.
    fn on_message(&mut self) -> Event {
        let bytes = match self
            .prims
            .memory()
            .read_vec(self.rm.join.offset, self.rm.membership_bytes)
        {
            Ok(b) => b,
            Err(e) => {
                tracing::error!(node = self.node, "cannot read the join area: {e}");
                return Event::Idle;
            }
        };
        let sealed: SealedMembership =
            match decode_sealed("membership", &bytes, self.rm.membership_bytes) {
                Ok(m) => m,
                Err(e) => {
                    tracing::error!(node = self.node, "ignoring a membership message: {e}");
                    return Event::Idle;
                }
            };
        let now_ms = self.identity.clock.unix_ms();
        if let Err(e) =
            self.identity
                .mm
                .check_membership(self.node, &sealed.msg, &sealed.seal, now_ms)
        {
            if let Some(more) = self.refused.allow(self.identity.clock.now()) {
                tracing::error!(
                    node = self.node,
                    suppressed = more,
                    "refusing a membership message: {e}"
                );
            }
            return Event::Idle;
        }
        let msg = sealed.msg;
        let mine = self.stamp();
        match msg {
            Membership::Welcome { incarnation, .. }
                if storm_cluster::messages::incarnation_term(incarnation) < self.term =>
            {
                if let Some(more) = self.refused.allow(self.identity.clock.now()) {
                    tracing::error!(
                        node = self.node,
                        term = storm_cluster::messages::incarnation_term(incarnation),
                        current = self.term,
                        suppressed = more,
                        "refusing the welcome of a deposed MM (an older term's leader)"
                    );
                }
                Event::Idle
            }
            Membership::Welcome {
                stamp,
                output_epoch,
                incarnation,
                keep,
            } if stamp == mine => {
                self.term = storm_cluster::messages::incarnation_term(incarnation);
                let ack_at = self.rm.join_ack.at(self.node as usize).offset();
                match self.standing {
                    Standing::Registering { .. } => {
                        // Nothing is sent to a node between its eviction and its start: every
                        // heartbeat signal pending now is stale.
                        QueueConsumer::discard_signals(&*self.prims, self.rm.heartbeat);
                        self.standing = Standing::Welcomed {
                            stamp,
                            since: self.identity.clock.now(),
                        };
                        // The acknowledgement goes once the manager has taken up the new
                        // membership ([`Registration::acknowledge`]): the MM counts on what
                        // that changes (the termination flags) from then on.
                        tracing::info!(node = self.node, kept = ?keep, "welcomed by the MM");
                        Event::Welcomed {
                            output_epoch,
                            incarnation,
                            keep,
                        }
                    }
                    Standing::Welcomed { .. } => {
                        // Our acknowledgement was lost: send it again.
                        self.send_to_mm(ack_at, stamp);
                        Event::Idle
                    }
                    Standing::Member { .. } => Event::Idle,
                }
            }
            Membership::Start { stamp, seq } if stamp == mine => {
                if let Standing::Welcomed { .. } = self.standing {
                    let heartbeats = QueueConsumer::join(&*self.prims, self.rm.heartbeat, 1, seq);
                    self.standing = Standing::Member {
                        stamp,
                        heartbeats,
                        last_heard: self.identity.clock.now(),
                    };
                    tracing::info!(node = self.node, seq, "joined the heartbeat");
                }
                Event::Idle
            }
            Membership::Evicted { stamp } if stamp == mine || stamp == 0 => {
                match &mut self.standing {
                    // The MM does not know this node yet (it restarted): send the
                    // registration again at once.
                    Standing::Registering { sent, .. } if stamp == 0 => *sent = None,
                    // The MM took this registration and then gave up on it (the node went
                    // DOWN before its welcome got through). It acts only on a stamp it has not
                    // seen, so the same one sent again would be ignored for ever: register
                    // with a new one.
                    Standing::Registering { .. } => {
                        tracing::warn!(
                            node = self.node,
                            "the MM dropped this node's registration; registering again"
                        );
                        self.register_again();
                    }
                    _ => {
                        tracing::warn!(
                            node = self.node,
                            "the MM no longer counts this node as a member; registering again"
                        );
                        self.register_again();
                    }
                }
                Event::Idle
            }
            _ => Event::Idle,
        }
    }

    /// Writes the inventory of registration `stamp` into this node's inventory area at the
    /// MM (before the stamp, which the MM acts on). Jobs that do not fit are left out, ended
    /// ones first; the MM then ends them.
    fn send_inventory(&self, stamp: u64, mut jobs: Vec<HeldJob>) {
        jobs.sort_by_key(|h| (h.ended, h.job));
        let bytes = loop {
            let inventory = Inventory {
                stamp,
                since_ms: self.identity.started_ms,
                jobs: jobs.clone(),
                mem: self.identity.mem,
                lease: self.identity.lease.clone(),
            };
            match encode_sealed("inventory", &inventory, self.rm.inventory_bytes) {
                Ok(b) => break b,
                Err(e) if !jobs.is_empty() => {
                    let dropped = jobs.pop().expect("not empty");
                    tracing::error!(
                        node = self.node,
                        job = dropped.job,
                        "left out of the inventory: {e}"
                    );
                }
                Err(e) => {
                    tracing::error!(node = self.node, "cannot encode an empty inventory: {e}");
                    return;
                }
            }
        };
        let at = self.rm.inventory_offset(self.node as usize);
        if let Err(e) = self.prims.xfer_and_signal(
            &NodeSet::single(self.mm),
            at,
            Bytes::from(bytes),
            None,
            Some(self.rm.register_sent),
        ) {
            tracing::debug!(node = self.node, "cannot reach the MM: {e}");
        }
    }

    /// Acknowledges the welcome that [`Event::Welcomed`] gave, once the manager has taken up
    /// the new membership it begins.
    pub fn acknowledge(&self) {
        if let Standing::Welcomed { stamp, .. } = self.standing {
            self.send_to_mm(self.rm.join_ack.at(self.node as usize).offset(), stamp);
        }
    }

    /// Writes `value` into the MM's memory at `offset` and raises `registered` there.
    fn send_to_mm(&self, offset: u64, value: u64) {
        if let Err(e) = self.prims.xfer_and_signal(
            &NodeSet::single(self.mm),
            offset,
            Bytes::copy_from_slice(&value.to_ne_bytes()),
            Some(self.rm.registered),
            Some(self.rm.register_sent),
        ) {
            tracing::debug!(node = self.node, "cannot reach the MM: {e}");
        }
    }
}
