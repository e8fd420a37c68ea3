//! A daemon's handshake, driven by hand: what a process without the key can try.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use storm_cli::relay::wire::{self, FRAME_LIMIT, Opened, Up, WireError};
use storm_cluster::config::ClusterConfig;
use storm_cluster::control::{PROTOCOL_VERSION, Reply, Request};
use storm_primitives::tcp::auth::{ClusterKey, Protection, Transcript};
use storm_primitives::tcp::wire::{Control, Frame, Hello, OutFrame, read_frame};

/// Every daemon of the cluster: (node id, address), the MM last.
pub fn daemons(cfg: &ClusterConfig) -> Vec<(u32, SocketAddr)> {
    (0..cfg.node_count())
        .map(|i| (i, cfg.nodes[i as usize].address))
        .chain([(cfg.mm_id(), cfg.mm.address)])
        .collect()
}

/// The proof a connecting node sends, under `key`, for `hello` to node `target` that answered
/// with `server_nonce`.
pub fn client_proof(
    key: &ClusterKey,
    hello: &Hello,
    target: u32,
    server_nonce: [u8; 32],
) -> [u8; 32] {
    Transcript::new(
        hello.node,
        target,
        hello.cluster_size,
        hello.layout_fingerprint,
        Protection::from_code(hello.protection).expect("a known protection"),
        &hello.nonce,
        &server_nonce,
    )
    .client_proof(key)
}

/// Sends `hello`, reads the challenge, answers it with `proof(challenge nonce, server proof)`
/// and says whether the daemon refused.
pub fn handshake(
    addr: SocketAddr,
    hello: &Hello,
    proof: impl FnOnce([u8; 32]) -> [u8; 32],
) -> (bool, [u8; 32]) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.write_all(&OutFrame::control(&Control::Hello(hello.clone())).to_vec())
        .unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let nonce = match read_frame(&mut s, 1 << 20) {
        Ok(Frame::Control(Control::Challenge { nonce, .. })) => nonce,
        other => panic!("a hello as a member would send it is answered by a challenge: {other:?}"),
    };
    let p = proof(nonce);
    s.write_all(&OutFrame::control(&Control::Proof(p)).to_vec())
        .unwrap();
    let was_refused = match read_frame(&mut s, 1 << 20) {
        Ok(Frame::Control(Control::HelloAck)) => false,
        Ok(Frame::Control(Control::HelloReject(why))) => {
            assert_eq!(why, "refused", "a refusal tells nothing more");
            true
        }
        // Accepted, then closed before its ack: the member it claims to be connected again
        // meanwhile, and a member's newer connection closes its older one.
        Err(_) => false,
        other => panic!("a proof is answered by an ack or a refusal: {other:?}"),
    };
    (was_refused, p)
}

/// A `Hello` as node `node` of `cfg` would send it.
pub fn member_hello(cfg: &ClusterConfig, node: u32, nonce: [u8; 32]) -> Hello {
    let rm = storm_cluster::layout::RmLayout::new(cfg).unwrap();
    Hello {
        node,
        cluster_size: cfg.node_count() + 1,
        layout_fingerprint: rm.layout.fingerprint(),
        protection: cfg.protection().code(),
        nonce,
    }
}

/// Opens a relay link to the manager side at `addr` as `member` (node id, cluster size:
/// MM included) with these keys, greets the MM for `uid`, then sends `then` if given;
/// returns the MM's answers (or why the link failed).
pub fn relay_as(
    addr: SocketAddr,
    member: (u32, u32),
    key: ClusterKey,
    identity: ed25519_dalek::SigningKey,
    uid: u32,
    then: Option<Request>,
) -> Result<Vec<Reply>, WireError> {
    let tcp = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    tcp.set_read_timeout(Some(Duration::from_secs(10)))?;
    let mut link = wire::handshake_as_node(
        tcp.try_clone()?,
        tcp,
        &key,
        member.0,
        member.1,
        &identity,
        FRAME_LIMIT,
    )?;
    link.writer.send(&Up::Open {
        uid,
        gid: uid,
        version: PROTOCOL_VERSION,
    })?;
    // The manager side says first whether its MM took the connection.
    match link.reader.recv::<Opened>()? {
        Opened::Ready => {}
        other => return Err(WireError::Refused(format!("{other:?}"))),
    }
    let mut replies = vec![link.reader.recv::<Reply>()?];
    if let Some(req) = then {
        link.writer.send(&Up::Request(req))?;
        replies.push(link.reader.recv::<Reply>()?);
    }
    Ok(replies)
}
