//! Papers deleted from the run, and the identity of the collections the run uploaded into.
//!
//! **Tombstones.** `embedfleet delete` records each paper here *before* it deletes the point
//! from Qdrant, so a kill between the two leaves a tombstone whose point is still there: the
//! next `upload` (its per-batch count finds one point too many) or `delete` removes it. Every
//! later stage respects them: `upload` never sends a tombstoned row, `build-shard` leaves it out
//! of a built shard, `publish` out of the dataset. Tombstones are the run's, not a collection's:
//! a deleted paper is deleted from everything the run makes.
//!
//! **Collection markers.** `upload_collections` holds, per collection at a target (`name@target`,
//! the key of `uploads`), the identity marker embedfleet generated and stored in that collection
//! when it first uploaded into it. Progress recorded under the key is about that collection only:
//! one found with another marker (or none) is not the one the progress is about.

use super::error::{sqlite_err, Result};
use super::handle::RunDb;
use rusqlite::params;

/// A paper deleted from the run, with the batch that holds its embedded copy.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct Tombstone {
    /// The batch (its shard key in a snapshot-loaded collection).
    pub batch_id: i64,
    /// The corpus's `id` of the paper.
    pub paper_id: String,
}

impl RunDb {
    /// Records papers as deleted, in one transaction; a paper deleted before keeps its first
    /// record. Returns how many were new.
    pub fn record_tombstones(&self, papers: &[Tombstone]) -> Result<usize> {
        let err = sqlite_err(&self.dir);
        let tx = self.conn.unchecked_transaction().map_err(&err)?;
        let mut new = 0;
        {
            let mut insert = tx
                .prepare(
                    "INSERT OR IGNORE INTO tombstones (paper_id, batch_id, deleted_at)
                     VALUES (?1, ?2, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))",
                )
                .map_err(&err)?;
            for t in papers {
                new += insert
                    .execute(params![t.paper_id, t.batch_id])
                    .map_err(&err)?;
            }
        }
        tx.commit().map_err(&err)?;
        Ok(new)
    }

    /// Every tombstone of the run, in batch and paper order.
    pub fn tombstones(&self) -> Result<Vec<Tombstone>> {
        let mut stmt = self
            .conn
            .prepare("SELECT batch_id, paper_id FROM tombstones ORDER BY batch_id, paper_id")
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| {
            Ok(Tombstone {
                batch_id: r.get(0)?,
                paper_id: r.get(1)?,
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// The tombstones whose delete reached the collection under `collection` (a progress key):
    /// those recorded up to its `deletes_applied` mark (see [`RunDb::record_deletes_applied`]),
    /// in batch and paper order. A paper deleted from another database only is still in it.
    pub fn tombstones_applied_to(&self, collection: &str) -> Result<Vec<Tombstone>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT batch_id, paper_id FROM tombstones WHERE rowid <=
                     coalesce((SELECT through FROM deletes_applied WHERE collection = ?1), 0)
                 ORDER BY batch_id, paper_id",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([collection], |r| {
            Ok(Tombstone {
                batch_id: r.get(0)?,
                paper_id: r.get(1)?,
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// Forgets the upload progress of one batch's shards under `collection` (`name@target`): the
    /// collection was found holding fewer of its points than recorded, so it is sent again.
    pub fn forget_batch_uploads(&self, collection: &str, batch_id: i64) -> Result<()> {
        self.conn
            .execute(
                "DELETE FROM uploads WHERE collection = ?1
                     AND shard_id IN (SELECT id FROM shards WHERE batch_id = ?2)",
                params![collection, batch_id],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundb::test_support::db_with_batches;

    #[test]
    fn a_tombstone_is_recorded_once_and_read_back_by_batch() {
        let (_dir, db) = db_with_batches(2);
        let t = |batch_id, paper: &str| Tombstone {
            batch_id,
            paper_id: paper.to_owned(),
        };
        assert_eq!(db.record_tombstones(&[t(2, "W9"), t(1, "W1")]).unwrap(), 2);
        assert_eq!(db.record_tombstones(&[t(1, "W1"), t(1, "W2")]).unwrap(), 1);
        assert_eq!(
            db.tombstones().unwrap(),
            [t(1, "W1"), t(1, "W2"), t(2, "W9")]
        );
    }

    #[test]
    fn a_collection_marker_is_replaced_and_a_batch_progress_forgotten_alone() {
        let (_dir, db) = db_with_batches(2);
        assert_eq!(db.upload_marker("papers@edge:/q").unwrap(), None);
        db.record_upload_marker("papers@edge:/q", "m1").unwrap();
        db.record_upload_marker("papers@edge:/q", "m2").unwrap();
        assert_eq!(
            db.upload_marker("papers@edge:/q").unwrap().as_deref(),
            Some("m2")
        );
        for batch in [1, 2] {
            db.record_shard(&crate::rundb::ShardRow {
                batch_id: crate::BatchId(batch),
                part: 0,
                path: format!("shards/b{batch}.parquet"),
                rows: 5,
                sha256: "x".into(),
            })
            .unwrap();
        }
        for s in db.upload_shards("papers@edge:/q").unwrap() {
            db.record_upload(s.shard_id, "papers@edge:/q", 5, 0)
                .unwrap();
        }
        db.forget_batch_uploads("papers@edge:/q", 1).unwrap();
        let acked: Vec<(i64, u64)> = db
            .upload_shards("papers@edge:/q")
            .unwrap()
            .iter()
            .map(|s| (s.batch_id, s.rows_acked))
            .collect();
        assert_eq!(acked, [(1, 0), (2, 5)]);
    }
}
