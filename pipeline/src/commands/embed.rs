//! `embed-job`, `embed` and `make-tiny-model`.

use crate::flags::{EmbedFlags, EmbedJobFlags, MakeTinyModelFlags};
use crate::settings::query as query_settings;
use anyhow::Result;
use embedfleet_core::exit;
use embedfleet_core::BatchId;
use embedfleet_embed::files::{self as embed_files, EmbedFilesOptions};
use embedfleet_embed::job::{self, EmbedJobOptions};

pub fn embed_job(args: &EmbedJobFlags) -> Result<i32> {
    let settings = args.settings.clone();
    let options = EmbedJobOptions {
        run_dir: args.run.run_dir.clone(),
        batch: BatchId(args.batch),
        devices: embedfleet_embed::parse_devices(&settings.devices)?,
        model_dir: settings.model_dir,
        output_dim: settings.dim,
        vector_dtype: settings.vector_dtype,
        precision: settings.precision,
        max_tokens: settings.max_tokens,
        shard_papers: settings.shard_papers,
        memory_limit: settings.memory_limit,
        text_rule: settings.text_rule,
    };
    if options
        .devices
        .iter()
        .any(|d| matches!(d, embedfleet_models::DeviceSpec::Cuda(_)))
    {
        if let Some(gpus) = embedfleet_models::supported_gpus() {
            eprintln!("embedfleet {}: built for {gpus}", env!("CARGO_PKG_VERSION"));
        }
    }
    let report = job::run(&options)?;
    if let Some(attempt) = &report.already_done_by {
        eprintln!(
            "batch {}: attempt {attempt} did it first (its shards verified); this attempt stops",
            args.batch
        );
        return Ok(exit::SUCCESS);
    }
    eprintln!("{}", job_summary(args.batch, &report));
    if settings.build_shard {
        // The GPUs are done with this batch; the graph is built on the node's cores, in this
        // job's allocation, so the owner's `upload --mode snapshot` finds it ready. A failed
        // build fails nothing: the upload builds what it does not find.
        if let Err(e) =
            super::snapshot::build_after_embed(&args.run.run_dir, args.batch, &report.attempt)
        {
            eprintln!("batch {}: building its Qdrant shard failed ({e:#}); `upload --mode snapshot` builds it instead", args.batch);
        }
    }
    Ok(if report.papers_failed > 0 {
        exit::PARTIAL
    } else {
        exit::SUCCESS
    })
}

/// The embed job's last line: what it made and where its time went.
fn job_summary(batch: i64, report: &job::JobReport) -> String {
    let t = &report.timings;
    format!(
        "batch {} (attempt {}): {} papers embedded in {} new shards ({} taken over from earlier attempts), {} failed; \
         model load {:.1} s, I/O {:.1} s, tokenize {:.1} s, inference {:.1} s; fallbacks: {} split, {} sequential, \
         {} chunked; {} long papers chunked",
        batch,
        report.attempt,
        report.papers_embedded,
        report.parts_written,
        report.parts_skipped,
        report.papers_failed,
        t.model_load_s,
        t.io_s,
        t.tokenize_s,
        t.inference_s,
        t.fallback_split,
        t.fallback_sequential,
        t.fallback_chunked,
        t.long_chunked
    )
}

pub fn embed(args: &EmbedFlags) -> Result<i32> {
    let instruction = if args.query {
        Some(query_settings::instruction(
            &args.model.model_dir,
            args.instruction.as_deref(),
        )?)
    } else {
        None
    };
    let options = EmbedFilesOptions {
        model_dir: args.model.model_dir.clone(),
        inputs: args.input.clone(),
        output: args.output.clone(),
        devices: embedfleet_embed::parse_devices(&args.devices)?,
        output_dim: args.model.dim,
        vector_dtype: args.model.vector_dtype,
        precision: args.model.precision,
        lines: args.lines,
        query_instruction: instruction,
        max_tokens: args.model.max_tokens,
        batch_tokens: args.batch_tokens,
        text_rule: args.model.text_rule.unwrap_or_default(),
    };
    let report = embed_files::run(&options)?;
    for why in &report.skipped {
        eprintln!("skipped {why}");
    }
    eprintln!(
        "embedded {} texts into {}",
        report.embedded,
        args.output.display()
    );
    Ok(if report.skipped.is_empty() {
        exit::SUCCESS
    } else {
        exit::PARTIAL
    })
}

pub fn make_tiny_model(args: &MakeTinyModelFlags) -> Result<i32> {
    let options = embedfleet_models::TinyModelOptions {
        seed: args.seed,
        hidden_size: args.hidden_size.map(|h| h as usize),
        ..Default::default()
    };
    let (family, files) =
        embedfleet_models::write_tiny_model_of(args.family.as_deref(), &args.out, &options)?;
    eprintln!(
        "wrote a tiny random {} ({} files) to {}",
        family.name(),
        files.len(),
        args.out.display()
    );
    Ok(exit::SUCCESS)
}
