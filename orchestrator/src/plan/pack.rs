//! Packing an update's papers into full batches across corpus files.
//!
//! Files plan in parallel, so each ends with a part-filled batch. For a first plan that is one
//! small job per file among thousands of full ones. An update plans only what a release
//! changed, spread thinly over every file: 125 papers over 5 files made 5 jobs, 5 nodes and 5
//! model loads. Once every file of an update is planned, its part-filled last batches are read
//! back in corpus order (file, then line) and written again as full batches
//! (`batches/rRRRR-NNNNN.parquet`, filled by the plan's own rules), each paper keeping its
//! line and, in run.db, its corpus file (`papers.file_id`). The batch records its first
//! paper's file, whose release it shares.
//!
//! Kill-safe: the new files are written first (a batch file that exists is complete), then
//! run.db swaps the batches in one transaction, then the old files go. A kill before the swap
//! leaves the per-file batches, and the next plan packs them again to the same files; after it,
//! at most one part-filled batch is left, and packing again does nothing.

use super::PlanError;
use embedfleet_core::batchfile::{self, BatchWriter};
use embedfleet_core::paper::{meta_hash, text_hash};
use embedfleet_core::rundb::{BatchRecord, PlannedPaper, RunDb};
use embedfleet_core::settings::PlanSettings;
use embedfleet_core::RunLayout;
use std::path::Path;

/// `batches.seq` of the first packed batch: apart from any file's own batches (UNIQUE (file_id,
/// seq)).
pub const PACKED_SEQ_BASE: u64 = 1_000_000;

/// What packing did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct Packed {
    /// Part-filled batches read.
    pub from: usize,
    /// Batches written instead.
    pub into: usize,
}

/// Packs the part-filled last batches of `release`'s files (see the module docs).
pub(super) fn pack_release(
    db: &mut RunDb,
    run_dir: &Path,
    release: i64,
    settings: &PlanSettings,
) -> Result<Packed, PlanError> {
    let batches = db.release_batches(release)?;
    // The last batch of each file, when it is part-filled (packed batches have no file's seq).
    let mut partial = Vec::new();
    for (i, b) in batches.iter().enumerate() {
        let last_of_file = batches
            .get(i + 1)
            .is_none_or(|next| next.file_id != b.file_id);
        if last_of_file && b.seq < PACKED_SEQ_BASE && b.rows < settings.papers_per_job {
            partial.push(b);
        }
    }
    if partial.len() < 2 {
        return Ok(Packed::default());
    }
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e: batchfile::BatchFileError| PlanError::BatchFile {
            path: path.clone(),
            message: e.to_string(),
        }
    };
    let mut out = Filler {
        run_dir,
        release,
        settings,
        open: None,
        done: Vec::new(),
    };
    for batch in &partial {
        let files = db.row_files(batch.id)?;
        let full_path = run_dir.join(&batch.path);
        let mut rows = Vec::new();
        batchfile::read(&full_path, |r| rows.push(r)).map_err(io(&full_path))?;
        if rows.len() != files.len() {
            return Err(PlanError::BatchFile {
                path: full_path,
                message: format!(
                    "it holds {} rows where run.db records {}",
                    rows.len(),
                    files.len()
                ),
            });
        }
        for (row, file_id) in rows.into_iter().zip(files) {
            out.add(row, file_id)?;
        }
    }
    out.close()?;
    embedfleet_core::rundb::test_kill_point("pack");
    let old: Vec<i64> = partial.iter().map(|b| b.id).collect();
    db.replace_batches(&old, &out.done)?;
    for batch in &partial {
        match std::fs::remove_file(run_dir.join(&batch.path)) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => {
                return Err(PlanError::Io {
                    path: run_dir.join(&batch.path),
                    cause: e,
                })
            }
            _ => {}
        }
    }
    Ok(Packed {
        from: partial.len(),
        into: out.done.len(),
    })
}

/// Fills packed batches in order, as a file's worker fills its own.
struct Filler<'a> {
    run_dir: &'a Path,
    release: i64,
    settings: &'a PlanSettings,
    open: Option<(BatchWriter, BatchRecord)>,
    done: Vec<BatchRecord>,
}

impl Filler<'_> {
    fn add(&mut self, row: batchfile::BatchRow, file_id: i64) -> Result<(), PlanError> {
        let n_chars = u64::from(row.n_chars);
        if let Some((writer, record)) = &self.open {
            let full = record.papers.len() as u64 >= self.settings.papers_per_job
                || self
                    .settings
                    .max_job_chars
                    .is_some_and(|max| writer.chars() + n_chars > max);
            if full {
                self.close()?;
            }
        }
        if self.open.is_none() {
            let seq = self.done.len() as u64;
            let path = RunLayout::packed_batch_file_name(self.release, seq);
            let writer = BatchWriter::create(&self.run_dir.join(&path)).map_err(|e| {
                PlanError::BatchFile {
                    path: self.run_dir.join(&path),
                    message: e.to_string(),
                }
            })?;
            let record = BatchRecord {
                file_id,
                seq: PACKED_SEQ_BASE + seq,
                path,
                n_chars: 0,
                papers: Vec::new(),
            };
            self.open = Some((writer, record));
        }
        let (writer, record) = self.open.as_mut().expect("opened above");
        writer
            .push(row.line, &row.paper, n_chars)
            .map_err(|e| PlanError::BatchFile {
                path: self.run_dir.join(&record.path),
                message: e.to_string(),
            })?;
        record.papers.push(PlannedPaper {
            text_hash: text_hash(&row.paper.text),
            meta_hash: meta_hash(&row.paper),
            id: row.paper.id,
            line: row.line,
            n_chars,
            file_id: Some(file_id),
        });
        Ok(())
    }

    fn close(&mut self) -> Result<(), PlanError> {
        let Some((writer, mut record)) = self.open.take() else {
            return Ok(());
        };
        record.n_chars = writer.chars();
        writer.finish().map_err(|e| PlanError::BatchFile {
            path: self.run_dir.join(&record.path),
            message: e.to_string(),
        })?;
        self.done.push(record);
        Ok(())
    }
}
