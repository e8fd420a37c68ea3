//! # storm-federation: clusters that share
//!
//! Each cluster runs a peer agent, `storm-peer`, beside its MM. Agents of clusters that
//! name each other as `[[peer]]`s keep links to each other, authenticated and encrypted under
//! a key each pair of clusters shares, and say what each offers the other: idle nodes and
//! CPUs, to the peers a cluster lends to. `storm peers` shows each peer's state, its offer
//! and the link's lag. Jobs flock over the same links: a cluster's queued jobs run on a peer
//! that offered room. docs/federation.md has the trust model and what is still to come
//! (automatic borrowing's gaps).
//!
//! * [`wire`]: the peer link's handshake, over [`storm_cluster::sealed`] frames.
//! * [`table`]: what this agent knows of each peer; pure bookkeeping.
//! * [`agent`]: the agent's threads: the listener, a dialler per peer, the reporter to the
//!   MM.
//! * [`flock`]: flocking: this cluster's jobs passed to peers, and peers' jobs run here.
//! * [`lending`]: borrowing nodes for this cluster's waiting jobs, and lending to peers'.
//!
//! The messages and the cluster file's sections are in [`storm_cluster::federation`], where
//! the MM and `storm` read them too.

pub mod agent;
pub mod flock;
pub mod lending;
pub mod table;
pub mod wire;
