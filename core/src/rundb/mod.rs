//! `run.db`: the one source of truth of a run directory (SQLite, WAL mode).
//!
//! Every step records what it finished here, in small transactions, after the files it wrote
//! are durable; on a re-run it reads what is done and does only the rest. A module per table
//! (or per group of tables written together): `plan` (corpus_files, papers, quarantine, the
//! plan's settings and state), `batches`, `shards`, `batch_runs`, `jobs`, `queues`,
//! `uploads`, `tombstones` (with the collections' identity markers); `status` reads them all.

mod attempts;
mod batch_runs;
mod batches;
mod jobs;
mod plan;
mod queues;
mod schema;
mod shards;
mod snapshot_loads;
mod status;
mod tombstones;
mod uploads;

pub use attempts::{IngestReport, TEST_KILL_ENV};
pub use batch_runs::{BatchRunRecord, BatchTimings};
pub use batches::BatchRow;
pub use jobs::{JobRow, NewJob};
pub use plan::{BatchRecord, CorpusFileRow, PlannedPaper};
pub use queues::PauseReason;
pub use shards::ShardRow;
pub use snapshot_loads::{SnapshotLoadRow, SnapshotStep};
pub use status::{CollectionUpload, RunStatus, STATUS_FORMAT_VERSION};
pub use tombstones::Tombstone;
pub use uploads::UploadShard;

use crate::layout::RunLayout;
use rusqlite::{Connection, OptionalExtension};
use serde::{de::DeserializeOwned, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum RunDbError {
    #[error("{0} is not a run directory (no run.db): run `embedfleet plan --run-dir {0}` first")]
    NotARun(PathBuf),
    #[error("run.db in {dir} has schema version {found}, newer than this embedfleet knows ({known}): use a newer embedfleet")]
    TooNew {
        dir: PathBuf,
        found: i64,
        known: i64,
    },
    #[error("run.db in {dir}: {source}")]
    Sqlite {
        dir: PathBuf,
        source: rusqlite::Error,
    },
    /// A file the run's owner keeps beside run.db (`quarantine.jsonl`, an attempt's leftovers).
    #[error("failed to {action} {}: {source}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("run.db in {dir}: setting `{key}` is not valid: {source}")]
    Setting {
        dir: PathBuf,
        key: String,
        source: serde_json::Error,
    },
}

pub type Result<T> = std::result::Result<T, RunDbError>;

/// Wraps SQLite errors with the run directory they happened in. Borrows only the directory, so
/// it can be used while a transaction holds the connection.
pub(crate) fn sqlite_err(dir: &Path) -> impl Fn(rusqlite::Error) -> RunDbError + '_ {
    move |source| RunDbError::Sqlite {
        dir: dir.to_path_buf(),
        source,
    }
}

/// A state column read back: an unknown name (a newer embedfleet's) is an error, not a guess.
pub(crate) fn stored_state<T>(text: String, parse: fn(&str) -> Option<T>) -> rusqlite::Result<T> {
    parse(&text).ok_or_else(|| {
        rusqlite::Error::FromSqlConversionFailure(
            0,
            rusqlite::types::Type::Text,
            format!("unknown state `{text}`: use a newer embedfleet").into(),
        )
    })
}

pub struct RunDb {
    conn: Connection,
    dir: PathBuf,
}

impl RunDb {
    /// Opens the run directory's run.db, creating the directory and the database if needed,
    /// and migrates it to the current schema.
    pub fn create(dir: &Path) -> Result<Self> {
        std::fs::create_dir_all(dir).map_err(|e| RunDbError::Sqlite {
            dir: dir.into(),
            source: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
        })?;
        Self::open_path(dir)
    }

    /// Opens an existing run directory, and ingests the result manifests embed jobs have
    /// written since (see [`RunDb::ingest_results`]): every command that reads the run's state
    /// sees every finished batch. Only the run's owner opens run.db; a job never does.
    pub fn open(dir: &Path) -> Result<Self> {
        if !RunLayout::new(dir).db().is_file() {
            return Err(RunDbError::NotARun(dir.into()));
        }
        let mut db = Self::open_path(dir)?;
        for line in db.ingest_results()?.lines() {
            tracing::info!("{line}");
        }
        Ok(db)
    }

    fn open_path(dir: &Path) -> Result<Self> {
        let conn =
            Connection::open(RunLayout::new(dir).db()).map_err(|source| RunDbError::Sqlite {
                dir: dir.into(),
                source,
            })?;
        let mut db = RunDb {
            conn,
            dir: dir.into(),
        };
        db.configure().map_err(|e| db.err(e))?;
        db.migrate()?;
        Ok(db)
    }

    fn configure(&self) -> rusqlite::Result<()> {
        // Only the run's owner opens run.db (jobs hand their results over as files, see
        // `handoff`), and the owner's processes — the submit loop, `status`, `pause`, ... —
        // run on one host, the login node: WAL's shared-memory index works between processes
        // of one host, so it is safe here, and it lets `status` read while the loop writes.
        // The busy timeout rides out the loop's short write transactions.
        self.conn.busy_timeout(Duration::from_secs(60))?;
        self.conn
            .query_row("PRAGMA journal_mode = WAL", [], |_| Ok(()))?;
        self.conn
            .execute_batch("PRAGMA synchronous = NORMAL; PRAGMA foreign_keys = ON;")
    }

    fn migrate(&mut self) -> Result<()> {
        let known = schema::MIGRATIONS.len() as i64;
        let found: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| self.err(e))?;
        if found > known {
            return Err(RunDbError::TooNew {
                dir: self.dir.clone(),
                found,
                known,
            });
        }
        for (i, sql) in schema::MIGRATIONS.iter().enumerate().skip(found as usize) {
            let dir = self.dir.clone();
            let err = |source| RunDbError::Sqlite {
                dir: dir.clone(),
                source,
            };
            let tx = self.conn.transaction().map_err(err)?;
            tx.execute_batch(sql).map_err(err)?;
            tx.pragma_update(None, "user_version", i as i64 + 1)
                .map_err(err)?;
            tx.commit().map_err(err)?;
        }
        Ok(())
    }

    pub fn schema_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(|e| self.err(e))
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The paths of this run directory.
    pub fn layout(&self) -> RunLayout {
        RunLayout::new(&self.dir)
    }

    /// The connection, for steps whose queries live with them.
    pub fn conn(&self) -> &Connection {
        &self.conn
    }

    pub fn conn_mut(&mut self) -> &mut Connection {
        &mut self.conn
    }

    /// Wraps a SQLite error with the run directory it happened in.
    pub fn err(&self, source: rusqlite::Error) -> RunDbError {
        RunDbError::Sqlite {
            dir: self.dir.clone(),
            source,
        }
    }

    pub fn setting<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        let value: Option<String> = self
            .conn
            .query_row("SELECT value FROM settings WHERE key = ?1", [key], |r| {
                r.get(0)
            })
            .optional()
            .map_err(|e| self.err(e))?;
        value
            .map(|v| serde_json::from_str(&v))
            .transpose()
            .map_err(|source| RunDbError::Setting {
                dir: self.dir.clone(),
                key: key.into(),
                source,
            })
    }

    pub fn set_setting<T: Serialize>(&self, key: &str, value: &T) -> Result<()> {
        let json = serde_json::to_string(value).expect("settings always serialise. This is a bug.");
        self.conn
            .execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2)
                 ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                (key, json),
            )
            .map(drop)
            .map_err(|e| self.err(e))
    }
}

#[cfg(test)]
pub(crate) mod test_support {
    use super::RunDb;

    /// A run with one corpus file and batches 1..=n, planned.
    pub fn db_with_batches(n: i64) -> (tempfile::TempDir, RunDb) {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        db.conn()
            .execute(
                "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 0, 0, '')",
                [],
            )
            .unwrap();
        for id in 1..=n {
            db.conn()
                .execute(
                    "INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (?1, 1, ?1, 'b', 1, 1)",
                    [id],
                )
                .unwrap();
        }
        (dir, db)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn migrates_a_new_database_to_the_current_version_once() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        assert_eq!(
            db.schema_version().unwrap(),
            schema::MIGRATIONS.len() as i64
        );
        db.set_setting("k", &vec![1, 2]).unwrap();
        drop(db);
        let db = RunDb::open(dir.path()).unwrap();
        assert_eq!(db.setting::<Vec<i32>>("k").unwrap(), Some(vec![1, 2]));
        let mode: String = db
            .conn()
            .query_row("PRAGMA journal_mode", [], |r| r.get(0))
            .unwrap();
        assert_eq!(mode, "wal");
    }

    #[test]
    fn migrates_a_version_1_run_directory_keeping_its_data() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(RunLayout::new(dir.path()).db()).unwrap();
            conn.execute_batch(schema::MIGRATIONS[0]).unwrap();
            conn.pragma_update(None, "user_version", 1).unwrap();
            conn.execute(
                "INSERT INTO settings (key, value) VALUES ('plan_state', '\"complete\"')",
                [],
            )
            .unwrap();
        }
        let db = RunDb::open(dir.path()).unwrap();
        assert_eq!(
            db.schema_version().unwrap(),
            schema::MIGRATIONS.len() as i64
        );
        assert_eq!(
            db.setting::<String>("plan_state").unwrap().as_deref(),
            Some("complete")
        );
        let runs: i64 = db
            .conn()
            .query_row("SELECT count(*) FROM batch_runs", [], |r| r.get(0))
            .unwrap();
        assert_eq!(runs, 0, "the v2 table exists");
    }

    #[test]
    fn refuses_a_newer_schema_and_a_missing_run() {
        let dir = tempfile::tempdir().unwrap();
        assert!(matches!(
            RunDb::open(dir.path()),
            Err(RunDbError::NotARun(_))
        ));
        let db = RunDb::create(dir.path()).unwrap();
        db.conn().pragma_update(None, "user_version", 99).unwrap();
        drop(db);
        let err = RunDb::open(dir.path()).err().unwrap();
        assert!(matches!(err, RunDbError::TooNew { found: 99, .. }), "{err}");
    }
}
