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
//! * starts one program launcher per local task ([`launch`]) and forwards their output to the
//!   MM ([`output`]);
//! * polls the NM-PL shared-memory table at heartbeat intervals and reports finished jobs
//!   (Algorithm 9, [`manager`]; the reports themselves in [`report`]).
//!
//! It reaches other nodes only through `storm-primitives`, and its PLs only through their
//! pipes and the shared table.

pub mod launch;
pub mod manager;
pub mod membership;
pub mod output;
pub mod pmi;
pub mod procstat;
pub mod receive;
pub mod report;

pub use manager::{NmOptions, NodeManager};
