//! README.md's commands, run exactly as written (with `./target/release/` standing for this
//! build's binaries), so that what a newcomer copies works:
//!
//! * the first two `sh` blocks are the two commands a newcomer needs: build and run a job on
//!   an embedded cluster, and run the tests (the second is what runs this, and `.ci/run`
//!   must call it);
//! * every other `sh` block (but `cargo build --release`, which is done) is a list of commands, each run in order and expected to succeed
//!   (labelled output must have every rank, once; a `--plot` must leave a PNG). Commands on
//!   the ofi backend need libfabric: where it is not installed they must fail with the clear
//!   error instead. The testbed block needs root, as the testbed tests do.

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use support::{bin_dir, ensure_daemons, testbed, text};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .unwrap()
        .to_path_buf()
}

/// The `sh` blocks of the README, each as its lines without comments or blanks.
fn sh_blocks() -> Vec<Vec<String>> {
    let readme = std::fs::read_to_string(workspace().join("README.md")).unwrap();
    let mut blocks = Vec::new();
    let mut current: Option<Vec<String>> = None;
    for line in readme.lines() {
        match (&mut current, line.trim()) {
            (None, "```sh") => current = Some(Vec::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap()),
            (Some(block), l) if !l.is_empty() && !l.starts_with('#') => block.push(l.to_string()),
            _ => {}
        }
    }
    assert!(current.is_none(), "an sh block of README.md is not closed");
    blocks
}

const RELEASE: &str = "./target/release/";

/// Runs one README command in `dir`, with this build's binaries; returns stdout and stderr.
fn run(line: &str, dir: &Path, limit: Duration) -> (bool, String, String) {
    let bins = format!("{}/", bin_dir().display());
    let cmd = line.replace(RELEASE, &bins);
    let mut child = Command::new("sh")
        .args(["-c", &cmd])
        .current_dir(dir)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run sh");
    let deadline = Instant::now() + limit;
    // Read the pipes in threads so that a chatty command never blocks on them.
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let out = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut out, &mut s).ok();
        s
    });
    let err = std::thread::spawn(move || {
        let mut s = Vec::new();
        std::io::Read::read_to_end(&mut err, &mut s).ok();
        s
    });
    let status = loop {
        if let Some(status) = child.try_wait().unwrap() {
            break status;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("README command took over {limit:?}: {line}");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    (
        status.success(),
        text(&out.join().unwrap()),
        text(&err.join().unwrap()),
    )
}

/// Whether MPICH's compiler wrapper and launcher are installed (CI's second phase).
fn mpich_installed() -> bool {
    ["mpicc", "mpiexec"].iter().all(|tool| {
        std::process::Command::new(tool)
            .arg("--version")
            .output()
            .is_ok()
    })
}

/// What a successful command must also have shown or left behind.
fn check_output(line: &str, stdout: &str, dir: &Path) {
    if line.contains("--label") {
        let mut ranks: Vec<u32> = stdout
            .lines()
            .filter_map(|l| l.split_once(": ")?.0.parse().ok())
            .collect();
        ranks.sort();
        ranks.dedup();
        assert!(
            !ranks.is_empty() && ranks == (0..ranks.len() as u32).collect::<Vec<_>>(),
            "every rank of `{line}` answers: {stdout}"
        );
    }
    if line.contains("storm-bench hpcc") {
        // Every figure's row ends with storm's ratio to mpirun's; a world of singletons
        // would have failed the command.
        let ratios: Vec<f64> = stdout
            .lines()
            .filter_map(|l| l.split_whitespace().last()?.parse().ok())
            .collect();
        assert!(
            stdout.contains("HPL") && stdout.contains("whole run, wall time") && ratios.len() >= 8,
            "`{line}` gives each HPC Challenge figure under storm and mpirun: {stdout}"
        );
    }
    if line.contains("storm-bench throughput") {
        let rate = |what: &str| -> Option<f64> {
            stdout
                .lines()
                .find(|l| l.trim_start().starts_with(what))?
                .split_whitespace()
                .nth(what.split_whitespace().count())?
                .parse()
                .ok()
        };
        assert!(
            rate("storm").is_some_and(|r| r > 0.0) && rate("fork/exec").is_some_and(|r| r > 0.0),
            "`{line}` gives storm's jobs/s beside fork/exec's: {stdout}"
        );
        // The idle cluster's cost, daemon by daemon: the MM and each of the 4 NMs.
        let idle: Vec<f64> = stdout
            .lines()
            .skip_while(|l| !l.starts_with("An idle cluster"))
            .filter(|l| l.trim_start().starts_with("storm-mm") || l.contains("storm-nm node"))
            .filter_map(|l| l.split_whitespace().rev().nth(1)?.parse().ok())
            .collect();
        assert_eq!(
            idle.len(),
            5,
            "`{line}` gives each idle daemon's cost: {stdout}"
        );
    }
    if line.contains("storm-bench federation") {
        // The row of a run: `RUN  JOBS  FLOCKED  ...`; the number of jobs that flocked.
        let flocked = |run: &str| -> Option<u32> {
            let row = stdout.lines().find(|l| l.trim_start().starts_with(run))?;
            row.trim_start()[run.len()..]
                .split_whitespace()
                .nth(1)?
                .parse()
                .ok()
        };
        assert_eq!(
            flocked("no sharing"),
            Some(0),
            "`{line}`: without sharing nothing flocks: {stdout}"
        );
        assert!(
            flocked("sharing").is_some_and(|n| n > 0) && stdout.contains("mean wait"),
            "`{line}`: with sharing, jobs flock to the idle peer, and the waits are compared: \
             {stdout}"
        );
        for row in ["lend the nodes", "return them", "launch on borrowed nodes"] {
            let measured = stdout
                .lines()
                .find(|l| l.trim_start().starts_with(row))
                .is_some_and(|l| l.contains(" ms") || l.contains(" s "));
            assert!(measured, "`{line}` measures lending: {row}: {stdout}");
        }
    }
    if let Some(png) = line
        .split_whitespace()
        .skip_while(|w| *w != "--plot")
        .nth(1)
    {
        let bytes = std::fs::read(dir.join(png)).unwrap_or_default();
        assert!(
            bytes.starts_with(b"\x89PNG"),
            "`{line}` drew no figure in {png}"
        );
    }
}

#[test]
fn the_newcomers_two_commands_work() {
    let blocks = sh_blocks();
    assert!(blocks.len() >= 2, "README.md lost its quick start");
    let first = blocks[0].join("\n");
    let (build, job) = first
        .split_once(" && ")
        .expect("the first command builds, then runs a job");
    assert_eq!(build, "cargo build --release");
    assert_eq!(blocks[1], ["cargo test --workspace"], "the test command");
    let ci = std::fs::read_to_string(workspace().join(".ci/run")).unwrap();
    assert!(
        ci.lines().any(|l| l.trim() == "cargo test --workspace"),
        ".ci/run runs the README's test command"
    );
    ensure_daemons();
    let work = tempfile::tempdir().unwrap();
    let (ok, stdout, stderr) = run(job, work.path(), Duration::from_secs(120));
    assert!(ok, "{job}: {stderr}");
    assert_eq!(stdout.lines().count(), 4, "one line per node: {stdout}");
    check_output(job, &stdout, work.path());
}

#[test]
fn every_other_readme_command_works_as_written() {
    support::ensure_all_binaries();
    let blocks = sh_blocks();
    let mut ran = 0;
    for block in &blocks[2..] {
        let testbed_block = block.iter().any(|l| l.contains("storm-testbed up"));
        if testbed_block && !testbed::can_run("the README's testbed commands") {
            continue;
        }
        let work = tempfile::tempdir().unwrap();
        for line in block {
            if line == "cargo build --release" {
                continue; // built already: this test runs on the build's binaries
            }
            // A command may be fed by a pipe (`printf ... | ./target/release/...`).
            assert!(
                line.starts_with(RELEASE) || line.contains(&format!("| {RELEASE}")),
                "README command does not run a binary of this build: {line}"
            );
            let (ok, stdout, stderr) = run(line, work.path(), Duration::from_secs(600));
            ran += 1;
            let needs_libfabric = line.contains("ofi");
            if needs_libfabric && !cfg!(libfabric) {
                assert!(
                    !ok && stderr.contains("cannot load libfabric")
                        && stderr.contains("apt-get install libfabric1"),
                    "without libfabric, `{line}` must say what is missing: {stderr}"
                );
                continue;
            }
            if line.contains("storm-bench hpcc") && !Path::new("/usr/bin/hpcc").is_file() {
                assert!(
                    !ok && stderr.contains("apt-get install hpcc"),
                    "without hpcc, `{line}` must say what is missing: {stderr}"
                );
                eprintln!(
                    "NOT TESTED with hpcc: `{line}` (not installed; it said what to install)"
                );
                continue;
            }
            if line.contains("storm-bench mpi") && !mpich_installed() {
                assert!(
                    !ok && stderr.contains("apt-get install mpich"),
                    "without MPICH, `{line}` must say what is missing: {stderr}"
                );
                eprintln!("NOT TESTED with MPI: `{line}` (no mpicc here; it said what to install)");
                continue;
            }
            if !ok && testbed_block {
                let down = block.iter().find(|l| l.contains("storm-testbed down"));
                if let Some(down) = down {
                    run(down, work.path(), Duration::from_secs(60));
                }
            }
            assert!(ok, "`{line}` failed:\n{stderr}\n{stdout}");
            check_output(line, &stdout, work.path());
        }
    }
    assert!(ran >= 10, "the README's examples were found ({ran} run)");
}
