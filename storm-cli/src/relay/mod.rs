//! `storm-relay`: how users on the compute nodes reach the machine manager, whose control
//! socket is a Unix socket on its own host (as slurmctld is reached from every node, with
//! munge saying who asks).
//!
//! * [`node`]: `storm-relay --node NAME`, on each node. It takes local users' connections on
//!   `[relay] socket` (which jobs' tasks get as `STORM_SOCKET`, so a batch script's
//!   `storm-submit` runs its step through it), learns who each user is from the kernel
//!   (`SO_PEERCRED`), and carries the connection to the manager side over one relay link
//!   per connection. A program sent with a job travels as its bytes and `fstat` stamp.
//! * [`manager`]: `storm-relay --manager`, on the MM's host. It listens on `[relay]
//!   address`, checks each link's handshake, and opens a control connection to the MM for
//!   each, greeting it with `RelayHello`: act for this user of that node. The MM takes that
//!   greeting only from root or its own user.
//! * [`wire`]: the link between them: the cluster key proved both ways, the node's identity
//!   key proved to the manager side, and every frame encrypted and authenticated.
//!
//! The relay belongs to the user tools' layer, as storm-submit does: it moves control
//! requests, never resource-management state, which travels only through the primitives.
//! What the relay trusts, and what root of one node can and cannot do through it, is in
//! docs/security.md ("The control relay").

pub mod manager;
pub mod node;
pub mod wire;

use std::net::TcpStream;
use std::os::fd::AsRawFd;

/// Dead peers are noticed: keepalive probes after 30 s idle, every 10 s, 3 of them.
pub(crate) fn keep_alive(sock: &TcpStream) {
    let set = |level: libc::c_int, name: libc::c_int, value: libc::c_int| {
        // SAFETY: setsockopt on an open socket with a pointer to a live c_int and its size.
        unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                level,
                name,
                (&value as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        }
    };
    set(libc::SOL_SOCKET, libc::SO_KEEPALIVE, 1);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPIDLE, 30);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPINTVL, 10);
    set(libc::IPPROTO_TCP, libc::TCP_KEEPCNT, 3);
    let _ = sock.set_nodelay(true);
}

/// Runs `reload` on a thread of its own each time the process gets SIGHUP, as it comes (not
/// at the next connection).
pub(crate) fn on_sighup(mut reload: impl FnMut() + Send + 'static) -> std::io::Result<()> {
    let mut signals = signal_hook::iterator::Signals::new([signal_hook::consts::SIGHUP])?;
    std::thread::Builder::new()
        .name("storm-relay-sighup".into())
        .spawn(move || {
            for _ in signals.forever() {
                reload();
            }
        })?;
    Ok(())
}

/// How long either side waits for the other's part of a handshake.
pub(crate) const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// Descriptors a relay keeps free of users' connections, for its own files and sockets.
pub(crate) const RESERVE: u64 = 64;

/// Why a new connection is refused for want of descriptors, if it is.
pub(crate) fn out_of_descriptors() -> Option<String> {
    let (open, limit) = storm_cluster::daemon::descriptors();
    (open + RESERVE >= limit).then(|| {
        format!(
            "the control relay has {open} of its {limit} file descriptors in use; try again \
             when jobs have ended (an operator can raise its LimitNOFILE)"
        )
    })
}
