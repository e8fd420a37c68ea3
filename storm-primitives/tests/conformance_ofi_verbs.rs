//! The conformance suite on InfiniBand: libfabric's verbs;ofi_rxm provider, whose memory
//! registration needs FI_MR_LOCAL, FI_MR_VIRT_ADDR, FI_MR_PROV_KEY and FI_MR_ENDPOINT. It runs
//! wherever an RDMA device exists (/sys/class/infiniband); elsewhere every case is reported as
//! ignored with that reason.

#![cfg(feature = "ofi")]

storm_primitives::conformance_suite!(
    storm_primitives::conformance::OfiFactory::new("verbs;ofi_rxm");
    every case [#[cfg_attr(not(rdma_device), ignore = "no RDMA device on this machine (/sys/class/infiniband is empty): the verbs;ofi_rxm suite needs InfiniBand hardware")]]
);
