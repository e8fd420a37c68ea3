//! Copies jobs' programs into the state directory on a thread of its own.
//!
//! A job that waits in the queue, or may be requeued, needs its program after a restart of the
//! MM, so the MM keeps a copy (`journal::save_program_at`). Copying takes as long as the
//! program is large (up to `[limits] max_program_bytes`); on the main loop it would hold up
//! every heartbeat and every other user's request meanwhile. Here the main loop hands the copy
//! over and hears back when it is done. Until then a restart finds no copy, and the job ends
//! saying its program was lost.

use std::fs::File;
use std::path::PathBuf;

use crossbeam_channel::{Receiver, Sender};
use storm_cluster::messages::JobId;

use crate::journal::{self, JournalError};

/// A copy the main loop asked for.
struct Order {
    job: JobId,
    program: File,
    path: PathBuf,
}

/// The saver thread, and what it reports.
pub struct ProgramSaver {
    orders: Sender<Order>,
    /// Job and outcome of each copy, in the order they finish.
    pub done: Receiver<(JobId, Result<(), JournalError>)>,
}

impl ProgramSaver {
    pub fn start() -> std::io::Result<Self> {
        let (orders, todo) = crossbeam_channel::unbounded::<Order>();
        let (report, done) = crossbeam_channel::unbounded();
        std::thread::Builder::new()
            .name("storm-mm-save".into())
            .spawn(move || {
                for o in todo {
                    let outcome = journal::save_program_at(&o.path, o.job, &o.program);
                    if report.send((o.job, outcome)).is_err() {
                        break;
                    }
                }
            })?;
        Ok(Self { orders, done })
    }

    /// Copies `program` (job `job`'s) to `path`.
    pub fn save(&self, job: JobId, program: File, path: PathBuf) {
        let _ = self.orders.send(Order { job, program, path });
    }
}
