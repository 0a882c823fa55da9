//! Each subcommand mapped onto the pipeline: its flags as given (`flags`), the run directories
//! it names (for the checks before and the record after, [`commands::invoke`]), and the one
//! pipeline function that does it. No decision is made here.

pub(crate) mod flags;

use crate::cli::{Cli, Command, QueuesCommand};
use embedfleet_pipeline::commands::{self, CommandError, Ended, RunDbSlot, RunDirs};
use std::path::{Path, PathBuf};

pub fn run(cli: Cli) -> Result<i32, CommandError> {
    let dirs = run_dirs(&cli.command);
    commands::invoke(&dirs, |db| dispatch(&cli.command, db))
}

/// Calls the command's pipeline function; `db` is where the command opens run.db, once.
fn dispatch(command: &Command, db: &mut RunDbSlot) -> anyhow::Result<Ended> {
    use flags::*;
    let code = match command {
        Command::Plan(a) => return commands::plan(&plan_flags(a), db),
        Command::Submit(a) => return commands::submit(&submit_flags(a)?, db),
        Command::Query(a) => return commands::query(&query_flags(a), db),
        Command::Run(a) => commands::run_all(&run_flags(a)),
        Command::Status(a) => commands::status(&status_flags(a)),
        Command::TakeOver(a) => commands::take_over(&take_over_flags(a)),
        Command::Pause(a) => commands::pause(&run_dir_flags(a), true),
        Command::Resume(a) => commands::pause(&run_dir_flags(a), false),
        Command::Queues(a) => commands::queues(&queues_flags(a)),
        Command::Report(a) => commands::report(&report_flags(a), db),
        Command::SampleCorpus(a) => commands::sample_corpus(&sample_corpus_flags(a)),
        Command::EmbedJob(a) => commands::embed_job(&embed_job_flags(a)),
        Command::Embed(a) => commands::embed(&embed_flags(a)),
        Command::MakeTinyModel(a) => commands::make_tiny_model(&make_tiny_model_flags(a)),
        Command::Doctor(a) => commands::doctor(&doctor_flags(a)),
        Command::BenchGpu(a) => commands::bench_gpu(&bench_gpu_flags(a)),
        Command::Upload(a) => commands::upload(&upload_flags(a), db),
        Command::BuildShard(a) => commands::build_shard(&build_shard_flags(a)),
        Command::Delete(a) => commands::delete(&delete_flags(a), db),
        Command::Tune(a) => commands::tune(&tune_flags(a), db),
        Command::QueryJob(a) => commands::query_job(&query_job_flags(a)),
        Command::Eval(a) => commands::eval(&eval_flags(a), db),
        Command::Publish(a) => commands::publish(&publish_flags(a), db),
    };
    code.map(Ended::from)
}

/// The run directories `command` names: see [`RunDirs`] for what each is checked for.
fn run_dirs(command: &Command) -> RunDirs {
    let owned = owned_run_dir(command).map(Path::to_path_buf);
    let named = match command {
        Command::Status(a) => Some(a.run_dir.clone()),
        Command::TakeOver(a) => Some(a.run_dir.clone()),
        _ => owned.clone(),
    };
    RunDirs {
        named,
        owned,
        recorded: recorded_run_dir(command),
    }
}

fn recorded_run_dir(command: &Command) -> Option<PathBuf> {
    match command {
        Command::Plan(a) => Some(a.run_dir.clone()),
        Command::Submit(a) if !a.dry_run => Some(a.run_dir.clone()),
        Command::Upload(a) if a.worker.is_none() => Some(a.run_dir.clone()),
        Command::Tune(a) => Some(a.run_dir.clone()),
        Command::Delete(a) => Some(a.run_dir.clone()),
        Command::Query(a) => Some(a.run_dir.clone()),
        Command::Eval(a) => Some(a.run_dir.clone()),
        _ => None,
    }
}

fn owned_run_dir(command: &Command) -> Option<&Path> {
    match command {
        Command::Plan(a) => Some(&a.run_dir),
        Command::Run(a) => Some(&a.corpus.run_dir),
        Command::Submit(a) => Some(&a.run_dir),
        Command::Pause(a) | Command::Resume(a) => Some(&a.run_dir),
        Command::Queues(a) => match &a.command {
            Some(QueuesCommand::Show(r)) => Some(&r.run_dir),
            Some(QueuesCommand::Set { run_dir, .. })
            | Some(QueuesCommand::Remove { run_dir, .. }) => Some(run_dir),
            None => a.run_dir.as_deref(),
        },
        Command::Report(a) => Some(&a.run_dir),
        Command::Upload(a) => Some(&a.run_dir),
        Command::Delete(a) => Some(&a.run_dir),
        Command::Tune(a) => Some(&a.run_dir),
        Command::Query(a) => Some(&a.run_dir),
        Command::Eval(a) => Some(&a.run_dir),
        Command::Publish(a) => Some(&a.run_dir),
        _ => None,
    }
}
