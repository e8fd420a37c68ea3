//! The relay link between a node's `storm-relay` and the one beside the MM: a handshake that
//! proves the cluster key on both sides and the node's identity key on the node's, then
//! frames encrypted and authenticated under per-direction session keys.
//!
//! The handshake reuses the primitives links' proofs and session keys
//! ([`storm_primitives::tcp::auth`]) under a transcript of its own
//! ([`Transcript::relay`]), so nothing said in one kind of handshake proves anything in the
//! other:
//!
//! 1. node → manager: [`NodeHello`] (relay version, node id, fresh nonce), in the clear;
//! 2. manager → node: [`ManagerHello`] (its fresh nonce, its proof of the cluster key);
//! 3. node → manager: [`NodeProof`] (its proof of the cluster key, and its identity key's
//!    signature over the transcript, which the manager checks with the key enrolled for the
//!    node it claims to be).
//!
//! After it, frames are sealed ([`storm_cluster::sealed`]): [`Up`] (node → manager) values,
//! and manager → node one [`Opened`], then control [`Reply`](storm_cluster::control::Reply)
//! values.

use std::io::{Read, Write};

use ed25519_dalek::{Signature, Signer, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};
use storm_cluster::control::Request;
use storm_cluster::messages::ProgramStamp;
pub use storm_cluster::sealed::{Link, SealedReader, SealedWriter, WireError};
use storm_cluster::sealed::{link, recv_plain, send_plain};
use storm_primitives::NodeId;
use storm_primitives::tcp::auth::{ClusterKey, NONCE_LEN, Transcript, random_bytes};

/// The relay link's own version, checked in the handshake. Version 2: the manager side
/// answers [`Up::Open`] with [`Opened`].
pub const RELAY_VERSION: u32 = 2;

/// Bytes of a program in one [`Up::Chunk`].
pub const CHUNK_BYTES: usize = 256 << 10;

/// The node's greeting.
#[derive(Debug, Serialize, Deserialize)]
pub struct NodeHello {
    pub version: u32,
    pub node: NodeId,
    pub nonce: [u8; NONCE_LEN],
}

/// The manager's answer: its nonce and its proof of the cluster key.
#[derive(Debug, Serialize, Deserialize)]
pub struct ManagerHello {
    pub nonce: [u8; NONCE_LEN],
    pub proof: [u8; 32],
}

/// The node's proof of the cluster key and of its identity.
#[derive(Debug, Serialize, Deserialize)]
pub struct NodeProof {
    pub proof: [u8; 32],
    pub signature: Vec<u8>,
}

/// What a node's relay sends up the link.
#[derive(Debug, Serialize, Deserialize)]
pub enum Up {
    /// First, once: the user on the node (from the kernel, `SO_PEERCRED`) and the control
    /// protocol version their command speaks.
    Open {
        uid: u32,
        gid: u32,
        version: u32,
    },
    /// A program the next request brings: what `fstat` said of the user's descriptor, then
    /// its bytes in [`Up::Chunk`]s (none when it is not a regular file).
    Program {
        stamp: ProgramStamp,
        regular: bool,
    },
    Chunk(Vec<u8>),
    /// A control request, as the user's command sent it.
    Request(Request),
}

/// The manager side's answer to [`Up::Open`], before any control [`Reply`](storm_cluster::control::Reply): whether the MM
/// beside it took the user's connection. A node relay that hears [`Opened::NoManager`] tries
/// the next manager-side relay (a replicated MM: only the leader's replica listens).
#[derive(Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum Opened {
    /// The MM took the connection: control replies follow.
    Ready,
    /// No MM listens beside this relay (it is not running, or it is a replica that does not
    /// lead): why, for the user if no relay has one.
    NoManager(String),
    /// The connection is refused for the user (too many connections): said to the user.
    Refused(String),
}

/// The node's side of the handshake, over `r`/`w` (one connected socket), as node `node`
/// of a cluster of `cluster_size` nodes; frames it receives may be `limit` bytes long.
pub fn handshake_as_node<R: Read, W: Write>(
    mut r: R,
    mut w: W,
    key: &ClusterKey,
    node: NodeId,
    cluster_size: u32,
    identity: &SigningKey,
    limit: usize,
) -> Result<Link<R, W>, WireError> {
    let nonce = random_bytes::<NONCE_LEN>();
    send_plain(
        &mut w,
        &NodeHello {
            version: RELAY_VERSION,
            node,
            nonce,
        },
    )?;
    let answer: ManagerHello = recv_plain(&mut r).map_err(|e| match e {
        WireError::Closed => WireError::Refused(
            "the relay beside the machine manager closed the link during the handshake \
             (does it hold this cluster's key, and is this node's identity key enrolled \
             there? its log says which)"
                .into(),
        ),
        other => other,
    })?;
    let t = Transcript::relay(node, cluster_size, &nonce, &answer.nonce);
    if !t.verify(key, &answer.proof, true) {
        return Err(WireError::Refused(
            "the relay beside the machine manager does not hold this cluster's key".into(),
        ));
    }
    let signature = identity.sign(&t.identity_message()).to_bytes().to_vec();
    send_plain(
        &mut w,
        &NodeProof {
            proof: t.client_proof(key),
            signature,
        },
    )?;
    Ok(link(&t, key, true, r, w, limit))
}

/// The manager's side of the handshake: which node connected, and the link. `enrolled`
/// gives the identity key enrolled for a node id (`None`: no such node, or none enrolled).
pub fn handshake_as_manager<R: Read, W: Write>(
    mut r: R,
    mut w: W,
    key: &ClusterKey,
    cluster_size: u32,
    enrolled: impl Fn(NodeId) -> Option<VerifyingKey>,
    limit: usize,
) -> Result<(NodeId, Link<R, W>), WireError> {
    let hello: NodeHello = recv_plain(&mut r)?;
    if hello.version != RELAY_VERSION {
        return Err(WireError::Refused(format!(
            "a node relay speaks relay version {}, this one {RELAY_VERSION}",
            hello.version
        )));
    }
    let node = hello.node;
    let Some(identity) = enrolled(node) else {
        return Err(WireError::Refused(format!(
            "a peer claiming node {node}, which is not in the cluster, has no identity key \
             enrolled here, or is a guest slot (its keys are on another cluster's node: no \
             relay acts from it)"
        )));
    };
    let nonce = random_bytes::<NONCE_LEN>();
    let t = Transcript::relay(node, cluster_size, &hello.nonce, &nonce);
    send_plain(
        &mut w,
        &ManagerHello {
            nonce,
            proof: t.server_proof(key),
        },
    )?;
    let proof: NodeProof = recv_plain(&mut r)?;
    if !t.verify(key, &proof.proof, false) {
        return Err(WireError::Refused(format!(
            "a peer claiming node {node} does not hold this cluster's key"
        )));
    }
    let signature: [u8; 64] = proof.signature.as_slice().try_into().map_err(|_| {
        WireError::Refused(format!(
            "a peer claiming node {node} sent a malformed identity"
        ))
    })?;
    identity
        .verify_strict(&t.identity_message(), &Signature::from_bytes(&signature))
        .map_err(|_| {
            WireError::Refused(format!(
                "a peer claiming node {node} did not prove its identity (its signature does \
                 not hold under the key enrolled for it)"
            ))
        })?;
    Ok((node, link(&t, key, false, r, w, limit)))
}

/// The largest sealed frame either side takes: a control request or reply of the protocol's
/// largest frame, or a program chunk, with room for bincode's framing.
pub const FRAME_LIMIT: usize = storm_cluster::control::MAX_FRAME + 1024;

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::net::UnixStream;
    use storm_cluster::control::Reply;

    fn pair() -> (UnixStream, UnixStream) {
        UnixStream::pair().unwrap()
    }

    fn node_key() -> SigningKey {
        SigningKey::from_bytes(&random_bytes::<32>())
    }

    type NodeSide = Result<Link<UnixStream, UnixStream>, WireError>;
    type ManagerSide = Result<(NodeId, Link<UnixStream, UnixStream>), WireError>;

    /// Runs both sides of a handshake; what each side made of it.
    fn handshake(
        node_cluster_key: &ClusterKey,
        manager_cluster_key: &ClusterKey,
        signing: &SigningKey,
        enrolled: VerifyingKey,
    ) -> (NodeSide, ManagerSide) {
        let (a, b) = pair();
        let node_key = node_cluster_key.clone();
        let signing = signing.clone();
        let node = std::thread::spawn(move || {
            let r = a.try_clone().unwrap();
            handshake_as_node(r, a, &node_key, 3, 8, &signing, FRAME_LIMIT)
        });
        let r = b.try_clone().unwrap();
        let manager = handshake_as_manager(
            r,
            b,
            manager_cluster_key,
            8,
            |n| (n == 3).then_some(enrolled),
            FRAME_LIMIT,
        );
        let node = node.join().unwrap();
        (node, manager)
    }

    #[test]
    fn a_node_with_the_key_and_its_identity_gets_a_sealed_link() {
        let key = ClusterKey::random();
        let id = node_key();
        let (node, manager) = handshake(&key, &key, &id, id.verifying_key());
        let mut node = node.unwrap();
        let (who, mut manager) = manager.unwrap();
        assert_eq!(who, 3);
        node.writer
            .send(&Up::Open {
                uid: 1000,
                gid: 100,
                version: 12,
            })
            .unwrap();
        match manager.reader.recv::<Up>().unwrap() {
            Up::Open { uid, gid, version } => assert_eq!((uid, gid, version), (1000, 100, 12)),
            other => panic!("{other:?}"),
        }
        manager.writer.send(&Reply::Done).unwrap();
        assert_eq!(node.reader.recv::<Reply>().unwrap(), Reply::Done);
    }

    #[test]
    fn a_wrong_cluster_key_or_identity_is_refused_by_name() {
        let key = ClusterKey::random();
        let id = node_key();
        // The node lacks the cluster key: it finds the manager's proof does not hold, and
        // leaves before proving anything.
        let (node, manager) = handshake(&ClusterKey::random(), &key, &id, id.verifying_key());
        let err = node.err().unwrap().to_string();
        assert!(err.contains("does not hold this cluster's key"), "{err}");
        assert!(matches!(manager, Err(WireError::Closed)));
        // The right cluster key, but another node's identity key: the manager names it.
        let (_, manager) = handshake(&key, &key, &node_key(), id.verifying_key());
        let err = manager.err().unwrap().to_string();
        assert!(err.contains("did not prove its identity"), "{err}");
    }
}
