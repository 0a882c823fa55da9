//! What the submit loop tells its user: a progress bar on a terminal (papers embedded,
//! tokens/s, jobs per state, ETA), plain lines otherwise (logs of cluster runs stay readable).

use std::time::{Duration, Instant};

use embedfleet_core::rundb::{JobRow, RunStatus};
use embedfleet_core::state::JobStatus;
use indicatif::{ProgressBar, ProgressStyle};

pub struct Console {
    bar: Option<ProgressBar>,
    started: Instant,
    tokens_at_start: Option<u64>,
    last_line: Option<(Instant, String)>,
}

impl Console {
    pub fn new(progress: bool) -> Self {
        let bar = progress.then(|| {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template("{bar:30} {pos}/{len} papers  {msg}  eta {eta}")
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
        let mut msg = format!(
            "{tok_s:.0} tok/s  jobs: {running} running, {} queued",
            open.len() - running
        );
        if paused {
            msg.push_str("  PAUSED");
        }
        match &self.bar {
            Some(bar) => {
                bar.set_length(status.papers_planned);
                bar.set_position(status.rows_in_shards);
                bar.set_message(msg);
            }
            None => {
                let line = format!(
                    "{}/{} papers embedded; {msg}",
                    status.rows_in_shards, status.papers_planned
                );
                // Without a terminal: a line when something changed, at most every 10 s.
                let due = match &self.last_line {
                    Some((at, last)) => *last != line && at.elapsed() >= Duration::from_secs(10),
                    None => true,
                };
                if due {
                    eprintln!("{line}");
                    self.last_line = Some((Instant::now(), line));
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
