//! The `batches` table: one row per planned batch (one per-node job and its batch file), and
//! the batch's state. The planner inserts the rows (`plan.rs`); the embed job and the submit
//! loop move them between states.

use super::error::{sqlite_err, stored_state, Result};
use super::handle::RunDb;
use crate::state::{BatchState, JobStatus};
use crate::BatchId;
use rusqlite::{params, OptionalExtension};

/// A planned batch, as the embed job needs it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BatchRow {
    pub id: BatchId,
    /// Relative to the run directory.
    pub path: String,
    pub n_rows: u64,
    pub n_excluded: u64,
    pub state: BatchState,
}

impl RunDb {
    pub fn batch(&self, id: BatchId) -> Result<Option<BatchRow>> {
        self.conn
            .prepare_cached("SELECT id, path, n_rows, n_excluded, state FROM batches WHERE id = ?1")
            .and_then(|mut stmt| {
                stmt.query_row([id], |r| {
                    Ok(BatchRow {
                        id: r.get(0)?,
                        path: r.get(1)?,
                        n_rows: r.get(2)?,
                        n_excluded: r.get(3)?,
                        state: stored_state(r.get::<_, String>(4)?, BatchState::parse)?,
                    })
                })
            })
            .optional()
            .map_err(sqlite_err(&self.dir))
    }

    /// The highest batch id the plan made (0 before any): batches are numbered from 1.
    pub fn last_batch_id(&self) -> Result<i64> {
        self.conn
            .query_row("SELECT COALESCE(MAX(id), 0) FROM batches", [], |r| r.get(0))
            .map_err(sqlite_err(&self.dir))
    }

    /// Of the batches `first..=last` the run has: how many are done, and how many there are.
    /// One range count on the primary key, so a loop can ask it of every group each poll.
    pub fn batches_done_in(&self, first: i64, last: i64) -> Result<(i64, i64)> {
        self.conn
            .query_row(
                "SELECT COALESCE(SUM(state = ?3), 0), COUNT(*) FROM batches WHERE id BETWEEN ?1 AND ?2",
                params![first, last, BatchState::Done.as_str()],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
            .map_err(sqlite_err(&self.dir))
    }

    /// Batches in a state, in id order.
    pub fn batch_ids(&self, state: BatchState) -> Result<Vec<i64>> {
        let mut stmt = self
            .conn
            .prepare("SELECT id FROM batches WHERE state = ?1 ORDER BY id")
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt
            .query_map([state.as_str()], |r| r.get(0))
            .and_then(|r| r.collect::<rusqlite::Result<Vec<i64>>>());
        rows.map_err(sqlite_err(&self.dir))
    }

    pub fn set_batch_state(&self, id: BatchId, state: BatchState) -> Result<()> {
        self.conn
            .execute(
                "UPDATE batches SET state = ?2, results_settled = 0 WHERE id = ?1",
                params![id, state.as_str()],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// The papers of the largest batch (0 with none): what one job writes at most, for the
    /// room it needs.
    pub fn largest_batch_papers(&self) -> Result<u64> {
        self.conn
            .prepare_cached("SELECT COALESCE(MAX(n_rows), 0) FROM batches")
            .and_then(|mut stmt| stmt.query_row([], |r| r.get::<_, i64>(0)))
            .map(|n| n.max(0) as u64)
            .map_err(sqlite_err(&self.dir))
    }

    /// Batches that need a job: not done, not given up on, and with no open job, in order.
    pub fn batches_without_job(&self) -> Result<Vec<i64>> {
        let sql = format!(
            "SELECT id FROM batches b WHERE {} ORDER BY id",
            without_job()
        );
        let mut stmt = self
            .conn
            .prepare_cached(&sql)
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| r.get(0));
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    /// The first `limit` of [`RunDb::batches_without_job`], read without the rest: the submit
    /// loop's round reads only what it uses. The condition is written so that SQLite walks
    /// the index of unsettled batches in id order and stops at `limit`.
    pub fn first_batches_without_job(&self, limit: usize) -> Result<Vec<i64>> {
        let mut stmt = self
            .conn
            .prepare_cached(&first_without_job_sql())
            .map_err(sqlite_err(&self.dir))?;
        let limit = i64::try_from(limit).unwrap_or(i64::MAX);
        let rows = stmt.query_map([limit], |r| r.get(0));
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    /// Whether any batch waits for a job ([`RunDb::batches_without_job`] is not empty), asked
    /// without reading them all: the submit loop asks it at the end of every round.
    pub fn any_batch_without_job(&self) -> Result<bool> {
        let sql = format!(
            "SELECT EXISTS (SELECT 1 FROM batches b WHERE {})",
            without_job()
        );
        let mut stmt = self
            .conn
            .prepare_cached(&sql)
            .map_err(sqlite_err(&self.dir))?;
        stmt.query_row([], |r| r.get(0))
            .map_err(sqlite_err(&self.dir))
    }

    /// Marks batches `failed` back to `planned` (a new `submit` tries them again).
    pub fn reset_failed_batches(&self) -> Result<u64> {
        self.conn
            .execute(
                "UPDATE batches SET state = ?1 WHERE state = ?2",
                [BatchState::Planned.as_str(), BatchState::Failed.as_str()],
            )
            .map(|n| n as u64)
            .map_err(sqlite_err(&self.dir))
    }

    /// The batch's state; `None` for a batch the run does not have.
    pub fn batch_state(&self, batch: BatchId) -> Result<Option<BatchState>> {
        self.conn
            .query_row("SELECT state FROM batches WHERE id = ?1", [batch], |r| {
                stored_state(r.get::<_, String>(0)?, BatchState::parse)
            })
            .optional()
            .map_err(sqlite_err(&self.dir))
    }
}

/// The condition on a batch `b` that it needs a job: not done, not given up on, no job open.
fn without_job() -> String {
    format!(
        "state IN {} AND NOT EXISTS (SELECT 1 FROM jobs j WHERE j.batch_id = b.id AND j.state IN {})",
        BatchState::open_sql(),
        JobStatus::open_sql()
    )
}

/// [`RunDb::first_batches_without_job`]'s query: the condition of the partial index
/// `batches_unsettled` (schema v12) spelled as the index spells it, so that SQLite may walk it.
fn first_without_job_sql() -> String {
    format!(
        "SELECT id FROM batches b INDEXED BY batches_unsettled \
         WHERE (state != 'done' OR results_settled = 0) AND {} ORDER BY id LIMIT ?1",
        without_job()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundb::test_support::db_with_batches;

    #[test]
    fn the_first_batches_without_a_job_are_read_in_order_from_the_unsettled_index() {
        let (_dir, mut db) = db_with_batches(40);
        for b in [1, 2, 3, 7] {
            db.set_batch_state(BatchId(b), BatchState::Done).unwrap();
        }
        db.set_batch_state(BatchId(9), BatchState::Failed).unwrap();
        db.insert_job(&crate::rundb::NewJob {
            batches: &[4, 5],
            attempt: 1,
            backend: "local",
            queue: "q",
            name: "j1",
            script: "s",
            log: "l",
            marker: "m",
        })
        .unwrap();
        let all = db.batches_without_job().unwrap();
        assert_eq!(all[..4], [6, 8, 10, 11]);
        for limit in [0, 1, 3, 10, 33, 34, 100] {
            let first = db.first_batches_without_job(limit).unwrap();
            assert_eq!(first, all[..limit.min(all.len())], "limit {limit}");
        }
        // It walks the index of unsettled batches in id order and stops at the limit: no
        // sort of every open batch (the whole plan, at the start of a run) to keep a few.
        let plan: Vec<String> = db
            .conn
            .prepare(&format!("EXPLAIN QUERY PLAN {}", first_without_job_sql()))
            .unwrap()
            .query_map([5], |r| r.get::<_, String>(3))
            .unwrap()
            .collect::<rusqlite::Result<_>>()
            .unwrap();
        assert!(plan[0].contains("batches_unsettled"), "{plan:?}");
        assert!(!plan.iter().any(|p| p.contains("TEMP B-TREE")), "{plan:?}");
    }

    #[test]
    fn a_range_counts_its_done_batches_and_only_the_batches_the_run_has() {
        let (_dir, db) = db_with_batches(5);
        assert_eq!(db.batches_done_in(1, 5).unwrap(), (0, 5));
        db.set_batch_state(BatchId(2), BatchState::Done).unwrap();
        db.set_batch_state(BatchId(4), BatchState::Done).unwrap();
        db.set_batch_state(BatchId(5), BatchState::Failed).unwrap();
        assert_eq!(db.batches_done_in(1, 3).unwrap(), (1, 3));
        // A group's range past the run's last batch counts only the batches there are.
        assert_eq!(db.batches_done_in(4, 8).unwrap(), (1, 2));
        assert_eq!(db.batches_done_in(9, 12).unwrap(), (0, 0));
    }
}
