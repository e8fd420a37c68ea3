//! What the machine manager's core asks of the world it runs in.
//!
//! [`crate::MachineManager`] makes every decision itself but does no I/O of its own: it
//! reads time from its environment's clock, asks it for the operator's uid, and has it start
//! program transfers. The fabric (a `storm-primitives` endpoint) and the journal's store are
//! handed to it whole when it is made ([`crate::manager::MmParts`]); requests arrive through
//! [`crate::MachineManager::handle`], and replies leave on each client's channel.
//!
//! [`DaemonEnv`] is the daemon's: the system clock, the process's effective uid, a thread per
//! transfer. The simulator (`storm-sim`) brings a virtual clock.

use std::sync::Arc;

use crossbeam_channel::Sender;
use storm_cluster::RmLayout;
use storm_cluster::clock::{Clock, SystemClock};
use storm_primitives::Primitives;

use crate::transfer::{self, Transfer, TransferDone};

/// The machine manager's view of the world around it.
pub trait MmEnv {
    /// Where the MM reads the time.
    fn clock(&self) -> &dyn Clock;
    /// The user who may act as operator besides root (the MM's own user).
    fn operator_uid(&self) -> u32;
    /// Starts sending a program to its nodes (Algorithm 6); the outcome is sent on `done`.
    fn start_transfer(
        &mut self,
        fabric: Arc<dyn Primitives>,
        rm: &RmLayout,
        transfer: Transfer,
        done: Sender<TransferDone>,
    );
}

/// The environment of the `storm-mm` daemon.
#[derive(Default)]
pub struct DaemonEnv {
    clock: SystemClock,
    /// The nodes' enrolled identity keys the MM's links check (read again on SIGHUP).
    pub enrolled: Option<Arc<parking_lot::RwLock<storm_cluster::identity::Enrolled>>>,
}

impl std::fmt::Debug for DaemonEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DaemonEnv").finish_non_exhaustive()
    }
}

impl MmEnv for DaemonEnv {
    fn clock(&self) -> &dyn Clock {
        &self.clock
    }

    fn operator_uid(&self) -> u32 {
        nix::unistd::geteuid().as_raw()
    }

    fn start_transfer(
        &mut self,
        fabric: Arc<dyn Primitives>,
        rm: &RmLayout,
        transfer: Transfer,
        done: Sender<TransferDone>,
    ) {
        transfer::spawn(fabric, rm, transfer, done);
    }
}
