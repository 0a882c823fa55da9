//! What the submit loop tells its user: a progress bar on a terminal (papers embedded,
//! tokens/s, jobs per state, ETA), plain lines otherwise (logs of cluster runs stay readable),
//! one at least every [`LINE_EVERY`] so a log shows the loop is alive while nothing changes.

use std::time::{Duration, Instant};

use embedfleet_core::rundb::{JobRow, RunStatus};
use embedfleet_core::state::JobStatus;
use indicatif::{ProgressBar, ProgressStyle};

use crate::status::duration;

/// The longest a log without a terminal goes without a progress line.
pub const LINE_EVERY: Duration = Duration::from_secs(10);

pub struct Console {
    bar: Option<ProgressBar>,
    started: Instant,
    tokens_at_start: Option<u64>,
    /// When the last line was printed, without a terminal.
    last_line: Option<Instant>,
}

impl Console {
    pub fn new(progress: bool) -> Self {
        let bar = progress.then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                // The ETA is the run's own (`eta`), not the bar's guess from its position: that
                // says 0s before a paper is done.
                ProgressStyle::with_template("{bar:30} {pos}/{len} papers  {msg}")
                    .expect("the template is valid. This is a bug."),
            );
            bar.enable_steady_tick(Duration::from_millis(500));
            bar
        });
        Self {
            bar,
            started: Instant::now(),
            tokens_at_start: None,
            last_line: None,
        }
    }

    /// An event worth a line of its own.
    pub fn say(&self, msg: impl AsRef<str>) {
        match &self.bar {
            Some(bar) => bar.println(msg.as_ref()),
            None => eprintln!("{}", msg.as_ref()),
        }
    }

    /// Redraws from the run's status.
    pub fn update(&mut self, status: &RunStatus, open: &[JobRow], paused: bool) {
        let start = *self.tokens_at_start.get_or_insert(status.tokens_embedded);
        let secs = self.started.elapsed().as_secs_f64().max(1e-3);
        let tok_s = status.tokens_embedded.saturating_sub(start) as f64 / secs;
        // Every open job is running or queued (pending, being submitted, or not yet listed).
        let running = open
            .iter()
            .filter(|j| j.state == JobStatus::Running)
            .count();
        // Papers in the shards running jobs have written count too: a job's papers are taken
        // in only when it ends, and a one-batch run would show 0 until then.
        let live: u64 = status.live.iter().map(|a| a.papers_done).sum();
        let embedded = (status.rows_in_shards + live).min(status.papers_planned.max(1));
        // Before the first batch is taken in there is no rate: say what is going on instead.
        let speed = if tok_s > 0.0 || running == 0 {
            format!("{tok_s:.0} tok/s")
        } else {
            format!(
                "embedding for {} (tok/s once a batch is done)",
                duration(secs)
            )
        };
        let mut msg = format!(
            "{speed}  jobs: {running} running, {} queued  {}",
            open.len() - running,
            eta(status)
        );
        if paused {
            msg.push_str("  PAUSED");
        }
        match &self.bar {
            Some(bar) => {
                bar.set_length(status.papers_planned);
                bar.set_position(embedded);
                bar.set_message(msg);
            }
            None => {
                if self.last_line.is_none_or(|at| at.elapsed() >= LINE_EVERY) {
                    eprintln!(
                        "{}/{} papers embedded after {}; {msg}",
                        embedded,
                        status.papers_planned,
                        duration(self.started.elapsed().as_secs_f64())
                    );
                    self.last_line = Some(Instant::now());
                }
            }
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}

/// `eta 12m 30s` from the run's rate, or `eta —` before a job has finished (no rate yet).
fn eta(status: &RunStatus) -> String {
    match status.eta_seconds {
        Some(secs) => format!("eta {}", duration(secs)),
        None => "eta —".to_string(),
    }
}
