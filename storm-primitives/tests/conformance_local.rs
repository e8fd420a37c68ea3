//! The conformance suite on the `local` backend.

storm_primitives::conformance_suite!(storm_primitives::conformance::LocalFactory);
