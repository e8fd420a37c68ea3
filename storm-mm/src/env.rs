//! The seam between the machine manager's core and the world it runs in.
//!
//! [`crate::MachineManager`] makes every decision itself and does no I/O of its own besides
//! the fabric (a `storm-primitives` endpoint) and the journal, both handed to it whole when it
//! is made ([`crate::manager::MmParts`]). Everything else crosses this seam as values:
//!
//! * what reaches the core is an [`Input`] (a client connected, asked or left; a program
//!   transfer, a program copy or a journal write finished; a node announced a termination),
//!   handed to [`crate::MachineManager::handle`];
//! * what the core wants done it asks of its [`MmEnv`]: send a reply, hang up on a client,
//!   start or cancel a program transfer, copy a program beside the journal, write a journal
//!   batch, let go of a program. The environment also tells the time and how far clients and
//!   transfers are.
//!
//! Programs and clients are known to the core by number ([`ProgramId`], [`ClientId`]): the
//! descriptors, sockets, threads and counters behind them are the host's. The daemon's
//! environment is `crate::daemon::DaemonEnv`; the simulator (`storm-sim`) brings one with a
//! virtual clock, clients in memory and modelled transfers.

use std::time::Duration;

use storm_cluster::clock::Clock;
use storm_cluster::control::{Reply, Request};
use storm_cluster::messages::JobId;
use storm_primitives::{EventId, NodeSet, QueueLayout, VarId};

/// A connection on the control socket.
pub type ClientId = u64;

/// A program a submitter sent with its job (`--bcast`), held by the host until the core lets
/// go of it ([`MmEnv::release_program`]).
pub type ProgramId = u64;

/// What the host found out about a program descriptor that came with a submission.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SubmittedProgram {
    pub id: ProgramId,
    /// Its size now.
    pub len: u64,
    /// Whether it is a regular file.
    pub regular: bool,
    /// Its permission bits.
    pub mode: u32,
    /// Its size, modification time and permissions, for the check whether it is in place.
    pub stamp: storm_cluster::messages::ProgramStamp,
}

/// Everything that reaches the machine manager's core.
#[derive(Debug)]
pub enum Input {
    /// A client connected as `uid`/`gid` (the socket's peer credentials, or what a control
    /// relay vouched for: then `relayed_from` names the node the user is on).
    Connected {
        client: ClientId,
        uid: u32,
        gid: u32,
        relayed_from: Option<String>,
    },
    /// A client asked something. `program` is the descriptor that came with it, as the host
    /// found it (`Err`: it could not be inspected), if one came.
    Request {
        client: ClientId,
        req: Request,
        program: Option<Result<SubmittedProgram, String>>,
    },
    /// A client's connection closed.
    Gone { client: ClientId },
    /// A program transfer ended (its worker is done with its slot and event).
    TransferDone(TransferDone),
    /// A program copy beside the journal ([`MmEnv::save_program`]) ended.
    ProgramSaved {
        job: JobId,
        result: Result<(), crate::journal::JournalError>,
    },
    /// The MM's termination event was signalled while the host waited on it: a node announced
    /// that a job's tasks ended (Algorithm 8).
    TerminationSignalled,
    /// A journal batch handed over with [`MmEnv::persist`] was written (or the write failed;
    /// its changes go again with the next batch).
    Persisted(crate::journal::Settled),
}

/// Where a program transfer reads the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ProgramSource {
    /// The descriptor storm-submit passed.
    Submitted(ProgramId),
    /// The copy beside the journal.
    Saved(JobId),
}

/// A program transfer (Algorithm 6) the core asks its environment to run. Its outcome comes
/// back as [`Input::TransferDone`].
#[derive(Debug, Clone)]
pub struct TransferSpec {
    pub job: JobId,
    pub transfer: u32,
    pub nodes: NodeSet,
    pub program: ProgramSource,
    /// Bytes to send: the size checked at submission.
    pub size: u64,
    /// The worker slot, and its local completion event.
    pub worker: usize,
    pub event: EventId,
    /// The chunk queue the program travels in.
    pub chunks: QueueLayout,
    /// Longest wait for queue space or a completion.
    pub timeout: Duration,
    /// Where each node answers once it checked the program.
    pub file_ack: VarId,
    /// Longest wait, once the program is delivered, for every node's answer.
    pub ack_wait: Duration,
    /// Send nothing: hash the program and wait (up to `ack_wait`) for the nodes' answers to a
    /// `Command::CheckProgram` (is it in place?). The hash is reported as a transfer's is.
    pub check_only: bool,
}

/// Why a single MM cannot remove replica `name` (`storm managers remove`).
pub fn no_group_to_remove_from(name: &str) -> String {
    format!(
        "this machine manager is a single one, not a replicated group: there is no {name} to \
         remove"
    )
}

/// The machine manager's view of the world around it.
pub trait MmEnv {
    /// Where the MM reads the time.
    fn clock(&self) -> &dyn Clock;
    /// The user who may act as operator besides root (the MM's own user).
    fn operator_uid(&self) -> u32;
    /// The peer cluster whose jobs run here as local account `uid` (a `[[peer]]` this
    /// cluster lends to names it as its `flock_user`), if any: that account submits no jobs
    /// of its own (docs/federation.md). The host reads the user database; none by default.
    fn peer_account(&self, _uid: u32) -> Option<&str> {
        None
    }
    /// The public keys of peer `peer`'s MM (`[[peer]] mm_public_key_file`), with which a
    /// guest slot's lease grant is checked; none if they cannot be read (then no guest slot
    /// of that peer is admitted). The host reads the file.
    fn lender_keys(&mut self, _peer: &str) -> Vec<storm_cluster::identity::VerifyingKey> {
        Vec::new()
    }
    /// The replicas of the manager group this MM leads, as it sees them (`storm managers`);
    /// a single MM, itself alone.
    fn managers(&self) -> Vec<storm_cluster::control::ManagerInfo> {
        vec![storm_cluster::control::ManagerInfo::single()]
    }
    /// Removes replica `name` from the manager group this MM leads (`storm managers
    /// remove`): what the operator should know, or why not.
    fn remove_manager(&mut self, name: &str) -> Result<String, String> {
        Err(no_group_to_remove_from(name))
    }

    /// Sends a reply to a client (dropped if it is gone).
    fn send(&mut self, client: ClientId, reply: Reply);
    /// How many of the replies sent to `client` it has been written (taken) so far; a client
    /// that is gone counts as having taken them all (`u64::MAX`).
    fn replies_written(&self, client: ClientId) -> u64;
    /// Closes a client's connection (it broke a limit).
    fn hang_up(&mut self, client: ClientId);

    /// Starts a program transfer; `Err` says why it cannot start (the program cannot be
    /// read). Its outcome comes back as [`Input::TransferDone`].
    fn start_transfer(&mut self, transfer: TransferSpec) -> Result<(), String>;
    /// Asks a transfer to stop; it still reports [`Input::TransferDone`].
    fn cancel_transfer(&mut self, transfer: u32);
    /// Program bytes transfer `transfer` has delivered to every node so far; `None` once it
    /// ended (its [`Input::TransferDone`] is on its way).
    fn transfer_delivered(&self, transfer: u32) -> Option<u64>;

    /// Starts copying the first `size` bytes of a submitted program beside the journal, as
    /// job `job`'s; false if this host keeps no copies. The outcome comes back as
    /// [`Input::ProgramSaved`].
    fn save_program(&mut self, job: JobId, program: ProgramId, size: u64) -> bool;
    /// The size of job `job`'s copy beside the journal, if there is one.
    fn saved_program_len(&self, job: JobId) -> Option<u64>;
    /// Removes job `job`'s copy beside the journal (nothing will need it).
    fn remove_saved_program(&mut self, job: JobId);
    /// Writes a batch of the journal's changes (a journal the host took the store of, see
    /// `Journal::hand_off`), in the order handed; each outcome comes back as
    /// [`Input::Persisted`].
    fn persist(&mut self, batch: crate::journal::Batch);
    /// The core needs a submitted program no more (its copy is made, its job ended, or its
    /// submission was refused).
    fn release_program(&mut self, program: ProgramId);
}

/// What a worker reports when it is done. By then no completion of its transfer is still
/// due, so its slot and event may serve the next transfer.
#[derive(Debug)]
pub struct TransferDone {
    pub job: JobId,
    pub transfer: u32,
    pub worker: usize,
    /// The BLAKE3 hash of the program sent, which its launch will carry under the MM's seal
    /// (nodes run only the file that hashes to it), or why the transfer failed.
    pub result: Result<[u8; 32], Failure>,
    /// How long its parts took, for the MM's metrics (zero for a check in place).
    pub took: TransferTook,
}

/// The parts of a program transfer's time, as its worker measured them.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TransferTook {
    /// The worker started to every chunk delivered to every node (read, hashed, sent).
    pub delivered: Duration,
    /// Then to every node's answer seen (its last write, its checks, its file closed),
    /// or the wait for them given up.
    pub answered: Duration,
}

/// Why a transfer did not complete.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Failure {
    pub message: String,
    /// The nodes that did not take a chunk in time (empty if the failure was not theirs).
    pub blamed: NodeSet,
}

impl Failure {
    pub fn new(message: String) -> Self {
        Self {
            message,
            blamed: NodeSet::new(),
        }
    }

    /// A failure of a primitive, blaming the nodes it names.
    pub fn from_prim(what: String, e: &storm_primitives::PrimError) -> Self {
        Self {
            message: format!("{what}: {e}"),
            blamed: e.blamed(),
        }
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}
