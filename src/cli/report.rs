//! `report`: a run's timings, throughput and failures (the study's Table 2), its plots, its
//! HTML page and its trace.

use super::help;
use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// Also write PNG plots (batch_timings.png, throughput.png) into this directory.
    #[arg(long, value_name = "DIR", help_heading = help::FILES)]
    pub plots: Option<PathBuf>,
    /// Print the stable JSON form (docs/commands.md, "report --json") instead of the table.
    #[arg(long)]
    pub json: bool,
    /// Write the run as one self-contained HTML page (progress, the timeline of every job
    /// attempt, queues, hosts, Table 2, failures): no network needed to open it. Alone (without
    /// --json or --plots) it writes only the files asked for, also while the run is young.
    #[arg(long, value_name = "FILE", help_heading = help::FILES)]
    pub html: Option<PathBuf>,
    /// Write a trace: one tab-separated line per job attempt, in Nextflow's trace field names
    /// (task_id, native_id, name, status, exit, attempt, queue, submit, start, complete,
    /// duration, realtime) and ours (batch, host, papers, tokens).
    #[arg(long, value_name = "FILE", help_heading = help::FILES)]
    pub trace: Option<PathBuf>,
}
