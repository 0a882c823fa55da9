use super::*;
use crate::rundb::test_support::db_with_batches;
use crate::rundb::{BatchTimings, NewJob, ShardRow};
use crate::state::{BatchState, JobStatus};
use crate::BatchId;

/// `status` from the kept counts is `status` recounted, field by field; the embed seconds,
/// a float summed in another order, to the last few bits.
fn assert_counts_match(db: &RunDb) {
    let mut kept = db.status().unwrap();
    let recounted = db.status_recounted().unwrap();
    assert_eq!(kept.releases.len(), recounted.releases.len());
    for (k, r) in kept.releases.iter_mut().zip(&recounted.releases) {
        let (a, b) = (k.embed_node_hours, r.embed_node_hours);
        assert!((a - b).abs() <= 1e-9 * b.abs().max(1.0), "{a} vs {b}");
        k.embed_node_hours = b;
    }
    // Free space is read anew by each (other writers share the filesystem); the rest is equal.
    assert_eq!(
        kept.disk
            .as_ref()
            .map(|d| (&d.dir, d.total_bytes, d.needed_bytes)),
        recounted
            .disk
            .as_ref()
            .map(|d| (&d.dir, d.total_bytes, d.needed_bytes))
    );
    kept.disk = recounted.disk.clone();
    assert_eq!(kept, recounted);
}

fn job<'a>(batches: &'a [i64], attempt: u32, queue: &'a str, name: &'a str) -> NewJob<'a> {
    NewJob {
        batches,
        attempt,
        backend: "local",
        queue,
        name,
        script: "s",
        log: "l",
        marker: "m",
    }
}

fn run(db: &RunDb, batch: i64, job: &str, papers: u64, error: Option<&str>) {
    let timings = BatchTimings {
        total_s: 0.1 + papers as f64 / 7.0,
        papers,
        tokens: papers * 600,
        ..Default::default()
    };
    db.record_batch_run(
        BatchId(batch),
        Some(job),
        1.8e9 + batch as f64,
        1.8e9 + 40.0 * batch as f64,
        "cpu",
        &timings,
        error,
    )
    .unwrap();
}

fn shard(db: &RunDb, batch: i64, part: u32, rows: u64) {
    let row = ShardRow {
        batch_id: BatchId(batch),
        part,
        path: format!("shards/b{batch}-{part}.parquet"),
        rows,
        sha256: "x".into(),
    };
    db.record_shard(&row).unwrap();
}

#[test]
fn the_kept_counts_are_the_recount_through_a_runs_life() {
    let (_dir, mut db) = db_with_batches(6);
    let c = db.conn();
    c.execute_batch(
        "INSERT INTO releases (id, started_at, planned_at, added, changed, withdrawn, unchanged)
             VALUES (1, 'a', 'b', 6, 0, 0, 0), (2, 'c', NULL, 0, 0, 0, 0);
         INSERT INTO corpus_files (id, path, size, mtime_ns, edges, release) VALUES (2, 'd', 0, 0, '', 2);
         INSERT INTO batches (id, file_id, seq, path, n_rows, n_excluded, n_chars) VALUES (7, 2, 1, 'b', 9, 2, 40);
         INSERT INTO quarantine (file_id, line, reason, detail) VALUES (1, 1, 'empty', ''), (1, 2, 'empty', ''), (2, 1, 'too_long', '');",
    )
    .unwrap();
    assert_counts_match(&db);
    // Submitted, retried after a cancel on another queue, run to the end.
    db.insert_job(&job(&[1, 2], 1, "debug", "j1")).unwrap();
    db.insert_job(&job(&[3], 1, "gpu", "j3")).unwrap();
    assert_counts_match(&db);
    db.set_job_submitted("j1", "41").unwrap();
    db.set_job_state("j1", JobStatus::Running, None).unwrap();
    db.set_job_state("j3", JobStatus::Cancelled, Some("cancelled"))
        .unwrap();
    assert_counts_match(&db);
    db.insert_job(&job(&[3], 2, "debug", "j3b")).unwrap();
    db.set_job_state("j3b", JobStatus::Failed, Some("exit code 1"))
        .unwrap();
    db.set_batch_state(BatchId(3), BatchState::Failed).unwrap();
    assert_counts_match(&db);
    for batch in [1, 2] {
        db.set_batch_state(BatchId(batch), BatchState::Running)
            .unwrap();
        run(&db, batch, "j1", 4, None);
        shard(&db, batch, 0, 3);
        shard(&db, batch, 1, 1);
        db.set_batch_state(BatchId(batch), BatchState::Done)
            .unwrap();
    }
    run(&db, 3, "j3b", 0, Some("out of memory"));
    db.set_job_state("j1", JobStatus::Completed, None).unwrap();
    // Ingested attempts, one rejected then forgotten; a shard recorded again with fewer rows.
    db.conn()
        .execute_batch(
            "INSERT INTO attempts (batch_id, token, state, ingested_at)
                 VALUES (1, 'a', 'accepted', 'x'), (2, 'b', 'accepted', 'x'), (3, 'c', 'rejected', 'x'),
                        (3, 'd', 'failed', 'x');
             DELETE FROM attempts WHERE token = 'c';
             UPDATE attempts SET state = 'abandoned' WHERE token = 'd';",
        )
        .unwrap();
    shard(&db, 2, 1, 0);
    assert_counts_match(&db);
    // The failed batch tried again (a new `submit`), done in release 2's embed run too.
    db.reset_failed_batches().unwrap();
    db.insert_job(&job(&[3, 7], 3, "gpu", "j4")).unwrap();
    run(&db, 3, "j4", 5, None);
    run(&db, 7, "j4", 7, None);
    shard(&db, 3, 0, 5);
    shard(&db, 7, 0, 7);
    db.set_batch_state(BatchId(3), BatchState::Done).unwrap();
    db.set_batch_state(BatchId(7), BatchState::Done).unwrap();
    db.set_job_state("j4", JobStatus::Completed, None).unwrap();
    assert_counts_match(&db);
    // Uploads into two collections, one moved to another key, one forgotten, a shard dropped.
    assert_eq!(db.all_shards().unwrap().len(), 6);
    let ids: Vec<i64> = {
        let mut stmt = db
            .conn()
            .prepare("SELECT id FROM shards ORDER BY id")
            .unwrap();
        let rows = stmt.query_map([], |r| r.get(0)).unwrap();
        rows.collect::<rusqlite::Result<_>>().unwrap()
    };
    for (i, id) in ids.iter().enumerate() {
        db.record_upload(*id, "papers@a", 3, (i % 2) as u64)
            .unwrap();
        db.record_upload(*id, "old@b", 1, 0).unwrap();
    }
    db.record_upload(ids[0], "papers@a", 2, 1).unwrap();
    assert_counts_match(&db);
    db.move_upload_progress("old@b", "new@b").unwrap();
    assert_counts_match(&db);
    db.forget_uploads("papers@a").unwrap();
    db.conn()
        .execute_batch(
            "DELETE FROM uploads WHERE shard_id IN (SELECT id FROM shards WHERE batch_id = 7);
             DELETE FROM shards WHERE batch_id = 7;
             UPDATE jobs SET queue = NULL WHERE name = 'j4';
             DELETE FROM jobs WHERE name = 'j3b';
             UPDATE quarantine SET reason = 'empty' WHERE reason = 'too_long';",
        )
        .unwrap();
    assert_counts_match(&db);
    // A corpus file moved to the other release takes its batches and their runs along;
    // a re-plan of a file deletes its batches (and their jobs).
    db.conn()
        .execute_batch(
            "UPDATE corpus_files SET release = 1 WHERE id = 2;
             INSERT INTO corpus_files (id, path, size, mtime_ns, edges, release) VALUES (3, 'e', 0, 0, '', 2);
             INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (8, 3, 1, 'b', 3, 9);",
        )
        .unwrap();
    assert_counts_match(&db);
    db.reset_file(3).unwrap();
    assert_counts_match(&db);
    let status = db.status().unwrap();
    assert_eq!(status.batches, 7);
    assert_eq!(status.batches_by_state["done"], 4);
    assert_eq!(status.jobs_by_queue["-"]["completed"], 2);
    assert_eq!(status.rows_in_shards, 3 + 1 + 3 + 5);
    assert_eq!(status.papers_quarantined, 3);
    assert_eq!(status.uploads_by_collection["new@b"].acked, 5);
    assert!(status.papers_per_second.is_some());
}

#[test]
fn an_older_run_db_is_counted_once_when_it_is_migrated() {
    let dir = tempfile::tempdir().unwrap();
    {
        let mut conn = rusqlite::Connection::open(dir.path().join("run.db")).unwrap();
        let tx = conn.transaction().unwrap();
        for sql in &crate::rundb::schema::MIGRATIONS[..11] {
            tx.execute_batch(sql).unwrap();
        }
        tx.execute_batch(
            "PRAGMA user_version = 11;
             INSERT INTO releases (id, started_at, planned_at, added, changed, withdrawn, unchanged)
                 VALUES (1, 'a', 'b', 8, 1, 0, 0);
             INSERT INTO corpus_files (id, path, size, mtime_ns, edges, state) VALUES (1, 'c', 0, 0, '', 'planned');
             INSERT INTO batches (id, file_id, seq, path, n_rows, n_excluded, n_chars, state)
                 VALUES (1, 1, 1, 'b', 4, 1, 10, 'done'), (2, 1, 2, 'b', 4, 0, 12, 'running'),
                        (3, 1, 3, 'b', 4, 0, 11, 'planned');
             INSERT INTO jobs (batch_id, attempt, backend, queue, state)
                 VALUES (1, 1, 'slurm', 'gpu', 'cancelled'), (1, 2, 'slurm', 'debug', 'completed'),
                        (2, 1, 'slurm', NULL, 'running');
             INSERT INTO batch_runs (batch_id, started_at, finished_at, devices, state, total_s, papers, tokens)
                 VALUES (1, '2027-01-01T00:00:00.000Z', '2027-01-01T00:00:30.500Z', 'cpu', 'done', 29.25, 3, 900),
                        (1, '2027-01-01T00:00:00.000Z', NULL, 'cpu', 'failed', NULL, NULL, NULL);
             INSERT INTO shards (batch_id, part, path, rows, sha256, created_at)
                 VALUES (1, 0, 's0', 2, 'x', 'now'), (1, 1, 's1', 1, 'x', 'now');
             INSERT INTO uploads (shard_id, collection, rows_acked, failed_rows) VALUES (1, 'p@t', 2, 0), (2, 'p@t', 0, 1);
             INSERT INTO attempts (batch_id, token, state, ingested_at) VALUES (1, 'a', 'accepted', 'x'), (1, 'b', 'failed', 'x');
             INSERT INTO quarantine (file_id, line, reason, detail) VALUES (1, 4, 'empty', '');",
        )
        .unwrap();
        tx.commit().unwrap();
    }
    let db = RunDb::create(dir.path()).unwrap();
    assert_eq!(
        db.schema_version().unwrap(),
        crate::rundb::schema::MIGRATIONS.len() as i64
    );
    assert_counts_match(&db);
    let status = db.status().unwrap();
    assert_eq!(status.papers_planned, 11);
    assert_eq!(status.jobs_by_queue["debug"]["completed"], 1);
    assert!(!status.jobs_by_queue.contains_key("gpu"));
    assert_eq!(status.tokens_embedded, 900);
    assert_eq!(status.uploads_by_collection["p@t"].failed, 1);
    assert_eq!(status.releases[0].embed_node_hours, 29.25 / 3600.0);
    // And kept from then on.
    db.set_batch_state(BatchId(3), BatchState::Done).unwrap();
    assert_counts_match(&db);
}

#[test]
fn the_recount_switch_makes_status_recount() {
    let (_dir, db) = db_with_batches(2);
    // A count put wrong by hand shows in `status`, and not in the recount it switches to.
    db.conn()
        .execute("UPDATE tally_batches SET batches = 5", [])
        .unwrap();
    assert_eq!(db.status().unwrap().batches, 5);
    assert_eq!(db.status_recounted().unwrap().batches, 2);
    std::env::set_var(STATUS_RECOUNT_ENV, "1");
    let recounted = db.status().unwrap().batches;
    std::env::remove_var(STATUS_RECOUNT_ENV);
    assert_eq!(recounted, 2);
}
