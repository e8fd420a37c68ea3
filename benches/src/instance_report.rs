//! `storm-bench report --out DIR`, inside an instance (`storm start -- storm-bench report
//! --out DIR`): one command for the whole picture of a fresh allocation.
//!
//! * the primitives on every fabric present ([`crate::fabric`]), over all of the instance's
//!   nodes, beside fi_pingpong: `fabric.txt`, `fabric.csv`, `fabric.json`, `fabric.png`;
//! * launch against node count: `storm-submit -N K /bin/true` to its exit for K = 1, 2, 4,
//!   ... up to the instance's nodes, beside `srun --overlap -N K true` in the same run where
//!   Slurm gave the nodes: `launch.txt`, `launch.csv`, `launch.json`.
//!
//! Everything printed is also in `report.txt`.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde::Serialize;

use crate::fabric::{self, FabricArgs};
use crate::report::{Csv, Table};

/// The nodes of the instance this runs in (its cluster file, `STORM_CONFIG`).
fn instance_nodes() -> Result<u32> {
    let path = std::env::var_os("STORM_CONFIG").context(
        "storm-bench report runs inside an instance: storm start -- storm-bench report --out DIR",
    )?;
    let cfg = storm_cluster::ClusterConfig::load(Path::new(&path))
        .with_context(|| format!("reading {}", Path::new(&path).display()))?;
    Ok(cfg.nodes.len() as u32)
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

#[derive(Serialize)]
struct LaunchFigure {
    nodes: u32,
    storm_median_s: f64,
    srun_median_s: Option<f64>,
}

/// Writes the report into `dir`.
pub fn run(dir: &Path, iterations: u32, runs: usize) -> Result<()> {
    let nodes = instance_nodes()?;
    if nodes < 2 {
        bail!("the instance has {nodes} node: the report measures between 2 or more");
    }
    std::fs::create_dir_all(dir).with_context(|| format!("making {}", dir.display()))?;
    let bin = storm_cli::local::bin_dir()?;
    let mut text = String::new();
    let say = |t: &Table, text: &mut String| {
        let r = t.render();
        println!("{r}");
        text.push_str(&r);
        text.push('\n');
    };

    let args = FabricArgs {
        fabrics: fabric::fabrics_present(),
        nodes,
        sizes: vec![8, 64, 1 << 10, 8 << 10, 64 << 10, 1 << 20],
        iterations,
        window: 64,
        fabtests: true,
    };
    let mut csv = Csv::new(fabric::CSV_HEADER);
    let (tables, figures) = fabric::run(&args, &bin, &mut csv)?;
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
    std::fs::write(dir.join("report.txt"), text)?;
    eprintln!("wrote the report into {}", dir.display());
    Ok(())
}

#[cfg(test)]
mod tests {
    #[test]
    fn launch_is_measured_at_powers_of_two_and_at_every_node() {
        assert_eq!(super::node_counts(4), [1, 2, 4]);
        assert_eq!(super::node_counts(6), [1, 2, 4, 6]);
        assert_eq!(super::node_counts(2), [1, 2]);
    }
}
