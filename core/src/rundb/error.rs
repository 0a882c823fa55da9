//! What can go wrong with run.db, and SQLite's errors said in words.

use std::path::{Path, PathBuf};

#[derive(Debug, thiserror::Error)]
pub enum RunDbError {
    /// Another host owns the run, or its owner record cannot be read.
    #[error(transparent)]
    Owner(#[from] crate::owner::OwnerError),
    #[error("{0} is not a run directory (no run.db): run `embedfleet plan --run-dir {0}` first")]
    NotARun(PathBuf),
    #[error("run.db in {dir} has schema version {found}, newer than this embedfleet knows ({known}): use a newer embedfleet")]
    TooNew {
        dir: PathBuf,
        found: i64,
        known: i64,
    },
    /// The owner process may no longer write run.db: its heartbeat could not be written for
    /// too long, or the run was taken over (`owner::heartbeat::why_not_writing`).
    #[error("run.db in {dir} not written: {why}")]
    NotWriting { dir: PathBuf, why: String },
    /// Another process of the run's owner held run.db's write lock past the busy timeout.
    #[error("run.db in {} stayed busy for 60 s: another embedfleet command of this run (a submit loop, an upload, a plan) is writing it; run this again when it is done, or see what runs with `embedfleet status --run-dir {}`", dir.display(), dir.display())]
    Busy { dir: PathBuf },
    /// run.db could not be written for want of room: its transaction rolled back, what was
    /// written before stays (SQLite's words are kept: `database or disk is full`).
    #[error("run.db in {} cannot be written: database or disk is full ({} free there); nothing half-written was kept: free space or raise the quota, then go on", dir.display(), free.map_or_else(|| "nothing".to_string(), crate::space::size))]
    DiskFull { dir: PathBuf, free: Option<u64> },
    #[error("run.db in {dir}: {cause}")]
    Sqlite {
        dir: PathBuf,
        cause: rusqlite::Error,
    },
    /// A file the run's owner keeps beside run.db (`quarantine.jsonl`, an attempt's leftovers).
    #[error("failed to {action} {}: {cause}", path.display())]
    Io {
        action: &'static str,
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("run.db in {dir}: setting `{key}` is not valid: {cause}")]
    Setting {
        dir: PathBuf,
        key: String,
        cause: serde_json::Error,
    },
    /// A read-only open (see [`RunDb::open_read_only`]) found a schema it would have to
    /// migrate, which writes.
    #[error("run.db in {dir} has schema version {found}, this embedfleet's is {known}: a read-only look does not migrate it; any other command (e.g. `embedfleet status`) migrates it first")]
    NotCurrent {
        dir: PathBuf,
        found: i64,
        known: i64,
    },
}

pub type Result<T> = std::result::Result<T, RunDbError>;

/// Wraps SQLite errors with the run directory they happened in. Borrows only the directory, so
/// it can be used while a transaction holds the connection.
/// Free bytes under which an I/O error of SQLite's is taken for a full disk.
const NEARLY_FULL_BYTES: u64 = 64 << 10;

pub(crate) fn sqlite_err(dir: &Path) -> impl Fn(rusqlite::Error) -> RunDbError + '_ {
    move |source| sqlite_error(dir, source)
}

/// An error of SQLite's on `dir`'s run.db; a commit the owner's commit hook refused says why, and
/// a lock held past the busy timeout is said in words (no raw SQLite code reaches the user).
pub(super) fn sqlite_error(dir: &Path, source: rusqlite::Error) -> RunDbError {
    if let rusqlite::Error::SqliteFailure(e, _) = &source {
        if matches!(
            e.code,
            rusqlite::ErrorCode::DatabaseBusy | rusqlite::ErrorCode::DatabaseLocked
        ) {
            return RunDbError::Busy { dir: dir.into() };
        }
        if e.extended_code == rusqlite::ffi::SQLITE_CONSTRAINT_COMMITHOOK {
            if let Some(why) = crate::owner::heartbeat::why_not_writing(dir) {
                return RunDbError::NotWriting {
                    dir: dir.into(),
                    why,
                };
            }
        }
    }
    if let rusqlite::Error::SqliteFailure(e, _) = &source {
        // SQLite says a full disk as SQLITE_FULL, or, when a write to the log or a sync meets
        // it, as an I/O error: a filesystem with next to nothing free says which.
        let full = e.code == rusqlite::ErrorCode::DiskFull
            || (e.code == rusqlite::ErrorCode::SystemIoFailure
                && crate::space::space_of(dir).is_ok_and(|s| s.free < NEARLY_FULL_BYTES));
        if full {
            return RunDbError::DiskFull {
                dir: dir.to_path_buf(),
                free: crate::space::space_of(dir).map(|s| s.free).ok(),
            };
        }
    }
    RunDbError::Sqlite {
        dir: dir.to_path_buf(),
        cause: source,
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
