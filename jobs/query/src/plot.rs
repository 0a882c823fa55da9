//! The PNG of an eval: recall@k against median latency, one line per filter, drawn like the
//! report's plots (see [`embedfleet_core::plot`]).

use crate::eval::EvalReport;
use embedfleet_core::plot::{render, write_png};
use plotters::prelude::*;
use std::path::Path;

const SIZE: (u32, u32) = (800, 500);
const COLORS: [RGBColor; 3] = [
    RGBColor(86, 119, 164),
    RGBColor(204, 102, 51),
    RGBColor(90, 160, 90),
];

/// Draws `report` into `path`.
pub fn write_recall_plot(
    report: &EvalReport,
    path: &Path,
) -> Result<(), Box<dyn std::error::Error>> {
    let mut filters: Vec<&str> = report.rows.iter().map(|r| r.filter.as_str()).collect();
    filters.dedup();
    let top_ms = report
        .rows
        .iter()
        .map(|r| r.latency.p50_ms)
        .fold(0.01, f64::max)
        * 1.15;
    let rgb = render(SIZE, |area| {
        let mut chart = ChartBuilder::on(area)
            .caption(
                format!("recall@{} against median latency", report.k),
                ("sans-serif", 22),
            )
            .margin(20)
            .x_label_area_size(40)
            .y_label_area_size(60)
            .build_cartesian_2d(0.0..top_ms, 0.0..1.05)?;
        chart
            .configure_mesh()
            .light_line_style(RGBColor(235, 235, 235))
            .x_desc("p50 latency, ms")
            .y_desc("recall")
            .draw()?;
        for (i, filter) in filters.iter().enumerate() {
            let color = COLORS[i % COLORS.len()];
            let points: Vec<(f64, f64)> = report
                .rows
                .iter()
                .filter(|r| r.filter == *filter && r.ef.is_some())
                .map(|r| (r.latency.p50_ms, r.recall))
                .collect();
            chart
                .draw_series(LineSeries::new(
                    points.iter().copied(),
                    color.stroke_width(2),
                ))?
                .label(format!("filter: {filter}"))
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart.draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))?;
        }
        chart
            .configure_series_labels()
            .position(SeriesLabelPosition::LowerRight)
            .background_style(WHITE)
            .border_style(BLACK)
            .draw()?;
        Ok(())
    })?;
    write_png(path, SIZE, &rgb)
}
