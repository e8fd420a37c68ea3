//! `storm-bench fabric`: the primitives across the nodes of a running instance (`storm start
//! -- storm-bench fabric`), on storm's own tcp fabric and on every libfabric provider
//! present that can do RMA between hosts, each beside libfabric's own `fi_pingpong` in the
//! same run where it is installed.
//!
//! The measuring program is a storm job: one rank per node ([`rank`], `storm-bench
//! fabric-rank`), which meet through the job's PMI-1 server (each puts the address it
//! listens on, `STORM_NODE_ADDR`, and rank 0 a key made for the run), start a primitives
//! node each, and measure between ranks 0 and 1 (and rank 0 to all the others):
//!
//! * **latency**, as osu_latency and ib_write_lat measure it: XFER-AND-SIGNAL of SIZE bytes
//!   to rank 1, which answers with the same; half the round trip;
//! * **bandwidth**, as osu_bw: a window of transfers to rank 1, answered by one small
//!   transfer once all have arrived;
//! * **COMPARE-AND-WRITE** latency on rank 1;
//! * **broadcast**: XFER-AND-SIGNAL to every other rank, until all have it.
//!
//! The driver ([`run`]) submits one such job per fabric through `storm-submit` (the
//! instance's `STORM_CONFIG`), reads rank 0's results, and prints them in OSU's and
//! perftest's columns beside fi_pingpong's figure for the same size.

use std::io::{Read, Write};
use std::net::{IpAddr, SocketAddr, TcpListener};
use std::os::fd::FromRawFd;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use bytes::Bytes;
use serde::{Deserialize, Serialize};
use storm_primitives::tcp::{TcpConfig, TcpNode};
use storm_primitives::{NodeSet, Primitives, Relation, Wait};

use crate::report::{Csv, Table, size_label};

/// One fabric to measure on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fabric {
    /// storm's own tcp fabric (authenticated, encrypted: the daemons' defaults).
    Tcp,
    /// libfabric with this provider.
    Ofi(String),
}

impl Fabric {
    pub fn label(&self) -> String {
        match self {
            Fabric::Tcp => "tcp".into(),
            Fabric::Ofi(p) => format!("ofi:{p}"),
        }
    }

    /// `tcp` or `ofi:PROVIDER`.
    pub fn parse(text: &str) -> Result<Self, String> {
        match text {
            "tcp" => Ok(Fabric::Tcp),
            _ => match text.strip_prefix("ofi:") {
                Some(p) if !p.is_empty() => Ok(Fabric::Ofi(p.to_string())),
                _ => Err(format!("{text:?}: a fabric is tcp or ofi:PROVIDER")),
            },
        }
    }
}

/// The libfabric providers that move data between hosts with RMA and atomics, as storm's
/// ofi backend uses them, in the order they are tried (fastest first). shm is one host's.
const HOST_PROVIDERS: &[&str] = &[
    "verbs;ofi_rxm",
    "efa",
    "cxi",
    "psm3",
    "opx",
    "tcp;ofi_rxm",
    "sockets",
];

/// storm's tcp fabric, and each provider of [`HOST_PROVIDERS`] that libfabric offers here.
pub fn fabrics_present() -> Vec<Fabric> {
    let mut out = vec![Fabric::Tcp];
    if storm_primitives::ofi::library().is_ok() {
        let present = storm_primitives::ofi::available_providers();
        for p in HOST_PROVIDERS {
            if present.iter().any(|n| n == p) {
                out.push(Fabric::Ofi(p.to_string()));
            }
        }
    }
    out
}

/// `storm-bench fabric`'s options.
#[derive(Debug, clap::Args)]
pub struct FabricCli {
    /// Fabrics: `tcp` and `ofi:PROVIDER`, comma-separated (default: every one present).
    #[arg(long, value_name = "LIST")]
    fabrics: Option<String>,
    /// Nodes of the measuring job (latency and bandwidth between the first two; a
    /// broadcast to the others).
    #[arg(long, default_value_t = 2)]
    nodes: u32,
    /// Transfer sizes (K, M suffixes are powers of 1024).
    #[arg(long, default_value = "8,64,1K,8K,64K,1M", value_parser = crate::report::parse_sizes)]
    sizes: std::vec::Vec<usize>,
    /// Measured round trips per size (after a tenth as many to warm up).
    #[arg(long, default_value_t = 1000)]
    iterations: u32,
    /// Transfers in flight in the bandwidth test (osu_bw's window).
    #[arg(long, default_value_t = 64)]
    window: u32,
    /// Do not run fi_pingpong beside each libfabric provider.
    #[arg(long)]
    no_fabtests: bool,
    /// Also write the results to this CSV file.
    #[arg(long)]
    csv: Option<std::path::PathBuf>,
    /// Also write the results to this JSON file.
    #[arg(long)]
    json: Option<std::path::PathBuf>,
    /// Also draw latency and bandwidth against size into this PNG file.
    #[arg(long, value_name = "FILE.png")]
    plot: Option<std::path::PathBuf>,
}

impl FabricCli {
    /// Measures, prints the tables, and writes what was asked for.
    pub fn run(self) -> Result<()> {
        let fabrics = match self.fabrics {
            Some(list) => list
                .split(',')
                .map(Fabric::parse)
                .collect::<Result<Vec<_>, _>>()
                .map_err(anyhow::Error::msg)?,
            None => fabrics_present(),
        };
        let args = FabricArgs {
            fabrics,
            nodes: self.nodes,
            sizes: self.sizes,
            iterations: self.iterations,
            window: self.window,
            fabtests: !self.no_fabtests,
        };
        let mut out = Csv::new(CSV_HEADER);
        let bin = storm_cli::local::bin_dir()?;
        let (tables, figures) = run(&args, &bin, &mut out)?;
        for table in tables {
            println!("{}", table.render());
        }
        out.write_if_asked(self.csv.as_deref())?;
        if let Some(path) = self.json {
            std::fs::write(&path, serde_json::to_string_pretty(&figures)?)?;
            eprintln!("wrote {}", path.display());
        }
        crate::plot_if_asked(self.plot.as_deref(), crate::plot::fabric(&figures))
    }
}

/// What to measure.
#[derive(Debug, Clone)]
pub struct FabricArgs {
    pub fabrics: Vec<Fabric>,
    /// Nodes of the job (2 or more: latency and bandwidth between the first two).
    pub nodes: u32,
    pub sizes: Vec<usize>,
    pub iterations: u32,
    /// Transfers in flight in the bandwidth test (osu_bw's window).
    pub window: u32,
    /// Run fi_pingpong beside each libfabric provider (where it is installed).
    pub fabtests: bool,
}

/// One figure from a rank-0 run.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Figure {
    pub fabric: String,
    /// `latency`, `bandwidth`, `compare_and_write`, `broadcast`, `fi_pingpong`.
    pub test: String,
    pub nodes: u32,
    pub size: usize,
    pub iterations: u32,
    /// Microseconds (latencies), or MB/s (bandwidth: `mb_per_s`).
    pub min_us: f64,
    pub median_us: f64,
    pub mean_us: f64,
    pub p99_us: f64,
    pub max_us: f64,
    pub mb_per_s: f64,
}

const RESULT_TAG: &str = "storm-fabric ";

pub const CSV_HEADER: &[&str] = &[
    "fabric",
    "test",
    "nodes",
    "size",
    "iterations",
    "min_us",
    "median_us",
    "mean_us",
    "p99_us",
    "max_us",
    "mb_per_s",
];

/// The measurements over every fabric: tables to print, and every figure (for CSV and
/// JSON).
pub fn run(args: &FabricArgs, bin: &Path, csv: &mut Csv) -> Result<(Vec<Table>, Vec<Figure>)> {
    if args.nodes < 2 {
        bail!(
            "storm-bench fabric needs at least 2 nodes, not {}",
            args.nodes
        );
    }
    if std::env::var_os("STORM_CONFIG").is_none() && std::env::var_os("STORM_SOCKET").is_none() {
        bail!(
            "storm-bench fabric measures across a running instance's nodes: run it as `storm \
             start -- storm-bench fabric` (or with STORM_CONFIG naming a cluster file)"
        );
    }
    let exe = std::env::current_exe().context("locating storm-bench")?;
    let mut figures = Vec::new();
    for fabric in &args.fabrics {
        let mut cmd = Command::new(bin.join("storm-submit"));
        cmd.args(["-N", &args.nodes.to_string(), "-n", &args.nodes.to_string()])
            .args(["--mpi", "pmi1", "--cpu-bind", "none"])
            .arg(&exe)
            .args(["fabric-rank", "--fabric", &fabric.label()])
            .args(rank_schedule_args(args));
        // A provider libfabric lists may still fail here (no device behind verbs, say): it
        // is named and skipped, and the others are measured.
        match rank_results(cmd) {
            Ok(found) => figures.extend(found),
            Err(e) => {
                eprintln!("storm-bench fabric: {}: {e:#} (skipped)", fabric.label());
                continue;
            }
        }
        if let (Fabric::Ofi(provider), true) = (fabric, args.fabtests) {
            if which("fi_pingpong") {
                let mut cmd = Command::new(bin.join("storm-submit"));
                cmd.args(["-N", "2", "-n", "2", "--mpi", "pmi1", "--cpu-bind", "none"])
                    .arg(&exe)
                    .args(["fabric-rank", "--pingpong", provider])
                    .args(rank_schedule_args(args));
                match rank_results(cmd) {
                    Ok(found) => figures.extend(found),
                    Err(e) => eprintln!("storm-bench fabric: fi_pingpong on {provider}: {e:#}"),
                }
            } else {
                eprintln!(
                    "storm-bench fabric: fi_pingpong is not installed (libfabric-bin): no \
                     libfabric baseline"
                );
            }
        }
    }
    if figures.is_empty() {
        bail!("no fabric could be measured (each one's failure is above)");
    }
    for f in &figures {
        csv.push(vec![
            f.fabric.clone(),
            f.test.clone(),
            f.nodes.to_string(),
            f.size.to_string(),
            f.iterations.to_string(),
            format!("{:.3}", f.min_us),
            format!("{:.3}", f.median_us),
            format!("{:.3}", f.mean_us),
            format!("{:.3}", f.p99_us),
            format!("{:.3}", f.max_us),
            format!("{:.3}", f.mb_per_s),
        ]);
    }
    Ok((tables(args, &figures), figures))
}

/// The schedule every rank follows (they must agree on it).
fn rank_schedule_args(args: &FabricArgs) -> Vec<String> {
    let sizes: Vec<String> = args.sizes.iter().map(|s| s.to_string()).collect();
    vec![
        "--sizes".into(),
        sizes.join(","),
        "--iterations".into(),
        args.iterations.to_string(),
        "--window".into(),
        args.window.to_string(),
    ]
}

/// Runs a measuring job; the figures its rank 0 printed. Its standard error goes to ours.
fn rank_results(mut cmd: Command) -> Result<Vec<Figure>> {
    let out = cmd
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .context("running storm-submit")?;
    let text = String::from_utf8_lossy(&out.stdout);
    if !out.status.success() {
        bail!("the measuring job failed ({}): {text}", out.status);
    }
    let figures: Vec<Figure> = text
        .lines()
        .filter_map(|l| l.strip_prefix(RESULT_TAG))
        .map(serde_json::from_str)
        .collect::<Result<_, _>>()
        .context("reading rank 0's results")?;
    if figures.is_empty() {
        bail!("rank 0 printed no result: {text}");
    }
    Ok(figures)
}

fn which(program: &str) -> bool {
    std::env::var_os("PATH")
        .is_some_and(|path| std::env::split_paths(&path).any(|d| d.join(program).is_file()))
}

/// OSU's and perftest's tables from the figures.
fn tables(args: &FabricArgs, figures: &[Figure]) -> Vec<Table> {
    let find = |fabric: &str, test: &str, size: usize| {
        figures
            .iter()
            .find(|f| f.fabric == fabric && f.test == test && f.size == size)
    };
    let mut out = Vec::new();
    for fabric in &args.fabrics {
        let label = fabric.label();
        let pingpong = match fabric {
            Fabric::Ofi(p) => format!("fi_pingpong:{p}"),
            Fabric::Tcp => String::new(),
        };
        let mut lat = Table::new(
            format!(
                "# storm XFER-AND-SIGNAL latency on {label}, 2 nodes (osu_latency's Size and \
                 Latency (us), one way; ib_write_lat's t_min/t_typical/t_avg/t_99; \
                 fi_pingpong's usec/xfer beside)"
            ),
            &[
                "# Size",
                "Latency (us)",
                "#iterations",
                "t_min[usec]",
                "t_typical[usec]",
                "t_avg[usec]",
                "t_99[usec]",
                "fi_pingpong (us)",
                "ratio",
            ],
        );
        let mut bw = Table::new(
            format!(
                "# storm XFER-AND-SIGNAL bandwidth on {label}, 2 nodes, window {} \
                 (osu_bw's Size and Bandwidth (MB/s))",
                args.window
            ),
            &["# Size", "Bandwidth (MB/s)"],
        );
        let mut bcast = Table::new(
            format!(
                "# storm XFER-AND-SIGNAL to all {} other nodes on {label} (until every one has \
                 it)",
                args.nodes - 1
            ),
            &["# Size", "Latency (us)", "t_99[usec]"],
        );
        for &size in &args.sizes {
            if let Some(f) = find(&label, "latency", size) {
                let pp = find(&pingpong, "fi_pingpong", size);
                lat.push(vec![
                    size.to_string(),
                    format!("{:.2}", f.median_us),
                    f.iterations.to_string(),
                    format!("{:.2}", f.min_us),
                    format!("{:.2}", f.median_us),
                    format!("{:.2}", f.mean_us),
                    format!("{:.2}", f.p99_us),
                    pp.map_or("-".into(), |p| format!("{:.2}", p.median_us)),
                    pp.map_or("-".into(), |p| format!("{:.2}", f.median_us / p.median_us)),
                ]);
            }
            if let Some(f) = find(&label, "bandwidth", size) {
                bw.push(vec![size.to_string(), format!("{:.2}", f.mb_per_s)]);
            }
            if let Some(f) = find(&label, "broadcast", size) {
                bcast.push(vec![
                    size.to_string(),
                    format!("{:.2}", f.median_us),
                    format!("{:.2}", f.p99_us),
                ]);
            }
        }
        let mut caw = Table::new(
            format!("# storm COMPARE-AND-WRITE latency on {label}, 2 nodes"),
            &["# Size", "Latency (us)", "t_min[usec]", "t_99[usec]"],
        );
        if let Some(f) = figures
            .iter()
            .find(|f| f.fabric == label && f.test == "compare_and_write")
        {
            caw.push(vec![
                size_label(f.size),
                format!("{:.2}", f.median_us),
                format!("{:.2}", f.min_us),
                format!("{:.2}", f.p99_us),
            ]);
        }
        out.extend([lat, bw, caw]);
        if args.nodes > 2 {
            out.push(bcast);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------------
// The ranks
// ---------------------------------------------------------------------------------------------

/// What one rank of the measuring job does (the driver passes the same to every rank).
#[derive(Debug, Clone, clap::Args)]
pub struct RankArgs {
    /// The primitives on this fabric; or, with `pingpong`, fi_pingpong on that provider.
    #[arg(long, value_parser = Fabric::parse)]
    pub fabric: Option<Fabric>,
    #[arg(long)]
    pub pingpong: Option<String>,
    #[arg(long, value_parser = crate::report::parse_sizes)]
    pub sizes: std::vec::Vec<usize>,
    #[arg(long)]
    pub iterations: u32,
    #[arg(long)]
    pub window: u32,
}

/// The job's PMI-1 link (`PMI_FD`, `PMI_RANK`, `PMI_SIZE`).
fn pmi() -> Result<storm_pmi::client::Client<UnixStream>> {
    let var = |k: &str| -> Result<i32> {
        std::env::var(k)
            .with_context(|| format!("{k} is not set: fabric-rank runs as a job with --mpi pmi1"))?
            .parse()
            .with_context(|| format!("{k} is not a number"))
    };
    let (fd, rank, size) = (var("PMI_FD")?, var("PMI_RANK")?, var("PMI_SIZE")?);
    // SAFETY: PMI_FD is the descriptor the node manager opened for this task, ours to own.
    let stream = unsafe { UnixStream::from_raw_fd(fd) };
    storm_pmi::client::Client::init(stream, rank, size).map_err(|e| anyhow::anyhow!("PMI: {e}"))
}

fn pmi_err(e: storm_pmi::client::Error) -> anyhow::Error {
    anyhow::anyhow!("PMI: {e}")
}

/// This node's address, where the other ranks reach this one.
fn node_addr() -> Result<IpAddr> {
    std::env::var("STORM_NODE_ADDR")
        .context("STORM_NODE_ADDR is not set (a storm job's task has it)")?
        .parse()
        .context("STORM_NODE_ADDR is not an address")
}

/// Runs one rank of the measuring job.
pub fn rank(args: &RankArgs) -> Result<()> {
    let mut pmi = pmi()?;
    let (me, size) = (pmi.rank as u32, pmi.size as u32);
    if size < 2 {
        bail!("the measuring job has {size} rank: it needs 2 or more, one per node");
    }
    let ip = node_addr()?;
    if let Some(provider) = &args.pingpong {
        return pingpong_rank(&mut pmi, me, ip, provider, args);
    }
    let fabric = args.fabric.clone().context("--fabric or --pingpong")?;
    let max = args.sizes.iter().copied().max().unwrap_or(8);
    let bl = crate::prims::bench_layout(max)?;
    // The run's own key: made by rank 0, passed through the job's PMI server.
    if me == 0 {
        let mut key = [0u8; 32];
        std::fs::File::open("/dev/urandom")
            .and_then(|mut f| f.read_exact(&mut key))
            .context("reading /dev/urandom")?;
        pmi.put("key", &hex(&key)).map_err(pmi_err)?;
    }
    let listener = TcpListener::bind((ip, 0)).with_context(|| format!("binding {ip}"))?;
    pmi.put(&format!("addr{me}"), &listener.local_addr()?.to_string())
        .map_err(pmi_err)?;
    pmi.barrier().map_err(pmi_err)?;
    let key = pmi
        .get("key")
        .map_err(pmi_err)?
        .context("no key from rank 0")?;
    let key = storm_primitives::tcp::auth::ClusterKey::from_hex(&key)
        .map_err(|e| anyhow::anyhow!("the run's key: {e}"))?;
    let mut directory = Vec::new();
    for r in 0..size {
        let addr: SocketAddr = pmi
            .get(&format!("addr{r}"))
            .map_err(pmi_err)?
            .with_context(|| format!("rank {r} put no address"))?
            .parse()
            .context("a rank's address")?;
        directory.push(Some(addr));
    }
    let config = TcpConfig {
        key,
        ..TcpConfig::default()
    };
    let node: Arc<dyn Primitives> = match &fabric {
        Fabric::Tcp => Arc::new(TcpNode::start(
            me,
            listener,
            directory,
            bl.layout.clone(),
            config,
        )?),
        Fabric::Ofi(provider) => {
            storm_primitives::ofi::library()?;
            if provider == "sockets" {
                // SAFETY: no libfabric call was made yet in this process.
                unsafe { std::env::set_var("FI_SOCKETS_PE_WAITTIME", "0") };
            }
            let boot_layout = storm_primitives::ofi::bootstrap_layout(size);
            let boot = TcpNode::start(me, listener, directory, boot_layout.layout.clone(), config)?;
            let mut ofi = storm_primitives::ofi::OfiConfig::new(provider);
            ofi.node = Some(ip.to_string());
            let node =
                storm_primitives::ofi::OfiNode::start(bl.layout.clone(), ofi, &boot, &boot_layout)
                    .with_context(|| format!("starting a {provider} node"))?;
            // Every rank has read every record before the bootstrap fabric goes.
            pmi.barrier().map_err(pmi_err)?;
            drop(boot);
            Arc::new(node)
        }
    };
    let run = Run {
        node,
        bl,
        me,
        size,
        label: fabric.label(),
        n: args.iterations.max(1),
    };
    for &bytes in &args.sizes {
        pmi.barrier().map_err(pmi_err)?;
        run.latency(bytes)?;
    }
    for &bytes in &args.sizes {
        pmi.barrier().map_err(pmi_err)?;
        run.bandwidth(bytes, args.window.max(1))?;
    }
    pmi.barrier().map_err(pmi_err)?;
    run.compare_and_write()?;
    if size > 2 {
        for &bytes in &args.sizes {
            pmi.barrier().map_err(pmi_err)?;
            run.broadcast(bytes)?;
        }
    }
    pmi.barrier().map_err(pmi_err)?;
    pmi.finalize().map_err(pmi_err)?;
    Ok(())
}

/// One rank's part in the measurements: rank 0 measures and prints, rank 1 answers, the
/// others take part in the broadcast only. Every rank runs the same schedule.
struct Run {
    node: Arc<dyn Primitives>,
    bl: crate::prims::BenchLayout,
    me: u32,
    size: u32,
    label: String,
    /// Measured operations per size (after a tenth as many to warm up).
    n: u32,
}

impl Run {
    fn warm(&self) -> u32 {
        (self.n / 10).max(1)
    }

    /// XFER-AND-SIGNAL of `data` to `dest`, raising `arrived` there, until it is done.
    fn send(&self, dest: &NodeSet, data: &Bytes) -> Result<()> {
        let bl = &self.bl;
        self.node.xfer_and_signal(
            dest,
            bl.data_offset,
            data.clone(),
            Some(bl.arrived),
            Some(bl.done),
        )?;
        self.wait(bl.done)
    }

    /// The next signal of `ev` here (an error after 30 s: a peer is gone).
    fn wait(&self, ev: storm_primitives::EventId) -> Result<()> {
        match self
            .node
            .test_event(ev, Wait::Timeout(Duration::from_secs(30)))
        {
            Ok(true) => Ok(()),
            Ok(false) => bail!("no event in 30 s"),
            Err(e) => Err(e.into()),
        }
    }

    /// Prints rank 0's figure for `test` from its samples (microseconds).
    fn say(&self, test: &str, nodes: u32, size: usize, mut us: Vec<f64>, mbs: f64) -> Result<()> {
        us.sort_by(f64::total_cmp);
        let q = |p: f64| us[((us.len() - 1) as f64 * p).round() as usize];
        let f = Figure {
            fabric: self.label.clone(),
            test: test.into(),
            nodes,
            size,
            iterations: us.len() as u32,
            min_us: us[0],
            median_us: q(0.5),
            mean_us: us.iter().sum::<f64>() / us.len() as f64,
            p99_us: q(0.99),
            max_us: us[us.len() - 1],
            mb_per_s: mbs,
        };
        let mut out = std::io::stdout().lock();
        writeln!(out, "{RESULT_TAG}{}", serde_json::to_string(&f)?)?;
        out.flush()?;
        Ok(())
    }

    /// Half a round trip of `size` bytes each way between ranks 0 and 1.
    fn latency(&self, size: usize) -> Result<()> {
        let data = Bytes::from(vec![0x5a; size]);
        let mut us = Vec::with_capacity(self.n as usize);
        for i in 0..self.warm() + self.n {
            match self.me {
                0 => {
                    let t = Instant::now();
                    self.send(&NodeSet::single(1), &data)?;
                    self.wait(self.bl.arrived)?;
                    if i >= self.warm() {
                        us.push(t.elapsed().as_secs_f64() * 1e6 / 2.0);
                    }
                }
                1 => {
                    self.wait(self.bl.arrived)?;
                    self.send(&NodeSet::single(0), &data)?;
                }
                _ => return Ok(()),
            }
        }
        if self.me == 0 {
            let mbs = size as f64 / (us[us.len() / 2] * 1e-6) / 1e6;
            self.say("latency", 2, size, us, mbs)?;
        }
        Ok(())
    }

    /// `window` transfers of `size` bytes in flight to rank 1, which answers once all
    /// arrived; rounds of that.
    fn bandwidth(&self, size: usize, window: u32) -> Result<()> {
        let bl = &self.bl;
        let data = Bytes::from(vec![0xa5; size]);
        let ack = Bytes::from_static(&[1u8; 8]);
        let rounds = (self.n / window).max(4);
        let mut us = Vec::new();
        for r in 0..rounds + 1 {
            match self.me {
                0 => {
                    let t = Instant::now();
                    for _ in 0..window {
                        self.node.xfer_and_signal(
                            &NodeSet::single(1),
                            bl.data_offset,
                            data.clone(),
                            Some(bl.arrived),
                            Some(bl.done),
                        )?;
                    }
                    for _ in 0..window {
                        self.wait(bl.done)?;
                    }
                    self.wait(bl.arrived)?;
                    if r > 0 {
                        us.push(t.elapsed().as_secs_f64() * 1e6);
                    }
                }
                1 => {
                    for _ in 0..window {
                        self.wait(bl.arrived)?;
                    }
                    self.send(&NodeSet::single(0), &ack)?;
                }
                _ => return Ok(()),
            }
        }
        if self.me == 0 {
            let total: f64 = us.iter().sum();
            let mbs = size as f64 * window as f64 * us.len() as f64 / (total * 1e-6) / 1e6;
            self.say("bandwidth", 2, size, us, mbs)?;
        }
        Ok(())
    }

    /// COMPARE-AND-WRITE of rank 1's variable, from rank 0.
    fn compare_and_write(&self) -> Result<()> {
        if self.me != 0 {
            return Ok(());
        }
        let mut us = Vec::with_capacity(self.n as usize);
        for i in 0..self.warm() + self.n {
            let t = Instant::now();
            self.node
                .compare_and_write(&NodeSet::single(1), self.bl.var, Relation::Eq, 0, None)?;
            if i >= self.warm() {
                us.push(t.elapsed().as_secs_f64() * 1e6);
            }
        }
        self.say("compare_and_write", 2, 8, us, 0.0)
    }

    /// XFER-AND-SIGNAL of `size` bytes from rank 0 to every other rank, until all have it.
    fn broadcast(&self, size: usize) -> Result<()> {
        let all: NodeSet = (1..self.size).collect();
        let data = Bytes::from(vec![0x3c; size]);
        let mut us = Vec::with_capacity(self.n as usize);
        for i in 0..self.warm() + self.n {
            if self.me == 0 {
                let t = Instant::now();
                self.send(&all, &data)?;
                if i >= self.warm() {
                    us.push(t.elapsed().as_secs_f64() * 1e6);
                }
            } else {
                self.wait(self.bl.arrived)?;
            }
        }
        if self.me == 0 {
            let mbs = size as f64 / (us[us.len() / 2] * 1e-6) / 1e6;
            self.say("broadcast", self.size, size, us, mbs)?;
        }
        Ok(())
    }
}

/// fi_pingpong between ranks 0 (client) and 1 (server) on `provider`, one run per size;
/// rank 0 prints its usec/xfer (one way, as fi_pingpong reports it).
fn pingpong_rank(
    pmi: &mut storm_pmi::client::Client<UnixStream>,
    me: u32,
    ip: IpAddr,
    provider: &str,
    args: &RankArgs,
) -> Result<()> {
    let n = args.iterations.max(1).to_string();
    // A port of the run's own: above the ephemeral range's usual start, by job.
    let job: u32 = std::env::var("STORM_JOB_ID")
        .ok()
        .and_then(|j| j.parse().ok())
        .unwrap_or(0);
    for (i, &size) in args.sizes.iter().enumerate() {
        let port = (20_000 + (job * 37 + i as u32) % 10_000).to_string();
        if me == 1 {
            pmi.put("server", &ip.to_string()).map_err(pmi_err)?;
        }
        let server = if me == 1 {
            Some(
                pingpong(provider, &n, size)
                    .args(["-B", &port])
                    .stdout(Stdio::null())
                    .spawn()
                    .context("starting fi_pingpong")?,
            )
        } else {
            None
        };
        pmi.barrier().map_err(pmi_err)?;
        if me == 0 {
            let server = pmi.get("server").map_err(pmi_err)?.context("no server")?;
            let mut last = String::new();
            let mut us = None;
            // The server may not listen yet: a few tries.
            for _ in 0..20 {
                let out = pingpong(provider, &n, size)
                    .args(["-P", &port, &server])
                    .output()
                    .context("running fi_pingpong")?;
                last = String::from_utf8_lossy(&out.stdout).into_owned()
                    + &String::from_utf8_lossy(&out.stderr);
                if out.status.success() {
                    us = pingpong_usec(&last, size);
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
            let us = us.with_context(|| format!("fi_pingpong gave no figure: {last}"))?;
            let f = Figure {
                fabric: format!("fi_pingpong:{provider}"),
                test: "fi_pingpong".into(),
                nodes: 2,
                size,
                iterations: args.iterations,
                min_us: us,
                median_us: us,
                mean_us: us,
                p99_us: us,
                max_us: us,
                mb_per_s: size as f64 / (us * 1e-6) / 1e6,
            };
            println!("{RESULT_TAG}{}", serde_json::to_string(&f)?);
        }
        if let Some(mut s) = server {
            let _ = s.wait();
        }
        pmi.barrier().map_err(pmi_err)?;
    }
    pmi.finalize().map_err(pmi_err)?;
    Ok(())
}

/// fi_pingpong on `provider`'s reliable datagrams, `iterations` messages of `size` bytes,
/// tuned as storm's ofi backend tunes it (the sockets provider's progress engine otherwise
/// sleeps about 10 ms per operation).
fn pingpong(provider: &str, iterations: &str, size: usize) -> Command {
    let mut cmd = Command::new("fi_pingpong");
    cmd.args(["-p", provider, "-e", "rdm", "-I", iterations])
        .args(["-S", &size.to_string()]);
    if provider == "sockets" {
        cmd.env("FI_SOCKETS_PE_WAITTIME", "0");
    }
    cmd
}

/// fi_pingpong's usec/xfer for `size` from its table (`bytes #sent #ack total time MB/sec
/// usec/xfer Mxfers/sec`).
pub fn pingpong_usec(text: &str, size: usize) -> Option<f64> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines
        .by_ref()
        .find(|l| l.starts_with("bytes"))?
        .split_whitespace()
        .collect();
    let col = header.iter().position(|h| *h == "usec/xfer")?;
    lines.find_map(|l| {
        let w: Vec<&str> = l.split_whitespace().collect();
        (pingpong_size(w.first()?)? == size)
            .then(|| w.get(col)?.parse().ok())
            .flatten()
    })
}

/// A size as fabtests writes it: bytes, or whole KiB, MiB, GiB with `k`, `m`, `g`.
fn pingpong_size(word: &str) -> Option<usize> {
    let (digits, shift) = match word.as_bytes().last()? {
        b'k' => (&word[..word.len() - 1], 10),
        b'm' => (&word[..word.len() - 1], 20),
        b'g' => (&word[..word.len() - 1], 30),
        _ => (word, 0),
    };
    digits.parse::<usize>().ok()?.checked_mul(1 << shift)
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// fi_pingpong's table as libfabric 1.17 prints it: the figure of the asked size.
    #[test]
    fn fi_pingpongs_usec_per_xfer_is_read_from_its_table() {
        let text = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                    64      1k      =1k      125k        0.04s      2.90      22.07       0.05\n";
        assert_eq!(pingpong_usec(text, 64), Some(22.07));
        let k = "bytes   #sent   #ack     total       time     MB/sec    usec/xfer   Mxfers/sec\n\
                 1k      200     =200     400k        0.04s     11.50      89.03       0.01\n";
        assert_eq!(pingpong_usec(k, 1024), Some(89.03));
        assert_eq!(pingpong_usec(k, 1), None);
        assert_eq!(pingpong_usec(text, 128), None);
        assert_eq!(pingpong_usec("garbage", 64), None);
    }

    #[test]
    fn fabrics_are_named_tcp_or_ofi_provider() {
        assert_eq!(Fabric::parse("tcp"), Ok(Fabric::Tcp));
        assert_eq!(
            Fabric::parse("ofi:tcp;ofi_rxm"),
            Ok(Fabric::Ofi("tcp;ofi_rxm".into()))
        );
        assert!(Fabric::parse("ofi:").is_err());
        assert!(Fabric::parse("ib").is_err());
        assert_eq!(Fabric::Ofi("sockets".into()).label(), "ofi:sockets");
    }
}
