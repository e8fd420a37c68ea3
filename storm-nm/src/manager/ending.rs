//! A job's end on this node (Algorithm 9): ended tasks collected, the job's other ranks
//! stopped where its flags say so (`--kill-on-bad-exit`, `--wait`) or a signal asks, the
//! singleton notice, and the report to the MM once every local task ended and its output is
//! delivered.

use super::*;

impl<E: NmEnv> NodeManager<E> {
    /// Stops the job's local ranks of this NM's own accord: SIGTERM now, SIGKILL to those
    /// still running `[cluster] kill_wait_ms` later (`poll_tasks`).
    pub(super) fn stop_job(&mut self, job: JobId, now: Instant) {
        if let Some(j) = self.jobs.get_mut(&job) {
            j.stopped_at = Some(now);
        }
        self.signal_job(job, libc::SIGTERM);
    }

    pub(super) fn signal_job(&mut self, job: JobId, signal: i32) {
        if let Some(spec) = self.pending.remove(&job) {
            // Never started here: its tasks end, unstarted, by this signal.
            self.record_unstarted(spec, RankStatus::Signaled(signal));
            return;
        }
        let Some(j) = self.jobs.get_mut(&job) else {
            return;
        };
        let was_suspended = j.suspended;
        // A stopped process cannot act on a signal: let the job run until it ends.
        j.ending = true;
        j.suspended = false;
        for task in j.ranks.iter().filter_map(LocalRank::live_task) {
            self.env.tasks().signal(task, signal);
        }
        if was_suspended {
            self.halt_job(job, false);
        }
    }

    /// Algorithm 9: collect ended tasks; report jobs whose local tasks all ended.
    pub(super) fn poll_tasks(&mut self) {
        self.env.tasks().poll();
        let now = self.env.clock().now();
        let output = self.env.output().state();
        let (backlogged, flushed) = (output.backlogged(), output.flushed(self.output_epoch));
        let mut ready = Vec::new();
        let mut close = Vec::new();
        let mut exiting = false;
        let mut stop = Vec::new();
        let mut waited = Vec::new();
        let mut kill = Vec::new();
        let kill_wait = Duration::from_millis(self.cfg.cluster.kill_wait_ms);
        for (job, j) in self.jobs.iter_mut().filter(|(_, j)| !j.reported) {
            let held_out = j.held_out();
            for r in j.ranks.iter_mut() {
                let Some(task) = r.live_task() else {
                    continue;
                };
                // A multi-rank job's rank that has not spoken to the PMI server: has it
                // loaded an MPI library (a singleton in the making)?
                let multi = j.spec.ntasks > 1;
                if multi && r.mpi.due(now) && !self.env.pmi().contacted(*job, r.rank) {
                    r.mpi.library = self.env.tasks().mpi_library(task);
                }
                if let Some(s) = self.env.tasks().status(task) {
                    r.status = Some(s);
                    // Not of a rank storm was ending (a cancel, a time limit, -K): it may
                    // have been stopped on its way to MPI_Init.
                    if let Some(lib) = r.mpi.library.as_deref()
                        && !j.ending
                        && !self.env.pmi().contacted(*job, r.rank)
                    {
                        let size = j.spec.ntasks;
                        let text = singleton::notice(r.rank, size, self.node, lib, j.spec.mpi);
                        tracing::warn!(node = self.node, job, rank = r.rank, "{}", text.trim());
                        self.env
                            .output()
                            .tell(*job, r.rank, Stream::Notice, &text, &r.output);
                    }
                    // Its job's other ranks hear of it (PMIx events), unless storm is
                    // ending the job.
                    if multi && j.spec.mpi.serves_pmix() && !j.ending {
                        self.env.pmi().rank_ended(*job, r.rank, s);
                    }
                    j.first_ended.get_or_insert((r.rank, now));
                    if j.spec.kill_on_bad_exit && !j.ending && j.culprit.is_none() && failed(s) {
                        j.culprit = Some(r.rank);
                        stop.push(*job);
                    }
                } else if held_out {
                    Self::halt(&mut self.env, r);
                } else if r.output.load(Ordering::Acquire) == 0 {
                    exiting = true;
                }
            }
            if j.ranks.iter().any(|r| r.status.is_none()) {
                if j.outlived_wait(now) {
                    j.waited = true;
                    waited.push(*job);
                }
                if j.stopped_at
                    .is_some_and(|at| now.saturating_duration_since(at) >= kill_wait)
                {
                    j.stopped_at = None;
                    kill.push(*job);
                }
                continue;
            }
            let ended = *j.exited_at.get_or_insert(now);
            let drained = j
                .ranks
                .iter()
                .all(|r| r.output.load(Ordering::Acquire) == 0);
            if backlogged {
                // Output waits to be sent (a slow submitter, or no MM): the pipes are not
                // read meanwhile, so their staying open says nothing.
                j.exited_at = Some(now);
            } else if !drained
                && !j.output_closed
                && now.saturating_duration_since(ended) > OUTPUT_GRACE
            {
                tracing::warn!(job, "tasks ended but their output stays open; closing it");
                close.push(*job);
                j.output_closed = true;
            }
            // Output sent again in a new membership reaches the MM before the report does.
            if drained && flushed {
                ready.push(*job);
            }
        }
        // `--kill-on-bad-exit`: a rank failed; the job's other local ranks stop now, and
        // the report names it (the MM then ends the job on its other nodes).
        for job in stop {
            if let Some(j) = self.jobs.get(&job) {
                tracing::info!(node = self.node, job, rank = ?j.culprit, "a rank failed under --kill-on-bad-exit: stopping the job's other ranks here");
            }
            self.stop_job(job, now);
        }
        // `--wait`: the job's other local ranks outlived its first by that long; they stop
        // now, and the report says why (the MM then ends the job on its other nodes).
        for job in waited {
            if let Some(j) = self.jobs.get(&job) {
                tracing::info!(node = self.node, job, first = ?j.first_ended.map(|f| f.0), wait_s = j.spec.exit_wait_s, "the job's ranks here outlived its first to end by --wait: stopping them");
            }
            self.stop_job(job, now);
        }
        for job in kill {
            tracing::warn!(
                node = self.node,
                job,
                "ranks stopped here still run: SIGKILL"
            );
            self.signal_job(job, libc::SIGKILL);
        }
        self.exiting_since = match (exiting, self.exiting_since) {
            (false, _) => None,
            (true, since) => since.or(Some(now)),
        };
        for job in close {
            self.env.output().close_job(job);
        }
        for job in ready {
            if let Err(e) = self.report(job) {
                tracing::warn!(node = self.node, job, "cannot report to the MM yet: {e}");
            }
        }
    }

    /// How this node reports to the MM.
    pub(super) fn reporter(&self) -> Reporter<'_> {
        Reporter {
            prims: &*self.prims,
            rm: &self.rm,
            node: self.node,
            mm: self.mm,
            wait: self.report_wait,
        }
    }

    /// Tells the MM how the job's local tasks ended.
    pub(super) fn report(&mut self, job: JobId) -> Result<(), crate::report::ReportError> {
        let Some(j) = self.jobs.get(&job) else {
            return Ok(());
        };
        let statuses = j
            .ranks
            .iter()
            .filter_map(|r| Some((r.rank, r.status?)))
            .collect();
        let times: Vec<TaskTimes> = j
            .ranks
            .iter()
            .filter_map(|r| r.task)
            .map(|t| self.env.tasks().times(t))
            .collect();
        let since = |ns: u128| (ns.saturating_sub(j.launched_ns) / 1_000) as u64;
        let first_started_us = times.iter().filter_map(|t| t.started_ns).min().map(since);
        let last_exited_us = times.iter().filter_map(|t| t.exited_ns).max().map(since);
        // The job's tasks here have ended: what they left running dies with the job, and
        // what it all used goes into the report.
        let usage = self.env.tasks().end_job(job);
        let Some(j) = self.jobs.get(&job) else {
            return Ok(());
        };
        let since = |ns: u128| (ns.saturating_sub(j.launched_ns) / 1_000) as u64;
        let stamp = |ns: Option<u128>| ns.map(since);
        let timing = NodeTiming {
            verified_us: stamp(j.stamps.verified_ns),
            prepared_us: stamp(j.stamps.prepared_ns),
            asked_us: stamp(j.stamps.asked_ns),
            first_started_us,
            last_exited_us,
            reported_us: since(self.env.stamp_ns()),
            usage,
        };
        self.reporter().report(
            &j.spec,
            statuses,
            timing,
            Ended {
                culprit: j.culprit,
                first: j.first_ended.map(|(rank, _)| rank),
                waited: j.waited,
            },
        )?;
        let Some(j) = self.jobs.get_mut(&job) else {
            return Ok(());
        };
        j.reported = true;
        if std::mem::take(&mut j.report_again) {
            tracing::info!(node = self.node, job, "reported again to a restarted MM");
        }
        for r in &mut j.ranks {
            if let Some(task) = r.task.take() {
                self.env.tasks().release(task);
            }
        }
        tracing::info!(node = self.node, job, "reported termination");
        Ok(())
    }
}

/// Whether a rank's end is a failure (`--kill-on-bad-exit`): a non-zero code or a signal.
fn failed(status: RankStatus) -> bool {
    !matches!(status, RankStatus::Exited(0))
}
