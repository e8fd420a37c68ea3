//! The conformance suite on the `ofi` backend over libfabric's `sockets` provider.

storm_primitives::conformance_suite!(
    storm_primitives::conformance::OfiFactory::new("sockets");
    every case [#[cfg_attr(not(libfabric), ignore = "libfabric is not installed (apt-get install libfabric1): the ofi suite needs it")]]
);
