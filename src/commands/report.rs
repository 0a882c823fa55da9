//! `embedfleet report`: the study's Table 2 for a run, and its plots.

use crate::cli::ReportArgs;
use anyhow::{Context, Result};
use embedfleet_core::exit;
use embedfleet_orchestrator::report::{self, ReportError};

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
