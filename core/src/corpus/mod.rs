//! Streaming readers for peS2o-style corpora: JSON lines (plain, gzip, zstd) and parquet, one
//! file or a directory tree of them. Memory is bounded by one record, whatever the file size.
//!
//! Readers never stop on a bad record: each one is handed back as a [`QuarantineEntry`]. A file
//! that breaks off (truncated gzip member, corrupt frame) ends with a `corrupt_file` entry naming
//! the line and byte where reading stopped; everything before it is kept.

mod json;
mod lines;
mod parquet_input;

use crate::paper::Paper;
use crate::quarantine::QuarantineEntry;
use std::io::{self, Read};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// A corpus file format, from the file name.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    Jsonl,
    JsonlGz,
    JsonlZst,
    Parquet,
}

impl Format {
    /// The format of `path` by its name: `.jsonl`/`.json`, `.jsonl.gz`/`.json.gz`,
    /// `.jsonl.zst`/`.json.zst`, `.parquet`.
    pub fn of(path: &Path) -> Option<Format> {
        let name = path.file_name()?.to_str()?.to_ascii_lowercase();
        let base = |suffix: &str| {
            name.strip_suffix(suffix)
                .map(|s| s.ends_with(".jsonl") || s.ends_with(".json"))
        };
        if name.ends_with(".parquet") {
            Some(Format::Parquet)
        } else if base(".gz") == Some(true) {
            Some(Format::JsonlGz)
        } else if base(".zst") == Some(true) {
            Some(Format::JsonlZst)
        } else if name.ends_with(".jsonl") || name.ends_with(".json") {
            Some(Format::Jsonl)
        } else {
            None
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("corpus path {0} does not exist")]
    NotFound(PathBuf),
    #[error(
        "{0} is not a corpus file (expected .jsonl, .jsonl.gz, .json.gz, .jsonl.zst or .parquet)"
    )]
    UnknownFormat(PathBuf),
    #[error("no corpus files (.jsonl, .jsonl.gz, .json.gz, .jsonl.zst, .parquet) under {0}")]
    Empty(PathBuf),
    #[error("failed to read {path}: {cause}")]
    Io { path: PathBuf, cause: io::Error },
    #[error("{path} leads back to {ancestor} (a symbolic link loop in the corpus tree): remove the link or name the corpus files another way")]
    SymlinkLoop { path: PathBuf, ancestor: PathBuf },
}

/// Expands the given paths into corpus files: files as given (their format must be known),
/// directories recursively, each directory's files sorted by name so the order is stable.
/// Run directories (those holding a run.db) found inside are skipped.
pub fn discover(inputs: &[PathBuf]) -> Result<Vec<PathBuf>, CorpusError> {
    let mut files = Vec::new();
    for input in inputs {
        let meta = std::fs::metadata(input).map_err(|_| CorpusError::NotFound(input.clone()))?;
        if meta.is_dir() {
            let before = files.len();
            walk(input, &mut files, &mut Vec::new())?;
            if files.len() == before {
                return Err(CorpusError::Empty(input.clone()));
            }
        } else if Format::of(input).is_some() {
            files.push(input.clone());
        } else {
            return Err(CorpusError::UnknownFormat(input.clone()));
        }
    }
    Ok(files)
}

/// `ancestors` holds the canonical paths of the directories above `dir`: a directory that is
/// its own ancestor (through a symbolic link) is a loop, reported rather than followed forever.
fn walk(
    dir: &Path,
    files: &mut Vec<PathBuf>,
    ancestors: &mut Vec<PathBuf>,
) -> Result<(), CorpusError> {
    let io_err = |source| CorpusError::Io {
        path: dir.to_path_buf(),
        cause: source,
    };
    let canonical = std::fs::canonicalize(dir).map_err(io_err)?;
    if let Some(ancestor) = ancestors.iter().find(|a| **a == canonical) {
        return Err(CorpusError::SymlinkLoop {
            path: dir.to_path_buf(),
            ancestor: ancestor.clone(),
        });
    }
    ancestors.push(canonical);
    let mut entries: Vec<PathBuf> = std::fs::read_dir(dir)
        .map_err(io_err)?
        .map(|e| e.map(|e| e.path()))
        .collect::<Result<_, _>>()
        .map_err(io_err)?;
    entries.sort();
    for path in entries {
        if path.is_dir() {
            // A run directory inside the corpus tree holds batch files, not corpus files.
            if !crate::RunLayout::new(&path).db().exists() {
                walk(&path, files, ancestors)?;
            }
        } else if Format::of(&path).is_some() {
            files.push(path);
        }
    }
    ancestors.pop();
    Ok(())
}

/// What to keep of each record.
#[derive(Debug, Clone, Default)]
pub struct ReadOptions {
    /// Fields kept besides id, text, source, created, added, version (stored as one JSON object).
    pub keep_fields: Vec<String>,
    /// When not empty, only records whose `source` equals one of these, or starts with one of
    /// these followed by `/` (so `s2orc` selects `s2orc/train`), are read.
    pub sources: Vec<String>,
    /// Added to as compressed input bytes are consumed (for progress bars).
    pub bytes_read: Option<Arc<AtomicU64>>,
}

impl ReadOptions {
    fn source_selected(&self, source: Option<&str>) -> bool {
        if self.sources.is_empty() {
            return true;
        }
        let Some(source) = source else { return false };
        self.sources.iter().any(|want| source_selects(want, source))
    }
}

/// Whether `--source want` (`plan`) or `--filter source=want` (`query`, `eval`) selects a
/// paper of `source`: equal to it, or the part of it before a `/` (`s2orc` selects
/// `s2orc/train`, not `s2orcx`). One rule for both.
pub fn source_selects(want: &str, source: &str) -> bool {
    source == want || (source.starts_with(want) && source.as_bytes().get(want.len()) == Some(&b'/'))
}

/// One record of a corpus file, in file order.
#[derive(Debug)]
pub enum Record {
    Paper {
        /// 1-based line (JSON lines) or 0-based row (parquet).
        line: u64,
        paper: Paper,
    },
    Quarantined(QuarantineEntry),
}

/// What reading one file came to.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct FileSummary {
    pub papers: u64,
    pub quarantined: u64,
    /// Records left out by the source filter.
    pub filtered: u64,
    /// Set when the file broke off: where and why. The records before it were delivered.
    pub corrupt: Option<String>,
    /// The kept fields (`ReadOptions::keep_fields`) that no record of the file had.
    pub kept_fields_missing: Vec<String>,
    /// The papers read, by their `source` (a paper without one is not counted): the values a
    /// `--filter source=…` of the run can select.
    pub sources: std::collections::BTreeMap<String, u64>,
}

/// Reads one corpus file, handing each record to `visit` in order. Errors from `visit` stop the
/// read and are returned; problems with the file itself never are — they become quarantine
/// entries and `FileSummary::corrupt`.
pub fn read_file<E>(
    path: &Path,
    options: &ReadOptions,
    mut visit: impl FnMut(Record) -> Result<(), E>,
) -> Result<FileSummary, ReadError<E>> {
    let format = Format::of(path)
        .ok_or_else(|| ReadError::Corpus(CorpusError::UnknownFormat(path.into())))?;
    let mut summary = FileSummary::default();
    // Each kept field as a paper's `extra` object names it: looked for until found, so a field
    // every record has costs one search.
    let mut unseen: Vec<(&String, String)> = options
        .keep_fields
        .iter()
        .map(|f| (f, format!("{}:", serde_json::Value::String(f.clone()))))
        .collect();
    let (mut papers, mut quarantined, mut filtered) = (0, 0, 0);
    let mut sources = std::collections::BTreeMap::<String, u64>::new();
    let mut count = |record: Record| {
        match &record {
            Record::Paper { paper, .. } => {
                papers += 1;
                if let Some(source) = &paper.source {
                    // A corpus has a handful of sources: a lookup, an allocation only for a new one.
                    match sources.get_mut(source.as_str()) {
                        Some(n) => *n += 1,
                        None => drop(sources.insert(source.clone(), 1)),
                    }
                }
                if let (false, Some(extra)) = (unseen.is_empty(), &paper.extra) {
                    unseen.retain(|(_, named)| !extra.contains(named.as_str()));
                }
            }
            Record::Quarantined(_) => quarantined += 1,
        }
        visit(record)
    };
    let corrupt = match format {
        Format::Parquet => parquet_input::read(path, options, &mut count, &mut filtered)?,
        _ => lines::read(path, format, options, &mut count, &mut filtered)?,
    };
    summary.papers = papers;
    summary.quarantined = quarantined;
    summary.filtered = filtered;
    summary.corrupt = corrupt;
    summary.kept_fields_missing = unseen.into_iter().map(|(f, _)| f.clone()).collect();
    summary.sources = sources;
    Ok(summary)
}

#[derive(Debug, thiserror::Error)]
pub enum ReadError<E> {
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    Visit(E),
}

/// Counts bytes as they are read, so errors can say where a file broke off.
pub(crate) struct CountingReader<R> {
    inner: R,
    pub(crate) count: u64,
    shared: Option<Arc<AtomicU64>>,
}

impl<R> CountingReader<R> {
    pub(crate) fn new(inner: R, shared: Option<Arc<AtomicU64>>) -> Self {
        Self {
            inner,
            count: 0,
            shared,
        }
    }
}

impl<R: Read> Read for CountingReader<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.count += n as u64;
        if let Some(shared) = &self.shared {
            shared.fetch_add(n as u64, Ordering::Relaxed);
        }
        Ok(n)
    }
}

#[cfg(test)]
mod tests;
