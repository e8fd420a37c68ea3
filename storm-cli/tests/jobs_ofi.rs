//! Jobs end to end with the daemons on the ofi backend (libfabric tcp;ofi_rxm): the heartbeat,
//! the program transfer, output and termination all ride on RMA writes and network atomics.
//! Where libfabric is not installed, the tests are reported as ignored with that reason.

mod support;

use std::collections::BTreeSet;

use storm_cli::local::LocalOptions;
use storm_cluster::config::BackendKind;
use support::{TestCluster, script, text};

fn ofi_cluster(nodes: u32) -> TestCluster {
    TestCluster::with(LocalOptions {
        backend: BackendKind::Ofi,
        provider: Some("tcp;ofi_rxm".into()),
        ..LocalOptions::new(nodes)
    })
}

#[test]
#[cfg_attr(
    not(libfabric),
    ignore = "libfabric is not installed (apt-get install libfabric1): the ofi backend needs it"
)]
fn an_eight_node_job_runs_end_to_end_on_the_ofi_backend() {
    let c = ofi_cluster(8);
    let work = tempfile::tempdir().unwrap();
    // Padded to 3 MB so the transfer takes several chunks of the chunk queue.
    let mut body = String::from(
        "echo \"RANK=$STORM_RANK NODE=$STORM_NODEID SUM=$(sha256sum < \"$0\" | cut -d' ' -f1)\"\n[ $STORM_RANK = 13 ] && exit 4\nexit 0\n",
    );
    body.push_str(&"#".repeat(3 << 20));
    let prog = script(work.path(), "ofi.sh", &body);
    let want = text(
        &std::process::Command::new("sha256sum")
            .arg(&prog)
            .output()
            .unwrap()
            .stdout,
    )
    .split_whitespace()
    .next()
    .unwrap()
    .to_string();
    let out = c.submit(&["-N", "8", "-n", "16", "-l", prog.to_str().unwrap()]);
    let stdout = text(&out.stdout);
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(4), "rank 13 exits 4: {stderr}");
    assert!(stderr.contains("rank 13 on node6: exit code 4"), "{stderr}");
    let ranks: BTreeSet<u32> = stdout
        .lines()
        .map(|l| l.split(": ").next().unwrap().parse().unwrap())
        .collect();
    assert_eq!(ranks, (0..16).collect(), "every rank ran once: {stdout}");
    for line in stdout.lines() {
        assert!(
            line.ends_with(&format!("SUM={want}")),
            "a node ran a different program: {line}"
        );
    }
    let nodes: BTreeSet<&str> = stdout
        .lines()
        .filter_map(|l| l.split("NODE=").nth(1)?.split(' ').next())
        .collect();
    assert_eq!(nodes.len(), 8);
}

#[test]
#[cfg_attr(
    not(libfabric),
    ignore = "libfabric is not installed (apt-get install libfabric1): the ofi backend needs it"
)]
fn a_missing_provider_is_named_with_the_ones_that_exist() {
    support::ensure_daemons();
    let err = match storm_cli::local::LocalCluster::start(&LocalOptions {
        backend: BackendKind::Ofi,
        provider: Some("no-such-provider".into()),
        ..LocalOptions::new(1)
    }) {
        Ok(_) => panic!("a cluster started on a provider that does not exist"),
        Err(e) => format!("{e:#}"),
    };
    assert!(err.contains("provider \"no-such-provider\""), "{err}");
    assert!(
        err.contains("providers found:") && err.contains("tcp;ofi_rxm"),
        "{err}"
    );
}
