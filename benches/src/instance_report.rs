//! `storm-bench report --out DIR`, inside an instance (`storm start -- storm-bench report
//! --out DIR`): one command for the whole picture of a fresh allocation.
//!
//! * the primitives on every fabric present ([`crate::fabric`]), over all of the instance's
//!   nodes, beside fi_pingpong: `fabric.txt`, `fabric.csv`, `fabric.json`, `fabric.png`;
//! * launch against node count: `storm-submit -N K /bin/true` to its exit for K = 1, 2, 4,
//!   ... up to the instance's nodes, beside `srun --overlap -N K true` in the same run where
//!   Slurm gave the nodes: `launch.txt`, `launch.csv`, `launch.json`.
//!
//! * the heartbeat at the instance's size: the MM's own histogram of heartbeat round trips
//!   (issued to delivered on every node, `storm metrics`) over 5 idle seconds, and the
//!   heartbeats any node missed: `heartbeat.txt`, `heartbeat.json`;
//! * gang scheduling at the instance's size where it gang-schedules, as the tasks see it
//!   ([`crate::instance_gang`]), or why not: `gang.txt`, `gang.json`.
//!
//! `--parts` picks some of them.
//! Everything printed is also in `report.txt`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::fabric::{self, FabricArgs};
use crate::report::{Csv, Table};

/// The cluster file of the instance this runs in (`STORM_CONFIG`).
fn instance_config() -> Result<storm_cluster::ClusterConfig> {
    let path = std::env::var_os("STORM_CONFIG").context(
        "storm-bench report runs inside an instance: storm start -- storm-bench report --out DIR",
    )?;
    storm_cluster::ClusterConfig::load(Path::new(&path))
        .with_context(|| format!("reading {}", Path::new(&path).display()))
}

/// The parts of the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Part {
    Fabric,
    Launch,
    Heartbeat,
    Gang,
}

/// What `storm-bench report` measures, and how much.
#[derive(Debug, Clone)]
pub struct ReportArgs {
    pub parts: Vec<Part>,
    /// Measured round trips per size.
    pub iterations: u32,
    /// Measured launches per node count.
    pub runs: usize,
    /// CPU seconds of each gang probe rank.
    pub gang_cpu_s: f64,
    /// Gang probe ranks per node (default: the fewest CPUs a node has).
    pub gang_ranks_per_node: Option<u32>,
}

/// 1, 2, 4, ... up to `n`, and `n`.
fn node_counts(n: u32) -> Vec<u32> {
    let mut out: Vec<u32> = std::iter::successors(Some(1u32), |k| k.checked_mul(2))
        .take_while(|&k| k < n)
        .collect();
    out.push(n);
    out
}

/// The median of `runs` runs of `cmd` (built anew each time) to its exit, in seconds.
fn median_run(runs: usize, mut cmd: impl FnMut() -> Command) -> Result<f64> {
    let mut times = Vec::with_capacity(runs);
    for i in 0..runs + 1 {
        let t = Instant::now();
        let status = cmd()
            .stdout(Stdio::null())
            .status()
            .context("running a launch")?;
        if !status.success() {
            bail!("a launch failed: {status}");
        }
        if i > 0 {
            times.push(t.elapsed().as_secs_f64());
        }
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// The heartbeat figures between two snapshots of the MM's metrics.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Heartbeats {
    pub count: u64,
    pub mean_s: f64,
    /// The upper bound of the histogram bucket holding the median, and the 99th percentile.
    pub p50_le_s: f64,
    pub p99_le_s: f64,
    pub missed: u64,
}

/// The cumulative buckets (upper bound, count), sum, count and missed total of the
/// heartbeat metrics in Prometheus text.
fn heartbeat_metrics(text: &str) -> (Vec<(f64, u64)>, f64, u64, u64) {
    let mut buckets = Vec::new();
    let (mut sum, mut count, mut missed) = (0.0, 0, 0);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((name, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let value = value.trim();
        if let Some(le) = name
            .strip_prefix("storm_heartbeat_round_trip_seconds_bucket{le=\"")
            .and_then(|r| r.strip_suffix("\"}"))
        {
            let le = if le == "+Inf" {
                f64::INFINITY
            } else {
                le.parse().unwrap_or(f64::NAN)
            };
            if let Ok(n) = value.parse::<f64>() {
                buckets.push((le, n as u64));
            }
        } else if name == "storm_heartbeat_round_trip_seconds_sum" {
            sum = value.parse().unwrap_or(0.0);
        } else if name == "storm_heartbeat_round_trip_seconds_count" {
            count = value.parse::<f64>().unwrap_or(0.0) as u64;
        } else if name == "storm_heartbeats_missed_total" {
            missed = value.parse::<f64>().unwrap_or(0.0) as u64;
        }
    }
    (buckets, sum, count, missed)
}

/// What happened between metrics snapshots `before` and `after`; `None` without heartbeats.
pub fn heartbeats_between(before: &str, after: &str) -> Option<Heartbeats> {
    let (b0, s0, c0, m0) = heartbeat_metrics(before);
    let (b1, s1, c1, m1) = heartbeat_metrics(after);
    let count = c1.checked_sub(c0)?;
    if count == 0 {
        return None;
    }
    let delta: Vec<(f64, u64)> = b1
        .iter()
        .map(|&(le, n)| {
            let was = b0.iter().find(|(l, _)| *l == le).map_or(0, |(_, n)| *n);
            (le, n.saturating_sub(was))
        })
        .collect();
    let quantile = |q: f64| {
        let want = (count as f64 * q).ceil() as u64;
        delta
            .iter()
            .find(|(_, n)| *n >= want.max(1))
            .map_or(f64::INFINITY, |(le, _)| *le)
    };
    Some(Heartbeats {
        count,
        mean_s: (s1 - s0) / count as f64,
        p50_le_s: quantile(0.5),
        p99_le_s: quantile(0.99),
        missed: m1.saturating_sub(m0),
    })
}

/// `storm metrics` of the instance, as text.
fn metrics(bin: &Path) -> Result<String> {
    let out = Command::new(bin.join("storm"))
        .arg("metrics")
        .output()
        .context("running storm metrics")?;
    if !out.status.success() {
        bail!(
            "storm metrics failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

#[derive(Serialize)]
struct LaunchFigure {
    nodes: u32,
    storm_median_s: f64,
    srun_median_s: Option<f64>,
}

/// Writes the report into `dir`.
pub fn run(dir: &Path, report: &ReportArgs) -> Result<()> {
    let cfg = instance_config()?;
    let nodes = cfg.nodes.len() as u32;
    let (iterations, runs) = (report.iterations, report.runs);
    if nodes < 2 {
        bail!("the instance has {nodes} node: the report measures between 2 or more");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let bin = storm_cli::local::bin_dir()?;
    let mut text = String::new();
    if report.parts.contains(&Part::Fabric) {
        fabric_part(dir, nodes, iterations, &bin, &mut text)?;
    }
    if report.parts.contains(&Part::Launch) {
        launch_part(dir, nodes, runs, &bin, &mut text)?;
    }
    if report.parts.contains(&Part::Heartbeat) {
        heartbeat_part(dir, nodes, &bin, &mut text)?;
    }
    if report.parts.contains(&Part::Gang) {
        gang_part(dir, &cfg, report, &bin, &mut text)?;
    }
    std::fs::write(dir.join("report.txt"), text)?;
    eprintln!("wrote the report into {}", dir.display());
    Ok(())
}

/// Prints `t` and adds it to `text`.
fn say(t: &Table, text: &mut String) {
    let r = t.render();
    println!("{r}");
    text.push_str(&r);
    text.push('\n');
}

/// Gang scheduling at the instance's size, or why not: `gang.{txt,json}`.
fn gang_part(
    dir: &Path,
    cfg: &storm_cluster::ClusterConfig,
    report: &ReportArgs,
    bin: &Path,
    text: &mut String,
) -> Result<()> {
    let figures =
        crate::instance_gang::measure(cfg, bin, dir, report.gang_cpu_s, report.gang_ranks_per_node);
    let mut gang_text = String::new();
    say(&crate::instance_gang::table(&figures), &mut gang_text);
    std::fs::write(dir.join("gang.txt"), &gang_text)?;
    let json = match &figures {
        Ok(g) => serde_json::to_value(g)?,
        Err(why) => serde_json::json!({ "not_measured": why }),
    };
    std::fs::write(dir.join("gang.json"), serde_json::to_string_pretty(&json)?)?;
    text.push_str(&gang_text);
    Ok(())
}

/// The primitives on every fabric present: `fabric.{txt,csv,json,png}`.
fn fabric_part(
    dir: &Path,
    nodes: u32,
    iterations: u32,
    bin: &Path,
    text: &mut String,
) -> Result<()> {
    let args = FabricArgs {
        fabrics: fabric::fabrics_present(),
        nodes,
        sizes: vec![8, 64, 1 << 10, 8 << 10, 64 << 10, 1 << 20],
        iterations,
        window: 64,
        fabtests: true,
    };
    let mut csv = Csv::new(fabric::CSV_HEADER);
    let (tables, figures) = fabric::run(&args, bin, &mut csv)?;
    let mut fabric_text = String::new();
    for t in &tables {
        say(t, &mut fabric_text);
    }
    std::fs::write(dir.join("fabric.txt"), &fabric_text)?;
    text.push_str(&fabric_text);
    csv.write(&dir.join("fabric.csv"))?;
    std::fs::write(
        dir.join("fabric.json"),
        serde_json::to_string_pretty(&figures)?,
    )?;
    crate::plot::draw(&crate::plot::fabric(&figures), &dir.join("fabric.png"))?;
    Ok(())
}

/// Launch against node count beside srun: `launch.{txt,csv,json}`.
fn launch_part(dir: &Path, nodes: u32, runs: usize, bin: &Path, text: &mut String) -> Result<()> {
    let slurm = std::env::var_os("SLURM_JOB_ID").is_some();
    let mut launch = Table::new(
        format!(
            "# launch to exit against nodes: storm-submit -N K /bin/true{} (median of {runs})",
            if slurm {
                " beside srun --overlap -N K true in the same allocation"
            } else {
                ""
            }
        ),
        &["nodes", "storm", "srun", "ratio"],
    );
    let mut launch_csv = Csv::new(&["nodes", "storm_median_s", "srun_median_s", "ratio"]);
    let mut launch_json = Vec::new();
    for k in node_counts(nodes) {
        let ks = k.to_string();
        let storm = median_run(runs, || {
            let mut c = Command::new(bin.join("storm-submit"));
            c.args(["-N", &ks, "/bin/true"]);
            c
        })?;
        let srun = if slurm {
            Some(median_run(runs, || {
                let mut c = Command::new("srun");
                c.args(["--overlap", "-N", &ks, "-n", &ks, "--quiet", "true"]);
                c
            })?)
        } else {
            None
        };
        let ratio = srun.map(|s| storm / s);
        launch.push(vec![
            ks.clone(),
            crate::stats::fmt_time(storm),
            srun.map_or("-".into(), crate::stats::fmt_time),
            ratio.map_or("-".into(), |r| format!("{r:.2}")),
        ]);
        launch_csv.push(vec![
            ks,
            format!("{storm:.6}"),
            srun.map_or(String::new(), |s| format!("{s:.6}")),
            ratio.map_or(String::new(), |r| format!("{r:.3}")),
        ]);
        launch_json.push(LaunchFigure {
            nodes: k,
            storm_median_s: storm,
            srun_median_s: srun,
        });
    }
    let mut launch_text = String::new();
    say(&launch, &mut launch_text);
    std::fs::write(dir.join("launch.txt"), &launch_text)?;
    text.push_str(&launch_text);
    launch_csv.write(&dir.join("launch.csv"))?;
    std::fs::write(
        dir.join("launch.json"),
        serde_json::to_string_pretty(&launch_json)?,
    )?;
    Ok(())
}

/// The heartbeat over idle seconds, at the instance's size: `heartbeat.{txt,json}`.
fn heartbeat_part(dir: &Path, nodes: u32, bin: &Path, text: &mut String) -> Result<()> {
    let before = metrics(bin)?;
    std::thread::sleep(std::time::Duration::from_secs(5));
    let after = metrics(bin)?;
    let beats =
        heartbeats_between(&before, &after).context("the MM counted no heartbeat in 5 s")?;
    let mut hb = Table::new(
        format!(
            "# heartbeat to all {nodes} nodes over 5 idle seconds (the MM's histogram: issued \
             to delivered everywhere; p50 and p99 as the upper bounds of their buckets)"
        ),
        &["heartbeats", "mean", "p50 <=", "p99 <=", "missed"],
    );
    hb.push(vec![
        beats.count.to_string(),
        crate::stats::fmt_time(beats.mean_s),
        crate::stats::fmt_time(beats.p50_le_s),
        crate::stats::fmt_time(beats.p99_le_s),
        beats.missed.to_string(),
    ]);
    let mut hb_text = String::new();
    say(&hb, &mut hb_text);
    std::fs::write(dir.join("heartbeat.txt"), &hb_text)?;
    std::fs::write(
        dir.join("heartbeat.json"),
        serde_json::to_string_pretty(&beats)?,
    )?;
    text.push_str(&hb_text);
    Ok(())
}

#[cfg(test)]
mod tests {
    /// Two snapshots of the MM's metrics as `storm metrics` prints them: the heartbeats
    /// between them, their mean, the buckets of their median and 99th percentile, and the
    /// misses.
    #[test]
    fn heartbeats_are_read_between_two_snapshots_of_the_metrics() {
        let snap = |b: [u64; 3], sum: f64, count: u64, missed: u64| {
            format!(
                "# TYPE storm_heartbeat_round_trip_seconds histogram\n\
                 storm_heartbeat_round_trip_seconds_bucket{{le=\"0.0001\"}} {}\n\
                 storm_heartbeat_round_trip_seconds_bucket{{le=\"0.0002\"}} {}\n\
                 storm_heartbeat_round_trip_seconds_bucket{{le=\"+Inf\"}} {}\n\
                 storm_heartbeat_round_trip_seconds_sum {sum}\n\
                 storm_heartbeat_round_trip_seconds_count {count}\n\
                 storm_heartbeats_missed_total {missed}\n",
                b[0], b[1], b[2]
            )
        };
        let before = snap([10, 10, 10], 0.001, 10, 1);
        // 100 more: 90 under 100 us, 9 under 200 us, 1 above.
        let after = snap([100, 109, 110], 0.001 + 0.012, 110, 3);
        let h = super::heartbeats_between(&before, &after).unwrap();
        assert_eq!(h.count, 100);
        assert!((h.mean_s - 0.00012).abs() < 1e-9, "{h:?}");
        assert_eq!(h.p50_le_s, 0.0001);
        assert_eq!(h.p99_le_s, 0.0002);
        assert_eq!(h.missed, 2);
        assert_eq!(super::heartbeats_between(&after, &after), None);
    }

    #[test]
    fn launch_is_measured_at_powers_of_two_and_at_every_node() {
        assert_eq!(super::node_counts(4), [1, 2, 4]);
        assert_eq!(super::node_counts(6), [1, 2, 4, 6]);
        assert_eq!(super::node_counts(2), [1, 2]);
    }
}
