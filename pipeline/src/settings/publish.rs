//! `publish`'s settings, resolved once: the flags, and what the dataset card takes from the run
//! (its query results, the report's table, the latest eval, the query format the run pinned,
//! the commands that made it).

use crate::flags::PublishFlags;
use crate::records;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_publish::{PublishOptions, QueryFormat};
use std::io::IsTerminal;

/// The options `publish` runs with, for the run whose run.db `db` is.
pub fn publish_options(db: &RunDb, flags: &PublishFlags) -> anyhow::Result<PublishOptions> {
    let mut options = PublishOptions::new(&flags.run_dir, &flags.out);
    options.target_shard_bytes = (flags.target_shard_mb * 1e6).max(1.0) as u64;
    options.allow_partial = flags.allow_partial;
    options.with_text = flags.with_text;
    options.license = flags.license.clone();
    options.progress = std::io::stderr().is_terminal();
    options.query_results = records::query_results(db, &flags.query_results)?;
    options.report_table = embedfleet_orchestrator::report::load(db, &flags.run_dir)
        .ok()
        .filter(|r| r.summary.is_some())
        .map(|r| embedfleet_orchestrator::report::render(&r));
    let eval_md = RunLayout::new(&flags.run_dir).eval_latest_md();
    options.eval_summary = std::fs::read_to_string(eval_md).ok();
    let convention = super::query::run_query_convention(&flags.run_dir);
    options.instruction = convention
        .as_ref()
        .map(|c| c.instruction.clone())
        .filter(|i| !i.is_empty());
    options.query_format = convention.map(|c| QueryFormat {
        family: c.family,
        example: c.example,
    });
    options.commands = records::history(db)?;
    Ok(options)
}
