//! Removing what the run no longer needs of its attempts: the files of every attempt at a
//! batch but the accepted one (by the names their manifests give, never by listing `shards/`),
//! and the temporary files killed writers left (in a full sweep only).

use super::super::error::{sqlite_err, Result, RunDbError};
use super::super::handle::RunDb;
use crate::handoff::AttemptManifest;
use crate::state::{AttemptState, BatchState};
use crate::{atomic, BatchId, RunLayout};
use rusqlite::params;
use std::path::PathBuf;

impl RunDb {
    /// Removes the temporary files killed writers left in `shards/` for settled batches (one
    /// listing of `shards/`: only in a full sweep, never per poll). A temporary file of a batch
    /// still open may be a live writer's: it stays.
    pub(super) fn remove_orphan_temporaries(&self, layout: &RunLayout) -> Result<()> {
        crate::fsops::count(1);
        let Ok(entries) = std::fs::read_dir(layout.shard_dir()) else {
            return Ok(());
        };
        let temporaries: Vec<(i64, PathBuf)> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                if !name.ends_with(atomic::TMP_SUFFIX) {
                    return None;
                }
                let batch = name.strip_prefix('b')?.split('-').next()?.parse().ok()?;
                Some((batch, e.path()))
            })
            .collect();
        if temporaries.is_empty() {
            return Ok(());
        }
        let settled = self.settled_batches()?;
        let failed = self.batches_in_state(BatchState::Failed)?;
        let orphans: Vec<PathBuf> = temporaries
            .into_iter()
            .filter(|(b, _)| settled.contains(b) || failed.contains(b))
            .map(|(_, p)| p)
            .collect();
        remove_files(&orphans).map(drop)
    }

    /// Removes the files of every attempt at `batch` but the accepted one, by the names its
    /// manifest's parts give them (no listing of `shards/`, which holds ~16,600 files at the
    /// study's scale), and records the attempts that never finished as abandoned. Temporary
    /// files of killed writers have no predictable name: the full sweep removes those.
    pub(super) fn clean_attempts(&self, layout: &RunLayout, batch: i64) -> Result<u64> {
        let kept = self.shards_of(BatchId(batch))?;
        let accepted = self.accepted_attempt(batch)?;
        let tokens = manifest_tokens(layout, batch);
        let known = self.attempts_of(batch)?;
        let max_parts: usize = self
            .conn
            .query_row(
                "SELECT max(n_rows, 1) FROM batches WHERE id = ?1",
                [batch],
                |r| r.get::<_, i64>(0),
            )
            .map_err(sqlite_err(&self.dir))?
            .try_into()
            .unwrap_or(1);
        let mut removed = 0;
        for token in &tokens {
            if Some(token) == accepted.as_ref() {
                continue;
            }
            // Its own count of parts when its manifest reads, else the accepted attempt's:
            // every attempt of one plan and settings has the same parts. The manifest's count
            // is bounded by the batch's rows (a shard holds at least one paper): anyone who
            // can write `results/` could claim 4,294,967,295 parts, a path each.
            crate::fsops::count(1);
            let manifest = AttemptManifest::read(layout, batch, token).ok();
            let claimed = manifest.as_ref().map_or(0, |m| m.parts as usize);
            let parts = claimed.min(max_parts).max(kept.len());
            let names: Vec<PathBuf> = (0..parts as u32)
                .map(|part| layout.resolve(RunLayout::shard_file_name(batch, part, token)))
                .filter(|p| !kept.iter().any(|k| layout.resolve(&k.path) == *p))
                .collect();
            removed += remove_files(&names)?;
            if !known.contains_key(token) {
                // Its job and host from its unfinished manifest, where it reads: the report
                // counts attempts per host, a killed host's included.
                let why = "it did not finish and another attempt did the batch";
                let job = manifest.as_ref().and_then(|m| m.job.as_deref());
                let host = manifest.as_ref().map(|m| m.host.as_str());
                self.record_attempt(batch, token, AttemptState::Abandoned, job, host, why)?;
            }
        }
        crate::fsops::count(1);
        let _ = atomic::remove_leftovers(&layout.batch_results_dir(batch));
        self.conn
            .execute(
                "UPDATE attempts SET cleaned = 1 WHERE batch_id = ?1 AND state != ?2",
                params![batch, AttemptState::Accepted.as_str()],
            )
            .map_err(sqlite_err(&self.dir))?;
        self.conn
            .execute(
                "UPDATE batches SET results_settled = 1 WHERE id = ?1 AND state = ?2",
                params![batch, BatchState::Done.as_str()],
            )
            .map_err(sqlite_err(&self.dir))?;
        Ok(removed)
    }
}

/// Removes `path`; true if this call removed it. A file already gone is done: another of the
/// owner's processes (`status` beside the submit loop, an upload worker) may be cleaning the
/// same batch at the same moment.
pub(super) fn remove_if_there(path: &std::path::Path) -> Result<bool> {
    crate::fsops::count(1);
    match std::fs::remove_file(path) {
        Ok(()) => Ok(true),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(false),
        Err(source) => Err(RunDbError::Io {
            action: "remove",
            path: path.to_path_buf(),
            cause: source,
        }),
    }
}

/// Removes `paths`; how many this call removed.
pub(super) fn remove_files(paths: &[PathBuf]) -> Result<u64> {
    let mut removed = 0;
    for path in paths {
        removed += u64::from(remove_if_there(path)?);
    }
    Ok(removed)
}

/// The attempt tokens of `batch`'s manifests, from their file names.
pub(super) fn manifest_tokens(layout: &RunLayout, batch: i64) -> Vec<String> {
    crate::fsops::count(1);
    let Ok(entries) = std::fs::read_dir(layout.batch_results_dir(batch)) else {
        return Vec::new();
    };
    let mut tokens: Vec<String> = entries
        .filter_map(|e| e.ok())
        .map(|e| e.path())
        .filter(|p| p.extension().is_some_and(|e| e == "json"))
        .map(|p| file_token(&p))
        .collect();
    tokens.sort();
    tokens
}

fn file_token(path: &std::path::Path) -> String {
    path.file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default()
}
