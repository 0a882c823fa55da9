//! `plan`'s settings (and `run`'s plan): the flags as typed become the run's plan settings
//! (what `core` stores and the jobs read) and the plan's options: a first plan, the same again
//! (which resumes or does nothing), or an update.

use crate::flags::{Batching, PlanFlags, PlanSettingsFlags};
use embedfleet_core::settings::{MiniBatchRule, PlanSettings};
use embedfleet_orchestrator::plan::{PlanOptions, UpdateOptions};
use std::io::IsTerminal;
use std::path::PathBuf;

/// `plan`'s options: an update (`--update FILE...`, recorded with `command_line`, secrets
/// redacted) or a plan of `--corpus`.
pub fn plan_command_options(flags: &PlanFlags, command_line: &str) -> PlanOptions {
    let update = (!flags.update.is_empty()).then(|| UpdateOptions {
        only_adds: flags.only_adds,
        command: embedfleet_core::secret::redact(command_line),
    });
    let corpus = if update.is_some() {
        flags.update.clone()
    } else {
        flags.corpus.clone()
    };
    plan_options(corpus, flags.run_dir.clone(), &flags.plan, update)
}

pub fn plan_settings(args: &PlanSettingsFlags) -> PlanSettings {
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

/// `plan`'s options (and `run`'s): a first plan, or the same again (which resumes or does
/// nothing), or an update.
pub fn plan_options(
    corpus: Vec<PathBuf>,
    run_dir: PathBuf,
    args: &PlanSettingsFlags,
    update: Option<UpdateOptions>,
) -> PlanOptions {
    let threads = args
        .threads
        .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()));
    let settings = plan_settings(args);
    PlanOptions {
        corpus,
        run_dir,
        // The flags' defaults are the settings layer's (a test in `cli` holds them equal).
        settings_given: settings != PlanSettings::default(),
        settings,
        threads,
        progress: std::io::stderr().is_terminal(),
        update,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flags() -> PlanFlags {
        PlanFlags {
            corpus: vec!["corpus.jsonl.gz".into()],
            update: Vec::new(),
            only_adds: false,
            run_dir: "run".into(),
            plan: PlanSettingsFlags {
                papers_per_job: 0,
                max_job_chars: None,
                sources: Vec::new(),
                keep_fields: Vec::new(),
                batching: Batching::Chars,
                batch_tokens: 0,
                batch_chars: 1000,
                batch_max: 8,
                threads: Some(2),
            },
        }
    }

    #[test]
    fn an_update_plans_its_files_and_records_its_command_without_secrets() {
        let first = plan_command_options(&flags(), "embedfleet plan");
        assert!(first.update.is_none());
        assert_eq!(first.corpus, [PathBuf::from("corpus.jsonl.gz")]);
        assert_eq!(first.settings.papers_per_job, 1, "at least one paper a job");
        assert_eq!(
            first.settings.minibatch,
            MiniBatchRule::Chars {
                max_chars: 1000,
                max_papers: 8
            }
        );
        assert!(first.settings_given);
        let update = PlanFlags {
            update: vec!["new.jsonl.gz".into()],
            only_adds: true,
            ..flags()
        };
        let options = plan_command_options(
            &update,
            "embedfleet plan --update new.jsonl.gz postgresql://u:hunter2@127.0.0.1/db",
        );
        assert_eq!(options.corpus, [PathBuf::from("new.jsonl.gz")]);
        let update = options.update.expect("--update plans an update");
        assert!(update.only_adds);
        assert!(!update.command.contains("hunter2"), "{}", update.command);
    }
}
