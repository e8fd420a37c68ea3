//! Gang scheduling on this node: the heartbeat's schedule carried out (the jobs out of their
//! time slot stopped, the others continued or started), the switch finished and recorded,
//! and every job stopped when the MM's lease on the schedule runs out.

use super::*;

impl<E: NmEnv> NodeManager<E> {
    /// Makes a task not runnable; false if its launcher was starting it (ask again).
    pub(super) fn halt(env: &mut E, r: &mut LocalRank) -> bool {
        let Some(task) = r.live_task().filter(|_| !r.stopped) else {
            return true;
        };
        if !env.tasks().halt(task) {
            return false;
        }
        r.stopped = true;
        true
    }

    /// Lets a halted task run again.
    pub(super) fn resume(env: &mut E, r: &mut LocalRank) {
        if let Some(task) = r.live_task() {
            env.tasks().resume(task);
        }
        r.stopped = false;
    }

    /// Gang scheduling: stops every local job that is not in `run`, then, once their tasks
    /// have all acted on SIGSTOP, continues (or starts) every one that is. A node never has
    /// two time slots' tasks runnable: when the old slot takes a while to stop (a busy
    /// node), the new one waits for it in `finish_switch`, called again on every step.
    /// `received_ns` is when the heartbeat was taken from the queue; the switch log records
    /// it beside the time the switch was complete.
    pub(super) fn apply_schedule(&mut self, seq: u64, received_ns: u128, run: &[JobId]) {
        let stopped = self.suspend_all_but(run);
        let now = self.env.clock().now();
        let switch = self.switch.get_or_insert_with(|| Switch {
            seq,
            from: seq,
            received_ns,
            since: now,
            stopped: Vec::new(),
            warned: false,
        });
        switch.seq = seq;
        switch.received_ns = received_ns;
        switch.stopped.extend(stopped);
        self.finish_switch(SWITCH_INLINE_WAIT);
    }

    /// From now on exactly the jobs of `run` may run here: stops (SIGSTOP) every other job
    /// that was running, and returns those. Continuing the jobs of `run` is
    /// `finish_switch`'s, once the stopped ones have stopped.
    pub(super) fn suspend_all_but(&mut self, run: &[JobId]) -> Vec<JobId> {
        self.run.clear();
        self.run.extend_from_slice(run);
        let mut stopped = Vec::new();
        for (job, j) in self
            .jobs
            .iter_mut()
            .filter(|(_, j)| !j.reported && !j.ending)
        {
            let suspend = !run.contains(job);
            // A job whose continuing was still waiting has not run since it was stopped.
            let ran = j.ranks.iter().any(|r| r.status.is_none() && !r.stopped);
            if suspend && !j.suspended && ran {
                stopped.push(*job);
            }
            j.suspended = suspend;
        }
        for job in &stopped {
            self.halt_job(*job, true);
        }
        stopped
    }

    /// The latest schedule's lease ran out and no heartbeat came since: the other nodes have
    /// moved on to the next slot, so this one stops every job until a heartbeat says what
    /// runs (the next heartbeat's switch confirms the stops before anything runs again).
    pub(super) fn expire_lease(&mut self) {
        let now = self.env.clock().now();
        if self.lease.is_none_or(|until| now < until) {
            return;
        }
        self.lease = None;
        let stopped = self.suspend_all_but(&[]);
        if let Some(seq) = self.last_schedule {
            self.env.switched(&SwitchRecord {
                seq,
                from: seq,
                received_ns: self.env.stamp_ns(),
                stopped: stopped.clone(),
                continued: Vec::new(),
                started: Vec::new(),
                lease_expired: true,
            });
        }
        if let Some(more) = self.late_heartbeats.allow(now) {
            tracing::warn!(
                node = self.node,
                stopped = ?stopped,
                suppressed = more,
                "no heartbeat within {:.1} ms of the timeslice's end: this node's jobs are \
                 stopped until the next one, so that they do not run beside the other nodes' \
                 next slot (an overloaded node, or a lossy link?)",
                self.cfg.scheduler.slot_grace_ms
            );
        }
    }

    /// Completes the switch in progress if the tasks it stopped have stopped, waiting for
    /// them at most `wait`: continues every job of the slot and starts those launched for
    /// it. Past `SWITCH_GIVE_UP` (a task stuck in the kernel) the new slot runs anyway.
    pub(super) fn finish_switch(&mut self, wait: Duration) {
        let Some(switch) = self.switch.as_mut() else {
            return;
        };
        // Tasks the launcher was starting when the switch began: stop each now
        // that it has a process, before the new slot may run.
        let mut spawning = false;
        let mut halting = Vec::new();
        for j in self.jobs.values_mut().filter(|j| j.held_out()) {
            for r in j.ranks.iter_mut() {
                spawning |= !Self::halt(&mut self.env, r);
                if r.stopped
                    && let Some(task) = r.live_task()
                {
                    halting.push(task);
                }
            }
        }
        let waited = self
            .env
            .clock()
            .now()
            .saturating_duration_since(switch.since);
        if spawning || !self.env.tasks().wait_stopped(&halting, wait) {
            if waited < SWITCH_GIVE_UP {
                if waited > SWITCH_WARN && !switch.warned {
                    switch.warned = true;
                    tracing::warn!(
                        node = self.node,
                        seq = switch.seq,
                        "tasks of the previous slot have taken over {} ms to stop (overloaded \
                         node?); the new slot waits for them",
                        SWITCH_WARN.as_millis()
                    );
                }
                return;
            }
            tracing::warn!(
                node = self.node,
                seq = switch.seq,
                "tasks of the previous slot did not stop within {} ms; the new slot runs anyway",
                SWITCH_GIVE_UP.as_millis()
            );
        }
        let Some(switch) = self.switch.take() else {
            return;
        };
        let mut started = Vec::new();
        let due: Vec<JobId> = self
            .pending
            .keys()
            .filter(|j| self.run.contains(j))
            .copied()
            .collect();
        for job in due {
            if let Some(spec) = self.pending.remove(&job) {
                started.push(job);
                self.spawn_job(spec);
            }
        }
        let continued: Vec<JobId> = self
            .jobs
            .iter()
            .filter(|(job, j)| {
                !j.suspended
                    && !j.reported
                    && !started.contains(job)
                    && j.ranks.iter().any(|r| r.status.is_none() && r.stopped)
            })
            .map(|(job, _)| *job)
            .collect();
        for job in &continued {
            self.halt_job(*job, false);
        }
        if !(switch.stopped.is_empty() && continued.is_empty() && started.is_empty()) {
            self.env.switched(&SwitchRecord {
                seq: switch.seq,
                from: switch.from,
                received_ns: switch.received_ns,
                stopped: switch.stopped,
                continued,
                started,
                lease_expired: false,
            });
        }
    }

    /// Halts (or resumes) every task of a job that has not ended.
    pub(super) fn halt_job(&mut self, job: JobId, stop: bool) {
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        for r in j.ranks.iter_mut() {
            if stop {
                Self::halt(&mut self.env, r);
            } else {
                Self::resume(&mut self.env, r);
            }
        }
    }
}
