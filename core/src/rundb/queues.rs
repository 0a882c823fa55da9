//! The `queues` table (queue caps) and the pause switch: what `pause`, `resume` and
//! `queues set` change while the submit loop runs (it re-reads them every poll).

use super::{sqlite_err, Result, RunDb};
use rusqlite::params;
use std::collections::BTreeMap;

const PAUSED_KEY: &str = "submit.paused";

impl RunDb {
    /// Queue name -> cap on its jobs queued + running.
    pub fn queue_caps(&self) -> Result<BTreeMap<String, u32>> {
        let mut stmt = self
            .conn
            .prepare("SELECT name, cap FROM queues ORDER BY name")
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

    pub fn set_paused(&self, paused: bool) -> Result<()> {
        self.set_setting(PAUSED_KEY, &paused)
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
}
