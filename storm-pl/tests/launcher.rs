//! The real `storm-pl` against a table and a link the test holds, as the NM would hold them:
//! one launcher serves several tasks, keeps a task whose slot is held until released, ends a
//! cancelled one without starting it, tells the user why a task could not start, and takes
//! its tasks with it when the NM goes.

use std::io::Read;
use std::os::fd::AsRawFd;
use std::os::unix::net::UnixStream;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use storm_cluster::messages::RankStatus;
use storm_pl::request::Outbox;
use storm_pl::{Cancel, Hold, LINK_FD, PlSpec, PlTable, SlotState, TABLE_FD};

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

/// A launcher serving `table`, and the NM's end of its link.
fn launcher(table: &PlTable) -> (Child, Outbox) {
    let (nm, pl) = UnixStream::pair().unwrap();
    let places = [
        (table.fd().as_raw_fd(), TABLE_FD),
        (pl.as_raw_fd(), LINK_FD),
    ];
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_storm-pl"));
    // The launcher's argument is the pid of the process it dies with (the NM's).
    cmd.arg(std::process::id().to_string());
    // SAFETY: only fcntl and dup2, async-signal-safe, between fork and exec. Each source is
    // first copied above 4, as it may sit on a target number already.
    unsafe {
        cmd.pre_exec(move || {
            let mut high = [0; 2];
            for (i, (from, _)) in places.iter().enumerate() {
                high[i] = libc::fcntl(*from, libc::F_DUPFD_CLOEXEC, 10);
                if high[i] < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            for (i, (_, to)) in places.iter().enumerate() {
                if libc::dup2(high[i], *to) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    let child = cmd.spawn().unwrap();
    (child, Outbox::new(nm).unwrap())
}

fn spec(slot: usize, cwd: &Path, program: &str, args: &[&str]) -> PlSpec {
    PlSpec {
        job: 1,
        rank: slot as u32,
        node: 0,
        slot: slot as u32,
        program: program.into(),
        args: args.iter().map(Into::into).collect(),
        env: vec![("PATH".into(), "/usr/bin:/bin".into())],
        cwd: cwd.to_path_buf(),
        uid: nix::unistd::geteuid().as_raw(),
        gid: nix::unistd::getegid().as_raw(),
        cgroups: Vec::new(),
        output_file: None,
        error_file: None,
        stdin: false,
    }
}

/// Waits for the launcher to take every request sent.
fn sent(link: &mut Outbox) {
    assert!(
        link.flush_within(Duration::from_secs(20)).unwrap(),
        "the launcher took no request for 20 s"
    );
}

/// Asks the launcher to start `spec` and gives back what the task writes to its standard
/// output and error, read to the end (on a thread).
fn start(link: &mut Outbox, spec: &PlSpec) -> std::thread::JoinHandle<(String, String)> {
    let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).unwrap();
    let (mut out_r, mut err_r) = (std::fs::File::from(out_r), std::fs::File::from(err_r));
    link.start(spec, out_w, err_w, None, None).unwrap();
    sent(link);
    std::thread::spawn(move || {
        let (mut out, mut err) = (String::new(), String::new());
        out_r.read_to_string(&mut out).unwrap();
        err_r.read_to_string(&mut err).unwrap();
        (out, err)
    })
}

#[test]
fn one_launcher_runs_several_tasks_and_reports_each_exit() {
    let dir = tempfile::tempdir().unwrap();
    let table = PlTable::create(4).unwrap();
    let (mut pl, mut link) = launcher(&table);
    let mut outputs = Vec::new();
    for code in 0..3 {
        let slot = table.claim().unwrap();
        let script = format!("echo out {code}; echo err {code} >&2; pwd; exit {code}");
        outputs.push((
            slot,
            code,
            start(
                &mut link,
                &spec(slot, dir.path(), "/bin/sh", &["-c", &script]),
            ),
        ));
    }
    for (slot, code, output) in outputs {
        wait_for("the task's exit status", || {
            table.status(slot).unwrap().is_some()
        });
        assert_eq!(table.status(slot).unwrap(), Some(RankStatus::Exited(code)));
        let (started, exited) = table.times(slot).unwrap();
        assert!(
            started.is_some() && exited >= started,
            "{started:?} {exited:?}"
        );
        let (out, err) = output.join().unwrap();
        assert_eq!(
            out,
            format!("out {code}\n{}\n", dir.path().display()),
            "its output, in its working directory"
        );
        assert_eq!(err, format!("err {code}\n"));
    }
    // A task killed by a signal reports the signal.
    let slot = table.claim().unwrap();
    let _ = start(
        &mut link,
        &spec(slot, dir.path(), "/bin/sh", &["-c", "kill -TERM $$"]),
    );
    wait_for("the task's exit status", || {
        table.status(slot).unwrap().is_some()
    });
    assert_eq!(table.status(slot).unwrap(), Some(RankStatus::Signaled(15)));
    drop(link);
    assert!(
        pl.wait().unwrap().success(),
        "the launcher ends with the link"
    );
}

#[test]
fn a_held_task_starts_only_once_released_and_a_cancelled_one_never() {
    let dir = tempfile::tempdir().unwrap();
    let marker = |name: &str| dir.path().join(name);
    let table = PlTable::create(2).unwrap();
    let (mut pl, mut link) = launcher(&table);

    let held = table.claim().unwrap();
    assert_eq!(table.hold(held).unwrap(), Hold::Held);
    let touch = |slot, name: &str| {
        spec(
            slot,
            dir.path(),
            "/usr/bin/touch",
            &[marker(name).to_str().unwrap()],
        )
    };
    let _ = start(&mut link, &touch(held, "held"));
    let cancelled = table.claim().unwrap();
    assert_eq!(table.hold(cancelled).unwrap(), Hold::Held);
    let _ = start(&mut link, &touch(cancelled, "cancelled"));
    // Ample time for the launcher to (wrongly) start them.
    std::thread::sleep(Duration::from_millis(300));
    assert!(
        !marker("held").exists(),
        "the task ran while its slot was held"
    );
    assert_eq!(table.state(held).unwrap(), SlotState::Held);

    assert_eq!(table.cancel(cancelled, 9).unwrap(), Cancel::Cancelled);
    table.unhold(held).unwrap();
    link.look().unwrap();
    sent(&mut link);
    wait_for("the released task's exit", || {
        table.is_settled(held).unwrap()
    });
    assert_eq!(table.status(held).unwrap(), Some(RankStatus::Exited(0)));
    assert!(marker("held").exists(), "the released task ran");
    wait_for("the cancelled task's end", || {
        table.is_settled(cancelled).unwrap()
    });
    assert_eq!(
        table.status(cancelled).unwrap(),
        Some(RankStatus::Signaled(9))
    );
    assert!(!marker("cancelled").exists(), "the cancelled task ran");
    drop(link);
    assert!(pl.wait().unwrap().success());
}

#[test]
fn a_task_that_cannot_start_says_why_on_its_standard_error() {
    let dir = tempfile::tempdir().unwrap();
    let plain = dir.path().join("plain.txt");
    std::fs::write(&plain, "not a program").unwrap();
    let table = PlTable::create(4).unwrap();
    let (_pl, mut link) = launcher(&table);
    let cases = [
        (
            spec(0, dir.path(), "/no/such/program", &[]),
            127,
            "cannot execute /no/such/program on node 0: No such file or directory",
        ),
        (
            spec(1, dir.path(), plain.to_str().unwrap(), &[]),
            126,
            "Permission denied",
        ),
        (
            spec(2, Path::new("/no/such/dir"), "/bin/true", &[]),
            127,
            "cannot use working directory /no/such/dir on node 0: No such file or directory",
        ),
    ];
    for (spec, code, message) in cases {
        let slot = table.claim().unwrap();
        assert_eq!(slot, spec.slot as usize);
        let (_, err) = start(&mut link, &spec).join().unwrap();
        assert!(err.contains(message), "{message:?} not in {err:?}");
        assert!(
            err.starts_with(&format!("storm-pl: rank {slot}: ")),
            "{err}"
        );
        wait_for("the status", || table.is_settled(slot).unwrap());
        assert_eq!(table.status(slot).unwrap(), Some(RankStatus::Exited(code)));
    }
}

/// A batch script's output and error go to the files it names, which its own process
/// opens with its user's rights: relative to its working directory, created or truncated;
/// standard error joins standard output unless given a file of its own; nothing goes to the
/// NM's pipes. A file the user may not write is refused with the reason.
#[test]
fn a_batch_scripts_files_are_opened_by_the_task_as_its_user() {
    let dir = tempfile::tempdir().unwrap();
    let table = PlTable::create(4).unwrap();
    let (_pl, mut link) = launcher(&table);
    let script = "echo to-out; echo to-err >&2";
    std::fs::write(dir.path().join("old.out"), "x".repeat(100)).unwrap();
    let mut both = spec(0, dir.path(), "/bin/sh", &["-c", script]);
    both.output_file = Some("old.out".into());
    let mut split = spec(1, dir.path(), "/bin/sh", &["-c", script]);
    split.output_file = Some("split.out".into());
    split.error_file = Some(dir.path().join("split.err"));
    for spec in [&both, &split] {
        let slot = table.claim().unwrap();
        let (out, err) = start(&mut link, spec).join().unwrap();
        assert_eq!(
            (out.as_str(), err.as_str()),
            ("", ""),
            "nothing on the pipes"
        );
        wait_for("the status", || table.is_settled(slot).unwrap());
        assert_eq!(table.status(slot).unwrap(), Some(RankStatus::Exited(0)));
    }
    let read = |name: &str| std::fs::read_to_string(dir.path().join(name)).unwrap();
    assert_eq!(
        read("old.out"),
        "to-out\nto-err\n",
        "truncated, then both streams"
    );
    assert_eq!(read("split.out"), "to-out\n");
    assert_eq!(read("split.err"), "to-err\n");

    let mut nowhere = spec(2, dir.path(), "/bin/true", &[]);
    nowhere.output_file = Some("no/such/dir/out".into());
    let slot = table.claim().unwrap();
    let (_, err) = start(&mut link, &nowhere).join().unwrap();
    let want = format!(
        "cannot open the output file {}/no/such/dir/out on node 0 as uid",
        dir.path().display()
    );
    assert!(err.contains(&want), "{err}");
    wait_for("the status", || table.is_settled(slot).unwrap());
    assert_eq!(table.status(slot).unwrap(), Some(RankStatus::Exited(127)));

    if !nix::unistd::geteuid().is_root() {
        eprintln!("NOT TESTED: the file opened with the user's rights: needs root");
        return;
    }
    // Root's launcher, a task of user nobody: the file in root's private directory is
    // refused, because the task opens it, not the launcher.
    let mut theirs = spec(3, Path::new("/"), "/bin/true", &[]);
    theirs.uid = 65534;
    theirs.gid = 65534;
    theirs.output_file = Some(dir.path().join("root-only.out"));
    let slot = table.claim().unwrap();
    let (_, err) = start(&mut link, &theirs).join().unwrap();
    assert!(err.contains("as uid 65534: Permission denied"), "{err}");
    assert!(!dir.path().join("root-only.out").exists());
    wait_for("the status", || table.is_settled(slot).unwrap());
}

/// The voluntary context switches of process `pid` so far: how often it went to sleep.
fn wake_ups(pid: u32) -> u64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    status
        .lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .and_then(|n| n.trim().parse().ok())
        .expect("voluntary_ctxt_switches in /proc/PID/status")
}

/// The state letter of process `pid` (`R`, `S`, `T`, `Z`...), or `None` once it is gone.
fn process_state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit(") ").next()?.chars().next()
}

/// A launcher serving `table` that has started `sleep 300` in one of its slots: the launcher,
/// the NM's end of its link, the slot and the task's pid.
fn launcher_with_a_sleeping_task(table: &PlTable) -> (Child, Outbox, usize, i32) {
    let dir = tempfile::tempdir().unwrap();
    let (pl, mut link) = launcher(table);
    let slot = table.claim().unwrap();
    let _ = start(&mut link, &spec(slot, dir.path(), "/bin/sleep", &["300"]));
    wait_for("the task's pid", || table.pid(slot).unwrap().is_some());
    let task = table.pid(slot).unwrap().unwrap();
    (pl, link, slot, task)
}

/// Gang scheduling stops and continues every task each time slice. The launcher, the tasks'
/// parent, must not be woken by that (a SIGCHLD for each), only by their ends.
#[test]
fn stopping_and_continuing_a_task_never_wakes_its_launcher() {
    let table = PlTable::create(1).unwrap();
    let (mut pl, link, slot, task) = launcher_with_a_sleeping_task(&table);
    let group = nix::unistd::Pid::from_raw(task);
    let before = wake_ups(pl.id());
    let switches = 100;
    for _ in 0..switches {
        nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGSTOP).unwrap();
        wait_for("the task to stop", || process_state(task) == Some('T'));
        nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGCONT).unwrap();
        wait_for("the task to go on", || {
            process_state(task).is_some_and(|s| s != 'T')
        });
    }
    let woken = wake_ups(pl.id()) - before;
    assert!(
        woken < switches / 4,
        "the launcher woke {woken} times for {switches} stops and continues of its task"
    );
    // Its end still wakes the launcher, which reports it.
    nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL).unwrap();
    wait_for("the task's exit status", || {
        table.status(slot).unwrap().is_some()
    });
    assert_eq!(table.status(slot).unwrap(), Some(RankStatus::Signaled(9)));
    drop(link);
    assert!(pl.wait().unwrap().success());
}

#[test]
fn a_killed_launcher_takes_its_tasks_with_it() {
    let table = PlTable::create(1).unwrap();
    let (mut pl, _link, _, task) = launcher_with_a_sleeping_task(&table);
    pl.kill().unwrap();
    pl.wait().unwrap();
    // Gone, or a zombie waiting for whoever inherited it to reap it.
    wait_for("the task to die with its launcher", || {
        matches!(process_state(task), None | Some('Z'))
    });
}
