//! Tells the tests what this machine has, so that those needing something absent are reported
//! as ignored, with the reason, instead of failing or passing silently:
//!
//! * `libfabric`: libfabric loads here (the ofi suites). Decided by the same loader the ofi
//!   backend uses, so `STORM_LIBFABRIC` and `LD_LIBRARY_PATH` count; re-run when the
//!   loader's cache changes, which installing or removing a library does.
//! * `rdma_device`: an RDMA device exists (the verbs suite needs InfiniBand hardware).

fn main() {
    println!("cargo::rustc-check-cfg=cfg(rdma_device)");
    println!("cargo::rustc-check-cfg=cfg(libfabric)");
    // Watched only where it exists: a path that does not counts as changed at every build,
    // which rebuilt this crate and every daemon at each `cargo` run (78 s here, once per test
    // binary in CI), and watching /sys/class instead makes cargo walk all of sysfs. A machine
    // that gains InfiniBand later needs `cargo clean -p storm-primitives` once.
    if std::path::Path::new("/sys/class/infiniband").exists() {
        println!("cargo::rerun-if-changed=/sys/class/infiniband");
    }
    println!("cargo::rerun-if-changed=/etc/ld.so.cache");
    println!("cargo::rerun-if-env-changed={}", ofi_sys::LIBRARY_VAR);
    println!("cargo::rerun-if-env-changed=LD_LIBRARY_PATH");
    let present = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    if present {
        println!("cargo::rustc-cfg=rdma_device");
    }
    if ofi_sys::library().is_ok() {
        println!("cargo::rustc-cfg=libfabric");
    }
}
