//! `build-shard`, `embed-job --build-shard`, `upload --mode snapshot` and `delete`.
//!
//! The embedded-path tests; the server suite is in `snapshot_server.rs`.

use crate::util::{embed_job_args, TestDir};
use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_snapshot::BuiltShardManifest;
use std::path::Path;

/// `run` of `papers` sample papers, `per_job` a batch, into `run_dir`.
pub(crate) fn small_run(t: &TestDir, run_dir: &str, papers: u64, per_job: u64) {
    t.small_run(run_dir, papers, per_job, &[]);
}

/// `build-shard --run-dir run` with `args`, exiting `code`; returns its stderr.
pub(crate) fn build(t: &TestDir, args: &[&str], code: i32) -> String {
    let line = [&["build-shard", "--run-dir", "run"][..], args].concat();
    stderr(&t.run(&line, code))
}

/// Every built-shard manifest of a run.
fn manifests(run: &Path) -> Vec<BuiltShardManifest> {
    let mut out: Vec<BuiltShardManifest> = std::fs::read_dir(run.join("snapshots"))
        .into_iter()
        .flatten()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "json")
                && p.file_name()
                    .is_some_and(|n| n != "settings.json" && n != "keys.json")
        })
        .map(|p| serde_json::from_slice(&std::fs::read(p).unwrap()).unwrap())
        .collect();
    out.sort_by_key(|m| m.batch);
    out
}

pub(crate) fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

#[test]
fn build_shard_builds_each_batch_once_from_its_accepted_shards() {
    let t = TestDir::new();
    small_run(&t, "run", 60, 40);
    let db = RunDb::open(&t.join("run")).unwrap();
    let shards = db.all_shards().unwrap();
    drop(db);
    let err = build(&t, &["--batch", "1", "--batch", "2"], 0);
    assert!(err.contains("points into snapshots/"), "{err}");
    let built = manifests(&t.join("run"));
    assert_eq!(built.len(), 2);
    for m in &built {
        let mine: Vec<_> = shards.iter().filter(|s| s.batch_id.0 == m.batch).collect();
        assert_eq!(m.points, mine.iter().map(|s| s.rows).sum::<u64>());
        let files: Vec<&str> = m.sources.iter().map(|s| s.file.as_str()).collect();
        let recorded: Vec<&str> = mine.iter().map(|s| s.path.as_str()).collect();
        assert_eq!(files, recorded, "built from the batch's accepted shards");
        assert!(t.join("run").join(&m.snapshot).is_file());
    }
    // Again: nothing to build; from run.db's accepted shards (the owner) it is the same shard.
    let err = build(&t, &["--batch", "2"], 0);
    assert!(err.contains("built already"), "{err}");
    let err = build(&t, &["--batch", "2", "--accepted"], 0);
    assert!(err.contains("built already"), "{err}");
    // The run's build settings are pinned: other ones are refused (exit 4), naming them.
    let err = build(&t, &["--batch", "1", "--hnsw-m", "32"], 4);
    assert!(err.contains("hnsw m: the run's 16, here 32"), "{err}");
    // A batch nothing embedded yet is refused with what to do.
    let err = build(&t, &["--batch", "9"], 1);
    assert!(err.contains("embed it first"), "{err}");
}

#[test]
fn build_shard_reads_shards_that_pyarrow_wrote_with_its_defaults() {
    let t = TestDir::new();
    small_run(&t, "run", 20, 20);
    let run = t.join("run");
    // Every shard of the run rewritten by pyarrow (snappy, its own schema metadata), and
    // recorded in run.db as the accepted shards with their new sha256.
    let code = format!(
        "import hashlib, sqlite3, pyarrow.parquet as pq
db = sqlite3.connect('{run}/run.db')
for sid, path in db.execute('SELECT id, path FROM shards').fetchall():
    t = pq.read_table('{run}/' + path).replace_schema_metadata(None)
    new = path.replace('.parquet', '.pyarrow.parquet')
    pq.write_table(t, '{run}/' + new)
    sha = hashlib.sha256(open('{run}/' + new, 'rb').read()).hexdigest()
    db.execute('UPDATE shards SET path = ?, sha256 = ? WHERE id = ?', (new, sha, sid))
db.commit()
print(pq.ParquetFile('{run}/' + new).metadata.row_group(0).column(0).compression)",
        run = run.display()
    );
    let Some(codec) = crate::util::python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW") else {
        return;
    };
    assert_eq!(codec, "SNAPPY");
    let err = build(&t, &["--batch", "1", "--accepted"], 0);
    assert!(err.contains("20 points into snapshots/"), "{err}");
    let built = manifests(&run);
    assert_eq!(built.len(), 1);
    assert!(built[0]
        .sources
        .iter()
        .all(|s| s.file.ends_with(".pyarrow.parquet")));
    assert_eq!(built[0].points, 20);
}

#[test]
fn embed_job_with_build_shard_leaves_the_batchs_shard_built() {
    let t = TestDir::new();
    t.plan_with_model(30, 30);
    t.run(&embed_job_args(&["--build-shard"]), 0);
    // The owner takes the attempt in (status opens run.db, which ingests results).
    t.status("run");
    let built = manifests(&t.join("run"));
    assert_eq!(built.len(), 1);
    let db = RunDb::open(&t.join("run")).unwrap();
    let accepted: Vec<String> = db
        .shards_of(embedfleet_core::BatchId(1))
        .unwrap()
        .into_iter()
        .map(|s| s.sha256)
        .collect();
    let sources: Vec<String> = built[0].sources.iter().map(|s| s.sha256.clone()).collect();
    assert_eq!(sources, accepted);
    assert_eq!(built[0].points, 30);
}

/// The job scripts under `run/jobs` whose name contains `part`.
fn job_scripts(run: &Path, part: &str) -> Vec<std::path::PathBuf> {
    let mut out: Vec<_> = std::fs::read_dir(run.join("jobs"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| {
            p.extension().is_some_and(|e| e == "sh")
                && p.file_name().unwrap().to_string_lossy().contains(part)
        })
        .collect();
    out.sort();
    out
}

#[test]
fn submit_builds_each_group_in_a_job_of_its_own_once_its_batches_are_done() {
    let t = TestDir::new();
    t.plan_with_model(50, 10);
    let run = t.join("run");
    // Batches 1-3 (group 1 of two groups of three) are embedded before the loop starts.
    for batch in ["1", "2", "3"] {
        let args = [
            "embed-job",
            "--run-dir",
            "run",
            "--batch",
            batch,
            "--model-dir",
            "model",
        ];
        t.run(&args, 0);
    }
    // Keep batch 5's shards aside: without them group 2's build fails, twice, and is given up.
    let submit = |extra: &[&str]| {
        let base = [
            "submit",
            "--run-dir",
            "run",
            "--model-dir",
            "model",
            "--poll-interval",
            "0.2",
            "--queue",
            "local=1",
        ];
        stderr(&t.run(&[&base[..], extra].concat(), 0))
    };
    let err = submit(&[
        "--group-builds",
        "local",
        "--group-count",
        "2",
        "--max-attempts",
        "2",
    ]);
    assert!(
        err.contains("group 1 (batches 1-3): 30 points ready"),
        "{err}"
    );
    assert!(
        err.contains("group 2 (batches 4-6): 20 points ready"),
        "{err}"
    );
    // Group 1's build went in the first round, before batch 5's embed job (one slot): the
    // builds pipeline with the embedding.
    let g1 = job_scripts(&run, "-g1-a");
    let embed5: Vec<_> = {
        let db = RunDb::open(&run).unwrap();
        let names: Vec<String> = db
            .conn()
            .prepare("SELECT name FROM jobs WHERE batch_id = 5")
            .unwrap()
            .query_map([], |r| r.get(0))
            .unwrap()
            .map(Result::unwrap)
            .collect();
        names
            .iter()
            .map(|n| RunLayout::new(&run).job_script(n))
            .collect()
    };
    assert_eq!((g1.len(), embed5.len()), (1, 1), "{g1:?} {embed5:?}");
    let mtime = |p: &Path| std::fs::metadata(p).unwrap().modified().unwrap();
    assert!(mtime(&g1[0]) < mtime(&embed5[0]));
    // Each group's shard is what the load builds: its batches' accepted shards, in order.
    let built = manifests(&run);
    assert_eq!(
        built.iter().map(|m| m.batches()).collect::<Vec<_>>(),
        vec![(1, 3), (4, 6)]
    );
    let db = RunDb::open(&run).unwrap();
    let accepted: Vec<String> = db
        .all_shards()
        .unwrap()
        .into_iter()
        .map(|s| s.sha256)
        .collect();
    let sources: Vec<String> = built
        .iter()
        .flat_map(|m| m.sources.iter().map(|s| s.sha256.clone()))
        .collect();
    assert_eq!(sources, accepted);
    assert_eq!(built.iter().map(|m| m.points).sum::<u64>(), 50);
    drop(db);
    let err = build(&t, &["--accepted", "--group", "1", "--group", "2"], 0);
    assert_eq!(err.matches("built already").count(), 2, "{err}");

    // A build that fails is tried again up to --max-attempts, then left to the load.
    for m in &built {
        std::fs::remove_file(run.join(&m.snapshot)).unwrap();
    }
    let shard5 = db_shards(&run, 5);
    std::fs::rename(run.join(&shard5), run.join("aside.parquet")).unwrap();
    let err = submit(&["--max-attempts", "2"]);
    assert!(err.contains("group 1: built by"), "{err}");
    assert_eq!(err.matches("group 2: build job").count(), 2, "{err}");
    assert!(err.contains("given up after 2 jobs"), "{err}");
    assert_eq!(job_scripts(&run, "-g2-a").len(), 3);
    // Restarted without the option (it is kept), the group is built once its shards are back.
    std::fs::rename(run.join("aside.parquet"), run.join(&shard5)).unwrap();
    let err = submit(&[]);
    assert!(err.contains("group 2: built by"), "{err}");
    assert!(!err.contains("group 1"), "built already: {err}");
    let err = submit(&["--group-builds", "off"]);
    assert!(
        !err.contains("group builds") && !err.contains("build job"),
        "{err}"
    );
}

/// Every batch embedded first, then `submit` on `backend` with only group builds to do: each
/// group's job goes through the scheduler, asks for its cores and memory, and builds it.
fn group_builds_through(backend: &str, directives: &[&str], config: Option<&str>) {
    let t = TestDir::new();
    t.plan_with_model(40, 10);
    for batch in ["1", "2", "3", "4"] {
        let args = [
            "embed-job",
            "--run-dir",
            "run",
            "--batch",
            batch,
            "--model-dir",
            "model",
        ];
        t.run(&args, 0);
    }
    let mut args = vec![
        "submit",
        "--run-dir",
        "run",
        "--backend",
        backend,
        "--model-dir",
        "model",
        "--devices",
        "cpu",
        "--queue",
        "gpu=1",
        "--poll-interval",
        "0.5",
        "--group-builds",
        "debug",
        "--group-count",
        "2",
        "--build-cpus",
        "1",
    ];
    if let Some(config) = config {
        std::fs::write(t.join("run.toml"), config).unwrap();
        args.extend(["--config", "run.toml"]);
    }
    let err = stderr(&t.run(&args, 0));
    assert!(
        err.contains("group 1: built by") && err.contains("group 2: built by"),
        "{err}"
    );
    let run = t.join("run");
    assert_eq!(
        manifests(&run)
            .iter()
            .map(|m| m.batches())
            .collect::<Vec<_>>(),
        vec![(1, 2), (3, 4)]
    );
    // The owner's record of group 1's job names its script (PBS names are cut to 15 chars).
    let record: serde_json::Value = serde_json::from_slice(
        &std::fs::read(run.join("snapshots/requests/group-000001.job.json")).unwrap(),
    )
    .unwrap();
    let script = std::fs::read_to_string(record["script"].as_str().unwrap()).unwrap();
    for d in directives {
        assert!(script.contains(d), "{d} in {script}");
    }
    assert!(!script.contains("gpus"), "{script}");
}

#[test]
fn submit_group_builds_through_slurm() {
    if !crate::util::slurm_up("submit_group_builds_through_slurm") {
        return;
    }
    group_builds_through(
        "slurm",
        &[
            "#SBATCH --partition=debug",
            "#SBATCH --cpus-per-task=1",
            "#SBATCH --mem=10",
        ],
        None,
    );
}

#[test]
fn submit_group_builds_through_pbs() {
    if !crate::util::slurm_up("submit_group_builds_through_pbs") {
        return;
    }
    group_builds_through(
        "pbs",
        &["#PBS -q debug", "#PBS -l select=1:ncpus=1:mem=10"],
        Some("[scheduler.pbs]\nflavor = \"torque\"\n"),
    );
}

/// The first parquet shard run.db accepted for `batch`.
fn db_shards(run: &Path, batch: i64) -> String {
    let db = RunDb::open(run).unwrap();
    db.shards_of(embedfleet_core::BatchId(batch)).unwrap()[0]
        .path
        .clone()
}

#[test]
fn snapshot_mode_needs_a_server_and_says_so() {
    let t = TestDir::new();
    small_run(&t, "run", 20, 20);
    let out = t.run(&["upload", "--run-dir", "run", "--mode", "snapshot"], 4);
    let err = stderr(&out);
    assert!(
        err.contains("--qdrant URL") && err.contains("cluster mode"),
        "{err}"
    );
    // A server that is not there: the REST address to check is named.
    let out = t.run(
        &[
            "upload",
            "--run-dir",
            "run",
            "--mode",
            "snapshot",
            "--qdrant",
            "http://127.0.0.1:9",
            "--qdrant-rest",
            "http://127.0.0.1:9",
        ],
        1,
    );
    assert!(stderr(&out).contains("--qdrant-rest"), "{}", stderr(&out));
}

#[test]
fn delete_removes_papers_by_id_from_the_embedded_engine() {
    let t = TestDir::new();
    small_run(&t, "run", 30, 30);
    let db = RunDb::open(&t.join("run")).unwrap();
    let ids = crate::util::planned_ids(&t.join("run"));
    drop(db);
    let out = t.run(&["delete", "--run-dir", "run", &ids[0], &ids[1]], 0);
    assert!(
        stderr(&out).contains("deleted 2 points"),
        "{}",
        stderr(&out)
    );
    let out = t.run(&["delete", "--run-dir", "run", "no-such-paper"], 0);
    assert!(
        stderr(&out).contains("deleted 0 points"),
        "{}",
        stderr(&out)
    );
}
