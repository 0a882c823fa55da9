//! One function per subcommand: convert the typed flags into library options, call the
//! library, print the outcome. A file per stage, as in `cli/`.

mod bench;
mod compare;
mod doctor;
mod embed;
pub(crate) mod plan;
mod query;
mod query_job;
mod report;
mod run;
mod snapshot;
mod submit;
mod target;
mod upload;

use crate::cli::{Cli, Command};
use embedfleet_core::exit;
use embedfleet_orchestrator::plan::PlanError;

pub fn run(cli: Cli) -> anyhow::Result<i32> {
    let named_run_dir = match &cli.command {
        Command::Status(a) => Some(a.run_dir.as_path()),
        Command::TakeOver(a) => Some(a.run_dir.as_path()),
        other => owned_run_dir(other),
    };
    if let Some(why) = named_run_dir.and_then(not_a_run_dir) {
        // The command line was wrong (exit code 2), as clap says of a bad flag.
        eprintln!("error: {why}");
        return Ok(exit::USAGE);
    }
    if let Some(dir) = owned_run_dir(&cli.command) {
        // Before anything opens run.db: on a host that does not own the run, refuse with where
        // the owner is (exit 4), whatever the command would have done first.
        embedfleet_core::owner::check_read_only(dir)?;
    }
    let run_dir = recorded_run_dir(&cli.command);
    let code = dispatch(cli)?;
    // A command that found its work done made nothing: the card's "How it was made" lists
    // what made the data, not what was typed again.
    let run_dir = run_dir.filter(|_| !WROTE_NOTHING.load(std::sync::atomic::Ordering::Relaxed));
    if let Some(dir) = run_dir {
        if let Err(e) = record_command(&dir) {
            tracing::warn!("could not record the command line in run.db: {e}");
        }
    }
    Ok(code)
}

/// Set by a command that found nothing to do ([`wrote_nothing`]).
static WROTE_NOTHING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Says that this command changed nothing of the run's outputs: it is not added to the run's
/// history (the dataset card's "How it was made").
pub(crate) fn wrote_nothing() {
    WROTE_NOTHING.store(true, std::sync::atomic::Ordering::Relaxed);
}

/// The run directory of a command worth remembering: those that make or change the run's
/// outputs (not `status`, not an upload's worker processes).
fn recorded_run_dir(command: &Command) -> Option<std::path::PathBuf> {
    match command {
        Command::Plan(a) => Some(a.run_dir.clone()),
        // `run` records its line with the run.db handle it holds (`RunOutcome::record_command`).
        Command::Submit(a) if !a.dry_run => Some(a.run_dir.clone()),
        Command::Upload(a) if a.worker.is_none() => Some(a.run_dir.clone()),
        Command::Tune(a) => Some(a.run_dir.clone()),
        Command::Delete(a) => Some(a.run_dir.clone()),
        Command::Query(a) => Some(a.run_dir.clone()),
        Command::Eval(a) => Some(a.run_dir.clone()),
        _ => None,
    }
}

/// The run directory of a command that opens run.db, and so must run on the run's owner host.
/// Not `status` (it reads the owner's snapshot elsewhere), `take-over`, nor what runs on
/// compute nodes (`embed-job`, `build-shard`, `doctor`), which never open run.db.
fn owned_run_dir(command: &Command) -> Option<&std::path::Path> {
    match command {
        Command::Plan(a) => Some(&a.run_dir),
        Command::Run(a) => Some(&a.corpus.run_dir),
        Command::Submit(a) => Some(&a.run_dir),
        Command::Pause(a) | Command::Resume(a) => Some(&a.run_dir),
        Command::Queues(a) => match &a.command {
            Some(crate::cli::QueuesCommand::Show(r)) => Some(&r.run_dir),
            Some(crate::cli::QueuesCommand::Set { run_dir, .. })
            | Some(crate::cli::QueuesCommand::Remove { run_dir, .. }) => Some(run_dir),
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

/// Why `dir` cannot be a `--run-dir`: it names something other than a directory (a file, say:
/// the corpus given by mistake). Said as such, before anything opens files inside it.
fn not_a_run_dir(dir: &std::path::Path) -> Option<String> {
    let meta = std::fs::metadata(dir).ok()?;
    (!meta.is_dir()).then(|| {
        format!(
            "--run-dir {} is a file, not a run directory: give the directory `embedfleet plan` made (a new path makes a new run)",
            dir.display()
        )
    })
}

/// Appends this process's command line to the run's history (once per distinct line in a row).
fn record_command(run_dir: &std::path::Path) -> anyhow::Result<()> {
    let db = embedfleet_core::rundb::RunDb::open(run_dir)?;
    embedfleet_pipeline::records::record_command(&db, &command_line())?;
    Ok(())
}

/// This process's command line as the run's history keeps it: the program as users type it,
/// not the path this binary happens to have here.
pub(crate) fn command_line() -> String {
    std::iter::once("embedfleet".to_string())
        .chain(std::env::args().skip(1))
        .map(|a| {
            embedfleet_orchestrator::scheduler::shell_quote(&embedfleet_core::secret::redact(&a))
        })
        .collect::<Vec<_>>()
        .join(" ")
}

fn dispatch(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Plan(args) => plan::plan(&args),
        Command::Run(args) => run::run_all(&args),
        Command::Status(args) => submit::status(&args),
        Command::TakeOver(args) => submit::take_over(&args),
        Command::Submit(args) => submit::submit(&args),
        Command::Pause(args) => submit::pause(&args, true),
        Command::Resume(args) => submit::pause(&args, false),
        Command::Queues(args) => submit::queues(&args),
        Command::Report(args) => report::report(&args),
        Command::SampleCorpus(args) => plan::sample_corpus(&args),
        Command::EmbedJob(args) => embed::embed_job(&args),
        Command::Embed(args) => embed::embed(&args),
        Command::MakeTinyModel(args) => embed::make_tiny_model(&args),
        Command::Doctor(args) => doctor::doctor(&args),
        Command::BenchGpu(args) => bench::bench_gpu(&args),
        Command::Upload(args) => upload::upload_cmd(&args),
        Command::BuildShard(args) => snapshot::build_shard_cmd(&args),
        Command::Delete(args) => upload::delete_cmd(&args),
        Command::Tune(args) if args.queries => query::tune_queries(&args),
        Command::Tune(args) => upload::tune_cmd(&args),
        Command::Query(args) => query::query(&args),
        Command::QueryJob(args) => query_job::query_job(&args),
        Command::Eval(args) => query::eval(&args),
        Command::Publish(args) => query::publish(&args),
    }
}

/// The exit code of an error (docs/commands.md, "Exit codes"): [`exit::REFUSED`] when any
/// error of its chain is a refusal, else [`exit::FAILURE`].
pub fn exit_code(err: &anyhow::Error) -> i32 {
    use embedfleet_orchestrator::submit::SubmitError;
    use embedfleet_pipeline::PipelineError;
    let interrupted = err.chain().find_map(|e| {
        if let Some(SubmitError::Interrupted { code, .. }) = e.downcast_ref() {
            return Some(*code);
        }
        e.downcast_ref::<PipelineError>()
            .and_then(PipelineError::interrupted_code)
    });
    if let Some(code) = interrupted {
        code
    } else if err.chain().any(is_refusal) {
        exit::REFUSED
    } else if err.chain().any(is_unusable_input) {
        exit::PARTIAL
    } else {
        exit::FAILURE
    }
}

/// Whether `e` says some input could not be used (exit code 3, as a corrupt corpus file is).
fn is_unusable_input(e: &(dyn std::error::Error + 'static)) -> bool {
    e.downcast_ref::<PlanError>()
        .is_some_and(|e| matches!(e, PlanError::Unusable { .. }))
        || e.downcast_ref::<embedfleet_pipeline::PipelineError>()
            .is_some_and(embedfleet_pipeline::PipelineError::is_unusable_input)
}

/// Whether `e` is a refusal: an error type of the libraries, and its own word on which of its
/// cases refuse (a run directory that holds another plan, settings that differ, another host's
/// run, ...). A library error type that can refuse gets one line here.
fn is_refusal(e: &(dyn std::error::Error + 'static)) -> bool {
    use embedfleet_core::owner::OwnerError;
    use embedfleet_orchestrator::submit::SubmitError;
    macro_rules! refusals {
        ($($ty:ty => $check:expr),* $(,)?) => {
            false $(|| e.downcast_ref::<$ty>().is_some_and($check))*
        };
    }
    refusals!(
        embedfleet_pipeline::preflight::Refused => |_| true,
        embedfleet_pipeline::PipelineError => embedfleet_pipeline::PipelineError::is_refusal,
        OwnerError => |e| matches!(e, OwnerError::OtherHost { .. } | OwnerError::OwnerAlive { .. }),
        SubmitError => embedfleet_pipeline::error::submit_refuses,
        embedfleet_orchestrator::stored_config::StoredConfigError => |e| e.is_refusal(),
        PlanError => PlanError::is_refusal,
        embedfleet_upload::UploadRunError => embedfleet_upload::UploadRunError::is_refusal,
        embedfleet_snapshot::SnapshotError => embedfleet_snapshot::SnapshotError::is_refusal,
        embedfleet_embed::job::EmbedJobError => embedfleet_embed::job::EmbedJobError::is_refusal,
        embedfleet_query::QueryError => embedfleet_query::QueryError::is_refusal,
        embedfleet_publish::PublishError => embedfleet_publish::PublishError::is_refusal,
    )
}
