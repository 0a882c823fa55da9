//! A temporary directory and a `Command` for the binary under test.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

/// The repository root: what the docs and code-rule tests read.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

pub struct TestDir {
    dir: tempfile::TempDir,
}

impl TestDir {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("a temporary directory"),
        }
    }

    pub fn path(&self) -> &Path {
        self.dir.path()
    }

    pub fn join(&self, rel: &str) -> PathBuf {
        self.dir.path().join(rel)
    }

    /// `embedfleet ARGS...` run in this directory.
    pub fn cmd(&self, args: &[&str]) -> Command {
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_embedfleet"));
        cmd.current_dir(self.path())
            .args(args)
            .env_remove("EMBEDFLEET_LOG");
        cmd
    }

    /// Runs `embedfleet ARGS...`, asserting it exits with `code`.
    pub fn run(&self, args: &[&str], code: i32) -> Output {
        let out = self.cmd(args).output().expect("the binary runs");
        assert_eq!(
            out.status.code(),
            Some(code),
            "embedfleet {args:?}\nstdout:\n{}\nstderr:\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        out
    }

    /// `status --json` of a run directory.
    pub fn status(&self, run_dir: &str) -> serde_json::Value {
        let out = self.run(&["status", "--run-dir", run_dir, "--json"], 0);
        serde_json::from_slice(&out.stdout).expect("status --json prints JSON")
    }

    /// A sample corpus of `papers` papers (`c.jsonl.gz`) planned into `run` with `per_job`
    /// papers per batch, and a tiny model in `model`.
    pub fn plan_with_model(&self, papers: u64, per_job: u64) {
        self.sample("c.jsonl.gz", papers, 1);
        let per_job = per_job.to_string();
        let plan = [
            "plan",
            "--corpus",
            "c.jsonl.gz",
            "--run-dir",
            "run",
            "--papers-per-job",
        ];
        self.run(&[&plan[..], &[per_job.as_str()]].concat(), 0);
        self.run(&["make-tiny-model", "--out", "model"], 0);
    }

    /// `run` of a sample corpus of `papers` papers (`c.jsonl.gz`) into `run`, `per_job` papers
    /// a batch, with the tiny model `run` writes: a run embedded, uploaded and queried.
    pub fn run_sample(&self, papers: u64, per_job: u64) {
        self.sample("c.jsonl.gz", papers, 1);
        let per_job = per_job.to_string();
        let args = [
            "run",
            "--corpus",
            "c.jsonl.gz",
            "--run-dir",
            "run",
            "--papers-per-job",
            &per_job,
        ];
        self.run(&args, 0);
    }

    /// `run` of `papers` sample papers into `run_dir` (`per_job` a batch, shards of 15 papers,
    /// 2 local jobs), with `extra` arguments; returns its stdout and stderr.
    pub fn small_run(
        &self,
        run_dir: &str,
        papers: u64,
        per_job: u64,
        extra: &[&str],
    ) -> (String, String) {
        let corpus = format!("{run_dir}-corpus.jsonl.gz");
        self.sample(&corpus, papers, 1);
        self.run_corpus(run_dir, &corpus, per_job, extra)
    }

    /// `run` of the corpus `corpus` into `run_dir`, as [`TestDir::small_run`] runs its own.
    pub fn run_corpus(
        &self,
        run_dir: &str,
        corpus: &str,
        per_job: u64,
        extra: &[&str],
    ) -> (String, String) {
        let per_job = per_job.to_string();
        let mut args = vec![
            "run",
            "--corpus",
            corpus,
            "--run-dir",
            run_dir,
            "--papers-per-job",
            &per_job,
            "--local-jobs",
            "2",
            "--shard-papers",
            "15",
        ];
        args.extend_from_slice(extra);
        let out = self.run(&args, 0);
        (
            String::from_utf8_lossy(&out.stdout).into_owned(),
            String::from_utf8_lossy(&out.stderr).into_owned(),
        )
    }

    /// A sample corpus of `papers` short papers over `files` files; returns its path.
    pub fn sample(&self, name: &str, papers: u64, files: u32) -> String {
        self.sample_seeded(name, papers, files, 42)
    }

    /// [`TestDir::sample`] made with corpus seed `seed` (another seed: other paper ids).
    pub fn sample_seeded(&self, name: &str, papers: u64, files: u32, seed: u64) -> String {
        let (papers, files, seed) = (papers.to_string(), files.to_string(), seed.to_string());
        self.run(
            &[
                "sample-corpus",
                "--papers",
                &papers,
                "--mean-chars",
                "1500",
                "--files",
                &files,
                "--seed",
                &seed,
                "--out",
                name,
            ],
            0,
        );
        name.to_string()
    }
}

/// One row of a shard file.
pub struct ShardRecord {
    pub id: String,
    pub vector: Vec<f32>,
    pub n_chunks: i16,
}

/// Every row of a shard file (f32 vectors), checking the file says it was pooled by the last
/// token (the default family's pooling).
pub fn read_shard(path: &Path) -> Vec<ShardRecord> {
    read_shard_pooled(path, "last_token")
}

/// [`read_shard`] of a shard pooled by `pooling`.
pub fn read_shard_pooled(path: &Path, pooling: &str) -> Vec<ShardRecord> {
    use arrow_array::{Array, FixedSizeListArray, Float32Array, Int16Array, StringArray};
    let file = std::fs::File::open(path).unwrap();
    let builder =
        parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
    let meta = builder
        .metadata()
        .file_metadata()
        .key_value_metadata()
        .unwrap()
        .clone();
    assert!(meta
        .iter()
        .any(|kv| kv.key == "embedfleet.pooling" && kv.value.as_deref() == Some(pooling)));
    let mut out = Vec::new();
    for batch in builder.build().unwrap() {
        let batch = batch.unwrap();
        let column = |name: &str| batch.column_by_name(name).unwrap().clone();
        let (ids, emb, chunks) = (column("id"), column("embedding"), column("n_chunks"));
        let ids = ids.as_any().downcast_ref::<StringArray>().unwrap();
        let emb = emb.as_any().downcast_ref::<FixedSizeListArray>().unwrap();
        let chunks = chunks.as_any().downcast_ref::<Int16Array>().unwrap();
        for i in 0..batch.num_rows() {
            let v = emb.value(i);
            out.push(ShardRecord {
                id: ids.value(i).to_owned(),
                vector: v
                    .as_any()
                    .downcast_ref::<Float32Array>()
                    .unwrap()
                    .values()
                    .to_vec(),
                n_chunks: chunks.value(i),
            });
        }
    }
    out
}

/// Runs a Python snippet; `None` when the module it needs is missing and not required.
pub fn python(code: &str, module: &str, required_env: &str) -> Option<String> {
    let probe = std::process::Command::new("python3")
        .args(["-c", &format!("import {module}")])
        .output();
    if !probe.is_ok_and(|o| o.status.success()) {
        assert!(
            std::env::var_os(required_env).is_none(),
            "{required_env} is set but python3 cannot import {module}"
        );
        eprintln!("skipping the {module} check: python3 has no {module} (pip install {module})");
        return None;
    }
    let out = std::process::Command::new("python3")
        .args(["-c", code])
        .env("HF_DATASETS_OFFLINE", "1")
        .env("HF_HUB_OFFLINE", "1")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "python3 failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    Some(String::from_utf8_lossy(&out.stdout).trim().to_string())
}

/// A Python with PyTorch and transformers: `EMBEDFLEET_TORCH_PYTHON` (CI makes a venv of its
/// own for them), else `python3`; `None` when it has neither and `EMBEDFLEET_REQUIRE_TORCH` is
/// not set.
pub fn torch_python() -> Option<String> {
    let python = std::env::var("EMBEDFLEET_TORCH_PYTHON").unwrap_or_else(|_| "python3".into());
    let probe = std::process::Command::new(&python)
        .args(["-c", "import torch, transformers"])
        .output();
    if probe.is_ok_and(|o| o.status.success()) {
        return Some(python);
    }
    assert!(
        std::env::var_os("EMBEDFLEET_REQUIRE_TORCH").is_none(),
        "EMBEDFLEET_REQUIRE_TORCH is set but {python} cannot import torch and transformers"
    );
    eprintln!("skipping the transformers check: {python} has no torch/transformers");
    None
}

/// id -> (vector, n_chunks) of every shard recorded in run.db; panics on a duplicate id.
pub fn shard_rows(run_dir: &Path) -> std::collections::BTreeMap<String, (Vec<f32>, i16)> {
    shard_rows_pooled(run_dir, "last_token")
}

/// [`shard_rows`] of shards pooled by `pooling`.
pub fn shard_rows_pooled(
    run_dir: &Path,
    pooling: &str,
) -> std::collections::BTreeMap<String, (Vec<f32>, i16)> {
    let db = embedfleet_core::rundb::RunDb::open(run_dir).unwrap();
    let mut rows = std::collections::BTreeMap::new();
    for shard in db.all_shards().unwrap() {
        let records = read_shard_pooled(&run_dir.join(&shard.path), pooling);
        assert_eq!(
            records.len() as u64,
            shard.rows,
            "{} rows as recorded",
            shard.path
        );
        for r in records {
            let old = rows.insert(r.id.clone(), (r.vector, r.n_chunks));
            assert!(old.is_none(), "duplicate id {}", r.id);
        }
    }
    rows
}

/// The ids planned for embedding (batch rows less duplicates), from the batch files.
pub fn planned_ids(run_dir: &Path) -> Vec<String> {
    let db = embedfleet_core::rundb::RunDb::open(run_dir).unwrap();
    let mut stmt = db
        .conn()
        .prepare("SELECT id FROM papers WHERE duplicate_of IS NULL ORDER BY id")
        .unwrap();
    let ids = stmt
        .query_map([], |r| r.get(0))
        .unwrap()
        .map(Result::unwrap)
        .collect();
    ids
}

/// `embed-job` of batch 1 of the run made by [`TestDir::plan_with_model`], with `extra` arguments.
pub fn embed_job_args<'a>(extra: &[&'a str]) -> Vec<&'a str> {
    let base = [
        "embed-job",
        "--run-dir",
        "run",
        "--batch",
        "1",
        "--model-dir",
        "model",
    ];
    [&base[..], extra].concat()
}

/// Whether the one-node Slurm of `.ci/slurm/start-local-slurm.sh` answers; a missing one
/// fails the test where EMBEDFLEET_REQUIRE_SLURM=1 (CI), and skips it elsewhere.
/// `submit` of the run in `run` to Slurm, with the model in `model`, on the CPU.
pub const SUBMIT_ON_SLURM_CPU: [&str; 9] = [
    "submit",
    "--run-dir",
    "run",
    "--backend",
    "slurm",
    "--model-dir",
    "model",
    "--devices",
    "cpu",
];

/// `var`, which names the Qdrant server (or cluster) a test runs against, or `None` when it is
/// not set: `test` is then said to be skipped, and fails instead where
/// `EMBEDFLEET_REQUIRE_QDRANT_SERVER=1` (CI, whose `.ci/run` starts a server and a three-peer
/// cluster: docs/testing.md, "Server tests").
pub fn qdrant_env(test: &str, var: &str) -> Option<String> {
    match std::env::var(var) {
        Ok(value) if !value.is_empty() => Some(value),
        _ if std::env::var("EMBEDFLEET_REQUIRE_QDRANT_SERVER").as_deref() == Ok("1") => panic!(
            "{test}: {var} is not set but EMBEDFLEET_REQUIRE_QDRANT_SERVER=1; start the server \
             and the cluster with .ci/qdrant/ (docs/testing.md, \"Server tests\")"
        ),
        _ => {
            eprintln!("skipping {test}: {var} is not set (docs/testing.md, \"Server tests\")");
            None
        }
    }
}

pub fn slurm_up(test: &str) -> bool {
    let ok = Command::new("squeue")
        .arg("-h")
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !ok {
        if std::env::var("EMBEDFLEET_REQUIRE_SLURM").as_deref() == Ok("1") {
            panic!("{test}: no Slurm but EMBEDFLEET_REQUIRE_SLURM=1; run .ci/slurm/start-local-slurm.sh");
        }
        eprintln!("skipping {test}: no Slurm (start one with .ci/slurm/start-local-slurm.sh)");
    }
    ok
}

/// Polls `cond` every 100 ms until it holds, failing the test after `timeout_s` seconds.
pub fn wait_until(what: &str, timeout_s: u64, mut cond: impl FnMut() -> bool) {
    let end = std::time::Instant::now() + std::time::Duration::from_secs(timeout_s);
    while !cond() {
        assert!(
            std::time::Instant::now() < end,
            "timed out waiting until {what}"
        );
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
}

/// Every file and folder under `dir` (relative path → bytes; folders map to nothing).
pub fn tree(dir: &Path) -> std::collections::BTreeMap<PathBuf, Option<Vec<u8>>> {
    let mut out = std::collections::BTreeMap::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).unwrap() {
            let p = e.unwrap().path();
            let rel = p.strip_prefix(dir).unwrap().to_path_buf();
            if p.is_dir() {
                out.insert(rel, None);
                stack.push(p);
            } else {
                out.insert(rel, Some(std::fs::read(&p).unwrap()));
            }
        }
    }
    out
}

/// Asserts `dir` holds what `before` ([`tree`]) held: the same files and folders, byte for byte.
pub fn assert_same_tree(before: &std::collections::BTreeMap<PathBuf, Option<Vec<u8>>>, dir: &Path) {
    let after = tree(dir);
    let keys = |t: &std::collections::BTreeMap<PathBuf, _>| t.keys().cloned().collect::<Vec<_>>();
    assert_eq!(keys(before), keys(&after), "the same files");
    for (path, bytes) in before {
        assert!(after[path] == *bytes, "{} changed", path.display());
    }
}
