//! `storm nodes --history WINDOW`: each node's recent samples as the MM keeps them
//! (`[monitoring] history_s`), as a table, as JSON (`--json`), or drawn (`--plot FILE.png`):
//! CPU utilization and memory in use over time, one line per node.

use std::path::Path;

use storm_cluster::sample::NodeTrace;
use storm_cluster::size::human_bytes;

use crate::plot::{Panel, Series, draw};
use crate::views::local_time;

/// `--history`'s window (`10m`, `2h`, `90s`) in milliseconds.
pub fn parse_window(text: &str) -> Result<u64, String> {
    match crate::history::parse_ago(text) {
        Some(0) | None => Err(format!(
            "--history {text:?}: expected a window such as 90s, 10m or 2h"
        )),
        Some(ms) => Ok(ms),
    }
}

/// One block per node: its samples, oldest first.
pub fn table(traces: &[NodeTrace]) -> String {
    let mut out = String::new();
    for t in traces {
        out.push_str(&format!(
            "{}: {} samples, {} of memory\n",
            t.name,
            t.points.len(),
            human_bytes(t.mem_total)
        ));
        if t.points.is_empty() {
            continue;
        }
        out.push_str("  TIME                  CPU%  LOAD1  MEM_AVAIL\n");
        for p in &t.points {
            out.push_str(&format!(
                "  {:<20} {:>5.1} {:>6.2}  {}\n",
                local_time(p.taken_ms),
                p.cpu_util * 100.0,
                p.load1,
                human_bytes(p.mem_avail)
            ));
        }
    }
    out
}

/// `{"nodes": [{"name", "mem_total", "points": [{"taken_ms", "cpu_util", "load1",
/// "mem_avail"}]}]}`.
pub fn json(traces: &[NodeTrace]) -> String {
    serde_json::json!({ "nodes": traces }).to_string()
}

/// Draws CPU utilization (%) and memory in use (GiB) over the window into `path` (PNG), time
/// in minutes before the newest sample.
pub fn plot(traces: &[NodeTrace], path: &Path) -> anyhow::Result<()> {
    let newest = traces
        .iter()
        .filter_map(|t| t.points.last())
        .map(|p| p.taken_ms)
        .max()
        .ok_or_else(|| anyhow::anyhow!("no samples in the window to plot"))?;
    let minutes = |ms: u64| -((newest - ms.min(newest)) as f64) / 60_000.0;
    let series = |value: &dyn Fn(&NodeTrace, usize) -> f64| -> Vec<Series> {
        traces
            .iter()
            .filter(|t| !t.points.is_empty())
            .map(|t| {
                let points = (0..t.points.len())
                    .map(|i| (minutes(t.points[i].taken_ms), value(t, i)))
                    .collect();
                Series {
                    markers: t.points.len() <= 60,
                    ..Series::line(t.name.clone(), points)
                }
            })
            .collect()
    };
    let cpu = Panel {
        title: "CPU utilization".into(),
        x_label: "minutes before the last sample".into(),
        y_label: "CPU (%)".into(),
        series: series(&|t, i| f64::from(t.points[i].cpu_util) * 100.0),
        ..Panel::default()
    };
    // GiB, or MiB where no node used a GiB in the window.
    let most = traces
        .iter()
        .flat_map(|t| {
            t.points
                .iter()
                .map(|p| t.mem_total.saturating_sub(p.mem_avail))
        })
        .max()
        .unwrap_or(0);
    let (unit, per) = if most >= 1 << 30 {
        ("GiB", (1u64 << 30) as f64)
    } else {
        ("MiB", (1u64 << 20) as f64)
    };
    let mem = Panel {
        title: "Memory in use".into(),
        x_label: "minutes before the last sample".into(),
        y_label: format!("memory in use ({unit})"),
        series: series(&|t, i| t.mem_total.saturating_sub(t.points[i].mem_avail) as f64 / per),
        ..Panel::default()
    };
    draw(&[cpu, mem], path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use storm_cluster::sample::HistoryPoint;

    fn trace() -> NodeTrace {
        NodeTrace {
            name: "node3".into(),
            mem_total: 8 << 30,
            points: (0..30)
                .map(|i| HistoryPoint {
                    taken_ms: 1_790_000_000_000 + i * 1000,
                    cpu_util: (i as f32 / 30.0),
                    load1: 0.5,
                    mem_avail: (6 << 30) - (i << 24),
                })
                .collect(),
        }
    }

    #[test]
    fn windows_read_as_people_write_them() {
        assert_eq!(parse_window("10m"), Ok(600_000));
        assert_eq!(parse_window("90s"), Ok(90_000));
        assert!(parse_window("0m").is_err());
        assert!(parse_window("soon").unwrap_err().contains("10m"));
    }

    #[test]
    fn the_history_prints_and_serializes_every_point() {
        let text = table(&[trace()]);
        assert!(
            text.starts_with("node3: 30 samples, 8 GiB of memory\n"),
            "{text}"
        );
        assert_eq!(text.lines().count(), 32);
        let v: serde_json::Value = serde_json::from_str(&json(&[trace()])).unwrap();
        assert_eq!(v["nodes"][0]["points"].as_array().unwrap().len(), 30);
        assert_eq!(
            v["nodes"][0]["points"][29]["taken_ms"],
            1_790_000_029_000u64
        );
    }

    #[test]
    fn the_plot_is_a_png_and_an_empty_window_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("h.png");
        plot(&[trace()], &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        let empty = NodeTrace {
            points: vec![],
            ..trace()
        };
        let e = plot(&[empty], &dir.path().join("e.png")).unwrap_err();
        assert!(e.to_string().contains("no samples"), "{e}");
    }
}
