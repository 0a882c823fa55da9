//! The snapshot stage's commands: `upload --mode snapshot`, `build-shard`, and the build that
//! ends `embed-job --build-shard`.

use anyhow::Result;
use embedfleet_core::exit;
use embedfleet_core::RunLayout;
use embedfleet_snapshot::{
    self as snapshot, describe_batches, GroupBuildRequest, LoadOptions, PinnedSettings, RestClient,
    ShardKeys, ShardSettings,
};
use embedfleet_vectordb as upload;
use std::io::IsTerminal;
use std::path::Path;

use crate::build_shard::BuildShards;
use crate::flags::{BuildShardFlags, UploadFlags};
use crate::settings::upload::apply_collection_flags;

/// `upload --mode snapshot`: the run's built shards recovered into a cluster-mode server.
pub fn snapshot_load(args: &UploadFlags, slot: &mut super::invoke::RunDbSlot) -> Result<i32> {
    let Some(url) = &args.target.qdrant else {
        return Err(snapshot::SnapshotError::NeedsCluster {
            message: "`--mode snapshot` loads into a Qdrant server (--qdrant URL); the embedded engine is one shard per collection and takes upserts only".into(),
        }
        .into());
    };
    let config = args.target.server_config(url);
    let key = config.api_key.resolve()?;
    let server = args.target.open_server(url)?;
    let rest_url = args
        .qdrant_rest
        .clone()
        .unwrap_or_else(|| RestClient::url_from_grpc(url));
    let rest = RestClient::new(
        &rest_url,
        key,
        args.target.allow_insecure,
        std::time::Duration::from_secs(6 * 3600),
    )?;
    let mut options = LoadOptions::new(&args.run_dir, &args.collection);
    apply_collection_flags(&mut options.spec, &args.collection_settings);
    options.spec.qdrant.replication_factor = args.replication_factor;
    options.in_flight = args.recoveries.max(1);
    options.build_missing = !args.no_build;
    options.progress = std::io::stderr().is_terminal();
    options.group_count = args.group_count;
    options.replace_keys = args.replace_keys;
    eprintln!(
        "snapshot load into `{}` ({url}, REST {rest_url}): {} recoveries at once",
        args.collection, options.in_flight
    );
    let db = slot.open(&args.run_dir)?;
    let report = snapshot::load_snapshots(db, &server, &rest, &options)?;
    if report.batches == 0 {
        eprintln!("the run has no shards yet: nothing to load");
        return Ok(exit::SUCCESS);
    }
    eprintln!("{}", load_summary(&args.collection, &report));
    Ok(exit::SUCCESS)
}

/// The snapshot load's last line: what it recovered, built and checked.
fn load_summary(collection: &str, report: &snapshot::LoadReport) -> String {
    let others = report.collection_points.saturating_sub(report.points);
    format!(
        "collection `{}` {}: {} batches in {} groups of {} (keys {}-g*), {} recovered now in {:.1} s, {} loaded before{}; green {:.1} s later; {} points of this run (every key's count = its built shard's{}){}, {} exact searches found their own paper",
        collection,
        if report.created { "created" } else { "existed" },
        report.batches,
        report.groups,
        report.batches_per_group,
        if report.run_id.is_empty() { "b" } else { &report.run_id },
        report.recovered,
        report.recover_s,
        report.already,
        if report.built_here > 0 {
            format!(", {} built here", report.built_here)
        } else {
            String::new()
        },
        report.green_s,
        report.points,
        if report.deleted_after > 0 {
            format!(
                " less {} rows deleted by id that their groups no longer serve",
                report.deleted_after
            )
        } else {
            String::new()
        },
        if others > 0 {
            format!(", {others} more in other runs' keys")
        } else {
            String::new()
        },
        report.searches_checked,
    )
}

/// `embedfleet build-shard`: each asked group's shard built and packed under
/// <run-dir>/snapshots.
pub fn build_shard_cmd(args: &BuildShardFlags) -> Result<i32> {
    let layout = RunLayout::new(&args.run_dir);
    if let Some(path) = &args.request {
        // A group build job: the owner decided the sources; the run's pinned settings apply.
        let request = GroupBuildRequest::read(path)?;
        eprintln!(
            "group {}: {}, {} points of {}-d from {} parquet shards{}",
            request.group,
            describe_batches(request.batches),
            request.points,
            request.dim,
            request.sources.len(),
            if request.deleted.is_empty() {
                String::new()
            } else {
                format!(", {} deleted papers left out", request.deleted.len())
            }
        );
        print_built(&request.build(&layout)?);
        return Ok(exit::SUCCESS);
    }
    let mut spec = upload::CollectionSpec::new("shard", 0);
    apply_collection_flags(&mut spec, &args.collection_settings);
    let build = BuildShards {
        run_dir: args.run_dir.clone(),
        accepted: args.accepted,
        groups: args.groups.clone(),
        batches: args.batches.clone(),
        group_count: args.group_count,
        attempt: args.attempt.clone(),
        spec,
    };
    build.run(&mut print_built)?;
    Ok(exit::SUCCESS)
}

/// `embed-job --build-shard`: the batch's shard, from this attempt's shards, with the run's
/// pinned build settings (the defaults before any `build-shard`). A run whose keys hold groups
/// of batches builds them on the login node or in a group job instead: this does nothing.
pub fn build_after_embed(run_dir: &Path, batch: i64, attempt: &str) -> Result<()> {
    let layout = RunLayout::new(run_dir);
    if let Some(keys) = ShardKeys::pinned(&layout)? {
        if keys.batches_per_group > 1 {
            eprintln!(
                "batch {batch}: this run's shard keys hold {} batches each; its group's shard is built when the group is done (`build-shard --accepted --group {}`, or `upload --mode snapshot`)",
                keys.batches_per_group,
                keys.group_of(batch)
            );
            return Ok(());
        }
    }
    let base = upload::CollectionSpec::new("shard", 0);
    let spec = match ShardSettings::pinned(&layout)? {
        Some(settings) => settings.apply(&base),
        None => base,
    };
    let sources = snapshot::sources_of_attempt(&layout, batch, attempt)?;
    let outcome = snapshot::build_shard(&layout, (batch, batch), &sources, &spec)?;
    print_built(&outcome);
    Ok(())
}

fn print_built(outcome: &snapshot::BuildOutcome) {
    let m = &outcome.manifest;
    let what = describe_batches(m.batches());
    let deleted = if m.deleted.is_empty() {
        String::new()
    } else {
        format!(", {} deleted papers left out", m.deleted.len())
    };
    if !outcome.built {
        eprintln!(
            "{what}: built already ({}, {} points{deleted})",
            m.snapshot, m.points
        );
        return;
    }
    let t = &m.timings;
    eprintln!(
        "{what}: {} points{deleted} into {} ({:.1} MB, {} segments, Qdrant {} format) in {:.1} s: insert {:.1} s, index {:.1} s, pack {:.1} s; {:.1} CPU s",
        m.points,
        m.snapshot,
        m.snapshot_bytes as f64 / 1e6,
        m.segments,
        m.engine_version,
        t.total_s,
        t.insert_s,
        t.optimize_s,
        t.pack_s,
        t.cpu_s
    );
}
