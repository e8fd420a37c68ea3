//! Listening on a node's link as any host on the cluster's network could: the TCP payloads
//! that pass, for attack tests (replaying what was seen must achieve nothing).

use std::net::{Ipv4Addr, SocketAddrV4};
use std::os::fd::AsRawFd;
use std::time::{Duration, Instant};

use anyhow::{Result, anyhow};

/// One TCP segment's payload, as seen on the link.
#[derive(Debug, Clone)]
pub struct Segment {
    pub src: SocketAddrV4,
    pub dst: SocketAddrV4,
    pub payload: Vec<u8>,
}

/// The TCP segments with a payload seen on `port` (a link on the bridge of namespace
/// `switch_ns`) during `window`, in order.
pub fn capture(switch_ns: &str, port: &str, window: Duration) -> Result<Vec<Segment>> {
    let (ns, port) = (switch_ns.to_string(), port.to_string());
    std::thread::spawn(move || -> Result<Vec<Segment>> {
        super::delay::enter_netns(&ns)?;
        capture_here(&port, window)
    })
    .join()
    .map_err(|_| anyhow!("the capture thread panicked"))?
}

/// The TCP segments with a payload seen on link `link` of this network namespace (`lo`, say)
/// during `window`, in order (needs root).
pub fn capture_here(link: &str, window: Duration) -> Result<Vec<Segment>> {
    let fd = super::delay::packet_socket(link, false)?;
    let mut buf = vec![0u8; 65_536 + 64];
    let mut seen = Vec::new();
    let until = Instant::now() + window;
    while Instant::now() < until {
        // SAFETY: the buffer is valid for its length.
        let n = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        if n < 0 {
            match std::io::Error::last_os_error().kind() {
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted => continue,
                e => return Err(anyhow!("capturing on {link}: {e}")),
            }
        }
        seen.extend(tcp_segment(&buf[..n as usize]));
    }
    Ok(seen)
}

/// The TCP segment in an Ethernet frame, if it is one with a payload.
fn tcp_segment(frame: &[u8]) -> Option<Segment> {
    const ETHERTYPE_IPV4: u16 = 0x0800;
    let ethertype = u16::from_be_bytes(frame.get(12..14)?.try_into().ok()?);
    if ethertype != ETHERTYPE_IPV4 {
        return None;
    }
    let ip = frame.get(14..)?;
    let ihl = usize::from(ip.first()? & 0x0f) * 4;
    let total = usize::from(u16::from_be_bytes(ip.get(2..4)?.try_into().ok()?));
    if *ip.get(9)? != 6 || ihl < 20 {
        return None;
    }
    // A segment the kernel has not split yet (GSO) has no total length of its own.
    let end = if total == 0 {
        ip.len()
    } else {
        total.min(ip.len())
    };
    let addr = |at: usize| -> Option<Ipv4Addr> {
        let b: [u8; 4] = ip.get(at..at + 4)?.try_into().ok()?;
        Some(Ipv4Addr::from(b))
    };
    let tcp = ip.get(ihl..end)?;
    let port = |at: usize| -> Option<u16> {
        Some(u16::from_be_bytes(tcp.get(at..at + 2)?.try_into().ok()?))
    };
    let data_offset = usize::from(tcp.get(12)? >> 4) * 4;
    let payload = tcp.get(data_offset..)?;
    if payload.is_empty() {
        return None;
    }
    Some(Segment {
        src: SocketAddrV4::new(addr(12)?, port(0)?),
        dst: SocketAddrV4::new(addr(16)?, port(2)?),
        payload: payload.to_vec(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tcp_payload_is_found_in_its_frame_and_other_frames_are_not() {
        let mut frame = vec![0u8; 12];
        frame.extend(0x0800u16.to_be_bytes());
        let mut ip = vec![
            0x45, 0, 0, 0, 0, 0, 0, 0, 64, 6, 0, 0, 10, 200, 0, 1, 10, 200, 0, 3,
        ];
        let mut tcp = vec![0u8; 20];
        tcp[..2].copy_from_slice(&40000u16.to_be_bytes());
        tcp[2..4].copy_from_slice(&7000u16.to_be_bytes());
        tcp[12] = 5 << 4;
        tcp.extend(b"STRM");
        let total = (ip.len() + tcp.len()) as u16;
        ip[2..4].copy_from_slice(&total.to_be_bytes());
        frame.extend(&ip);
        frame.extend(&tcp);
        let s = tcp_segment(&frame).unwrap();
        assert_eq!(s.src, "10.200.0.1:40000".parse().unwrap());
        assert_eq!(s.dst, "10.200.0.3:7000".parse().unwrap());
        assert_eq!(s.payload, b"STRM");
        // Not TCP, truncated, or without payload: nothing.
        let mut udp = frame.clone();
        udp[14 + 9] = 17;
        assert!(tcp_segment(&udp).is_none());
        assert!(tcp_segment(&frame[..30]).is_none());
        assert!(tcp_segment(&frame[..frame.len() - 4]).is_none());
    }
}
