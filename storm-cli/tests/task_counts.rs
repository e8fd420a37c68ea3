//! `-N`, `-n`, `--ntasks-per-node` and `--overcommit` as srun reads them, end to end: which
//! nodes run how many ranks, on a cluster of 4 nodes of 2 CPUs.

mod support;

use std::collections::BTreeMap;

use storm_cli::local::LocalOptions;
use support::{TestCluster, text};

fn cluster() -> TestCluster {
    TestCluster::with(LocalOptions {
        cpus: Some(2),
        ..LocalOptions::new(4)
    })
}

/// Runs a job printing each rank's node; returns ranks per node id, or the error.
fn layout(c: &TestCluster, shape: &[&str]) -> Result<BTreeMap<u32, Vec<u32>>, String> {
    let mut args = shape.to_vec();
    args.extend(["sh", "-c", "echo $STORM_NODEID $STORM_RANK $STORM_SIZE"]);
    let out = c.submit(&args);
    if !out.status.success() {
        return Err(text(&out.stderr));
    }
    let mut by_node: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    let stdout = text(&out.stdout);
    let mut size = None;
    for line in stdout.lines() {
        let f: Vec<u32> = line
            .split_whitespace()
            .map(|w| w.parse().unwrap())
            .collect();
        by_node.entry(f[0]).or_default().push(f[1]);
        assert!(size.is_none() || size == Some(f[2]), "{stdout}");
        size = Some(f[2]);
    }
    for ranks in by_node.values_mut() {
        ranks.sort();
    }
    let total: usize = by_node.values().map(Vec::len).sum();
    assert_eq!(
        Some(total as u32),
        size,
        "every rank printed once: {stdout}"
    );
    Ok(by_node)
}

fn counts(l: &BTreeMap<u32, Vec<u32>>) -> Vec<usize> {
    l.values().map(Vec::len).collect()
}

#[test]
fn shapes_follow_srun() {
    let c = cluster();
    // -n alone: as many nodes as needed, each node's CPUs filled, ranks in blocks.
    let l = layout(&c, &["-n", "8"]).unwrap();
    assert_eq!(counts(&l), [2, 2, 2, 2]);
    for ranks in l.values() {
        assert_eq!(
            ranks[1],
            ranks[0] + 1,
            "consecutive ranks share a node: {l:?}"
        );
    }
    assert_eq!(counts(&layout(&c, &["-n", "3"]).unwrap()), [2, 1]);
    assert_eq!(counts(&layout(&c, &["-n", "1"]).unwrap()), [1]);
    // -N alone: one task per node.
    assert_eq!(counts(&layout(&c, &["-N", "3"]).unwrap()), [1, 1, 1]);
    // -N with -n: exactly those nodes.
    assert_eq!(
        counts(&layout(&c, &["-N", "4", "-n", "6"]).unwrap()),
        [2, 2, 1, 1]
    );
    // --ntasks-per-node keeps its meaning.
    assert_eq!(
        counts(&layout(&c, &["-N", "2", "--ntasks-per-node", "2"]).unwrap()),
        [2, 2]
    );
    assert_eq!(
        counts(&layout(&c, &["-n", "5", "--ntasks-per-node", "2"]).unwrap()),
        [2, 2, 1]
    );
}

#[test]
fn more_tasks_than_cpus_needs_overcommit() {
    let c = cluster();
    let err = layout(&c, &["-n", "9"]).unwrap_err();
    assert!(
        err.contains("asks for 9 tasks but the cluster has 8 CPUs (4 nodes of 2 CPUs)")
            && err.contains("--overcommit"),
        "{err}"
    );
    let err = layout(&c, &["-N", "1", "-n", "3"]).unwrap_err();
    assert!(err.contains("3 tasks on a node, which has 2 CPUs"), "{err}");
    let err = layout(&c, &["-N", "1", "--ntasks-per-node", "4"]).unwrap_err();
    assert!(err.contains("which has 2 CPUs"), "{err}");
    assert!(c.queued_jobs().is_empty(), "nothing was queued");
    assert_eq!(
        counts(&layout(&c, &["-n", "9", "-O"]).unwrap()),
        [3, 2, 2, 2]
    );
    assert_eq!(
        counts(&layout(&c, &["-N", "1", "-n", "3", "--overcommit"]).unwrap()),
        [3]
    );
}
