//! The handle of one open run.db: every table's module adds its methods to it.

use rusqlite::Connection;
use std::path::PathBuf;

/// An open run.db (see the module docs of `rundb`).
pub struct RunDb {
    pub(super) conn: Connection,
    pub(super) dir: PathBuf,
    /// What the owner check found when this handle was opened.
    pub(super) ownership: crate::owner::Ownership,
}
