//! The NM's side of termination (Algorithm 9), as it touches global memory: a job's slot made
//! ready for a launch, and a finished job reported to the MM. The node manager and the
//! simulator (`storm-sim`) both use these, so the simulated nodes speak the NM's protocol.

use std::time::Duration;

use bytes::Bytes;
use storm_cluster::RmLayout;
use storm_cluster::messages::{LaunchSpec, NodeReport, NodeTiming, RankStatus, encode_sealed};
use storm_primitives::{EventId, NodeId, NodeSet, Primitives, Wait};

#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    #[error("{0}")]
    Encode(#[from] storm_cluster::messages::MessageError),
    #[error("{0}")]
    Fabric(#[from] storm_primitives::PrimError),
    #[error("no completion within {0:?}")]
    NoCompletion(Duration),
}

/// What ended a job's ranks on one node, beside their statuses.
#[derive(Debug, Clone, Copy, Default)]
pub struct Ended {
    /// The local rank whose failure ended the job (`--kill-on-bad-exit`).
    pub culprit: Option<u32>,
    /// The local rank that ended first.
    pub first: Option<u32>,
    /// The NM stopped the others because they outlived `first` by `--wait`.
    pub waited: bool,
}

/// Where a node reports: its fabric endpoint and layout, its own id, the MM's, and how long
/// a report may take to complete.
pub struct Reporter<'a> {
    pub prims: &'a dyn Primitives,
    pub rm: &'a RmLayout,
    pub node: NodeId,
    pub mm: NodeId,
    pub wait: Duration,
}

impl Reporter<'_> {
    /// Before job `spec` starts here: a job run again (requeued) may use the slot it used
    /// before, so its old termination flag must not announce the new run's end, nor may the
    /// MM's PMI fence results for its earlier run release its ranks.
    pub fn prepare_slot(&self, spec: &LaunchSpec) {
        let flag = self.rm.terminated.at(spec.slot as usize);
        if self.prims.memory().load(flag) == spec.job {
            self.prims.memory().store(flag, 0);
        }
        let _ = self
            .prims
            .memory()
            .write(self.rm.pmi_down_offset(spec.slot as usize), &[0u8; 32]);
    }

    /// Tells the MM how job `spec`'s tasks on this node ended: the report into the MM's
    /// report area, then this node's termination flag, and, from the job's reporter node or
    /// a node whose rank's failure ends the job (`culprit`, `--kill-on-bad-exit`) or whose
    /// ranks outlived `--wait`, the hint that raises the MM's termination event.
    pub fn report(
        &self,
        spec: &LaunchSpec,
        statuses: Vec<(u32, RankStatus)>,
        timing: NodeTiming,
        ended: Ended,
    ) -> Result<(), ReportError> {
        let slot = spec.slot as usize;
        let report = NodeReport {
            job: spec.job,
            statuses,
            timing,
            culprit: ended.culprit,
            first_ended: ended.first,
            waited: ended.waited,
        };
        let raise = spec.reporter == self.node || ended.culprit.is_some() || ended.waited;
        let bytes = encode_sealed("report", &report, self.rm.report_bytes)?;
        let mm = NodeSet::single(self.mm);
        let offset = self.rm.report_offset(slot, self.node as usize);
        self.put_and_wait(&mm, offset, Bytes::from(bytes), None)?;
        self.prims
            .memory()
            .store(self.rm.terminated.at(slot), spec.job);
        if raise {
            let hint = self.rm.term_hint.at(slot).offset();
            self.put_and_wait(
                &mm,
                hint,
                Bytes::copy_from_slice(&spec.job.to_ne_bytes()),
                Some(self.rm.term_event),
            )?;
        }
        Ok(())
    }

    fn put_and_wait(
        &self,
        dest: &NodeSet,
        offset: u64,
        data: Bytes,
        remote: Option<EventId>,
    ) -> Result<(), ReportError> {
        self.prims
            .xfer_and_signal(dest, offset, data, remote, Some(self.rm.report_sent))?;
        match self
            .prims
            .test_event(self.rm.report_sent, Wait::Timeout(self.wait))?
        {
            true => Ok(()),
            false => Err(ReportError::NoCompletion(self.wait)),
        }
    }
}
