//! The conformance suite on InfiniBand: libfabric's verbs;ofi_rxm provider, whose memory
//! registration needs FI_MR_LOCAL, FI_MR_VIRT_ADDR, FI_MR_PROV_KEY and FI_MR_ENDPOINT. It runs
//! wherever an RDMA device exists (/sys/class/infiniband) and libfabric is installed;
//! elsewhere every case is reported as ignored with that reason.

storm_primitives::conformance_suite!(
    storm_primitives::conformance::OfiFactory::new("verbs;ofi_rxm");
    every case [#[cfg_attr(not(all(rdma_device, libfabric)), ignore = "needs an RDMA device (/sys/class/infiniband) and libfabric: the verbs;ofi_rxm suite needs InfiniBand hardware")]]
);
