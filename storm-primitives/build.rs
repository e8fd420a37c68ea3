//! Detects RDMA devices, so the tests that need real InfiniBand hardware run where it exists
//! and are reported as ignored, with the reason, where it does not.

fn main() {
    println!("cargo::rustc-check-cfg=cfg(rdma_device)");
    println!("cargo::rerun-if-changed=/sys/class/infiniband");
    let present = std::fs::read_dir("/sys/class/infiniband").is_ok_and(|mut d| d.next().is_some());
    if present {
        println!("cargo::rustc-cfg=rdma_device");
    }
}
