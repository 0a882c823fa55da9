//! One function per subcommand: convert the typed flags into library options, call the
//! library, print the outcome.

use crate::cli::{Batching, Cli, Command, PlanSettingsArgs, SampleCorpusArgs, StatusArgs};
use anyhow::{Context, Result};
use embedfleet_core::exit;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::settings::{MiniBatchRule, PlanSettings};
use embedfleet_orchestrator::plan::{self, PlanError, PlanOptions, PlanReport};
use embedfleet_orchestrator::sample::{self, SampleOptions};
use std::io::IsTerminal;
use std::path::PathBuf;

pub fn run(cli: Cli) -> Result<i32> {
    match cli.command {
        Command::Plan(args) => {
            let report = plan_run(args.corpus.corpus, args.corpus.run_dir.clone(), &args.plan)?;
            Ok(report_code(&report))
        }
        Command::Run(args) => {
            let report = plan_run(args.corpus.corpus, args.corpus.run_dir.clone(), &args.plan)?;
            print!("{}", embedfleet_orchestrator::status::render(&RunDb::open(&args.corpus.run_dir)?.status()?));
            Ok(report_code(&report))
        }
        Command::Status(args) => status(&args),
        Command::SampleCorpus(args) => sample_corpus(&args),
    }
}

/// The exit code of an error (README, "Exit codes").
pub fn exit_code(err: &anyhow::Error) -> i32 {
    match err.downcast_ref::<PlanError>() {
        Some(e) if e.is_refusal() => exit::REFUSED,
        _ => exit::FAILURE,
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
        Batching::Tokens => MiniBatchRule::TokenBudget { max_tokens: args.batch_tokens },
        Batching::Chars => MiniBatchRule::Chars { max_chars: args.batch_chars, max_papers: args.batch_max },
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
    let threads = args.threads.unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let options = PlanOptions { corpus, run_dir, settings: plan_settings(args), threads, progress: std::io::stderr().is_terminal() };
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
        println!("{}", serde_json::to_string_pretty(&status).context("failed to serialise the status")?);
    } else {
        print!("{}", embedfleet_orchestrator::status::render(&status));
    }
    Ok(exit::SUCCESS)
}

fn sample_corpus(args: &SampleCorpusArgs) -> Result<i32> {
    let options = SampleOptions { papers: args.papers, seed: args.seed, mean_chars: args.mean_chars, files: args.files };
    let files = sample::write(&args.out, &options).with_context(|| format!("failed to write {}", args.out.display()))?;
    eprintln!("wrote {} papers to {} file(s) under {}", args.papers, files.len(), args.out.display());
    Ok(exit::SUCCESS)
}
