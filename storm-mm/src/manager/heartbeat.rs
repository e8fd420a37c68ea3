//! The heartbeat (paper Algorithm 4): every timeslice the MM issues one XFER-AND-SIGNAL to
//! every member with the commands due and, under gang scheduling, the strobe, and takes its
//! outcome (a failure is `failure`'s).

use std::time::Instant;

use bytes::Bytes;
use storm_cluster::messages::{Command, Heartbeat, encode};
use storm_primitives::{PrimError, Wait};

use crate::env::MmEnv;

use super::{MachineManager, Phase, SEAL_ROOM};

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
        if self.heartbeats.dest().is_empty() {
            return;
        }
        let (bytes, fresh) = match self.hb_resend.take() {
            Some(bytes) => (bytes, None),
            None => match self.next_heartbeat() {
                Some((bytes, taken)) => (bytes, Some(taken)),
                None => return,
            },
        };
        match self
            .heartbeats
            .enqueue(&*self.prims, &bytes, Some(self.rm.hb_sent))
        {
            Ok(()) => {
                let now = self.now();
                if let Some(taken) = fresh {
                    self.hb_seq += 1;
                    for cmd in self.commands.drain(..taken) {
                        if let Command::Launch(spec) = cmd
                            && let Some(j) = self.jobs.get_mut(&spec.job)
                            && j.phase == Phase::Launching
                        {
                            // Its record (with the time its launch was readied) was
                            // written before this heartbeat: a restarted MM re-adopts it.
                            j.launched = Some(now);
                            j.phase = Phase::Running;
                        }
                    }
                }
                self.hb_in_flight = Some(InFlight { bytes, issued: now });
            }
            Err(e) => {
                // AWAIT-SPACE found no room in time (a node that just joined, or one that no
                // longer takes heartbeats, which the receipt check finds), or could not ask a
                // node: one that did not answer by the heartbeat's deadline (or whose
                // connection failed) misses this heartbeat, as if the transfer had failed.
                if fresh.is_none() {
                    self.hb_resend = Some(bytes);
                }
                if let Some(more) = self.hb_errors.allow(self.now()) {
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
            seq: self.hb_seq,
            commands: Vec::new(),
            seal: None,
        };
        // Room for the seal, which covers the commands chosen.
        let room = limit.saturating_sub(SEAL_ROOM);
        let mut taken = 0;
        for cmd in &self.commands {
            hb.commands.push(cmd.clone());
            if encode("heartbeat", &hb, room).is_err() {
                hb.commands.pop();
                break;
            }
            taken += 1;
        }
        if self.gang {
            let lease = self.cfg.slot_lease().filter(|_| self.run_rotates);
            hb.commands.push(Command::Schedule {
                run: self.run_set.clone(),
                lease_us: lease.map_or(0, |l| l.as_micros().clamp(1, u32::MAX as u128) as u32),
            });
        }
        hb.seal = self
            .signer
            .seal_commands(self.incarnation, hb.seq, &hb.commands, self.unix_ms());
        match encode("heartbeat", &hb, limit) {
            Ok(b) => Some((Bytes::from(b), taken)),
            Err(e) => {
                tracing::error!("cannot encode a heartbeat: {e}");
                None
            }
        }
    }

    /// Takes the outcome of the heartbeat in flight, if it has one; true when none is in
    /// flight any more.
    pub(super) fn heartbeat_completed(&mut self) -> bool {
        let now = self.now();
        let Some(flight) = &self.hb_in_flight else {
            return true;
        };
        match self.prims.test_event(self.rm.hb_sent, Wait::Poll) {
            Ok(false) => false,
            Ok(true) => {
                let issued = flight.issued;
                self.metrics
                    .heartbeat_delivered(now.saturating_duration_since(issued));
                self.hb_in_flight = None;
                self.hb_delivered = self.heartbeats.next_seq();
                self.nodes.heard_all(issued);
                true
            }
            Err(e) => {
                let flight = self.hb_in_flight.take().expect("in flight");
                self.heartbeat_failed(e, flight.bytes);
                true
            }
        }
    }
}
