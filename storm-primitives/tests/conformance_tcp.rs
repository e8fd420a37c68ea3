//! The conformance suite on the `tcp` backend, in three tree shapes: the default binary tree,
//! a chain (fanout 1, the deepest pipeline) with small chunks so every transfer is many
//! frames, and a flat tree (fanout 16).

use std::time::Duration;

use storm_primitives::conformance::TcpFactory;
use storm_primitives::tcp::TcpConfig;

fn config(fanout: usize, chunk_size: usize) -> TcpFactory {
    TcpFactory(TcpConfig {
        fanout,
        chunk_size,
        op_timeout: Duration::from_secs(3),
        ..TcpConfig::default()
    })
}

mod binary_tree {
    storm_primitives::conformance_suite!(storm_primitives::conformance::TcpFactory::default());
}

mod chain_small_chunks {
    storm_primitives::conformance_suite!(super::config(1, 16 * 1024));
}

mod flat_tree {
    storm_primitives::conformance_suite!(super::config(16, 1 << 20));
}
