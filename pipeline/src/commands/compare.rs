//! `embedfleet eval --compare-postgres`: the run's collection and a pgvector table of the same
//! run side by side, each at the least effort reaching the recall floor, with pgvector's
//! defaults beside them (`embedfleet_query::compare`).

use crate::flags::EvalFlags;
use crate::settings::Comparison;
use anyhow::Result;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::{atomic, exit, RunLayout};
use embedfleet_query::compare::{self, Target};
use embedfleet_vectordb::{IterativeScan, Sink};

pub(super) fn eval_compare(
    args: &EvalFlags,
    db: &RunDb,
    primary: &dyn Sink,
    queries: &[Vec<f32>],
    comparison: &Comparison,
) -> Result<i32> {
    let postgres = crate::target::TargetFlags {
        postgres: Some(comparison.postgres.clone()),
        ..args.target.clone()
    };
    let pg = postgres.open(&args.run_dir)?;
    // pgvector as it comes: its default ef_search, no iterative scans under a filter.
    let defaults = crate::target::TargetFlags {
        pg_iterative_scan: IterativeScan::Off,
        ..postgres
    }
    .open(&args.run_dir)?;
    let targets = [
        Target {
            database: primary.database_name().into(),
            sink: primary,
            collection: args.collection.clone(),
            defaults_only: false,
        },
        Target {
            database: "pgvector".into(),
            sink: pg.as_ref(),
            collection: comparison.table.clone(),
            defaults_only: false,
        },
        Target {
            database: "pgvector, defaults (no iterative scan)".into(),
            sink: defaults.as_ref(),
            collection: comparison.table.clone(),
            defaults_only: true,
        },
    ];
    let report = compare::compare(&targets, db, queries, &comparison.options)?;
    write_and_print(&report, &RunLayout::new(&args.run_dir), args.json)?;
    Ok(exit::SUCCESS)
}

/// The comparison written beside eval's latest report (`eval/compare.json`, `compare.md`),
/// and printed as markdown or, with `--json`, as JSON.
fn write_and_print(report: &compare::CompareReport, layout: &RunLayout, json: bool) -> Result<()> {
    let text = serde_json::to_string_pretty(report)?;
    let markdown = compare::render(report);
    std::fs::create_dir_all(layout.eval_dir())?;
    atomic::write(&layout.eval_compare_json(), text.as_bytes())?;
    atomic::write(&layout.eval_compare_md(), markdown.as_bytes())?;
    if json {
        println!("{text}");
    } else {
        print!("{markdown}");
    }
    eprintln!("wrote {}", layout.eval_compare_json().display());
    Ok(())
}
