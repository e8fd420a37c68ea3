//! `storm start` inside a real Slurm allocation, as an unprivileged user would run it:
//! Debian's slurmctld and four slurmd on this host (`.ci/slurm-up`: node1..node4, each its
//! own name and port on 127.0.0.1, munge), users the test makes (`useradd`).
//!
//! Seen from outside: what the user's command prints and its exit code through `salloc`,
//! which processes run and as whom while it runs, what is left afterwards on the "nodes"
//! (this host), and what a second user can reach of the first one's instance.
//!
//! Needs root (to make the users), Slurm up (`SLURM_CONF`, default the file `.ci/slurm-up`
//! writes) and munged; without them each test says NOT TESTED.

mod support;

use std::os::unix::fs::PermissionsExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use storm_cluster::control::Request;
use storm_primitives::tcp::auth::ClusterKey;
use support::handshake::{client_proof, daemons, handshake, member_hello, relay_as};
use support::mpi::{pmix_program, sorted_lines};
use support::{bin_dir, processes_of, start_leftovers_of as leftovers_of, test_user as user, text};

/// The file `.ci/slurm-up` writes.
const CI_SLURM_CONF: &str = "/run/storm-ci-slurm/slurm.conf";

fn slurm_conf() -> PathBuf {
    std::env::var_os("SLURM_CONF")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(CI_SLURM_CONF))
}

/// One test at a time: each takes all four nodes, and each looks at its users' processes.
static ONE_AT_A_TIME: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    ONE_AT_A_TIME.lock().unwrap_or_else(|p| p.into_inner())
}

/// Whether this test can run here; says why not.
fn can_run(test: &str) -> bool {
    if !nix::unistd::geteuid().is_root() {
        eprintln!("{test}: NOT TESTED: needs root to make its users");
        return false;
    }
    let up = Command::new("sinfo")
        .arg("-h")
        .env("SLURM_CONF", slurm_conf())
        .output()
        .is_ok_and(|o| o.status.success());
    if !up {
        eprintln!("{test}: NOT TESTED: no Slurm here (run .ci/slurm-up, or set SLURM_CONF)");
        return false;
    }
    support::ensure_daemons();
    true
}

/// `salloc -N 4 storm start -- ARGS` as `who`, in /tmp, within `limit`.
fn salloc_start(who: (u32, u32), args: &[&str], limit: Duration) -> Output {
    salloc_start_with(who, 4, &[], args, limit)
}

/// `salloc -N NODES storm start OPTIONS -- ARGS` as `who`, in /tmp, within `limit`.
fn salloc_start_with(
    who: (u32, u32),
    nodes: u32,
    options: &[&str],
    args: &[&str],
    limit: Duration,
) -> Output {
    let mut cmd = Command::new("salloc");
    cmd.args(["-N", &nodes.to_string(), "--quiet"])
        .arg(bin_dir().join("storm"))
        .arg("start")
        .args(options)
        .arg("--")
        .args(args)
        .current_dir("/tmp")
        .env("SLURM_CONF", slurm_conf())
        .env("STORM_BIN_DIR", bin_dir())
        .env_remove("STORM_CONFIG")
        .env_remove("STORM_SOCKET")
        .uid(who.0)
        .gid(who.1);
    support::output_within(cmd, limit).expect("salloc storm start ended in time")
}

/// Waits (a little) until `uid` has no process left: Slurm reaps a step's tasks
/// asynchronously.
fn settled(uid: u32) -> Vec<(u32, String)> {
    for _ in 0..100 {
        if processes_of(uid).is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    processes_of(uid)
}

/// Inside `salloc -N 4`, a user's `storm start -- COMMAND` runs a 4-node job (each rank on
/// its own node of the allocation), the daemons and the job run as that user and none as
/// root, the instance's exit code is the command's, and afterwards nothing of it is left:
/// no process of the user, no directory.
#[test]
fn a_user_starts_an_instance_in_an_allocation_and_it_leaves_nothing() {
    let test = "start_slurm: an instance in an allocation";
    let _one = one_at_a_time();
    if !can_run(test) {
        return;
    }
    let who = user("storm-ua");
    let bins = bin_dir();
    let script = format!(
        "{submit} -N 4 -l hostname || exit 9; \
         ps -e -o user=,comm= | grep -E ' (storm|storm-mm|storm-nm|storm-pmix|storm-pl|srun)$' | sort | uniq -c; \
         exit 3",
        submit = bins.join("storm-submit").display()
    );
    let out = salloc_start(who, &["/bin/sh", "-c", &script], Duration::from_secs(120));
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(
        out.status.code(),
        Some(3),
        "the command's code: {stdout}{stderr}"
    );
    let ranks: Vec<&str> = stdout
        .lines()
        .filter(|l| l.len() > 2 && l.as_bytes()[1] == b':')
        .collect();
    let mut rank_ids: Vec<&str> = ranks.iter().map(|l| &l[..1]).collect();
    rank_ids.sort();
    assert_eq!(rank_ids, ["0", "1", "2", "3"], "{stdout}{stderr}");
    // Who runs what, as the command saw it: the user's MM, four NMs, four agents; no root.
    let counts: Vec<(usize, String, String)> = stdout
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            Some((
                f.first()?.parse().ok()?,
                f.get(1)?.to_string(),
                f.get(2)?.to_string(),
            ))
        })
        .collect();
    let count = |user: &str, comm: &str| {
        counts
            .iter()
            .find(|(_, u, c)| u == user && c == comm)
            .map_or(0, |(n, ..)| *n)
    };
    assert!(
        !counts.iter().any(|(_, u, _)| u == "root"),
        "nothing of the instance runs as root: {counts:?}"
    );
    assert_eq!(count("storm-ua", "storm-mm"), 1, "{counts:?}");
    assert_eq!(count("storm-ua", "storm-nm"), 4, "{counts:?}");
    assert!(
        count("storm-ua", "storm") >= 5,
        "front end and agents: {counts:?}"
    );
    assert_eq!(settled(who.0), Vec::new(), "the user's processes are gone");
    assert_eq!(
        leftovers_of(who.0),
        Vec::<PathBuf>::new(),
        "its directories are gone"
    );
}

/// An MPI program (a PMIx client: PMIx_Init, put, fence, get across nodes) runs as one
/// world of 4 ranks in the user's instance, served by the user's own node managers.
#[test]
fn an_mpi_program_is_one_world_in_a_users_instance() {
    let test = "start_slurm: PMIx in an instance";
    let _one = one_at_a_time();
    if !can_run(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let Some(client) = pmix_program(test, dir.path(), "pmix_client") else {
        return;
    };
    let who = user("storm-ua");
    let submit = bin_dir().join("storm-submit");
    let out = salloc_start(
        who,
        &[
            submit.to_str().unwrap(),
            "-N",
            "4",
            "-n",
            "4",
            client.to_str().unwrap(),
        ],
        Duration::from_secs(120),
    );
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        sorted_lines(&out.stdout),
        [
            "rank 0 of 4 (local 0) got: hello from 1",
            "rank 1 of 4 (local 0) got: hello from 2",
            "rank 2 of 4 (local 0) got: hello from 3",
            "rank 3 of 4 (local 0) got: hello from 0",
        ],
        "{}",
        text(&out.stderr)
    );
    assert_eq!(settled(who.0), Vec::new());
}

/// `srun --mpi=M -N 4 storm start -- COMMAND` as a user: every task of the step runs `storm
/// start`, and one instance runs the command once, with its exit code. The job's ranks
/// answer once each; the allocation's steps, as squeue shows them from inside, are the
/// user's own and, without PMI, the agents' step (its first task starts the agents itself)
/// or, with Slurm's PMI (`pmi2`), none besides (the step's own tasks are the agents, met
/// through PMI). Nothing is left.
#[test]
fn srun_storm_start_runs_one_instance_over_the_steps_nodes() {
    let _one = one_at_a_time();
    let test = "start_slurm: srun storm start";
    if !can_run(test) {
        return;
    }
    let who = user("storm-ua");
    let bins = bin_dir();
    for (mpi, steps) in [("none", "storm,storm-agents"), ("pmi2", "storm")] {
        let script = format!(
            "{submit} -N 4 -l hostname; \
             echo steps=$(squeue -h -s -j $SLURM_JOB_ID -o %j | sort | paste -sd, -); exit 3",
            submit = bins.join("storm-submit").display()
        );
        let mut cmd = Command::new("salloc");
        cmd.args(["-N", "4", "--quiet", "srun", "-N", "4", "--quiet"])
            .arg(format!("--mpi={mpi}"))
            .arg(bins.join("storm"))
            .args(["start", "--", "sh", "-c", &script])
            .current_dir("/tmp")
            .env("SLURM_CONF", slurm_conf())
            .env("STORM_BIN_DIR", &bins)
            .env_remove("STORM_CONFIG")
            .uid(who.0)
            .gid(who.1);
        let out = support::output_within(cmd, Duration::from_secs(120)).expect("ended in time");
        let stdout = text(&out.stdout);
        let all = format!("--mpi={mpi}: {stdout}{}", text(&out.stderr));
        assert_eq!(out.status.code(), Some(3), "the command's code: {all}");
        let mut ranks: Vec<&str> = stdout
            .lines()
            .filter_map(|l| l.split_once(": "))
            .map(|(r, _)| r)
            .collect();
        ranks.sort();
        assert_eq!(ranks, ["0", "1", "2", "3"], "one instance, one job: {all}");
        assert!(
            stdout.contains(&format!("steps={steps}\n")),
            "the allocation's steps: {all}"
        );
        assert_eq!(settled(who.0), Vec::new(), "{all}");
        assert_eq!(leftovers_of(who.0), Vec::<PathBuf>::new(), "{all}");
    }
}

/// `storm start --policy gang`: two 4-node jobs at once in the user's instance are gang
/// scheduled, each in a time slot of its own on the same nodes (as `storm queue` shows them
/// from inside), and both finish; without root the daemons ran under the normal policy.
#[test]
fn a_gang_scheduled_pair_timeshares_the_users_nodes() {
    let _one = one_at_a_time();
    let test = "start_slurm: a gang-scheduled pair";
    if !can_run(test) {
        return;
    }
    let who = user("storm-ua");
    let bins = bin_dir();
    let script = format!(
        "{submit} -N 4 sleep 3 > /dev/null & a=$!; {submit} -N 4 sleep 3 > /dev/null & b=$!; \
         sleep 1.5; {storm} queue; wait $a && wait $b && echo both-finished",
        submit = bins.join("storm-submit").display(),
        storm = bins.join("storm").display()
    );
    let mut cmd = Command::new("salloc");
    cmd.args(["-N", "4", "--quiet"])
        .arg(bins.join("storm"))
        .args([
            "start", "--policy", "gang", "--mpl", "2", "--", "/bin/sh", "-c", &script,
        ])
        .current_dir("/tmp")
        .env("SLURM_CONF", slurm_conf())
        .env("STORM_BIN_DIR", &bins)
        .env_remove("STORM_CONFIG")
        .uid(who.0)
        .gid(who.1);
    let out = support::output_within(cmd, Duration::from_secs(120)).expect("ended in time");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("(time slot 0)") && stdout.contains("(time slot 1)"),
        "both jobs placed, each in its own slot: {stdout}"
    );
    assert!(stdout.contains("both-finished"), "{stdout}");
    assert_eq!(settled(who.0), Vec::new());
}

/// The harness in an allocation: `storm-bench start` measures an instance's start and a
/// launch inside it beside srun in the same allocation, as the user, and prints each with
/// its ratio.
#[test]
fn storm_bench_start_measures_an_instance_beside_srun() {
    let _one = one_at_a_time();
    let test = "start_slurm: storm-bench start";
    if !can_run(test) {
        return;
    }
    let who = user("storm-ua");
    let mut cmd = Command::new("salloc");
    cmd.args(["-N", "4", "--quiet"])
        .arg(bin_dir().join("storm-bench"))
        .args(["start", "--runs", "2"])
        .current_dir("/tmp")
        .env("SLURM_CONF", slurm_conf())
        .env("STORM_BIN_DIR", bin_dir())
        .env_remove("STORM_CONFIG")
        .uid(who.0)
        .gid(who.1);
    let out = support::output_within(cmd, Duration::from_secs(300)).expect("ended in time");
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    for row in ["to first output", "to exit", "launch to exit"] {
        let ratio = stdout
            .lines()
            .find(|l| l.trim_start().starts_with(row))
            .and_then(|l| l.split_whitespace().last()?.parse::<f64>().ok());
        assert!(ratio.is_some_and(|r| r > 0.0), "{row}: {stdout}");
    }
    assert_eq!(settled(who.0), Vec::new());
}

/// The harness's whole report for a fresh allocation, in one command, as the user: `salloc
/// -N 4 storm start -- storm-bench report --out DIR`. DIR holds the primitives on storm's
/// tcp fabric and on every libfabric provider the harness found (latency, bandwidth,
/// COMPARE-AND-WRITE, broadcast to the other 3 nodes), fi_pingpong beside each provider,
/// launch at 1, 2 and 4 nodes beside srun, as CSV, JSON and a PNG; every figure a positive
/// number; nothing of the user's left after.
#[test]
fn storm_bench_report_writes_the_whole_report_of_an_allocation() {
    let _one = one_at_a_time();
    let test = "start_slurm: storm-bench report";
    if !can_run(test) {
        return;
    }
    let who = user("storm-ua");
    let work = support::shared_tempdir();
    let dir = work.path().join("report");
    let bench = bin_dir().join("storm-bench");
    let out = salloc_start(
        who,
        &[
            bench.to_str().unwrap(),
            "report",
            "--iterations",
            "50",
            "--runs",
            "1",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(600),
    );
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{said}");
    let csv = std::fs::read_to_string(dir.join("fabric.csv")).expect("fabric.csv");
    let rows: Vec<Vec<&str>> = csv
        .lines()
        .skip(1)
        .map(|l| l.split(',').collect())
        .collect();
    let has = |fabric: &str, test: &str| {
        rows.iter()
            .any(|r| r[0] == fabric && r[1] == test && r[6].parse::<f64>().is_ok_and(|v| v > 0.0))
    };
    for test in ["latency", "bandwidth", "compare_and_write", "broadcast"] {
        assert!(has("tcp", test), "tcp {test}: {csv}");
    }
    // libfabric's tcp provider is here (libfabric1): storm over it, and fi_pingpong beside.
    let libfabric = std::path::Path::new("/usr/bin/fi_pingpong").is_file();
    if libfabric {
        assert!(has("ofi:tcp;ofi_rxm", "latency"), "{csv}");
        assert!(has("ofi:tcp;ofi_rxm", "broadcast"), "{csv}");
        assert!(has("fi_pingpong:tcp;ofi_rxm", "fi_pingpong"), "{csv}");
    }
    let broadcast = rows.iter().find(|r| r[1] == "broadcast").unwrap();
    assert_eq!(broadcast[2], "4", "to every other node of the 4: {csv}");
    let json: Vec<serde_json::Value> =
        serde_json::from_str(&std::fs::read_to_string(dir.join("fabric.json")).unwrap())
            .expect("fabric.json");
    assert_eq!(json.len(), rows.len(), "the same figures in JSON and CSV");
    let png = std::fs::read(dir.join("fabric.png")).expect("fabric.png");
    assert!(png.starts_with(b"\x89PNG"), "a PNG");
    let launch = std::fs::read_to_string(dir.join("launch.csv")).expect("launch.csv");
    let counts: Vec<&str> = launch
        .lines()
        .skip(1)
        .map(|l| {
            let cells: Vec<&str> = l.split(',').collect();
            assert!(
                cells[1].parse::<f64>().is_ok_and(|v| v > 0.0)
                    && cells[2].parse::<f64>().is_ok_and(|v| v > 0.0),
                "storm and srun each timed: {l}"
            );
            cells[0]
        })
        .collect();
    assert_eq!(counts, ["1", "2", "4"], "{launch}");
    let beats: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("heartbeat.json")).unwrap())
            .expect("heartbeat.json");
    assert!(
        beats["count"].as_u64().is_some_and(|c| c > 0)
            && beats["mean_s"].as_f64().is_some_and(|m| m > 0.0),
        "heartbeats counted over the idle seconds: {beats}"
    );
    // This instance does not gang-schedule: the gang part says so instead of figures.
    let gang: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("gang.json")).unwrap())
            .expect("gang.json");
    assert!(
        gang["not_measured"]
            .as_str()
            .is_some_and(|w| w.contains("--policy gang")),
        "{gang}"
    );
    let report = std::fs::read_to_string(dir.join("report.txt")).expect("report.txt");
    assert!(
        report.contains("osu_latency") && report.contains("srun") && report.contains("gang"),
        "{report}"
    );
    assert_eq!(settled(who.0), Vec::new());
}

/// The report's gang part in an instance that gang-schedules, as the user: `salloc -N 2
/// storm start --policy gang -- storm-bench report --parts gang --out DIR`. Two probe jobs
/// that each fill both nodes (a rank per CPU) ran alone and then together, and the ranks'
/// own windows say the pair took turns: they ran at once less than half of the time (a
/// scheduler that let both run would show close to all of it), and the pair took about
/// twice as long as one job.
#[test]
fn storm_bench_report_measures_gang_scheduling_in_a_gang_instance() {
    let _one = one_at_a_time();
    let test = "start_slurm: storm-bench report, gang";
    if !can_run(test) {
        return;
    }
    let who = user("storm-ua");
    let work = support::shared_tempdir();
    let dir = work.path().join("report");
    let bench = bin_dir().join("storm-bench");
    let out = salloc_start_with(
        who,
        2,
        &["--policy", "gang"],
        &[
            bench.to_str().unwrap(),
            "report",
            "--parts",
            "gang",
            "--gang-cpu-s",
            "0.3",
            "--out",
            dir.to_str().unwrap(),
        ],
        Duration::from_secs(300),
    );
    let said = format!("{}{}", text(&out.stdout), text(&out.stderr));
    assert!(out.status.success(), "{said}");
    let gang: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("gang.json")).unwrap())
            .expect("gang.json");
    let f = |k: &str| gang[k].as_f64().unwrap_or_else(|| panic!("{k} in {gang}"));
    assert_eq!(gang["nodes"], 2, "{gang}");
    assert!(f("alone_s") > 0.0 && f("together_s") > 0.0, "{gang}");
    assert!(f("overlap") < 0.5, "the two jobs took turns: {gang}");
    assert!((0.0..=1.0).contains(&f("corun_min")), "a fraction: {gang}");
    assert!(
        f("slowdown") > 0.7,
        "two jobs that take turns take about twice one: {gang}"
    );
    assert!(
        std::fs::read_to_string(dir.join("gang.txt"))
            .is_ok_and(|t| t.contains("overlap") && t.contains("slowdown")),
        "gang.txt"
    );
    assert_eq!(settled(who.0), Vec::new());
}

/// Monitoring and CPU binding in a user's instance, seen from outside: `storm nodes --json`
/// lists the allocation's 4 nodes, each with a fresh sample of its CPUs and memory and its
/// inventory (read from /proc, without root); and a job of 2 ranks on each of 2 nodes has
/// each rank bound to one CPU of its own on its node (`Cpus_allowed_list`, read inside the
/// ranks), as srun's task/affinity binds them.
#[test]
fn monitoring_and_cpu_binding_work_in_a_users_instance() {
    let _one = one_at_a_time();
    let test = "start_slurm: monitoring and binding";
    if !can_run(test) {
        return;
    }
    if storm_cli::local::host_cpus() < 2 {
        support::say_not_tested(test, "binding two ranks per node needs two CPUs");
        return;
    }
    let who = user("storm-ua");
    let script = "sleep 3; storm nodes --json; echo ===; \
                  storm-submit -N 2 -n 4 -l grep Cpus_allowed_list /proc/self/status";
    let out = salloc_start(
        who,
        &[
            "sh",
            "-c",
            &format!("PATH={}:$PATH; {script}", bin_dir().display()),
        ],
        Duration::from_secs(120),
    );
    let stdout = text(&out.stdout);
    assert!(out.status.success(), "{stdout}{}", text(&out.stderr));
    let (json, bound) = stdout.split_once("===").expect("both parts");
    let nodes: serde_json::Value = serde_json::from_str(json).expect("storm nodes --json");
    let nodes = nodes["nodes"].as_array().expect("nodes");
    assert_eq!(nodes.len(), 4, "{json}");
    for n in nodes {
        let records = &n["records"];
        let sample = &records["sample"];
        assert!(sample["mem_total"].as_u64().is_some_and(|m| m > 0), "{n}");
        assert!(sample["cpus"].as_u64().is_some_and(|c| c > 0), "{n}");
        assert!(
            records["inventory"]["ram"].as_u64().is_some_and(|m| m > 0),
            "{n}"
        );
        assert_eq!(records["stale"], serde_json::Value::Bool(false), "{n}");
    }
    // "0: Cpus_allowed_list:\t1": rank, then the list.
    let mut cpus: Vec<(u32, String)> = bound
        .lines()
        .filter_map(|l| {
            let (rank, rest) = l.split_once(':')?;
            Some((
                rank.trim().parse().ok()?,
                rest.rsplit('\t').next()?.trim().to_string(),
            ))
        })
        .collect();
    cpus.sort();
    assert_eq!(cpus.len(), 4, "{bound}");
    for (rank, list) in &cpus {
        assert!(
            list.parse::<u32>().is_ok(),
            "rank {rank} bound to one CPU: {list:?}"
        );
    }
    // Ranks 0-1 on the first node, 2-3 on the second: each pair on two CPUs.
    assert_ne!(cpus[0].1, cpus[1].1, "{cpus:?}");
    assert_ne!(cpus[2].1, cpus[3].1, "{cpus:?}");
    assert_eq!(settled(who.0), Vec::new());
}

/// A second user on the same nodes reaches nothing of the first one's instance: not its
/// control socket (its directory is the first user's alone), not its files, not its
/// daemons' or its relay's ports as a network peer without its keys, and a job submitted
/// there by the first user is not the second's to cancel or see.
#[test]
fn a_second_users_instance_cannot_reach_the_first() {
    let test = "start_slurm: two users' instances";
    let _one = one_at_a_time();
    if !can_run(test) {
        return;
    }
    let a = user("storm-ua");
    let b = user("storm-ub");
    let shared = tempfile::tempdir().unwrap();
    std::fs::set_permissions(shared.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let said = shared.path().join("config-path");
    // A's command says where its instance's file is, then holds the instance up while B
    // tries it.
    let hold = format!(
        "echo \"$STORM_CONFIG\" > {said}; {submit} -N 4 sleep 30",
        said = said.display(),
        submit = bin_dir().join("storm-submit").display()
    );
    let a_run = std::thread::spawn(move || {
        salloc_start(a, &["/bin/sh", "-c", &hold], Duration::from_secs(120))
    });
    let mut config = String::new();
    for _ in 0..600 {
        config = std::fs::read_to_string(&said).unwrap_or_default();
        if !config.trim().is_empty() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let config = PathBuf::from(config.trim());
    assert!(
        config.is_absolute(),
        "A's command said where its instance is"
    );
    let as_b = |program: &Path, args: &[&str]| {
        let mut cmd = Command::new(program);
        cmd.args(args)
            .current_dir("/tmp")
            .env_remove("STORM_CONFIG")
            .env_remove("STORM_SOCKET")
            .uid(b.0)
            .gid(b.1);
        support::output_within(cmd, Duration::from_secs(30)).expect("B's command ended")
    };
    let socket = config.parent().unwrap().join("mm.sock");
    for args in [
        vec!["--config", config.to_str().unwrap(), "queue"],
        vec!["--socket", socket.to_str().unwrap(), "queue"],
        vec!["--socket", socket.to_str().unwrap(), "cancel", "1"],
    ] {
        let out = as_b(&bin_dir().join("storm"), &args);
        assert!(
            !out.status.success(),
            "B ran `storm {args:?}` on A's instance"
        );
        let err = text(&out.stderr).to_lowercase();
        assert!(err.contains("permission denied"), "{args:?}: {err}");
    }
    // Were A to open its directory to all (a mistake), its MM still serves A alone.
    let dir = config.parent().unwrap();
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = as_b(
        &bin_dir().join("storm"),
        &["--socket", socket.to_str().unwrap(), "queue"],
    );
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700)).unwrap();
    assert!(
        !out.status.success(),
        "B saw A's queue through an open directory"
    );
    assert!(
        text(&out.stderr).contains("private instance"),
        "{}",
        text(&out.stderr)
    );
    // As a peer on the network without the instance's keys (B's own instance's, or
    // anyone's; the addresses are no secret, a port scan finds them): every daemon of A's
    // instance refuses a handshake under another key, claiming to be the MM to a node and
    // node 0 to the MM, and the relay's manager side refuses a link.
    let cfg = storm_cluster::ClusterConfig::load(&config).unwrap();
    let other_key = ClusterKey::random();
    for (target, addr) in daemons(&cfg) {
        let claim = if target == cfg.mm_id() {
            0
        } else {
            cfg.mm_id()
        };
        let h = member_hello(&cfg, claim, [9; 32]);
        let (refused, _) = handshake(addr, &h, |n| client_proof(&other_key, &h, target, n));
        assert!(
            refused,
            "daemon {target} of A's instance at {addr} took another key"
        );
    }
    let relay = cfg
        .relay
        .address
        .expect("an instance runs the relay's manager side");
    let reply = relay_as(
        relay,
        (1, cfg.node_count() + 1),
        other_key,
        ed25519_dalek::SigningKey::from_bytes(&[7; 32]),
        b.0,
        Some(Request::Queue),
    );
    let err = reply.expect_err("A's relay took another key").to_string();
    assert!(err.contains("does not hold this cluster's key"), "{err}");
    // A's job was never B's to end: it runs its 30 s and A's instance ends with 0.
    let out = a_run.join().unwrap();
    assert!(out.status.success(), "A's instance: {}", text(&out.stderr));
    assert_eq!(settled(a.0), Vec::new());
}

/// Outside any allocation, `storm start` says so and names the ways in.
#[test]
fn outside_an_allocation_storm_start_says_how_to_start_one() {
    let out = Command::new(bin_dir().join("storm"))
        .args(["start", "--", "true"])
        .env_remove("SLURM_JOB_ID")
        .env_remove("SLURM_JOB_NODELIST")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = text(&out.stderr);
    assert!(
        err.contains("not inside a Slurm allocation") && err.contains("--local"),
        "{err}"
    );
}
