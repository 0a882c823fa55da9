//! The scheduler-facing commands: `submit`, `pause`, `resume`, `queues`, `status`.

use super::common::{PrecisionArg, RunDirArgs, VectorDtypeArg};
use super::help;
use clap::builder::{PossibleValuesParser, TypedValueParser};
use clap::{Args, Subcommand};
use embedfleet_pipeline::flags::defaults::{parse_listen, Backend};
use std::path::PathBuf;

#[derive(Debug, Args)]
pub struct SubmitArgs {
    /// The run directory (planned with `embedfleet plan`).
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// The scheduler; overrides `[scheduler] backend` of --config (default: the run's stored
    /// run config, else local). One that differs from the stored one is refused unless
    /// --replace-config is given.
    #[arg(long, value_parser = backend_names())]
    pub backend: Option<Backend>,
    /// A queue (PBS) or partition (Slurm) and its cap on jobs queued + running, e.g.
    /// `--queue debug=1 --queue preemptable=4` (repeatable). Replaces the queues stored in the run;
    /// without it the stored ones are used (`embedfleet queues`).
    #[arg(long = "queue", value_name = "NAME=CAP", value_parser = parse_queue_cap)]
    pub queues: Vec<(String, u32)>,
    /// The run config (TOML): scheduler command paths, account, walltime, GPUs, modules,
    /// environment, a job script template (docs/cluster.md, "How the submit loop works").
    /// The run's first submit stores it in run.db; later commands (a restart, --trial,
    /// `query --submit`) use the stored one when given none, and refuse a different one
    /// unless --replace-config is given. Without any: local.
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Store the run config given by --config/--backend in place of the one the run keeps
    /// (the differences are printed). Queues are not part of it (`embedfleet queues set`).
    #[arg(long)]
    pub replace_config: bool,
    /// Print what a submit would fix for the run (the run config it would store, the output
    /// settings the first job would pin) and the job scripts the first round would submit;
    /// write nothing: the run directory is left byte-identical.
    #[arg(long, help_heading = help::TRY_FIRST)]
    pub dry_run: bool,
    /// Run one trial job (the first batch that needs one) on this queue, wait for it and print
    /// its time per batch — what to set `walltime` from (README, "On a cluster, step by
    /// step"). The run's queues are left as they are.
    #[arg(long, value_name = "QUEUE", conflicts_with_all = ["queues", "watch", "dry_run"], help_heading = help::TRY_FIRST)]
    pub trial: Option<String>,
    // The families this build implements answer the help (`help::model_dir`).
    #[arg(
        long,
        value_name = "DIR",
        help = help::model_dir(
            " (default: the run's, which its first submit fixed: a restart needs none of the output options)"
        ),
        help_heading = help::MODEL
    )]
    pub model_dir: Option<PathBuf>,
    /// Output dimension (Matryoshka): the first N components, renormalised (default: the
    /// run's, else the model's own).
    #[arg(long, value_name = "N", help_heading = help::MODEL)]
    pub dim: Option<usize>,
    /// Element type of the stored vectors (default: the run's, else f32).
    #[arg(long, value_enum, help_heading = help::MODEL)]
    pub vector_dtype: Option<VectorDtypeArg>,
    /// How the model computes: `native` (bf16 on a GPU, f32 on the CPU) or `fp8` (FP8
    /// projections on GPUs of compute capability 8.9+: H100, H200, L40; Qwen3 models only;
    /// refused on A100s and CPUs) (default: the run's, else native).
    #[arg(long, value_enum, help_heading = help::MODEL)]
    pub precision: Option<PrecisionArg>,
    /// Longest sequence fed to the model, in tokens; longer papers are embedded in chunks and
    /// combined (default: the run's, else the model's context).
    #[arg(long, value_name = "TOKENS", help_heading = help::MODEL)]
    pub max_tokens: Option<usize>,
    // The help is embed's (`TEXT_RULE_HELP`): the run's own is the default of a restart.
    #[arg(long, value_enum, value_name = "RULE", help = super::common::TEXT_RULE_SUBMIT_HELP, help_heading = help::MODEL)]
    pub text_rule: Option<super::common::TextRuleArg>,
    /// Devices of each job: `cuda` (every GPU of the node), `cuda:0,1`, `cpu:N` (default:
    /// the run's last submit's, else cuda on slurm and pbs, cpu locally; on ssh cuda, on the
    /// GPUs of each host's slot, or cpu when every slot is a cpu slot).
    #[arg(long, value_name = "DEVICES", help_heading = help::MODEL)]
    pub devices: Option<String>,
    /// Papers per parquet shard (default: the run's, else 500).
    #[arg(long, value_name = "N", help_heading = help::MODEL)]
    pub shard_papers: Option<usize>,
    /// Jobs per batch before it is marked failed (walltime kills, node failures, cancelled
    /// jobs are retried; exit codes 2 and 4 of embed-job are not).
    /// Kept for the run's later submits, as --breaker-after, --poll-interval and --lost-after
    /// are (default: the run's, else 3).
    #[arg(long, value_name = "N", help_heading = help::LOOP)]
    pub max_attempts: Option<u32>,
    /// Pause the run after this many jobs in a row failed the same way (same exit code and
    /// first error line of the log), at the first for a refusal (exit code 4 or 2); 0: never.
    /// `embedfleet status` says why; `embedfleet resume` goes on after the fix.
    /// (default: the run's, else 3).
    #[arg(long, value_name = "K", help_heading = help::LOOP)]
    pub breaker_after: Option<u32>,
    /// How free job slots are given batches: `adaptive` learns each queue from the run's own
    /// jobs (start delay, run time, share lost to preemption or walltime) and sends each batch
    /// where it finishes soonest (a queue with no history is expected to start jobs at once
    /// until its waits say otherwise); `static` fills every queue to its cap, queues taking
    /// turns. Caps are upper bounds either way.
    /// `embedfleet status` shows what was learned and why the next batch goes where it goes.
    /// (default: the run's, else adaptive; docs/cluster.md, "Routing between queues").
    #[arg(long, value_name = "ROUTE", value_parser = ["adaptive", "static"], help_heading = help::ROUTING)]
    pub route: Option<String>,
    /// With the adaptive route, at the tail (no batch left without a job): give a batch whose
    /// job has waited over twice another queue's usual start a second job there; the first to
    /// finish is kept, the other cancelled. `--speculate false` turns it off.
    /// (default: the run's, else true).
    #[arg(long, value_name = "BOOL", help_heading = help::ROUTING)]
    pub speculate: Option<bool>,
    /// The most jobs the run may hold queued or running over all its queues together: a
    /// site's per-user limit (Slurm's `MaxSubmitJobs` of a QOS or association, PBS's
    /// `max_queued`). Each queue's cap still holds; under the limit the adaptive route gives
    /// each free place to the queue that finishes a batch soonest with it. Where the scheduler
    /// states such a limit (Slurm: `sacctmgr`; PBS Pro: `qstat -B -f`, and a queue's own
    /// `max_queued` from `qstat -Q -f` lowers that queue's cap), the loop reads it and keeps
    /// under the lower of the two; `status` shows it. 0: none of the run's own. Also
    /// `[scheduler] max_jobs` in the run config. (default: the run's, else the run config's, else none).
    #[arg(long, value_name = "N", help_heading = help::ROUTING)]
    pub max_jobs: Option<u32>,
    /// Seconds between polls of the scheduler (default: 30; 5 for ssh, 1 for local).
    #[arg(long, value_name = "SECS", value_parser = positive_secs, help_heading = help::LOOP)]
    pub poll_interval: Option<f64>,
    /// Seconds a job may be unknown to the scheduler, with no completion marker, before it
    /// counts as lost and is retried (default: 300; 60 for ssh, 10 for local).
    #[arg(long, value_name = "SECS", value_parser = positive_secs, help_heading = help::LOOP)]
    pub lost_after: Option<f64>,
    /// Run as a daemon: do not exit when every batch is settled; stop it with a signal.
    #[arg(long, help_heading = help::LOOP)]
    pub watch: bool,
    /// A running job counts as stalled when it has written no shard for this many of its own
    /// shard times (and at least --stalled-min): shown by `status`, said once by the loop.
    #[arg(long, default_value_t = 4.0, value_name = "N", value_parser = positive_secs, help_heading = help::STALLS)]
    pub stalled_after_shards: f64,
    /// The least silence, in seconds, that counts as a stall (model loads, slow shards).
    #[arg(long, default_value_t = 600.0, value_name = "SECS", value_parser = positive_secs, help_heading = help::STALLS)]
    pub stalled_min: f64,
    /// Cancel stalled jobs; their batches are retried like any cancelled job's. Without it a
    /// stalled job is only shown and reported.
    #[arg(long, help_heading = help::STALLS)]
    pub kill_stalled: bool,
    /// Serve the run's Prometheus metrics at http://ADDR/metrics while the loop runs. ADDR is a
    /// port (listened on loopback, 127.0.0.1, only) or ADDRESS:PORT to be scraped from
    /// elsewhere. `metrics.prom` beside run.db has the same for node_exporter's textfile
    /// collector.
    #[arg(long, value_name = "ADDR", value_parser = parse_listen, help_heading = help::LOOP)]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// After each batch, its job builds the batch's Qdrant shard on the node's cores
    /// (`embed-job --build-shard`), for `upload --mode snapshot`.
    #[arg(long, conflicts_with = "group_builds", help_heading = help::SHARD_BUILDS)]
    pub build_shard: bool,
    /// Build each group's Qdrant shard (for `upload --mode snapshot`) in a CPU job of its own
    /// as soon as the group's batches are done, on this queue of the run's scheduler; `local`
    /// runs them as processes on this host, `off` stops them. Each job asks for --build-cpus
    /// cores and memory sized from its group's points. Kept for the run's later submits.
    #[arg(long, value_name = "QUEUE|local|off", help_heading = help::SHARD_BUILDS)]
    pub group_builds: Option<String>,
    /// Groups to split the run's batches into for --group-builds, when its shard keys are not
    /// pinned yet (`snapshots/keys.json`); e.g. two per peer of the target Qdrant cluster.
    #[arg(long, value_name = "G", value_parser = clap::value_parser!(i64).range(1..), help_heading = help::SHARD_BUILDS)]
    pub group_count: Option<i64>,
    /// Cores each group build job asks for (the engine builds the graph on all of them).
    #[arg(long, default_value_t = 8, value_name = "N", value_parser = clap::value_parser!(u32).range(1..), help_heading = help::SHARD_BUILDS)]
    pub build_cpus: u32,
}

#[derive(Debug, Args)]
pub struct TakeOverArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// Seconds the owner host must have been silent (no process there holding run.db) before
    /// its run may be moved here.
    #[arg(long, default_value_t = 300.0, value_name = "SECS", value_parser = positive_secs)]
    pub stale_after: f64,
}

/// `--backend`: a name of the scheduler backends' registry.
fn backend_names() -> impl TypedValueParser<Value = Backend> {
    PossibleValuesParser::new(Backend::NAMES.iter().copied())
        .map(|name| name.parse().expect("clap checked the name. This is a bug."))
}

#[derive(Debug, Args)]
pub struct QueuesArgs {
    #[command(subcommand)]
    pub command: Option<QueuesCommand>,
    /// The run directory (to show its queues).
    #[arg(long, value_name = "DIR")]
    pub run_dir: Option<PathBuf>,
}

#[derive(Debug, Subcommand)]
pub enum QueuesCommand {
    /// Show the queues, their caps and jobs.
    Show(RunDirArgs),
    /// Add queues or change caps: `queues set --run-dir DIR debug=2 prod=0 preemptable=4`
    /// (0 submits nothing more there; running jobs go on).
    Set {
        /// The run directory.
        #[arg(long, value_name = "DIR")]
        run_dir: PathBuf,
        /// NAME=CAP pairs.
        #[arg(required = true, value_name = "NAME=CAP", value_parser = parse_queue_cap)]
        caps: Vec<(String, u32)>,
    },
    /// Remove queues (their running jobs go on and are still watched).
    Remove {
        /// The run directory.
        #[arg(long, value_name = "DIR")]
        run_dir: PathBuf,
        /// Queue names.
        #[arg(required = true, value_name = "NAME")]
        names: Vec<String>,
    },
}

/// A finite number of seconds above zero (`inf`, `nan` and negatives would hang or panic).
fn positive_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 => Ok(v),
        _ => Err(format!(
            "`{s}` is not a number of seconds above 0, e.g. 30 or 0.5"
        )),
    }
}

fn parse_queue_cap(s: &str) -> Result<(String, u32), String> {
    let (name, cap) = s
        .split_once('=')
        .ok_or_else(|| format!("`{s}` is not NAME=CAP, e.g. debug=1"))?;
    let valid = !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.@".contains(c));
    if !valid {
        return Err(format!(
            "queue name `{name}` must be letters, digits and `-_.@`"
        ));
    }
    let cap = cap
        .parse::<u32>()
        .map_err(|_| format!("cap `{cap}` of queue {name} is not a whole number >= 0"))?;
    Ok((name.to_string(), cap))
}

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The run directory.
    #[arg(long, value_name = "DIR")]
    pub run_dir: PathBuf,
    /// Print the stable JSON form (docs/commands.md, "status --json").
    #[arg(long)]
    pub json: bool,
}

#[cfg(test)]
mod tests {
    use super::positive_secs;

    #[test]
    fn seconds_must_be_finite_and_positive() {
        assert_eq!(positive_secs("0.5"), Ok(0.5));
        for bad in ["0", "-1", "inf", "NaN", "x", ""] {
            assert!(positive_secs(bad).is_err(), "{bad}");
        }
    }
}
