//! The real `storm-pl` against a table the test holds: a launcher whose slot the NM holds
//! (gang scheduling stopped the job before its task existed) does not start the task until
//! the hold is released, then runs it and reports its exit.

use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::process::CommandExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use storm_cluster::messages::RankStatus;
use storm_pl::{PlSpec, PlTable, SlotState, TABLE_FD};

fn wait_for(what: &str, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "timed out: {what}"
        );
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn a_held_launcher_starts_its_task_only_once_released() {
    let dir = tempfile::tempdir().unwrap();
    let marker = dir.path().join("ran");
    let table = PlTable::create(1).unwrap();
    let slot = table.claim().unwrap();
    assert_eq!(table.hold(slot).unwrap(), storm_pl::Hold::Held);
    let spec = PlSpec {
        job: 1,
        rank: 0,
        node: 0,
        slot: slot as u32,
        program: "/usr/bin/touch".into(),
        args: vec![marker.to_str().unwrap().to_string()],
        env: vec![],
        cwd: dir.path().to_path_buf(),
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
    };
    let table_fd = table.fd().as_raw_fd();
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_storm-pl"));
    // The launcher's argument is the pid of the process it dies with (the NM's).
    cmd.arg(std::process::id().to_string())
        .stdin(Stdio::piped());
    // SAFETY: only fcntl and dup2, async-signal-safe, between fork and exec. The table is
    // first copied above 3, as it may be descriptor 3 already (dup2 onto itself would leave
    // it close-on-exec).
    unsafe {
        cmd.pre_exec(move || {
            let high = libc::fcntl(table_fd, libc::F_DUPFD_CLOEXEC, 10);
            if high < 0 || libc::dup2(high, TABLE_FD) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let mut pl = cmd.spawn().unwrap();
    pl.stdin.take().unwrap().write_all(&spec.encode()).unwrap();
    // The launcher has read its spec and checked the program; give it ample time to (wrongly)
    // start the task.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        pl.try_wait().unwrap().is_none(),
        "the launcher ended while held"
    );
    assert!(!marker.exists(), "the task ran while its slot was held");
    assert_eq!(table.state(slot).unwrap(), SlotState::Held);
    table.unhold(slot).unwrap();
    wait_for("the task's exit status", || {
        table.status(slot).unwrap().is_some()
    });
    assert_eq!(table.status(slot).unwrap(), Some(RankStatus::Exited(0)));
    assert!(marker.exists(), "the released task ran");
    assert!(pl.wait().unwrap().success());
}
