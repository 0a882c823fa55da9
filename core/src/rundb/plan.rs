//! What the planner records: the `corpus_files`, each batch with its `papers`, the
//! `quarantine`, and the plan's settings and state; the embed job adds its failed papers to
//! the quarantine.

use super::error::{sqlite_err, Result};
use super::handle::RunDb;
use crate::fingerprint::Fingerprint;
use crate::quarantine::{QuarantineEntry, QuarantineReason};
use crate::settings::PlanSettings;
use crate::state::PlanState;
use crate::BatchId;
use rusqlite::params;

/// The settings key of the plan's settings, and of its state.
const PLAN_SETTINGS_KEY: &str = "plan";
pub(crate) const PLAN_STATE_KEY: &str = "plan_state";
/// The settings key of the plan's id (see [`RunDb::plan_id`]).
const PLAN_ID_KEY: &str = "plan_id";

/// A corpus file as run.db knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CorpusFileRow {
    pub id: i64,
    pub path: String,
    pub fingerprint: Fingerprint,
    pub planned: bool,
    /// The corpus release the file belongs to (1: the first plan).
    pub release: i64,
}

/// One paper of a batch file, for the `papers` table.
#[derive(Debug, Clone)]
pub struct PlannedPaper {
    pub id: String,
    pub line: u64,
    pub n_chars: u64,
    /// xxh3-64 of its text (see [`crate::paper::text_hash`]): what a later release compares.
    pub text_hash: u64,
    /// Hash of its corpus metadata (see [`crate::paper::meta_hash`]).
    pub meta_hash: u64,
    /// Its corpus file, when the batch packs papers of several files (`None`: the batch's).
    pub file_id: Option<i64>,
}

/// A batch of a release, as packing an update's batches reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReleaseBatch {
    pub id: i64,
    /// Its corpus file (a packed batch's: its first paper's).
    pub file_id: i64,
    pub seq: u64,
    /// Relative to the run directory.
    pub path: String,
    pub rows: u64,
}

/// A batch file that has been written and made durable.
#[derive(Debug, Clone)]
pub struct BatchRecord {
    pub file_id: i64,
    pub seq: u64,
    /// Relative to the run directory.
    pub path: String,
    pub n_chars: u64,
    /// In row order.
    pub papers: Vec<PlannedPaper>,
}

impl RunDb {
    pub fn plan_settings(&self) -> Result<Option<PlanSettings>> {
        self.setting(PLAN_SETTINGS_KEY)
    }

    /// Stores the plan's settings (the first plan of a run directory; later ones compare).
    pub fn set_plan_settings(&self, settings: &PlanSettings) -> Result<()> {
        self.set_setting(PLAN_SETTINGS_KEY, settings)
    }

    /// Where planning stands; `None` before the first plan.
    pub fn plan_state(&self) -> Result<Option<PlanState>> {
        let text: Option<String> = self.setting(PLAN_STATE_KEY)?;
        Ok(text.as_deref().and_then(PlanState::parse))
    }

    pub fn set_plan_state(&self, state: PlanState) -> Result<()> {
        self.set_setting(PLAN_STATE_KEY, &state.as_str())
    }

    /// The plan's id: made once, by the first plan of the run directory (or, for a run planned
    /// before plans had ids, the first time it is asked for), and named by `plan.json` and by
    /// every result manifest, so that nothing made for another plan of the same directory is
    /// ever accepted.
    pub fn plan_id(&self) -> Result<String> {
        if let Some(id) = self.setting::<String>(PLAN_ID_KEY)? {
            return Ok(id);
        }
        let id = format!(
            "p{}",
            crate::handoff::new_attempt_token().trim_start_matches('a')
        );
        // Two owner processes asking at once: the first insert wins, both read it back.
        self.conn
            .execute(
                "INSERT INTO settings (key, value) VALUES (?1, ?2) ON CONFLICT (key) DO NOTHING",
                params![
                    PLAN_ID_KEY,
                    serde_json::to_string(&id).expect("a string serialises")
                ],
            )
            .map_err(sqlite_err(&self.dir))?;
        Ok(self.setting::<String>(PLAN_ID_KEY)?.unwrap_or(id))
    }

    /// The ids of the papers a batch embeds (its rows less later duplicates), in row order.
    pub fn papers_to_embed(&self, batch_id: BatchId) -> Result<Vec<String>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT id FROM papers WHERE batch_id = ?1 AND duplicate_of IS NULL ORDER BY row",
            )
            .map_err(sqlite_err(&self.dir))?;
        let ids = stmt
            .query_map([batch_id], |r| r.get(0))
            .and_then(|r| r.collect::<rusqlite::Result<Vec<String>>>());
        ids.map_err(sqlite_err(&self.dir))
    }

    /// True once the whole corpus is planned (what an embed job and the submit loop wait for).
    pub fn is_planned(&self) -> Result<bool> {
        Ok(self.plan_state()? == Some(PlanState::Complete))
    }

    /// Quarantines papers of a batch that could not be embedded (replacing what an earlier run
    /// of the batch recorded for them).
    pub fn record_embed_failures(
        &self,
        batch_id: BatchId,
        failed: &[(String, String)],
    ) -> Result<()> {
        let reason = crate::quarantine::QuarantineReason::EmbedFailed.as_str();
        for (id, why) in failed {
            self.conn
                .execute(
                    "DELETE FROM quarantine WHERE reason = ?1 AND paper_id = ?2",
                    params![reason, id],
                )
                .map_err(sqlite_err(&self.dir))?;
            self.conn
                .execute(
                    "INSERT INTO quarantine (file_id, line, reason, detail, paper_id)
                     SELECT coalesce(p.file_id, b.file_id), p.line, ?1, ?2, p.id FROM papers p JOIN batches b ON b.id = p.batch_id
                     WHERE p.batch_id = ?3 AND p.id = ?4 AND p.duplicate_of IS NULL LIMIT 1",
                    params![reason, why, batch_id, id],
                )
                .map_err(sqlite_err(&self.dir))?;
        }
        Ok(())
    }

    /// The first `limit` quarantined papers (paper id, reason, detail), oldest first: what a
    /// report lists by name; `status` has the counts.
    pub fn quarantine_sample(&self, limit: u32) -> Result<Vec<(String, String, String)>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT coalesce(paper_id, ''), reason, detail FROM quarantine
                 ORDER BY rowid LIMIT ?1",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([limit], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)));
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    pub fn corpus_files(&self) -> Result<Vec<CorpusFileRow>> {
        let mut stmt = self
            .conn
            .prepare("SELECT id, path, size, mtime_ns, edges, state, release FROM corpus_files ORDER BY id")
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt
            .query_map([], |r| {
                Ok(CorpusFileRow {
                    id: r.get(0)?,
                    path: r.get(1)?,
                    fingerprint: Fingerprint {
                        size: r.get(2)?,
                        mtime_ns: r.get(3)?,
                        edges: r.get(4)?,
                    },
                    planned: r.get::<_, String>(5)? == "planned",
                    release: r.get(6)?,
                })
            })
            .and_then(|rows| rows.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(sqlite_err(&self.dir));
        rows
    }

    /// Records the corpus of a release, in corpus order.
    pub fn add_corpus_files(
        &mut self,
        release: i64,
        files: &[(String, Fingerprint)],
    ) -> Result<()> {
        let tx = self.conn.transaction().map_err(sqlite_err(&self.dir))?;
        for (path, fp) in files {
            tx.execute(
                "INSERT INTO corpus_files (path, size, mtime_ns, edges, release) VALUES (?1, ?2, ?3, ?4, ?5)",
                params![path, fp.size, fp.mtime_ns, fp.edges, release],
            )
            .map_err(sqlite_err(&self.dir))?;
        }
        tx.commit().map_err(sqlite_err(&self.dir))
    }

    /// Forgets everything a killed plan recorded for a file that did not finish, returning the
    /// batch files (relative paths) to delete.
    pub fn reset_file(&mut self, file_id: i64) -> Result<Vec<String>> {
        let tx = self.conn.transaction().map_err(sqlite_err(&self.dir))?;
        let paths = {
            let mut stmt = tx
                .prepare("SELECT path FROM batches WHERE file_id = ?1")
                .map_err(sqlite_err(&self.dir))?;
            let paths = stmt
                .query_map([file_id], |r| r.get(0))
                .and_then(|r| r.collect::<rusqlite::Result<Vec<String>>>());
            paths.map_err(sqlite_err(&self.dir))?
        };
        tx.execute_batch(&format!(
            "DELETE FROM papers WHERE batch_id IN (SELECT id FROM batches WHERE file_id = {file_id});
             DELETE FROM batches WHERE file_id = {file_id};
             DELETE FROM quarantine WHERE file_id = {file_id};
             DELETE FROM release_seen WHERE file_id = {file_id};
             UPDATE corpus_files SET state = 'pending' WHERE id = {file_id};"
        ))
        .map_err(sqlite_err(&self.dir))?;
        tx.commit().map_err(sqlite_err(&self.dir))?;
        Ok(paths)
    }

    /// Forgets the run's first plan, so that the next `plan` is a first plan again (other files,
    /// other settings): for a plan that could use none of its input. Only while nothing
    /// depends on it: one release, and no job ever sent. Returns the batch files to remove
    /// (relative to the run directory), `None` when the plan is kept.
    pub fn discard_first_plan(&mut self) -> Result<Option<Vec<String>>> {
        let err = sqlite_err(&self.dir);
        let tx = self.conn.transaction().map_err(&err)?;
        let kept: bool = tx
            .query_row(
                "SELECT (SELECT count(*) FROM releases) > 1 OR EXISTS (SELECT 1 FROM jobs)",
                [],
                |r| r.get(0),
            )
            .map_err(&err)?;
        if kept {
            return Ok(None);
        }
        let paths = {
            let mut stmt = tx.prepare("SELECT path FROM batches").map_err(&err)?;
            let paths = stmt
                .query_map([], |r| r.get(0))
                .and_then(|r| r.collect::<rusqlite::Result<Vec<String>>>());
            paths.map_err(&err)?
        };
        tx.execute_batch(
            "DELETE FROM papers; DELETE FROM batches; DELETE FROM quarantine;
             DELETE FROM release_seen; DELETE FROM corpus_files; DELETE FROM releases;",
        )
        .map_err(&err)?;
        for key in [PLAN_SETTINGS_KEY, PLAN_STATE_KEY, PLAN_ID_KEY] {
            tx.execute("DELETE FROM settings WHERE key = ?1", [key])
                .map_err(&err)?;
        }
        tx.commit().map_err(&err)?;
        Ok(Some(paths))
    }

    /// The corpus files of `release` that stop its plan, each with its first quarantined
    /// record's reason and detail: a file from which no record could be used because its
    /// fields are named otherwise (no `id`, no `text`: `paper_id` for `id`), or any file of a
    /// release from which no record at all could be used. A file whose records have the fields
    /// but are empty, duplicates or malformed is quarantined, not a stop: the plan goes on.
    pub fn unusable_files(&self, release: i64) -> Result<Vec<(String, String, String)>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT f.path, q.reason, q.detail FROM corpus_files f
                 JOIN quarantine q ON q.rowid =
                     (SELECT min(rowid) FROM quarantine WHERE file_id = f.id)
                 WHERE f.release = ?1 AND f.state = 'planned' AND f.papers = 0
                     AND f.quarantined > 0
                     AND (EXISTS (SELECT 1 FROM quarantine n WHERE n.file_id = f.id
                                  AND n.reason IN ('missing_id', 'missing_text'))
                          OR NOT EXISTS (SELECT 1 FROM corpus_files g
                                         WHERE g.release = ?1 AND g.papers > 0))
                 ORDER BY f.id",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([release], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)));
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    /// Every corpus file of the run from which no record could be used, each with its first
    /// quarantined record's reason and detail, in corpus order: what a plan that went on
    /// without them reports (see [`RunDb::unusable_files`] for those that stop it).
    pub fn files_without_papers(&self) -> Result<Vec<(String, String, String)>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT f.path, q.reason, q.detail FROM corpus_files f
                 JOIN quarantine q ON q.rowid =
                     (SELECT min(rowid) FROM quarantine WHERE file_id = f.id)
                 WHERE f.state = 'planned' AND f.papers = 0 AND f.quarantined > 0
                 ORDER BY f.id",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)));
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    /// Takes the new fingerprints of corpus files nothing is planned from yet (see
    /// `reset_file`): they are read anew, as they are now.
    pub fn refresh_fingerprints(&self, files: &[(i64, Fingerprint)]) -> Result<()> {
        for (id, fp) in files {
            self.conn
                .execute(
                    "UPDATE corpus_files SET size = ?2, mtime_ns = ?3, edges = ?4
                     WHERE id = ?1 AND state = 'pending'",
                    params![id, fp.size, fp.mtime_ns, fp.edges],
                )
                .map_err(sqlite_err(&self.dir))?;
        }
        Ok(())
    }

    /// Records a durable batch file and its papers in one transaction.
    pub fn record_batch(&mut self, batch: &BatchRecord) -> Result<i64> {
        let tx = self.conn.transaction().map_err(sqlite_err(&self.dir))?;
        let batch_id = insert_batch(&tx, batch).map_err(sqlite_err(&self.dir))?;
        tx.commit().map_err(sqlite_err(&self.dir))?;
        Ok(batch_id)
    }

    /// The batches planned from the files of `release`, in corpus order (file, then seq).
    pub fn release_batches(&self, release: i64) -> Result<Vec<ReleaseBatch>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT b.id, b.file_id, b.seq, b.path, b.n_rows FROM batches b
                 JOIN corpus_files f ON f.id = b.file_id WHERE f.release = ?1
                 ORDER BY b.file_id, b.seq",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([release], |r| {
            Ok(ReleaseBatch {
                id: r.get(0)?,
                file_id: r.get(1)?,
                seq: r.get(2)?,
                path: r.get(3)?,
                rows: r.get(4)?,
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// The corpus file of each row of a batch, in row order.
    pub fn row_files(&self, batch_id: i64) -> Result<Vec<i64>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT coalesce(p.file_id, b.file_id) FROM papers p JOIN batches b ON b.id = p.batch_id
                 WHERE p.batch_id = ?1 ORDER BY p.row",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([batch_id], |r| r.get(0));
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }

    /// Replaces batches `old` (not yet embedded) by `new`, in one transaction: a kill leaves
    /// either. Returns the new batches' ids.
    pub fn replace_batches(&mut self, old: &[i64], new: &[BatchRecord]) -> Result<Vec<i64>> {
        let tx = self.conn.transaction().map_err(sqlite_err(&self.dir))?;
        let mut ids = Vec::with_capacity(new.len());
        for batch in new {
            ids.push(insert_batch(&tx, batch).map_err(sqlite_err(&self.dir))?);
        }
        for id in old {
            tx.execute("DELETE FROM papers WHERE batch_id = ?1", [id])
                .and_then(|_| tx.execute("DELETE FROM batches WHERE id = ?1", [id]))
                .map_err(sqlite_err(&self.dir))?;
        }
        tx.commit().map_err(sqlite_err(&self.dir))?;
        Ok(ids)
    }

    pub fn record_quarantine(&mut self, file_id: i64, entries: &[QuarantineEntry]) -> Result<()> {
        let tx = self.conn.transaction().map_err(sqlite_err(&self.dir))?;
        {
            let mut insert = tx
                .prepare_cached(
                    "INSERT INTO quarantine (file_id, line, reason, detail, paper_id, first_occurrence)
                     VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                )
                .map_err(sqlite_err(&self.dir))?;
            for q in entries {
                insert
                    .execute(params![
                        file_id,
                        q.line,
                        q.reason.as_str(),
                        q.detail,
                        q.id,
                        q.first_occurrence
                    ])
                    .map_err(sqlite_err(&self.dir))?;
            }
        }
        tx.commit().map_err(sqlite_err(&self.dir))
    }

    /// Marks a file planned, with what reading it came to.
    pub fn finish_file(&self, file_id: i64, summary: &crate::corpus::FileSummary) -> Result<()> {
        let sources = serde_json::to_string(&summary.sources)
            .expect("a map of counts serialises. This is a bug.");
        self.conn
            .execute(
                "UPDATE corpus_files SET state = 'planned', papers = ?2, quarantined = ?3, filtered = ?4, corrupt = ?5,
                     sources = ?6
                 WHERE id = ?1",
                params![
                    file_id,
                    summary.papers,
                    summary.quarantined,
                    summary.filtered,
                    summary.corrupt.as_deref(),
                    sources
                ],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// The `source` values of the run's papers with how many papers of the planned files had
    /// each; `None` when a file was planned by an embedfleet that did not count them (before
    /// schema v15): then the values are not known.
    pub fn source_values(&self) -> Result<Option<std::collections::BTreeMap<String, u64>>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT sources FROM corpus_files WHERE state = 'planned'")
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt
            .query_map([], |r| r.get::<_, Option<String>>(0))
            .and_then(|r| r.collect::<rusqlite::Result<Vec<_>>>())
            .map_err(sqlite_err(&self.dir))?;
        let mut all = std::collections::BTreeMap::new();
        for row in rows {
            let Some(json) = row else { return Ok(None) };
            let counts: std::collections::BTreeMap<String, u64> = serde_json::from_str(&json)
                .map_err(|source| super::RunDbError::Setting {
                    dir: self.dir.clone(),
                    key: "corpus_files.sources".into(),
                    cause: source,
                })?;
            for (source, n) in counts {
                *all.entry(source).or_insert(0) += n;
            }
        }
        Ok(Some(all))
    }

    /// How many later duplicates the run's releases had (planned rows excluded from their
    /// batch, and rows an update saw unchanged), each quarantined once.
    pub fn duplicates(&self) -> Result<u64> {
        self.conn
            .query_row(
                "SELECT (SELECT count(*) FROM papers WHERE duplicate_of IS NOT NULL)
                      + (SELECT count(*) FROM release_seen WHERE duplicate_of IS NOT NULL)",
                [],
                |r| r.get(0),
            )
            .map_err(sqlite_err(&self.dir))
    }

    /// Rows of a batch file that are not to be embedded (later duplicates), sorted.
    pub fn excluded_rows(&self, batch_id: BatchId) -> Result<Vec<u64>> {
        let mut stmt = self
            .conn
            .prepare("SELECT row FROM papers WHERE batch_id = ?1 AND duplicate_of IS NOT NULL ORDER BY row")
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt
            .query_map([batch_id], |r| r.get(0))
            .and_then(|r| r.collect::<rusqlite::Result<Vec<u64>>>());
        rows.map_err(sqlite_err(&self.dir))
    }

    /// Every quarantine entry, in corpus order.
    pub fn quarantine_entries(&self) -> Result<Vec<QuarantineEntry>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT f.path, q.line, q.reason, q.detail, q.paper_id, q.first_occurrence
                 FROM quarantine q JOIN corpus_files f ON f.id = q.file_id ORDER BY q.file_id, q.line, q.rowid",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| {
            let reason: String = r.get(2)?;
            Ok(QuarantineEntry {
                file: r.get(0)?,
                line: r.get(1)?,
                reason: QuarantineReason::parse(&reason).unwrap_or(QuarantineReason::InvalidJson),
                detail: r.get(3)?,
                id: r.get(4)?,
                first_occurrence: r.get(5)?,
            })
        });
        rows.and_then(|r| r.collect::<rusqlite::Result<_>>())
            .map_err(sqlite_err(&self.dir))
    }
}

/// Inserts a batch and its paper rows; returns its id.
fn insert_batch(tx: &rusqlite::Transaction, batch: &BatchRecord) -> rusqlite::Result<i64> {
    tx.execute(
        "INSERT INTO batches (file_id, seq, path, n_rows, n_chars) VALUES (?1, ?2, ?3, ?4, ?5)",
        params![
            batch.file_id,
            batch.seq,
            batch.path,
            batch.papers.len(),
            batch.n_chars
        ],
    )?;
    let batch_id = tx.last_insert_rowid();
    let mut insert = tx.prepare_cached(
        "INSERT INTO papers (id, batch_id, row, line, n_chars, text_hash, meta_hash, file_id)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
    )?;
    for (row, p) in batch.papers.iter().enumerate() {
        insert.execute(params![
            p.id,
            batch_id,
            row,
            p.line,
            p.n_chars,
            p.text_hash as i64,
            p.meta_hash as i64,
            p.file_id
        ])?;
    }
    Ok(batch_id)
}
