//! The embedded default's job runner: every batch not yet done runs as a child process
//! (`embedfleet embed-job`), at most `jobs` at once, on this machine. Children are their own
//! process group, so stopping the run stops their workers too. A failed job is retried once;
//! a batch that fails twice is left for `status` to show.
//!
//! This is the `run` command's runner; the queue-aware submit loop is the general one.

use embedfleet_core::rundb::{RunDb, RunDbError};
use indicatif::{ProgressBar, ProgressStyle};
use std::collections::VecDeque;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct LocalRunOptions {
    pub run_dir: PathBuf,
    /// The embedfleet binary to run jobs with.
    pub exe: PathBuf,
    /// Jobs at once.
    pub jobs: usize,
    /// Arguments after `embed-job --run-dir DIR --batch ID`.
    pub job_args: Vec<String>,
    pub progress: bool,
    pub max_attempts: u32,
}

#[derive(Debug, Default, Clone)]
pub struct LocalRunReport {
    pub batches_done: u64,
    /// (batch, last stderr lines) of batches that failed every attempt.
    pub failed: Vec<(i64, String)>,
    pub elapsed: Duration,
}

#[derive(Debug, thiserror::Error)]
pub enum LocalRunError {
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    #[error("failed to start {exe}: {source}")]
    Spawn {
        exe: PathBuf,
        source: std::io::Error,
    },
}

struct Running {
    batch: i64,
    attempt: u32,
    child: Child,
    log: PathBuf,
}

pub fn run(options: &LocalRunOptions) -> Result<LocalRunReport, LocalRunError> {
    let started = Instant::now();
    let db = RunDb::open(&options.run_dir)?;
    let status = db.status()?;
    let mut pending = Vec::new();
    for state in ["planned", "running", "failed"] {
        pending.extend(db.batch_ids(state)?);
    }
    pending.sort_unstable();
    let mut queue: VecDeque<(i64, u32)> = pending.into_iter().map(|b| (b, 1)).collect();
    let progress = bar(
        options.progress,
        status.papers_planned,
        status.rows_in_shards,
    );
    let log_dir = options.run_dir.join("logs");
    std::fs::create_dir_all(&log_dir).map_err(|source| LocalRunError::Spawn {
        exe: log_dir.clone(),
        source,
    })?;
    let mut running: Vec<Running> = Vec::new();
    let mut report = LocalRunReport::default();
    while !queue.is_empty() || !running.is_empty() {
        while running.len() < options.jobs.max(1) {
            let Some((batch, attempt)) = queue.pop_front() else {
                break;
            };
            running.push(spawn(options, &log_dir, batch, attempt)?);
        }
        std::thread::sleep(Duration::from_millis(100));
        let mut still = Vec::new();
        for mut job in running.drain(..) {
            match job.child.try_wait() {
                Ok(None) => still.push(job),
                Ok(Some(exit))
                    if exit.success() || exit.code() == Some(embedfleet_core::exit::PARTIAL) =>
                {
                    report.batches_done += 1
                }
                Ok(Some(exit)) => {
                    let why = exit.to_string();
                    if job.attempt < options.max_attempts {
                        progress.println(format!("batch {} failed ({why}); retrying", job.batch));
                        queue.push_back((job.batch, job.attempt + 1));
                    } else {
                        report
                            .failed
                            .push((job.batch, format!("{why}: {}", log_tail(&job.log))));
                        db.set_batch_state(job.batch, "failed")?;
                    }
                }
                Err(e) => {
                    report
                        .failed
                        .push((job.batch, format!("lost the job process: {e}")));
                    db.set_batch_state(job.batch, "failed")?;
                }
            }
        }
        running = still;
        if let Ok(s) = db.status() {
            progress.set_position(s.rows_in_shards);
        }
    }
    progress.finish_and_clear();
    report.elapsed = started.elapsed();
    Ok(report)
}

fn spawn(
    options: &LocalRunOptions,
    log_dir: &Path,
    batch: i64,
    attempt: u32,
) -> Result<Running, LocalRunError> {
    let log = log_dir.join(format!("batch-{batch:06}-attempt-{attempt}.log"));
    let err = |source| LocalRunError::Spawn {
        exe: options.exe.clone(),
        source,
    };
    let log_file = std::fs::File::create(&log).map_err(err)?;
    let mut cmd = Command::new(&options.exe);
    cmd.arg("embed-job")
        .arg("--run-dir")
        .arg(&options.run_dir)
        .arg("--batch")
        .arg(batch.to_string())
        .args(&options.job_args)
        .stdin(Stdio::null())
        .stdout(log_file.try_clone().map_err(err)?)
        .stderr(log_file)
        .process_group(0);
    let child = cmd.spawn().map_err(err)?;
    Ok(Running {
        batch,
        attempt,
        child,
        log,
    })
}

fn log_tail(path: &Path) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(5)..].join(" | ")
}

fn bar(enabled: bool, total: u64, done: u64) -> ProgressBar {
    if !enabled {
        return ProgressBar::hidden();
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template("embedding {bar:30} {pos}/{len} papers {per_sec} eta {eta}")
            .expect("the template is valid. This is a bug."),
    );
    bar.set_position(done);
    bar
}
