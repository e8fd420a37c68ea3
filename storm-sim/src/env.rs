//! The machine manager's environment in the simulator: the virtual clock, root as the
//! operator, and no program transfers (simulated jobs run programs already on the nodes).

use std::sync::Arc;

use crossbeam_channel::Sender;
use storm_cluster::RmLayout;
use storm_cluster::clock::{Clock, VirtualClock};
use storm_mm::MmEnv;
use storm_mm::transfer::{Failure, Transfer, TransferDone};
use storm_primitives::Primitives;

pub struct SimEnv {
    pub clock: Arc<VirtualClock>,
}

impl MmEnv for SimEnv {
    fn clock(&self) -> &dyn Clock {
        &*self.clock
    }

    fn operator_uid(&self) -> u32 {
        0
    }

    /// A job that asks for its program to be sent fails, saying why: the simulator moves no
    /// program bytes (its launch model is in docs/launch-model.md).
    fn start_transfer(
        &mut self,
        _fabric: Arc<dyn Primitives>,
        _rm: &RmLayout,
        t: Transfer,
        done: Sender<TransferDone>,
    ) {
        let _ = done.send(TransferDone {
            job: t.job,
            transfer: t.transfer,
            worker: t.worker,
            result: Err(Failure::new(
                "the simulator sends no programs: submit with bcast off".into(),
            )),
        });
    }
}
