//! The local backend: a cluster whose MM and NMs are threads of one `storm-local` process over
//! an in-process fabric, and the daemons' refusal of a cluster file they cannot serve alone.

mod support;

use std::collections::BTreeSet;
use std::process::Command;

use storm_cli::local::LocalOptions;
use storm_cluster::config::BackendKind;
use support::{TEST_CPUS, TestCluster, bin_dir, ensure_daemons, text};

fn local_cluster(nodes: u32) -> TestCluster {
    TestCluster::with(LocalOptions {
        cpus: Some(TEST_CPUS),
        backend: BackendKind::Local,
        ..LocalOptions::new(nodes)
    })
}

#[test]
fn jobs_run_with_their_ranks_output_and_exit_codes_on_a_cluster_of_threads() {
    let c = local_cluster(3);
    let out = c.submit(&[
        "-N",
        "3",
        "-n",
        "6",
        "-l",
        "sh",
        "-c",
        "echo node=$STORM_NODEID; echo err-$STORM_RANK >&2",
    ]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let lines: BTreeSet<String> = text(&out.stdout).lines().map(str::to_string).collect();
    let want: BTreeSet<String> = (0..6).map(|r| format!("{r}: node={}", r / 2)).collect();
    assert_eq!(lines, want, "every rank once, two per node in rank order");
    let err = text(&out.stderr);
    for r in 0..6 {
        assert!(
            err.contains(&format!("{r}: err-{r}")),
            "rank {r}'s stderr: {err}"
        );
    }
    let failed = c.submit(&["-N", "2", "sh", "-c", "exit 3"]);
    assert_eq!(failed.status.code(), Some(3), "{}", text(&failed.stderr));
    // Two jobs wanting the same nodes at once: the scheduler runs both to the end.
    let a = c.spawn(&["-N", "3", "sleep", "0.3"]);
    let b = c.submit(&["-N", "3", "true"]);
    assert!(b.status.success(), "{}", text(&b.stderr));
    let a = a.wait_with_output().unwrap();
    assert!(a.status.success(), "{}", text(&a.stderr));
}

#[test]
fn the_separate_daemons_refuse_a_local_backend_cluster_and_storm_local_refuses_tcp() {
    ensure_daemons();
    let c = local_cluster(1);
    let file = c.root.join("cluster.toml");
    for (daemon, extra) in [("storm-mm", vec![]), ("storm-nm", vec!["--node", "node0"])] {
        let out = Command::new(bin_dir().join(daemon))
            .arg("--config")
            .arg(&file)
            .args(extra)
            .output()
            .unwrap();
        assert!(
            !out.status.success(),
            "{daemon} ran on a local-backend file"
        );
        let err = text(&out.stderr);
        assert!(err.contains("storm-local"), "{daemon} says: {err}");
    }
    let tcp = tempfile::tempdir().unwrap();
    let tcp_file = tcp.path().join("cluster.toml");
    let text_of = std::fs::read_to_string(&file)
        .unwrap()
        .replace("backend = \"local\"", "backend = \"tcp\"");
    std::fs::write(&tcp_file, text_of).unwrap();
    let out = Command::new(env!("CARGO_BIN_EXE_storm-local"))
        .arg("--config")
        .arg(&tcp_file)
        .output()
        .unwrap();
    assert!(!out.status.success(), "storm-local ran a tcp cluster");
    assert!(
        text(&out.stderr).contains("whose backend is \"local\""),
        "{}",
        text(&out.stderr)
    );
}
