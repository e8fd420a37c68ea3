//! The conformance suite on tcp;ofi_rxm with every local buffer registered as FI_MR_LOCAL
//! providers (InfiniBand verbs) require: the registration path runs for real here although this
//! provider does not demand it.

storm_primitives::conformance_suite!(
    storm_primitives::conformance::OfiFactory {
        force_mr_local: true,
        ..storm_primitives::conformance::OfiFactory::new("tcp;ofi_rxm")
    };
    every case [#[cfg_attr(not(libfabric), ignore = "libfabric is not installed (apt-get install libfabric1): the ofi suite needs it")]]
);
