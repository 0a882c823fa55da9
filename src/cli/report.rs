//! `report`: the study's Table 2 for a run, and its plots.

use clap::Args;
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// Also write PNG plots (batch_timings.png, throughput.png) into this directory.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// Print the stable JSON form (docs/commands.md, "report --json") instead of the table.
    #[arg(long)]
    pub json: bool,
}
