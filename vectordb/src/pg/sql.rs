//! SQL's small pieces every part of the sink writes with: quoted names and server errors.

use crate::error::UploadError;

/// `name` as a quoted identifier (collection names are letters, digits, `-`, `_`, `.`).
pub(super) fn quoted(name: &str) -> String {
    format!("\"{name}\"")
}

/// A server error while doing `action`, with its SQLSTATE.
pub(super) fn pg_err(action: &'static str) -> impl FnOnce(postgres::Error) -> UploadError {
    move |e| {
        let message = match e.as_db_error() {
            Some(db) => format!("{} (SQLSTATE {})", db.message(), db.code().code()),
            None => e.to_string(),
        };
        UploadError::Postgres { action, message }
    }
}
