//! The conformance suite on the `ofi` backend over libfabric's `sockets` provider.

#![cfg(feature = "ofi")]

storm_primitives::conformance_suite!(storm_primitives::conformance::OfiFactory::new("sockets"));
