//! When an idle MM may sleep past its timeslices: what counts as quiet, and how an input
//! brings the next timeslice back to the usual cadence (issue 64: an idle cluster costs
//! its daemons almost nothing). The heartbeats it skips meanwhile are `heartbeat`'s.

use std::time::Instant;

use crate::env::MmEnv;

use super::MachineManager;

impl<E: MmEnv> MachineManager<E> {
    /// Whether nothing is under way that a timeslice must move on: no job, no command or
    /// heartbeat waiting, no reply, journal change or transfer pending, no node joining or
    /// unresponsive, no follower waiting for an ended job's nodes, no shutdown. A quiet
    /// MM's next timeslice comes a quiet heartbeat period later (`[failure]
    /// quiet_heartbeat_ms`), not one timeslice later: an idle cluster does not wake it a
    /// thousand times a second. Any input brings the next timeslice back to the usual
    /// cadence ([`MachineManager::handle`]).
    pub(super) fn is_quiet(&self) -> bool {
        self.jobs.is_empty()
            && !self.shutting_down
            && self.hb.commands.is_empty()
            && self.hb.in_flight.is_none()
            && self.hb.resend.is_none()
            && self.outbox.is_idle()
            && self.transfers.is_idle()
            && !self.term_announced
            && !self.pmi_recheck
            && self.pmi_ended.is_empty()
            && !self.queue_changed
            && self.nodes.settled()
            && self.reattach.parked.is_empty()
    }

    /// When the next timeslice is due once an input arrives: one timeslice after the last,
    /// as when the MM is busy, however quiet it was.
    pub fn poll_timeout_with_input(&self) -> Instant {
        self.next_tick.min(self.last_tick + self.cfg.timeslice())
    }

    /// An input came: see [`MachineManager::poll_timeout_with_input`].
    pub(super) fn back_to_cadence(&mut self) {
        self.next_tick = self.poll_timeout_with_input();
    }
}
