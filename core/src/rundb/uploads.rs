//! What the uploader records: per shard and progress key (a collection *at a target*, see
//! `embedfleet_vectordb::progress_key`), the rows Qdrant has acknowledged, and the shard's
//! sha256 when they were: a shard rewritten since has no progress.
//!
//! `uploads.rows_acked` is a prefix: the first `rows_acked` rows of the shard are durable in the
//! collection, so a re-run sends the shard from that row on. `failed_rows` counts the rows of
//! batches that failed after every retry in the last attempt; a re-run sends them again.

use super::error::{sqlite_err, Result};
use super::handle::RunDb;
use rusqlite::{params, OptionalExtension};

/// A shard of the run with its upload progress into one collection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadShard {
    /// `shards.id`.
    pub shard_id: i64,
    /// The batch the shard is part of.
    pub batch_id: i64,
    /// Relative to the run directory.
    pub path: String,
    /// Rows in the shard file.
    pub rows: u64,
    /// The first `rows_acked` rows are durable in the collection.
    pub rows_acked: u64,
    /// Rows of batches that failed in the last attempt.
    pub failed_rows: u64,
}

impl UploadShard {
    /// True when every row is acknowledged.
    pub fn is_done(&self) -> bool {
        self.rows_acked >= self.rows
    }
}

impl RunDb {
    /// Every shard of the run, in batch and part order, with its progress into `collection`.
    pub fn upload_shards(&self, collection: &str) -> Result<Vec<UploadShard>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT s.id, s.batch_id, s.path, s.rows, coalesce(u.rows_acked, 0), coalesce(u.failed_rows, 0)
                 FROM shards s LEFT JOIN uploads u ON u.shard_id = s.id AND u.collection = ?1
                     AND u.shard_sha256 = s.sha256
                 ORDER BY s.batch_id, s.part",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([collection], |r| {
            Ok(UploadShard {
                shard_id: r.get(0)?,
                batch_id: r.get(1)?,
                path: r.get(2)?,
                rows: r.get(3)?,
                rows_acked: r.get(4)?,
                failed_rows: r.get(5)?,
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// Records a shard's progress into `collection` (replacing what was recorded). Call it only
    /// after the sink's checkpoint made those rows durable.
    pub fn record_upload(
        &self,
        shard_id: i64,
        collection: &str,
        rows_acked: u64,
        failed_rows: u64,
    ) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO uploads (shard_id, collection, rows_acked, failed_rows, shard_sha256)
                 VALUES (?1, ?2, ?3, ?4, (SELECT sha256 FROM shards WHERE id = ?1))
                 ON CONFLICT (shard_id, collection) DO UPDATE
                 SET rows_acked = excluded.rows_acked, failed_rows = excluded.failed_rows,
                     shard_sha256 = excluded.shard_sha256",
                params![shard_id, collection, rows_acked, failed_rows],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// Indexes `papers.id` for [`RunDb::batch_path_of_paper`] (once; a no-op afterwards). Planning
    /// does not need the index, so it is made by the first lookup: without it each lookup scans
    /// every paper of the run (8.3 M rows for the full corpus).
    pub fn index_paper_ids(&self) -> Result<()> {
        self.conn
            .execute_batch("CREATE INDEX IF NOT EXISTS papers_by_id ON papers (id)")
            .map_err(sqlite_err(&self.dir))
    }

    /// The batch file (relative to the run directory) that holds the embedded copy of a paper.
    /// Call [`RunDb::index_paper_ids`] first when looking up more than a few.
    pub fn batch_path_of_paper(&self, paper_id: &str) -> Result<Option<String>> {
        self.conn
            .query_row(
                "SELECT b.path FROM papers p JOIN batches b ON b.id = p.batch_id
                 WHERE p.id = ?1 AND p.duplicate_of IS NULL LIMIT 1",
                [paper_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(sqlite_err(&self.dir))
    }

    /// The batch that holds the embedded copy of a paper (not a skipped duplicate): its live
    /// copy, or, when a later corpus release withdrew it, its newest.
    /// Call [`RunDb::index_paper_ids`] first when looking up more than a few.
    pub fn batch_of_paper(&self, paper_id: &str) -> Result<Option<i64>> {
        self.conn
            .query_row(
                "SELECT batch_id FROM papers WHERE id = ?1 AND duplicate_of IS NULL
                 ORDER BY superseded_in IS NOT NULL OR withdrawn_in IS NOT NULL, batch_id DESC LIMIT 1",
                [paper_id],
                |r| r.get(0),
            )
            .optional()
            .map_err(sqlite_err(&self.dir))
    }

    /// Forgets the progress recorded under `collection` (a collection found holding fewer points
    /// than that progress says: dropped, recreated, restored from an older snapshot).
    pub fn forget_uploads(&self, collection: &str) -> Result<()> {
        let err = sqlite_err(&self.dir);
        let tx = self.conn.unchecked_transaction().map_err(&err)?;
        for table in ["uploads", "upload_releases", "deletes_applied"] {
            tx.execute(
                &format!("DELETE FROM {table} WHERE collection = ?1"),
                [collection],
            )
            .map_err(&err)?;
        }
        tx.commit().map_err(&err)
    }

    /// Records that the collection under `collection` (a progress key) is brought up to the
    /// run's newest planned release, when it is: every shard's rows acknowledged and none
    /// failed. Call it at the end of an upload, whose check deleted every point a release
    /// withheld or a tombstone deleted. Returns the release recorded, if any.
    pub fn record_upload_release(&self, collection: &str) -> Result<Option<i64>> {
        let err = sqlite_err(&self.dir);
        let behind: u64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM shards s LEFT JOIN uploads u ON u.shard_id = s.id
                     AND u.collection = ?1 AND u.shard_sha256 = s.sha256
                 WHERE coalesce(u.rows_acked, 0) < s.rows OR coalesce(u.failed_rows, 0) > 0",
                [collection],
                |r| r.get(0),
            )
            .map_err(&err)?;
        let release: Option<i64> = self
            .conn
            .query_row(
                "SELECT max(id) FROM releases WHERE planned_at IS NOT NULL",
                [],
                |r| r.get(0),
            )
            .map_err(&err)?;
        let (0, Some(release)) = (behind, release) else {
            return Ok(None);
        };
        self.conn
            .execute(
                "INSERT INTO upload_releases (collection, release, recorded_at)
                 VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
                 ON CONFLICT (collection) DO UPDATE
                 SET release = excluded.release, recorded_at = excluded.recorded_at",
                params![collection, release],
            )
            .map_err(&err)?;
        self.record_deletes_applied(collection)?;
        Ok(Some(release))
    }

    /// Records that every tombstone of the run so far reached the collection under
    /// `collection` (a progress key): a `delete` to it, or a complete upload, deleted them.
    pub fn record_deletes_applied(&self, collection: &str) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO deletes_applied (collection, through, recorded_at)
                 SELECT ?1, coalesce(max(rowid), 0), strftime('%Y-%m-%dT%H:%M:%fZ', 'now')
                 FROM tombstones
                 WHERE true
                 ON CONFLICT (collection) DO UPDATE
                 SET through = excluded.through, recorded_at = excluded.recorded_at",
                [collection],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// The release the collection under `collection` was last brought up to
    /// ([`RunDb::record_upload_release`]); `None` when never (or before run.db recorded it).
    pub fn upload_release(&self, collection: &str) -> Result<Option<i64>> {
        self.conn
            .query_row(
                "SELECT release FROM upload_releases WHERE collection = ?1",
                [collection],
                |r| r.get(0),
            )
            .optional()
            .map_err(sqlite_err(&self.dir))
    }

    /// The identity marker of the collection the run uploaded into under `collection`
    /// (`name@target`), if it recorded one.
    pub fn upload_marker(&self, collection: &str) -> Result<Option<String>> {
        self.conn
            .query_row(
                "SELECT marker FROM upload_collections WHERE collection = ?1",
                [collection],
                |r| r.get(0),
            )
            .optional()
            .map_err(sqlite_err(&self.dir))
    }

    /// Records which collection (by its marker) the progress under `collection` is about.
    pub fn record_upload_marker(&self, collection: &str, marker: &str) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO upload_collections (collection, marker, recorded_at)
                 VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
                 ON CONFLICT (collection) DO UPDATE
                 SET marker = excluded.marker, recorded_at = excluded.recorded_at",
                params![collection, marker],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }
    /// The progress key other than `except` under which the run recorded `marker`: the same
    /// collection, reached before by another path or URL. The latest recorded when several are.
    pub fn upload_key_with_marker(&self, marker: &str, except: &str) -> Result<Option<String>> {
        self.conn
            .query_row(
                "SELECT collection FROM upload_collections WHERE marker = ?1 AND collection <> ?2
                 ORDER BY recorded_at DESC LIMIT 1",
                params![marker, except],
                |r| r.get(0),
            )
            .optional()
            .map_err(sqlite_err(&self.dir))
    }

    /// Moves what the run recorded of a collection under the progress key `from` (upload
    /// progress, snapshot-load steps, identity marker) to `to`, replacing what `to` had, in one
    /// transaction: the collection is reached by `to` now.
    pub fn move_upload_progress(&self, from: &str, to: &str) -> Result<()> {
        let err = sqlite_err(&self.dir);
        let tx = self.conn.unchecked_transaction().map_err(&err)?;
        for table in [
            "uploads",
            "snapshot_loads",
            "upload_collections",
            "upload_releases",
            "deletes_applied",
        ] {
            tx.execute(&format!("DELETE FROM {table} WHERE collection = ?1"), [to])
                .map_err(&err)?;
            tx.execute(
                &format!("UPDATE {table} SET collection = ?2 WHERE collection = ?1"),
                [from, to],
            )
            .map_err(&err)?;
        }
        tx.commit().map_err(&err)
    }

    /// Rows acknowledged and rows failed into `collection`, over every shard.
    pub fn upload_totals(&self, collection: &str) -> Result<(u64, u64)> {
        self.conn
            .query_row(
                "SELECT coalesce(sum(rows_acked), 0), coalesce(sum(failed_rows), 0)
                 FROM uploads WHERE collection = ?1",
                [collection],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(sqlite_err(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundb::ShardRow;

    fn run_with_shards(dir: &std::path::Path) -> RunDb {
        let db = RunDb::create(dir).unwrap();
        db.conn()
            .execute_batch(
                "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 1, 1, 'e');
                 INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (1, 1, 0, 'b', 30, 1);",
            )
            .unwrap();
        for part in 0..2 {
            db.record_shard(&ShardRow {
                batch_id: crate::BatchId(1),
                part,
                path: format!("shards/p{part}.parquet"),
                rows: 10 + u64::from(part) * 10,
                sha256: "x".into(),
            })
            .unwrap();
        }
        db
    }

    #[test]
    fn progress_is_per_collection_and_replaced_on_record() {
        let dir = tempfile::tempdir().unwrap();
        let db = run_with_shards(dir.path());
        let shards = db.upload_shards("papers").unwrap();
        assert_eq!(shards.len(), 2);
        assert!(shards.iter().all(|s| s.rows_acked == 0 && !s.is_done()));
        db.record_upload(shards[0].shard_id, "papers", 4, 6)
            .unwrap();
        db.record_upload(shards[0].shard_id, "papers", 10, 0)
            .unwrap();
        db.record_upload(shards[1].shard_id, "other", 20, 0)
            .unwrap();
        let shards = db.upload_shards("papers").unwrap();
        assert!(shards[0].is_done());
        assert_eq!((shards[1].rows_acked, shards[1].failed_rows), (0, 0));
        assert_eq!(db.upload_totals("papers").unwrap(), (10, 0));
        assert_eq!(db.upload_totals("other").unwrap(), (20, 0));
        let status = db.status().unwrap();
        let papers = &status.uploads_by_collection["papers"];
        assert_eq!((papers.acked, papers.failed, papers.missing), (10, 0, 20));
    }

    #[test]
    fn progress_follows_its_collections_marker_to_a_new_key() {
        let dir = tempfile::tempdir().unwrap();
        let db = run_with_shards(dir.path());
        let shards = db.upload_shards("p@old").unwrap();
        db.record_upload(shards[0].shard_id, "p@old", 10, 0)
            .unwrap();
        db.record_upload_marker("p@old", "m1").unwrap();
        // The new key had progress of another collection: replaced, not added to.
        db.record_upload(shards[1].shard_id, "p@new", 5, 0).unwrap();
        db.record_upload_marker("p@new", "m2").unwrap();
        assert_eq!(db.upload_key_with_marker("m1", "p@old").unwrap(), None);
        let from = db.upload_key_with_marker("m1", "p@new").unwrap();
        assert_eq!(from.as_deref(), Some("p@old"));
        db.move_upload_progress("p@old", "p@new").unwrap();
        assert_eq!(db.upload_totals("p@new").unwrap(), (10, 0));
        assert_eq!(db.upload_totals("p@old").unwrap(), (0, 0));
        assert_eq!(db.upload_marker("p@new").unwrap().as_deref(), Some("m1"));
        assert_eq!(db.upload_marker("p@old").unwrap(), None);
        let status = db.status().unwrap();
        assert_eq!(
            status.uploads_by_collection.keys().collect::<Vec<_>>(),
            ["p@new"],
            "no stale line for the old key"
        );
    }

    #[test]
    fn paper_lookup_finds_the_batch_and_uses_the_id_index_once_made() {
        let dir = tempfile::tempdir().unwrap();
        let db = run_with_shards(dir.path());
        db.conn()
            .execute_batch(
                "INSERT INTO papers (id, batch_id, row, line, n_chars) VALUES ('W1', 1, 0, 1, 5);
                 INSERT INTO papers (id, batch_id, row, line, n_chars, duplicate_of)
                     VALUES ('W2', 1, 1, 2, 5, 'c:1');",
            )
            .unwrap();
        let plan = |db: &RunDb| -> String {
            db.conn()
                .query_row(
                    "EXPLAIN QUERY PLAN SELECT batch_id FROM papers WHERE id = 'W1'",
                    [],
                    |r| r.get::<_, String>(3),
                )
                .unwrap()
        };
        assert!(plan(&db).starts_with("SCAN"), "{}", plan(&db));
        db.index_paper_ids().unwrap();
        db.index_paper_ids().unwrap(); // idempotent
        assert!(plan(&db).contains("papers_by_id"), "{}", plan(&db));
        assert_eq!(db.batch_path_of_paper("W1").unwrap().as_deref(), Some("b"));
        assert_eq!(
            db.batch_path_of_paper("W2").unwrap(),
            None,
            "a skipped duplicate"
        );
        assert_eq!(db.batch_path_of_paper("W3").unwrap(), None);
        assert_eq!(db.batch_of_paper("W1").unwrap(), Some(1));
        assert_eq!(
            db.batch_of_paper("W2").unwrap(),
            None,
            "a skipped duplicate"
        );
    }
}
