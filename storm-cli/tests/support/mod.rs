//! Real daemons on loopback for integration tests: an embedded cluster (storm-mm, storm-nm,
//! storm-pl as processes), and helpers to run storm-submit and storm against it.

#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::Once;

use storm_cli::local::{LocalCluster, LocalOptions};

pub mod handshake;
pub mod mpi;
pub mod testbed;

/// The directory holding the workspace's binaries (target/debug).
pub fn bin_dir() -> PathBuf {
    Path::new(env!("CARGO_BIN_EXE_storm-submit"))
        .parent()
        .unwrap()
        .to_path_buf()
}

static BUILD: Once = Once::new();

/// `LD_LIBRARY_PATH` without what `cargo test` added to it (the target directory's and the
/// toolchain's library directories). storm-primitives' build script reads the variable (the
/// libfabric loader does), so building the daemons under the test's value would rebuild them,
/// and the next `cargo` run outside a test would rebuild them again.
fn library_path_outside_cargo() -> Option<std::ffi::OsString> {
    let target = bin_dir()
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default();
    let kept: Vec<_> =
        std::env::split_paths(&std::env::var_os("LD_LIBRARY_PATH").unwrap_or_default())
            .filter(|p| !p.starts_with(&target) && !p.to_string_lossy().contains("/lib/rustlib/"))
            .collect();
    (!kept.is_empty())
        .then(|| std::env::join_paths(kept).ok())
        .flatten()
}

/// Makes sure the daemons are built and current (a plain `cargo test -p storm-cli` builds only
/// this package's binaries, and a stale daemon would test old code).
///
/// It builds every library and binary of the workspace (`--workspace --lib --bins`): the
/// dependencies' features are then unified as for `cargo test --workspace`, whose build is
/// fresh for it, so CI's test run pays only for the binaries `cargo test` leaves out (those of
/// packages without integration tests: storm-bench, storm-peer). Building the daemons' four
/// packages alone (`-p`) unified the features differently and compiled much of the
/// workspace again: two and a half minutes of CI, in each of its two test phases.
pub fn ensure_daemons() {
    BUILD.call_once(|| {
        let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
        let mut build = Command::new(cargo);
        match library_path_outside_cargo() {
            Some(path) => build.env("LD_LIBRARY_PATH", path),
            None => build.env_remove("LD_LIBRARY_PATH"),
        };
        let status = build
            .args(["build", "--quiet", "--workspace", "--lib", "--bins"])
            .status()
            .expect("running cargo build for the workspace's binaries");
        assert!(status.success(), "building the workspace's binaries failed");
        let dir = bin_dir();
        for b in [
            "storm-mm",
            "storm-nm",
            "storm-pl",
            "storm-pmix",
            "libstorm_pmi.so",
            "storm-bench",
            "storm-peer",
        ] {
            assert!(dir.join(b).is_file(), "{b} is not in {}", dir.display());
        }
    });
    // SAFETY: set once, before any daemon starts; tests only read it.
    unsafe { std::env::set_var("STORM_BIN_DIR", bin_dir()) };
}

/// Makes sure every binary of the workspace (storm-bench and storm-prim-node too) is built
/// and current, besides the daemons: [`ensure_daemons`] builds them all.
pub fn ensure_all_binaries() {
    ensure_daemons();
}

pub struct TestCluster {
    pub cluster: Option<LocalCluster>,
    pub socket: PathBuf,
    pub root: PathBuf,
}

/// CPUs per node of the clusters tests start: fixed, so that what `-n` does is the same on
/// every machine.
pub const TEST_CPUS: u32 = 4;

impl TestCluster {
    /// `nodes` nodes of [`TEST_CPUS`] CPUs.
    pub fn start(nodes: u32) -> Self {
        Self::with(LocalOptions {
            cpus: Some(TEST_CPUS),
            ..LocalOptions::new(nodes)
        })
    }

    pub fn with(opts: LocalOptions) -> Self {
        ensure_daemons();
        let cluster = LocalCluster::start(&opts).expect("start the local cluster");
        let socket = cluster.socket().to_path_buf();
        let root = cluster.root().to_path_buf();
        // Tests submit as other users too (a multi-user machine): they must reach the socket.
        // The key stays private (0600, owned by root).
        std::fs::set_permissions(&root, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("open the cluster directory to other users");
        Self {
            cluster: Some(cluster),
            socket,
            root,
        }
    }

    /// storm-submit with `args` and this cluster's socket, to run as the caller likes.
    pub fn submit_cmd(&self, args: &[&str]) -> Command {
        let mut c = Command::new(env!("CARGO_BIN_EXE_storm-submit"));
        c.arg("--socket").arg(&self.socket).args(args);
        c
    }

    /// Runs storm-submit to completion.
    pub fn submit(&self, args: &[&str]) -> Output {
        self.submit_cmd(args).output().expect("run storm-submit")
    }

    /// Runs storm-submit to completion with these variables added to its environment (which
    /// the job's tasks get).
    pub fn submit_env(&self, env: &[(&str, &str)], args: &[&str]) -> Output {
        let mut c = self.submit_cmd(args);
        c.envs(env.iter().copied());
        c.output().expect("run storm-submit")
    }

    /// Runs storm-submit to completion as user (and group) `uid` (needs root).
    pub fn submit_as(&self, uid: u32, args: &[&str]) -> Output {
        self.submit_cmd_as(uid, args)
            .output()
            .expect("run storm-submit")
    }

    /// storm-submit with `args`, to be run as user (and group) `uid` (needs root).
    pub fn submit_cmd_as(&self, uid: u32, args: &[&str]) -> Command {
        use std::os::unix::process::CommandExt;
        let mut c = self.submit_cmd(args);
        c.uid(uid).gid(uid);
        c
    }

    /// Starts storm-submit without waiting.
    pub fn spawn(&self, args: &[&str]) -> Child {
        self.spawn_env(&[], args)
    }

    /// Starts storm-submit without waiting, with these variables added to its environment.
    pub fn spawn_env(&self, env: &[(&str, &str)], args: &[&str]) -> Child {
        self.submit_cmd(args)
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn storm-submit")
    }

    /// Runs `storm <args>`.
    pub fn storm(&self, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_storm"))
            .arg("--socket")
            .arg(&self.socket)
            .args(args)
            .output()
            .expect("run storm")
    }

    /// Job ids in `storm queue`.
    pub fn queued_jobs(&self) -> Vec<u64> {
        let out = self.storm(&["queue"]);
        String::from_utf8_lossy(&out.stdout)
            .lines()
            .skip(1)
            .filter_map(|l| l.split_whitespace().next()?.parse().ok())
            .collect()
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        if let Some(c) = self.cluster.take() {
            let _ = c.shutdown();
        }
    }
}

/// Says, past the test harness's output capture (so that it shows even when the test passes),
/// that `test` could not run here and why.
pub fn say_not_tested(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr().lock(), "NOT TESTED: {test}: {why}");
}

/// The user and group tests submit as when they need another user than root.
pub const NOBODY: u32 = 65534;

/// Whether this process is root, as `test` needs (to act as another user); says NOT TESTED
/// with the reason when it is not.
pub fn root_or_say(test: &str) -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        say_not_tested(test, "needs root to act as another user");
    }
    root
}

/// Writes an executable shell script into `dir`.
pub fn script(dir: &Path, name: &str, body: &str) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(&p, format!("#!/bin/sh\n{body}")).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// A script `dir/NAME.sh` for a job that is run twice (`--requeue`): its first run marks each
/// rank (`dir/NAME-first.RANK`), says `first run` and sleeps; a later run says `second run on
/// NODE` and ends. Returns the script and the markers' stem (`NAME` must have no dot: each
/// rank's marker is the stem with the rank as its extension).
pub fn rerun_script(dir: &Path, name: &str) -> (PathBuf, PathBuf) {
    let marker = dir.join(format!("{name}-first"));
    let body = format!(
        "if [ -e {m}.$STORM_RANK ]; then echo second run on $STORM_NODENAME; exit 0; fi\n\
         touch {m}.$STORM_RANK\necho first run\nexec sleep 600\n",
        m = marker.display()
    );
    (script(dir, &format!("{name}.sh"), &body), marker)
}

/// A cluster's peer agent (`storm-peer`), killed when dropped.
pub struct Agent(pub Child);

impl Drop for Agent {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The guest file of `borrower` as a lender's operator installs it (docs/federation.md,
/// guest files): its topology and the keys its guests need, written by what `storm
/// guest-file` runs into `borrower`'s directory (`guest-export/`, root's, mode 0755).
/// Returns the file, for the lender's `[[peer]] guest_file`.
pub fn guest_file_of(borrower: &TestCluster) -> PathBuf {
    let cfg = storm_cluster::ClusterConfig::load(&borrower.root.join("cluster.toml")).unwrap();
    let dir = borrower.root.join("guest-export");
    storm_cluster::guest_file::write_guest_dir(&cfg, &dir).expect("write the guest file");
    dir.join("cluster.toml")
}

/// Installs `lender`'s MM public key (its `mm.pub`) at `at`, root's, mode 0644: where a
/// borrower's `[[peer]] mm_public_key_file` names it, to check its guest slots' leases.
pub fn install_lender_key(lender: &TestCluster, at: &Path) {
    let cfg = storm_cluster::ClusterConfig::load(&lender.root.join("cluster.toml")).unwrap();
    std::fs::copy(cfg.mm_key_paths().1, at).expect("copy the lender's mm.pub");
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(at, std::fs::Permissions::from_mode(0o644)).unwrap();
}

/// Starts the peer agent of the cluster file `config`, its log beside it (`*.peer.log`).
pub fn start_agent(config: &Path) -> Agent {
    let log = std::fs::File::create(config.with_extension("peer.log")).unwrap();
    Agent(
        Command::new(bin_dir().join("storm-peer"))
            .arg("--config")
            .arg(config)
            .env("RUST_LOG", "info")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("start storm-peer"),
    )
}

pub fn text(b: &[u8]) -> String {
    String::from_utf8_lossy(b).into_owned()
}

/// Compiles the C program `source` into `dir/name` with `cc` (made executable by everyone);
/// `None`, having said NOT TESTED for `test`, where there is no C compiler.
pub fn compile_c(test: &str, source: &str, dir: &Path, name: &str) -> Option<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let src = dir.join(format!("{name}.c"));
    std::fs::write(&src, source).unwrap();
    let out = dir.join(name);
    match Command::new("cc")
        .arg("-O2")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .output()
    {
        Ok(o) if o.status.success() => {
            std::fs::set_permissions(&out, std::fs::Permissions::from_mode(0o755)).unwrap();
            Some(out)
        }
        Ok(o) => panic!("cc failed on {name}.c: {}", text(&o.stderr)),
        Err(e) => {
            say_not_tested(test, &format!("needs a C compiler (cc): {e}"));
            None
        }
    }
}

/// A temporary directory every user may enter and write (mode 01777), for files tests share
/// with processes of other users.
pub fn shared_tempdir() -> tempfile::TempDir {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o1777)).unwrap();
    dir
}

/// Waits up to `limit` for `path` to exist; false if it never did.
pub fn wait_for_path(path: &Path, limit: std::time::Duration) -> bool {
    let until = std::time::Instant::now() + limit;
    while std::time::Instant::now() < until {
        if path.exists() {
            return true;
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    path.exists()
}

/// Runs `cmd` to completion, or kills it after `limit`: `None` if it had to be killed (a
/// daemon that stopped answering must fail a test, not hang it).
pub fn output_within(mut cmd: Command, limit: std::time::Duration) -> Option<Output> {
    let mut child = cmd
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn");
    let until = std::time::Instant::now() + limit;
    while std::time::Instant::now() < until {
        if child.try_wait().expect("try_wait").is_some() {
            return Some(child.wait_with_output().expect("wait"));
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

impl TestCluster {
    /// Runs `storm <args>`, or gives up after `limit` (`None`).
    pub fn storm_within(&self, args: &[&str], limit: std::time::Duration) -> Option<Output> {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_storm"));
        cmd.arg("--socket").arg(&self.socket).args(args);
        output_within(cmd, limit)
    }

    /// The pid of daemon `name` ("storm-mm", "storm-nm node0") of this cluster.
    pub fn daemon_pid(&self, name: &str) -> u32 {
        self.cluster
            .as_ref()
            .expect("a running cluster")
            .daemon_pids()
            .into_iter()
            .find_map(|(n, p)| (n == name).then_some(p))
            .unwrap_or_else(|| panic!("no daemon {name}"))
    }
}

/// Waits up to `limit` until the file at `log` contains `what` (a storm-submit's standard
/// error, a job's marks).
pub fn wait_for_text(log: &Path, what: &str, limit: std::time::Duration) {
    let deadline = std::time::Instant::now() + limit;
    while !std::fs::read_to_string(log).is_ok_and(|t| t.contains(what)) {
        assert!(
            std::time::Instant::now() < deadline,
            "{} never said {what:?}: {:?}",
            log.display(),
            std::fs::read_to_string(log)
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// A job script in `dir` that prints `lines` numbered lines (`line N`), one every 50 ms,
/// marks each on standard error (`tick N`), and exits 5; its path.
pub fn counter_script(dir: &Path, lines: u32) -> String {
    script(
        dir,
        "counter.sh",
        &format!(
            "i=1\nwhile [ $i -le {lines} ]; do echo line $i; echo tick $i >&2; i=$((i+1)); \
             sleep 0.05; done\nexit 5\n"
        ),
    )
    .display()
    .to_string()
}

/// Waits for a counter job's storm-submit (`child`, run with `-l`) to end: its exit code is the
/// script's (5), and each of its `ranks` printed lines 1..=`n` once and in order. `log` is its
/// standard error, shown when not.
pub fn assert_counter_job_whole(child: std::process::Child, ranks: u32, n: u32, log: &Path) {
    let out = child.wait_with_output().expect("wait for storm-submit");
    assert_eq!(
        out.status.code(),
        Some(5),
        "{}",
        std::fs::read_to_string(log).unwrap_or_default()
    );
    assert_counted_lines(&out, ranks, n, log);
}

/// Waits (up to 20 s) until `leader` names a replica other than `old` as the manager group's
/// leader: which, and how long it took.
pub fn wait_new_leader(
    old: &str,
    leader: impl Fn() -> Option<String>,
) -> (String, std::time::Duration) {
    let started = std::time::Instant::now();
    loop {
        if let Some(l) = leader()
            && l != old
        {
            return (l, started.elapsed());
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(20),
            "no replica took over from {old}"
        );
        std::thread::sleep(std::time::Duration::from_millis(2));
    }
}

/// What a job of [`counter_script`] printed (`out`, labelled by rank with `-l`): each of its
/// `ranks` wrote lines 1..=n, each once and in order. `log` is its storm-submit's standard
/// error, shown when not.
pub fn assert_counted_lines(out: &Output, ranks: u32, n: u32, log: &Path) {
    let all = text(&out.stdout);
    for rank in 0..ranks {
        let prefix = format!("{rank}: ");
        let got: Vec<&str> = all
            .lines()
            .filter_map(|l| l.strip_prefix(&prefix))
            .collect();
        let want: Vec<String> = (1..=n).map(|i| format!("line {i}")).collect();
        assert_eq!(
            got,
            want,
            "rank {rank}: every line once, in order; storm-submit said:\n{}",
            std::fs::read_to_string(log).unwrap_or_default()
        );
    }
}

/// `child`'s output once it ends; if it runs past `limit`, it is killed and what it had
/// printed is the error (a guard against a hang, not a measure of speed).
pub fn ended_within(mut child: Child, limit: std::time::Duration) -> Result<Output, String> {
    let until = std::time::Instant::now() + limit;
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > until {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            return Err(format!(
                "still running after {limit:?}; it had printed:\n{}{}",
                text(&out.stdout),
                text(&out.stderr)
            ));
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    Ok(child.wait_with_output().unwrap())
}

/// Waits up to `limit` until `check` says nothing is missing (`None`); panics with `what` and
/// the last thing `check` said was missing.
pub fn wait_until(
    limit: std::time::Duration,
    what: &str,
    mut check: impl FnMut() -> Option<String>,
) {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let Some(not_yet) = check() else {
            return;
        };
        assert!(
            std::time::Instant::now() < deadline,
            "{what}: not within {limit:?}: {not_yet}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// One HTTP GET with an optional bearer token; the status code.
pub fn scrape(addr: &str, token: Option<&str>) -> u16 {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).expect("connect to the exporter");
    let auth = token.map_or(String::new(), |t| format!("Authorization: Bearer {t}\r\n"));
    write!(
        s,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n{auth}Connection: close\r\n\r\n"
    )
    .unwrap();
    let mut reply = String::new();
    let _ = s.read_to_string(&mut reply);
    reply
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Starts `storm metrics` with `args`; the child and the address it serves (or its error).
pub fn exporter(c: &TestCluster, args: &[&str]) -> (std::process::Child, Result<String, String>) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_storm"))
        .arg("--socket")
        .arg(&c.socket)
        .arg("metrics")
        .args(args)
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let mut first = String::new();
    std::io::BufReader::new(child.stderr.take().unwrap())
        .read_line(&mut first)
        .unwrap();
    let addr = first
        .trim()
        .strip_prefix("storm metrics: serving http://")
        .and_then(|a| a.strip_suffix("/metrics"))
        .map(str::to_string)
        .ok_or(first);
    (child, addr)
}

/// A user of this host made for the tests (`useradd`, a home and /bin/sh), with its uid and
/// gid.
pub fn test_user(name: &str) -> (u32, u32) {
    if nix::unistd::User::from_name(name).ok().flatten().is_none() {
        let made = Command::new("useradd")
            .args(["--create-home", "--shell", "/bin/sh", name])
            .status()
            .expect("useradd");
        assert!(made.success(), "useradd {name}");
    }
    let u = nix::unistd::User::from_name(name).unwrap().unwrap();
    (u.uid.as_raw(), u.gid.as_raw())
}

/// The processes of uid `uid` now: (pid, command name), zombies aside.
pub fn processes_of(uid: u32) -> Vec<(u32, String)> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = entry.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(status) = std::fs::read_to_string(entry.path().join("status")) else {
            continue;
        };
        let owner = status
            .lines()
            .find_map(|l| l.strip_prefix("Uid:"))
            .and_then(|l| l.split_whitespace().next()?.parse::<u32>().ok());
        let name = status
            .lines()
            .find_map(|l| l.strip_prefix("Name:\t"))
            .unwrap_or("")
            .to_string();
        if owner == Some(uid) && !status.contains("State:\tZ") {
            found.push((pid, name));
        }
    }
    found
}

/// What of `uid`'s is left in the temporary directory: `storm start`'s instance and agent
/// directories.
pub fn start_leftovers_of(uid: u32) -> Vec<PathBuf> {
    use std::os::unix::fs::MetadataExt;
    std::fs::read_dir(std::env::temp_dir())
        .unwrap()
        .flatten()
        .filter(|e| {
            let n = e.file_name().to_string_lossy().into_owned();
            n.starts_with("storm-start-") || n.starts_with("storm-agent-")
        })
        .filter(|e| e.metadata().is_ok_and(|m| m.uid() == uid))
        .map(|e| e.path())
        .collect()
}
