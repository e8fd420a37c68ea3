//! Flocking (docs/federation.md): a job of this cluster runs on a peer cluster that
//! advertised room, while this cluster's MM keeps it in its queue.
//!
//! * [`Flock`] is what a job asks (`--flock`, `--clusters`, `--no-flock`, or nothing);
//! * the home MM hands the jobs it flocked to its peer agent as [`FlockOrder`]s;
//! * the agent passes each to the peer's agent, which submits it to its own MM and follows
//!   it as storm-submit would: what it hears comes back as numbered [`FlockEvent`]s, which
//!   the home agent hands to the home MM ([`FlockUpdate`]), and the home MM to the job's
//!   storm-submit.
//!
//! Events are numbered per job from 1, and sent again until the home side has taken them:
//! each one can arrive twice, and means the same the second time (output carries its
//! offset in its stream; a job that started or ended once is not started or ended again).

use serde::{Deserialize, Serialize};

use crate::control::{JobOutcome, JobRequest};
use crate::messages::{JobId, OutputChunk};

/// Where a job may run, as its submitter asked.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Flock {
    /// At home; on a peer once it has waited `[federation] flock_after_ms`, if the cluster
    /// file sets it.
    #[default]
    AfterWait,
    /// At home or on any peer this cluster may borrow from, whichever can start it first
    /// (`--flock`).
    Now,
    /// Only on these clusters, whichever can start it first (`--clusters a,b`; this cluster's
    /// own name among them lets it run at home too).
    Only(Vec<String>),
    /// Only at home (`--no-flock`).
    Never,
    /// Flocked here from peer cluster `from`: runs only here. Only the MM sets it, on a job
    /// its peer agent submits for that peer (a user's submission that names it is refused);
    /// the MM gives the job up when that agent falls silent (docs/federation.md).
    From(String),
}

impl Flock {
    /// Whether the job may run on this cluster, named `home`.
    pub fn may_run_at_home(&self, home: &str) -> bool {
        match self {
            Flock::Only(names) => names.iter().any(|n| n == home),
            _ => true,
        }
    }

    /// Whether the job may go to peer `peer` (one this cluster may borrow from).
    pub fn may_run_on(&self, peer: &str) -> bool {
        match self {
            Flock::AfterWait | Flock::Now => true,
            Flock::Only(names) => names.iter().any(|n| n == peer),
            Flock::Never | Flock::From(_) => false,
        }
    }

    /// The peer cluster a job flocked here came from.
    pub fn flocked_from(&self) -> Option<&str> {
        match self {
            Flock::From(peer) => Some(peer),
            _ => None,
        }
    }

    /// Whether the job goes to a peer as soon as one has room, without waiting at home first.
    pub fn at_once(&self) -> bool {
        matches!(self, Flock::Now | Flock::Only(_))
    }
}

/// A job the home MM flocked to a peer, as it hands it to its peer agent.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlockOrder {
    /// Its id at home.
    pub job: JobId,
    /// The peer cluster it goes to.
    pub peer: String,
    /// When it was sent there (milliseconds since the Unix epoch): a job sent again, after
    /// it came back, is a new submission there.
    pub since_ms: u64,
    /// Its owner's uid at home (the agent looks up the name: the peer maps names, not uids).
    pub uid: u32,
    pub req: JobRequest,
    /// Its submitter's standard input that came since the agent last asked, for the peer
    /// (each piece goes once: storm-submit sends again what the tasks do not acknowledge).
    pub input: Vec<InputPiece>,
}

/// A piece of a flocked job's standard input: its offset in the stream, its bytes (at most
/// [`MAX_INPUT_CHUNK`](crate::messages::MAX_INPUT_CHUNK)), and whether the stream ends after
/// it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct InputPiece {
    pub offset: u64,
    pub data: Vec<u8>,
    pub eof: bool,
}

/// What a peer's agent heard of a flocked job from the peer's MM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum FlockEvent {
    /// The peer's MM took the job, as its job `remote`.
    Accepted { remote: JobId },
    /// It started on the peer's nodes.
    Started {
        ntasks: u32,
        node_names: Vec<String>,
    },
    /// Its tasks' output (the chunk's `job` is the peer's id; the home MM puts its own).
    Output(OutputChunk),
    /// A node of it failed on the peer, which put it back in its own queue.
    Requeued { reason: String },
    /// It ended on the peer.
    Finished(JobOutcome),
    /// The peer will not run it: the reason says why (no such user there, it does not fit,
    /// the peer does not lend to this cluster). The home MM queues it at home again.
    Refused(String),
    /// The peer holds no such job: it gave it up while the home cluster was away (see
    /// `peer_timeout_ms`). The home MM queues it at home again.
    NotHere,
}

/// Events of one flocked job, from the peer `peer`, for the home MM.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FlockUpdate {
    pub peer: String,
    /// The job's id at home.
    pub job: JobId,
    pub events: Vec<FlockEvent>,
}
