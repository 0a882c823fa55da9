//! `embedfleet upload`, `embedfleet tune`, and the upload that ends `embedfleet run`.

use anyhow::{bail, Context, Result};
use clap::Args;
use embedfleet_core::exit;
use embedfleet_core::rundb::RunDb;
use embedfleet_jobs::upload::tune::{self, TuneOptions, TunedUpload, TUNED_SETTING};
use embedfleet_jobs::upload::{
    self, query, ApiKey, QdrantEdge, QdrantServer, ServerConfig, Sink, UploadOptions, UploadReport,
    WorkerCommand,
};
use std::io::IsTerminal;
use std::path::{Path, PathBuf};

/// Where the points go: a Qdrant server, or the embedded engine (the default).
#[derive(Debug, Args)]
pub struct TargetArgs {
    /// A Qdrant server or cluster, its gRPC port: http://host:6334 (https for TLS).
    #[arg(long, value_name = "URL", conflicts_with = "edge")]
    pub qdrant: Option<String>,
    /// The embedded Qdrant engine's directory (default: <run-dir>/qdrant).
    #[arg(long, value_name = "DIR")]
    pub edge: Option<PathBuf>,
    /// Read the server's API key from this environment variable (never printed).
    #[arg(long, value_name = "VAR", conflicts_with = "api_key_file")]
    pub api_key_env: Option<String>,
    /// Read the server's API key from the first line of this file (never printed).
    #[arg(long, value_name = "PATH")]
    pub api_key_file: Option<PathBuf>,
}

#[derive(Debug, Args)]
pub struct UploadArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub target: TargetArgs,
    /// The collection (created if absent; an existing one must have the run's vector size).
    #[arg(long, default_value = "papers", value_name = "NAME")]
    pub collection: String,
    /// Points per upsert (default: what `tune` saved, else 256).
    #[arg(long, value_name = "B")]
    pub batch_size: Option<usize>,
    /// Upserts in flight per worker (default: what `tune` saved, else 4).
    #[arg(long, value_name = "K")]
    pub in_flight: Option<usize>,
    /// Worker processes, each with its own client (server only; default: one per peer holding
    /// the collection's shards, or one per core on a single server). The embedded engine is one
    /// process: its upload uses K threads.
    #[arg(long, value_name = "N")]
    pub workers: Option<u64>,
    /// Make the sent points durable and record them in run.db every N batches.
    #[arg(long, default_value_t = 32, value_name = "N")]
    pub checkpoint_every: usize,
    /// HNSW edges per node, restored after the load.
    #[arg(long, default_value_t = 16, value_name = "M")]
    pub hnsw_m: u64,
    /// HNSW build candidates, restored after the load.
    #[arg(long, default_value_t = 100, value_name = "N")]
    pub hnsw_ef_construct: u64,
    /// Keep the vectors on disk (mmap) instead of RAM.
    #[arg(long)]
    pub on_disk_vectors: bool,
    /// Add int8 scalar quantization.
    #[arg(long)]
    pub int8: bool,
    /// Shards of a new collection (server).
    #[arg(long, value_name = "N")]
    pub shard_number: Option<u32>,
    /// Copies of each shard of a new collection (server).
    #[arg(long, value_name = "N")]
    pub replication_factor: Option<u32>,
    /// Build the HNSW index while loading instead of once at the end.
    #[arg(long)]
    pub no_bulk_load: bool,
    /// Internal: this process is worker I of N of a multi-process upload.
    #[arg(long, value_name = "I/N", hide = true)]
    pub worker: Option<String>,
}

#[derive(Debug, Args)]
pub struct TuneArgs {
    /// The run directory (its shards are the sample; the result is saved in its run.db).
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    #[command(flatten)]
    pub target: TargetArgs,
    /// Points in the sample (capped at what the shards have).
    #[arg(long, default_value_t = 20_000, value_name = "N")]
    pub sample: usize,
    /// The scratch collection, dropped afterwards.
    #[arg(long, default_value = "embedfleet-tune-scratch", value_name = "NAME")]
    pub scratch: String,
    /// Largest batch size tried (powers of two from 1).
    #[arg(long, default_value_t = 512, value_name = "B")]
    pub max_batch: usize,
    /// Where the table and the plot go (default: <run-dir>/tune).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
}

/// The sink of `target`, and its kind (`edge` or `server`) for the tuned settings.
fn open_sink(run_dir: &Path, target: &TargetArgs) -> Result<(Box<dyn Sink>, &'static str)> {
    if let Some(url) = &target.qdrant {
        let api_key = match (&target.api_key_env, &target.api_key_file) {
            (Some(var), _) => ApiKey::Env(var.clone()),
            (None, Some(path)) => ApiKey::File(path.clone()),
            (None, None) => ApiKey::None,
        };
        let config = ServerConfig {
            api_key,
            ..ServerConfig::new(url.clone())
        };
        return Ok((Box::new(QdrantServer::connect(config)?), "server"));
    }
    let dir = target
        .edge
        .clone()
        .unwrap_or_else(|| run_dir.join("qdrant"));
    Ok((Box::new(QdrantEdge::open(dir)?), "edge"))
}

fn parse_share(s: &str) -> Result<(u64, u64)> {
    let parsed = s
        .split_once('/')
        .and_then(|(i, n)| Some((i.parse().ok()?, n.parse().ok()?)));
    match parsed {
        Some((i, n)) if i < n => Ok((i, n)),
        _ => bail!("--worker takes I/N with I < N, e.g. 0/4 (got `{s}`)"),
    }
}

fn upload_options(args: &UploadArgs, tuned: Option<&TunedUpload>) -> UploadOptions {
    let mut options = UploadOptions::new(&args.run_dir, &args.collection);
    let spec = &mut options.spec;
    spec.hnsw.m = args.hnsw_m;
    spec.hnsw.ef_construct = args.hnsw_ef_construct;
    spec.on_disk_vectors = args.on_disk_vectors;
    spec.int8_quantization = args.int8;
    spec.shard_number = args.shard_number;
    spec.replication_factor = args.replication_factor;
    spec.bulk_load = !args.no_bulk_load;
    options.batch_size = args
        .batch_size
        .or(tuned.map(|t| t.batch_size))
        .unwrap_or(256)
        .max(1);
    options.in_flight = args
        .in_flight
        .or(tuned.map(|t| t.in_flight))
        .unwrap_or(4)
        .max(1);
    options.checkpoint_every = args.checkpoint_every.max(1);
    options.progress = args.worker.is_none() && std::io::stderr().is_terminal();
    options
}

pub fn upload_cmd(args: &UploadArgs) -> Result<i32> {
    let db = RunDb::open(&args.run_dir)?;
    let (sink, kind) = open_sink(&args.run_dir, &args.target)?;
    let tuned: Option<TunedUpload> = db.setting(TUNED_SETTING)?;
    let tuned = tuned.filter(|t| t.sink == kind);
    let mut options = upload_options(args, tuned.as_ref());
    if let Some(share) = &args.worker {
        options.share = Some(parse_share(share)?);
        exit_when_orphaned();
        let prepared = upload::prepare(&db, &args.collection)?;
        let report = upload::send(sink.as_ref(), &db, &prepared, &options)?;
        return Ok(if report.failed_points > 0 {
            exit::PARTIAL
        } else {
            exit::SUCCESS
        });
    }
    // A server gets worker processes (by default one per peer holding the collection, else one
    // per core, decided once the collection exists); the embedded engine is one process.
    let server = kind == "server";
    if !server && args.workers.is_some_and(|n| n > 1) {
        eprintln!("note: the embedded engine is one process; --workers is ignored, --in-flight sets its threads");
    }
    eprintln!(
        "upload into `{}` ({kind}): batches of {}, {} in flight{}{}",
        args.collection,
        options.batch_size,
        options.in_flight,
        match (server, args.workers) {
            (false, _) | (true, Some(1)) => String::new(),
            (true, Some(n)) => format!(", {n} worker processes"),
            (true, None) => ", a worker process per peer (one peer: per core)".into(),
        },
        if tuned.is_some() && (args.batch_size.is_none() || args.in_flight.is_none()) {
            " (tuned)"
        } else {
            ""
        }
    );
    let report = if server {
        let command = WorkerCommand {
            exe: std::env::current_exe().context("failed to find the embedfleet binary")?,
            args: worker_args(args, &options),
            workers: args.workers,
            partial_code: exit::PARTIAL,
        };
        upload::upload_with_workers(sink.as_ref(), &options, &command)?
    } else {
        upload::upload(sink.as_ref(), &options)?
    };
    print_report(&args.collection, &report);
    Ok(if report.send.failed_points > 0 {
        exit::PARTIAL
    } else {
        exit::SUCCESS
    })
}

/// A worker process ends when its parent `embedfleet upload` is gone (killed, say), so that
/// running the upload again never finds stray workers still sending. Ending mid-batch is safe:
/// only checkpointed rows are recorded, and a re-sent batch overwrites the same point ids.
fn exit_when_orphaned() {
    let parent = std::os::unix::process::parent_id();
    std::thread::spawn(move || loop {
        std::thread::sleep(std::time::Duration::from_millis(200));
        if std::os::unix::process::parent_id() != parent {
            eprintln!("upload worker: the parent `embedfleet upload` is gone; stopping");
            std::process::exit(exit::FAILURE);
        }
    });
}

/// The command line of a worker process: the parent's, with the resolved batch settings.
fn worker_args(args: &UploadArgs, options: &UploadOptions) -> Vec<String> {
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
    out
}

fn print_report(collection: &str, report: &UploadReport) {
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

pub fn tune_cmd(args: &TuneArgs) -> Result<i32> {
    let db = RunDb::open(&args.run_dir)?;
    let (sink, kind) = open_sink(&args.run_dir, &args.target)?;
    let mut options = TuneOptions::new(&args.scratch);
    options.sample = args.sample.max(1);
    options.batch_sizes.retain(|&b| b <= args.max_batch.max(1));
    let report = tune::tune(sink.as_ref(), &db, &options)?;
    print!("{}", tune::markdown(&report));
    let out = args
        .out
        .clone()
        .unwrap_or_else(|| args.run_dir.join("tune"));
    let files = tune::write_outputs(&report, &out)?;
    let saved = TunedUpload {
        sink: kind.into(),
        batch_size: report.batch_size,
        in_flight: report.in_flight,
        points_per_s: report.points_per_s,
        sample_points: report.trials.first().map_or(0, |t| t.points),
    };
    db.set_setting(TUNED_SETTING, &saved)?;
    eprintln!(
        "chosen: batches of {}, {} in flight ({:.0} points/s into the {kind} sink); saved in run.db, `embedfleet upload` uses it",
        report.batch_size, report.in_flight, report.points_per_s
    );
    for f in files {
        eprintln!("wrote {}", f.display());
    }
    Ok(exit::SUCCESS)
}

/// The end of `embedfleet run`: the run's shards into the embedded engine (`<run-dir>/qdrant`,
/// collection `papers`), then `query` embedded with the model and its top 5 papers printed.
/// Points that failed are reported; `embedfleet status` shows them as missing.
pub fn upload_and_query(
    run_dir: &Path,
    model_dir: &Path,
    dim: Option<usize>,
    query_text: &str,
) -> Result<()> {
    const COLLECTION: &str = "papers";
    let sink = QdrantEdge::open(run_dir.join("qdrant"))?;
    let mut options = UploadOptions::new(run_dir, COLLECTION);
    options.progress = std::io::stderr().is_terminal();
    let report = upload::upload(&sink, &options)?;
    print_report(COLLECTION, &report);
    if report.ensured.is_none() {
        return Ok(());
    }
    let vector = query::embed_query(
        model_dir,
        dim,
        embedfleet_jobs::embed_files::DEFAULT_INSTRUCTION,
        query_text,
    )?;
    let db = RunDb::open(run_dir)?;
    let hits = query::search_with_text(&sink, &db, COLLECTION, &vector, 5, 12)?;
    println!("top {} papers for \"{query_text}\":", hits.len());
    for (rank, h) in hits.iter().enumerate() {
        println!(
            "{:>2}. {:.4}  {}  {}",
            rank + 1,
            h.hit.score,
            h.hit.paper_id.as_deref().unwrap_or("?"),
            h.first_words.as_deref().unwrap_or("")
        );
    }
    Ok(())
}
