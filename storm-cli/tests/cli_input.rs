//! What a user's terminal sees of storm-submit on ordinary input and ordinary endings
//! (issue 33, "A CLI that takes any input"): options it does not know, `--version`, a closed
//! standard output, a second Ctrl-C, and an embedded cluster whose storm-submit is killed.

mod support;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use support::{TestCluster, ensure_all_binaries, ensure_daemons};

/// Longest a test waits for something that should happen within a second or two; reaching
/// it is the failure (a hang), not a measure of speed.
const HANG: Duration = Duration::from_secs(60);

fn submit() -> Command {
    Command::new(env!("CARGO_BIN_EXE_storm-submit"))
}

/// Waits for `child` to exit, at most `limit`; kills it and fails if it does not.
fn exit_within(child: &mut Child, limit: Duration, what: &str) -> ExitStatus {
    let start = Instant::now();
    loop {
        if let Some(status) = child.try_wait().expect("wait") {
            return status;
        }
        if start.elapsed() > limit {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

fn stderr_of(child: &mut Child) -> String {
    let mut s = String::new();
    if let Some(mut e) = child.stderr.take() {
        let _ = e.read_to_string(&mut s);
    }
    s
}

/// Options storm-submit does not have are refused before anything runs, naming the option,
/// instead of being taken for the program's name; the program's own options, after its
/// name or after `--`, are the program's.
#[test]
fn unknown_options_are_errors_and_the_programs_options_are_its_own() {
    ensure_daemons();
    for args in [
        &["--partition=debug", "hostname"][..],
        &["-o", "out.txt", "hostname"],
        &["--array", "1-3", "hostname"],
    ] {
        let out = submit().args(args).output().unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("unexpected argument") && err.contains(args[0].split('=').next().unwrap()),
            "{args:?}: {err}"
        );
        assert!(!err.contains("not found in PATH"), "{args:?}: {err}");
    }
    let c = TestCluster::start(1);
    // `-n` after the program is echo's (no newline), not storm-submit's task count.
    let out = c.submit(&["echo", "-n", "a", "--version"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "a --version");
    let out = c.submit(&["-N", "1", "--", "printf", "%s|", "-x"]);
    assert!(out.status.success(), "{out:?}");
    assert_eq!(String::from_utf8_lossy(&out.stdout), "-x|");
}

/// Every binary says its version, and exits 0.
#[test]
fn every_binary_has_version() {
    ensure_all_binaries();
    let bins = support::bin_dir();
    for bin in [
        "storm-submit",
        "storm",
        "storm-mm",
        "storm-nm",
        "storm-pl",
        "storm-local",
        "storm-testbed",
        "storm-bench",
    ] {
        let out = Command::new(bins.join(bin))
            .arg("--version")
            .output()
            .unwrap_or_else(|e| panic!("{bin}: {e}"));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(out.status.success(), "{bin} --version: {out:?}");
        assert_eq!(
            text.trim(),
            format!("{bin} {}", env!("CARGO_PKG_VERSION")),
            "{bin} --version"
        );
    }
}

/// The embedded clusters' directories under `tmp`.
fn cluster_dirs(tmp: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(tmp)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name()
                        .unwrap()
                        .to_string_lossy()
                        .starts_with("storm-local-")
                })
                .collect()
        })
        .unwrap_or_default()
}

/// `storm-submit ... yes | head -1`: once `head` has its line and closes the pipe, the job is
/// cancelled and storm-submit ends as srun would (128 + SIGPIPE), after stopping its
/// embedded cluster, instead of following the job for ever.
#[test]
fn a_closed_stdout_ends_the_job_and_storm_submit() {
    ensure_daemons();
    let tmp = tempfile::tempdir().unwrap();
    let mut child = Command::new("bash")
        .arg("-c")
        .arg(format!(
            "{} --local 1 yes | head -n 1; echo \"rc=${{PIPESTATUS[0]}}\"",
            env!("CARGO_BIN_EXE_storm-submit")
        ))
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let status = exit_within(&mut child, HANG, "storm-submit | head");
    let mut out = String::new();
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut out)
        .unwrap();
    let err = stderr_of(&mut child);
    assert!(status.success(), "{err}");
    assert_eq!(out, "y\nrc=141\n", "{err}");
    assert!(err.contains("standard output was closed"), "{err}");
    assert!(
        cluster_dirs(tmp.path()).is_empty(),
        "the embedded cluster was not stopped: {:?}",
        cluster_dirs(tmp.path())
    );
}

/// Processes whose parent is `pid`.
fn children_of(pid: u32) -> Vec<u32> {
    let mut kids = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // The fields after the command's closing parenthesis: state, ppid, ...
        let rest = stat.rsplit_once(") ").map(|(_, r)| r).unwrap_or("");
        if rest.split(' ').nth(1).and_then(|s| s.parse().ok()) == Some(pid) {
            kids.push(p);
        }
    }
    kids
}

/// Whether process `pid` still runs (a zombie has ended).
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(") ").map(|(_, r)| !r.starts_with('Z')))
        .unwrap_or(false)
}

/// Processes whose command line contains `marker`.
fn running_with(marker: &str) -> Vec<u32> {
    let mut found = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        if let Ok(cmd) = std::fs::read(format!("/proc/{p}/cmdline"))
            && String::from_utf8_lossy(&cmd).contains(marker)
            && alive(p)
        {
            found.push(p);
        }
    }
    found
}

/// An embedded cluster ends with its storm-submit however storm-submit ends: killed with
/// SIGKILL, its daemons (and the job's tasks) stop by themselves, and the next embedded
/// cluster removes the directory it left.
#[test]
fn an_embedded_cluster_dies_with_its_killed_storm_submit() {
    ensure_daemons();
    let tmp = tempfile::tempdir().unwrap();
    let marker = tmp.path().join("long-task.sh");
    std::fs::write(&marker, "#!/bin/sh\nsleep 600\n").unwrap();
    std::fs::set_permissions(&marker, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let mut child = submit()
        .args(["--local", "2", "-N", "2", "--no-bcast"])
        .arg(&marker)
        .env("TMPDIR", tmp.path())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let marker_s = marker.to_string_lossy().into_owned();
    let start = Instant::now();
    while running_with(&marker_s).len() < 2 {
        assert!(
            start.elapsed() < HANG,
            "the job's tasks did not start: {}",
            stderr_of(&mut child)
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let daemons = children_of(child.id());
    assert!(daemons.len() >= 3, "an MM and two NMs: {daemons:?}");
    child.kill().unwrap();
    child.wait().unwrap();
    let start = Instant::now();
    loop {
        let left: Vec<u32> = daemons.iter().copied().filter(|&p| alive(p)).collect();
        let tasks = running_with(&marker_s);
        if left.is_empty() && tasks.is_empty() {
            break;
        }
        assert!(
            start.elapsed() < HANG,
            "after storm-submit was killed, daemons {left:?} and tasks {tasks:?} still run"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    assert_eq!(
        cluster_dirs(tmp.path()).len(),
        1,
        "the killed one's directory is left"
    );
    let out = submit()
        .args(["--local", "1", "true"])
        .env("TMPDIR", tmp.path())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(
        cluster_dirs(tmp.path()).is_empty(),
        "the abandoned directory was not removed: {:?}",
        cluster_dirs(tmp.path())
    );
}

/// A second Ctrl-C quits at once, as the first one's message says, even while storm-submit
/// waits for a machine manager that does not answer (here, one that is stopped).
#[test]
fn a_second_interrupt_quits_at_once() {
    let c = TestCluster::start(1);
    let mm = c.daemon_pid("storm-mm");
    /// Lets the stopped MM go on however the test ends, so that the cluster can stop.
    struct Stopped(nix::unistd::Pid);
    impl Drop for Stopped {
        fn drop(&mut self) {
            let _ = nix::sys::signal::kill(self.0, nix::sys::signal::Signal::SIGCONT);
        }
    }
    let mm = nix::unistd::Pid::from_raw(mm as i32);
    nix::sys::signal::kill(mm, nix::sys::signal::Signal::SIGSTOP).unwrap();
    let stopped = Stopped(mm);
    let mut child = c.spawn(&["true"]);
    std::thread::sleep(Duration::from_millis(500));
    let pid = nix::unistd::Pid::from_raw(child.id() as i32);
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    std::thread::sleep(Duration::from_millis(200));
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGINT).unwrap();
    let status = exit_within(&mut child, Duration::from_secs(10), "after a second Ctrl-C");
    drop(stopped);
    let err = stderr_of(&mut child);
    assert_eq!(status.code(), Some(130), "{err}");
    assert!(err.contains("interrupted twice"), "{err}");
}

/// A daemon that cannot start says why in one line, without a Rust backtrace, even with
/// `RUST_BACKTRACE` set in its environment.
#[test]
fn daemon_configuration_errors_are_one_line_without_a_backtrace() {
    ensure_daemons();
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("cluster.toml");
    std::fs::write(&bad, "[cluster]\nname = 7\n").unwrap();
    let missing = dir.path().join("missing.toml");
    for (bin, config) in [
        ("storm-mm", &missing),
        ("storm-mm", &bad),
        ("storm-nm", &missing),
        ("storm-nm", &bad),
    ] {
        let out = Command::new(support::bin_dir().join(bin))
            .arg("--config")
            .arg(config)
            .args(if bin == "storm-nm" {
                &["--node", "n0"][..]
            } else {
                &[]
            })
            .env("RUST_BACKTRACE", "1")
            .env("RUST_LOG", "off")
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{bin}: {err}");
        assert_eq!(err.lines().count(), 1, "{bin} {}: {err}", config.display());
        assert!(err.starts_with(&format!("{bin}: error: ")), "{bin}: {err}");
        assert!(
            err.contains(&config.display().to_string()),
            "{bin}: the message names the file: {err}"
        );
        assert!(!err.to_lowercase().contains("backtrace"), "{bin}: {err}");
    }
}

/// Unix hands a program bytes, not UTF-8: a working directory, a variable and an argument in
/// Latin-1 reach the task exactly as they were, and a non-UTF-8 variable that `--export NONE`
/// leaves behind is no reason to fail. storm-submit used to panic (rc 101) on both.
#[test]
fn non_utf8_directory_environment_and_arguments_reach_the_task_byte_for_byte() {
    use std::ffi::OsStr;
    use std::os::unix::ffi::OsStrExt;
    let c = TestCluster::start(1);
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join(OsStr::from_bytes(b"caf\xe9"));
    std::fs::create_dir(&dir).unwrap();
    let value = OsStr::from_bytes(b"\xe9t\xe9");
    let arg = OsStr::from_bytes(b"\xff-arg");
    let mut cmd = c.submit_cmd(&[
        "/bin/sh",
        "-c",
        r#"printf '%s|%s|%s' "$(pwd)" "$LATIN1_TEST" "$1""#,
        "sh",
    ]);
    cmd.arg(arg).env("LATIN1_TEST", value).current_dir(&dir);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = [
        dir.as_os_str().as_bytes(),
        b"|",
        value.as_bytes(),
        b"|",
        arg.as_bytes(),
    ]
    .concat();
    assert_eq!(
        out.stdout,
        want,
        "{:?} != {:?}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&want)
    );

    let mut cmd = c.submit_cmd(&["--export", "NONE", "/bin/echo", "ok"]);
    cmd.env("LATIN1_TEST", value);
    let out = cmd.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"ok\n");
}

/// Runs `storm-submit ARGS` on cluster `c` with `input` as its standard input; fails on a
/// hang.
fn submit_with_stdin(c: &TestCluster, args: &[&str], input: Vec<u8>) -> std::process::Output {
    use std::io::Write;
    let mut child = c
        .submit_cmd(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut stdin = child.stdin.take().unwrap();
    // A job that stops reading makes this writer wait (or fail with a broken pipe once
    // storm-submit is gone); either is the test's business, not a hang of its own.
    let writer = std::thread::spawn(move || {
        let _ = stdin.write_all(&input);
    });
    let mut out = Vec::new();
    let mut stdout = child.stdout.take().unwrap();
    let reader = std::thread::spawn(move || {
        let _ = stdout.read_to_end(&mut out);
        out
    });
    let status = exit_within(&mut child, HANG, &format!("storm-submit {args:?}"));
    let stderr = stderr_of(&mut child);
    let _ = writer.join();
    std::process::Output {
        status,
        stdout: reader.join().unwrap(),
        stderr: stderr.into_bytes(),
    }
}

/// `echo hi | storm-submit cat` prints hi: standard input goes to rank 0 by default, and
/// megabytes of it arrive byte for byte, however often the window fills (storm-submit sends
/// no more than 64 KiB past what the task took).
#[test]
fn standard_input_reaches_rank_0_byte_for_byte() {
    let c = TestCluster::start(2);
    let out = submit_with_stdin(&c, &["cat"], b"hi\n".to_vec());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"hi\n");

    // 3 MiB of bytes that are not text, through a task on the second node of two.
    let data: Vec<u8> = (0..3u32 << 20)
        .map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
        .collect();
    let out = submit_with_stdin(
        &c,
        &[
            "-N",
            "2",
            "-n",
            "2",
            "-i",
            "1",
            "sh",
            "-c",
            "[ $STORM_RANK = 1 ] && cat || true",
        ],
        data.clone(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.stdout == data,
        "{} bytes came back of {}",
        out.stdout.len(),
        data.len()
    );
}

/// `-i all` gives every rank all of the input; `-i none` gives none (the task reads end of
/// file at once); a rank the job does not have is refused before anything runs.
#[test]
fn input_modes_all_none_and_a_rank_out_of_range() {
    let c = TestCluster::start(2);
    let out = submit_with_stdin(
        &c,
        &["-N", "2", "-n", "3", "-i", "all", "-l", "cat"],
        b"x\ny\n".to_vec(),
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_string)
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        ["0: x", "0: y", "1: x", "1: y", "2: x", "2: y"],
        "{lines:?}"
    );

    let out = submit_with_stdin(&c, &["-i", "none", "cat"], b"unread\n".to_vec());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"");

    let out = submit_with_stdin(&c, &["-n", "2", "-i", "5", "cat"], Vec::new());
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("-i 5") && err.contains("2 tasks"), "{err}");
}

/// A job that never reads its input ends when its tasks do, however much input waits: the
/// window stops storm-submit from reading more, and nothing waits on the unread rest.
#[test]
fn a_job_that_never_reads_its_input_ends_all_the_same() {
    let c = TestCluster::start(1);
    let out = submit_with_stdin(&c, &["sleep", "0.5"], vec![b'y'; 8 << 20]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // One that reads a little and stops (closes it) also ends, with what it read.
    let out = submit_with_stdin(&c, &["head", "-c", "5"], vec![b'z'; 8 << 20]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.stdout, b"zzzzz");
}

/// Pipes the node managers of cluster `c` hold open.
fn nm_pipes(c: &TestCluster) -> usize {
    let marker = c.root.to_string_lossy().into_owned();
    running_with(&marker)
        .into_iter()
        .filter(|&p| {
            std::fs::read_to_string(format!("/proc/{p}/comm")).is_ok_and(|c| c.trim() == "storm-nm")
        })
        .flat_map(|p| {
            std::fs::read_dir(format!("/proc/{p}/fd"))
                .into_iter()
                .flatten()
        })
        .flatten()
        .filter(|fd| {
            std::fs::read_link(fd.path()).is_ok_and(|t| t.to_string_lossy().starts_with("pipe:"))
        })
        .count()
}

/// A node lets go of a job's input pipe when the job is gone: jobs that read their input,
/// or stop reading it, leave no descriptor behind in the long-running NM.
#[test]
fn ended_jobs_leave_no_input_pipe_open_in_the_node_manager() {
    let c = TestCluster::start(1);
    let run = |args: &[&str], input: &[u8]| {
        let out = submit_with_stdin(&c, args, input.to_vec());
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&["cat"], b"warm up\n");
    // The node forgets a job at the heartbeat after it ended.
    std::thread::sleep(Duration::from_millis(500));
    let before = nm_pipes(&c);
    assert!(before > 0, "the NM was found (it holds its own pipes)");
    for _ in 0..3 {
        run(&["cat"], b"read all\n");
        run(&["head", "-c", "1"], &[b'x'; 200_000]);
        run(&["true"], b"never read\n");
    }
    std::thread::sleep(Duration::from_millis(500));
    let after = nm_pipes(&c);
    assert!(
        after <= before,
        "the NM held {before} pipes, and {after} after nine more jobs"
    );
}
