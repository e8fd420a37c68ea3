//! Figures as PNG files: `storm nodes --history --plot`, and `storm-bench --plot`'s figures
//! of the paper.
//!
//! A figure is a column of [`Panel`]s, each a set of line series over two axes (either of them
//! logarithmic). Drawing uses plotters' bitmap backend with DejaVu Sans compiled in (the
//! `dejavu` crate), so no system font, fontconfig or display is needed.

use std::path::Path;
use std::sync::Once;

use anyhow::{Context, Result, bail};
use plotters::prelude::*;
use plotters::style::FontStyle;

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
    // A sum of floats that should be 0 (a range's end) prints as 0, not as 2e-16.
    if a < 1e-12 {
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
}
