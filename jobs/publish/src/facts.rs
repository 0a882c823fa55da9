//! What the dataset card (`README.md`) and `manifest.json` both say of a published folder:
//! its files, the source run's facts, and what is missing.

use crate::error::{io, MissingBatch, PublishError};
use crate::run::Source;
use embedfleet_core::rundb::RunStatus;
use serde::Serialize;
use std::path::Path;

/// Everything the card and the manifest say.
pub struct Facts<'a> {
    pub source: &'a Source,
    pub data: &'a [FileEntry],
    pub queries: &'a [FileEntry],
    pub missing: &'a [MissingBatch],
    pub status: RunStatus,
}

impl Facts<'_> {
    /// Rows in the data files.
    pub fn rows(&self) -> u64 {
        self.data.iter().map(|f| f.rows).sum()
    }

    /// Papers of the missing batches not in any parquet shard.
    pub fn papers_missing(&self) -> u64 {
        self.missing.iter().map(|b| b.missing).sum()
    }

    /// A shard metadata value (`embedfleet.<key>`), `unknown` when the shards lack it.
    pub fn meta(&self, key: &str) -> &str {
        self.meta_given(key).unwrap_or("unknown")
    }

    /// The shards' `embedfleet.{key}`, `None` where they do not say (made before it was
    /// recorded).
    pub fn meta_given(&self, key: &str) -> Option<&str> {
        let key = format!("embedfleet.{key}");
        self.source
            .meta
            .iter()
            .find(|(k, _)| *k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// One data or query file of the folder.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct FileEntry {
    /// Relative to the folder, with `/`.
    pub path: String,
    pub rows: u64,
    pub bytes: u64,
    pub sha256: String,
}

/// Sizes and checksums of the files at `rels` (relative to `dir`), with their rows.
pub fn entries(dir: &Path, rels: &[String], rows: &[u64]) -> Result<Vec<FileEntry>, PublishError> {
    rels.iter()
        .zip(rows)
        .map(|(rel, &rows)| {
            let path = dir.join(rel);
            Ok(FileEntry {
                path: rel.clone(),
                rows,
                bytes: std::fs::metadata(&path).map_err(io(&path))?.len(),
                sha256: embedfleet_core::shardfile::sha256_of(&path).map_err(io(&path))?,
            })
        })
        .collect()
}
