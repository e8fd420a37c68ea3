//! `--plot FILE.png`: the paper's figures, drawn from a run's results.
//!
//! The drawing is `storm_cli::plot`'s ([`Panel`]s of [`Series`], drawn by [`draw`]). The
//! figure builders ([`launch`], [`gang`], [`prims`], [`faults`]) read the same rows the CSV file
//! gets, plus the raw samples a run keeps for distributions (CDFs).

pub use storm_cli::plot::{Panel, Scale, Series, draw};

use crate::report::Csv;

/// The numbers of column `name` in `rows` of `csv` (rows whose cell does not parse are
/// skipped).
fn numbers<'a>(csv: &'a Csv, rows: &'a [&'a Vec<String>], name: &str) -> Vec<f64> {
    let Some(i) = csv.column(name) else {
        return Vec::new();
    };
    rows.iter().filter_map(|r| r.get(i)?.parse().ok()).collect()
}

/// Rows of `csv` whose column `name` is `value`.
fn rows_where<'a>(csv: &'a Csv, name: &str, value: &str) -> Vec<&'a Vec<String>> {
    let Some(i) = csv.column(name) else {
        return Vec::new();
    };
    csv.rows().iter().filter(|r| r[i] == value).collect()
}

/// Distinct values of column `name`, in first-seen order.
fn distinct(csv: &Csv, name: &str) -> Vec<String> {
    let Some(i) = csv.column(name) else {
        return Vec::new();
    };
    let mut out: Vec<String> = Vec::new();
    for r in csv.rows() {
        if !out.contains(&r[i]) {
            out.push(r[i].clone());
        }
    }
    out
}

fn zip(x: Vec<f64>, y: Vec<f64>) -> Vec<(f64, f64)> {
    x.into_iter().zip(y).collect()
}

/// Paper Fig. 2a: launch time against node count for each program size, with the floor.
pub fn launch(csv: &Csv) -> Vec<Panel> {
    let mut series = Vec::new();
    for (i, size) in distinct(csv, "size_mb").into_iter().enumerate() {
        let rows = rows_where(csv, "size_mb", &size);
        let nodes = numbers(csv, &rows, "nodes");
        let ms = |col| {
            numbers(csv, &rows, col)
                .into_iter()
                .map(|s| s * 1e3)
                .collect()
        };
        series.push(
            Series::line(
                format!("{size} MB: storm-submit end to end"),
                zip(nodes.clone(), ms("end_to_end_s")),
            )
            .colored(i),
        );
        series.push(
            Series::reference(
                format!("{size} MB: floor (cp + fork/exec)"),
                zip(nodes, ms("floor_s")),
            )
            .colored(i),
        );
    }
    vec![Panel {
        title: "Job launch (paper Fig. 2a): do-nothing program on N nodes".into(),
        x_label: "nodes".into(),
        y_label: "launch time (ms)".into(),
        x_scale: Scale::Log(2.0),
        y_scale: Scale::Linear,
        series,
    }]
}

/// Paper Figs. 3 and 5 and the strobe-skew CDF, for what the run measured.
pub fn gang(csv: &Csv) -> Vec<Panel> {
    let mut panels = Vec::new();
    let quantum = rows_where(csv, "table", "quantum");
    if !quantum.is_empty() {
        let q = numbers(csv, &quantum, "quantum_ms");
        panels.push(Panel {
            title: "Gang scheduling (paper Fig. 3): slowdown against quantum".into(),
            x_label: "quantum (ms)".into(),
            y_label: "slowdown".into(),
            x_scale: Scale::Log(10.0),
            y_scale: Scale::Linear,
            series: vec![
                Series::line(
                    "MPL jobs together / one alone",
                    zip(q.clone(), numbers(csv, &quantum, "slowdown")),
                ),
                Series::line(
                    "together / one run bare (no cluster)",
                    zip(q.clone(), numbers(csv, &quantum, "vs_bare")),
                ),
                Series::reference("ideal", q.iter().map(|&x| (x, 1.0)).collect()),
            ],
        });
    }
    let mpl = rows_where(csv, "table", "mpl");
    if !mpl.is_empty() {
        let m = numbers(csv, &mpl, "mpl");
        panels.push(Panel {
            title: "Gang scheduling (paper Fig. 5): multiprogramming level".into(),
            x_label: "MPL (jobs sharing the nodes)".into(),
            y_label: "slowdown".into(),
            x_scale: Scale::Linear,
            y_scale: Scale::Linear,
            series: vec![
                Series::line(
                    "MPL jobs together / one alone",
                    zip(m.clone(), numbers(csv, &mpl, "slowdown")),
                ),
                Series::line(
                    "together / one run bare",
                    zip(m.clone(), numbers(csv, &mpl, "vs_bare")),
                ),
                Series::reference("ideal", m.iter().map(|&x| (x, 1.0)).collect()),
            ],
        });
    }
    let mut series: Vec<Series> = csv
        .distributions()
        .iter()
        .filter(|(name, _)| name.starts_with("skew"))
        .enumerate()
        .map(|(i, (name, v))| {
            // Each node count's skew, then its baseline, in the same colour.
            let s = Series::cdf(name.clone(), v, 1e6).colored(i / 2);
            if name.contains("baseline") {
                Series { dashed: true, ..s }
            } else {
                s
            }
        })
        .collect();
    if !series.is_empty() {
        series.retain(|s| !s.points.is_empty());
        panels.push(Panel {
            title: "Strobe skew: first to last node finishing the same switch (CDF)".into(),
            x_label: "skew (us)".into(),
            y_label: "fraction of switches".into(),
            x_scale: Scale::Log(10.0),
            y_scale: Scale::Linear,
            series,
        });
    }
    panels
}

/// The primitives: XFER-AND-SIGNAL time against node count on each backend, one series per
/// size beside its baseline; COMPARE-AND-WRITE on every backend in one panel.
pub fn prims(csv: &Csv) -> Vec<Panel> {
    let (Some(op_i), Some(bytes_i), Some(backend_i)) =
        (csv.column("op"), csv.column("bytes"), csv.column("backend"))
    else {
        return Vec::new();
    };
    let us = |rows: &[&Vec<String>], col: &str| -> Vec<f64> {
        numbers(csv, rows, col)
            .into_iter()
            .map(|s| s * 1e6)
            .collect()
    };
    let mut panels = Vec::new();
    let mut caw = Vec::new();
    let mut caw_baseline = None;
    for backend in distinct(csv, "backend") {
        let rows: Vec<&Vec<String>> = csv
            .rows()
            .iter()
            .filter(|r| r[backend_i] == backend)
            .collect();
        let xfer: Vec<&Vec<String>> = rows
            .iter()
            .copied()
            .filter(|r| r[op_i] == "xfer_and_signal")
            .collect();
        let mut sizes: Vec<String> = Vec::new();
        for r in &xfer {
            if !sizes.contains(&r[bytes_i]) {
                sizes.push(r[bytes_i].clone());
            }
        }
        let mut series = Vec::new();
        for (i, size) in sizes.iter().enumerate() {
            let these: Vec<&Vec<String>> = xfer
                .iter()
                .copied()
                .filter(|r| &r[bytes_i] == size)
                .collect();
            let nodes = numbers(csv, &these, "nodes");
            let label = crate::report::size_label(size.parse().unwrap_or(0));
            let baseline = these
                .first()
                .and_then(|r| r.get(csv.column("baseline")?).cloned())
                .unwrap_or_default();
            series.push(
                Series::line(
                    format!("{label} B"),
                    zip(nodes.clone(), us(&these, "median_s")),
                )
                .colored(i),
            );
            series.push(
                Series::reference(
                    format!("{label} B: {baseline}"),
                    zip(nodes, us(&these, "baseline_median_s")),
                )
                .colored(i),
            );
        }
        if !series.is_empty() {
            panels.push(Panel {
                title: format!("XFER-AND-SIGNAL on the {backend} backend: node 0 to nodes 1..N"),
                x_label: "destination nodes".into(),
                y_label: "median time (us)".into(),
                x_scale: Scale::Log(2.0),
                y_scale: Scale::Log(10.0),
                series,
            });
        }
        for op in ["compare_and_write", "compare_and_write+write"] {
            let these: Vec<&Vec<String>> = rows.iter().copied().filter(|r| r[op_i] == op).collect();
            if these.is_empty() {
                continue;
            }
            let nodes = numbers(csv, &these, "nodes");
            let what = if op.ends_with("+write") {
                "compare and write"
            } else {
                "compare"
            };
            caw.push(
                Series::line(
                    format!("{backend}: {what}"),
                    zip(nodes.clone(), us(&these, "median_s")),
                )
                .colored(caw.len() + 1),
            );
            caw_baseline.get_or_insert_with(|| zip(nodes, us(&these, "baseline_median_s")));
        }
    }
    if let Some(base) = caw_baseline {
        caw.push(Series::reference("raw TCP round trip of 8 bytes", base).colored(0));
        panels.push(Panel {
            title: "COMPARE-AND-WRITE from node 0 over nodes 1..N".into(),
            x_label: "nodes".into(),
            y_label: "median time (us)".into(),
            x_scale: Scale::Log(2.0),
            y_scale: Scale::Log(10.0),
            series: caw,
        });
    }
    panels
}

/// Failure detection and recovery: the distribution of each measured time, and tree healing
/// against node count.
pub fn faults(csv: &Csv) -> Vec<Panel> {
    let mut panels = Vec::new();
    let series: Vec<Series> = csv
        .distributions()
        .iter()
        .map(|(name, v)| Series::cdf(name.clone(), v, 1e3))
        .filter(|s| !s.points.is_empty())
        .collect();
    if !series.is_empty() {
        panels.push(Panel {
            title: "Failure detection and recovery: time of each trial (CDF)".into(),
            x_label: "time (ms)".into(),
            y_label: "fraction of trials".into(),
            x_scale: Scale::Log(10.0),
            y_scale: Scale::Linear,
            series,
        });
    }
    let heal = rows_where(csv, "measure", "tree_heal");
    if !heal.is_empty() {
        let nodes = numbers(csv, &heal, "nodes");
        let ms = |col| {
            numbers(csv, &heal, col)
                .into_iter()
                .map(|s| s * 1e3)
                .collect()
        };
        panels.push(Panel {
            title: "Tree healing: interior node crash to a completed transfer".into(),
            x_label: "nodes".into(),
            y_label: "time (ms)".into(),
            x_scale: Scale::Log(2.0),
            y_scale: Scale::Linear,
            series: vec![
                Series::line("crash to healed", zip(nodes.clone(), ms("median_s"))),
                Series::reference(
                    "one transfer on the healthy tree",
                    zip(nodes, ms("baseline_s")),
                ),
            ],
        });
    }
    panels
}

/// `storm-bench fabric`: latency and bandwidth against size for each fabric, with
/// fi_pingpong's latency beside its provider's (dashed).
pub fn fabric(figures: &[crate::fabric::Figure]) -> Vec<Panel> {
    let mut fabrics: Vec<&str> = Vec::new();
    for f in figures {
        if f.test != "fi_pingpong" && !fabrics.contains(&f.fabric.as_str()) {
            fabrics.push(&f.fabric);
        }
    }
    let points = |fabric: &str, test: &str, y: fn(&crate::fabric::Figure) -> f64| {
        figures
            .iter()
            .filter(|f| f.fabric == fabric && f.test == test)
            .map(|f| (f.size as f64, y(f)))
            .collect::<Vec<_>>()
    };
    let mut latency = Vec::new();
    let mut bandwidth = Vec::new();
    for (i, fabric) in fabrics.iter().enumerate() {
        latency.push(Series::line(*fabric, points(fabric, "latency", |f| f.median_us)).colored(i));
        if let Some(provider) = fabric.strip_prefix("ofi:") {
            let pp = points(&format!("fi_pingpong:{provider}"), "fi_pingpong", |f| {
                f.median_us
            });
            if !pp.is_empty() {
                latency.push(Series::reference(format!("fi_pingpong {provider}"), pp).colored(i));
            }
        }
        bandwidth
            .push(Series::line(*fabric, points(fabric, "bandwidth", |f| f.mb_per_s)).colored(i));
    }
    let panel = |title: &str, y: &str, series| Panel {
        title: title.into(),
        x_label: "bytes".into(),
        y_label: y.into(),
        x_scale: Scale::Log(2.0),
        y_scale: Scale::Log(10.0),
        series,
    };
    vec![
        panel(
            "XFER-AND-SIGNAL latency between two nodes (one way, median)",
            "us",
            latency,
        ),
        panel(
            "XFER-AND-SIGNAL bandwidth between two nodes",
            "MB/s",
            bandwidth,
        ),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn launch_figure_has_a_line_and_a_floor_per_size() {
        let mut csv = Csv::new(crate::launch::CSV_HEADER);
        for (mb, n) in [("4", "1"), ("4", "2"), ("8", "1"), ("8", "2")] {
            csv.push(vec![
                mb.into(),
                n.into(),
                "5".into(),
                "0.01".into(),
                "0.005".into(),
                "0.015".into(),
                "0.02".into(),
                "0.004".into(),
                "5.0".into(),
                "0.008".into(),
                "2.5".into(),
                "0.012".into(),
                "1.67".into(),
            ]);
        }
        let panels = launch(&csv);
        assert_eq!(panels.len(), 1);
        let labels: Vec<&str> = panels[0].series.iter().map(|s| s.label.as_str()).collect();
        assert_eq!(labels.len(), 4, "{labels:?}");
        assert_eq!(panels[0].series[0].points, vec![(1.0, 20.0), (2.0, 20.0)]);
        assert!(panels[0].series[1].dashed);
        assert_eq!(panels[0].series[1].points, vec![(1.0, 4.0), (2.0, 4.0)]);
    }

    #[test]
    fn a_figure_is_a_png_drawn_without_system_fonts() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f.png");
        let panels = vec![
            Panel {
                title: "linear".into(),
                x_label: "x".into(),
                y_label: "y".into(),
                series: vec![
                    Series::line("a", vec![(1.0, 2.0), (2.0, 3.0)]),
                    Series::reference("b", vec![(1.0, 1.0), (2.0, 1.0)]),
                ],
                ..Panel::default()
            },
            Panel {
                title: "log-log".into(),
                x_scale: Scale::Log(2.0),
                y_scale: Scale::Log(10.0),
                series: vec![Series::line("c", vec![(1.0, 10.0), (32.0, 1000.0)])],
                ..Panel::default()
            },
        ];
        draw(&panels, &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "a PNG file");
        assert!(
            bytes.len() > 10_000,
            "with something drawn: {} bytes",
            bytes.len()
        );
        assert!(draw(&[], &path).is_err());
        let empty = Panel {
            title: "empty".into(),
            ..Panel::default()
        };
        assert!(
            draw(&[empty], &path).is_err(),
            "a panel without points is an error"
        );
    }
}
