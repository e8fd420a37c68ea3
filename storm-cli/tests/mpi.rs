//! Unmodified MPICH programs under storm-submit: wire-up through the NMs' PMI servers, the
//! same output as MPICH's own `mpiexec`, `MPI_Abort` and early exits ending the job, several
//! MPI jobs at once and an MPI job under gang scheduling. Needs MPICH's `mpicc` and `mpiexec`
//! (Debian: mpich, libmpich-dev; `.ci/run` installs them); without them each test says
//! NOT TESTED. Open MPI 4 (Debian: openmpi-bin, libopenmpi-dev) runs with `--mpi openmpi`,
//! the same way tested against its own `mpirun`.
//!
//! With both MPIs installed, plain `mpicc` is whichever Debian's alternatives chose: the tests
//! use `mpicc.mpich` / `mpiexec.mpich` and `mpicc.openmpi` / `mpirun.openmpi` when they exist.

mod support;

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use storm_cli::local::LocalOptions;
use storm_cluster::config::{FailureSection, PolicyKind, SchedulerSection};
use support::mpi::{compile, mpi_program, mpi_tool, sorted_lines};
use support::{TestCluster, say_not_tested, script, text};

#[test]
fn an_mpi_program_prints_under_storm_what_it_prints_under_mpiexec() {
    let dir = tempfile::tempdir().unwrap();
    let Some(hello) = mpi_program("mpi: same output as mpiexec", dir.path(), "hello") else {
        return;
    };
    let reference = Command::new(mpi_tool("mpiexec", "mpich"))
        .args(["-n", "8"])
        .arg(&hello)
        .output()
        .expect("mpiexec (mpich) is installed with mpicc");
    assert!(reference.status.success(), "{}", text(&reference.stderr));
    let c = TestCluster::start(4);
    for mpi in ["both", "pmi1"] {
        let out = c.submit(&["-N", "4", "-n", "8", "--mpi", mpi, hello.to_str().unwrap()]);
        assert!(out.status.success(), "--mpi {mpi}: {}", text(&out.stderr));
        assert_eq!(
            sorted_lines(&out.stdout),
            sorted_lines(&reference.stdout),
            "--mpi {mpi}: 8 ranks, 2 per node, each sees size 8, the allreduce's sum and its ring neighbour"
        );
        assert!(
            !text(&out.stderr).contains("singleton"),
            "--mpi {mpi}: one world, no singleton notice: {}",
            text(&out.stderr)
        );
    }
    // Without PMI every rank is a singleton, as the issue first saw.
    let out = c.submit(&[
        "-N",
        "2",
        "-n",
        "2",
        "--mpi",
        "none",
        hello.to_str().unwrap(),
    ]);
    assert_eq!(
        sorted_lines(&out.stdout),
        ["rank 0 of 1 sum=1 from=0"; 2],
        "{}",
        text(&out.stderr)
    );
    // ... and says so, for each rank (issue 62: never silently).
    let err = text(&out.stderr);
    for rank in 0..2 {
        assert!(
            err.contains(&format!("storm: rank {rank} of 2 (node {rank}) loaded "))
                && err.contains("libmpi"),
            "rank {rank}'s singleton is named: {err}"
        );
    }
    assert!(
        err.contains("ran as an MPI singleton") && err.contains("--mpi none"),
        "{err}"
    );
}

#[test]
fn mpi_abort_ends_the_job_on_every_node_with_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let Some(abort) = mpi_program("mpi: MPI_Abort", dir.path(), "abort") else {
        return;
    };
    let c = TestCluster::start(4);
    let out = c.submit(&["-N", "4", "-n", "8", abort.to_str().unwrap()]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(
        err.contains("rank 1 on node 0 aborted the job with exit code 7"),
        "{err}"
    );
    // The others were waiting in a barrier (and then a 60 s sleep): they were ended.
    assert_eq!(c.queued_jobs(), Vec::<u64>::new());
}

#[test]
fn a_rank_that_leaves_without_finalize_ends_the_job_instead_of_hanging_it() {
    let dir = tempfile::tempdir().unwrap();
    let Some(early) = mpi_program("mpi: early exit", dir.path(), "early") else {
        return;
    };
    let c = TestCluster::start(2);
    let out = c.submit(&["-N", "2", "-n", "4", early.to_str().unwrap()]);
    let err = text(&out.stderr);
    // It exited 0, but the job failed: 1, as mpirun.
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("rank 2 on node 1 exited with code 0: it left without calling MPI_Finalize"),
        "{err}"
    );
}

/// Issue 62: a program that speaks another PMI than the job serves is told so: MPICH (its
/// PMI-1 wire) under `--mpi pmi2`. Before, every rank died of SIGPIPE (exit 141) with no word
/// of a protocol; now the job ends naming the mismatch and what serves it.
#[test]
fn a_pmi_protocol_mismatch_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let Some(hello) = mpi_program("mpi: protocol mismatch", dir.path(), "hello") else {
        return;
    };
    let c = TestCluster::start(2);
    let out = c.submit(&[
        "-N",
        "2",
        "-n",
        "2",
        "--mpi",
        "pmi2",
        hello.to_str().unwrap(),
    ]);
    let err = text(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("speaks PMI-1, and this job serves PMI-2 only")
            && err.contains("--mpi auto serves both"),
        "{err}"
    );
}

/// Issue 62: a rank that dies before `MPI_Init` ends the job at once, with its code, instead
/// of leaving the others waiting in `MPI_Init` until the time limit (before: the job hung
/// until `-t`; mpirun ends it in about a second). Both ways it can be placed: beside another
/// rank on its node (that node's NM sees it), and alone on its node (the MM sees the others
/// wait in a fence its node can never join). A storm-submit that has not ended in a minute
/// has hung.
#[test]
fn a_rank_that_dies_before_mpi_init_ends_the_job() {
    let dir = tempfile::tempdir().unwrap();
    let Some(prog) = mpi_program("mpi: death before MPI_Init", dir.path(), "before_init") else {
        return;
    };
    let c = TestCluster::start(2);
    for ranks in ["4", "2"] {
        let child = c
            .submit_cmd(&["-N", "2", "-n", ranks, prog.to_str().unwrap()])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap();
        let until = std::time::Instant::now() + std::time::Duration::from_secs(60);
        let mut child = child;
        while child.try_wait().unwrap().is_none() {
            if std::time::Instant::now() > until {
                let _ = child.kill();
                panic!("-n {ranks}: the job still waits a minute after rank 1 died");
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        let out = child.wait_with_output().unwrap();
        let err = text(&out.stderr);
        assert_eq!(out.status.code(), Some(3), "-n {ranks}: {err}");
        assert!(
            err.contains("rank 1 on node") && err.contains("exited with code 3"),
            "-n {ranks}: {err}"
        );
    }
}

/// Issue 62: a rank that fails after MPI_Init ends the job with its own code, as mpirun's
/// (exit(1): 1; SIGSEGV: 139), never the SIGTERM storm then sent the other ranks (before:
/// 143 for both, the lowest-numbered failed rank being rank 0, which storm killed), and the
/// reason names the rank and its real cause first. The same program under MPICH's own
/// mpiexec, in the same run, for reference.
#[test]
fn a_failed_rank_gives_the_job_its_own_exit_code_and_cause() {
    let dir = tempfile::tempdir().unwrap();
    let Some(fail) = mpi_program("mpi: a rank's failure", dir.path(), "fail") else {
        return;
    };
    let c = TestCluster::start(2);
    for (how, code, cause) in [
        ("exit", 1, "rank 1 on node 0 exited with code 1"),
        (
            "segv",
            139,
            "rank 1 on node 0 was killed by SIGSEGV (signal 11)",
        ),
    ] {
        let reference = Command::new(mpi_tool("mpiexec", "mpich"))
            .args(["-n", "4"])
            .arg(&fail)
            .arg(how)
            .output()
            .expect("mpiexec (mpich) is installed with mpicc");
        let out = c.submit(&["-N", "2", "-n", "4", fail.to_str().unwrap(), how]);
        let err = text(&out.stderr);
        eprintln!(
            "rank 1 {how}: storm {:?}, mpiexec (Hydra) {:?}",
            out.status.code(),
            reference.status.code()
        );
        assert_eq!(out.status.code(), Some(code), "rank 1 {how}: {err}");
        let first = err.lines().find(|l| l.contains("rank 1")).unwrap_or("");
        assert!(
            first.contains(cause),
            "rank 1 {how}: the first word of it: {err}"
        );
    }
    // In the history as sacct has them: failed, with the rank's code (not cancelled).
    let out = c.storm(&["history", "--json"]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let ended: Vec<(String, i64)> = v["jobs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|j| {
            (
                j["state"].as_str().unwrap_or("").to_string(),
                j["exit_code"].as_i64().unwrap_or(-1),
            )
        })
        .collect();
    assert_eq!(
        ended,
        [("failed".to_string(), 1), ("failed".to_string(), 139)],
        "{v}"
    );
}

#[test]
fn mpi_jobs_run_side_by_side_and_under_gang_scheduling() {
    let dir = tempfile::tempdir().unwrap();
    let Some(spin) = mpi_program("mpi: gang scheduling", dir.path(), "spin") else {
        return;
    };
    let c = TestCluster::with(LocalOptions {
        timeslice_ms: 2.0,
        kill_wait_ms: Some(500),
        failure: FailureSection {
            deadline_min_ms: 500,
            ..FailureSection::default()
        },
        scheduler: SchedulerSection {
            policy: PolicyKind::Gang,
            mpl: 2,
            switch_log: true,
            ..SchedulerSection::default()
        },
        ..LocalOptions::new(2)
    });
    // Two jobs on the same two nodes, each taking turns with the other every 2 ms for the
    // whole run: each is stopped and resumed thousands of times, mid-collective.
    let jobs: Vec<_> = (0..2)
        .map(|_| c.spawn(&["-N", "2", "-n", "4", spin.to_str().unwrap(), "2000"]))
        .collect();
    for job in jobs {
        let out = job.wait_with_output().unwrap();
        assert!(out.status.success(), "{}", text(&out.stderr));
        // sum over ranks of (rank + i) = 6 + 4i; over i < 2000: 12000 + 4 * 1999000.
        let expected: BTreeSet<String> = (0..4)
            .map(|r| format!("rank {r} of 4 total=8008000"))
            .collect();
        assert_eq!(
            text(&out.stdout)
                .lines()
                .map(str::to_string)
                .collect::<BTreeSet<_>>(),
            expected
        );
    }
    // Every NM recorded each schedule it applied (switches.log: `... stop=<jobs> cont=<jobs>
    // ...`): a switch stops one job and continues the other.
    for node in 0..2 {
        let log = std::fs::read_to_string(c.root.join(format!("node{node}")).join("switches.log"))
            .unwrap_or_default();
        let switches = log
            .lines()
            .filter(|l| {
                let has = |key: &str| {
                    l.split_whitespace()
                        .any(|f| f.strip_prefix(key).is_some_and(|jobs| !jobs.is_empty()))
                };
                has("stop=") && has("cont=")
            })
            .count();
        assert!(
            switches >= 1000,
            "node {node} switched between the MPI jobs only {switches} times"
        );
        eprintln!("node {node}: {switches} switches between the two MPI jobs");
    }
}

/// Open MPI 4 has no PMI-1 wire client, but its `flux` component loads a PMI-1 library:
/// `--mpi openmpi` points it at storm's (libstorm_pmi.so, beside storm-nm). The same program
/// prints under storm what it prints under Open MPI's own `mpirun`.
///
/// Both runs keep Open MPI's tcp transport on loopback, and leave out its shared-memory
/// transport (vader): vader names its segments by host name and local rank, so the embedded
/// cluster's pretend nodes, all one host, would share segments. Real nodes have their own.
#[test]
fn an_open_mpi_program_prints_under_storm_what_it_prints_under_mpirun() {
    let test = "mpi: Open MPI through libstorm_pmi.so";
    let mpicc = mpi_tool("mpicc", "openmpi");
    if mpicc == "mpicc" {
        say_not_tested(
            test,
            "mpicc.openmpi is not installed; install openmpi-bin and libopenmpi-dev",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(hello) = compile(
        test,
        &mpicc,
        dir.path(),
        "hello",
        "openmpi-bin and libopenmpi-dev",
    ) else {
        return;
    };
    let env = [
        ("OMPI_MCA_btl", "self,tcp"),
        ("OMPI_MCA_btl_tcp_if_include", "lo"),
    ];
    let reference = Command::new(mpi_tool("mpirun", "openmpi"))
        .args(["--oversubscribe", "--allow-run-as-root", "-n", "8"])
        .arg(&hello)
        .envs(env)
        .output()
        .expect("mpirun.openmpi is installed with mpicc.openmpi");
    assert!(reference.status.success(), "{}", text(&reference.stderr));
    let c = TestCluster::start(4);
    let run = |mpi: &str| {
        c.submit_env(
            &env,
            &["-N", "4", "-n", "8", "--mpi", mpi, hello.to_str().unwrap()],
        )
    };
    let out = run("openmpi");
    assert!(out.status.success(), "{}", text(&out.stderr));
    assert_eq!(
        sorted_lines(&out.stdout),
        sorted_lines(&reference.stdout),
        "8 ranks, 2 per node, each sees size 8, the allreduce's sum and its ring neighbour"
    );
    // MPI_Abort reaches the NM through PMI_Abort and ends the job with its code.
    let abort = compile(test, &mpicc, dir.path(), "abort", "libopenmpi-dev").unwrap();
    let out = c.submit_env(
        &env,
        &[
            "-N",
            "4",
            "-n",
            "8",
            "--mpi",
            "openmpi",
            abort.to_str().unwrap(),
        ],
    );
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(7), "{err}");
    assert!(
        err.contains("rank 1 on node 0 aborted the job with exit code 7"),
        "{err}"
    );
    // Without the flux component's variables Open MPI starts singletons, as the issue saw.
    let out = run("both");
    assert_eq!(
        sorted_lines(&out.stdout),
        ["rank 0 of 1 sum=1 from=0"; 8],
        "{}",
        text(&out.stderr)
    );
}

/// Issue 62: Open MPI 4 programs start as one world with no `--mpi` flag and no `OMPI_MCA_*`
/// variable, on two pretend nodes of one host. Before, the default served PMI alone and Open
/// MPI ran 4 singletons (`rank 0 of 1`) and exited 0; with `--mpi openmpi`, the two nodes'
/// shared-memory segments (named by host name and local rank) collided and ranks died of
/// SIGSEGV (14 of 14 runs in the issue). Now each node's ranks keep their segments and
/// session files in the job's own scratch directory on that node (in `/dev/shm`), which storm
/// removes with the job. Three runs, each the world `mpirun -n 4` prints.
#[test]
fn an_open_mpi_program_is_one_world_with_no_flags_on_pretend_nodes() {
    let test = "mpi: Open MPI with no flags";
    let mpicc = mpi_tool("mpicc", "openmpi");
    if mpicc == "mpicc" {
        say_not_tested(
            test,
            "mpicc.openmpi is not installed; install openmpi-bin and libopenmpi-dev",
        );
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let Some(hello) = compile(test, &mpicc, dir.path(), "hello", "openmpi-bin") else {
        return;
    };
    let reference = Command::new(mpi_tool("mpirun", "openmpi"))
        .args(["--oversubscribe", "--allow-run-as-root", "-n", "4"])
        .arg(&hello)
        .output()
        .expect("mpirun.openmpi is installed with mpicc.openmpi");
    assert!(reference.status.success(), "{}", text(&reference.stderr));
    let c = TestCluster::start(2);
    let name = c.cluster.as_ref().unwrap().config().cluster.name.clone();
    for attempt in 1..=3 {
        let mut cmd = c.submit_cmd(&["-N", "2", "-n", "4", hello.to_str().unwrap()]);
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("OMPI_MCA_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd.output().unwrap();
        assert!(out.status.success(), "run {attempt}: {}", text(&out.stderr));
        assert_eq!(
            sorted_lines(&out.stdout),
            sorted_lines(&reference.stdout),
            "run {attempt}: 4 ranks on 2 nodes, each sees size 4, the sum and its neighbour"
        );
    }
    // Without PMI the same program runs as four singletons, and the job says so for each.
    let out = c.submit(&[
        "-N",
        "2",
        "-n",
        "4",
        "--mpi",
        "none",
        hello.to_str().unwrap(),
    ]);
    let err = text(&out.stderr);
    assert_eq!(
        err.matches("ran as an MPI singleton").count(),
        4,
        "every singleton rank is named: {err}"
    );
    assert!(err.contains("libmpi.so"), "the library it loaded: {err}");
    // Nothing of the jobs is left in the nodes' scratch space (the running NM's PMIx helper
    // keeps its directory, `pmix`, there until the NM stops: tests/pmix.rs).
    for node in ["node0", "node1"] {
        let root = std::path::Path::new("/dev/shm").join(format!("storm-{name}-{node}"));
        let left: Vec<_> = std::fs::read_dir(&root)
            .map(|d| d.flatten().map(|e| e.file_name()).collect())
            .unwrap_or_default();
        let left: Vec<_> = left.into_iter().filter(|n| n != "pmix").collect();
        assert!(left.is_empty(), "{} holds {left:?}", root.display());
    }
}

/// A fence entered while the MM is down completes once it is back: each NM sends its part
/// again to the restarted MM (at the new membership), which merges the parts and releases the
/// fence, and the job ends normally with every rank's puts visible. The job prints only after
/// the restart and ends before storm-submit has reattached: the restarted MM keeps that output
/// for it and gives it before the outcome. The tasks speak PMI-1 themselves (a shell script on
/// `PMI_FD`), so this needs no MPI library.
#[test]
fn a_fence_entered_while_the_mm_is_down_completes_after_its_restart() {
    let work = tempfile::tempdir().unwrap();
    let dir = work.path().display().to_string();
    let job = script(
        work.path(),
        "fence.sh",
        &format!(
            r#"pmi() {{ echo "$1" >&4; read -r reply <&4; }}
pmi "cmd=init pmi_version=1 pmi_subversion=1"
pmi "cmd=put kvsname=storm-$STORM_JOB_ID key=card-$PMI_RANK value=from-$PMI_RANK"
touch "{dir}/ready-$PMI_RANK"
while [ ! -e "{dir}/go" ]; do sleep 0.05; done
pmi "cmd=barrier_in"
echo "rank $PMI_RANK: $reply"
pmi "cmd=get kvsname=storm-$STORM_JOB_ID key=card-$(( (PMI_RANK + 1) % PMI_SIZE ))"
echo "rank $PMI_RANK: $reply"
pmi "cmd=finalize"
"#
        ),
    );
    let mut c = TestCluster::start(2);
    // The time limit ends the job, failing the test, if the fence is never released.
    let submitter = c.spawn(&["-N", "2", "-n", "4", "-t", "1:00", job.to_str().unwrap()]);
    let ready = |n: u32| (0..n).all(|r| work.path().join(format!("ready-{r}")).exists());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !ready(4) {
        assert!(
            std::time::Instant::now() < deadline,
            "the ranks never got past their puts"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let cluster = c.cluster.as_mut().unwrap();
    cluster.kill_mm().unwrap();
    // Every rank enters the fence with no MM to take the parts.
    std::fs::write(work.path().join("go"), "").unwrap();
    std::thread::sleep(std::time::Duration::from_millis(1500));
    cluster.restart_mm().unwrap();
    let out = submitter.wait_with_output().unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    let mut expected: Vec<String> = (0..4)
        .flat_map(|r| {
            [
                format!("rank {r}: cmd=barrier_out rc=0"),
                format!("rank {r}: cmd=get_result rc=0 value=from-{}", (r + 1) % 4),
            ]
        })
        .collect();
    expected.sort();
    assert_eq!(sorted_lines(&out.stdout), expected, "{}", text(&out.stderr));
}

/// A node manager that was killed leaves its jobs' scratch directories in `/dev/shm`
/// (memory) and its PMIx helper's directory; the next NM of that node removes them as it
/// starts, and nothing else: a file beside the scratch root is untouched.
#[test]
fn a_new_node_manager_removes_what_a_killed_one_left_in_its_scratch_space() {
    let test = "mpi: scratch space left by a killed NM";
    if !support::root_or_say(test) {
        return;
    }
    use std::os::unix::fs::PermissionsExt;
    let name = format!("scratch-{}", std::process::id());
    let root = Path::new("/dev/shm").join(format!("storm-{name}-node0"));
    let neighbour = Path::new("/dev/shm").join(format!("storm-{name}-neighbour"));
    std::fs::create_dir(&root).unwrap();
    std::fs::set_permissions(&root, std::fs::Permissions::from_mode(0o711)).unwrap();
    for dir in ["job-7", "job-12/nested", "pmix"] {
        std::fs::create_dir_all(root.join(dir)).unwrap();
    }
    std::fs::write(root.join("job-12/nested/segment"), vec![0u8; 4096]).unwrap();
    std::fs::write(&neighbour, "not the NM's").unwrap();
    let c = TestCluster::with(LocalOptions {
        name: Some(name.clone()),
        cpus: Some(support::TEST_CPUS),
        ..LocalOptions::new(1)
    });
    let out = c.submit(&["-n", "1", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let left: BTreeSet<String> = std::fs::read_dir(&root)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        !left.contains("job-7") && !left.contains("job-12"),
        "the killed NM's job directories are still there: {left:?}"
    );
    assert_eq!(std::fs::read_to_string(&neighbour).unwrap(), "not the NM's");
    drop(c);
    let _ = std::fs::remove_file(&neighbour);
    let _ = std::fs::remove_dir_all(&root);
}
