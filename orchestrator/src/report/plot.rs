//! PNG plots of a run: where each batch's time went, and throughput over the run.
//!
//! Drawn with plotters into an RGB buffer (text from [`embedfleet_core::plot::GlyphBackend`]) and encoded with
//! `png`: no image crate, no system fonts.

use super::table::BatchLine;
use super::ReportError;
use embedfleet_core::plot::{
    line_with_dots, render, write_png, Area, PlotResult, LIGHT_GRID, SERIES_BLUE,
};
use plotters::prelude::*;
use std::path::{Path, PathBuf};

/// Size of every plot, in pixels.
pub const SIZE: (u32, u32) = (960, 540);
/// File names of the plots, in the order [`write_all`] writes them.
pub const TIMINGS_PNG: &str = "batch_timings.png";
pub const THROUGHPUT_PNG: &str = "throughput.png";

type DrawFn = fn(&Area, &[BatchLine]) -> PlotResult;

/// Writes [`TIMINGS_PNG`] and [`THROUGHPUT_PNG`] into `dir`; returns their paths.
pub fn write_all(lines: &[BatchLine], dir: &Path) -> Result<Vec<PathBuf>, ReportError> {
    let plots: [(&str, DrawFn); 2] = [(TIMINGS_PNG, timings), (THROUGHPUT_PNG, throughput)];
    let mut written = Vec::new();
    for (name, draw) in plots {
        let path = dir.join(name);
        let fail = |reason: String| ReportError::Plot {
            path: path.clone(),
            reason,
        };
        let pixels = render(SIZE, |area| draw(area, lines)).map_err(|e| fail(e.to_string()))?;
        write_png(&path, SIZE, &pixels).map_err(|e| fail(e.to_string()))?;
        written.push(path);
    }
    Ok(written)
}

/// The phases stacked in the timings plot, bottom up. Tokenisation runs on CPU threads ahead
/// of the devices, overlapping inference, so it is not a slice of the bar; "other" is the rest
/// of the job's total (setup, waiting, run.db).
const PHASES: [(&str, RGBColor); 4] = [
    ("model load", RGBColor(86, 119, 164)),
    ("I/O", RGBColor(221, 132, 82)),
    ("inference", RGBColor(85, 168, 104)),
    ("other", RGBColor(160, 160, 160)),
];

fn phases(l: &BatchLine) -> [f64; 4] {
    let t = &l.timings;
    let known = t.model_load_s + t.io_s + t.inference_s;
    [
        t.model_load_s,
        t.io_s,
        t.inference_s,
        (t.total_s - known).max(0.0),
    ]
}

/// One stacked bar per batch (in batch order): model load, I/O, inference, other.
fn timings(area: &Area, lines: &[BatchLine]) -> PlotResult {
    let top = lines
        .iter()
        .map(|l| phases(l).iter().sum::<f64>())
        .fold(0.0, f64::max)
        .max(1e-3)
        * 1.15;
    let n = lines.len() as i32;
    let mut chart = ChartBuilder::on(area)
        .caption("time per batch (s)", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(64)
        // A segmented `0..m` has m + 1 segments; one batch gets an empty one beside it (the
        // range 0..0 would put the bar on the axis).
        .build_cartesian_2d((0..(n - 1).max(1)).into_segmented(), 0.0..top)?;
    // Segment i is batch lines[i]; its label sits under the middle of the bar.
    let label = |x: &SegmentValue<i32>| match x {
        SegmentValue::CenterOf(i) => lines
            .get(*i as usize)
            .map_or(String::new(), |l| l.batch_id.to_string()),
        _ => String::new(),
    };
    chart
        .configure_mesh()
        .disable_x_mesh()
        .light_line_style(WHITE)
        .x_desc("batch")
        .y_desc("seconds")
        .x_labels(lines.len().min(30))
        .x_label_formatter(&label)
        .draw()?;
    for (k, (name, color)) in PHASES.iter().enumerate() {
        let bars = lines.iter().enumerate().map(|(i, l)| {
            let p = phases(l);
            let base: f64 = p[..k].iter().sum();
            let i = i as i32;
            let mut bar = Rectangle::new(
                [
                    (SegmentValue::Exact(i), base),
                    (SegmentValue::Exact(i + 1), base + p[k]),
                ],
                color.filled(),
            );
            bar.set_margin(0, 0, 8, 8);
            bar
        });
        chart
            .draw_series(bars)?
            .label(*name)
            .legend(move |(x, y)| Rectangle::new([(x, y - 5), (x + 12, y + 5)], color.filled()));
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    Ok(())
}

/// Tokens/s of each batch (over its total time) at its finish time, seconds from the run's
/// first start.
fn throughput(area: &Area, lines: &[BatchLine]) -> PlotResult {
    let start = lines
        .iter()
        .map(|l| l.started_unix_s)
        .fold(f64::MAX, f64::min);
    let mut points: Vec<(f64, f64)> = lines
        .iter()
        .map(|l| (l.finished_unix_s - start, l.tokens_per_s))
        .collect();
    points.sort_by(|a, b| a.0.total_cmp(&b.0));
    let right = points.iter().map(|p| p.0).fold(0.0, f64::max).max(1e-3) * 1.05;
    let top = points.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-3) * 1.15;
    let mut chart = ChartBuilder::on(area)
        .caption("throughput per batch (tokens/s)", ("sans-serif", 24))
        .margin(16)
        .x_label_area_size(40)
        .y_label_area_size(80)
        .build_cartesian_2d(0.0..right, 0.0..top)?;
    chart
        .configure_mesh()
        .light_line_style(LIGHT_GRID)
        .x_desc("batch finished at (s from run start)")
        .y_desc("tokens/s")
        .draw()?;
    line_with_dots(&mut chart, &points, SERIES_BLUE)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn line(batch_id: i64, finished: f64, tokens_per_s: f64) -> BatchLine {
        BatchLine {
            batch_id,
            run_id: batch_id,
            devices: "Cpu".into(),
            started_unix_s: 1000.0,
            finished_unix_s: 1000.0 + finished,
            timings: embedfleet_core::rundb::BatchTimings {
                model_load_s: 0.5,
                io_s: 0.2,
                tokenize_s: 0.1,
                inference_s: 2.0,
                total_s: 3.0,
                papers: 10,
                tokens: 1000,
                ..Default::default()
            },
            papers_per_s: 3.3,
            tokens_per_s,
        }
    }

    #[test]
    fn plots_are_pngs_with_drawn_pixels() {
        let dir = tempfile::tempdir().unwrap();
        let lines = vec![
            line(1, 3.0, 300.0),
            line(2, 5.0, 500.0),
            line(3, 4.0, 200.0),
        ];
        let paths = write_all(&lines, dir.path()).unwrap();
        assert_eq!(paths.len(), 2);
        for path in paths {
            let decoder =
                png::Decoder::new(std::io::BufReader::new(std::fs::File::open(&path).unwrap()));
            let mut reader = decoder.read_info().unwrap();
            let mut buf = vec![0; reader.output_buffer_size().unwrap()];
            let info = reader.next_frame(&mut buf).unwrap();
            assert_eq!((info.width, info.height), SIZE);
            let pixels = &buf[..info.buffer_size()];
            let coloured = pixels
                .chunks(3)
                .filter(|p| p[0] != p[1] || p[1] != p[2])
                .count();
            assert!(
                coloured > 100,
                "{}: {coloured} coloured pixels",
                path.display()
            );
            let dark = pixels
                .chunks(3)
                .filter(|p| p.iter().all(|&c| c < 64))
                .count();
            assert!(
                dark > 500,
                "{}: text and axes drawn ({dark} dark pixels)",
                path.display()
            );
        }
    }

    #[test]
    fn one_batch_plots_too() {
        let dir = tempfile::tempdir().unwrap();
        let paths = write_all(&[line(7, 0.0, 0.0)], dir.path()).unwrap();
        assert!(paths.iter().all(|p| p.metadata().unwrap().len() > 0));
    }
}
