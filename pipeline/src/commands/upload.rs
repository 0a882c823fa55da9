//! `embedfleet upload`, `embedfleet tune`, and the upload that ends `embedfleet run`.

use crate::flags::{DeleteFlags, TuneFlags, UploadFlags, UploadMode};
use crate::settings::{TuneSettings, UploadSettings};
use crate::tuned;
use anyhow::{Context, Result};
use embedfleet_core::rundb::RunDb;
use embedfleet_core::{exit, process};
use embedfleet_vectordb::tune;
use embedfleet_vectordb::{self as upload, UploadOptions, UploadReport, WorkerCommand};

pub fn upload_cmd(args: &UploadFlags, slot: &mut super::invoke::RunDbSlot) -> Result<i32> {
    if args.mode == UploadMode::Snapshot {
        return super::snapshot::snapshot_load(args, slot);
    }
    let db = slot.open(&args.run_dir)?;
    let sink = args.target.open(&args.run_dir)?;
    let UploadSettings { options, batching } = UploadSettings::resolve(db, sink.as_ref(), args)?;
    if options.share.is_some() {
        return upload_worker(db, sink.as_ref(), &args.collection, &options);
    }
    // A server gets worker processes (by default one per peer holding the collection, else one
    // per core, decided once the collection exists); other sinks are one process.
    let server = sink.one_process_because().is_none();
    if let Some(why) = sink.one_process_because() {
        if args.workers.is_some_and(|n| n > 1) {
            eprintln!("note: {why}; --workers is ignored, --in-flight sets its threads");
        }
    }
    eprintln!(
        "upload into `{}` ({}): batches of {}, {} in flight{}{}",
        args.collection,
        sink.kind(),
        options.batch_size,
        options.in_flight,
        match (server, args.workers) {
            (false, _) | (true, Some(1)) => String::new(),
            (true, Some(n)) => format!(", {n} worker processes"),
            (true, None) => ", a worker process per peer (one peer: per core)".into(),
        },
        if batching.tuned() { " (tuned)" } else { "" }
    );
    let report = if server {
        let command = WorkerCommand {
            exe: std::env::current_exe().context("failed to find the embedfleet binary")?,
            args: worker_args(args, &options),
            workers: args.workers,
            partial_code: exit::PARTIAL,
        };
        upload::upload_with_workers(sink.as_ref(), db, &options, &command)?
    } else {
        upload::upload_on(sink.as_ref(), db, &options)?
    };
    print_report(&args.collection, &report);
    crate::activity::record_upload(db, sink.as_ref(), &options, &report);
    Ok(if report.send.failed_points > 0 {
        exit::PARTIAL
    } else {
        exit::SUCCESS
    })
}

/// `upload --worker I/N`: one worker process's share of the batches, sent by the parent's
/// settings.
fn upload_worker(
    db: &RunDb,
    sink: &dyn upload::Sink,
    collection: &str,
    options: &UploadOptions,
) -> Result<i32> {
    // A worker ends when its parent `embedfleet upload` is gone (killed, say), so running the
    // upload again never finds stray workers still sending.
    process::exit_when_parent_gone("upload worker", exit::FAILURE);
    let prepared = upload::prepare(db, &upload::progress_key(sink, collection))?;
    let report = upload::send(sink, db, &prepared, options)?;
    Ok(if report.failed_points > 0 {
        exit::PARTIAL
    } else {
        exit::SUCCESS
    })
}

/// `embedfleet delete`: papers out of a collection by id, each from the shard key of its batch's
/// group in a snapshot-loaded collection. Each paper of the run is first recorded as deleted in run.db (a
/// tombstone: no later upload, built shard or publish brings it back), then deleted from Qdrant,
/// with every earlier tombstone again: a delete killed between the two is finished by the next.
pub fn delete_cmd(args: &DeleteFlags, slot: &mut super::invoke::RunDbSlot) -> Result<i32> {
    let db = slot.open(&args.run_dir)?;
    let sink = args.target.open(&args.run_dir)?;
    let report = crate::delete::delete_papers(
        db,
        sink.as_ref(),
        &args.run_dir,
        &args.collection,
        &args.papers,
    )?;
    let (new, all) = (report.newly_tombstoned, report.tombstones);
    match report.counts {
        None => eprintln!(
            "`{}` does not exist on {}: nothing to delete there; {new} papers newly tombstoned in run.db ({all} in all), so no upload will send them",
            args.collection,
            sink.target(),
        ),
        Some((before, after)) => eprintln!(
            "deleted {} points from `{}` ({before} → {after} points); {new} papers newly tombstoned in run.db ({all} in all): `upload`, `build-shard` and `publish` leave them out",
            before - after.min(before),
            args.collection,
        ),
    }
    if report.counts.is_some() && !report.unknown.is_empty() {
        eprintln!(
            "note: {} papers are not in this run (not tombstoned): {}",
            report.unknown.len(),
            report.unknown.join(", ")
        );
    }
    Ok(exit::SUCCESS)
}

/// The command line of a worker process: the parent's, with the resolved batch settings.
fn worker_args(args: &UploadFlags, options: &UploadOptions) -> Vec<String> {
    let mut out: Vec<String> = vec![
        "upload".into(),
        "--run-dir".into(),
        args.run_dir.display().to_string(),
        "--collection".into(),
        args.collection.clone(),
        "--batch-size".into(),
        options.batch_size.to_string(),
        "--in-flight".into(),
        options.in_flight.to_string(),
        "--checkpoint-every".into(),
        options.checkpoint_every.to_string(),
    ];
    if let Some(url) = &args.target.qdrant {
        out.extend(["--qdrant".into(), url.clone()]);
    }
    if let Some(var) = &args.target.api_key_env {
        out.extend(["--api-key-env".into(), var.clone()]);
    }
    if let Some(path) = &args.target.api_key_file {
        out.extend(["--api-key-file".into(), path.display().to_string()]);
    }
    if args.target.allow_insecure {
        out.push("--allow-insecure".into());
    }
    out
}

pub(crate) fn print_report(collection: &str, report: &UploadReport) {
    let Some(ensured) = report.ensured else {
        eprintln!("the run has no shards yet: nothing to upload");
        return;
    };
    let s = &report.send;
    let secs = s.elapsed.as_secs_f64().max(1e-9);
    eprintln!(
        "collection `{collection}` {}: {} points sent in {:.1} s{} ({:.0} points/s, {:.1} MB/s of vectors), {} already acknowledged, {} failed",
        match ensured {
            upload::Ensured::Created => "created",
            upload::Ensured::Existing => "existed",
        },
        s.points,
        secs,
        if report.workers > 1 {
            format!(" by {} worker processes", report.workers)
        } else {
            String::new()
        },
        s.points_per_s(),
        s.vector_bytes as f64 / 1e6 / secs,
        report.already_acked,
        s.failed_points,
    );
    for e in &s.errors {
        eprintln!("  error: {e}");
    }
    if let Some(f) = &report.finish {
        eprintln!(
            "indexing took {:.1} s; the collection holds {} points ({} indexed) and is green",
            f.indexing.as_secs_f64(),
            f.points,
            f.indexed_vectors
        );
    }
    if s.failed_points > 0 {
        eprintln!("{} points failed: run `embedfleet upload` again to send them (`embedfleet status` shows what is missing)", s.failed_points);
    }
}

/// `tune`: the upload's batching (into a scratch collection) or, with `--queries`, the query
/// workload's.
pub fn tune_cmd(args: &TuneFlags, slot: &mut super::invoke::RunDbSlot) -> Result<i32> {
    let db = slot.open(&args.run_dir)?;
    let sink = args.target.open(&args.run_dir)?;
    let (options, out) = match TuneSettings::resolve(db, sink.as_ref(), args)? {
        TuneSettings::Queries { options } => {
            return super::query::tune_queries(db, sink.as_ref(), &options)
        }
        TuneSettings::Upload { options, out } => (options, out),
    };
    let report = tune::tune(sink.as_ref(), db, &options)?;
    print!("{}", tune::markdown(&report));
    let files = tune::write_outputs(&report, &out)?;
    crate::activity::record_tune(db, sink.kind(), &report);
    tuned::save_upload(db, sink.kind(), &report)?;
    eprintln!(
        "chosen: batches of {}, {} in flight ({:.0} points/s into the {} sink); saved in run.db, `embedfleet upload` uses it",
        report.batch_size,
        report.in_flight,
        report.points_per_s,
        sink.kind()
    );
    for f in files {
        eprintln!("wrote {}", f.display());
    }
    Ok(exit::SUCCESS)
}
