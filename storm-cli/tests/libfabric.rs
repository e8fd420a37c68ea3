//! libfabric is loaded at run time, only by the ofi backend:
//!
//! * no storm binary links it (`readelf -d` lists no libfabric, PSM or verbs library);
//! * daemons on the tcp backend never map it, and daemons on the ofi backend do;
//! * asking for the ofi backend where libfabric cannot be loaded is one clear error naming the
//!   library and the package that provides it, and tcp jobs are untouched by its absence.

mod support;

use std::process::Command;

use storm_cli::local::LocalOptions;
use storm_cluster::config::BackendKind;
use support::{TestCluster, bin_dir, ensure_daemons, text};

/// Libraries that must never be a storm binary's NEEDED entry.
const FABRIC_LIBS: [&str; 4] = ["libfabric", "libpsm", "libibverbs", "librdmacm"];

#[test]
fn no_storm_binary_links_libfabric() {
    support::ensure_all_binaries();
    let bins = [
        "storm-mm",
        "storm-nm",
        "storm-pl",
        "storm-submit",
        "storm",
        "storm-testbed",
        "storm-bench",
        "storm-prim-node",
    ];
    for bin in bins {
        let path = bin_dir().join(bin);
        let out = Command::new("readelf")
            .arg("-d")
            .arg(&path)
            .output()
            .expect("readelf (binutils) runs");
        assert!(out.status.success(), "readelf -d {}", path.display());
        let dynamic = text(&out.stdout);
        let needed: Vec<&str> = dynamic.lines().filter(|l| l.contains("(NEEDED)")).collect();
        assert!(
            needed.iter().any(|l| l.contains("libc.so")),
            "readelf output of {bin} lists its libraries: {dynamic}"
        );
        for lib in FABRIC_LIBS {
            assert!(
                !needed.iter().any(|l| l.contains(lib)),
                "{bin} links {lib}: {needed:?}"
            );
        }
    }
}

/// Whether process `pid` has a libfabric mapped.
fn maps_libfabric(pid: u32) -> bool {
    let maps = std::fs::read_to_string(format!("/proc/{pid}/maps")).expect("read /proc/PID/maps");
    maps.contains("libfabric")
}

#[test]
fn daemons_on_the_tcp_backend_never_load_libfabric() {
    let c = TestCluster::start(2);
    let out = c.submit(&["-N", "2", "true"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let pids = c.cluster.as_ref().unwrap().daemon_pids();
    assert_eq!(pids.len(), 3, "the MM and two NMs");
    for (name, pid) in pids {
        assert!(!maps_libfabric(pid), "{name} (tcp) mapped libfabric");
    }
}

#[test]
#[cfg_attr(
    not(libfabric),
    ignore = "libfabric is not installed (apt-get install libfabric1): the ofi backend needs it"
)]
fn daemons_on_the_ofi_backend_load_libfabric() {
    let c = TestCluster::with(LocalOptions {
        backend: BackendKind::Ofi,
        provider: Some("tcp;ofi_rxm".into()),
        ..LocalOptions::new(2)
    });
    for (name, pid) in c.cluster.as_ref().unwrap().daemon_pids() {
        assert!(maps_libfabric(pid), "{name} (ofi) has no libfabric mapped");
    }
}

#[test]
fn the_ofi_backend_without_libfabric_is_a_clear_error_and_tcp_still_works() {
    ensure_daemons();
    let work = tempfile::tempdir().unwrap();
    let submit = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_storm-submit"))
            .args(args)
            .current_dir(work.path())
            .env("STORM_BIN_DIR", bin_dir())
            // As on a machine where libfabric is not installed.
            .env("STORM_LIBFABRIC", "/nonexistent/libfabric.so.1")
            .output()
            .expect("run storm-submit")
    };
    let out = submit(&["--local", "2", "--backend", "ofi", "true"]);
    let err = text(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("cannot load libfabric"), "{err}");
    assert!(
        err.contains("/nonexistent/libfabric.so.1"),
        "the library tried: {err}"
    );
    assert!(
        err.contains("apt-get install libfabric1"),
        "the package: {err}"
    );
    assert!(!err.contains("panicked"), "{err}");
    let out = submit(&["--local", "2", "--label", "echo", "fine"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    // Ranks on different nodes print in whatever order they run.
    let mut lines: Vec<String> = text(&out.stdout).lines().map(String::from).collect();
    lines.sort();
    assert_eq!(lines, ["0: fine", "1: fine"]);
}
