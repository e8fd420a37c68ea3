//! Gang scheduling with real daemons and real processes: what the kernel says about the tasks'
//! states (/proc), what every NM recorded switching (switches.log), and what the user sees.

mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use storm_cli::local::LocalOptions;
use storm_cluster::config::{FailureSection, PolicyKind, SchedulerSection};
use support::{TestCluster, script, text};

fn gang(nodes: u32, mpl: usize, timeslice_ms: f64) -> TestCluster {
    gang_with(nodes, mpl, timeslice_ms, false)
}

/// A gang-scheduled cluster whose NMs also log every heartbeat they take, when
/// `heartbeat_log`.
fn gang_with(nodes: u32, mpl: usize, timeslice_ms: f64, heartbeat_log: bool) -> TestCluster {
    TestCluster::with(LocalOptions {
        timeslice_ms,
        kill_wait_ms: Some(500),
        // A node that misses a heartbeat's deadline leaves the heartbeat, and misses its
        // switches, by design (docs/operations.md). With CPU-bound jobs and parallel tests on
        // a 2-core machine, healthy NMs have gone unscheduled for longer than a default
        // deadline; these tests are about switching, so heartbeats get 500 ms.
        failure: FailureSection {
            deadline_min_ms: 500,
            ..FailureSection::default()
        },
        scheduler: SchedulerSection {
            policy: PolicyKind::Gang,
            mpl,
            switch_log: true,
            heartbeat_log,
            ..SchedulerSection::default()
        },
        ..LocalOptions::new(nodes)
    })
}

/// A task of a job: its pid, node and rank, found through /proc.
#[derive(Debug, Clone, Copy)]
struct Task {
    pid: i32,
    job: u64,
    node: u32,
    rank: u32,
}

fn env_of(pid: i32) -> Option<BTreeMap<String, String>> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).ok()?;
    Some(
        raw.split(|&b| b == 0)
            .filter_map(|kv| {
                let kv = String::from_utf8_lossy(kv);
                let (k, v) = kv.split_once('=')?;
                Some((k.to_string(), v.to_string()))
            })
            .collect(),
    )
}

/// Task processes (not launchers) running a script whose name contains `marker`.
fn tasks(marker: &str) -> Vec<Task> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let Ok(cmd) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
            continue;
        };
        if !String::from_utf8_lossy(&cmd).contains(marker) {
            continue;
        }
        // The task itself, child of its launcher, not a subshell it forked.
        if parent_comm(pid).as_deref() != Some("storm-pl") {
            continue;
        }
        let Some(env) = env_of(pid) else { continue };
        let (Some(job), Some(node), Some(rank)) = (
            env.get("STORM_JOB_ID"),
            env.get("STORM_NODEID"),
            env.get("STORM_RANK"),
        ) else {
            continue;
        };
        out.push(Task {
            pid,
            job: job.parse().unwrap(),
            node: node.parse().unwrap(),
            rank: rank.parse().unwrap(),
        });
    }
    out
}

/// The command name of a process's parent.
fn parent_comm(pid: i32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let ppid: i32 = stat
        .rsplit_once(") ")?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()?;
    Some(
        std::fs::read_to_string(format!("/proc/{ppid}/comm"))
            .ok()?
            .trim()
            .to_string(),
    )
}

/// 'R', 'S', 'T', 'Z'..., or None if the process is gone.
fn state(pid: i32) -> Option<char> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(") ")
        .and_then(|(_, rest)| rest.chars().next())
}

fn runnable(pid: i32) -> bool {
    matches!(state(pid), Some('R' | 'S' | 'D'))
}

/// Whether the task may be on a CPU: it is runnable (`R`, on a run queue, even with a
/// SIGSTOP pending: it still takes the CPU it is given), or asleep with no SIGSTOP pending
/// (it runs its own code once woken). This test once counted a runnable task with a pending
/// SIGSTOP as stopped, and so could not see a node continue the new slot while the old one
/// still held a CPU. /proc reads the state and the pending signals at two moments, and a stop
/// taken in between shows as neither: the state is read once more.
fn can_run(pid: i32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(str::trim)
            .unwrap_or_default()
    };
    let state = field("State:").chars().next();
    let stop = 1u64 << (libc::SIGSTOP - 1);
    let pending = |name| u64::from_str_radix(field(name), 16).unwrap_or(0) & stop != 0;
    if state == Some('R') {
        return true;
    }
    let running = matches!(state, Some('S' | 'D'));
    running && !pending("ShdPnd:") && !pending("SigPnd:") && runnable(pid)
}

fn wait_for(what: &str, timeout: Duration, mut f: impl FnMut() -> bool) {
    let start = Instant::now();
    while !f() {
        assert!(start.elapsed() < timeout, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A shell loop that keeps the CPU busy for `secs` seconds, then prints its rank.
fn spinner(dir: &std::path::Path, name: &str) -> std::path::PathBuf {
    script(
        dir,
        name,
        "end=$(( $(date +%s) + $1 ))\nwhile [ $(date +%s) -lt $end ]; do :; done\necho \"done $STORM_RANK\"\n",
    )
}

/// At any instant, the tasks of at most one time slot can run their own code on a node: the
/// NM has stopped the old slot's before it continues the new slot's (a task whose SIGSTOP is
/// pending counts as stopped, see `can_run`).
#[test]
fn at_any_instant_at_most_one_time_slots_tasks_are_runnable_on_a_node() {
    let c = gang(4, 2, 20.0);
    let work = tempfile::tempdir().unwrap();
    let marker = format!("gang-one-{}", std::process::id());
    let prog = spinner(work.path(), &marker);
    let a = c.spawn(&["-N", "4", prog.to_str().unwrap(), "4"]);
    let b = c.spawn(&["-N", "4", prog.to_str().unwrap(), "4"]);
    wait_for("eight tasks", Duration::from_secs(20), || {
        tasks(&marker).len() == 8
    });
    let all = tasks(&marker);
    let jobs: BTreeSet<u64> = all.iter().map(|t| t.job).collect();
    assert_eq!(jobs.len(), 2);
    let (ja, jb) = (*jobs.first().unwrap(), *jobs.last().unwrap());
    let mut samples = 0;
    let mut seen_each = [false, false];
    let start = Instant::now();
    while start.elapsed() < Duration::from_secs(2) {
        for node in 0..4 {
            let pa = all
                .iter()
                .find(|t| t.job == ja && t.node == node)
                .unwrap()
                .pid;
            let pb = all
                .iter()
                .find(|t| t.job == jb && t.node == node)
                .unwrap()
                .pid;
            // B, then A, then B: if B was runnable at both ends and A in between, both were
            // runnable at once (a 20 ms timeslice cannot switch twice in a few microseconds).
            // A sample during which this thread was preempted for milliseconds (a loaded CI
            // machine) proves nothing either way and is not counted.
            let read_at = std::time::Instant::now();
            let (b1, a1, b2) = (can_run(pb), can_run(pa), can_run(pb));
            if read_at.elapsed() > std::time::Duration::from_millis(2) {
                continue;
            }
            if b1 && a1 && b2 {
                let states: Vec<String> = all
                    .iter()
                    .map(|t| format!("j{}n{}:{:?}", t.job, t.node, state(t.pid)))
                    .collect();
                let log = std::fs::read_to_string(
                    c.root.join(format!("node{node}")).join("switches.log"),
                )
                .unwrap_or_default();
                let tail: Vec<&str> = log.lines().rev().take(4).collect();
                panic!(
                    "node {node}: jobs {ja} and {jb} were both runnable; now {states:?}; log tail {tail:?}"
                );
            }
            seen_each[0] |= a1 && !b1 && !b2;
            seen_each[1] |= b1 && b2 && !a1;
            samples += 1;
        }
    }
    assert!(samples > 100, "only {samples} samples");
    assert!(
        seen_each[0] && seen_each[1],
        "both jobs ran in turn: {seen_each:?}"
    );
    for child in [a, b] {
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
    }
}

/// The heartbeats some node did not take, between the first every node took and the last
/// every node took, each with the first heartbeat that node took after it (from its
/// heartbeats.log).
fn unheard(c: &TestCluster, nodes: u32) -> BTreeSet<u64> {
    let taken: Vec<BTreeSet<u64>> = (0..nodes)
        .map(|n| {
            std::fs::read_to_string(c.root.join(format!("node{n}")).join("heartbeats.log"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.split_whitespace().next()?.parse().ok())
                .collect()
        })
        .collect();
    let first = taken
        .iter()
        .map(|t| t.first().copied().unwrap_or(u64::MAX))
        .max();
    let last = taken.iter().map(|t| t.last().copied().unwrap_or(0)).min();
    let (Some(first), Some(last)) = (first, last) else {
        return BTreeSet::new();
    };
    let mut out = BTreeSet::new();
    for t in &taken {
        let mut missed = false;
        for seq in first..=last {
            if !t.contains(&seq) {
                missed = true;
                out.insert(seq);
            } else if missed {
                missed = false;
                out.insert(seq);
            }
        }
    }
    out
}

/// Parses every NM's switches.log: for each node, heartbeat number -> (ns, stopped, continued
/// or started, the heartbeat that began the switch).
type Switches = BTreeMap<u32, BTreeMap<u64, (u128, Vec<u64>, Vec<u64>, u64)>>;

/// Every NM's switches, and the strobes around a lease that ran out on some node
/// (`lease=expired` lines: it stopped its slot before the next heartbeat came, by design):
/// from the lease's own heartbeat (whose switch may not have been complete yet) to the next
/// one that node switched at.
fn switches(c: &TestCluster, nodes: u32) -> (Switches, BTreeSet<u64>) {
    let mut out = BTreeMap::new();
    let mut expired = Vec::new();
    for n in 0..nodes {
        let text = std::fs::read_to_string(c.root.join(format!("node{n}")).join("switches.log"))
            .unwrap_or_default();
        let mut per = BTreeMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            let list = |s: &str, key: &str| -> Vec<u64> {
                s.trim_start_matches(key)
                    .split(',')
                    .filter(|x| !x.is_empty())
                    .map(|x| x.parse().unwrap())
                    .collect()
            };
            if f.last() == Some(&"lease=expired") {
                expired.push((n, f[0].parse::<u64>().unwrap()));
                continue;
            }
            // A job whose tasks start at this strobe (f[4], start=) runs from it just as a
            // continued one does: a node that missed the launch's heartbeat is launched again
            // later and starts the job at a strobe where the others continue it. f[5] is recv=.
            let mut runs = list(f[3], "cont=");
            runs.extend(list(f[4], "start="));
            per.insert(
                f[0].parse().unwrap(),
                (
                    f[1].parse().unwrap(),
                    list(f[2], "stop="),
                    runs,
                    f[6].trim_start_matches("from=").parse().unwrap(),
                ),
            );
        }
        out.insert(n, per);
    }
    let mut late = BTreeSet::new();
    for (n, seq) in expired {
        let next = out[&n].range(seq + 1..).next().map_or(seq + 1, |(s, _)| *s);
        late.extend(seq..=next);
    }
    (out, late)
}

#[test]
fn all_nodes_of_a_job_switch_at_the_same_strobe_and_results_survive_hundreds_of_switches() {
    let c = gang_with(4, 2, 1.0, true);
    let work = tempfile::tempdir().unwrap();
    // Each rank prints 2000 numbered lines while it computes for about 4 s.
    let prog = script(
        work.path(),
        "count.sh",
        "end=$(( $(date +%s) + 4 )); i=0\nwhile [ $(date +%s) -lt $end ] || [ $i -lt 2000 ]; do\n  if [ $i -lt 2000 ]; then echo \"$STORM_RANK line $i\"; i=$((i+1)); fi\ndone\nexit $((STORM_RANK % 2 + 2))\n",
    );
    let a = c.spawn(&["-N", "4", "-n", "8", "-l", prog.to_str().unwrap()]);
    let b = c.spawn(&["-N", "4", "-n", "8", "-l", prog.to_str().unwrap()]);
    let outs = [a.wait_with_output().unwrap(), b.wait_with_output().unwrap()];
    for out in &outs {
        // Ranks exit 2 or 3: the lowest failing rank (0) decides.
        assert_eq!(out.status.code(), Some(2), "{}", text(&out.stderr));
        let stdout = text(&out.stdout);
        for rank in 0..8 {
            let lines: Vec<&str> = stdout
                .lines()
                .filter(|l| l.starts_with(&format!("{rank}: ")))
                .collect();
            assert_eq!(lines.len(), 2000, "rank {rank}");
            for (i, l) in lines.iter().enumerate() {
                assert_eq!(
                    *l,
                    format!("{rank}: {rank} line {i}"),
                    "rank {rank}'s output is intact and in order"
                );
            }
        }
        let stderr = text(&out.stderr);
        assert!(stderr.contains("rank 1 on node0: exit code 3"), "{stderr}");
    }
    let (log, lease_late) = switches(&c, 4);
    // The quantum is 1 ms, so an idle machine gives thousands of switches per node; a loaded
    // 2-core CI runner (8 busy ranks, 5 daemons) has given as few as ~400. The claim tested is
    // that output and exit codes survive many switches, not how fast the machine switches
    // (storm-bench gang measures that), so each node must have switched a few hundred times.
    for (node, switched) in &log {
        assert!(
            switched.len() >= 200,
            "node {node} switched only {} times",
            switched.len()
        );
    }
    // Every node switched each job at exactly the same strobes, until the job's tasks ended
    // somewhere (a node stops switching a job once its own tasks of it are done).
    let jobs: BTreeSet<u64> = log
        .values()
        .flat_map(|m| {
            m.values()
                .flat_map(|(_, s, c, _)| s.iter().chain(c).copied())
        })
        .collect();
    // A node whose old slot took longer than a heartbeat to stop continues the new one late,
    // by design (it never runs two slots at once); those strobes are left out, on every node.
    let late: BTreeSet<u64> = log
        .values()
        .flat_map(|m| m.iter())
        .filter(|(seq, e)| e.3 < **seq)
        .flat_map(|(seq, e)| e.3..=*seq)
        .collect();
    // A node that missed heartbeats (it left the heartbeat for a while: a missed deadline
    // under load, by design) missed their switches, and the first heartbeat it took after
    // them switches from where it was: those strobes are left out too, on every node.
    let skipped = unheard(&c, 4);
    if !skipped.is_empty() {
        // Only a node the MM put out of the heartbeat may miss one: a node that skips a
        // heartbeat silently is a bug this test must not hide.
        let metrics = text(&c.storm(&["metrics"]).stdout);
        let missed = metrics
            .lines()
            .find_map(|l| l.strip_prefix("storm_heartbeats_missed_total "))
            .and_then(|v| v.trim().parse::<f64>().ok())
            .unwrap_or(0.0);
        assert!(
            missed > 0.0,
            "nodes did not take heartbeats {skipped:?}, yet the MM put no node out of the heartbeat"
        );
    }
    let late: BTreeSet<u64> = late.union(&skipped).copied().collect();
    // A node whose heartbeat came more than `slot_grace_ms` late stopped its slot before it
    // came (the lease, by design: it must not run beside the other nodes' next slot); the
    // strobes up to its next switch are left out, on every node.
    eprintln!(
        "{} strobes came after a lease ran out somewhere",
        lease_late.len()
    );
    let late: BTreeSet<u64> = late.union(&lease_late).copied().collect();
    for job in jobs {
        let moves = |n: u32| -> BTreeMap<u64, bool> {
            log[&n]
                .iter()
                .filter(|(seq, _)| !late.contains(seq))
                .filter_map(|(seq, (_, s, c, _))| {
                    if s.contains(&job) {
                        Some((*seq, false))
                    } else if c.contains(&job) {
                        Some((*seq, true))
                    } else {
                        None
                    }
                })
                .collect()
        };
        let last = (0..4)
            .filter_map(|n| moves(n).keys().last().copied())
            .min()
            .unwrap();
        let reference: Vec<(u64, bool)> =
            moves(0).into_iter().filter(|(s, _)| *s <= last).collect();
        assert!(
            reference.len() > 100,
            "job {job} switched only {} times",
            reference.len()
        );
        for n in 1..4 {
            let here: Vec<(u64, bool)> = moves(n).into_iter().filter(|(s, _)| *s <= last).collect();
            if let Some(at) =
                (0..reference.len().max(here.len())).find(|&i| reference.get(i) != here.get(i))
            {
                let near =
                    |v: &[(u64, bool)]| v[at.saturating_sub(3)..(at + 3).min(v.len())].to_vec();
                let seq = reference.get(at).or(here.get(at)).map_or(0, |m| m.0);
                panic!(
                    "job {job}: node {n} switched at other strobes than node 0, first at move {at} \
                     (strobe {seq}): node 0 {:?}, node {n} {:?}; {} late or unheard strobes left \
                     out; raw lines near it: node 0 {:?}, node {n} {:?}",
                    near(&reference),
                    near(&here),
                    late.len(),
                    log[&0]
                        .range(seq.saturating_sub(3)..=seq + 3)
                        .collect::<Vec<_>>(),
                    log[&n]
                        .range(seq.saturating_sub(3)..=seq + 3)
                        .collect::<Vec<_>>(),
                );
            }
        }
    }
}

#[test]
fn cancel_and_time_limit_act_on_a_suspended_job() {
    let c = gang(2, 2, 50.0);
    let work = tempfile::tempdir().unwrap();
    let pid = std::process::id();
    let (ma, mb, mo) = (
        format!("gang-cancel-{pid}"),
        format!("gang-limit-{pid}"),
        format!("gang-other-{pid}"),
    );
    let (pa, pb, po) = (
        spinner(work.path(), &ma),
        spinner(work.path(), &mb),
        spinner(work.path(), &mo),
    );
    let a = c.spawn(&["-N", "2", pa.to_str().unwrap(), "60"]);
    let b = c.spawn(&["-N", "2", "--time", "0:03", pb.to_str().unwrap(), "60"]);
    let other = c.spawn(&["-N", "2", "--time", "0:20", po.to_str().unwrap(), "2"]);
    wait_for("job A's tasks", Duration::from_secs(20), || {
        tasks(&ma).len() == 2
    });
    let ta = tasks(&ma);
    let ja = ta[0].job;
    // Wait until job A is stopped, then cancel it.
    let pids: Vec<i32> = ta.iter().map(|t| t.pid).collect();
    wait_for("job A suspended", Duration::from_secs(10), || {
        pids.iter().all(|&p| state(p) == Some('T'))
    });
    // `storm queue` shows each placed job's time slot, and which one is suspended.
    wait_for(
        "storm queue to show both slots",
        Duration::from_secs(10),
        || {
            let q = text(&c.storm(&["queue"]).stdout);
            q.contains("(time slot 0)") && q.contains("(time slot 1)") && q.contains("suspended")
        },
    );
    assert!(c.storm(&["cancel", &ja.to_string()]).status.success());
    let a = a.wait_with_output().unwrap();
    assert_eq!(
        a.status.code(),
        Some(143),
        "cancelled while suspended: {}",
        text(&a.stderr)
    );
    for p in pids {
        assert!(
            matches!(state(p), None | Some('Z')),
            "task {p} of the cancelled job lives on"
        );
    }
    // B runs 60 s but has a 3 s limit, part of it spent suspended: it is killed at its limit.
    let b = b.wait_with_output().unwrap();
    let err = text(&b.stderr);
    assert!(err.contains("time limit of 3s exceeded"), "{err}");
    assert_eq!(b.status.code(), Some(143));
    let other = other.wait_with_output().unwrap();
    assert!(
        other.status.success(),
        "the third job was undisturbed: {}",
        text(&other.stderr)
    );
}

#[test]
fn a_task_that_dies_while_its_slot_is_stopped_is_collected() {
    let c = gang(2, 2, 50.0);
    let work = tempfile::tempdir().unwrap();
    // Distinct script names tell the victim's tasks from its partner's, whatever job ids the
    // two concurrent submissions receive.
    let victim_marker = format!("gang-die-victim-{}", std::process::id());
    let partner_marker = format!("gang-die-partner-{}", std::process::id());
    let victim_prog = spinner(work.path(), &victim_marker);
    let partner_prog = spinner(work.path(), &partner_marker);
    let victim_job = c.spawn(&["-N", "2", "-n", "2", victim_prog.to_str().unwrap(), "3"]);
    let partner = c.spawn(&["-N", "2", partner_prog.to_str().unwrap(), "3"]);
    wait_for("the victim's two tasks", Duration::from_secs(20), || {
        tasks(&victim_marker).len() == 2
    });
    let victim = *tasks(&victim_marker).iter().find(|t| t.rank == 1).unwrap();
    wait_for(
        "the victim's slot to be stopped",
        Duration::from_secs(10),
        || state(victim.pid) == Some('T'),
    );
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(victim.pid),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let out = victim_job.wait_with_output().unwrap();
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(137), "{err}");
    assert!(
        err.contains(&format!(
            "rank 1 on node{}: killed by signal 9 (SIGKILL)",
            victim.node
        )),
        "{err}"
    );
    assert!(
        text(&out.stdout).contains("done 0"),
        "rank 0 finished its work"
    );
    assert!(partner.wait_with_output().unwrap().status.success());
}

#[test]
fn under_fcfs_a_job_past_its_time_limit_is_killed_everywhere_and_reported() {
    let c = TestCluster::with(LocalOptions {
        kill_wait_ms: Some(300),
        ..LocalOptions::new(3)
    });
    let work = tempfile::tempdir().unwrap();
    let prog = script(work.path(), "sleepy.sh", "trap '' TERM\nsleep 60\n");
    let start = Instant::now();
    let out = c.submit(&["-N", "3", "--time", "0:02", prog.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert!(
        start.elapsed() >= Duration::from_secs(2),
        "killed before its limit"
    );
    assert!(err.contains("time limit of 2s exceeded"), "{err}");
    assert!(
        err.contains("killed by signal 9 (SIGKILL)"),
        "TERM was ignored, so KILL followed: {err}"
    );
    assert_eq!(out.status.code(), Some(137));
    let bad = c.submit(&["--time", "soon", "/bin/true"]);
    assert!(
        text(&bad.stderr).contains("not a time limit"),
        "{}",
        text(&bad.stderr)
    );
}

/// With `daemon_rt_priority`, the NM and the launcher run under SCHED_FIFO (a heartbeat
/// preempts busy tasks at once), but the tasks run under the normal policy: a task that
/// inherited the real-time policy could starve its node, daemons included.
#[test]
fn real_time_daemons_start_their_tasks_under_the_normal_policy() {
    if !support::root_or_say("real_time_daemons_start_their_tasks_under_the_normal_policy") {
        return;
    }
    let c = TestCluster::with(LocalOptions {
        scheduler: SchedulerSection {
            daemon_rt_priority: 10,
            ..SchedulerSection::default()
        },
        ..LocalOptions::new(1)
    });
    // Field 41 of /proc/PID/stat is the scheduling policy: 0 normal, 1 SCHED_FIFO. The
    // task's parent is the launcher, whose parent is the NM.
    let policies = r#"
        policy() { cut -d' ' -f41 "/proc/$1/stat"; }
        nm=$(cut -d' ' -f4 "/proc/$PPID/stat")
        echo "task $(policy $$) launcher $(policy $PPID) nm $(policy $nm)"
    "#;
    let out = c.submit(&["/bin/sh", "-c", policies]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(text(&out.stdout), "task 0 launcher 1 nm 1\n");
}

/// Under the normal policy (`daemon_rt_priority = 0`, as every unprivileged instance runs)
/// the NM asks the kernel for a short time slice, so that a heartbeat preempts busy tasks
/// when it wakes the NM, but the tasks do not get it: they run with the kernel's own slice,
/// as a job started by anything else would.
#[test]
fn normal_policy_daemons_take_a_short_slice_and_their_tasks_do_not() {
    let c = TestCluster::with(LocalOptions {
        scheduler: SchedulerSection {
            daemon_rt_priority: 0,
            ..SchedulerSection::default()
        },
        ..LocalOptions::new(1)
    });
    // The task's parent is the launcher, whose parent is the NM; se.slice in ns.
    let slices = r#"
        slice() { awk '/^se.slice/ {print $3}' "/proc/$1/sched"; }
        nm=$(cut -d' ' -f4 "/proc/$PPID/stat")
        echo "task $(slice $$) nm $(slice $nm)"
    "#;
    let out = c.submit(&["/bin/sh", "-c", slices]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let said = text(&out.stdout);
    if said.trim() == "task  nm" || !storm_cluster::daemon::custom_slices_supported() {
        support::say_not_tested(
            "normal_policy_daemons_take_a_short_slice_and_their_tasks_do_not",
            "this kernel takes no time slice under the normal policy (Linux 6.12 on)",
        );
        return;
    }
    let short = storm_cluster::daemon::DAEMON_SLICE_NS;
    let words: Vec<&str> = said.split_whitespace().collect();
    assert_eq!(words[3], short.to_string(), "the NM's slice: {said}");
    assert_ne!(words[1], short.to_string(), "the task's slice: {said}");
}
