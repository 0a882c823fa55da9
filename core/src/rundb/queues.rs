//! The `queues` table (queue caps) and the pause switch: what `pause`, `resume` and
//! `queues set` change while the submit loop runs (it re-reads them every poll). A pause may
//! carry its reason (the submit loop's breaker records one), which `resume` clears.

use super::error::{sqlite_err, Result};
use super::handle::RunDb;
use rusqlite::params;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

const PAUSED_KEY: &str = "submit.paused";
/// The settings key of [`PauseReason`]; absent unless something other than `embedfleet pause`
/// paused the run.
const PAUSE_REASON_KEY: &str = "submit.pause_reason";
const RESUMES_KEY: &str = "submit.resumes";

/// Why the submit loop paused the run by itself (`embedfleet pause` records none). Shown by
/// `status` (text and `--json`, field `pause_reason`) until `embedfleet resume` clears it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PauseReason {
    /// What paused it: `breaker` (jobs in a row failed alike), `disk` (no room for another
    /// job: lifted by the loop itself once there is).
    pub by: String,
    /// One line, for people: what happened.
    pub message: String,
    /// What the failures had in common: exit code and first error line of the job log, with
    /// the numbers that differ per job (batch ids, job ids, line numbers) written as `#`.
    pub signature: String,
    /// The scheduler's names of the failed jobs, oldest first.
    pub jobs: Vec<String>,
    /// Their logs, in the same order.
    pub logs: Vec<String>,
    /// What to check before `embedfleet resume`.
    pub check: Vec<String>,
    /// When, in seconds since the Unix epoch.
    pub at_unix_s: u64,
}

impl RunDb {
    /// Queue name -> cap on its jobs queued + running.
    pub fn queue_caps(&self) -> Result<BTreeMap<String, u32>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT name, cap FROM queues ORDER BY name")
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?)));
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    /// Sets the caps of the queues named; with `replace`, queues not named are removed.
    /// A cap of 0 keeps the queue known (its running jobs still show) but submits nothing.
    pub fn set_queue_caps(&mut self, caps: &BTreeMap<String, u32>, replace: bool) -> Result<()> {
        let dir = self.dir.clone();
        let tx = self.conn.transaction().map_err(sqlite_err(&dir))?;
        if replace {
            tx.execute("DELETE FROM queues", [])
                .map_err(sqlite_err(&dir))?;
        }
        for (name, cap) in caps {
            tx.execute(
                "INSERT INTO queues (name, cap) VALUES (?1, ?2)
                 ON CONFLICT (name) DO UPDATE SET cap = excluded.cap",
                params![name, cap],
            )
            .map_err(sqlite_err(&dir))?;
        }
        tx.commit().map_err(sqlite_err(&dir))
    }

    /// Removes queues; their running jobs go on and are still watched.
    pub fn remove_queues(&self, names: &[String]) -> Result<()> {
        for name in names {
            self.conn
                .execute("DELETE FROM queues WHERE name = ?1", [name])
                .map_err(sqlite_err(&self.dir))?;
        }
        Ok(())
    }

    /// True while `embedfleet pause` is in force: no new submissions.
    pub fn paused(&self) -> Result<bool> {
        Ok(self.setting::<bool>(PAUSED_KEY)?.unwrap_or(false))
    }

    /// Pauses or resumes. Resuming clears the pause's reason: the user says it is dealt with.
    pub fn set_paused(&self, paused: bool) -> Result<()> {
        if paused {
            return self.set_setting(PAUSED_KEY, &paused);
        }
        self.unpause(true)
    }

    /// Clears the pause and its reason in one transaction, counting a user's `resume` where
    /// `resumed`.
    fn unpause(&self, resumed: bool) -> Result<()> {
        let tx = self
            .conn
            .unchecked_transaction()
            .map_err(sqlite_err(&self.dir))?;
        self.set_setting(PAUSED_KEY, &false)?;
        tx.execute("DELETE FROM settings WHERE key = ?1", [PAUSE_REASON_KEY])
            .map_err(sqlite_err(&self.dir))?;
        if resumed {
            self.set_setting(RESUMES_KEY, &(self.resumes()? + 1))?;
        }
        tx.commit().map_err(sqlite_err(&self.dir))
    }

    /// How many times `embedfleet resume` was given in this run: the submit loop brings back the
    /// queues its breaker set aside when this changes, paused or not.
    pub fn resumes(&self) -> Result<u64> {
        Ok(self.setting::<u64>(RESUMES_KEY)?.unwrap_or(0))
    }

    /// Pauses, recording why, in one transaction: a reader never sees the reason without the
    /// pause.
    pub fn pause_for(&self, reason: &PauseReason) -> Result<()> {
        let tx = self
            .conn
            .unchecked_transaction()
            .map_err(sqlite_err(&self.dir))?;
        self.set_setting(PAUSE_REASON_KEY, reason)?;
        self.set_setting(PAUSED_KEY, &true)?;
        tx.commit().map_err(sqlite_err(&self.dir))
    }

    /// Lifts a pause the submit loop made for reason `by` (see [`PauseReason::by`]) by itself,
    /// once what paused it is over (room on the disk again): not a user's `resume`, so not
    /// counted as one. A pause for another reason, or the user's own, stays.
    pub fn lift_pause_by(&self, by: &str) -> Result<()> {
        if self.pause_reason()?.is_none_or(|r| r.by != by) {
            return Ok(());
        }
        self.unpause(false)
    }

    /// Gives back the room run.db's write-ahead log holds beyond what it needs: its pages
    /// checkpointed into run.db and the log file truncated (it keeps its largest size
    /// otherwise). Writes nothing new: a way to make room on a full disk, taken by the submit
    /// loop while it holds jobs for room.
    pub fn shrink_wal(&self) -> Result<()> {
        self.conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |_| Ok(()))
            .map_err(sqlite_err(&self.dir))
    }

    /// Why the run is paused, when the submit loop paused it (see [`Self::pause_for`]).
    pub fn pause_reason(&self) -> Result<Option<PauseReason>> {
        self.setting(PAUSE_REASON_KEY)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rundb::test_support::db_with_batches;

    #[test]
    fn caps_merge_or_replace_and_pause_toggles() {
        let (_d, mut db) = db_with_batches(0);
        let caps = |pairs: &[(&str, u32)]| {
            pairs
                .iter()
                .map(|(k, v)| (k.to_string(), *v))
                .collect::<BTreeMap<_, _>>()
        };
        db.set_queue_caps(&caps(&[("debug", 1), ("gpu", 2)]), true)
            .unwrap();
        db.set_queue_caps(&caps(&[("gpu", 0), ("pre", 4)]), false)
            .unwrap();
        assert_eq!(
            db.queue_caps().unwrap(),
            caps(&[("debug", 1), ("gpu", 0), ("pre", 4)])
        );
        db.set_queue_caps(&caps(&[("x", 3)]), true).unwrap();
        assert_eq!(db.queue_caps().unwrap(), caps(&[("x", 3)]));
        db.remove_queues(&["x".into()]).unwrap();
        assert!(db.queue_caps().unwrap().is_empty());
        assert!(!db.paused().unwrap());
        db.set_paused(true).unwrap();
        assert!(db.paused().unwrap());
        db.set_paused(false).unwrap();
        assert!(!db.paused().unwrap());
    }

    #[test]
    fn a_pause_with_a_reason_keeps_it_until_resume() {
        let (_d, db) = db_with_batches(0);
        assert_eq!(db.pause_reason().unwrap(), None);
        let reason = PauseReason {
            by: "breaker".into(),
            message: "3 jobs in a row failed alike".into(),
            signature: "exit code 1: error: no cudnn".into(),
            jobs: vec!["j1".into()],
            logs: vec!["/l/j1.log".into()],
            check: vec!["the logs".into()],
            at_unix_s: 7,
        };
        db.pause_for(&reason).unwrap();
        assert!(db.paused().unwrap());
        assert_eq!(db.pause_reason().unwrap(), Some(reason.clone()));
        // Pausing again by hand keeps the reason; resuming clears it.
        db.set_paused(true).unwrap();
        assert_eq!(db.pause_reason().unwrap(), Some(reason));
        db.set_paused(false).unwrap();
        assert!(!db.paused().unwrap());
        assert_eq!(db.pause_reason().unwrap(), None);
    }
}
