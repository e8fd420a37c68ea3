//! Peer clusters (docs/federation.md): the cluster file's `[federation]` and `[[peer]]`
//! entries, what two clusters' peer agents say to each other over their link, and what
//! `storm peers` shows.
//!
//! Each pair of clusters shares a key of its own (the *pair key*), named by both sides'
//! `[[peer]] key_file`. It opens only the link between their peer agents (`storm-peer`): it
//! is not either cluster's key, so holding it makes nobody a member of either cluster.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::control::JobRequest;
use crate::flock::FlockEvent;
use crate::messages::JobId;

/// `[federation]`: this cluster's side of its peer links.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FederationSection {
    /// Where this cluster's peer agent takes its peers' links (needed once a `[[peer]]` is
    /// named).
    pub listen: Option<SocketAddr>,
    /// How often the agent tells each peer what it offers, and measures the link's lag (ms).
    pub advertise_ms: u64,
    /// A peer not heard from for this long is down (ms). Jobs flocked to it are then queued
    /// at home again, and jobs it flocked here are cancelled.
    pub peer_timeout_ms: u64,
    /// A queued job that could not start here within this long goes to a peer that offers
    /// room (ms; unset: jobs flock only when they ask, `--flock` or `--clusters`).
    pub flock_after_ms: Option<u64>,
    /// Which peers a `--borrow` job that lacks nodes asks first (Balloc's `--ba--group`):
    /// the one offering the most idle nodes, or the one of highest `[[peer]] priority`.
    pub lenders: LenderOrder,
    /// How long a node borrowed for a job is lent for at most, when the job has no time
    /// limit (ms; with one, the limit and a minute): the node comes home at its end even if
    /// nobody gives it back.
    pub borrow_lease_ms: u64,
    /// A job of this cluster that has waited this long takes back the nodes this cluster lent
    /// on a peer's asking (ms): a cluster lends only what its own queue does not want.
    pub reclaim_after_ms: u64,
    /// How long a borrower has to give back a node its owner calls home (ms): the owner's
    /// agent tells the borrower's at once, the borrower preempts its jobs there with the
    /// owner's reason and gives the node back, and the node comes home at the latest when
    /// this has passed (Condor's vacate). 0: a node called home comes home at once, and the
    /// borrower learns only that its guest went silent.
    pub vacate_ms: u64,
    /// Each node keeps a guest NM started and set up ahead of a lend, for each peer it lends
    /// to, that waits for its node's NM to tell it the lease: a lend then takes the guest's
    /// registration with the borrower, not also its start (docs/federation.md, lending).
    /// On by default. Off: a guest is started when the node is lent (2-3 heartbeat periods
    /// more).
    pub warm_guests: bool,
}

impl Default for FederationSection {
    fn default() -> Self {
        Self {
            listen: None,
            advertise_ms: 1000,
            peer_timeout_ms: 5000,
            flock_after_ms: None,
            lenders: LenderOrder::MostFree,
            borrow_lease_ms: 3_600_000,
            reclaim_after_ms: 500,
            vacate_ms: 5000,
            warm_guests: true,
        }
    }
}

/// The order in which a cluster asks its lenders for nodes (`[federation] lenders`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LenderOrder {
    /// The peer that offers the most idle nodes first.
    #[default]
    MostFree,
    /// The peer of highest `[[peer]] priority` first (ties: the most idle nodes).
    Priority,
}

impl FederationSection {
    pub fn advertise_every(&self) -> Duration {
        Duration::from_millis(self.advertise_ms)
    }

    pub fn peer_timeout(&self) -> Duration {
        Duration::from_millis(self.peer_timeout_ms)
    }

    pub fn vacate_within(&self) -> Duration {
        Duration::from_millis(self.vacate_ms)
    }
}

/// A `[[peer]]`: another cluster, and what each may do with the other.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PeerEntry {
    /// The peer's cluster name (its `[cluster] name`).
    pub name: String,
    /// Where the peer's agent listens (its `[federation] listen`).
    pub address: SocketAddr,
    /// The pair key this cluster and that one share (mode 0600, root's; relative to the
    /// cluster file's directory).
    pub key_file: PathBuf,
    /// This cluster lends to the peer: its idle nodes are offered to it, and its jobs may
    /// run here (Condor's list of pools allowed to run jobs on its machines).
    #[serde(default)]
    pub lend: bool,
    /// This cluster may use the peer: run its jobs there, borrow its nodes (the list of pools
    /// where it may run its own).
    #[serde(default)]
    pub borrow: bool,
    /// The local account that runs the jobs this peer flocks here (Condor's dedicated uid):
    /// with `same_users`, only those whose owner has no account of the same name here.
    /// Unset: such jobs are refused, with the reason.
    #[serde(default)]
    pub flock_user: Option<String>,
    /// The two clusters share their users (one directory of accounts): a job flocked here
    /// from this peer runs as the account of its owner's name, if there is one. Off by
    /// default: the peer's word for who owns a job then reaches no local user's files.
    #[serde(default)]
    pub same_users: bool,
    /// Lending (docs/federation.md): the peer's guest file (its topology, written by its
    /// `storm guest-file`), as this cluster's operator installed it on every node it may lend
    /// to the peer, root's, with the peer's keys beside it (relative to this cluster file's
    /// directory). A lent node's guest NM runs as that file's guest slot for the node
    /// ([`GuestOf`]), taking nothing else from it (`crate::guest_file`). Unset: no node of
    /// this cluster is lent to the peer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub guest_file: Option<PathBuf>,
    /// Borrowing (docs/federation.md): the peer's MM's public key (its `mm.pub`, as this
    /// cluster's operator installed it; relative to this cluster file's directory). A guest
    /// slot of the peer's node is admitted only with a lease grant this key signed: the
    /// lending node's root, who holds the slot's keys, cannot join outside a lease. Needed
    /// for every peer this file names guest slots of.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mm_public_key_file: Option<PathBuf>,
    /// Where this peer comes among lenders under `[federation] lenders = "priority"`
    /// (highest first).
    #[serde(default)]
    pub priority: u32,
}

/// A node lent to a peer cluster: to whom, and until when.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Lease {
    /// The borrowing cluster (a `[[peer]]` this cluster lends to).
    pub peer: String,
    /// When the lease ends (Unix ms): the node's guest NM stops itself then, whatever it
    /// hears, and the node comes home.
    pub until_ms: u64,
    /// Lent because the peer asked, for a job of its own (not by `storm lend`): the peer gives
    /// it back when it no longer needs it, and this cluster takes it back once a job of its
    /// own waits for nodes.
    pub asked: bool,
    /// Called home, and why: the borrower was told, preempts its jobs on the node with this
    /// reason, and gives it back; it comes home then, or at `by_ms` (Unix ms) at the latest.
    pub recall: Option<Recall>,
}

/// A lent node its owner calls home ([`Lease::recall`]).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recall {
    /// Why, as the borrower's users are told (`reclaimed for its job 7, which waits there`).
    pub why: String,
    /// When it comes home whether the borrower gave it back or not (Unix ms).
    pub by_ms: u64,
}

/// One node of a [`PeerMessage::Lent`]: the lender's name of it, and whether it was lent on
/// the borrower's asking ([`Lease::asked`]). Only such a lease ends when the borrower gives
/// the node back, so only such a node is held out of the borrower's allocation once it is
/// given back (an operator's lease runs to its end whatever the borrower says).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LentNode {
    pub node: String,
    pub on_asking: bool,
}

/// One node of a [`PeerMessage::Recall`]: the lender's name of it, and why it is called home.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Recalled {
    pub node: String,
    pub why: String,
}

/// What a guest slot of this cluster's file stands for: node `node` of peer cluster
/// `cluster`, while that cluster lends it here (a `[[node]]` with `guest_of`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GuestOf {
    /// The lending cluster's name (a `[[peer]]` this cluster may borrow from).
    pub cluster: String,
    /// The node's name in the lending cluster's own file.
    pub node: String,
}

/// What an agent tells a peer it lends to, every `advertise_ms` (nothing offered to a peer it
/// does not lend to: only its liveness and the lag).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct Offer {
    /// Nodes idle now (up, not drained, no job).
    pub idle_nodes: u32,
    /// Their CPUs.
    pub idle_cpus: u32,
    /// Nodes in the cluster.
    pub nodes: u32,
    /// Jobs waiting in its own queue: a cluster with a queue of its own offers nothing.
    pub queued: u32,
}

/// What goes over a peer link after its handshake.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum PeerMessage {
    /// The sender's offer to the receiver (`None`: it lends nothing to it), and a token (its
    /// own monotonic clock, µs), which the receiver echoes.
    /// `manager`: the sender's agent reached its own MM this period (a cluster whose MM does
    /// not answer is `down` to its peers, though its agent is alive).
    Advert {
        offer: Option<Offer>,
        manager: bool,
        token: u64,
    },
    /// The receiver's answer to an advert: the token it carried, for the round trip.
    Echo { token: u64 },
    /// Flocking, from the home cluster's agent: every job it has flocked to the receiver now,
    /// each as sent (`since_ms`) with the follower (`epoch`) and number of the last event the
    /// home cluster took of it. A job the receiver runs for the sender that is not listed, or
    /// listed as sent at another time, was withdrawn (cancelled, or queued at home again and
    /// maybe sent again): the receiver cancels it. Sent every `advertise_ms`.
    Want { jobs: Vec<Wanted> },
    /// Flocking, from the home cluster's agent: run this job for user `user` (the owner's
    /// name at home). Sent again every `advertise_ms` until an event of the job comes back.
    Submit {
        job: JobId,
        /// When the home cluster sent it (each sending is a submission of its own).
        since_ms: u64,
        user: String,
        req: Box<JobRequest>,
    },
    /// Flocking, from the agent of the cluster that runs a job to its home cluster's: the
    /// job's events numbered `first`, `first + 1`, … by the follower `epoch` (each may come
    /// twice; a new follower, after that agent restarted, numbers from 1 again).
    Events {
        job: JobId,
        /// The sending of the job the follower runs (its `Submit`'s `since_ms`): events of an
        /// earlier sending are old news once the job was sent again.
        since_ms: u64,
        epoch: u64,
        first: u64,
        events: Vec<FlockEvent>,
    },
    /// Flocking, from the home cluster's agent: a piece of the standard input of its job
    /// `job` (as sent at `since_ms`), from the job's submitter, for the job's tasks. Sent
    /// once; storm-submit sends again what the tasks have not acknowledged (their
    /// acknowledgements come home with the job's output).
    Input {
        job: JobId,
        since_ms: u64,
        piece: crate::flock::InputPiece,
    },
    /// Borrowing, from the agent of a cluster whose `--borrow` jobs lack nodes: lend it up to
    /// `count` of these nodes (names in the receiver's file; those lent to it already count)
    /// for `for_ms`. Sent every `advertise_ms` while the need lasts.
    Borrow {
        nodes: Vec<String>,
        count: u32,
        for_ms: u64,
    },
    /// Borrowing: these nodes, lent to the sender on its asking, are idle there: take them
    /// home.
    GiveBack { nodes: Vec<String> },
    /// Borrowing, the lender's answer to a `Borrow`: which of the nodes asked for are lent to
    /// the borrower now (their guests are on their way, or up), and how.
    Lent { nodes: Vec<LentNode> },
    /// Borrowing, from a lender's agent to its borrower's: the owner calls these lent nodes
    /// home, each for the reason given. The borrower preempts its jobs on them with that
    /// reason and gives them back. Sent every `advertise_ms` until they are home.
    Recall { nodes: Vec<Recalled> },
}

/// What a cluster's MM wants of one lender now (its agent passes it on): nodes to borrow,
/// and borrowed nodes to give back.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BorrowOrder {
    pub peer: String,
    /// The lender's names of the nodes it may lend for the jobs waiting (guest slots not up).
    pub want: Vec<String>,
    /// How many of them the jobs need.
    pub count: u32,
    /// The lease asked for (ms).
    pub for_ms: u64,
    /// The lender's names of borrowed nodes idle here, that no waiting job needs.
    pub give_back: Vec<String>,
}

/// One job of a [`PeerMessage::Want`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Wanted {
    pub job: JobId,
    /// When the home cluster sent it: its `Submit`'s.
    pub since_ms: u64,
    /// The follower whose events the home cluster took, and the number of the last one.
    pub epoch: u64,
    pub taken: u64,
}

/// A peer's state, as this cluster's agent sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PeerState {
    /// Both links up: the peer hears this cluster and this cluster hears it.
    Up,
    /// Not heard from within `peer_timeout_ms`, or its link is not up yet.
    Down,
    /// Its agent refused this cluster's link, or this cluster refused its link (a key that
    /// does not match, a name not listed): see the reason.
    Refused,
}

impl PeerState {
    pub fn as_str(self) -> &'static str {
        match self {
            PeerState::Up => "up",
            PeerState::Down => "down",
            PeerState::Refused => "refused",
        }
    }
}

/// One peer, as `storm peers` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PeerInfo {
    pub name: String,
    pub address: SocketAddr,
    pub state: PeerState,
    /// This cluster lends to it; may use it.
    pub lend: bool,
    pub borrow: bool,
    /// What it offers this cluster (its last advert; `None`: it lends nothing to this one,
    /// or has said nothing yet).
    pub offer: Option<Offer>,
    /// The link's round trip, at the last echo (µs).
    pub lag_us: Option<u64>,
    /// How long ago it was last heard from (ms).
    pub heard_ms_ago: Option<u64>,
    /// Why it is down or refused.
    pub reason: Option<String>,
}

/// Checks the `[[peer]]` entries against this cluster's name and `[federation]`: names
/// unique and not this cluster's, a listen address once there is a peer.
pub fn validate(cluster: &str, fed: &FederationSection, peers: &[PeerEntry]) -> Result<(), String> {
    let mut names = std::collections::BTreeSet::new();
    for p in peers {
        if p.name.is_empty() || p.name.contains(['/', ' ', '"']) {
            return Err(format!(
                "peer name {:?}: a cluster name without / \" or spaces",
                p.name
            ));
        }
        if p.name == cluster {
            return Err(format!(
                "[[peer]] {:?} is this cluster's own name: a peer is another cluster",
                p.name
            ));
        }
        if !names.insert(p.name.as_str()) {
            return Err(format!("[[peer]] {:?} is named twice", p.name));
        }
        if p.guest_file.is_some() && !p.lend {
            return Err(format!(
                "[[peer]] {:?} names a guest_file but does not lend (lend = true): its guests \
                 would have no node to run on",
                p.name
            ));
        }
    }
    if !peers.is_empty() && fed.listen.is_none() {
        return Err(
            "the cluster file names peers but no [federation] listen: set where this cluster's \
             peer agent takes its peers' links"
                .into(),
        );
    }
    // A peer is down after the timeout without a word; a job flocked here is given up after
    // half of it without a report of this cluster's own agent, which reports every
    // advertise_ms: at least two reports fit in that half.
    if fed.advertise_ms == 0 || fed.peer_timeout_ms < 4 * fed.advertise_ms {
        return Err(format!(
            "[federation] peer_timeout_ms ({}) must be at least four times advertise_ms ({}), \
             which must not be 0",
            fed.peer_timeout_ms, fed.advertise_ms
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(name: &str) -> PeerEntry {
        PeerEntry {
            name: name.into(),
            address: "127.0.0.1:7100".parse().unwrap(),
            key_file: "c1.pair".into(),
            lend: true,
            borrow: false,
            flock_user: None,
            same_users: false,
            guest_file: None,
            mm_public_key_file: None,
            priority: 0,
        }
    }

    #[test]
    fn peers_are_other_clusters_named_once_with_a_listen_address() {
        let listening = FederationSection {
            listen: Some("127.0.0.1:7101".parse().unwrap()),
            ..Default::default()
        };
        assert!(validate("c0", &listening, &[peer("c1"), peer("c2")]).is_ok());
        let e = validate("c0", &listening, &[peer("c0")]).unwrap_err();
        assert!(e.contains("own name"), "{e}");
        let e = validate("c0", &listening, &[peer("c1"), peer("c1")]).unwrap_err();
        assert!(e.contains("twice"), "{e}");
        let e = validate("c0", &FederationSection::default(), &[peer("c1")]).unwrap_err();
        assert!(e.contains("[federation] listen"), "{e}");
        assert!(validate("c0", &FederationSection::default(), &[]).is_ok());
        let hasty = FederationSection {
            peer_timeout_ms: 1000,
            ..listening
        };
        assert!(validate("c0", &hasty, &[peer("c1")]).is_err());
        // Three reports in the timeout: a job flocked here would be given up after a report
        // and a half.
        let e = validate(
            "c0",
            &FederationSection {
                peer_timeout_ms: 3000,
                ..listening.clone()
            },
            &[peer("c1")],
        )
        .unwrap_err();
        assert!(e.contains("four times advertise_ms"), "{e}");
        let enough = FederationSection {
            peer_timeout_ms: 4000,
            ..listening
        };
        assert!(validate("c0", &enough, &[peer("c1")]).is_ok());
    }
}
