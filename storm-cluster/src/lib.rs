//! # storm-cluster
//!
//! What the storm daemons and tools share, so that each side of every exchange is defined in
//! one place:
//!
//! * [`accept_gate`]: how many unproved connections a network listener holds, in all and per
//!   source address.
//! * [`cli_docs`]: man pages and shell completions from the tools' clap definitions.
//! * [`clock`]: the time the daemons' logic reads (the system's, or a simulation's).
//! * [`config`]: the cluster file (nodes, backend, timeslice, queue sizes).
//! * [`layout`]: the resource manager's global-memory layout, built identically by the MM and
//!   every NM from the cluster file.
//! * [`messages`]: heartbeats and their commands, per-node reports, output chunks.
//! * [`sample`]: a node's sample and inventory, the fixed-size records NMs keep for queries.
//! * [`usage`]: what a node's jobs (CPU, memory) and fabric ports used, its fourth record.
//! * [`tasks`]: `-N` / `-n` / `--ntasks-per-node` and the placement of ranks on nodes.
//! * [`control`]: the Unix-socket protocol between storm-submit / storm and the MM;
//!   [`dependency`]: `--dependency`, parsed and judged.
//! * [`federation`]: peer clusters: `[federation]`, `[[peer]]`, the peer agents' messages;
//!   [`guest_file`]: what a lent node's guest NM takes from the borrower, and what not.
//! * [`endpoint`]: starting a daemon's primitives endpoint (tcp or ofi) from the cluster file.
//! * [`key`] and [`identity`]: the cluster key, the MM's signing key and the nodes'
//!   identity keys, and the MM's seals on the commands nodes carry out; [`keywatch`]: key
//!   files looked at again while a daemon runs, and read again on SIGHUP.
//! * [`daemon_dir`]: directories a root daemon writes in for users, reached only by
//!   descriptor.
//! * [`sealed`]: links of encrypted, authenticated frames after a handshake that proves a
//!   key (the control relay's, and the peer clusters').
//! * [`os_bytes`]: users' paths on the wire as their bytes, UTF-8 or not.
//! * [`program_hash`]: program files' hashes, remembered by what `fstat` says of them.
//! * [`daemon`]: the daemons' process plumbing: logging, stop signals, readiness
//!   notification.
//!
//! Apart from [`endpoint`], which hands the daemons their `storm-primitives` node, and
//! [`keywatch`], whose thread follows the key files' directories, it holds definitions, not
//! behaviour: no threads, and no network access of its own (the control socket and the
//! readiness socket are local Unix sockets).

pub mod accept_gate;
pub mod cli_docs;
pub mod clock;
pub mod config;
pub mod control;
pub mod cpu_bind;
pub mod daemon;
pub mod daemon_dir;
pub mod dependency;
pub mod endpoint;
pub mod federation;
pub mod flock;
pub mod guest_file;
pub mod health;
pub mod hostlist;
pub mod identity;
pub mod key;
pub mod keywatch;
pub mod layout;
pub mod messages;
pub mod os_bytes;
pub mod program_hash;
pub mod sample;
pub mod sealed;
pub mod size;
pub mod tasks;
pub mod usage;

pub use config::{ClusterConfig, ConfigError};
pub use layout::RmLayout;
pub use messages::JobId;
