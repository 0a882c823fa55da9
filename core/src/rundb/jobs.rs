//! What an embed job records: batch state, finished shards, and the timing of each run.

use super::{sqlite_err, Result, RunDb};
use crate::settings::PlanSettings;
use rusqlite::{params, OptionalExtension};
use serde::{Deserialize, Serialize};

/// A planned batch, as the embed job needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRow {
    pub id: i64,
    /// Relative to the run directory.
    pub path: String,
    pub n_rows: u64,
    pub n_excluded: u64,
    pub state: String,
}

/// A shard recorded in run.db.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardRow {
    pub batch_id: i64,
    pub part: u32,
    pub path: String,
    pub rows: u64,
    pub sha256: String,
}

/// The study's per-batch breakdown and what the job had to do to finish.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BatchTimings {
    pub model_load_s: f64,
    /// Reading the batch file and writing shards.
    pub io_s: f64,
    pub tokenize_s: f64,
    pub inference_s: f64,
    pub total_s: f64,
    pub papers: u64,
    pub tokens: u64,
    /// Tokens a padded forward would have spent on padding (the model itself packs).
    pub padding_tokens: u64,
    /// Mini-batches split in halves after an out-of-memory.
    pub fallback_split: u64,
    /// Papers embedded alone after an out-of-memory.
    pub fallback_sequential: u64,
    /// Papers embedded in chunks because even alone they did not fit.
    pub fallback_chunked: u64,
    /// Papers longer than the context, embedded in chunks.
    pub long_chunked: u64,
    pub peak_memory_bytes: Option<u64>,
}

impl RunDb {
    pub fn plan_settings(&self) -> Result<Option<PlanSettings>> {
        self.setting("plan")
    }

    pub fn batch(&self, id: i64) -> Result<Option<BatchRow>> {
        self.conn
            .query_row(
                "SELECT id, path, n_rows, n_excluded, state FROM batches WHERE id = ?1",
                [id],
                |r| {
                    Ok(BatchRow {
                        id: r.get(0)?,
                        path: r.get(1)?,
                        n_rows: r.get(2)?,
                        n_excluded: r.get(3)?,
                        state: r.get(4)?,
                    })
                },
            )
            .optional()
            .map_err(sqlite_err(&self.dir))
    }

    /// Batches in a state, in id order.
    pub fn batch_ids(&self, state: &str) -> Result<Vec<i64>> {
        let mut stmt = self
            .conn
            .prepare("SELECT id FROM batches WHERE state = ?1 ORDER BY id")
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt
            .query_map([state], |r| r.get(0))
            .and_then(|r| r.collect::<rusqlite::Result<Vec<i64>>>());
        rows.map_err(sqlite_err(&self.dir))
    }

    pub fn set_batch_state(&self, id: i64, state: &str) -> Result<()> {
        self.conn
            .execute(
                "UPDATE batches SET state = ?2 WHERE id = ?1",
                params![id, state],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    pub fn shards_of(&self, batch_id: i64) -> Result<Vec<ShardRow>> {
        self.query_shards("WHERE batch_id = ?1 ORDER BY part", [batch_id])
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

    /// Quarantines papers of a batch that could not be embedded (replacing what an earlier run
    /// of the batch recorded for them).
    pub fn record_embed_failures(&self, batch_id: i64, failed: &[(String, String)]) -> Result<()> {
        let reason = crate::quarantine::QuarantineReason::EmbedFailed.as_str();
        for (id, why) in failed {
            self.conn
                .execute(
                    "DELETE FROM quarantine WHERE reason = ?1 AND paper_id = ?2",
                    params![reason, id],
                )
                .map_err(sqlite_err(&self.dir))?;
            self.conn
                .execute(
                    "INSERT INTO quarantine (file_id, line, reason, detail, paper_id)
                     SELECT b.file_id, p.line, ?1, ?2, p.id FROM papers p JOIN batches b ON b.id = p.batch_id
                     WHERE p.batch_id = ?3 AND p.id = ?4 AND p.duplicate_of IS NULL LIMIT 1",
                    params![reason, why, batch_id, id],
                )
                .map_err(sqlite_err(&self.dir))?;
        }
        Ok(())
    }

    /// Starts a run of a batch; returns its id for [`RunDb::finish_batch_run`].
    pub fn start_batch_run(&self, batch_id: i64, devices: &str) -> Result<i64> {
        self.conn
            .execute(
                "INSERT INTO batch_runs (batch_id, started_at, devices, state)
                 VALUES (?1, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), ?2, 'running')",
                params![batch_id, devices],
            )
            .map_err(sqlite_err(&self.dir))?;
        Ok(self.conn.last_insert_rowid())
    }

    pub fn finish_batch_run(
        &self,
        run_id: i64,
        t: &BatchTimings,
        error: Option<&str>,
    ) -> Result<()> {
        self.conn
            .execute(
                "UPDATE batch_runs SET finished_at = strftime('%Y-%m-%dT%H:%M:%fZ', 'now'), state = ?2, error = ?3,
                     model_load_s = ?4, io_s = ?5, tokenize_s = ?6, inference_s = ?7, total_s = ?8, papers = ?9,
                     tokens = ?10, padding_tokens = ?11, fallback_split = ?12, fallback_sequential = ?13,
                     fallback_chunked = ?14, long_chunked = ?15, peak_memory_bytes = ?16
                 WHERE id = ?1",
                params![
                    run_id,
                    if error.is_some() { "failed" } else { "done" },
                    error,
                    t.model_load_s,
                    t.io_s,
                    t.tokenize_s,
                    t.inference_s,
                    t.total_s,
                    t.papers,
                    t.tokens,
                    t.padding_tokens,
                    t.fallback_split,
                    t.fallback_sequential,
                    t.fallback_chunked,
                    t.long_chunked,
                    t.peak_memory_bytes
                ],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// The timings of every finished run, in batch order (for `report`).
    pub fn finished_runs(&self) -> Result<Vec<(i64, BatchTimings)>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT batch_id, model_load_s, io_s, tokenize_s, inference_s, total_s, papers, tokens, padding_tokens,
                        fallback_split, fallback_sequential, fallback_chunked, long_chunked, peak_memory_bytes
                 FROM batch_runs WHERE state = 'done' ORDER BY batch_id, id",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get(0)?,
                BatchTimings {
                    model_load_s: r.get(1)?,
                    io_s: r.get(2)?,
                    tokenize_s: r.get(3)?,
                    inference_s: r.get(4)?,
                    total_s: r.get(5)?,
                    papers: r.get(6)?,
                    tokens: r.get(7)?,
                    padding_tokens: r.get(8)?,
                    fallback_split: r.get(9)?,
                    fallback_sequential: r.get(10)?,
                    fallback_chunked: r.get(11)?,
                    long_chunked: r.get(12)?,
                    peak_memory_bytes: r.get(13)?,
                },
            ))
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }
}
