//! The conformance suite on the `ofi` backend, unchanged, on libfabric's `tcp;ofi_rxm`.
//! (`sockets` and `shm` are in conformance_ofi_other.rs.)

#![cfg(feature = "ofi")]

storm_primitives::conformance_suite!(storm_primitives::conformance::OfiFactory::new(
    "tcp;ofi_rxm"
));
