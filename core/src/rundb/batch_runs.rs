//! The `batch_runs` table: one row per embed-job run of a batch, with the study's timing
//! breakdown (written by the embed job, read back by `embedfleet report`).

use super::error::{sqlite_err, Result};
use super::handle::RunDb;
pub use crate::handoff::BatchTimings;
use crate::state::BatchRunState;
use crate::BatchId;
use rusqlite::params;

/// One finished run of a batch: when and where it ran, and its timings.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRunRecord {
    pub run_id: i64,
    pub batch_id: i64,
    /// Unix seconds (UTC), from run.db's ISO timestamps.
    pub started_unix_s: f64,
    pub finished_unix_s: f64,
    pub devices: String,
    pub timings: BatchTimings,
}

impl RunDb {
    /// Records an attempt's run of a batch as its result manifest tells it: the scheduler job's
    /// name (run.db's, when the manifest has it), when it started and ended (unix seconds),
    /// where, its timings, and its error if it failed.
    #[allow(clippy::too_many_arguments)]
    pub fn record_batch_run(
        &self,
        batch_id: BatchId,
        job: Option<&str>,
        started_unix_s: f64,
        finished_unix_s: f64,
        devices: &str,
        t: &BatchTimings,
        error: Option<&str>,
    ) -> Result<()> {
        let state = match error {
            Some(_) => BatchRunState::Failed,
            None => BatchRunState::Done,
        };
        self.conn
            .execute(
                "INSERT INTO batch_runs (batch_id, started_at, finished_at, devices, state, error,
                     model_load_s, io_s, tokenize_s, inference_s, total_s, papers, tokens,
                     padding_tokens, fallback_split, fallback_sequential, fallback_chunked,
                     long_chunked, peak_memory_bytes, job)
                 VALUES (?1, strftime('%Y-%m-%dT%H:%M:%fZ', ?2, 'unixepoch'),
                     strftime('%Y-%m-%dT%H:%M:%fZ', ?3, 'unixepoch'), ?4, ?5, ?6, ?7, ?8, ?9,
                     ?10, ?11, ?12, ?13, ?14, ?15, ?16, ?17, ?18, ?19, ?20)",
                params![
                    batch_id,
                    started_unix_s,
                    finished_unix_s,
                    devices,
                    state.as_str(),
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
                    t.peak_memory_bytes,
                    job
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

    /// The latest successful run of every batch, in batch order. A batch embedded in several
    /// runs (a job killed and run again) counts once, by its last complete run.
    pub fn latest_batch_runs(&self) -> Result<Vec<BatchRunRecord>> {
        // julianday() parses the ISO timestamps; 2440587.5 is the Julian day of the Unix epoch.
        let mut stmt = self
            .conn
            .prepare(
                "SELECT r.id, r.batch_id,
                        (julianday(r.started_at) - 2440587.5) * 86400.0,
                        (julianday(r.finished_at) - 2440587.5) * 86400.0,
                        r.devices, r.model_load_s, r.io_s, r.tokenize_s, r.inference_s, r.total_s,
                        r.papers, r.tokens, r.padding_tokens, r.fallback_split,
                        r.fallback_sequential, r.fallback_chunked, r.long_chunked,
                        r.peak_memory_bytes
                 FROM batch_runs r
                 WHERE r.state = 'done' AND r.finished_at IS NOT NULL
                   AND r.id = (SELECT max(id) FROM batch_runs
                               WHERE batch_id = r.batch_id AND state = 'done')
                 ORDER BY r.batch_id",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| {
            let opt_f = |i| r.get::<_, Option<f64>>(i).map(Option::unwrap_or_default);
            let opt_u = |i| r.get::<_, Option<u64>>(i).map(Option::unwrap_or_default);
            Ok(BatchRunRecord {
                run_id: r.get(0)?,
                batch_id: r.get(1)?,
                started_unix_s: r.get(2)?,
                finished_unix_s: r.get(3)?,
                devices: r.get(4)?,
                timings: BatchTimings {
                    model_load_s: opt_f(5)?,
                    io_s: opt_f(6)?,
                    tokenize_s: opt_f(7)?,
                    inference_s: opt_f(8)?,
                    total_s: opt_f(9)?,
                    papers: opt_u(10)?,
                    tokens: opt_u(11)?,
                    padding_tokens: opt_u(12)?,
                    fallback_split: opt_u(13)?,
                    fallback_sequential: opt_u(14)?,
                    fallback_chunked: opt_u(15)?,
                    long_chunked: opt_u(16)?,
                    peak_memory_bytes: r.get(17)?,
                },
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latest_done_run_of_each_batch_with_unix_times() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        db.conn
            .execute_batch(
                "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 0, 0, '');
                 INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES
                     (1, 1, 0, 'b1', 1, 1), (2, 1, 1, 'b2', 1, 1), (3, 1, 2, 'b3', 1, 1);
                 INSERT INTO batch_runs (batch_id, started_at, finished_at, devices, state, total_s, papers) VALUES
                     (1, '1970-01-01T00:00:10.000Z', '1970-01-01T00:00:20.500Z', 'Cpu', 'done', 10.5, 7),
                     (1, '1970-01-01T00:01:00.000Z', '1970-01-01T00:01:30.000Z', 'Cpu', 'done', 30.0, 9),
                     (1, '1970-01-01T00:02:00.000Z', NULL, 'Cpu', 'running', NULL, NULL),
                     (2, '1970-01-01T00:00:00.000Z', '1970-01-01T00:00:01.000Z', 'Cpu', 'failed', 1.0, 0),
                     (3, '1970-01-01T00:00:00.000Z', '1970-01-01T00:00:02.000Z', 'Cpu,Cpu', 'done', 2.0, 3);",
            )
            .unwrap();
        let runs = db.latest_batch_runs().unwrap();
        let ids: Vec<(i64, u64)> = runs
            .iter()
            .map(|r| (r.batch_id, r.timings.papers))
            .collect();
        assert_eq!(ids, vec![(1, 9), (3, 3)]);
        assert!((runs[0].started_unix_s - 60.0).abs() < 1e-3, "{runs:?}");
        assert!((runs[0].finished_unix_s - 90.0).abs() < 1e-3, "{runs:?}");
        assert_eq!(runs[1].devices, "Cpu,Cpu");
        assert_eq!(runs[1].timings.peak_memory_bytes, None);
    }
}
