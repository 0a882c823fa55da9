//! One function per subcommand: convert the typed flags into library options, call the
//! library, print the outcome.

mod submit;
pub mod upload;

use crate::cli::{
    Batching, Cli, Command, EmbedArgs, EmbedJobArgs, MakeTinyModelArgs, PlanSettingsArgs, RunArgs,
    SampleCorpusArgs, StatusArgs, VectorDtypeArg,
};
use anyhow::{Context, Result};
use embedfleet_core::exit;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::settings::{MiniBatchRule, PlanSettings};
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_jobs::embed::job::{self, EmbedJobOptions};
use embedfleet_jobs::embed_files::{self, EmbedFilesOptions};
use embedfleet_orchestrator::plan::{self, PlanError, PlanOptions, PlanReport};
use embedfleet_orchestrator::sample::{self, SampleOptions};
use embedfleet_orchestrator::scheduler::SchedulerConfig;
use embedfleet_orchestrator::submit::SubmitOptions;
use std::collections::BTreeMap;
use std::io::IsTerminal;
use std::path::PathBuf;
use std::time::Duration;

mod report;
pub use report::ReportArgs;

pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Plan(args) => {
            let report = plan_run(args.corpus.corpus, args.corpus.run_dir.clone(), &args.plan)?;
            Ok(report_code(&report))
        }
        Command::Run(args) => run_all(&args),
        Command::Status(args) => status(&args),
        Command::Submit(args) => submit::submit(&args),
        Command::Pause(args) => submit::pause(&args, true),
        Command::Resume(args) => submit::pause(&args, false),
        Command::Queues(args) => submit::queues(&args),
        Command::Report(args) => report::report(&args),
        Command::SampleCorpus(args) => sample_corpus(&args),
        Command::EmbedJob(args) => embed_job(&args),
        Command::Embed(args) => embed(&args),
        Command::MakeTinyModel(args) => make_tiny_model(&args),
        Command::Upload(args) => upload::upload_cmd(&args),
        Command::Tune(args) => upload::tune_cmd(&args),
    }
}

/// The exit code of an error (README, "Exit codes").
pub fn exit_code(err: &anyhow::Error) -> i32 {
    let refused = err
        .downcast_ref::<PlanError>()
        .is_some_and(PlanError::is_refusal)
        || err
            .downcast_ref::<embedfleet_jobs::upload::UploadRunError>()
            .is_some_and(embedfleet_jobs::upload::UploadRunError::is_refusal);
    if refused {
        exit::REFUSED
    } else {
        exit::FAILURE
    }
}

fn report_code(report: &PlanReport) -> i32 {
    if report.corrupt.is_empty() {
        exit::SUCCESS
    } else {
        exit::PARTIAL
    }
}

fn plan_settings(args: &PlanSettingsArgs) -> PlanSettings {
    let minibatch = match args.batching {
        Batching::Tokens => MiniBatchRule::TokenBudget {
            max_tokens: args.batch_tokens,
        },
        Batching::Chars => MiniBatchRule::Chars {
            max_chars: args.batch_chars,
            max_papers: args.batch_max,
        },
    };
    PlanSettings {
        papers_per_job: args.papers_per_job.max(1),
        max_job_chars: args.max_job_chars,
        sources: args.sources.clone(),
        keep_fields: args.keep_fields.clone(),
        minibatch,
    }
}

fn plan_run(corpus: Vec<PathBuf>, run_dir: PathBuf, args: &PlanSettingsArgs) -> Result<PlanReport> {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let options = PlanOptions {
        corpus,
        run_dir,
        settings: plan_settings(args),
        threads,
        progress: std::io::stderr().is_terminal(),
    };
    let report = plan::plan(&options)?;
    if report.already_planned {
        eprintln!(
            "already planned: {} papers in {} batches ({} quarantined); nothing to do",
            report.papers, report.batches, report.quarantined
        );
    } else {
        let secs = report.elapsed.as_secs_f64().max(1e-9);
        eprintln!(
            "planned {} papers into {} batches from {} files in {:.1} s ({:.0} papers/s); {} quarantined ({} duplicates), see {}",
            report.papers,
            report.batches,
            report.files,
            secs,
            report.papers as f64 / secs,
            report.quarantined,
            report.duplicates,
            options.run_dir.join(plan::QUARANTINE_FILE).display()
        );
    }
    for (file, why) in &report.corrupt {
        eprintln!("warning: {file} is corrupt: {why}; the records before it were planned");
    }
    Ok(report)
}

fn status(args: &StatusArgs) -> Result<i32> {
    let status = RunDb::open(&args.run_dir)?.status()?;
    if args.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&status).context("failed to serialise the status")?
        );
    } else {
        print!("{}", embedfleet_orchestrator::status::render(&status));
    }
    Ok(exit::SUCCESS)
}

fn sample_corpus(args: &SampleCorpusArgs) -> Result<i32> {
    let options = SampleOptions {
        papers: args.papers,
        seed: args.seed,
        mean_chars: args.mean_chars,
        files: args.files,
    };
    let files = sample::write(&args.out, &options)
        .with_context(|| format!("failed to write {}", args.out.display()))?;
    eprintln!(
        "wrote {} papers to {} file(s) under {}",
        args.papers,
        files.len(),
        args.out.display()
    );
    Ok(exit::SUCCESS)
}

fn vector_dtype(arg: VectorDtypeArg) -> VectorDtype {
    match arg {
        VectorDtypeArg::F32 => VectorDtype::F32,
        VectorDtypeArg::F16 => VectorDtype::F16,
    }
}

fn embed_job(args: &EmbedJobArgs) -> Result<i32> {
    let options = EmbedJobOptions {
        run_dir: args.run_dir.clone(),
        batch: args.batch,
        model_dir: args.model.model_dir.clone(),
        devices: embedfleet_jobs::embed::parse_devices(&args.devices)?,
        output_dim: args.model.dim,
        vector_dtype: vector_dtype(args.model.vector_dtype),
        max_tokens: args.model.max_tokens,
        shard_papers: args.shard_papers,
        memory_limit: args.memory_limit,
    };
    let report = job::run(&options)?;
    let t = &report.timings;
    eprintln!(
        "batch {}: {} papers embedded in {} new shards ({} already done), {} failed; model load {:.1} s, I/O {:.1} s, \
         tokenize {:.1} s, inference {:.1} s; fallbacks: {} split, {} sequential, {} chunked; {} long papers chunked",
        args.batch,
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
    );
    Ok(if report.papers_failed > 0 {
        exit::PARTIAL
    } else {
        exit::SUCCESS
    })
}

fn embed(args: &EmbedArgs) -> Result<i32> {
    let instruction = args.query.then(|| {
        args.instruction
            .clone()
            .unwrap_or_else(|| embed_files::DEFAULT_INSTRUCTION.into())
    });
    let options = EmbedFilesOptions {
        model_dir: args.model.model_dir.clone(),
        inputs: args.input.clone(),
        output: args.output.clone(),
        devices: embedfleet_jobs::embed::parse_devices(&args.device)?,
        output_dim: args.model.dim,
        vector_dtype: vector_dtype(args.model.vector_dtype),
        lines: args.lines,
        query_instruction: instruction,
        max_tokens: args.model.max_tokens,
        batch_tokens: args.batch_tokens,
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

fn make_tiny_model(args: &MakeTinyModelArgs) -> Result<i32> {
    let files = embedfleet_models::write_tiny_model(&args.out, args.seed)?;
    eprintln!(
        "wrote a tiny random Qwen3 ({} files) to {}",
        files.len(),
        args.out.display()
    );
    Ok(exit::SUCCESS)
}

fn run_all(args: &RunArgs) -> Result<i32> {
    let run_dir = &args.corpus.run_dir;
    let plan_report = plan_run(args.corpus.corpus.clone(), run_dir.clone(), &args.plan)?;
    let model_dir = match &args.model_dir {
        Some(dir) => dir.clone(),
        None => {
            let dir = run_dir.join("tiny-model");
            if !dir.join("model.safetensors").is_file() {
                embedfleet_models::write_tiny_model(&dir, 0)?;
                eprintln!(
                    "no --model-dir: using a tiny random Qwen3 written to {}",
                    dir.display()
                );
            }
            dir
        }
    };
    let mut job_args = vec![
        "--model-dir".to_string(),
        // Absolute: jobs start in the run directory.
        std::path::absolute(&model_dir)?.display().to_string(),
        "--devices".into(),
        args.devices.clone(),
        "--shard-papers".into(),
        args.shard_papers.to_string(),
    ];
    if let Some(dim) = args.dim {
        job_args.extend(["--dim".to_string(), dim.to_string()]);
    }
    let options = SubmitOptions {
        run_dir: run_dir.clone(),
        scheduler: SchedulerConfig::default(),
        queues: Some(BTreeMap::from([(
            "local".to_string(),
            args.local_jobs.max(1) as u32,
        )])),
        max_attempts: 2,
        poll_interval: Duration::from_millis(500),
        lost_after: Duration::from_secs(10),
        watch: false,
        embed_args: job_args,
        exe: std::env::current_exe().context("failed to find the embedfleet binary")?,
        progress: std::io::stderr().is_terminal(),
    };
    let report = embedfleet_orchestrator::submit::submit(&options)?;
    upload::upload_and_query(run_dir, &model_dir, args.dim, &args.query)?;
    let code = submit::summarise(&options, &report)?;
    if code != exit::SUCCESS {
        return Ok(code);
    }
    Ok(report_code(&plan_report))
}
