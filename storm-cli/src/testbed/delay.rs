//! A delay line on one node's link, in user space: this kernel has no netem.
//!
//! The node's port (`n<i>`, the switch end of its veth) leaves the bridge. A new veth pair
//! (`n<i>d` and `n<i>b`) takes its place, `n<i>b` on the bridge. A relay in this process reads
//! every frame that arrives on `n<i>` (sent by the node) or on `n<i>d` (sent to it through the
//! bridge) with a packet socket, holds it for the delay, and sends it out the other side, in
//! order. Both directions are delayed, so the node's round trip grows by twice the delay.
//!
//! Frames pass with their virtio-net header (`PACKET_VNET_HDR`): a veth sends TCP segments of up
//! to 64 KiB whose checksum is left to the hardware, and the header lets the kernel finish them
//! on the other side as it would have.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};

/// `linux/if_packet.h`.
const PACKET_VNET_HDR: libc::c_int = 15;
const PACKET_OUTGOING: u8 = 4;
/// Room for a 64 KiB segment and its virtio-net header.
const FRAME_MAX: usize = 65_536 + 64;

/// A running delay line; dropping it stops the relay (the namespace's links stay as they are
/// until the testbed deletes them).
#[derive(Debug)]
pub struct DelayLine {
    delay_us: Arc<AtomicU64>,
    stop: Arc<AtomicBool>,
    threads: Vec<JoinHandle<()>>,
}

impl DelayLine {
    /// Puts a delay line between `port` (a link on the bridge `br0` of namespace `switch_ns`)
    /// and the bridge.
    pub fn insert(switch_ns: &str, port: &str, delay: Duration) -> Result<Self> {
        let (near, far) = (format!("{port}d"), format!("{port}b"));
        let ip = |args: &[&str]| super::ip(&[&["-n", switch_ns][..], args].concat());
        ip(&["link", "add", &near, "type", "veth", "peer", "name", &far])?;
        ip(&["link", "set", &far, "master", "br0", "up"])?;
        ip(&["link", "set", &near, "promisc", "on", "up"])?;
        ip(&["link", "set", port, "nomaster"])?;
        ip(&["link", "set", port, "promisc", "on", "up"])?;
        let (node_side, bridge_side) = {
            let ns = switch_ns.to_string();
            let (port, near) = (port.to_string(), near.clone());
            std::thread::spawn(move || -> Result<(OwnedFd, OwnedFd)> {
                enter_netns(&ns)?;
                Ok((packet_socket(&port, true)?, packet_socket(&near, true)?))
            })
            .join()
            .map_err(|_| anyhow::anyhow!("the delay line's set-up thread panicked"))??
        };
        let delay_us = Arc::new(AtomicU64::new(delay.as_micros() as u64));
        let stop = Arc::new(AtomicBool::new(false));
        let (node_side, bridge_side) = (Arc::new(node_side), Arc::new(bridge_side));
        let mut threads = Vec::new();
        for (from, to) in [
            (node_side.clone(), bridge_side.clone()),
            (bridge_side, node_side),
        ] {
            let (tx, rx) = crossbeam_channel::unbounded::<(Instant, Vec<u8>)>();
            let (delay_us, stop) = (delay_us.clone(), stop.clone());
            threads.push(std::thread::spawn(move || {
                read_frames(&from, &delay_us, &stop, &tx)
            }));
            threads.push(std::thread::spawn(move || send_frames(&to, &rx)));
        }
        Ok(Self {
            delay_us,
            stop,
            threads,
        })
    }

    /// Delays frames read from now on by `delay` (each direction).
    pub fn set_delay(&self, delay: Duration) {
        self.delay_us
            .store(delay.as_micros() as u64, Ordering::Relaxed);
    }
}

impl Drop for DelayLine {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
    }
}

/// Moves this thread into the network namespace `ns` (made by `ip netns add`).
pub(super) fn enter_netns(ns: &str) -> Result<()> {
    let path = format!("/var/run/netns/{ns}");
    let file = std::fs::File::open(&path).with_context(|| format!("opening {path}"))?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET)
        .with_context(|| format!("entering network namespace {ns}"))
}

/// A packet socket that takes and sends whole frames on `link`, virtio-net header first if
/// `vnet_header`.
pub(super) fn packet_socket(link: &str, vnet_header: bool) -> Result<OwnedFd> {
    let proto = (libc::ETH_P_ALL as u16).to_be();
    // SAFETY: plain socket(2); the descriptor is owned at once.
    let fd = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW, proto as libc::c_int) };
    if fd < 0 {
        bail!("packet socket: {}", std::io::Error::last_os_error());
    }
    // SAFETY: `fd` is a new descriptor that nothing else owns.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let name = std::ffi::CString::new(link)?;
    // SAFETY: a NUL-terminated name.
    let index = unsafe { libc::if_nametoindex(name.as_ptr()) };
    if index == 0 {
        bail!("no link {link}: {}", std::io::Error::last_os_error());
    }
    let one: libc::c_int = vnet_header.into();
    let timeout = libc::timeval {
        tv_sec: 0,
        tv_usec: 100_000,
    };
    // SAFETY: setsockopt with values of the sizes given.
    let set = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_PACKET,
            PACKET_VNET_HDR,
            (&one as *const libc::c_int).cast(),
            size_of::<libc::c_int>() as libc::socklen_t,
        ) == 0
            && libc::setsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&timeout as *const libc::timeval).cast(),
                size_of::<libc::timeval>() as libc::socklen_t,
            ) == 0
    };
    if !set {
        bail!("packet socket options: {}", std::io::Error::last_os_error());
    }
    // SAFETY: an all-zero sockaddr_ll is valid; the fields that matter are set below.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = libc::AF_PACKET as u16;
    addr.sll_protocol = proto;
    addr.sll_ifindex = index as i32;
    // SAFETY: binds to an address of the size given.
    let bound = unsafe {
        libc::bind(
            fd.as_raw_fd(),
            (&addr as *const libc::sockaddr_ll).cast(),
            size_of::<libc::sockaddr_ll>() as libc::socklen_t,
        )
    };
    if bound != 0 {
        bail!("binding to {link}: {}", std::io::Error::last_os_error());
    }
    Ok(fd)
}

/// Reads the frames that arrive on `fd` (not those sent from it) and queues each with the
/// time it is due, until told to stop or the link goes away.
fn read_frames(
    fd: &OwnedFd,
    delay_us: &AtomicU64,
    stop: &AtomicBool,
    tx: &crossbeam_channel::Sender<(Instant, Vec<u8>)>,
) {
    let mut buf = vec![0u8; FRAME_MAX];
    while !stop.load(Ordering::Relaxed) {
        // SAFETY: an all-zero sockaddr_ll is valid for recvfrom to fill.
        let mut from: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
        let mut len = size_of::<libc::sockaddr_ll>() as libc::socklen_t;
        // SAFETY: the buffer and address are valid for the sizes given.
        let n = unsafe {
            libc::recvfrom(
                fd.as_raw_fd(),
                buf.as_mut_ptr().cast(),
                buf.len(),
                0,
                (&mut from as *mut libc::sockaddr_ll).cast(),
                &mut len,
            )
        };
        if n < 0 {
            match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => continue,
                _ => return,
            }
        }
        if from.sll_pkttype == PACKET_OUTGOING {
            continue;
        }
        let due = Instant::now() + Duration::from_micros(delay_us.load(Ordering::Relaxed));
        if tx.send((due, buf[..n as usize].to_vec())).is_err() {
            return;
        }
    }
}

/// Sends each queued frame out of `fd` once it is due.
fn send_frames(fd: &OwnedFd, rx: &crossbeam_channel::Receiver<(Instant, Vec<u8>)>) {
    while let Ok((due, frame)) = rx.recv() {
        let now = Instant::now();
        if due > now {
            std::thread::sleep(due - now);
        }
        // SAFETY: sends the bytes of `frame`. A frame the link refuses is lost, as on a wire.
        unsafe {
            libc::send(fd.as_raw_fd(), frame.as_ptr().cast(), frame.len(), 0);
        }
    }
}
