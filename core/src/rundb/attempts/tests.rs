use super::cleaning::remove_files;
use super::*;
use crate::handoff::settings_for_tests;

fn settings() -> crate::handoff::OutputSettings {
    settings_for_tests(10)
}

/// A run of `batches` batches, each with a results folder: the first `open` of them running
/// (a job open, an attempt's manifest still incomplete), the others done, their one attempt
/// accepted.
fn run_at_scale(batches: i64, open: i64) -> (tempfile::TempDir, RunDb) {
    let dir = tempfile::tempdir().unwrap();
    let mut db = RunDb::create(dir.path()).unwrap();
    let layout = db.layout();
    let plan = db.plan_id().unwrap();
    let tx = db.conn_mut().transaction().unwrap();
    tx.execute(
        "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 1, 1, 'e')",
        [],
    )
    .unwrap();
    for id in 1..=batches {
        let state = if id <= open { "running" } else { "done" };
        tx.execute(
            "INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars, state) VALUES (?1, 1, ?1, 'c', 4, 1, ?2)",
            params![id, state],
        )
        .unwrap();
        if id > open {
            tx.execute(
                "INSERT INTO attempts (batch_id, token, state, cleaned, ingested_at) VALUES (?1, 'a1', 'accepted', 0, 'now')",
                [id],
            )
            .unwrap();
        }
    }
    tx.commit().unwrap();
    for id in 1..=batches {
        let mut m = AttemptManifest::start(&plan, id, "cpu".into(), settings(), 1);
        m.attempt = "a1".into();
        m.complete = id > open;
        m.write(&layout).unwrap();
    }
    for id in 1..=open {
        let name = format!("job-{id}");
        db.insert_job(&crate::rundb::NewJob {
            batches: &[id],
            attempt: 1,
            backend: "local",
            queue: "q",
            name: &name,
            script: "s",
            log: "l",
            marker: "m",
        })
        .unwrap();
    }
    (dir, db)
}

fn operations(db: &mut RunDb, full_sweep_s: &str) -> u64 {
    std::env::set_var(FULL_SWEEP_ENV, full_sweep_s);
    let before = crate::fsops::total();
    db.ingest_results().unwrap();
    crate::fsops::total() - before
}

#[test]
fn an_ingest_reads_the_open_works_folders_not_every_batchs() {
    let (_dir, mut db) = run_at_scale(2_075, 8);
    // The first ingest of a run (or after a lost sweep time) reads every folder once.
    let first = operations(&mut db, "900");
    assert!(first > 2_075, "{first}");
    // Then each poll: the open batches' folders and manifests (no listing of results/).
    let poll = operations(&mut db, "900");
    assert!(
        (8..=2 * 8 + 4).contains(&poll),
        "{poll} operations at 8 open jobs"
    );
    // The same with no sweep interval: every folder, as before the fix.
    let every = operations(&mut db, "0");
    assert!(every > 2_075, "{every}");
    // Per-poll operations follow the open jobs, not the batches.
    let (_small, mut small) = run_at_scale(100, 8);
    operations(&mut small, "900");
    assert_eq!(operations(&mut small, "900"), poll);
}

#[test]
fn cleaning_removes_the_other_attempts_shards_by_name_and_keeps_the_accepted_ones() {
    let (dir, mut db) = run_at_scale(3, 0);
    let layout = db.layout();
    std::fs::create_dir_all(layout.shard_dir()).unwrap();
    let shard = |batch: i64, part: u32, token: &str| {
        layout.resolve(RunLayout::shard_file_name(batch, part, token))
    };
    // Batch 2's accepted attempt a1 has one shard; a killed attempt k9 wrote one, and its
    // writer left a temporary file. Batch 3 has files of its own.
    db.record_shard(&ShardRow {
        batch_id: BatchId(2),
        part: 0,
        path: RunLayout::shard_file_name(2, 0, "a1"),
        rows: 4,
        sha256: "x".into(),
    })
    .unwrap();
    let mut killed = AttemptManifest::start(&db.plan_id().unwrap(), 2, "cpu".into(), settings(), 1);
    killed.attempt = "k9".into();
    // A manifest's count of parts is not believed: cleaning goes by the accepted attempt's
    // (a path per claimed part would exhaust memory).
    killed.parts = u32::MAX;
    killed.write(&layout).unwrap();
    let temporary = atomic::tmp_path(&shard(2, 0, "k9"));
    for f in [
        shard(2, 0, "a1"),
        shard(2, 0, "k9"),
        temporary.clone(),
        shard(3, 0, "a1"),
    ] {
        std::fs::write(f, b"x").unwrap();
    }
    db.ingest_results().unwrap();
    assert!(shard(2, 0, "a1").exists() && shard(3, 0, "a1").exists());
    assert!(
        !shard(2, 0, "k9").exists(),
        "the killed attempt's shard is removed by name"
    );
    let states = db.attempts().unwrap();
    assert!(
        states
            .iter()
            .any(|(b, t, s, _)| *b == 2 && t == "k9" && *s == AttemptState::Abandoned),
        "{states:?}"
    );
    // Its host is the one its unfinished manifest names (a killed host's attempts count).
    let host: Option<String> = db
        .conn()
        .query_row("SELECT host FROM attempts WHERE token = 'k9'", [], |r| {
            r.get(0)
        })
        .unwrap();
    assert_eq!(host.as_deref(), Some(killed.host.as_str()));
    // The first ingest of this run was a full sweep: the temporary file went too.
    assert!(!temporary.exists());
    // A temporary file of a batch still open stays: its writer may be alive.
    db.conn()
        .execute("UPDATE batches SET state = 'running' WHERE id = 3", [])
        .unwrap();
    let live = atomic::tmp_path(&shard(3, 1, "a2"));
    std::fs::write(&live, b"x").unwrap();
    std::env::set_var(FULL_SWEEP_ENV, "0");
    db.ingest_results().unwrap();
    assert!(live.exists());
    drop(dir);
}

#[test]
fn a_cancelled_attempts_shard_is_cleaned_once_the_batch_job_ends_between_full_sweeps() {
    let (_dir, mut db) = run_at_scale(3, 0);
    let layout = db.layout();
    std::fs::create_dir_all(layout.shard_dir()).unwrap();
    std::env::set_var(FULL_SWEEP_ENV, "900");
    db.ingest_results().unwrap(); // the first, full sweep: every batch settled
                                  // Batch 1 runs again (a job open), and an attempt of it that was cancelled left a
                                  // manifest that never completed and a shard: the rehearsal's 9 extra shard rows.
    db.insert_job(&crate::rundb::NewJob {
        batches: &[1],
        attempt: 2,
        backend: "slurm",
        queue: "q",
        name: "job-1b",
        script: "s",
        log: "l",
        marker: "m",
    })
    .unwrap();
    let mut cancelled =
        AttemptManifest::start(&db.plan_id().unwrap(), 1, "cpu".into(), settings(), 1);
    cancelled.attempt = "c7".into();
    cancelled.write(&layout).unwrap();
    let shard = layout.resolve(RunLayout::shard_file_name(1, 0, "c7"));
    std::fs::write(&shard, b"x").unwrap();
    db.ingest_results().unwrap();
    assert!(shard.exists(), "kept while a job of the batch is open");
    db.set_job_state("job-1b", JobStatus::Cancelled, None)
        .unwrap();
    db.ingest_results().unwrap();
    assert!(
        !shard.exists(),
        "removed at the first poll after the job ended"
    );
    // And then the batch is settled: its folder is not read at every poll.
    let before = crate::fsops::total();
    db.ingest_results().unwrap();
    assert_eq!(
        crate::fsops::total() - before,
        0,
        "no folder read, nor a listing of results/"
    );
}

/// Between full sweeps a poll lists no `results/` and reads the folders of open work only,
/// and that includes a job that ended with its batch not done: on NFS its manifest can show up
/// a poll or two after the scheduler said it ended. Once the job is ten minutes gone, its
/// folder waits for the next full sweep.
#[test]
fn a_job_that_ended_leaving_its_batch_not_done_is_read_between_full_sweeps_for_ten_minutes() {
    let (_dir, mut db) = run_at_scale(50, 2);
    std::env::set_var(FULL_SWEEP_ENV, "900");
    db.ingest_results().unwrap(); // the first, full sweep
    assert_eq!(
        db.batches_with_open_work().unwrap(),
        vec![(1, true), (2, true)]
    );
    // Job 1 ends with its batch not done (its manifest not seen yet); job 2's batch is done
    // and, once an ingest cleaned it, settled.
    db.set_job_state("job-1", JobStatus::Failed, Some("exit code 1"))
        .unwrap();
    db.set_batch_state(BatchId(2), BatchState::Done).unwrap();
    db.set_job_state("job-2", JobStatus::Completed, None)
        .unwrap();
    assert_eq!(
        db.batches_with_open_work().unwrap(),
        vec![(1, true), (2, false)]
    );
    db.conn_mut()
        .execute("UPDATE batches SET results_settled = 1 WHERE id = 2", [])
        .unwrap();
    assert_eq!(db.batches_with_open_work().unwrap(), vec![(1, true)]);
    let before = crate::fsops::total();
    db.ingest_results().unwrap();
    assert!(crate::fsops::total() > before, "batch 1's folder is read");
    // Eleven minutes later its folder is no poll's business (the next full sweep reads it).
    db.conn_mut()
        .execute(
            "UPDATE jobs SET updated_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now', '-11 minutes')",
            [],
        )
        .unwrap();
    assert_eq!(
        db.batches_with_open_work().unwrap(),
        Vec::<(i64, bool)>::new()
    );
}

#[test]
fn a_file_another_cleaner_removed_first_is_done_not_an_error() {
    let dir = tempfile::tempdir().unwrap();
    let paths = [dir.path().join("a"), dir.path().join("b")];
    for p in &paths {
        std::fs::write(p, b"x").unwrap();
    }
    // `status` beside the submit loop cleans the same batch between the listing and the
    // removal: one of the files is gone already.
    std::fs::remove_file(&paths[0]).unwrap();
    assert_eq!(remove_files(&paths).unwrap(), 1);
    assert!(!paths.iter().any(|p| p.exists()));
}

#[test]
fn a_manifest_that_is_a_fifo_or_a_link_is_rejected_with_a_reason_not_retried_for_ever() {
    let (_dir, mut db) = run_at_scale(1, 1);
    let layout = db.layout();
    let fifo = layout.attempt_manifest(1, "a2");
    let c_path = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c_path.as_ptr(), 0o644) }, 0);
    std::os::unix::fs::symlink("/dev/zero", layout.attempt_manifest(1, "a3")).unwrap();
    // Neither blocks the ingest nor is read: each is a verdict, recorded once with its reason.
    db.ingest_results().unwrap();
    let rows = |db: &RunDb| -> Vec<(String, String, String)> {
        let mut stmt = db
            .conn()
            .prepare("SELECT token, state, reason FROM attempts WHERE batch_id = 1 ORDER BY token")
            .unwrap();
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)));
        rows.unwrap().map(|r| r.unwrap()).collect()
    };
    let recorded = rows(&db);
    assert_eq!(recorded.len(), 2, "{recorded:?}");
    assert_eq!(
        (recorded[0].0.as_str(), recorded[0].1.as_str()),
        ("a2", "rejected")
    );
    assert!(
        recorded[0].2.contains("a FIFO, not a regular file"),
        "{recorded:?}"
    );
    assert_eq!(
        (recorded[1].0.as_str(), recorded[1].1.as_str()),
        ("a3", "rejected")
    );
    assert!(recorded[1].2.contains("a symbolic link"), "{recorded:?}");
    // The next poll does not read them again.
    db.ingest_results().unwrap();
    assert_eq!(rows(&db), recorded);
}
