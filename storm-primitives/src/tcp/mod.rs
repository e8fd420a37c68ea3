//! Backend `tcp`: every node is its own TCP endpoint, and operations travel along k-ary
//! spanning trees over the destination set.
//!
//! * [`wire`]: frames (length-prefixed, versioned, size-limited).
//! * [`tree`]: the tree shape every node computes for itself.
//! * `conn`: connections, handshake, reader and writer threads.
//! * `xfer`: XFER-AND-SIGNAL as a pipelined broadcast with a two-phase commit.
//! * `caw`: COMPARE-AND-WRITE as a tree reduction serialised at the set's root.
//! * `node`: [`TcpNode`], which ties them together and implements [`crate::Primitives`].
//! * [`peer`]: a member driven by hand, frame by frame, for tests.

pub mod auth;
mod caw;
mod config;
mod conn;
mod node;
pub mod peer;
pub mod tree;
pub mod wire;
mod xfer;

pub use config::{PeerKeys, TcpConfig, WriteCheck};
pub use node::TcpNode;
