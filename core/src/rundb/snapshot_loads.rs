//! The `snapshot_loads` table: how far a snapshot load got with each batch (see
//! `embedfleet_vectordb::snapshot`). One row per collection (at its target) and batch.

use super::error::{sqlite_err, Result};
use super::handle::RunDb;
use rusqlite::params;

/// How far a batch of a snapshot load got.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SnapshotStep {
    /// Its shard key exists (with `shard_id`).
    Key,
    /// Its snapshot was recovered into the key's shard.
    Recovered,
    /// Its count (and the sample searches) matched after the load.
    Verified,
}

impl SnapshotStep {
    pub fn as_str(self) -> &'static str {
        match self {
            SnapshotStep::Key => "key",
            SnapshotStep::Recovered => "recovered",
            SnapshotStep::Verified => "verified",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        match s {
            "key" => Some(SnapshotStep::Key),
            "recovered" => Some(SnapshotStep::Recovered),
            "verified" => Some(SnapshotStep::Verified),
            _ => None,
        }
    }
}

/// One batch of a snapshot load.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotLoadRow {
    pub batch_id: i64,
    pub shard_key: String,
    pub shard_id: Option<u32>,
    /// The snapshot recovered (set from `Recovered` on).
    pub snapshot_sha256: Option<String>,
    pub points: Option<u64>,
    pub step: SnapshotStep,
}

impl RunDb {
    /// Every batch recorded for `collection` (a `name@target` key), in batch order.
    pub fn snapshot_loads(&self, collection: &str) -> Result<Vec<SnapshotLoadRow>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT batch_id, shard_key, shard_id, snapshot_sha256, points, step
                 FROM snapshot_loads WHERE collection = ?1 ORDER BY batch_id",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([collection], |r| {
            let step: String = r.get(5)?;
            Ok(SnapshotLoadRow {
                batch_id: r.get(0)?,
                shard_key: r.get(1)?,
                shard_id: r.get(2)?,
                snapshot_sha256: r.get(3)?,
                points: r.get(4)?,
                // An unknown step (a newer embedfleet's) counts as nothing done.
                step: SnapshotStep::parse(&step).unwrap_or(SnapshotStep::Key),
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// Records (replacing) how far `row.batch_id` got in `collection`.
    pub fn record_snapshot_load(&self, collection: &str, row: &SnapshotLoadRow) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO snapshot_loads
                     (collection, batch_id, shard_key, shard_id, snapshot_sha256, points, step, updated_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
                 ON CONFLICT (collection, batch_id) DO UPDATE SET shard_key = excluded.shard_key,
                     shard_id = excluded.shard_id, snapshot_sha256 = excluded.snapshot_sha256,
                     points = excluded.points, step = excluded.step, updated_at = excluded.updated_at",
                params![
                    collection,
                    row.batch_id,
                    row.shard_key,
                    row.shard_id,
                    row.snapshot_sha256,
                    row.points,
                    row.step.as_str()
                ],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// Forgets the snapshot load into `collection` (the collection was dropped or replaced).
    pub fn forget_snapshot_loads(&self, collection: &str) -> Result<()> {
        self.conn
            .execute(
                "DELETE FROM snapshot_loads WHERE collection = ?1",
                [collection],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_step_is_replaced_and_loads_are_per_collection() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        db.conn()
            .execute_batch(
                "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 1, 1, 'e');
                 INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (1, 1, 0, 'b', 3, 1);",
            )
            .unwrap();
        let mut row = SnapshotLoadRow {
            batch_id: 1,
            shard_key: "b1".into(),
            shard_id: Some(4),
            snapshot_sha256: None,
            points: None,
            step: SnapshotStep::Key,
        };
        db.record_snapshot_load("papers@server:x", &row).unwrap();
        row.step = SnapshotStep::Recovered;
        row.snapshot_sha256 = Some("ab".into());
        row.points = Some(3);
        db.record_snapshot_load("papers@server:x", &row).unwrap();
        assert_eq!(db.snapshot_loads("papers@server:x").unwrap(), [row.clone()]);
        assert!(db.snapshot_loads("other@server:x").unwrap().is_empty());
        db.forget_snapshot_loads("papers@server:x").unwrap();
        assert!(db.snapshot_loads("papers@server:x").unwrap().is_empty());
    }
}
