//! One function per subcommand: convert the typed flags into library options, call the
//! library, print the outcome. A file per stage, as in `cli/`.

mod embed;
mod plan;
mod report;
mod run;
mod submit;
mod upload;

use crate::cli::{Cli, Command};
use embedfleet_core::exit;
use embedfleet_orchestrator::plan::PlanError;

pub fn run(cli: Cli) -> anyhow::Result<i32> {
    match cli.command {
        Command::Plan(args) => plan::plan(&args),
        Command::Run(args) => run::run_all(&args),
        Command::Status(args) => submit::status(&args),
        Command::Submit(args) => submit::submit(&args),
        Command::Pause(args) => submit::pause(&args, true),
        Command::Resume(args) => submit::pause(&args, false),
        Command::Queues(args) => submit::queues(&args),
        Command::Report(args) => report::report(&args),
        Command::SampleCorpus(args) => plan::sample_corpus(&args),
        Command::EmbedJob(args) => embed::embed_job(&args),
        Command::Embed(args) => embed::embed(&args),
        Command::MakeTinyModel(args) => embed::make_tiny_model(&args),
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
            .downcast_ref::<embedfleet_upload::UploadRunError>()
            .is_some_and(embedfleet_upload::UploadRunError::is_refusal);
    if refused {
        exit::REFUSED
    } else {
        exit::FAILURE
    }
}
