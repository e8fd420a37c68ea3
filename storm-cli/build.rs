//! Tells the tests what this machine has, so that those needing something absent are reported
//! as ignored, with the reason, instead of failing or passing silently:
//!
//! * `libfabric`: libfabric loads here (jobs on the ofi backend). The same loader as the ofi
//!   backend decides; see storm-primitives/build.rs.
//! * `promtool`: Prometheus's `promtool` is installed (Debian package `prometheus`), to check
//!   `storm metrics` output.

use std::path::Path;

fn main() {
    println!("cargo::rustc-check-cfg=cfg(libfabric)");
    println!("cargo::rustc-check-cfg=cfg(promtool)");
    println!("cargo::rerun-if-changed=/etc/ld.so.cache");
    println!("cargo::rerun-if-env-changed={}", ofi_sys::LIBRARY_VAR);
    println!("cargo::rerun-if-env-changed=LD_LIBRARY_PATH");
    println!("cargo::rerun-if-env-changed=PATH");
    if ofi_sys::library().is_ok() {
        println!("cargo::rustc-cfg=libfabric");
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs: Vec<_> = std::env::split_paths(&path).collect();
    // Installing a package changes the directory it puts its program in.
    for dir in dirs.iter().filter(|d| d.starts_with("/usr") && d.is_dir()) {
        println!("cargo::rerun-if-changed={}", dir.display());
    }
    if dirs.iter().any(|d| Path::new(d).join("promtool").is_file()) {
        println!("cargo::rustc-cfg=promtool");
    }
}
