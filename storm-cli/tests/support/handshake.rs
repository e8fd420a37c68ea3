//! A daemon's handshake, driven by hand: what a process without the key can try.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use storm_cluster::config::ClusterConfig;
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
