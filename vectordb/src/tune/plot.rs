//! The PNG of a tune: points/s against batch size (left) and against requests in flight
//! (right), drawn like the report's plots (see [`embedfleet_core::plot`]).

use std::path::Path;

use plotters::prelude::*;

use super::sweep::Trial;
use embedfleet_core::plot::{line_with_dots, render, Area, PlotResult, LIGHT_GRID, SERIES_BLUE};

const SIZE: (u32, u32) = (1000, 420);

/// The plot could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("failed to write the tune plot {}: {message}", path.display())]
pub struct PlotError {
    path: std::path::PathBuf,
    message: String,
}

/// Draws a tune's two sweeps (its `trials`, of `dim`-d vectors, the second at the chosen
/// `batch_size`) and writes them as a PNG to `path`.
pub fn write_png(
    trials: &[Trial],
    dim: usize,
    batch_size: usize,
    path: &Path,
) -> Result<(), PlotError> {
    let sweep = |name: &str| -> Vec<&Trial> { trials.iter().filter(|t| t.sweep == name).collect() };
    let (batch, flight) = (sweep("batch"), sweep("in_flight"));
    let pixels = render(SIZE, |area| {
        let (left, right) = area.split_horizontally(SIZE.0 / 2);
        let title = format!("points/s, {dim}-d vectors");
        panel(
            &left,
            &batch,
            |t| t.batch_size,
            &title,
            "batch size (1 in flight)",
        )?;
        let x_name = format!("requests in flight (batch {batch_size})");
        panel(&right, &flight, |t| t.in_flight, "points/s", &x_name)
    });
    pixels
        .and_then(|rgb| embedfleet_core::plot::write_png(path, SIZE, &rgb))
        .map_err(|e| PlotError {
            path: path.to_path_buf(),
            message: e.to_string(),
        })
}

/// One sweep: x is the index of the setting (they are powers of two, labelled by value), y is
/// points/s.
fn panel(
    area: &Area,
    trials: &[&Trial],
    key: impl Fn(&Trial) -> usize,
    title: &str,
    x_name: &str,
) -> PlotResult {
    let top = trials.iter().map(|t| t.points_per_s()).fold(1.0, f64::max) * 1.15;
    let last = trials.len().saturating_sub(1).max(1) as i32;
    let mut chart = ChartBuilder::on(area)
        .caption(title, ("sans-serif", 24))
        .margin(20)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0..last, 0.0..top)?;
    let labels: Vec<String> = trials.iter().map(|t| key(t).to_string()).collect();
    chart
        .configure_mesh()
        .light_line_style(LIGHT_GRID)
        .x_labels(trials.len().max(2))
        .x_label_formatter(&|i| labels.get(*i as usize).cloned().unwrap_or_default())
        .x_desc(x_name)
        .draw()?;
    let points: Vec<(i32, f64)> = trials
        .iter()
        .enumerate()
        .map(|(i, t)| (i as i32, t.points_per_s()))
        .collect();
    line_with_dots(&mut chart, &points, SERIES_BLUE)
}
