//! `storm-bench startup`: how long a daemon takes to start, from its fork/exec to ready.
//!
//! Each run starts an embedded cluster of one MM and one NM (the least a cluster is) and takes
//! every daemon's time from just before its fork/exec to its readiness notification (systemd's
//! `READY=1`, sent once the control socket is bound, the fabric endpoint is up and, for the MM,
//! the journal is restored). On the ofi backend that includes loading libfabric and the
//! address exchange with the other daemon.
//!
//! Baseline, measured in the same run and interleaved with the clusters: fork/exec of
//! `/bin/true` and waiting for its exit. The target for the tcp backend is to be within 10 ms
//! of it; the table gives the difference beside the ratio.

use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use storm_cli::local::{LocalCluster, LocalOptions};
use storm_cluster::config::BackendKind;

use crate::report::{Csv, Table};
use crate::stats::{Samples, fmt_time};

pub struct StartupArgs {
    pub backends: Vec<BackendKind>,
    pub provider: Option<String>,
    pub runs: usize,
}

pub const CSV_HEADER: &[&str] = &[
    "backend",
    "daemon",
    "runs",
    "median_s",
    "p90_s",
    "true_median_s",
    "difference_s",
    "ratio",
];

/// The backends that can run here: tcp, and ofi where libfabric loads (said on stderr when
/// it does not).
pub fn available_backends() -> Vec<BackendKind> {
    match storm_primitives::ofi::library() {
        Ok(_) => vec![BackendKind::Tcp, BackendKind::Ofi],
        Err(e) => {
            eprintln!("storm-bench startup: measuring tcp only: {e}");
            vec![BackendKind::Tcp]
        }
    }
}

/// One fork/exec of /bin/true, to its exit.
fn fork_exec_true() -> Result<Duration> {
    let t = Instant::now();
    let status = Command::new("/bin/true")
        .status()
        .context("running /bin/true")?;
    let elapsed = t.elapsed();
    if !status.success() {
        bail!("/bin/true failed");
    }
    Ok(elapsed)
}

/// Start-up times of the MM and the NM of one fresh cluster.
fn one_cluster(backend: BackendKind, provider: &Option<String>) -> Result<(Duration, Duration)> {
    let mut c = LocalCluster::start(&LocalOptions {
        backend,
        provider: provider.clone(),
        ..LocalOptions::new(1)
    })?;
    let times = c.ready_times();
    c.shutdown()?;
    let get = |name: &str| {
        times
            .iter()
            .find(|(n, _)| n == name)
            .and_then(|(_, t)| *t)
            .with_context(|| format!("{name} never said it was ready"))
    };
    Ok((get("storm-mm")?, get("storm-nm node0")?))
}

pub fn run(args: &StartupArgs, csv: &mut Csv) -> Result<Table> {
    let mut table = Table::new(
        format!(
            "Daemon start-up: fork/exec to ready (sd_notify READY=1) of the MM and the NM of a \
             1-node embedded cluster, {} runs per backend; baseline: fork/exec of /bin/true to \
             its exit, interleaved with the clusters",
            args.runs
        ),
        &[
            "backend",
            "daemon",
            "median",
            "p90",
            "/bin/true",
            "difference",
            "ratio",
        ],
    );
    for &backend in &args.backends {
        let (mut mm, mut nm, mut base) = (Vec::new(), Vec::new(), Vec::new());
        // One warm-up cluster: page cache, and libfabric's first load.
        one_cluster(backend, &args.provider)
            .with_context(|| format!("starting a {backend:?} cluster"))?;
        for _ in 0..args.runs {
            for _ in 0..5 {
                base.push(fork_exec_true()?.as_secs_f64());
            }
            let (m, n) = one_cluster(backend, &args.provider)?;
            mm.push(m.as_secs_f64());
            nm.push(n.as_secs_f64());
        }
        let base = Samples::from_secs(base);
        let floor = base.median();
        for (daemon, samples) in [("storm-mm", mm), ("storm-nm", nm)] {
            let s = Samples::from_secs(samples);
            let (median, p90) = (s.median(), s.quantile(0.9));
            let name = format!("{backend:?}").to_lowercase();
            table.push(vec![
                name.clone(),
                daemon.into(),
                fmt_time(median),
                fmt_time(p90),
                fmt_time(floor),
                format!("+{}", fmt_time(median - floor)),
                format!("{:.1}", median / floor),
            ]);
            csv.push(vec![
                name,
                daemon.into(),
                s.len().to_string(),
                format!("{median:.6}"),
                format!("{p90:.6}"),
                format!("{floor:.6}"),
                format!("{:.6}", median - floor),
                format!("{:.3}", median / floor),
            ]);
        }
    }
    Ok(table)
}
