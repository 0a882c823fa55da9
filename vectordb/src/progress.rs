//! The upload's progress bar on stderr: points, points/s, MB/s of vectors, ETA.

use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// A progress bar, or nothing when stderr is not a terminal (or it was not asked for).
pub struct Progress {
    bar: Option<ProgressBar>,
    bytes_per_point: u64,
    started: Instant,
}

impl Progress {
    /// A bar of `total` points of `dim`-d f32 vectors, shown only when `show`.
    pub fn new(show: bool, total: u64, dim: usize) -> Self {
        let bar = show.then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style = ProgressStyle::with_template(
                "upload {bar:30} {human_pos}/{human_len} points, {per_sec}, {msg}, ETA {eta}",
            )
            .expect("the template is valid. This is a bug.");
            bar.set_style(style);
            bar.enable_steady_tick(Duration::from_millis(500));
            bar
        });
        Self {
            bar,
            bytes_per_point: dim as u64 * 4,
            started: Instant::now(),
        }
    }

    /// `n` more points done (acknowledged or failed).
    pub fn add(&self, n: u64) {
        if let Some(bar) = &self.bar {
            bar.inc(n);
            self.update_rate(bar);
        }
    }

    /// Sets the points done (the parent of worker processes polls run.db).
    pub fn set(&self, done: u64) {
        if let Some(bar) = &self.bar {
            bar.set_position(done);
            self.update_rate(bar);
        }
    }

    fn update_rate(&self, bar: &ProgressBar) {
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let mb = (bar.position() * self.bytes_per_point) as f64 / 1e6;
        bar.set_message(format!("{:.1} MB/s", mb / secs));
    }

    /// Removes the bar.
    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
