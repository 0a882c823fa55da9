//! One paper of the corpus, as the planner keeps it and the embed job reads it back.

use serde::{Deserialize, Serialize};

/// A paper: its id, its full text and the corpus metadata kept for it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, Default)]
pub struct Paper {
    /// The corpus id, as a string (integer ids are written in decimal).
    pub id: String,
    pub text: String,
    pub source: Option<String>,
    pub created: Option<String>,
    pub added: Option<String>,
    pub version: Option<String>,
    /// Other fields kept by `--keep-field`, as one JSON object (`None` when there are none).
    pub extra: Option<String>,
}

impl Paper {
    /// Length in Unicode scalar values, the unit of every character budget.
    pub fn n_chars(&self) -> u64 {
        count_chars(&self.text)
    }
}

/// Counts the `char`s of a string without decoding it: every byte that is not a UTF-8
/// continuation byte starts a char. Vectorises, unlike `str::chars().count()` on older compilers.
pub fn count_chars(s: &str) -> u64 {
    s.as_bytes().iter().filter(|&&b| (b as i8) >= -0x40).count() as u64
}

/// The hash a corpus release's paper is compared by (`plan --update`): xxh3-64 of its text
/// alone, so a release that only touches other fields (`added`, `version`) re-embeds nothing.
pub fn text_hash(text: &str) -> u64 {
    xxhash_rust::xxh3::xxh3_64(text.as_bytes())
}

/// The id of one planned batch: one per-node job's input. Stable once planned.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct BatchId(pub i64);

/// Stored as the `batches.id` integer.
impl rusqlite::ToSql for BatchId {
    fn to_sql(&self) -> rusqlite::Result<rusqlite::types::ToSqlOutput<'_>> {
        self.0.to_sql()
    }
}

impl rusqlite::types::FromSql for BatchId {
    fn column_result(value: rusqlite::types::ValueRef<'_>) -> rusqlite::types::FromSqlResult<Self> {
        i64::column_result(value).map(BatchId)
    }
}

impl std::fmt::Display for BatchId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", self.0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn count_chars_counts_scalar_values() {
        for s in ["", "abc", "héllo", "日本語", "𝔘nicode ✓", "a\u{0301}"] {
            assert_eq!(count_chars(s), s.chars().count() as u64, "{s:?}");
        }
    }
}
