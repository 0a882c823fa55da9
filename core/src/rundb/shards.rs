//! The `shards` table: the parquet shards an embed job made durable, one per part of a batch.

use super::error::{sqlite_err, Result};
use super::handle::RunDb;
use crate::BatchId;
use rusqlite::params;

/// A shard recorded in run.db.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRow {
    pub batch_id: BatchId,
    pub part: u32,
    pub path: String,
    pub rows: u64,
    pub sha256: String,
}

impl RunDb {
    pub fn shards_of(&self, batch_id: BatchId) -> Result<Vec<ShardRow>> {
        self.query_shards("WHERE batch_id = ?1 ORDER BY part", [batch_id])
    }

    /// True when any result of the run was taken in (a shard recorded).
    pub fn has_shards(&self) -> Result<bool> {
        self.conn
            .query_row("SELECT EXISTS (SELECT 1 FROM shards)", [], |r| r.get(0))
            .map_err(sqlite_err(&self.dir))
    }

    /// Every shard of the run, in batch and part order.
    pub fn all_shards(&self) -> Result<Vec<ShardRow>> {
        self.query_shards("ORDER BY batch_id, part", [])
    }

    fn query_shards(&self, tail: &str, params: impl rusqlite::Params) -> Result<Vec<ShardRow>> {
        let sql = format!("SELECT batch_id, part, path, rows, sha256 FROM shards {tail}");
        let mut stmt = self.conn.prepare(&sql).map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map(params, |r| {
            Ok(ShardRow {
                batch_id: r.get(0)?,
                part: r.get(1)?,
                path: r.get(2)?,
                rows: r.get(3)?,
                sha256: r.get(4)?,
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// Records a durable shard. Recording the same part again replaces it (a re-run that found
    /// the file but not the row).
    pub fn record_shard(&self, shard: &ShardRow) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO shards (batch_id, part, path, rows, sha256, created_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
                 ON CONFLICT (batch_id, part) DO UPDATE SET path = excluded.path, rows = excluded.rows,
                     sha256 = excluded.sha256, created_at = excluded.created_at",
                params![shard.batch_id, shard.part, shard.path, shard.rows, shard.sha256],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }
}
