//! `embedfleet eval --compare-postgres`: the run's collection and a pgvector table of the same
//! run side by side, each at the least effort reaching the recall floor, with pgvector's
//! defaults beside them (`embedfleet_query::compare`).

use super::target::pg_config;
use crate::cli::EvalArgs;
use anyhow::Result;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::{atomic, exit, RunLayout};
use embedfleet_pipeline::target::SinkKind;
use embedfleet_query::compare::{self, CompareOptions, Target};
use embedfleet_upload::{IterativeScan, PgConfig, PgVector, Sink};

/// The name a kind of sink has in the table.
fn database(kind: SinkKind) -> String {
    match kind {
        SinkKind::Edge => "qdrant (embedded)".into(),
        SinkKind::Server => "qdrant (server)".into(),
        SinkKind::Postgres => "pgvector".into(),
    }
}

pub(super) fn eval_compare(
    args: &EvalArgs,
    db: &RunDb,
    primary: &dyn Sink,
    kind: SinkKind,
    queries: &[Vec<f32>],
    url: &str,
) -> Result<i32> {
    let config = pg_config(&args.target, url);
    let pg = PgVector::connect(config.clone())?;
    // pgvector as it comes: its default ef_search, no iterative scans under a filter.
    let defaults = PgVector::connect(PgConfig {
        iterative_scan: IterativeScan::Off,
        ..config
    })?;
    let table = args
        .compare_table
        .clone()
        .unwrap_or_else(|| args.collection.clone());
    let targets = [
        Target {
            database: database(kind),
            sink: primary,
            collection: args.collection.clone(),
            defaults_only: false,
        },
        Target {
            database: "pgvector".into(),
            sink: &pg,
            collection: table.clone(),
            defaults_only: false,
        },
        Target {
            database: "pgvector, defaults (no iterative scan)".into(),
            sink: &defaults,
            collection: table,
            defaults_only: true,
        },
    ];
    let extra_filter = embedfleet_query::parse_filters(&args.filters)
        .map_err(anyhow::Error::msg)?
        .map(|f| (args.filters.join(" & "), f));
    let options = CompareOptions {
        k: args.top_k.max(1),
        floor: args.recall_floor,
        batch_size: args.batch_size.max(1),
        in_flight: args.in_flight.max(1),
        extra_filter,
    };
    let report = compare::compare(&targets, db, queries, &options)?;
    let json = serde_json::to_string_pretty(&report)?;
    let markdown = compare::render(&report);
    let dir = RunLayout::new(&args.run_dir).eval_dir();
    std::fs::create_dir_all(&dir)?;
    atomic::write(&dir.join("compare.json"), json.as_bytes())?;
    atomic::write(&dir.join("compare.md"), markdown.as_bytes())?;
    if args.json {
        println!("{json}");
    } else {
        print!("{markdown}");
    }
    eprintln!("wrote {}", dir.join("compare.json").display());
    Ok(exit::SUCCESS)
}
