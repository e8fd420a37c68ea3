//! The cluster's own users as attackers (issue 31): root daemons on loopback, an unprivileged
//! user (`nobody`) with jobs of their own, and what that user obtains, seen from outside: the
//! root files they aimed at, other users' jobs, the daemons' answers.

mod support;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::time::Duration;

use support::{NOBODY, TestCluster, exporter, scrape, text};

/// A root-only file an attacker aims at: (path, its content).
fn victim(dir: &std::path::Path) -> (std::path::PathBuf, &'static [u8]) {
    let path = dir.join("victim");
    let content: &'static [u8] = b"root's secret\n";
    std::fs::write(&path, content).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    (path, content)
}

/// Fails unless the victim is as it was: root's, mode 0600, the same bytes.
fn assert_untouched(path: &std::path::Path, content: &[u8], report: &str) {
    let meta = std::fs::symlink_metadata(path).expect("the victim still exists");
    assert!(
        meta.file_type().is_file(),
        "the victim was replaced\n{report}"
    );
    assert_eq!(
        (meta.uid(), meta.gid(), meta.mode() & 0o7777),
        (0, 0, 0o600),
        "the attacker changed the owner or mode of a root-only file\n{report}"
    );
    assert_eq!(
        std::fs::read(path).unwrap(),
        content,
        "the root-only file was written\n{report}"
    );
}

/// A shell script of about `bytes` bytes (padded with a comment) that prints `marker`.
fn padded_script(path: &std::path::Path, bytes: usize, marker: &str) {
    let mut body = format!("#!/bin/sh\necho {marker}\nexit 0\n");
    let line = format!("# {}\n", "x".repeat(1000));
    while body.len() < bytes {
        body.push_str(&line);
    }
    std::fs::write(path, body).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

/// Finding 1: a job owner's task races the NM while it writes that user's next programs into
/// the spool, by every path trick there is (a symlink planted before the file exists, the
/// file swapped for a symlink while it is written, a hard link to a root file, the job
/// directory renamed and replaced by a symlink). On the code before the fix, the NM created,
/// chmodded and chowned by path in a directory the user owned, and a root-only file became
/// the user's. Now every step is refused and the root file is untouched; the programs still
/// arrive whole and run.
#[test]
fn a_job_owner_racing_the_spool_gains_no_root_file() {
    let test = "a_job_owner_racing_the_spool_gains_no_root_file";
    if !support::root_or_say(test) {
        return;
    }
    let work = support::shared_tempdir();
    let Some(attacker) = support::compile_c(
        test,
        include_str!("support/spool_attacker.c"),
        work.path(),
        "attacker",
    ) else {
        return;
    };
    let c = TestCluster::start(1);
    let (victim, content) = victim(&c.root);
    let spool = c.cluster.as_ref().unwrap().config.nodes[0].spool.clone();
    let name = "program";
    let (ready, stop) = (work.path().join("ready"), work.path().join("stop"));
    let spool_arg = spool.display().to_string();
    let victim_arg = victim.display().to_string();
    let ready_arg = ready.display().to_string();
    let stop_arg = stop.display().to_string();
    let attacker_arg = attacker.display().to_string();
    // The attacker is a task of the user's own first job (run in place, not sent), aiming at
    // the directories of the jobs that follow it.
    let running = {
        c.submit_cmd_as(
            NOBODY,
            &[
                "--no-bcast",
                &attacker_arg,
                &spool_arg,
                "1",
                "40",
                name,
                &victim_arg,
                &ready_arg,
                &stop_arg,
            ],
        )
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap()
    };
    assert!(
        support::wait_for_path(&ready, Duration::from_secs(30)),
        "the attacker's job did not start"
    );
    // The user's next programs, of several sizes: the larger, the longer the NM writes.
    let mut runs = Vec::new();
    for (i, mb) in [1usize, 5, 20].into_iter().enumerate() {
        let sub = work.path().join(format!("p{i}"));
        std::fs::create_dir(&sub).unwrap();
        std::fs::set_permissions(&sub, std::fs::Permissions::from_mode(0o755)).unwrap();
        let program = sub.join(name);
        padded_script(&program, mb << 20, "intact");
        let out = c.submit_as(NOBODY, &["--bcast", program.to_str().unwrap()]);
        runs.push((mb, out));
    }
    std::fs::write(&stop, b"").unwrap();
    let out = running.wait_with_output().unwrap();
    let report = text(&out.stdout);
    assert!(
        out.status.success(),
        "the attacker's job failed: {report}{}",
        text(&out.stderr)
    );
    assert_untouched(&victim, content, &report);
    // Not one step of any attack went through: the user cannot add, remove or rename a
    // name in a job directory.
    for line in report.lines().filter(|l| !l.starts_with("rounds=")) {
        let counts: Vec<u64> = line
            .split_whitespace()
            .filter_map(|w| w.split_once('=')?.1.parse().ok())
            .collect();
        assert!(
            counts.iter().all(|&n| n == 0),
            "an attack step succeeded: {line}\n{report}"
        );
    }
    assert!(
        report.contains("rounds=") && !report.contains("rounds=0\n"),
        "the attacker never ran: {report}"
    );
    // And the user's programs arrived whole and ran, the attack notwithstanding.
    for (mb, out) in runs {
        assert!(
            out.status.success() && text(&out.stdout).contains("intact"),
            "the user's {mb} MB program did not run: {}{}",
            text(&out.stdout),
            text(&out.stderr)
        );
    }
}

/// Descriptors the process `pid` has open (read from outside, as root).
fn open_descriptors(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd")).map_or(0, |d| d.count())
}

fn mm_pid(c: &TestCluster) -> u32 {
    c.daemon_pid("storm-mm")
}

/// Finding 6: each waiting job held a descriptor (its program) at the MM, and under
/// systemd's default limit about 1,200 of them used up the MM's descriptors: after that,
/// root's `storm nodes` and every user's submissions failed. Now, under a limit of 200, a
/// user's flood of waiting jobs is refused with a message naming the descriptor limit before
/// the MM runs out; root's `storm nodes` still answers; the waiting jobs hold no descriptor
/// (counted from outside); and they all run once the node frees.
#[test]
fn a_user_cannot_use_up_the_mms_descriptors() {
    let test = "a_user_cannot_use_up_the_mms_descriptors";
    if !support::root_or_say(test) {
        return;
    }
    let c = TestCluster::with(storm_cli::local::LocalOptions {
        cpus: Some(1),
        limits: storm_cluster::config::LimitsSection {
            max_connections_per_user: 10_000,
            max_queued_jobs_per_user: 10_000,
            ..Default::default()
        },
        ..storm_cli::local::LocalOptions::new(1)
    });
    let work = support::shared_tempdir();
    let program = support::script(work.path(), "waiter", "exit 0\n");
    // The node is busy, so every job of the flood waits.
    let blocker = c.spawn(&["--exclusive", "/bin/sleep", "300"]);
    let since = std::time::Instant::now();
    while !text(&c.storm(&["queue"]).stdout).contains("running") {
        assert!(since.elapsed() < Duration::from_secs(30), "no job started");
        std::thread::sleep(Duration::from_millis(20));
    }
    let mm = mm_pid(&c);
    let limit = 200u64;
    let rl = libc::rlimit {
        rlim_cur: limit,
        rlim_max: limit,
    };
    // SAFETY: prlimit on another process with a valid rlimit and no old-limit pointer.
    let set = unsafe { libc::prlimit(mm as i32, libc::RLIMIT_NOFILE, &rl, std::ptr::null_mut()) };
    assert_eq!(set, 0, "prlimit: {}", std::io::Error::last_os_error());
    let base = open_descriptors(mm);
    let flood: Vec<std::process::Child> = (0..120)
        .map(|_| {
            use std::os::unix::process::CommandExt;
            std::process::Command::new(env!("CARGO_BIN_EXE_storm-submit"))
                .arg("--socket")
                .arg(&c.socket)
                .arg(&program)
                .uid(NOBODY)
                .gid(NOBODY)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    // Until every submitter is either waiting with its job queued or gone.
    let since = std::time::Instant::now();
    let mut flood = flood;
    let mut refused = Vec::new();
    loop {
        let mut i = 0;
        while i < flood.len() {
            if flood[i].try_wait().unwrap().is_some() {
                let out = flood.swap_remove(i).wait_with_output().unwrap();
                refused.push(text(&out.stderr));
            } else {
                i += 1;
            }
        }
        let queue = c
            .storm_within(&["queue"], Duration::from_secs(10))
            .expect("root's `storm queue` did not answer within 10 s during the flood");
        // Every job but the one running.
        let queued = text(&queue.stdout)
            .lines()
            .filter(|l| {
                l.split_whitespace()
                    .next()
                    .is_some_and(|w| w.parse::<u64>().is_ok())
            })
            .count()
            .saturating_sub(1);
        if queued + refused.len() >= 120 || since.elapsed() > Duration::from_secs(90) {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    // Root's view still answers.
    let nodes = c
        .storm_within(&["nodes"], Duration::from_secs(10))
        .expect("root's `storm nodes` did not answer within 10 s during the flood");
    assert!(
        nodes.status.success(),
        "root's `storm nodes` failed during the flood: {}",
        text(&nodes.stderr)
    );
    // What was refused said why.
    assert!(
        !refused.is_empty(),
        "120 waiting submitters fit under 200 descriptors: the test does not reach the limit"
    );
    for e in &refused {
        assert!(
            e.contains("file descriptors in use") && e.contains("LimitNOFILE"),
            "a refused submission does not say which limit it hit: {e}"
        );
    }
    // The waiting jobs hold no descriptor: each live submitter's connection holds three, and
    // nothing else grew.
    std::thread::sleep(Duration::from_millis(500));
    let live = flood.len();
    let now = open_descriptors(mm);
    assert!(
        now <= base + 3 * live + 8,
        "the MM holds {now} descriptors for {live} waiting jobs and their connections \
         ({base} before the flood)"
    );
    // Everything accepted runs once the node frees.
    let cancel = c.storm(&["cancel", "1"]);
    assert!(cancel.status.success(), "{}", text(&cancel.stderr));
    blocker.wait_with_output().unwrap();
    for child in flood {
        let out = child.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "a waiting job did not run: {}",
            text(&out.stderr)
        );
    }
}

/// CPU time (user + system) of process `pid` so far, in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let after = &stat[stat.rfind(')').unwrap() + 2..];
    let fields: Vec<&str> = after.split_whitespace().collect();
    fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap()
}

/// Finding 10: `storm metrics --listen` answered anyone, and every scrape asked the MM afresh
/// (1,737 scrapes a second cost the MM 62 % of a core). Now the exporter listens on loopback
/// unless told otherwise, refuses a public address without a token, asks for the bearer
/// token it was given, and serves a snapshot: a flood of scrapes costs the MM no more CPU
/// than the same flood refused (read from /proc, outside the MM).
#[test]
fn metrics_scrapes_need_the_token_and_cost_the_mm_nothing() {
    let c = TestCluster::start(1);
    // Loopback by default.
    let (mut default, served) = exporter(&c, &["--listen"]);
    let _ = default.kill();
    let _ = default.wait();
    match served {
        Ok(addr) => assert_eq!(addr, "127.0.0.1:9464"),
        Err(e) => assert!(e.contains("cannot listen on 127.0.0.1:9464"), "{e}"),
    }
    // A public address needs a token.
    let out = c.storm(&["metrics", "--listen", "0.0.0.0:0"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("--token-file"),
        "{}",
        text(&out.stderr)
    );
    // With a token, nothing is served without it.
    let work = tempfile::tempdir().unwrap();
    let token_file = work.path().join("token");
    std::fs::write(&token_file, "s3cret-token\n").unwrap();
    std::fs::set_permissions(&token_file, std::fs::Permissions::from_mode(0o600)).unwrap();
    let (mut server, addr) = exporter(
        &c,
        &[
            "--listen",
            "127.0.0.1:0",
            "--token-file",
            token_file.to_str().unwrap(),
            "--refresh-ms",
            "1000",
        ],
    );
    let addr = addr.expect("the exporter serves");
    assert_eq!(scrape(&addr, None), 401);
    assert_eq!(scrape(&addr, Some("s3cret-tokeN")), 401);
    assert_eq!(scrape(&addr, Some("s3cret-token")), 200);
    // A flood of served scrapes, against a flood of refused ones for the same time: both
    // load the machine (this test, the exporter, the kernel) alike, but only a served scrape
    // could reach the MM. (Against an idle window, the flood's contention for the two cores
    // alone cost the MM 11 more ticks in CI: its 1 ms timeslice loop runs slower on a busy
    // machine, whatever the exporter does.)
    let mm = mm_pid(&c);
    let window = Duration::from_secs(2);
    let flood = |token: &str, status: u16| {
        let from = cpu_ticks(mm);
        let until = std::time::Instant::now() + window;
        let mut scrapes = 0;
        while std::time::Instant::now() < until {
            assert_eq!(scrape(&addr, Some(token)), status);
            scrapes += 1;
        }
        (cpu_ticks(mm) - from, scrapes)
    };
    let (refused, refusals) = flood("wrong-token", 401);
    let (served, scrapes) = flood("s3cret-token", 200);
    let hz = nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .unwrap_or(100) as u64;
    // 10 ticks over 2 s is a twentieth of a core: scheduling noise, not work per scrape (asked
    // afresh, 11,000 scrapes would cost the MM seconds of CPU).
    assert!(
        served <= refused + hz / 10,
        "{scrapes} served scrapes in {window:?} cost the MM {served} ticks of CPU against \
         {refused} for {refusals} refused ones ({hz} ticks a second)"
    );
    assert!(scrapes > 100, "only {scrapes} scrapes were made");
    let _ = server.kill();
    let _ = server.wait();
}

/// A second unprivileged user, for attacks whose victim is another user.
const VICTIM: u32 = 1; // "daemon" on Debian

/// Finding 4: a task that sends PMI requests and never reads the answers blocked the NM's one
/// PMI thread, and another user's MPI job on the node got no `init` answer. Now the answers
/// wait in a bounded buffer per task: the flooding job ends, saying why, and the other
/// user's task is answered.
#[test]
fn a_task_that_never_reads_pmi_answers_stalls_no_other_job() {
    let test = "a_task_that_never_reads_pmi_answers_stalls_no_other_job";
    if !support::root_or_say(test) {
        return;
    }
    // One node of two CPUs: both jobs run there.
    let c = TestCluster::with(storm_cli::local::LocalOptions {
        cpus: Some(2),
        ..storm_cli::local::LocalOptions::new(1)
    });
    let work = support::shared_tempdir();
    let flooder = support::script(
        work.path(),
        "flooder",
        "printf 'cmd=init pmi_version=1 pmi_subversion=1\\n' >&4\n\
         yes 'cmd=get_maxes' | head -n 200000 >&4\n\
         sleep 60\n",
    );
    // A well-behaved PMI client: it finalizes before it leaves (since issue 62 a rank that
    // leaves without finalizing fails its job, as under mpirun).
    let asker = support::script(
        work.path(),
        "asker",
        "printf 'cmd=init pmi_version=1 pmi_subversion=1\\n' >&4\n\
         echo \"got: $(timeout 10 head -n 1 <&4)\"\n\
         printf 'cmd=finalize\\n' >&4\n\
         timeout 10 head -n 1 <&4 >/dev/null\n",
    );
    let attack = {
        c.submit_cmd_as(NOBODY, &["--mpi", "pmi1", "--no-bcast"])
            .arg(&flooder)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    // Let the flood fill the task's socket.
    std::thread::sleep(Duration::from_secs(3));
    let victim = {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_storm-submit"));
        cmd.arg("--socket")
            .arg(&c.socket)
            .args(["--mpi", "pmi1", "--no-bcast"])
            .arg(&asker)
            .uid(VICTIM)
            .gid(VICTIM);
        support::output_within(cmd, Duration::from_secs(60)).expect("the victim's job hung")
    };
    let attack = attack.wait_with_output().unwrap();
    assert!(
        victim.status.success() && text(&victim.stdout).contains("got: cmd=response_to_init"),
        "another user's MPI task was not answered: {}{}",
        text(&victim.stdout),
        text(&victim.stderr)
    );
    assert!(
        !attack.status.success() && text(&attack.stderr).contains("does not read the answers"),
        "the flooding job did not end with the reason: {}",
        text(&attack.stderr)
    );
}

/// Finding 3: a user SIGSTOPped their own task's process between its change of user and its
/// exec; the launcher waited for that exec (a `vfork`), and no task of any user started on
/// the node until root stepped in. The attacker here is a task of `nobody` that stops the
/// launcher's new processes the moment they become `nobody`'s (it predicts their process
/// ids), while `nobody` submits jobs. Once it holds one before its exec, another user submits
/// a job to the node: it runs at once (on the old code it waited for as long as the attack
/// lasted), and the held start fails after the task start deadline, with the reason.
#[test]
fn a_user_stopping_their_task_before_exec_stalls_no_other_start() {
    let test = "a_user_stopping_their_task_before_exec_stalls_no_other_start";
    if !support::root_or_say(test) {
        return;
    }
    let work = support::shared_tempdir();
    let Some(stopper) = support::compile_c(
        test,
        include_str!("support/start_stopper.c"),
        work.path(),
        "stopper",
    ) else {
        return;
    };
    // Five CPUs: the attacker's task and the held job's three leave one for the victim, so
    // the victim waits for nothing but the launcher.
    let c = TestCluster::with(storm_cli::local::LocalOptions {
        cpus: Some(5),
        failure: storm_cluster::config::FailureSection {
            task_start_timeout_ms: 1500,
            ..Default::default()
        },
        ..storm_cli::local::LocalOptions::new(1)
    });
    let file = |name: &str| work.path().join(name);
    let (ready, caught, stop) = (file("ready"), file("caught"), file("stop"));
    let as_user = |uid: u32, args: &[&str]| {
        use std::os::unix::process::CommandExt;
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_storm-submit"));
        cmd.arg("--socket")
            .arg(&c.socket)
            .args(args)
            .uid(uid)
            .gid(uid);
        cmd
    };
    let attacker = as_user(
        NOBODY,
        &[
            "--no-bcast",
            stopper.to_str().unwrap(),
            ready.to_str().unwrap(),
            caught.to_str().unwrap(),
            stop.to_str().unwrap(),
        ],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .unwrap();
    assert!(
        support::wait_for_path(&ready, Duration::from_secs(30)),
        "the attacker's job did not start"
    );
    // The user's own jobs, whose starts the attacker stops, until it holds one before its
    // exec. Their working directory and program sit 900 directories deep, as the user may
    // put them: the path walks after the change of user take a while, which widens the
    // window the attacker aims at.
    let mut deep = work.path().to_path_buf();
    for _ in 0..900 {
        deep.push("d");
    }
    std::fs::create_dir_all(&deep).unwrap();
    let mut at = deep.clone();
    while at != work.path() {
        std::fs::set_permissions(&at, std::fs::Permissions::from_mode(0o755)).unwrap();
        at.pop();
    }
    let program = deep.join("true");
    std::fs::copy("/bin/true", &program).unwrap();
    let mut held = None;
    for _ in 0..20 {
        let mut cmd = as_user(
            NOBODY,
            &["-n", "3", "--no-bcast", program.to_str().unwrap()],
        );
        cmd.current_dir(&deep)
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped());
        let mut job = cmd.spawn().unwrap();
        let since = std::time::Instant::now();
        while job.try_wait().unwrap().is_none() && !caught.exists() {
            if since.elapsed() > Duration::from_secs(60) {
                let ps = std::process::Command::new("ps")
                    .args(["-eo", "pid,ppid,user,stat,wchan:20,comm,args"])
                    .output()
                    .map(|o| text(&o.stdout))
                    .unwrap_or_default();
                let queue = text(&c.storm(&["queue"]).stdout);
                let _ = job.kill();
                let out = job.wait_with_output().unwrap();
                panic!(
                    "a job hung: {}{}\nqueue: {queue}\n{ps}",
                    text(&out.stdout),
                    text(&out.stderr)
                );
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        if caught.exists() {
            held = Some(job);
            break;
        }
    }
    let held = held.expect("the attacker never held a start before its exec");
    // While it holds it, another user's job on the node starts and ends.
    let mut cmd = as_user(VICTIM, &["--no-bcast", "/bin/echo", "started"]);
    cmd.current_dir("/");
    let victim = support::output_within(cmd, Duration::from_secs(30));
    // The held start must fail on its own, while the attacker still holds it: releasing it
    // first would let it exec and succeed, which says nothing about the deadline.
    let mut held = held;
    let since = std::time::Instant::now();
    while held.try_wait().unwrap().is_none() && since.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let failed_while_held = held.try_wait().unwrap().is_some();
    std::fs::write(&stop, b"").unwrap();
    let held = held.wait_with_output().unwrap();
    let attack = attacker.wait_with_output().unwrap();
    let victim = victim.unwrap_or_else(|| {
        panic!(
            "another user's job did not finish within 30 s while a start was held: the \
             launcher waited for it ({})",
            text(&attack.stdout)
        )
    });
    assert!(
        victim.status.success() && text(&victim.stdout).contains("started"),
        "{}{}",
        text(&victim.stdout),
        text(&victim.stderr)
    );
    let why = text(&held.stderr);
    assert!(
        failed_while_held,
        "the held start did not end within 30 s while the attacker held it"
    );
    assert!(
        !held.status.success()
            && why.contains("did not reach its program")
            && why.contains("task_start_timeout_ms"),
        "the held start does not fail with the reason ({:?}): {why}{}",
        held.status,
        text(&held.stdout)
    );
}

/// Finding 11: job names reached every user's `storm queue` raw, and a user forged a line
/// `999 root-backup 0 running` (and could send escape sequences) on root's terminal. Now every
/// character that would act on a terminal is shown escaped: root's listing has one line per
/// job and no control character but the newlines ending them; JSON carries the name intact.
/// A name over `max_job_name_bytes` is refused with the limit's name.
#[test]
fn a_job_name_cannot_forge_lines_or_escapes_on_another_users_terminal() {
    let test = "a_job_name_cannot_forge_lines_or_escapes_on_another_users_terminal";
    if !support::root_or_say(test) {
        return;
    }
    let c = TestCluster::start(1);
    let forged = "x\n   999  root-backup         0 running         1       0.1s  0\x1b]0;owned\x07\x1b[2J\u{202e}";
    let mut job = {
        c.submit_cmd_as(NOBODY, &["-J", forged, "--no-bcast", "/bin/sleep", "30"])
            .stderr(std::process::Stdio::null())
            .current_dir("/")
            .spawn()
            .unwrap()
    };
    let since = std::time::Instant::now();
    let listing = loop {
        let out = c.storm(&["queue"]);
        let listing = text(&out.stdout);
        if listing.contains("running") || since.elapsed() > Duration::from_secs(30) {
            break listing;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let json = text(&c.storm(&["queue", "--json"]).stdout);
    let _ = c.storm(&["cancel", "1"]);
    let _ = job.wait();
    let lines: Vec<&str> = listing.lines().collect();
    assert_eq!(lines.len(), 2, "a header and one job:\n{listing}");
    assert!(
        !lines[1..].iter().any(|l| l.trim_start().starts_with("999")),
        "a forged line:\n{listing}"
    );
    assert!(
        listing
            .chars()
            .all(|c| c == '\n' || (!c.is_control() && c != '\u{202e}')),
        "a control character reached the terminal: {listing:?}"
    );
    assert!(
        listing.contains("x\\n   999"),
        "the name is shown escaped: {listing}"
    );
    let v: serde_json::Value = serde_json::from_str(&json).unwrap();
    assert_eq!(v["jobs"][0]["name"], forged, "JSON keeps the name as it is");
    // Too long a name is refused, naming the limit.
    let long = "n".repeat(300);
    let out = c.submit_as(NOBODY, &["-J", &long, "--no-bcast", "/bin/true"]);
    assert!(!out.status.success());
    assert!(
        text(&out.stderr).contains("max_job_name_bytes"),
        "{}",
        text(&out.stderr)
    );
}

/// Whether process `pid` still runs (not gone, not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|s| {
        s.rsplit_once(") ")
            .is_some_and(|(_, rest)| !rest.starts_with('Z'))
    })
}

/// Finding 12: a task that calls `setsid` (leaving its process group, which is all the NM
/// signalled) outlived its job. Each job now runs in a cgroup of its own, killed whole when
/// the job ends: the escapee, as seen in /proc, dies with its job, under v1 (this machine's
/// hierarchies) and v2 (its unified one) alike. The job's record keeps the CPU time its
/// processes used (and, where the memory controller counts it, their peak memory).
#[test]
fn a_task_that_leaves_its_process_group_dies_with_its_job() {
    let test = "a_task_that_leaves_its_process_group_dies_with_its_job";
    if !support::root_or_say(test) {
        return;
    }
    for mode in [
        storm_cluster::config::CgroupMode::V1,
        storm_cluster::config::CgroupMode::V2,
    ] {
        let has = |fs: &str| {
            std::fs::read_to_string("/proc/self/mounts")
                .is_ok_and(|m| m.lines().any(|l| l.split(' ').nth(2) == Some(fs)))
        };
        let fs = if mode == storm_cluster::config::CgroupMode::V1 {
            "cgroup"
        } else {
            "cgroup2"
        };
        if !has(fs) {
            support::say_not_tested(&format!("{test} ({mode:?})"), &format!("no {fs} here"));
            continue;
        }
        let c = TestCluster::with(storm_cli::local::LocalOptions {
            cgroups: mode,
            ..storm_cli::local::LocalOptions::new(1)
        });
        let work = support::shared_tempdir();
        let pidfile = work.path().join("escapee");
        let script = support::script(
            work.path(),
            "escape",
            &format!(
                "setsid sh -c 'echo $$ > {p}; exec sleep 300' </dev/null >/dev/null 2>&1 &\n\
                 while [ ! -s {p} ]; do sleep 0.01; done\n\
                 i=0; while [ $i -lt 200000 ]; do i=$((i+1)); done\n",
                p = pidfile.display()
            ),
        );
        let out = c.submit_as(NOBODY, &["--no-bcast", script.to_str().unwrap()]);
        assert!(out.status.success(), "{mode:?}: {}", text(&out.stderr));
        let pid: i32 = std::fs::read_to_string(&pidfile)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        let since = std::time::Instant::now();
        while alive(pid) && since.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let survived = alive(pid);
        if survived {
            // SAFETY: cleaning up after a failed test.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        assert!(!survived, "{mode:?}: the setsid child outlived its job");
        let history = text(&c.storm(&["history", "--json"]).stdout);
        let v: serde_json::Value = serde_json::from_str(&history).unwrap();
        let cpu = v["jobs"][0]["cpu_s"].as_f64();
        assert!(
            cpu.is_some_and(|s| s > 0.01),
            "{mode:?}: the job's CPU time is recorded: {history}"
        );
        if mode == storm_cluster::config::CgroupMode::V1 {
            assert!(
                v["jobs"][0]["max_memory_bytes"]
                    .as_u64()
                    .is_some_and(|b| b > 0),
                "{mode:?}: the job's peak memory is recorded: {history}"
            );
        }
    }
}

/// `f`, run on a thread of its own whose credentials are `nobody`'s (the raw syscalls change
/// only the calling thread's, so the rest of the test stays root): what a user's own client
/// could send the MM, without storm's tools in the way.
fn as_nobody<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    std::thread::spawn(move || {
        let id = NOBODY as libc::c_long;
        // SAFETY: plain syscalls with integer arguments; they change this thread only.
        let (g, u) = unsafe {
            (
                libc::syscall(libc::SYS_setresgid, id, id, id),
                libc::syscall(libc::SYS_setresuid, id, id, id),
            )
        };
        assert_eq!((g, u), (0, 0), "{}", std::io::Error::last_os_error());
        f()
    })
    .join()
    .unwrap()
}

/// An ordinary user speaking the control protocol themselves, as the cluster's peer agent or
/// its operator would: lending the cluster's nodes to a peer on a forged asking, giving
/// back, taking the borrowing orders or the flocked jobs, reporting forged peers, draining,
/// reclaiming, shutting down, or claiming to be a node's control relay for root. Each is
/// refused with a reason that names who may, and nothing happens: the nodes stay idle and in
/// service, no peer appears, the MM runs on. (The peer `other` is one this cluster lends to,
/// so the lending requests would lend if the MM took them: with the operator check on
/// `LendAsked` taken out, the node shows `lent` and this test fails.)
#[test]
fn a_user_cannot_act_as_the_peer_agent_or_the_operator() {
    use storm_cluster::control::{Client, Reply, Request};
    use storm_cluster::federation::{FederationSection, PeerEntry, PeerInfo, PeerState};
    use storm_primitives::NodeSet;
    let test = "a_user_cannot_act_as_the_peer_agent_or_the_operator";
    if !support::root_or_say(test) {
        return;
    }
    let keys = tempfile::tempdir().unwrap();
    let pair = keys.path().join("pair.key");
    storm_cluster::key::generate(&pair).unwrap();
    let free_port = || storm_cli::local::free_loopback_port().expect("a free loopback port");
    let c = TestCluster::with(storm_cli::local::LocalOptions {
        cpus: Some(support::TEST_CPUS),
        name: Some("victim".into()),
        federation: FederationSection {
            listen: Some(format!("127.0.0.1:{}", free_port()).parse().unwrap()),
            ..Default::default()
        },
        peers: vec![PeerEntry {
            name: "other".into(),
            address: format!("127.0.0.1:{}", free_port()).parse().unwrap(),
            key_file: pair.clone(),
            lend: true,
            borrow: true,
            flock_user: Some("daemon".into()),
            same_users: false,
            guest_file: Some(keys.path().join("other.toml")),
            mm_public_key_file: None,
            priority: 0,
        }],
        ..storm_cli::local::LocalOptions::new(2)
    });
    let names = vec!["node0".to_string(), "node1".to_string()];
    let both: NodeSet = [0, 1].into_iter().collect();
    let forged = PeerInfo {
        name: "forged".into(),
        address: "127.0.0.1:9".parse().unwrap(),
        state: PeerState::Up,
        lend: true,
        borrow: true,
        offer: None,
        lag_us: None,
        heard_ms_ago: None,
        reason: None,
    };
    let requests = vec![
        Request::LendAsked {
            peer: "other".into(),
            nodes: names.clone(),
            count: 2,
            for_ms: 3_600_000,
        },
        Request::Lend {
            nodes: both.clone(),
            peer: "other".into(),
            for_ms: 3_600_000,
        },
        Request::GiveBack {
            peer: "other".into(),
            nodes: names.clone(),
        },
        Request::BorrowOut { lent: Vec::new() },
        Request::FlockOut,
        Request::FlockReport(Vec::new()),
        Request::PeerReport(vec![forged]),
        Request::Drain {
            nodes: both.clone(),
            reason: "a user's drain".into(),
        },
        Request::Reclaim {
            nodes: both.clone(),
            now: true,
        },
        Request::Recalls,
        Request::Recalled {
            peer: "other".into(),
            nodes: vec![storm_cluster::federation::Recalled {
                node: "node0".into(),
                why: "a forged call home".into(),
            }],
        },
        Request::Shutdown,
    ];
    let socket = c.socket.clone();
    let answers: Vec<(String, Result<Reply, String>)> = as_nobody(move || {
        requests
            .into_iter()
            .map(|r| {
                let what = format!("{r:?}");
                let answer = Client::connect(&socket).and_then(|client| client.call(&r));
                (what, answer)
            })
            .collect()
    });
    for (what, answer) in answers {
        match answer {
            Ok(Reply::Error(why)) => assert!(
                why.contains("only root or the MM's own user may"),
                "{what}: refused, but the reason does not say who may: {why}"
            ),
            other => panic!("{what}, sent by nobody, was not refused: {other:?}"),
        }
    }
    // A connection claiming to be a node's control relay, for root: refused before anything.
    let socket = c.socket.clone();
    let relay = as_nobody(move || {
        let sock = std::os::unix::net::UnixStream::connect(&socket).unwrap();
        let hello = Request::RelayHello {
            version: storm_cluster::control::PROTOCOL_VERSION,
            uid: 0,
            gid: 0,
            node: "node0".into(),
        };
        storm_cluster::control::send(&sock, &hello, None).unwrap();
        storm_cluster::control::recv::<Reply>(&sock).map(|(r, _)| r)
    });
    assert!(
        matches!(&relay, Ok(Reply::Error(_)) | Err(_)),
        "a user's relay hello was taken: {relay:?}"
    );

    // Nothing happened: both nodes idle and in service, no forged peer, the MM answers.
    let out = c.storm(&["nodes", "--json"]);
    assert!(out.status.success(), "the MM went: {}", text(&out.stderr));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let states: Vec<String> = v["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| format!("{}={}", n["name"], n["state"]))
        .collect();
    assert_eq!(
        states,
        ["\"node0\"=\"idle\"", "\"node1\"=\"idle\""],
        "a user's request changed the nodes"
    );
    let peers = text(&c.storm(&["peers"]).stdout);
    assert!(
        !peers.contains("forged"),
        "a user's peer report shows: {peers}"
    );
    let out = c.submit_as(NOBODY, &["-N", "2", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
}
