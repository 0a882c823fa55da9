//! `embedfleet report`: the study's Table 2 for a run, its plots, its HTML page and its trace.

use crate::flags::ReportFlags;
use crate::settings::ReportSettings;
use anyhow::{Context, Result};
use embedfleet_core::exit;
use embedfleet_orchestrator::report::{self, ReportError};
use std::path::Path;

/// Prints the report; a run with no finished batch is an error (exit code 1), unless only the
/// page or the trace was asked for.
pub fn report(args: &ReportFlags, slot: &mut super::invoke::RunDbSlot) -> Result<i32> {
    let db = slot.open(&args.run_dir)?;
    let settings = ReportSettings::resolve(args);
    if let Some(path) = &settings.html {
        write(path, &report::html_page(db, &args.run_dir)?)?;
    }
    if let Some(path) = &settings.trace {
        write(path, &report::trace_file(db)?)?;
    }
    let Some(table) = &settings.table else {
        return Ok(exit::SUCCESS);
    };
    let report = report::load(db, &args.run_dir)?;
    if report.summary.is_none() {
        return Err(ReportError::NothingFinished(args.run_dir.clone()).into());
    }
    if table.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&report).context("failed to serialise the report")?
        );
    } else {
        print!("{}", report::render(&report));
    }
    if let Some(dir) = &table.plots {
        for path in report::write_plots(&report, dir)? {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(exit::SUCCESS)
}

fn write(path: &Path, text: &str) -> Result<()> {
    embedfleet_core::atomic::write(path, text.as_bytes())
        .with_context(|| format!("failed to write {}", path.display()))?;
    eprintln!("wrote {}", path.display());
    Ok(())
}
