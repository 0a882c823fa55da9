//! Every path of a run directory, in one place. docs/cluster.md, "On a shared filesystem", says
//! which process writes which of them.
//!
//! ```text
//! <run-dir>/run.db              the run state (SQLite)
//! <run-dir>/batches/            one batch file per per-node job (f<file>-<seq>.parquet)
//! <run-dir>/plan.json           what a job needs of the plan (written by the owner)
//! <run-dir>/output-settings.json  the settings every attempt must share (model, dim, ...)
//! <run-dir>/shards/             parquet shards of embeddings (b<batch>-<part>.<attempt>.parquet)
//! <run-dir>/results/            one result manifest per embed-job attempt (b<batch>/<attempt>.json)
//! <run-dir>/quarantine.jsonl    papers that were not embedded, with why
//! <run-dir>/jobs/               job scripts and completion markers (<job>.sh, <job>.exit)
//! <run-dir>/logs/               job logs (<job>.log)
//! <run-dir>/qdrant/             the embedded Qdrant engine (the default upload target)
//! <run-dir>/snapshots/          built Qdrant shards (b<batch>-<sources>.snapshot + .json)
//! <run-dir>/tune/               `tune`'s table and plot
//! <run-dir>/tiny-model/         the tiny random model `run` writes without --model-dir
//! <run-dir>/eval/               `eval`'s cached exact answers and its latest report
//!                               (latest.json, latest.md, recall.png, compare.json/.md)
//! <run-dir>/queries/            `query --submit`'s work folders (queries/<key>/)
//! <run-dir>/report.html, metrics.prom   the owner's report page and Prometheus metrics
//! <run-dir>/submit.lock         held by the running submit loop
//! ```

use std::path::{Path, PathBuf};

/// The paths of one run directory. Paths stored in run.db are relative to the run directory
/// (the `*_name` functions), so a run directory can be moved whole.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RunLayout {
    root: PathBuf,
}

impl RunLayout {
    pub const DB_FILE: &'static str = "run.db";
    pub const BATCH_DIR: &'static str = "batches";
    pub const SHARD_DIR: &'static str = "shards";
    pub const RESULTS_DIR: &'static str = "results";
    pub const PLAN_FILE: &'static str = "plan.json";
    pub const OUTPUT_SETTINGS_FILE: &'static str = "output-settings.json";
    pub const QUARANTINE_FILE: &'static str = "quarantine.jsonl";
    pub const JOB_DIR: &'static str = "jobs";
    pub const LOG_DIR: &'static str = "logs";
    pub const EDGE_DIR: &'static str = "qdrant";
    pub const SNAPSHOT_DIR: &'static str = "snapshots";
    pub const TUNE_DIR: &'static str = "tune";
    pub const TINY_MODEL_DIR: &'static str = "tiny-model";
    pub const EVAL_DIR: &'static str = "eval";
    pub const QUERIES_DIR: &'static str = "queries";
    pub const REPORT_FILE: &'static str = "report.html";
    pub const METRICS_FILE: &'static str = "metrics.prom";
    pub const LOOP_LOCK_FILE: &'static str = "submit.lock";
    /// Relative to the run directory, as messages name them.
    pub const SHARD_KEYS_FILE: &'static str = "snapshots/keys.json";
    pub const SNAPSHOT_SETTINGS_FILE: &'static str = "snapshots/settings.json";

    pub fn new(root: impl Into<PathBuf>) -> Self {
        Self { root: root.into() }
    }

    /// The run directory itself.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// A path stored relative to the run directory, made whole.
    pub fn resolve(&self, relative: impl AsRef<Path>) -> PathBuf {
        self.root.join(relative)
    }

    pub fn db(&self) -> PathBuf {
        self.root.join(Self::DB_FILE)
    }

    /// The host that owns the run: only it opens run.db (see `owner`).
    pub fn owner_file(&self) -> PathBuf {
        self.root.join("owner.json")
    }

    /// Rewritten every 30 s by each owner process that holds run.db (see `owner::heartbeat`).
    pub fn heartbeat_file(&self) -> PathBuf {
        self.root.join("owner-heartbeat.json")
    }

    /// The run's status as the owner last wrote it, for `status` on other hosts.
    pub fn status_snapshot_file(&self) -> PathBuf {
        self.root.join("status-snapshot.json")
    }

    pub fn batch_dir(&self) -> PathBuf {
        self.root.join(Self::BATCH_DIR)
    }

    /// The batch file of the `seq`-th batch of corpus file `file_id`, relative.
    pub fn batch_file_name(file_id: i64, seq: u64) -> String {
        format!("{}/f{file_id:06}-{seq:05}.parquet", Self::BATCH_DIR)
    }

    /// The batch file of the `seq`-th batch that packs an update's papers of several corpus
    /// files (`release`'s), relative.
    pub fn packed_batch_file_name(release: i64, seq: u64) -> String {
        format!("{}/r{release:04}-{seq:05}.parquet", Self::BATCH_DIR)
    }

    pub fn shard_dir(&self) -> PathBuf {
        self.root.join(Self::SHARD_DIR)
    }

    /// The parquet shard of part `part` of batch `batch` written by attempt `attempt`,
    /// relative. The attempt's token in the name keeps two attempts of one batch (a lost job
    /// and its replacement, say) from ever writing, or deleting, each other's files.
    pub fn shard_file_name(batch: i64, part: u32, attempt: &str) -> String {
        format!(
            "{}/b{batch:06}-{part:04}.{attempt}.parquet",
            Self::SHARD_DIR
        )
    }

    /// The file-name prefix every parquet shard of `batch` starts with.
    pub fn shard_file_prefix(batch: i64) -> String {
        format!("b{batch:06}-")
    }

    /// What a job needs of the plan (see `handoff::PlanManifest`).
    pub fn plan_file(&self) -> PathBuf {
        self.root.join(Self::PLAN_FILE)
    }

    /// The output settings the run's first attempt fixed (see `handoff::OutputSettings`).
    pub fn output_settings_file(&self) -> PathBuf {
        self.root.join(Self::OUTPUT_SETTINGS_FILE)
    }

    pub fn results_dir(&self) -> PathBuf {
        self.root.join(Self::RESULTS_DIR)
    }

    /// The result manifests of every attempt at `batch`.
    pub fn batch_results_dir(&self, batch: i64) -> PathBuf {
        self.results_dir().join(format!("b{batch:06}"))
    }

    /// The result manifest of attempt `attempt` at `batch`.
    pub fn attempt_manifest(&self, batch: i64, attempt: &str) -> PathBuf {
        self.batch_results_dir(batch)
            .join(format!("{attempt}.json"))
    }

    /// The owner's word that it rejected attempt `attempt` at `batch` (beside its manifest): a
    /// job never stands down for an attempt with one, though it looks complete to the job.
    pub fn attempt_rejection(&self, batch: i64, attempt: &str) -> PathBuf {
        self.batch_results_dir(batch)
            .join(format!("{attempt}.rejected"))
    }

    pub fn quarantine_file(&self) -> PathBuf {
        self.root.join(Self::QUARANTINE_FILE)
    }

    pub fn job_dir(&self) -> PathBuf {
        self.root.join(Self::JOB_DIR)
    }

    pub fn job_script(&self, job: &str) -> PathBuf {
        self.job_dir().join(format!("{job}.sh"))
    }

    /// The file a job script writes its exit code to when it ends.
    pub fn job_marker(&self, job: &str) -> PathBuf {
        self.job_dir().join(format!("{job}.exit"))
    }

    pub fn log_dir(&self) -> PathBuf {
        self.root.join(Self::LOG_DIR)
    }

    pub fn job_log(&self, job: &str) -> PathBuf {
        self.log_dir().join(format!("{job}.log"))
    }

    /// The embedded Qdrant engine's directory when `--edge` is not given.
    pub fn edge_dir(&self) -> PathBuf {
        self.root.join(Self::EDGE_DIR)
    }

    /// Built Qdrant shards, packed as server shard snapshots (`build-shard`).
    pub fn snapshot_dir(&self) -> PathBuf {
        self.root.join(Self::SNAPSHOT_DIR)
    }

    /// The built shard of `batch` made from the shards whose digest is `sources`, relative:
    /// the same inputs give the same name, whoever builds it.
    pub fn snapshot_file_name(batch: i64, sources: &str) -> String {
        format!("{}/b{batch:06}-{sources}.snapshot", Self::SNAPSHOT_DIR)
    }

    /// The manifest beside [`RunLayout::snapshot_file_name`]; written last, so a snapshot
    /// without one is unfinished.
    pub fn snapshot_manifest_name(batch: i64, sources: &str) -> String {
        format!("{}/b{batch:06}-{sources}.json", Self::SNAPSHOT_DIR)
    }

    pub fn tune_dir(&self) -> PathBuf {
        self.root.join(Self::TUNE_DIR)
    }

    pub fn tiny_model_dir(&self) -> PathBuf {
        self.root.join(Self::TINY_MODEL_DIR)
    }

    /// `eval`'s cached exact answers and its latest report.
    pub fn eval_dir(&self) -> PathBuf {
        self.root.join(Self::EVAL_DIR)
    }

    /// The latest `eval`'s report, as JSON (what `report` shows of it).
    pub fn eval_latest_json(&self) -> PathBuf {
        self.eval_dir().join("latest.json")
    }

    /// The latest `eval`'s recall table, as markdown (what a dataset card quotes).
    pub fn eval_latest_md(&self) -> PathBuf {
        self.eval_dir().join("latest.md")
    }

    /// `eval --compare-postgres`'s table of two databases side by side, as JSON (what the
    /// report shows) and as markdown.
    pub fn eval_compare_json(&self) -> PathBuf {
        self.eval_dir().join("compare.json")
    }

    pub fn eval_compare_md(&self) -> PathBuf {
        self.eval_dir().join("compare.md")
    }

    /// `eval`'s recall-against-latency plot when `--plot` is not given.
    pub fn recall_plot(&self) -> PathBuf {
        self.eval_dir().join("recall.png")
    }

    /// How the run's batches are grouped into Qdrant shard keys, pinned at the first grouped
    /// build or load (beside the built shards: a run.db rebuilt after a loss keeps them).
    pub fn shard_keys_file(&self) -> PathBuf {
        self.root.join(Self::SHARD_KEYS_FILE)
    }

    /// The settings the run's built shards were made with, pinned by the first build.
    pub fn snapshot_settings_file(&self) -> PathBuf {
        self.root.join(Self::SNAPSHOT_SETTINGS_FILE)
    }

    /// The requests of group builds (`snapshots/requests/group-<n>.json`): what each group's
    /// build job builds from.
    pub fn group_request_dir(&self) -> PathBuf {
        self.snapshot_dir().join("requests")
    }

    /// `query --submit`'s work folders, one per work (`queries/<key>/`).
    pub fn queries_dir(&self) -> PathBuf {
        self.root.join(Self::QUERIES_DIR)
    }

    /// The owner's report page, rewritten as the run goes.
    pub fn report_page(&self) -> PathBuf {
        self.root.join(Self::REPORT_FILE)
    }

    /// The owner's Prometheus metrics, rewritten each poll.
    pub fn metrics_file(&self) -> PathBuf {
        self.root.join(Self::METRICS_FILE)
    }

    /// Held (`flock`) by the submit loop that runs the run: a second loop is refused.
    pub fn loop_lock_file(&self) -> PathBuf {
        self.root.join(Self::LOOP_LOCK_FILE)
    }

    /// The ssh backend's check that `host` sees the run directory: a file the check writes
    /// here and the host reads back (removed after).
    pub fn ssh_check_file(&self, host: &str, nonce: &str) -> PathBuf {
        self.root.join(format!(".ssh-check.{host}.{nonce}"))
    }

    /// A job script the ssh backend was handed as text, written where every host reads it.
    pub fn ssh_job_script(&self, job: &str) -> PathBuf {
        self.root.join(format!(".{job}.ssh.sh"))
    }

    /// What the notify hooks print (`notify.log` among the job logs).
    pub fn notify_log(&self) -> PathBuf {
        self.log_dir().join("notify.log")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_relative_and_resolve_under_the_root() {
        let layout = RunLayout::new("/runs/r1");
        let shard = RunLayout::shard_file_name(12, 3, "t0a1b2c3d4e5");
        assert_eq!(shard, "shards/b000012-0003.t0a1b2c3d4e5.parquet");
        assert!(shard.starts_with(&format!("shards/{}", RunLayout::shard_file_prefix(12))));
        assert_eq!(
            layout.resolve(&shard),
            PathBuf::from("/runs/r1/shards/b000012-0003.t0a1b2c3d4e5.parquet")
        );
        assert_eq!(
            RunLayout::batch_file_name(2, 7),
            "batches/f000002-00007.parquet"
        );
        assert_eq!(layout.db(), PathBuf::from("/runs/r1/run.db"));
        assert_eq!(
            layout.job_marker("j"),
            PathBuf::from("/runs/r1/jobs/j.exit")
        );
        assert_eq!(layout.job_log("j"), PathBuf::from("/runs/r1/logs/j.log"));
        assert_eq!(
            layout.shard_keys_file(),
            PathBuf::from("/runs/r1/snapshots/keys.json")
        );
        assert_eq!(
            layout.eval_latest_md(),
            PathBuf::from("/runs/r1/eval/latest.md")
        );
    }
}
