//! The PNG of a tune: points/s against batch size (left) and against requests in flight (right).
//!
//! plotters draws the axes, lines and points into an RGB buffer (its bitmap backend, no image
//! encoder); it has no font without its `ttf`/`ab_glyph` features, so the labels are drawn here
//! from the public-domain 8x8 bitmap font of `font8x8`, and the buffer is encoded with `png`.
//! This keeps the plot's build to three small crates.

use std::path::Path;

use plotters::prelude::*;

use super::{Trial, TuneReport};

const WIDTH: u32 = 1000;
const HEIGHT: u32 = 420;
/// Pixels per font pixel of titles; tick labels use 1.
const SCALE: i32 = 2;

/// The plot could not be drawn or written.
#[derive(Debug, thiserror::Error)]
#[error("failed to {action} the tune plot: {message}")]
pub struct PlotError {
    action: &'static str,
    message: String,
}

fn plot_err<E: std::fmt::Display>(action: &'static str) -> impl Fn(E) -> PlotError {
    move |e| PlotError {
        action,
        message: e.to_string(),
    }
}

/// A label to draw at a pixel position, anchored at its top-left corner.
struct Label {
    x: i32,
    y: i32,
    text: String,
    scale: i32,
}

/// Draws the two sweeps of `report` and writes them as a PNG to `path`.
pub fn write_png(report: &TuneReport, path: &Path) -> Result<(), PlotError> {
    let mut buf = vec![255u8; (WIDTH * HEIGHT * 3) as usize];
    let mut labels = Vec::new();
    {
        let root = BitMapBackend::with_buffer(&mut buf, (WIDTH, HEIGHT)).into_drawing_area();
        let (left, right) = root.split_horizontally(WIDTH / 2);
        let batch: Vec<&Trial> = report
            .trials
            .iter()
            .filter(|t| t.sweep == "batch")
            .collect();
        let flight: Vec<&Trial> = report
            .trials
            .iter()
            .filter(|t| t.sweep == "in_flight")
            .collect();
        let title = format!("points/s, {}-d", report.dim);
        let x_name = "batch size (1 in flight)";
        panel(&left, &batch, |t| t.batch_size, &title, x_name, &mut labels)?;
        let x_name = format!("in flight (batch {})", report.batch_size);
        let title = "points/s";
        panel(
            &right,
            &flight,
            |t| t.in_flight,
            title,
            &x_name,
            &mut labels,
        )?;
        root.present().map_err(plot_err("draw"))?;
    }
    for label in &labels {
        draw_text(&mut buf, label);
    }
    encode(&buf, path)
}

/// One sweep: x is the index of the setting (they are powers of two), y is points/s.
fn panel(
    area: &DrawingArea<BitMapBackend<'_>, plotters::coord::Shift>,
    trials: &[&Trial],
    key: impl Fn(&Trial) -> usize,
    title: &str,
    x_name: &str,
    labels: &mut Vec<Label>,
) -> Result<(), PlotError> {
    let y_max = trials.iter().map(|t| t.points_per_s()).fold(1.0, f64::max) * 1.15;
    let x_max = trials.len().saturating_sub(1).max(1) as f64;
    let mut chart = ChartBuilder::on(area)
        .margin(30)
        .x_label_area_size(30)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.3..x_max + 0.3, 0.0..y_max)
        .map_err(plot_err("draw"))?;
    // No `configure_mesh`: its labels need a font (plotters panics without one). The axes and
    // grid lines are drawn as paths; the labels come after, from `font8x8`.
    let grey = RGBColor(220, 220, 220);
    let grid = (1..=5).map(|step| {
        let y = y_max / 1.15 * step as f64 / 5.0;
        PathElement::new(vec![(-0.3, y), (x_max + 0.3, y)], grey)
    });
    chart.draw_series(grid).map_err(plot_err("draw"))?;
    let axes = [
        vec![(-0.3, 0.0), (x_max + 0.3, 0.0)],
        vec![(-0.3, 0.0), (-0.3, y_max)],
    ];
    chart
        .draw_series(axes.into_iter().map(|p| PathElement::new(p, BLACK)))
        .map_err(plot_err("draw"))?;
    let points: Vec<(f64, f64)> = trials
        .iter()
        .enumerate()
        .map(|(i, t)| (i as f64, t.points_per_s()))
        .collect();
    chart
        .draw_series(LineSeries::new(
            points.iter().copied(),
            BLUE.stroke_width(2),
        ))
        .map_err(plot_err("draw"))?;
    chart
        .draw_series(points.iter().map(|&p| Circle::new(p, 4, BLUE.filled())))
        .map_err(plot_err("draw"))?;
    let (ox, oy) = area.get_base_pixel();
    for (i, t) in trials.iter().enumerate() {
        let (x, y) = chart.backend_coord(&(i as f64, 0.0));
        let text = key(t).to_string();
        labels.push(centred(x, y + 8, text, 1));
    }
    for step in 0..=5 {
        let value = y_max / 1.15 * step as f64 / 5.0;
        let (x, y) = chart.backend_coord(&(-0.3, value));
        let text = format!("{value:.0}");
        let width = text.len() as i32 * 8;
        labels.push(Label {
            x: x - width - 6,
            y: y - 4,
            text,
            scale: 1,
        });
    }
    let (w, h) = area.dim_in_pixel();
    labels.push(centred(ox + w as i32 / 2, oy + 8, title.to_owned(), SCALE));
    let bottom = oy + h as i32 - 8 * SCALE - 4;
    labels.push(centred(ox + w as i32 / 2, bottom, x_name.into(), SCALE));
    Ok(())
}

fn centred(x: i32, y: i32, text: String, scale: i32) -> Label {
    let width = text.len() as i32 * 8 * scale;
    Label {
        x: x - width / 2,
        y,
        text,
        scale,
    }
}

/// Draws ASCII text in black into the RGB buffer (other characters are left blank).
fn draw_text(buf: &mut [u8], label: &Label) {
    for (n, c) in label.text.chars().enumerate() {
        let Some(glyph) = font8x8::legacy::BASIC_LEGACY.get(c as usize) else {
            continue;
        };
        for (row, bits) in glyph.iter().enumerate() {
            for col in 0..8 {
                if bits & (1 << col) == 0 {
                    continue;
                }
                let x0 = label.x + (n as i32 * 8 + col) * label.scale;
                let y0 = label.y + row as i32 * label.scale;
                for dy in 0..label.scale {
                    for dx in 0..label.scale {
                        set_black(buf, x0 + dx, y0 + dy);
                    }
                }
            }
        }
    }
}

fn set_black(buf: &mut [u8], x: i32, y: i32) {
    if x < 0 || y < 0 || x >= WIDTH as i32 || y >= HEIGHT as i32 {
        return;
    }
    let i = (y as usize * WIDTH as usize + x as usize) * 3;
    buf[i..i + 3].fill(0);
}

fn encode(buf: &[u8], path: &Path) -> Result<(), PlotError> {
    let file = std::fs::File::create(path).map_err(plot_err("create"))?;
    let mut encoder = png::Encoder::new(std::io::BufWriter::new(file), WIDTH, HEIGHT);
    encoder.set_color(png::ColorType::Rgb);
    encoder.set_depth(png::BitDepth::Eight);
    let mut writer = encoder.write_header().map_err(plot_err("write"))?;
    writer.write_image_data(buf).map_err(plot_err("write"))?;
    writer.finish().map_err(plot_err("write"))
}
