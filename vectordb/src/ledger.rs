//! What a send acknowledged, failed and recorded: per shard, the acknowledged prefix (the rows
//! a re-run skips), batches acknowledged beyond a gap, and failed rows; recorded in run.db only
//! after the sink's checkpoint made them durable.

use std::time::Duration;

use embedfleet_core::rundb::{RunDb, UploadShard};

use crate::error::UploadRunError;
use crate::prepared::progress_key;
use crate::sink::Sink;

/// What one [`send`](crate::send) did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SendReport {
    /// Points acknowledged now.
    pub points: u64,
    /// Points in batches that failed after every retry (or in shards that could not be read).
    pub failed_points: u64,
    /// Bytes of vectors acknowledged now.
    pub vector_bytes: u64,
    /// Wall time of sending.
    pub elapsed: Duration,
    /// The first distinct errors (at most 5).
    pub errors: Vec<String>,
}

impl SendReport {
    /// Points per second.
    pub fn points_per_s(&self) -> f64 {
        self.points as f64 / self.elapsed.as_secs_f64().max(1e-9)
    }
}

/// Per shard: the acknowledged prefix, the batches acknowledged beyond a gap, failed rows.
struct ShardLedger {
    shard_id: i64,
    rows: u64,
    /// Rows `0..prefix` are acknowledged.
    prefix: u64,
    /// Acknowledged batches after a gap: start -> len.
    ahead: std::collections::BTreeMap<u64, u64>,
    failed: u64,
    /// Changed since the last record.
    dirty: bool,
}

pub(crate) struct Ledger {
    shards: Vec<ShardLedger>,
    dim: usize,
    pub(crate) report: SendReport,
}

impl Ledger {
    pub(crate) fn new(todo: &[UploadShard], dim: usize) -> Self {
        let shards = todo
            .iter()
            .map(|s| ShardLedger {
                shard_id: s.shard_id,
                rows: s.rows,
                prefix: s.rows_acked,
                ahead: Default::default(),
                failed: 0,
                // A shard that failed before is recorded again even if nothing fails now.
                dirty: s.failed_rows > 0,
            })
            .collect();
        Self {
            shards,
            dim,
            report: SendReport::default(),
        }
    }

    /// Rows `start..start + len` are done: acknowledged, or (`skipped` of them) tombstoned.
    pub(crate) fn acked(&mut self, shard: usize, start: u64, len: u64, skipped: u64) {
        let sent = len - skipped;
        self.report.points += sent;
        self.report.vector_bytes += sent * self.dim as u64 * 4;
        let s = &mut self.shards[shard];
        s.ahead.insert(start, len);
        while let Some(len) = s.ahead.remove(&s.prefix) {
            s.prefix += len;
        }
        s.dirty = true;
    }

    pub(crate) fn failed(&mut self, shard: usize, len: u64, error: &str) {
        self.report.failed_points += len;
        self.note(error);
        let s = &mut self.shards[shard];
        s.failed += len;
        s.dirty = true;
    }

    pub(crate) fn unreadable(&mut self, shard: usize, from: u64, error: &str) {
        let s = &mut self.shards[shard];
        let lost = s.rows.saturating_sub(from);
        s.failed += lost;
        s.dirty = true;
        self.report.failed_points += lost;
        self.note(error);
    }

    fn note(&mut self, error: &str) {
        if self.report.errors.len() < 5 && !self.report.errors.iter().any(|e| e == error) {
            tracing::warn!("{error}");
            self.report.errors.push(error.to_owned());
        }
    }

    /// Makes the acknowledged upserts durable, then records every changed shard.
    pub(crate) fn checkpoint(
        &mut self,
        sink: &dyn Sink,
        db: &RunDb,
        collection: &str,
    ) -> Result<(), UploadRunError> {
        if !self.shards.iter().any(|s| s.dirty) {
            return Ok(());
        }
        sink.checkpoint(collection)?;
        // The points are durable in the collection and run.db does not know yet: a re-run
        // sends them again, idempotently.
        embedfleet_core::rundb::test_kill_point("upload_checkpoint");
        let key = progress_key(sink, collection);
        for s in self.shards.iter_mut().filter(|s| s.dirty) {
            db.record_upload(s.shard_id, &key, s.prefix.min(s.rows), s.failed)?;
            s.dirty = false;
        }
        Ok(())
    }
}
