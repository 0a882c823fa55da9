//! Records the planner could not use. Each goes to `quarantine.jsonl` in the run directory with
//! where it was and why; none stops the run.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum QuarantineReason {
    /// The line is not a JSON object.
    InvalidJson,
    /// The line holds bytes that are not UTF-8.
    NonUtf8,
    /// No `id`, or an id that is neither a string nor an integer.
    MissingId,
    /// No `text` field, or not a string.
    MissingText,
    /// `text` is empty or only white space.
    EmptyText,
    /// The same `id` was seen before (see `first_occurrence`).
    DuplicateId,
    /// The file ended or broke off mid-record (truncated gzip member, corrupt zstd frame):
    /// the records before this point are kept.
    CorruptFile,
    /// The embed job could not embed the paper (the detail says why).
    EmbedFailed,
    /// A line longer than any paper can be (a file with no newlines, say): skipped without
    /// holding it in memory; the detail gives its size.
    LineTooLong,
}

impl QuarantineReason {
    pub const ALL: [QuarantineReason; 9] = [
        Self::InvalidJson,
        Self::NonUtf8,
        Self::MissingId,
        Self::MissingText,
        Self::EmptyText,
        Self::DuplicateId,
        Self::CorruptFile,
        Self::EmbedFailed,
        Self::LineTooLong,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::InvalidJson => "invalid_json",
            Self::NonUtf8 => "non_utf8",
            Self::MissingId => "missing_id",
            Self::MissingText => "missing_text",
            Self::EmptyText => "empty_text",
            Self::DuplicateId => "duplicate_id",
            Self::CorruptFile => "corrupt_file",
            Self::EmbedFailed => "embed_failed",
            Self::LineTooLong => "line_too_long",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }
}

/// One line of `quarantine.jsonl`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct QuarantineEntry {
    pub file: String,
    /// 1-based line (JSON lines) or 0-based row (parquet) of the record.
    pub line: u64,
    pub reason: QuarantineReason,
    /// What exactly was wrong, for a person.
    pub detail: String,
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub id: Option<String>,
    /// For duplicates: `file:line` of the occurrence that was kept.
    #[serde(skip_serializing_if = "Option::is_none", default)]
    pub first_occurrence: Option<String>,
}
