//! `--plot FILE.png`: the paper's figures, drawn from a run's results.
//!
//! A figure is a column of [`Panel`]s, each a set of line series over two axes (either of them
//! logarithmic). Drawing uses plotters' bitmap backend with DejaVu Sans compiled in (the
//! `dejavu` crate), so no system font, fontconfig or display is needed.
//!
//! The figure builders ([`launch`], [`gang`], [`prims`], [`faults`]) read the same rows the
//! CSV file gets, plus the raw samples a run keeps for distributions (CDFs).

use std::path::Path;
use std::sync::Once;

use anyhow::{Context, Result, bail};
use plotters::prelude::*;
use plotters::style::FontStyle;

use crate::report::Csv;

/// One line of a panel.
#[derive(Debug, Clone)]
pub struct Series {
    pub label: String,
    pub points: Vec<(f64, f64)>,
    /// A reference line (a baseline or floor), drawn dashed.
    pub dashed: bool,
    /// Its colour, by index (default: its position), so a line and its reference can match.
    pub color: Option<usize>,
    /// Mark each point (off for dense series such as a CDF).
    pub markers: bool,
}

impl Series {
    pub fn line(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            label: label.into(),
            points,
            dashed: false,
            color: None,
            markers: true,
        }
    }

    /// The distribution of `samples` (seconds) as a CDF, in the unit `scale` gives.
    pub fn cdf(label: impl Into<String>, samples: &[f64], scale: f64) -> Self {
        Self {
            markers: false,
            ..Self::line(label, cdf(samples, scale))
        }
    }

    pub fn reference(label: impl Into<String>, points: Vec<(f64, f64)>) -> Self {
        Self {
            dashed: true,
            ..Self::line(label, points)
        }
    }

    /// The same series in colour `i`.
    pub fn colored(self, i: usize) -> Self {
        Self {
            color: Some(i),
            ..self
        }
    }
}

/// How an axis maps values.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub enum Scale {
    #[default]
    Linear,
    /// Logarithmic, with ticks at powers of this base (2 for node counts, 10 for times).
    Log(f64),
}

/// One chart.
#[derive(Debug, Clone, Default)]
pub struct Panel {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: Scale,
    pub y_scale: Scale,
    pub series: Vec<Series>,
}

/// The empirical CDF of `samples` (seconds), in the unit `scale` gives (1e3: ms, 1e6: us),
/// as a step line: up by 1/n at each sample.
pub fn cdf(samples: &[f64], scale: f64) -> Vec<(f64, f64)> {
    let mut v: Vec<f64> = samples
        .iter()
        .map(|s| s * scale)
        .filter(|s| s.is_finite())
        .collect();
    v.sort_by(f64::total_cmp);
    let n = v.len() as f64;
    v.iter()
        .enumerate()
        .flat_map(|(i, x)| [(*x, i as f64 / n), (*x, (i + 1) as f64 / n)])
        .collect()
}

const COLORS: [RGBColor; 8] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
    RGBColor(23, 190, 207),
    RGBColor(127, 127, 127),
];

const FONT: &str = "storm-sans";

fn register_font() -> Result<()> {
    static ONCE: Once = Once::new();
    let mut result = Ok(());
    ONCE.call_once(|| {
        result = plotters::style::register_font(FONT, FontStyle::Normal, dejavu::sans::regular())
            .map_err(|_| anyhow::anyhow!("the embedded DejaVu Sans font did not load"));
    });
    result
}

/// A tick label: at most three decimals, without trailing zeros.
fn tick(v: f64) -> String {
    let a = v.abs();
    if a == 0.0 {
        "0".into()
    } else if !(1e-3..1e5).contains(&a) {
        format!("{v:.0e}")
    } else if a >= 100.0 {
        format!("{v:.0}")
    } else {
        let t = format!("{v:.3}");
        t.trim_end_matches('0').trim_end_matches('.').to_string()
    }
}

/// The range of an axis over every point (only positive values on a log axis), padded a
/// little: additively on a linear axis, by a factor on a log one.
fn range(values: impl Iterator<Item = f64>, scale: Scale) -> Option<(f64, f64)> {
    let log = matches!(scale, Scale::Log(_));
    let (lo, hi) = values
        .filter(|v| v.is_finite() && (!log || *v > 0.0))
        .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
            (lo.min(v), hi.max(v))
        });
    if !lo.is_finite() {
        return None;
    }
    Some(match scale {
        Scale::Log(_) => (lo / 1.15, hi * 1.15),
        Scale::Linear => {
            let pad = if hi > lo { (hi - lo) * 0.05 } else { 0.5 };
            let lo = if lo >= 0.0 {
                0f64.max(lo - pad)
            } else {
                lo - pad
            };
            (lo, hi + pad)
        }
    })
}

/// Draws `panels` one above the other into a PNG file.
pub fn draw(panels: &[Panel], path: &Path) -> Result<()> {
    if panels.is_empty() {
        bail!("nothing to plot");
    }
    register_font()?;
    let height = 420 * panels.len() as u32;
    let root = BitMapBackend::new(path, (960, height)).into_drawing_area();
    root.fill(&WHITE)?;
    for (area, panel) in root.split_evenly((panels.len(), 1)).iter().zip(panels) {
        draw_panel(area, panel)
            .with_context(|| format!("drawing {:?} into {}", panel.title, path.display()))?;
    }
    root.present()
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}

type Area<'a> = DrawingArea<BitMapBackend<'a>, plotters::coord::Shift>;

fn draw_panel(area: &Area<'_>, p: &Panel) -> Result<()> {
    let points = || p.series.iter().flat_map(|s| s.points.iter());
    let Some((x0, x1)) = range(points().map(|(x, _)| *x), p.x_scale) else {
        bail!("no points to plot");
    };
    let Some((y0, y1)) = range(points().map(|(_, y)| *y), p.y_scale) else {
        bail!("no points to plot");
    };
    match (p.x_scale, p.y_scale) {
        (Scale::Linear, Scale::Linear) => chart(area, p, x0..x1, y0..y1),
        (Scale::Log(b), Scale::Linear) => chart(area, p, (x0..x1).log_scale().base(b), y0..y1),
        (Scale::Linear, Scale::Log(b)) => chart(area, p, x0..x1, (y0..y1).log_scale().base(b)),
        (Scale::Log(bx), Scale::Log(by)) => chart(
            area,
            p,
            (x0..x1).log_scale().base(bx),
            (y0..y1).log_scale().base(by),
        ),
    }
}

/// Draws panel `p` on axes `x` and `y` (linear or logarithmic ranges).
fn chart<X, Y>(area: &Area<'_>, p: &Panel, x: X, y: Y) -> Result<()>
where
    X: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    Y: plotters::coord::ranged1d::AsRangedCoord<Value = f64>,
    X::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
    Y::CoordDescType: plotters::coord::ranged1d::ValueFormatter<f64>,
{
    let mut chart = ChartBuilder::on(area)
        .caption(&p.title, (FONT, 18))
        .margin(12)
        .x_label_area_size(44)
        .y_label_area_size(70)
        .build_cartesian_2d(x, y)?;
    let fmt = |v: &f64| tick(*v);
    chart
        .configure_mesh()
        .x_desc(p.x_label.as_str())
        .y_desc(p.y_label.as_str())
        .x_labels(12)
        .y_labels(10)
        .x_label_formatter(&fmt)
        .y_label_formatter(&fmt)
        .label_style((FONT, 13))
        .axis_desc_style((FONT, 14))
        .light_line_style(RGBColor(238, 238, 238))
        .max_light_lines(3)
        .draw()?;
    let log_x = matches!(p.x_scale, Scale::Log(_));
    let log_y = matches!(p.y_scale, Scale::Log(_));
    for (i, s) in p.series.iter().enumerate() {
        let color = COLORS[s.color.unwrap_or(i) % COLORS.len()];
        let pts: Vec<(f64, f64)> = s
            .points
            .iter()
            .copied()
            .filter(|(x, y)| x.is_finite() && y.is_finite())
            .filter(|(x, y)| (!log_x || *x > 0.0) && (!log_y || *y > 0.0))
            .collect();
        let style = color.stroke_width(2);
        let drawn = if s.dashed {
            chart.draw_series(DashedLineSeries::new(pts.clone(), 6, 4, style))?
        } else {
            chart.draw_series(LineSeries::new(pts.clone(), style))?
        };
        drawn.label(s.label.as_str()).legend(move |(x, y)| {
            PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2))
        });
        if s.markers && !s.dashed {
            chart.draw_series(
                pts.iter()
                    .map(|&(x, y)| Circle::new((x, y), 3, color.filled())),
            )?;
        }
    }
    chart
        .configure_series_labels()
        .label_font((FONT, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()?;
    Ok(())
}

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cdf_climbs_to_one_over_sorted_samples() {
        let c = cdf(&[3e-3, 1e-3, 2e-3, f64::NAN], 1e3);
        let third = 1.0 / 3.0;
        assert_eq!(
            c,
            vec![
                (1.0, 0.0),
                (1.0, third),
                (2.0, third),
                (2.0, 2.0 * third),
                (3.0, 2.0 * third),
                (3.0, 1.0)
            ]
        );
    }

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
