//! Process plumbing shared by the daemons (storm-mm, storm-nm): logging, stop signals and
//! readiness.
//!
//! * Logs go to standard error through `tracing`, filtered by `RUST_LOG` (default `info`).
//!   Colour escapes are written only to a terminal (and never with `NO_COLOR` set): a daemon's
//!   log file or journal holds plain text.
//! * SIGTERM and SIGINT set a flag the daemon's loop watches, so it stops cleanly.
//! * [`notify_ready`] tells a service manager that the daemon is up, with systemd's
//!   `sd_notify` protocol (`READY=1` to the datagram socket in `NOTIFY_SOCKET`): a unit of
//!   `Type=notify` starts its dependents only then, and `storm-submit --local` and
//!   `storm-bench startup` time start-up by it.
//! * [`raise_open_files_limit`] lifts the soft limit on descriptors to the hard one at start
//!   (systemd's default soft limit is 1024), and [`descriptors`] says how many are in use, so
//!   a daemon refuses new work with a clear error before it runs out.

use std::io::IsTerminal;
use std::os::unix::net::UnixDatagram;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// The environment variable naming the service manager's notification socket.
pub const NOTIFY_SOCKET: &str = "NOTIFY_SOCKET";

/// Installs the log subscriber: `RUST_LOG` (default `info`) to standard error, in colour only
/// on a terminal.
pub fn init_logging() {
    let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()),
        )
        .with_writer(std::io::stderr)
        .with_ansi(ansi)
        .init();
}

/// The kernel time slice a daemon asks for when it runs under the normal policy: 100 us,
/// the shortest Linux takes. Under EEVDF (Linux 6.12 and later) a task that wakes with a
/// shorter slice than the one running preempts it at once, rather than when the running
/// task's slice ends (about 3 ms): a node manager woken by a heartbeat while the jobs keep
/// every CPU busy stops and continues them that much sooner, and the nodes' switches stay
/// together. It takes no privilege, and older kernels ignore it. Measured in a 2-node
/// instance as a user at a 32 ms gang quantum: overlap 3.8-5.4 % and co-run 0.83-0.86
/// without, 2.3-2.5 % and 0.89-0.91 with (docs/start.md).
pub const DAEMON_SLICE_NS: u64 = 100_000;

/// Linux's `struct sched_attr` (sched_setattr(2)), as far as SCHED_OTHER uses it.
#[repr(C)]
#[derive(Default)]
struct SchedAttr {
    size: u32,
    policy: u32,
    flags: u64,
    nice: i32,
    priority: u32,
    runtime: u64,
    deadline: u64,
    period: u64,
    util_min: u32,
    util_max: u32,
}

/// Asks for a kernel time slice of `ns` for the calling thread and what it starts from now
/// on (0: the kernel's default), keeping its policy and nice value. Only under the normal
/// policy; a real-time thread is left alone.
pub fn set_slice(ns: u64) -> std::io::Result<()> {
    let mut attr = SchedAttr::default();
    let size = std::mem::size_of::<SchedAttr>() as u32;
    // SAFETY: sched_getattr(2) on the calling thread, into a buffer of `size` bytes.
    if unsafe { libc::syscall(libc::SYS_sched_getattr, 0, &raw mut attr, size, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    if attr.policy != libc::SCHED_OTHER as u32 {
        return Ok(());
    }
    attr.size = size;
    attr.runtime = ns;
    // SAFETY: sched_setattr(2) on the calling thread with the attributes it just read.
    if unsafe { libc::syscall(libc::SYS_sched_setattr, 0, &raw const attr, 0) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Whether this kernel takes a time slice asked for under the normal policy (Linux 6.12 and
/// later; older kernels accept the call and ignore it).
pub fn custom_slices_supported() -> bool {
    let Ok(release) = std::fs::read_to_string("/proc/sys/kernel/osrelease") else {
        return false;
    };
    let mut parts = release.split(|c: char| !c.is_ascii_digit());
    let major: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    let minor: u32 = parts.next().and_then(|p| p.parse().ok()).unwrap_or(0);
    (major, minor) >= (6, 12)
}

/// The calling thread's kernel time slice in nanoseconds, as `/proc/thread-self/sched`
/// shows it (`None` where the kernel does not say).
pub fn current_slice_ns() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/thread-self/sched").ok()?;
    text.lines().find_map(|l| {
        l.strip_prefix("se.slice")?
            .split(':')
            .nth(1)?
            .trim()
            .parse()
            .ok()
    })
}

/// Puts the calling thread, and every thread it starts from now on, under SCHED_FIFO at
/// `priority`, as `[scheduler] daemon_rt_priority` asks; call it before the daemon starts
/// its threads. Without the privilege it warns and leaves the policy as it is. Under the
/// normal policy (priority 0, or without the privilege) it asks for [`DAEMON_SLICE_NS`].
pub fn set_rt_priority(priority: u8) {
    if priority == 0 {
        short_slice();
        return;
    }
    let param = libc::sched_param {
        sched_priority: priority.into(),
    };
    // SAFETY: sched_setscheduler on the calling thread with a valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_FIFO, &param) } != 0 {
        tracing::warn!(
            priority,
            "cannot run under SCHED_FIFO ({}: it needs root or CAP_SYS_NICE); running under \
             the normal policy, so on busy nodes heartbeats wait for the tasks' kernel time \
             slices and gang-scheduled jobs can run at once for milliseconds per switch \
             (set [scheduler] daemon_rt_priority = 0 to choose this and silence this warning)",
            std::io::Error::last_os_error()
        );
        short_slice();
    } else {
        tracing::info!(priority, "running under SCHED_FIFO");
    }
}

/// [`DAEMON_SLICE_NS`] for the calling thread, or a debug line saying why not.
fn short_slice() {
    if let Err(e) = set_slice(DAEMON_SLICE_NS) {
        tracing::debug!("keeping the kernel's time slice: {e}");
    }
}

/// Puts the calling thread under the normal policy, whatever it inherited: a warm guest NM
/// started by a real-time NM, which takes real-time priority only once it is lent.
pub fn set_normal_priority() {
    let param = libc::sched_param { sched_priority: 0 };
    // SAFETY: sched_setscheduler on the calling thread with a valid parameter.
    if unsafe { libc::sched_setscheduler(0, libc::SCHED_OTHER, &param) } != 0 {
        tracing::warn!(
            "cannot leave the real-time policy: {}",
            std::io::Error::last_os_error()
        );
    }
}

/// Puts process `pid` (its main thread) under SCHED_FIFO at `priority`. `passed_on`: whether
/// what it starts from then on inherits it. A launcher started before its NM took real-time
/// priority gets it without (`false`: SCHED_RESET_ON_FORK, as [`children_run_normal`]
/// leaves a launcher started real-time); a lent warm guest NM, still setting up, with.
/// Nothing for priority 0.
pub fn set_rt_priority_of(pid: u32, priority: u8, passed_on: bool) -> std::io::Result<()> {
    if priority == 0 {
        return Ok(());
    }
    let param = libc::sched_param {
        sched_priority: priority.into(),
    };
    let policy = if passed_on {
        libc::SCHED_FIFO
    } else {
        libc::SCHED_FIFO | libc::SCHED_RESET_ON_FORK
    };
    // SAFETY: sched_setscheduler of another process with a valid parameter.
    if unsafe { libc::sched_setscheduler(pid as libc::pid_t, policy, &param) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// Keeps the calling thread's policy, but a real-time one is no longer passed on: whatever it
/// starts from now on runs under the normal policy (SCHED_RESET_ON_FORK), with the kernel's
/// own time slice (a daemon's short one, [`DAEMON_SLICE_NS`], is dropped). A launcher started
/// by a real-time NM calls this first, so that it starts tasks promptly on busy nodes while
/// the tasks themselves never run real-time.
pub fn children_run_normal() -> std::io::Result<()> {
    // A daemon's short slice is not the tasks' either: the kernel's own from here on (the
    // launcher's work is not on a gang switch's path).
    let _ = set_slice(0);
    // SAFETY: sched_getscheduler and sched_getparam on the calling thread.
    let policy = unsafe { libc::sched_getscheduler(0) };
    if policy < 0 {
        return Err(std::io::Error::last_os_error());
    }
    if policy != libc::SCHED_FIFO && policy != libc::SCHED_RR {
        return Ok(());
    }
    let mut param = libc::sched_param { sched_priority: 0 };
    // SAFETY: as above, with a valid pointer; then setting the same policy and priority.
    unsafe {
        if libc::sched_getparam(0, &mut param) != 0
            || libc::sched_setscheduler(0, policy | libc::SCHED_RESET_ON_FORK, &param) != 0
        {
            return Err(std::io::Error::last_os_error());
        }
    }
    Ok(())
}

/// A flag that SIGTERM and SIGINT set.
pub fn stop_flag() -> std::io::Result<Arc<AtomicBool>> {
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGTERM, signal_hook::consts::SIGINT] {
        signal_hook::flag::register(sig, stop.clone())?;
    }
    Ok(stop)
}

/// CLOCK_MONOTONIC in nanoseconds: comparable between the processes of one machine (the
/// clock of the NMs' switch and heartbeat logs).
pub fn monotonic_ns() -> u128 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .expect("CLOCK_MONOTONIC is always available on Linux");
    t.tv_sec() as u128 * 1_000_000_000 + t.tv_nsec() as u128
}

/// CLOCK_MONOTONIC in microseconds.
pub fn monotonic_usec() -> u64 {
    (monotonic_ns() / 1_000) as u64
}

/// Raises this process's soft limit on open descriptors to its hard limit; returns the limit
/// now in force.
pub fn raise_open_files_limit() -> u64 {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    match getrlimit(Resource::RLIMIT_NOFILE) {
        Ok((soft, hard)) if soft < hard => match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => hard,
            Err(e) => {
                tracing::warn!("cannot raise the open files limit from {soft} to {hard}: {e}");
                soft
            }
        },
        Ok((soft, _)) => soft,
        Err(_) => 1024,
    }
}

/// Descriptors this process has open, and the most it may (the soft limit in force now).
pub fn descriptors() -> (u64, u64) {
    use nix::sys::resource::{Resource, getrlimit};
    let open = std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count() as u64);
    let limit = getrlimit(Resource::RLIMIT_NOFILE).map_or(1024, |(soft, _)| soft);
    (open, limit)
}

/// The groups of user `uid` (with `gid` as primary), as `initgroups` would set them: what a
/// root daemon gives a process or thread that acts as the user.
pub fn user_groups(uid: libc::uid_t, gid: libc::gid_t) -> Vec<libc::gid_t> {
    let primary = nix::unistd::Gid::from_raw(gid);
    let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
        .ok()
        .flatten()
        .and_then(|u| std::ffi::CString::new(u.name).ok());
    match name {
        Some(name) => nix::unistd::getgrouplist(&name, primary).unwrap_or_else(|_| vec![primary]),
        None => vec![primary],
    }
    .into_iter()
    .map(|g| g.as_raw())
    .collect()
}

/// Wall-clock time, milliseconds since the Unix epoch (0 if the clock is set before it):
/// what the journal records and what an NM says about its start.
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// The message [`notify_ready`] sends: ready, by whom, and when (`MONOTONIC_USEC`, as
/// systemd's protocol spells CLOCK_MONOTONIC), so a listener can time start-up exactly
/// however late it reads the message.
pub fn ready_message(pid: u32, monotonic_usec: u64) -> String {
    format!("READY=1\nMAINPID={pid}\nMONOTONIC_USEC={monotonic_usec}\n")
}

/// A daemon's readiness, as [`parse_ready`] reads it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    pub pid: u32,
    /// When it was sent, if the message says (CLOCK_MONOTONIC microseconds).
    pub monotonic_usec: Option<u64>,
}

/// Tells the service manager in `NOTIFY_SOCKET`, if any, that this daemon is ready. A path
/// starting with `@` is a Linux abstract socket, as systemd allows. It never blocks (a
/// listener that does not read its socket must not stall the daemon), and failing to notify
/// is logged, never fatal: the daemon serves either way.
pub fn notify_ready() {
    let Some(target) = std::env::var_os(NOTIFY_SOCKET) else {
        return;
    };
    let msg = ready_message(std::process::id(), monotonic_usec());
    if let Err(e) = send_notification(&target, &msg) {
        tracing::warn!(
            socket = %target.to_string_lossy(),
            "cannot tell the service manager that this daemon is ready: {e}"
        );
    }
}

fn send_notification(target: &std::ffi::OsStr, msg: &str) -> std::io::Result<()> {
    use std::os::unix::ffi::OsStrExt;
    let sock = UnixDatagram::unbound()?;
    // A datagram socket's queue is short (10 messages by default): a full one must not make
    // the daemon wait.
    sock.set_nonblocking(true)?;
    let bytes = target.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(msg.as_bytes(), &addr)?;
    } else {
        sock.send_to(msg.as_bytes(), std::path::Path::new(target))?;
    }
    Ok(())
}

/// Who says it is ready (`MAINPID=`) and when (`MONOTONIC_USEC=`), if the message says
/// `READY=1` and names its process.
pub fn parse_ready(msg: &[u8]) -> Option<Ready> {
    let text = std::str::from_utf8(msg).ok()?;
    let mut ready = false;
    let mut pid = None;
    let mut monotonic_usec = None;
    for line in text.lines() {
        match line.split_once('=') {
            Some(("READY", "1")) => ready = true,
            Some(("MAINPID", p)) => pid = p.trim().parse().ok(),
            Some(("MONOTONIC_USEC", t)) => monotonic_usec = t.trim().parse().ok(),
            _ => {}
        }
    }
    Some(Ready {
        pid: pid.filter(|_| ready)?,
        monotonic_usec,
    })
}

/// How a daemon's `main` ends: success, or its error in one line (`NAME: error: ...`, the
/// causes of an `anyhow` chain and the lines of a multi-line message joined by "; "), with no
/// backtrace whatever `RUST_BACKTRACE` says: an operator reads it in the journal.
pub fn exit_status<E: std::fmt::Display>(
    name: &str,
    result: Result<(), E>,
) -> std::process::ExitCode {
    match result {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("{name}: error: {}", one_line(&format!("{e:#}")));
            std::process::ExitCode::FAILURE
        }
    }
}

/// `text` with its non-empty lines, trimmed, joined by "; ".
fn one_line(text: &str) -> String {
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    /// A thread under the normal policy gets the short slice it asks for, without
    /// privilege, passes it to the threads it starts, and gets the kernel's default back;
    /// where the kernel shows no slice the test says so.
    #[test]
    fn a_thread_takes_a_short_slice_and_gives_it_back() {
        std::thread::spawn(|| {
            let Some(before) =
                super::current_slice_ns().filter(|_| super::custom_slices_supported())
            else {
                eprintln!("NOT TESTED: this kernel takes no time slice under the normal policy");
                return;
            };
            super::set_slice(super::DAEMON_SLICE_NS).unwrap();
            assert_eq!(super::current_slice_ns(), Some(super::DAEMON_SLICE_NS));
            let child = std::thread::spawn(super::current_slice_ns).join().unwrap();
            assert_eq!(child, Some(super::DAEMON_SLICE_NS));
            super::set_slice(0).unwrap();
            assert_eq!(super::current_slice_ns(), Some(before));
        })
        .join()
        .unwrap();
    }

    use super::*;

    #[test]
    fn readiness_reaches_a_notify_socket_and_parses_back() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let listener = UnixDatagram::bind(&path).unwrap();
        let before = monotonic_usec();
        send_notification(path.as_os_str(), &ready_message(4242, monotonic_usec())).unwrap();
        let mut buf = [0u8; 256];
        let n = listener.recv(&mut buf).unwrap();
        let ready = parse_ready(&buf[..n]).unwrap();
        assert_eq!(ready.pid, 4242);
        let at = ready.monotonic_usec.unwrap();
        assert!(
            at >= before && at <= monotonic_usec(),
            "sent between the two readings"
        );
    }

    #[test]
    fn abstract_notify_sockets_work_too() {
        use std::os::linux::net::SocketAddrExt;
        let name = format!("storm-notify-test-{}", std::process::id());
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
        let listener = UnixDatagram::bind_addr(&addr).unwrap();
        send_notification(
            std::ffi::OsStr::new(&format!("@{name}")),
            &ready_message(7, 1),
        )
        .unwrap();
        let mut buf = [0u8; 256];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(parse_ready(&buf[..n]).map(|r| r.pid), Some(7));
    }

    #[test]
    fn a_listener_that_never_reads_does_not_block_the_daemon() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("notify");
        let _listener = UnixDatagram::bind(&path).unwrap();
        let mut refused = 0;
        // Far more than the socket's queue holds.
        for pid in 0..1000 {
            if send_notification(path.as_os_str(), &ready_message(pid, 0)).is_err() {
                refused += 1;
            }
        }
        assert!(refused > 0, "the queue filled up and sending said so");
    }

    #[test]
    fn only_ready_messages_count() {
        assert_eq!(parse_ready(b"STATUS=starting\nMAINPID=5\n"), None);
        assert_eq!(parse_ready(b"READY=1\n"), None, "no pid to attribute it to");
        assert_eq!(
            parse_ready(b"MAINPID=9\nREADY=1"),
            Some(Ready {
                pid: 9,
                monotonic_usec: None
            })
        );
        assert_eq!(parse_ready(&[0xff, 0xfe]), None);
    }
}
