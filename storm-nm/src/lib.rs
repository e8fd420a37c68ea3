//! # storm-nm: the node manager
//!
//! One per compute node (paper Sec. 2.2). It
//!
//! * registers with the MM and joins the heartbeat, and registers again when the MM no
//!   longer counts it as a member ([`membership`]);
//! * receives heartbeats from the MM through the heartbeat queue (Algorithm 5) and carries out
//!   their commands: receive a program, launch a job, signal a job, forget a job, shut down;
//! * receives programs chunk by chunk into its node-local spool directory and verifies size
//!   and checksum before it acknowledges them (Algorithm 7, [`receive`]);
//! * starts the node's program launcher ([`launch`]), which starts every local task, and
//!   forwards the tasks' output to the MM ([`output`]);
//! * keeps each job's processes in a cgroup of its own, killed whole when the job ends, and
//!   reads its CPU time and peak memory there ([`cgroup`]);
//! * samples its node once per sample period: load, memory, disks, network, its own CPU
//!   ([`sample`]), and puts the record where the MM reads it ([`monitor`]);
//! * runs the guest NM while the node is lent to a peer cluster ([`guest`]);
//! * polls the NM-PL shared-memory table at heartbeat intervals and reports finished jobs
//!   (Algorithm 9, [`manager`]; the reports themselves in [`report`]).
//!
//! It reaches other nodes only through `storm-primitives`, and its PLs only through their
//! pipes and the shared table.
//!
//! The decisions are a core without I/O of its own, [`NodeManager`] ([`manager`]), over an
//! environment ([`env::NmEnv`]: the clock, a [`env::TaskRunner`], a [`env::Spool`], the
//! output forwarder, the PMI server). The `storm-nm` daemon ([`daemon`]) hosts it with the
//! real ones ([`tasks::PlRunner`] for storm-pl processes); the simulator (`storm-sim`) with
//! tasks in virtual time.

pub mod cgroup;
pub mod daemon;
pub mod env;
pub mod guest;
pub mod health;
pub mod in_place;
pub mod launch;
pub mod manager;
pub mod membership;
pub mod monitor;
pub mod output;
pub mod pmi;
pub mod pmix;
pub mod procstat;
pub mod receive;
pub mod report;
pub mod sample;
pub mod singleton;
pub mod tasks;
pub mod usage;

pub use daemon::NmOptions;
pub use env::NmEnv;
pub use manager::{JobState, NmParts, NodeManager, Stepped};
