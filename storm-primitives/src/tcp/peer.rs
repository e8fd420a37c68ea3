//! A member of a tcp cluster driven by hand, frame by frame.
//!
//! Tests use it to send what no real node would send, or in an order no real node would send
//! it (an origin that commits one transfer while another is still in flight, a peer that
//! lies about its tree), and to watch a real node's answers. It holds the cluster key and
//! speaks the same handshake and framing as [`super::TcpNode`], through the same
//! [`super::auth`] and [`super::wire`] code.

use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpStream};
use std::time::Duration;

use bytes::Bytes;

use super::auth::{ClusterKey, Opener, Protection, Sealer, Transcript, random_bytes};
use super::wire::{
    self, Control, DATA_PREFIX_LEN, Frame, HEADER_LEN, Hello, KIND_DATA, OutFrame, WireError,
};
use crate::layout::Layout;
use crate::nodeset::NodeId;

/// One authenticated connection from a hand-driven node to a real one.
pub struct RawPeer {
    stream: TcpStream,
    sealer: Sealer,
    opener: Opener,
    protection: Protection,
}

/// Who the hand-driven node claims to be, in which cluster.
#[derive(Clone)]
pub struct Membership {
    pub node: NodeId,
    pub cluster_size: u32,
    pub layout: Layout,
    pub key: ClusterKey,
    pub protection: Protection,
    /// The identity key it signs the handshake with, if it has one (see
    /// `TcpConfig::identity`).
    pub identity: Option<ed25519_dalek::SigningKey>,
}

impl RawPeer {
    /// Connects to node `them` at `addr` and completes the handshake as `me.node`.
    pub fn connect(addr: SocketAddr, them: NodeId, me: &Membership) -> Result<Self, String> {
        let mut stream = TcpStream::connect(addr).map_err(|e| format!("connect {addr}: {e}"))?;
        stream.set_nodelay(true).ok();
        stream.set_read_timeout(Some(Duration::from_secs(30))).ok();
        let fingerprint = me.layout.fingerprint();
        let nonce = random_bytes();
        let hello = Hello {
            node: me.node,
            cluster_size: me.cluster_size,
            layout_fingerprint: fingerprint,
            protection: me.protection.code(),
            nonce,
        };
        let handshake = |e: WireError| format!("handshake with node {them}: {e}");
        stream
            .write_all(&OutFrame::control(&Control::Hello(hello)).to_vec())
            .map_err(|e| e.to_string())?;
        let (their_nonce, proof) =
            match wire::read_frame(&mut stream, wire::MAX_CONTROL_LEN).map_err(handshake)? {
                Frame::Control(Control::Challenge { nonce, proof }) => (nonce, proof),
                other => return Err(format!("node {them} answered the hello with {other:?}")),
            };
        let t = Transcript::new(
            me.node,
            them,
            me.cluster_size,
            fingerprint,
            me.protection,
            &nonce,
            &their_nonce,
        );
        if !t.verify(&me.key, &proof, true) {
            return Err(format!("node {them} did not prove it holds the key"));
        }
        if let Some(identity) = &me.identity {
            use ed25519_dalek::Signer;
            let sig = identity.sign(&t.identity_message()).to_bytes().to_vec();
            stream
                .write_all(&OutFrame::control(&Control::Identify(sig)).to_vec())
                .map_err(|e| e.to_string())?;
        }
        stream
            .write_all(&OutFrame::control(&Control::Proof(t.client_proof(&me.key))).to_vec())
            .map_err(|e| e.to_string())?;
        match wire::read_frame(&mut stream, wire::MAX_CONTROL_LEN).map_err(handshake)? {
            Frame::Control(Control::HelloAck) => {}
            other => return Err(format!("node {them} answered the proof with {other:?}")),
        }
        let session = t.session(&me.key, me.protection, true);
        Ok(Self {
            stream,
            sealer: session.sealer,
            opener: session.opener,
            protection: me.protection,
        })
    }

    /// Seals and sends one frame.
    pub fn send(&mut self, frame: &OutFrame) -> std::io::Result<()> {
        let (body, tag) = self.sealer.seal(frame.head(), frame.body.clone());
        let mut out = frame.head().to_vec();
        out.extend_from_slice(&body);
        out.extend_from_slice(&tag);
        self.stream.write_all(&out)
    }

    pub fn send_control(&mut self, msg: &Control) -> std::io::Result<()> {
        self.send(&OutFrame::control(msg))
    }

    /// Reads and checks the next frame from the real node.
    pub fn recv(&mut self) -> Result<Frame, String> {
        let mut head = [0u8; HEADER_LEN + DATA_PREFIX_LEN];
        wire::read_exact(&mut self.stream, &mut head[..HEADER_LEN]).map_err(|e| e.to_string())?;
        let (kind, len) = wire::parse_header(
            head[..HEADER_LEN].try_into().expect("header length"),
            usize::MAX,
        )
        .map_err(|e| e.to_string())?;
        let head_len = if kind == KIND_DATA {
            HEADER_LEN + DATA_PREFIX_LEN
        } else {
            HEADER_LEN
        };
        wire::read_exact(&mut self.stream, &mut head[HEADER_LEN..head_len])
            .map_err(|e| e.to_string())?;
        let mut body = vec![0u8; len - (head_len - HEADER_LEN)];
        let mut tag = vec![0u8; self.protection.tag_len()];
        self.stream
            .read_exact(&mut body)
            .and_then(|()| self.stream.read_exact(&mut tag))
            .map_err(|e| e.to_string())?;
        self.opener
            .open(&head[..head_len], &mut body, &tag)
            .map_err(|e| e.to_string())?;
        let mut whole = head[HEADER_LEN..head_len].to_vec();
        whole.extend_from_slice(&body);
        wire::decode_body(kind, Bytes::from(whole)).map_err(|e| e.to_string())
    }

    /// The next control message, skipping nothing: anything else is an error.
    pub fn recv_control(&mut self) -> Result<Control, String> {
        match self.recv()? {
            Frame::Control(c) => Ok(c),
            Frame::Data(d) => Err(format!("expected a control message, got data of {}", d.key)),
        }
    }
}

/// A plain TCP connection to `to` from the local address `from` (another loopback address,
/// say, which a node counts as another host): what a test's attacker opens, unauthenticated.
pub fn connect_from(from: Ipv4Addr, to: SocketAddr) -> std::io::Result<TcpStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let SocketAddr::V4(to) = to else {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "connect_from: an IPv4 destination",
        ));
    };
    let sockaddr = |ip: Ipv4Addr, port: u16| libc::sockaddr_in {
        sin_family: libc::AF_INET as libc::sa_family_t,
        sin_port: port.to_be(),
        sin_addr: libc::in_addr {
            s_addr: u32::from_ne_bytes(ip.octets()),
        },
        sin_zero: [0; 8],
    };
    let len = std::mem::size_of::<libc::sockaddr_in>() as libc::socklen_t;
    // SAFETY: a new socket, owned at once; bind and connect get valid sockaddr_in values of
    // the length given.
    unsafe {
        let raw = libc::socket(libc::AF_INET, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0);
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        let fd = OwnedFd::from_raw_fd(raw);
        let src = sockaddr(from, 0);
        if libc::bind(raw, &src as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        let dst = sockaddr(*to.ip(), to.port());
        if libc::connect(raw, &dst as *const _ as *const libc::sockaddr, len) != 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(TcpStream::from(fd))
    }
}
