//! How the help is laid out. The top-level `--help` lists the commands in groups, in the order
//! a user meets them (clap lists subcommands in one flat list), names the internal ones in a
//! line, and ends with examples, as cargo's and ripgrep's do. Every command's options sit under
//! the headings below, so a long help (`submit`) reads by section; the flags every command
//! takes come last, under [`GLOBAL`].

use clap::builder::StyledStr;
use clap::Command;
use std::fmt::Write;

/// `-v`, `-h`, `-V`: last in every command's help, after the command's own options.
pub const GLOBAL: &str = "Global options";
/// Where the collection is: a server (and its key) or the embedded engine, and its name.
pub const QDRANT: &str = "Qdrant";
/// A PostgreSQL database with pgvector instead of Qdrant, and what is built there.
pub const POSTGRES: &str = "PostgreSQL (pgvector)";
/// `eval --compare-postgres`: two databases side by side.
pub const COMPARE: &str = "Side by side";
/// The model and what it writes (dimension, dtype, devices, shards).
pub const MODEL: &str = "Model";
/// How the corpus is cut into jobs and mini-batches.
pub const PLANNING: &str = "Planning";
/// What a new collection or a built shard is made with.
pub const COLLECTION: &str = "Collection settings";
/// Batch sizes, requests in flight, workers.
pub const SPEED: &str = "Throughput";
/// `submit --dry-run` and `--trial`: what to do before a run's first real jobs.
pub const TRY_FIRST: &str = "Before the first jobs";
/// How the submit loop polls, retries and pauses.
pub const LOOP: &str = "Submit loop";
/// Which queue a batch goes to.
pub const ROUTING: &str = "Routing";
/// Running jobs that stopped writing shards.
pub const STALLS: &str = "Stalled jobs";
/// Qdrant shards built offline (`upload --mode snapshot`).
pub const SHARD_BUILDS: &str = "Shard builds";
/// `upload --mode snapshot` and what only it uses.
pub const SNAPSHOT: &str = "Snapshot mode";
/// `query --submit`: the query job on a node.
pub const QUERY_JOB: &str = "Query job";
/// Files a command writes besides its main output.
pub const FILES: &str = "Files";
/// `bench-gpu`'s three measurements.
pub const BENCH_UNIFORM: &str = "Uniform shapes";
pub const BENCH_MIX: &str = "Paper mix";
pub const BENCH_FIDELITY: &str = "Fidelity";

/// The help of a `--model-dir` that takes a model (`more` follows it): the model families this
/// build implements, each with a checkpoint of it, so a new family shows in every help.
pub fn model_dir(more: &str) -> String {
    format!(
        "A model directory (config.json, model.safetensors or its numbered pieces, \
         tokenizer.json) of a family this build implements: {}{more}",
        embedfleet_pipeline::flags::help::families()
    )
}

/// The help of `embed --query`: each family's query format (the pipeline says them).
pub fn query_formats() -> String {
    embedfleet_pipeline::flags::help::query_formats()
}

/// The commands of the top-level help, by group: each with a one-line summary (its own
/// `--help` says the rest). Hidden commands are not here: the help names them in one line.
const GROUPS: &[(&str, &[(&str, &str)])] = &[
    (
        "Pipeline (each step resumable: kill it, run it again)",
        &[
            (
                "run",
                "The whole pipeline on this machine: plan, embed, upload, one query",
            ),
            (
                "plan",
                "Cut a corpus into per-node jobs; `--update` plans its next release",
            ),
            (
                "submit",
                "Send the planned batches to Slurm, PBS, ssh hosts or local jobs",
            ),
            (
                "upload",
                "Load the run's parquet shards into Qdrant (a server or embedded)",
            ),
            (
                "query",
                "Search the collection for each term; the top papers to a parquet file",
            ),
            (
                "eval",
                "Recall@k of the collection against exact search, per HNSW ef",
            ),
            (
                "publish",
                "Write a dataset folder: parquet, dataset card, checksums",
            ),
        ],
    ),
    (
        "Watching a run",
        &[
            (
                "status",
                "Where a run stands: papers, batches, jobs, shards, uploads",
            ),
            (
                "report",
                "Timings, throughput, failures: a table, an HTML page, plots",
            ),
            (
                "queues",
                "Show or change the queues the submit loop fills, and their caps",
            ),
            (
                "pause",
                "Stop the submit loop from submitting (running jobs go on)",
            ),
            ("resume", "Let the submit loop submit again"),
            (
                "doctor",
                "Check this binary and this node as a job would use them",
            ),
            (
                "take-over",
                "Move a run to this host when its owner host is gone for good",
            ),
        ],
    ),
    (
        "Data",
        &[
            ("sample-corpus", "Write a synthetic peS2o-like corpus"),
            (
                "embed",
                "Embed files of records or text lines into one parquet file",
            ),
            (
                "build-shard",
                "Build a batch's Qdrant shard offline, for `upload --mode snapshot`",
            ),
            ("delete", "Delete papers from a collection by paper id"),
            (
                "tune",
                "Find the upload's (or the queries') batch size and requests in flight",
            ),
        ],
    ),
];

/// The two examples that end the top-level help: the demo, then a cluster run's first look.
const EXAMPLES: &[&str] = &[
    "embedfleet run --corpus examples/sample-200.jsonl.gz --run-dir /tmp/embedfleet-demo",
    "embedfleet submit --run-dir /scratch/run1 --config run.toml --model-dir MODEL --dry-run",
];

/// `cmd` (the whole command line) with the grouped top-level help.
pub fn grouped(cmd: Command) -> Command {
    let styles = cmd.get_styles();
    let (header, literal) = (*styles.get_header(), *styles.get_literal());
    let width = GROUPS
        .iter()
        .flat_map(|(_, commands)| commands.iter().map(|(name, _)| name.len()))
        .max()
        .unwrap_or(0);
    let mut t = StyledStr::new();
    let _ = writeln!(t, "{{about-with-newline}}\n{{usage-heading}} {{usage}}");
    for (heading, commands) in GROUPS {
        let _ = writeln!(t, "\n{header}{heading}:{header:#}");
        for (name, summary) in *commands {
            let _ = writeln!(t, "  {literal}{name:<width$}{literal:#}  {summary}");
        }
    }
    let internal: Vec<&str> = cmd
        .get_subcommands()
        .filter(|c| c.is_hide_set())
        .map(|c| c.get_name())
        .collect();
    let _ = writeln!(
        t,
        "\n{header}Internal{header:#} (run by jobs, benches and tests): {}",
        internal.join(", ")
    );
    let _ = writeln!(t, "\n{header}{GLOBAL}:{header:#}\n{{options}}");
    let _ = write!(t, "\n{header}Examples:{header:#}");
    for example in EXAMPLES {
        let _ = write!(t, "\n  {example}");
    }
    cmd.help_template(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn top_level() -> Command {
        let mut cmd = crate::cli::command();
        cmd.build();
        cmd
    }

    /// What `embedfleet ARGS... --help` prints.
    fn help(args: &[&str]) -> String {
        let line = std::iter::once("embedfleet")
            .chain(args.iter().copied())
            .chain(["--help"]);
        let err = crate::cli::command()
            .try_get_matches_from(line)
            .expect_err("--help ends the parse");
        assert_eq!(err.kind(), clap::error::ErrorKind::DisplayHelp);
        err.render().to_string()
    }

    #[test]
    fn every_command_is_in_one_group_or_hidden_as_internal() {
        let cmd = top_level();
        let grouped: Vec<&str> = GROUPS
            .iter()
            .flat_map(|(_, commands)| commands.iter().map(|(name, _)| *name))
            .collect();
        for sub in cmd.get_subcommands().filter(|c| c.get_name() != "help") {
            let name = sub.get_name();
            let times = grouped.iter().filter(|g| **g == name).count();
            if sub.is_hide_set() {
                assert_eq!(times, 0, "{name} is hidden and grouped");
            } else {
                assert_eq!(times, 1, "{name} is in {times} groups");
            }
        }
        for name in grouped {
            assert!(cmd.find_subcommand(name).is_some(), "{name} is no command");
        }
        let hidden: Vec<&str> = cmd
            .get_subcommands()
            .filter(|c| c.is_hide_set())
            .map(|c| c.get_name())
            .collect();
        assert_eq!(
            hidden,
            ["embed-job", "make-tiny-model", "bench-gpu", "query-job"]
        );
    }

    #[test]
    fn top_level_help_is_under_40_lines_grouped_with_examples() {
        let help = help(&[]);
        let lines: Vec<&str> = help.lines().collect();
        assert!(lines.len() < 40, "{} lines:\n{help}", lines.len());
        for heading in [
            "Pipeline (each step resumable: kill it, run it again):",
            "Watching a run:",
            "Data:",
            "Global options:",
            "Examples:",
        ] {
            assert!(lines.contains(&heading), "no {heading}:\n{help}");
        }
        let internal = lines
            .iter()
            .find(|l| l.starts_with("Internal"))
            .unwrap_or_else(|| panic!("no internal line:\n{help}"));
        for name in ["embed-job", "query-job", "bench-gpu", "make-tiny-model"] {
            assert!(internal.contains(name), "{internal}");
            let listed = lines.iter().any(|l| l.trim_start().starts_with(name));
            assert!(!listed, "{name} listed among the user's commands:\n{help}");
        }
        assert!(lines.iter().all(|l| l.len() <= 100), "{help}");
        let examples = lines.iter().skip_while(|l| **l != "Examples:").skip(1);
        assert_eq!(examples.count(), 2, "{help}");
        let report = lines.iter().find(|l| l.starts_with("  report "));
        assert!(
            report.is_some_and(|l| l.contains("Timings, throughput, failures")),
            "{help}"
        );
    }

    /// Each heading of a help text and the options under it.
    fn sections(help: &str) -> Vec<(String, usize)> {
        let mut out: Vec<(String, usize)> = Vec::new();
        for line in help.lines() {
            if !line.starts_with(' ') && line.ends_with(':') {
                out.push((line.trim_end_matches(':').to_string(), 0));
            } else if is_option_line(line) {
                if let Some(last) = out.last_mut() {
                    last.1 += 1;
                }
            }
        }
        out
    }

    /// An option's first line (`  -v, --verbose...`, `      --run-dir <DIR>`), not a wrapped
    /// description (indented to the description column).
    fn is_option_line(line: &str) -> bool {
        let text = line.trim_start();
        line.len() - text.len() <= 6 && text.starts_with('-')
    }

    #[test]
    fn every_command_help_has_headings_of_at_most_ten_options() {
        let cmd = top_level();
        let not_help = |c: &&Command| c.get_name() != "help";
        let mut paths = Vec::new();
        for sub in cmd.get_subcommands().filter(not_help) {
            paths.push(vec![sub.get_name()]);
            for subsub in sub.get_subcommands().filter(not_help) {
                paths.push(vec![sub.get_name(), subsub.get_name()]);
            }
        }
        assert!(paths.len() > 20, "{paths:?}");
        for path in paths {
            let help = help(&path);
            let sections = sections(&help);
            assert_eq!(
                sections.last().map(|(h, _)| h.as_str()),
                Some(GLOBAL),
                "{path:?}: the global options come last:\n{help}"
            );
            for (heading, options) in &sections {
                assert!(
                    *options <= 10,
                    "{path:?}: {options} options under {heading}: more headings needed\n{help}"
                );
            }
        }
    }
}
