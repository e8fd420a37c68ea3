//! A daemon's handshake, driven by hand: what a process without the key can try.

use std::io::Write;
use std::net::{SocketAddr, TcpStream};
use std::time::Duration;

use storm_primitives::tcp::wire::{Control, Frame, Hello, OutFrame, read_frame};

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
        other => panic!("a proof is answered by an ack or a refusal: {other:?}"),
    };
    (was_refused, p)
}
