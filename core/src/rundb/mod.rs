//! `run.db`: the one source of truth of a run directory (SQLite, WAL mode).
//!
//! Every step records what it finished here, in small transactions, after the files it wrote
//! are durable; on a re-run it reads what is done and does only the rest. A module per table
//! (or per group of tables written together): `plan` (corpus_files, papers, quarantine, the
//! plan's settings and state), `batches`, `shards`, `batch_runs`, `jobs`, `queues`,
//! `uploads`, `tombstones` (with the collections' identity markers); `status` reads them all,
//! its aggregates from the running counts SQLite triggers keep beside them (`counts`).

mod attempts;
mod batch_runs;
mod batches;
mod counts;
mod error;
mod handle;
mod job_history;
mod jobs;
mod live;
mod plan;
mod plan_file;
mod queues;
mod releases;
mod schema;
mod shards;
mod snapshot_loads;
mod status;
mod tombstones;
mod uploads;

pub use attempts::{test_kill_point, IngestReport, TEST_KILL_ENV};
pub use batch_runs::{BatchRunRecord, BatchTimings};
pub use batches::BatchRow;
pub use counts::STATUS_RECOUNT_ENV;
pub(crate) use error::sqlite_err;
use error::sqlite_error;
pub use error::{Result, RunDbError};
pub use handle::RunDb;
pub use job_history::{JobAttempt, JobAttemptCursor};
pub use jobs::{JobRow, NewJob};
pub use live::{LiveAttempt, StallRule, STALL_RULE_SETTING};
pub use plan::{BatchRecord, CorpusFileRow, PlannedPaper, ReleaseBatch};
pub use queues::PauseReason;
pub use releases::{
    KnownPaper, NewMetadata, PaperMetadata, Release, ReleaseCounts, Restamp, SeenPaper, WithheldRow,
};
pub use shards::ShardRow;
pub use snapshot_loads::{SnapshotLoadRow, SnapshotStep};
pub use status::{CollectionUpload, ReleaseStatus, RunStatus, WithheldRows, STATUS_FORMAT_VERSION};
pub use tombstones::Tombstone;
pub use uploads::UploadShard;

use crate::layout::RunLayout;
use rusqlite::{Connection, OptionalExtension};
use serde::{de::DeserializeOwned, Serialize};
use std::path::Path;
use std::time::Duration;

/// Prepared statements a connection keeps (see `RunDb::configure`).
const STATEMENT_CACHE: usize = 64;

impl RunDb {
    /// Opens the run directory's run.db, creating the directory and the database if needed,
    /// and migrates it to the current schema.
    pub fn create(dir: &Path) -> Result<Self> {
        crate::access::create_run_dir(dir).map_err(|e| RunDbError::Sqlite {
            dir: dir.into(),
            cause: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
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
        db.ingest_and_log()?;
        Ok(db)
    }

    /// Ingests the result manifests written since (see [`RunDb::ingest_results`]), logging
    /// what it took in: what [`RunDb::open`] does, for a handle that [`RunDb::create`] made.
    pub fn ingest_and_log(&mut self) -> Result<()> {
        for line in self.ingest_results()?.lines() {
            tracing::info!("{line}");
        }
        Ok(())
    }

    fn open_path(dir: &Path) -> Result<Self> {
        // Each open checks the owner, ingests new results and configures SQLite: a command
        // opens run.db once (`EMBEDFLEET_LOG=embedfleet_core::rundb=debug` counts them).
        tracing::debug!(run_dir = %dir.display(), "opening run.db");
        // Before SQLite touches the file: on another host even opening it is unsafe.
        let ownership = crate::owner::check(dir)?;
        if let crate::owner::Ownership::Rebooted { previous } = &ownership {
            tracing::warn!(
                "{} rebooted since it last opened this run (boot {}): whatever ran here then has stopped",
                previous.hostname,
                previous.boot_id
            );
        }
        crate::owner::keep_heartbeat(dir);
        // run.db holds the run config's secrets: its mode (and so its -wal's) is set, not left
        // to the umask (crate::access).
        crate::access::prepare_db(dir).map_err(|e| RunDbError::Sqlite {
            dir: dir.into(),
            cause: rusqlite::Error::ToSqlConversionFailure(Box::new(e)),
        })?;
        let conn =
            Connection::open(RunLayout::new(dir).db()).map_err(|source| RunDbError::Sqlite {
                dir: dir.into(),
                cause: source,
            })?;
        let mut db = RunDb {
            conn,
            dir: dir.into(),
            ownership,
        };
        db.configure().map_err(|e| db.err(e))?;
        // A transaction that reads and then writes, begun DEFERRED, holds a read snapshot; if
        // another process (a `query`, a `status`) commits in between, its first write fails at
        // once with SQLITE_BUSY_SNAPSHOT, which no busy timeout retries. Every transaction of
        // this handle begins as a writer instead (BEGIN IMMEDIATE): it waits its turn (the busy
        // timeout) and then cannot be overtaken.
        db.conn
            .set_transaction_behavior(rusqlite::TransactionBehavior::Immediate);
        // Every commit of this process first asks whether it may still write: a process whose
        // heartbeat stopped, or whose run was taken over, writes nothing more (in memory: the
        // heartbeat thread keeps the answer).
        let hook_dir = db.dir.clone();
        db.conn.commit_hook(Some(move || {
            crate::owner::heartbeat::why_not_writing(&hook_dir).is_some()
        }));
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
        // Each poll runs a few dozen distinct statements (the ingest, `status`): kept prepared
        // rather than parsed again at every poll (rusqlite keeps 16 by default).
        self.conn
            .set_prepared_statement_cache_capacity(STATEMENT_CACHE);
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
        // A migration may rebuild a table others refer to (v9 rebuilds `corpus_files`, which
        // `batches` refers to): foreign keys are off while they run (outside any transaction,
        // as SQLite requires) and `batches`' are checked before each commit.
        if found < known {
            self.conn
                .execute_batch("PRAGMA foreign_keys = OFF")
                .map_err(|e| self.err(e))?;
        }
        for (i, sql) in schema::MIGRATIONS.iter().enumerate().skip(found as usize) {
            let dir = self.dir.clone();
            let err = |source| RunDbError::Sqlite {
                dir: dir.clone(),
                cause: source,
            };
            let tx = self.conn.transaction().map_err(err)?;
            tx.execute_batch(sql).map_err(err)?;
            let broken: Option<String> = tx
                .query_row("PRAGMA foreign_key_check(batches)", [], |r| r.get(0))
                .optional()
                .map_err(err)?;
            if let Some(table) = broken {
                return Err(err(rusqlite::Error::SqliteFailure(
                    rusqlite::ffi::Error::new(rusqlite::ffi::SQLITE_CONSTRAINT),
                    Some(format!(
                        "migration to schema {} leaves rows of `{table}` without their parent",
                        i + 1
                    )),
                )));
            }
            tx.pragma_update(None, "user_version", i as i64 + 1)
                .map_err(err)?;
            tx.commit().map_err(err)?;
        }
        self.conn
            .execute_batch("PRAGMA foreign_keys = ON")
            .map_err(|e| self.err(e))?;
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

    /// What the owner check found when run.db was opened (a reboot of the owner, say).
    pub fn ownership(&self) -> &crate::owner::Ownership {
        &self.ownership
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
        sqlite_error(&self.dir, source)
    }

    pub fn setting<T: DeserializeOwned>(&self, key: &str) -> Result<Option<T>> {
        let value: Option<String> = self
            .conn
            .prepare_cached("SELECT value FROM settings WHERE key = ?1")
            .and_then(|mut stmt| stmt.query_row([key], |r| r.get(0)))
            .optional()
            .map_err(|e| self.err(e))?;
        value
            .map(|v| serde_json::from_str(&v))
            .transpose()
            .map_err(|source| RunDbError::Setting {
                dir: self.dir.clone(),
                key: key.into(),
                cause: source,
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

    /// Opens run.db only to read it, creating and changing no file of the run directory: no
    /// migration, no ingest, no journal-mode switch. For `submit --dry-run`, which must leave
    /// the run directory byte-identical.
    ///
    /// With no `run.db-wal` beside it (no owner process has it open, or all closed cleanly),
    /// it is opened `immutable=1`: SQLite then takes no locks and makes no `-shm`/`-wal` file
    /// (`mode=ro` alone still creates `run.db-shm` in WAL mode). That is only sound while
    /// nobody writes, which no `-wal` file is the sign of. If a `-wal` exists a submit loop may
    /// be writing right now, and immutable reads would miss or tear its latest commits: then
    /// it is opened `mode=ro`, which reads through the WAL and may touch the shared index
    /// `run.db-shm` that the writer already keeps — the run directory changes then anyway.
    pub fn open_read_only(dir: &Path) -> Result<Self> {
        let db_path = RunLayout::new(dir).db();
        if !db_path.is_file() {
            return Err(RunDbError::NotARun(dir.into()));
        }
        let mut wal = db_path.clone().into_os_string();
        wal.push("-wal");
        let absolute = std::path::absolute(&db_path).unwrap_or(db_path);
        let mode = if Path::new(&wal).exists() {
            "mode=ro"
        } else {
            "immutable=1"
        };
        let uri = format!("file:{}?{mode}", uri_path(&absolute));
        let flags = rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY
            | rusqlite::OpenFlags::SQLITE_OPEN_URI
            | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX;
        // Another host may not even read: `mode=ro` shares the owner's WAL index (`-shm`).
        crate::owner::check_read_only(dir)?;
        let conn = Connection::open_with_flags(uri, flags).map_err(sqlite_err(dir))?;
        let db = RunDb {
            conn,
            dir: dir.into(),
            ownership: crate::owner::Ownership::Owner,
        };
        db.conn
            .busy_timeout(Duration::from_secs(60))
            .map_err(|e| db.err(e))?;
        db.conn
            .set_prepared_statement_cache_capacity(STATEMENT_CACHE);
        let known = schema::MIGRATIONS.len() as i64;
        let found = db.schema_version()?;
        if found != known {
            return Err(RunDbError::NotCurrent {
                dir: dir.into(),
                found,
                known,
            });
        }
        Ok(db)
    }
}

/// A path as the path part of an SQLite `file:` URI: `%`, `?` and `#` escaped.
fn uri_path(path: &Path) -> String {
    let mut out = String::new();
    for c in path.to_string_lossy().chars() {
        match c {
            '%' | '?' | '#' => out.push_str(&format!("%{:02X}", c as u32)),
            c => out.push(c),
        }
    }
    out
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

    /// A transaction of run.db begins as a writer (BEGIN IMMEDIATE): begun deferred, one that
    /// read and then wrote failed at once (SQLITE_BUSY_SNAPSHOT, extended code 517) when a
    /// `query` of the same run committed in between: `plan --update` beside a notebook's loop.
    #[test]
    fn a_transaction_takes_the_write_lock_when_it_begins_and_a_busy_run_db_is_said_in_words() {
        let dir = tempfile::tempdir().unwrap();
        let mut db = RunDb::create(dir.path()).unwrap();
        let other = Connection::open(RunLayout::new(dir.path()).db()).unwrap();
        other.busy_timeout(Duration::ZERO).unwrap();
        {
            let tx = db.conn_mut().transaction().unwrap();
            let _: i64 = tx
                .query_row("SELECT count(*) FROM settings", [], |r| r.get(0))
                .unwrap();
            // Deferred, the read above took no write lock and this would commit first.
            let err = other
                .execute("INSERT INTO settings (key, value) VALUES ('x', '1')", [])
                .unwrap_err();
            assert_eq!(
                err.sqlite_error_code(),
                Some(rusqlite::ErrorCode::DatabaseBusy),
                "{err}"
            );
            tx.execute("INSERT INTO settings (key, value) VALUES ('y', '2')", [])
                .unwrap();
            tx.commit().unwrap();
        }
        // Another process holding the lock past the busy timeout: said in words, no SQLite code.
        other.execute_batch("BEGIN IMMEDIATE").unwrap();
        db.conn().busy_timeout(Duration::from_millis(50)).unwrap();
        let err = db.set_setting("z", &3).unwrap_err();
        assert!(matches!(err, RunDbError::Busy { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("another embedfleet command") && !text.contains("code"),
            "{text}"
        );
        other.execute_batch("ROLLBACK").unwrap();
        db.set_setting("z", &3).unwrap();
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
    fn migrates_a_version_8_run_directory_to_releases_keeping_its_files_and_batches() {
        let dir = tempfile::tempdir().unwrap();
        {
            let conn = Connection::open(RunLayout::new(dir.path()).db()).unwrap();
            for sql in &schema::MIGRATIONS[..8] {
                conn.execute_batch(sql).unwrap();
            }
            conn.pragma_update(None, "user_version", 8).unwrap();
            conn.execute_batch(
                "PRAGMA foreign_keys = ON;
                 INSERT INTO corpus_files (id, path, size, mtime_ns, edges, state, papers)
                     VALUES (1, '/c/a.jsonl', 5, 6, 'e', 'planned', 2), (2, '/c/b.jsonl', 7, 8, 'f', 'planned', 1);
                 INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (1, 1, 0, 'b1', 2, 9), (2, 2, 0, 'b2', 1, 3);
                 INSERT INTO papers (id, batch_id, row, line, n_chars) VALUES ('x', 1, 0, 1, 4), ('y', 1, 1, 2, 5), ('z', 2, 0, 1, 3);",
            )
            .unwrap();
        }
        let db = RunDb::open(dir.path()).unwrap();
        assert_eq!(
            db.schema_version().unwrap(),
            schema::MIGRATIONS.len() as i64
        );
        let files = db.corpus_files().unwrap();
        assert_eq!(
            files
                .iter()
                .map(|f| (f.id, f.path.as_str(), f.planned))
                .collect::<Vec<_>>(),
            [(1, "/c/a.jsonl", true), (2, "/c/b.jsonl", true)]
        );
        let release: i64 = db
            .conn()
            .query_row("SELECT max(release) FROM corpus_files", [], |r| r.get(0))
            .unwrap();
        assert_eq!(
            release, 1,
            "the files planned before releases are release 1's"
        );
        assert_eq!(db.latest_release().unwrap().map(|r| r.id), Some(1));
        // Foreign keys are back on, and `batches` still refers to the rebuilt table.
        let orphan = db.conn().execute(
            "INSERT INTO batches (file_id, seq, path, n_rows, n_chars) VALUES (9, 0, 'b9', 1, 1)",
            [],
        );
        assert!(orphan.is_err(), "a batch of no corpus file is refused");
        db.conn()
            .execute(
                "INSERT INTO corpus_files (path, size, mtime_ns, edges, release) VALUES ('/c/a.jsonl', 1, 1, 'e', 2)",
                [],
            )
            .expect("a path is unique per release, not in the run");
    }

    /// Every file of `dir` with its bytes.
    /// The run directory's files and bytes, but the heartbeat (this process's owner thread
    /// may rewrite it at any moment).
    fn snapshot(dir: &Path) -> Vec<(std::ffi::OsString, Vec<u8>)> {
        let mut files: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .filter(|e| e.as_ref().unwrap().file_name() != "owner-heartbeat.json")
            .map(|e| {
                let e = e.unwrap();
                (e.file_name(), std::fs::read(e.path()).unwrap())
            })
            .collect();
        files.sort();
        files
    }

    #[test]
    fn a_read_only_open_creates_and_changes_no_file() {
        let parent = tempfile::tempdir().unwrap();
        // URI characters in the path must not cut it.
        let dir = parent.path().join("a run?#%20");
        let db = RunDb::create(&dir).unwrap();
        db.set_setting("k", &7).unwrap();
        drop(db);
        let before = snapshot(&dir);
        let names: Vec<_> = before.iter().map(|(n, _)| n.clone()).collect();
        assert_eq!(
            names,
            ["owner.json", "run.db"],
            "no -wal, no -shm after a clean close"
        );
        let ro = RunDb::open_read_only(&dir).unwrap();
        assert_eq!(ro.setting::<i32>("k").unwrap(), Some(7));
        assert!(ro.set_setting("k", &8).is_err(), "read only");
        drop(ro);
        assert_eq!(snapshot(&dir), before);
        // A writer holding it open: its WAL is read through (mode=ro), its commits seen.
        let writer = RunDb::open(&dir).unwrap();
        writer.set_setting("k", &9).unwrap();
        let ro = RunDb::open_read_only(&dir).unwrap();
        assert_eq!(ro.setting::<i32>("k").unwrap(), Some(9));
        drop(writer);
        // An older schema is not migrated by a look.
        drop(ro);
        RunDb::open(&dir)
            .unwrap()
            .conn()
            .pragma_update(None, "user_version", 1)
            .unwrap();
        let err = RunDb::open_read_only(&dir).err().unwrap();
        assert!(
            matches!(err, RunDbError::NotCurrent { found: 1, .. }),
            "{err}"
        );
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
