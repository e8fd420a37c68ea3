//! The PMI server: how unmodified MPI programs find each other (docs/mpi.md).
//!
//! Each task of a job that uses PMI gets one end of a socket pair as `PMI_FD`. One thread per
//! NM ([`service`]) serves every local task's socket; each job's state is a [`job::PmiJob`],
//! which speaks PMI-1 and PMI-2 ([`wire`]) and knows nothing of sockets or of other nodes.
//! Fences go through the MM (see storm-mm's `manager::pmi`); a PMIx job's direct modex and
//! its ranks' ends too ([`exchange`]).

pub mod exchange;
pub mod job;
pub mod service;
pub mod wire;

pub use job::{JobFacts, PmiJob, process_mapping};
pub use service::PmiService;

/// The descriptor number a task finds its PMI socket on.
pub const PMI_FD: i32 = storm_pl::PMI_FD;
