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
