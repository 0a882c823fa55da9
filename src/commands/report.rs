//! `embedfleet report`: the study's Table 2 for a run, and its plots.

use anyhow::{Context, Result};
use clap::Args;
use embedfleet_core::exit;
use embedfleet_jobs::report::{self, ReportError};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// Also write PNG plots (batch_timings.png, throughput.png) into this directory.
    #[arg(long, value_name = "DIR")]
    pub plots: Option<PathBuf>,
    /// Print the stable JSON form (README, "report --json") instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// Prints the report; a run with no finished batch is an error (exit code 1).
pub fn report(args: &ReportArgs) -> Result<i32> {
    let report = report::load(&args.run_dir)?;
    if report.summary.is_none() {
        return Err(ReportError::NothingFinished(args.run_dir.clone()).into());
    }
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("failed to serialise the report")?
        );
    } else {
        print!("{}", report::render(&report));
    }
    if let Some(dir) = &args.plots {
        for path in report::write_plots(&report, dir)? {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(exit::SUCCESS)
}
