//! The owner's side of the result manifests: `ingest_results` reads what embed jobs wrote
//! under `results/` and records it in run.db (the `attempts` table says what became of each).
//!
//! Idempotent and safe to kill at any moment: an attempt is accepted in one transaction (its
//! shards, its failed papers, its timings, the batch done, the attempt recorded), so a rerun
//! after a kill either finds it recorded or ingests it whole. The first complete manifest of a
//! batch that verifies (see `AttemptManifest::verify`) wins; later ones are discarded, and
//! once no job of the batch is open the files of every other attempt are removed.

use super::{sqlite_err, stored_state, Result, RunDb, RunDbError, ShardRow};
use crate::handoff::{AttemptManifest, OutputSettings};
use crate::state::{AttemptState, BatchState, JobStatus};
use crate::{atomic, BatchId, RunLayout};
use rusqlite::params;
use std::collections::BTreeMap;

/// What one ingest did, for the caller to report.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct IngestReport {
    /// (batch, attempt) accepted now.
    pub accepted: Vec<(i64, String)>,
    /// (batch, attempt, state, why) for every attempt recorded now as not accepted.
    pub not_accepted: Vec<(i64, String, AttemptState, String)>,
    /// Files of attempts that were not accepted, removed now.
    pub files_removed: u64,
}

impl IngestReport {
    /// One line per event, for a console.
    pub fn lines(&self) -> Vec<String> {
        let mut out: Vec<String> = self
            .accepted
            .iter()
            .map(|(b, a)| format!("batch {b}: attempt {a} accepted"))
            .collect();
        out.extend(
            self.not_accepted
                .iter()
                .map(|(b, a, state, why)| format!("batch {b}: attempt {a} {state}: {why}")),
        );
        out
    }
}

/// The environment variable that makes the owner SIGKILL itself at a named point (tests of
/// kill-anywhere resumption): `ingest` (inside the transaction accepting an attempt) or
/// `resolve_duplicates` (inside the plan's duplicate resolution).
pub const TEST_KILL_ENV: &str = "EMBEDFLEET_TEST_KILL_AT";

/// SIGKILLs this process when [`TEST_KILL_ENV`] names `point`.
pub(crate) fn test_kill_point(point: &str) {
    if std::env::var(TEST_KILL_ENV).is_ok_and(|v| v == point) {
        // SAFETY: sends a signal to this very process.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

impl RunDb {
    /// Ingests every new result manifest under `results/` (see the module docs).
    pub fn ingest_results(&mut self) -> Result<IngestReport> {
        let Ok(entries) = std::fs::read_dir(self.layout().results_dir()) else {
            return Ok(IngestReport::default());
        };
        let mut batches: Vec<i64> = entries
            .filter_map(|e| e.ok())
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                name.strip_prefix('b')?.parse().ok()
            })
            .collect();
        batches.sort_unstable();
        self.ingest_batches(&batches)
    }

    /// Ingests the new result manifests of `batches` only (the submit loop, when their job
    /// ends: the other batches wait for the next round's [`RunDb::ingest_results`]).
    pub fn ingest_batches(&mut self, batches: &[i64]) -> Result<IngestReport> {
        let mut report = IngestReport::default();
        let layout = self.layout();
        let settings = OutputSettings::read(&layout).ok().flatten();
        let mut accepted_any = false;
        for &batch in batches {
            accepted_any |= self.ingest_batch(&layout, batch, settings.as_ref(), &mut report)?;
        }
        if accepted_any {
            crate::quarantine::write_jsonl(self).map_err(|source| RunDbError::Io {
                action: "write",
                path: layout.quarantine_file(),
                source,
            })?;
        }
        Ok(report)
    }

    fn ingest_batch(
        &mut self,
        layout: &RunLayout,
        batch: i64,
        settings: Option<&OutputSettings>,
        report: &mut IngestReport,
    ) -> Result<bool> {
        let known = self.attempts_of(batch)?;
        let tokens = manifest_tokens(layout, batch);
        let new: Vec<&String> = tokens.iter().filter(|t| !known.contains_key(*t)).collect();
        let uncleaned = known
            .values()
            .any(|(state, cleaned)| *state != AttemptState::Accepted && !cleaned);
        if new.is_empty() && !uncleaned {
            return Ok(false);
        }
        let Some(row) = self.batch(BatchId(batch))? else {
            return Ok(false); // a results directory of a batch this run does not have
        };
        let papers = row.n_rows - row.n_excluded;
        let mut manifests: Vec<AttemptManifest> = Vec::new();
        for token in new {
            let token = token.clone();
            match AttemptManifest::read(layout, batch, &token) {
                Ok(m) if m.batch == batch && m.attempt == token => manifests.push(m),
                // Written atomically, so a manifest that does not parse (or names another
                // batch or attempt) is not a half-written one: reject it, saying why.
                other => {
                    let why = match other {
                        Err(e) => e.to_string(),
                        Ok(_) => "its batch or attempt does not match its file name".into(),
                    };
                    self.record_attempt(batch, &token, AttemptState::Rejected, None, None, &why)?;
                    report
                        .not_accepted
                        .push((batch, token, AttemptState::Rejected, why));
                }
            }
        }
        // The first to finish wins.
        manifests.sort_by(|a, b| {
            let end = |m: &AttemptManifest| m.finished_unix_s.unwrap_or(f64::INFINITY);
            end(a)
                .total_cmp(&end(b))
                .then_with(|| a.attempt.cmp(&b.attempt))
        });
        let mut accepted_now = false;
        let mut done = row.state == BatchState::Done;
        for m in &manifests {
            let (job, host) = (m.job.as_deref(), Some(m.host.as_str()));
            if let Some(error) = &m.error {
                if self.record_failed(m, error)? {
                    report.not_accepted.push((
                        batch,
                        m.attempt.clone(),
                        AttemptState::Failed,
                        error.clone(),
                    ));
                }
                continue;
            }
            if !m.complete {
                continue; // still running, or killed: its shards may serve a later attempt
            }
            if done {
                let why = match self.accepted_attempt(batch)? {
                    Some(winner) => format!("attempt {winner} of the batch was accepted first"),
                    None => "the batch was done before".to_string(),
                };
                self.record_attempt(batch, &m.attempt, AttemptState::Discarded, job, host, &why)?;
                report
                    .not_accepted
                    .push((batch, m.attempt.clone(), AttemptState::Discarded, why));
                continue;
            }
            if let Err(why) = m.verify(layout, papers, settings) {
                self.record_attempt(batch, &m.attempt, AttemptState::Rejected, job, host, &why)?;
                report
                    .not_accepted
                    .push((batch, m.attempt.clone(), AttemptState::Rejected, why));
                continue;
            }
            if self.accept(m)? {
                report.accepted.push((batch, m.attempt.clone()));
                accepted_now = true;
            }
            done = true;
        }
        if done && !self.has_open_job(batch)? {
            report.files_removed += self.clean_attempts(layout, batch)?;
        }
        Ok(accepted_now)
    }

    /// Records `m` as the batch's result, in one transaction; false when another of the owner's
    /// processes (`status` beside the submit loop, say) accepted an attempt of the batch first.
    fn accept(&self, m: &AttemptManifest) -> Result<bool> {
        let batch = BatchId(m.batch);
        self.ingest_transaction(|| {
            if self.accepted_attempt(m.batch)?.is_some() {
                return Ok(false);
            }
            self.conn
                .execute("DELETE FROM shards WHERE batch_id = ?1", [batch])
                .map_err(sqlite_err(&self.dir))?;
            let mut failed = Vec::new();
            for s in &m.shards {
                self.record_shard(&ShardRow {
                    batch_id: batch,
                    part: s.part,
                    path: s.file.clone(),
                    rows: s.rows,
                    sha256: s.sha256.clone(),
                })?;
                failed.extend(s.failed.iter().cloned());
            }
            self.record_embed_failures(batch, &failed)?;
            self.record_manifest_run(m, None)?;
            self.set_batch_state(batch, BatchState::Done)?;
            self.record_attempt(
                m.batch,
                &m.attempt,
                AttemptState::Accepted,
                m.job.as_deref(),
                Some(&m.host),
                "",
            )?;
            Ok(true)
        })
    }

    /// Records a failed attempt and its run, in one transaction (a kill between the two would
    /// count the run again on the next ingest); false when it was recorded already.
    fn record_failed(&self, m: &AttemptManifest, error: &str) -> Result<bool> {
        self.ingest_transaction(|| {
            if self.attempts_of(m.batch)?.contains_key(&m.attempt) {
                return Ok(false);
            }
            self.record_manifest_run(m, Some(error))?;
            let (job, host) = (m.job.as_deref(), Some(m.host.as_str()));
            self.record_attempt(m.batch, &m.attempt, AttemptState::Failed, job, host, error)?;
            Ok(true)
        })
    }

    /// The batch run an attempt's manifest tells of.
    fn record_manifest_run(&self, m: &AttemptManifest, error: Option<&str>) -> Result<()> {
        self.record_batch_run(
            BatchId(m.batch),
            m.started_unix_s,
            m.finished_unix_s.unwrap_or(m.started_unix_s),
            &m.devices,
            &m.timings,
            error,
        )
    }

    /// Runs `write` (writes through RunDb's own methods) in one IMMEDIATE transaction:
    /// committed when it returns `Ok`, rolled back otherwise. The `ingest` kill point of the
    /// tests is just before the commit.
    fn ingest_transaction<T>(&self, write: impl FnOnce() -> Result<T>) -> Result<T> {
        self.conn
            .execute_batch("BEGIN IMMEDIATE")
            .map_err(sqlite_err(&self.dir))?;
        match write() {
            Ok(value) => {
                test_kill_point("ingest");
                self.conn
                    .execute_batch("COMMIT")
                    .map(|()| value)
                    .map_err(sqlite_err(&self.dir))
            }
            Err(e) => {
                let _ = self.conn.execute_batch("ROLLBACK");
                Err(e)
            }
        }
    }

    /// Removes the files of every attempt at `batch` but the accepted one (shards not in
    /// run.db, temporary files), and records the attempts that never finished as abandoned.
    fn clean_attempts(&self, layout: &RunLayout, batch: i64) -> Result<u64> {
        let keep: Vec<String> = self
            .shards_of(BatchId(batch))?
            .into_iter()
            .filter_map(|s| {
                std::path::Path::new(&s.path)
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
            })
            .collect();
        let prefix = RunLayout::shard_file_prefix(batch);
        let mut removed = 0;
        if let Ok(entries) = std::fs::read_dir(layout.shard_dir()) {
            for entry in entries.filter_map(|e| e.ok()) {
                let name = entry.file_name().to_string_lossy().into_owned();
                if name.starts_with(&prefix) && !keep.contains(&name) {
                    std::fs::remove_file(entry.path()).map_err(|source| RunDbError::Io {
                        action: "remove",
                        path: entry.path(),
                        source,
                    })?;
                    removed += 1;
                }
            }
        }
        let known = self.attempts_of(batch)?;
        for token in manifest_tokens(layout, batch) {
            if !known.contains_key(&token) {
                let why = "it did not finish and another attempt did the batch";
                self.record_attempt(batch, &token, AttemptState::Abandoned, None, None, why)?;
            }
        }
        let _ = atomic::remove_leftovers(&layout.batch_results_dir(batch));
        self.conn
            .execute(
                "UPDATE attempts SET cleaned = 1 WHERE batch_id = ?1 AND state != ?2",
                params![batch, AttemptState::Accepted.as_str()],
            )
            .map_err(sqlite_err(&self.dir))?;
        Ok(removed)
    }

    fn record_attempt(
        &self,
        batch: i64,
        token: &str,
        state: AttemptState,
        job: Option<&str>,
        host: Option<&str>,
        reason: &str,
    ) -> Result<()> {
        self.conn
            .execute(
                "INSERT INTO attempts (batch_id, token, state, job, host, reason, ingested_at)
                 VALUES (?1, ?2, ?3, ?4, ?5, ?6, strftime('%Y-%m-%dT%H:%M:%fZ', 'now'))
                 ON CONFLICT (batch_id, token) DO NOTHING",
                params![batch, token, state.as_str(), job, host, reason],
            )
            .map(drop)
            .map_err(sqlite_err(&self.dir))
    }

    /// The recorded attempts of `batch`: token → (state, cleaned).
    fn attempts_of(&self, batch: i64) -> Result<BTreeMap<String, (AttemptState, bool)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT token, state, cleaned FROM attempts WHERE batch_id = ?1")
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([batch], |r| {
            Ok((
                r.get::<_, String>(0)?,
                (
                    stored_state(r.get::<_, String>(1)?, AttemptState::parse)?,
                    r.get::<_, bool>(2)?,
                ),
            ))
        });
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    /// The attempt whose shards the batch has.
    pub fn accepted_attempt(&self, batch: i64) -> Result<Option<String>> {
        use rusqlite::OptionalExtension;
        self.conn
            .query_row(
                "SELECT token FROM attempts WHERE batch_id = ?1 AND state = ?2",
                params![batch, AttemptState::Accepted.as_str()],
                |r| r.get(0),
            )
            .optional()
            .map_err(sqlite_err(&self.dir))
    }

    /// Every recorded attempt of the run: (batch, token, state, reason), in batch order.
    pub fn attempts(&self) -> Result<Vec<(i64, String, AttemptState, String)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT batch_id, token, state, coalesce(reason, '') FROM attempts ORDER BY batch_id, ingested_at, token")
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([], |r| {
            Ok((
                r.get(0)?,
                r.get(1)?,
                stored_state(r.get::<_, String>(2)?, AttemptState::parse)?,
                r.get(3)?,
            ))
        });
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    fn has_open_job(&self, batch: i64) -> Result<bool> {
        let sql = format!(
            "SELECT count(*) FROM jobs WHERE batch_id = ?1 AND state IN {}",
            JobStatus::open_sql()
        );
        let n: i64 = self
            .conn
            .query_row(&sql, [batch], |r| r.get(0))
            .map_err(sqlite_err(&self.dir))?;
        Ok(n > 0)
    }
}

/// The attempt tokens of `batch`'s manifests, from their file names.
fn manifest_tokens(layout: &RunLayout, batch: i64) -> Vec<String> {
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
