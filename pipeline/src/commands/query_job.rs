//! `query-job`: the query workload's job on a GPU node, which embeds the terms of a work
//! folder into files and never opens run.db (its owner's side, `query --submit`, is
//! `crate::query_job`).

use crate::flags::QueryJobFlags;
use anyhow::Result;
use embedfleet_core::exit;
use embedfleet_query::{QueryModel, QueryWorkDir};
use std::time::Instant;

/// `query-job`: embeds the work folder's missing parts on this node.
pub fn query_job(args: &QueryJobFlags) -> Result<i32> {
    let wd = QueryWorkDir::open(&args.work)?;
    let devices = embedfleet_embed::parse_devices(&args.devices)?;
    let mut model = QueryModel::new(wd.work.model_dir.clone(), devices, wd.work.dim)
        .with_precision(wd.work.precision)
        .with_text_rule(wd.work.text_rule);
    let started = Instant::now();
    let before = wd.work.parts() - wd.missing_parts().len();
    let written = wd.embed_missing(&mut model, |index, parts| {
        eprintln!("query-job: part {index} of {parts} written");
    })?;
    eprintln!(
        "query-job: {written} parts embedded on {} ({before} were done before) in {:.1} s",
        args.devices,
        started.elapsed().as_secs_f64()
    );
    Ok(exit::SUCCESS)
}
