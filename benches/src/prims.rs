//! `storm-bench prims`: XFER-AND-SIGNAL latency and bandwidth, COMPARE-AND-WRITE latency,
//! each beside a baseline measured in the same run.
//!
//! The cluster has N+1 nodes: node 0 is the origin (as the machine manager would be) and the
//! operations cover nodes 1..=N. XFER-AND-SIGNAL is timed from the call to the local event
//! reporting success, that is until every destination has the data and has been signalled.

use std::sync::Arc;
use std::time::Instant;

use anyhow::{Result, bail};
use bytes::Bytes;
use storm_primitives::local::LocalFabric;
use storm_primitives::tcp::{TcpConfig, TcpNode};
use storm_primitives::{Layout, NodeSet, Primitives, Relation};

use crate::baseline;
use crate::report::{Csv, Table, size_label};
use crate::stats::{Budget, fmt_time, mb_per_s, sample};

/// Which backend to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    Local,
    Tcp,
    /// libfabric (`--provider`, default tcp;ofi_rxm).
    Ofi,
}

pub struct PrimsArgs {
    pub backend: Backend,
    pub provider: String,
    pub nodes: Vec<u32>,
    pub sizes: Vec<usize>,
    pub tcp: TcpConfig,
    pub budget: Budget,
}

pub(crate) struct BenchLayout {
    pub layout: Layout,
    pub var: storm_primitives::VarId,
    pub other: storm_primitives::VarId,
    pub data_offset: u64,
    pub arrived: storm_primitives::EventId,
    pub done: storm_primitives::EventId,
}

pub(crate) fn bench_layout(max_size: usize) -> Result<BenchLayout> {
    let mut b = Layout::builder();
    let var = b.var("var");
    let other = b.var("other");
    let data = b.area("data", max_size.max(8));
    let arrived = b.event("arrived");
    let done = b.event("done");
    Ok(BenchLayout {
        layout: b.build()?,
        var,
        other,
        data_offset: data.offset,
        arrived,
        done,
    })
}

/// A running cluster: the handles of its nodes.
struct Cluster(Vec<Arc<dyn Primitives>>);

impl Cluster {
    fn start(
        backend: Backend,
        n: u32,
        layout: &Layout,
        tcp: &TcpConfig,
        provider: &str,
    ) -> Result<Self> {
        Ok(Cluster(match backend {
            Backend::Local => LocalFabric::new(n, layout.clone())
                .all_nodes()
                .into_iter()
                .map(|n| Arc::new(n) as Arc<dyn Primitives>)
                .collect(),
            Backend::Tcp => TcpNode::local_cluster(n, layout, tcp)?
                .into_iter()
                .map(|n| Arc::new(n) as Arc<dyn Primitives>)
                .collect(),
            Backend::Ofi => {
                use storm_primitives::conformance::{ClusterFactory, OfiFactory};
                // Not installed: say so, naming the library and its package.
                storm_primitives::ofi::library()?;
                let factory = OfiFactory::new(provider);
                if !factory.available() {
                    bail!(
                        "libfabric provider {provider:?} is not available; providers found: {}",
                        storm_primitives::ofi::available_providers().join(", ")
                    );
                }
                let cluster = factory.start(n, layout);
                (0..n).map(|i| cluster.node(i)).collect()
            }
        }))
    }

    fn origin(&self) -> &Arc<dyn Primitives> {
        &self.0[0]
    }
}

pub fn run(args: &PrimsArgs, csv: &mut Csv) -> Result<Vec<Table>> {
    let max_size = args.sizes.iter().copied().max().unwrap_or(8);
    let bl = bench_layout(max_size)?;
    let baseline_name = match args.backend {
        Backend::Local => "memcpy",
        Backend::Tcp | Backend::Ofi => "raw TCP",
    };
    let backend_name = match args.backend {
        Backend::Local => "local".to_string(),
        Backend::Tcp => format!(
            "tcp (fanout {}, chunk {})",
            args.tcp.fanout,
            size_label(args.tcp.chunk_size)
        ),
        Backend::Ofi => format!("ofi ({}, flat RMA writes)", args.provider),
    };
    let mut xfer = Table::new(
        format!(
            "XFER-AND-SIGNAL, backend {backend_name}: node 0 to nodes 1..N, until the local event \
             reports success, all-or-nothing and applied on arrival (one phase on tcp); \
             baseline: one {baseline_name} of the same bytes"
        ),
        &[
            "N",
            "bytes",
            "median",
            "p90",
            "MB/s per node",
            "aggregate MB/s",
            baseline_name,
            "ratio",
            "ratio/N",
            "applied on arrival",
            "ratio",
        ],
    );
    let mut caw = Table::new(
        format!(
            "COMPARE-AND-WRITE, backend {backend_name}: from node 0 over nodes 1..N; baseline: \
             one {baseline_name} of 8 bytes"
        ),
        &[
            "N",
            "compare",
            "compare+write",
            baseline_name,
            "ratio (compare)",
        ],
    );

    // Baselines do not depend on N: measure each size once, up front.
    let mut base = std::collections::HashMap::new();
    for &size in args.sizes.iter().chain(std::iter::once(&8)) {
        let s = match args.backend {
            Backend::Local => baseline::memcpy(size, args.budget)?,
            Backend::Tcp | Backend::Ofi => baseline::raw_tcp(size, args.budget)?,
        };
        base.insert(size, s.median());
    }

    for &n in &args.nodes {
        let cluster = Cluster::start(args.backend, n + 1, &bl.layout, &args.tcp, &args.provider)?;
        let origin = cluster.origin().clone();
        let dest = NodeSet::range(1, n);
        for &size in &args.sizes {
            let data = Bytes::from(vec![0x3cu8; size]);
            let samples = sample(args.budget, || {
                crate::links::xfer(&*origin, &bl, &dest, &data)
            })?;
            let eager = sample(args.budget, || {
                crate::links::xfer_as(&*origin, &bl, &dest, &data, true)
            })?;
            let med = samples.median();
            let b = base[&size];
            xfer.push(vec![
                n.to_string(),
                size_label(size),
                fmt_time(med),
                fmt_time(samples.quantile(0.9)),
                format!("{:.1}", mb_per_s(size, med)),
                format!("{:.1}", mb_per_s(size * n as usize, med)),
                fmt_time(b),
                format!("{:.2}", med / b),
                format!("{:.2}", med / b / n as f64),
                fmt_time(eager.median()),
                format!("{:.2}", eager.median() / b),
            ]);
            csv.push(row(
                args.backend,
                "xfer_and_signal",
                n,
                size,
                &samples,
                baseline_name,
                b,
            ));
            csv.push(row(
                args.backend,
                "xfer_and_signal_on_arrival",
                n,
                size,
                &eager,
                baseline_name,
                b,
            ));
        }
        let compare = sample(args.budget, || {
            let t = Instant::now();
            if !origin.compare_and_write(&dest, bl.var, Relation::Eq, 0, None)? {
                bail!("compare unexpectedly false");
            }
            Ok(t.elapsed())
        })?;
        let mut value = 0u64;
        let write = sample(args.budget, || {
            value += 1;
            let t = Instant::now();
            if !origin.compare_and_write(&dest, bl.var, Relation::Eq, 0, Some((bl.other, value)))? {
                bail!("compare unexpectedly false");
            }
            Ok(t.elapsed())
        })?;
        let b = base[&8];
        caw.push(vec![
            n.to_string(),
            fmt_time(compare.median()),
            fmt_time(write.median()),
            fmt_time(b),
            format!("{:.2}", compare.median() / b),
        ]);
        csv.push(row(
            args.backend,
            "compare_and_write",
            n,
            8,
            &compare,
            baseline_name,
            b,
        ));
        csv.push(row(
            args.backend,
            "compare_and_write+write",
            n,
            8,
            &write,
            baseline_name,
            b,
        ));
        eprintln!("  measured N = {n}");
    }
    Ok(vec![xfer, caw])
}

fn row(
    backend: Backend,
    op: &str,
    n: u32,
    size: usize,
    s: &crate::stats::Samples,
    baseline: &str,
    b: f64,
) -> Vec<String> {
    let med = s.median();
    vec![
        format!("{backend:?}").to_lowercase(),
        op.to_string(),
        n.to_string(),
        size.to_string(),
        format!("{med:.9}"),
        format!("{:.9}", s.quantile(0.9)),
        s.len().to_string(),
        format!("{:.3}", mb_per_s(size, med)),
        baseline.to_string(),
        format!("{b:.9}"),
        format!("{:.4}", med / b),
    ]
}

pub const CSV_HEADER: &[&str] = &[
    "backend",
    "op",
    "nodes",
    "bytes",
    "median_s",
    "p90_s",
    "samples",
    "mb_per_s",
    "baseline",
    "baseline_median_s",
    "ratio",
];
