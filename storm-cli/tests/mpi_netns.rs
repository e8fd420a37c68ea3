//! MPI on the namespace testbed: each node a network namespace of its own, joined by a
//! bridge, so ranks on different nodes reach each other only over the network, as on a
//! cluster. MPICH, Open MPI 4 and a PMIx program each start as one world with no `--mpi`
//! flag and no `OMPI_MCA_*` variable.
//!
//! Needs root (namespaces; without them the test fails and says why unless
//! STORM_ALLOW_NO_NETNS=1), each MPI's `mpicc` (Debian: mpich, libmpich-dev, openmpi-bin,
//! libopenmpi-dev) and OpenPMIx with munged (libpmix-dev, munge); `.ci/run` installs them
//! and runs this file again once they are there. A part whose MPI is missing says NOT TESTED.

mod support;

use std::process::Command;

use support::mpi::{mpi_program, open_mpi_program, pmix_program, sorted_lines};
use support::testbed::{can_run, up};
use support::{bin_dir, text};

/// What `tests/mpi/hello.c` prints with 4 ranks: each sees the world of 4, the sum of an
/// allreduce, and its ring neighbour's token.
fn hello_lines() -> Vec<String> {
    let mut v: Vec<String> = (0..4)
        .map(|r| format!("rank {r} of 4 sum=4 from={}", (r + 3) % 4))
        .collect();
    v.sort();
    v
}

#[test]
fn mpi_programs_are_one_world_with_no_flags_across_namespaces() {
    let test = "mpi_netns: one world with no flags across namespaces";
    if !can_run(test) {
        return;
    }
    let work = tempfile::tempdir().unwrap();
    let ompi = work.path().join("ompi");
    std::fs::create_dir(&ompi).unwrap();
    let pmix_lines = vec![
        "rank 0 of 4 (local 0) got: hello from 1".to_string(),
        "rank 1 of 4 (local 1) got: hello from 2".to_string(),
        "rank 2 of 4 (local 0) got: hello from 3".to_string(),
        "rank 3 of 4 (local 1) got: hello from 0".to_string(),
    ];
    let pmix = pmix_program(test, work.path(), "pmix_client");
    // The last: a remote key that no fence collected, fetched by direct modex.
    let programs: Vec<(&str, std::path::PathBuf, &str, Vec<String>)> = [
        mpi_program(test, work.path(), "hello").map(|p| ("MPICH", p, "", hello_lines())),
        open_mpi_program(test, &ompi, "hello").map(|p| ("Open MPI", p, "", hello_lines())),
        pmix.clone().map(|p| ("PMIx", p, "", pmix_lines.clone())),
        pmix.map(|p| ("PMIx direct modex", p, "nofence", pmix_lines)),
    ]
    .into_iter()
    .flatten()
    .collect();
    if programs.is_empty() {
        return;
    }
    let tb = up(2, work.path());
    for (mpi, program, arg, want) in programs {
        let mut cmd = Command::new(bin_dir().join("storm-submit"));
        cmd.arg("--config")
            .arg(&tb.config_path)
            .args(["-N", "2", "-n", "4"])
            .arg(&program);
        if !arg.is_empty() {
            cmd.arg(arg);
        }
        for (k, _) in std::env::vars_os() {
            if k.to_string_lossy().starts_with("OMPI_MCA_") {
                cmd.env_remove(k);
            }
        }
        let out = cmd.output().unwrap();
        assert!(
            out.status.success(),
            "{mpi} on two namespace nodes: {}",
            text(&out.stderr)
        );
        assert_eq!(
            sorted_lines(&out.stdout),
            want,
            "{mpi}: 4 ranks on 2 namespace nodes are one world; stderr: {}",
            text(&out.stderr)
        );
        eprintln!("{mpi}: one world of 4 ranks across two namespace nodes");
    }
}
