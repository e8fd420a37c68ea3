//! The conformance suite on the `ofi` backend, unchanged, on libfabric's `tcp;ofi_rxm`.
//! (`sockets`, `shm` and forced FI_MR_LOCAL have their own files.) Where libfabric is not
//! installed every case is reported as ignored, with that reason.

storm_primitives::conformance_suite!(
    storm_primitives::conformance::OfiFactory::new("tcp;ofi_rxm");
    every case [#[cfg_attr(not(libfabric), ignore = "libfabric is not installed (apt-get install libfabric1): the ofi suite needs it")]]
);
