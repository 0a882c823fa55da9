//! The owner's side of the result manifests: `ingest_results` reads what embed jobs wrote
//! under `results/` and records it in run.db (the `attempts` table says what became of each).
//!
//! Idempotent and safe to kill at any moment: an attempt is accepted in one transaction (its
//! shards, its failed papers, its timings, the batch done, the attempt recorded), so a rerun
//! after a kill either finds it recorded or ingests it whole. The first complete manifest of a
//! batch that verifies (see `AttemptManifest::verify`) wins; later ones are discarded, and
//! once no job of the batch is open the files of every other attempt are removed
//! ([`cleaning`]).

mod cleaning;
mod open_work;

use cleaning::{manifest_tokens, remove_if_there};

use super::error::{sqlite_err, stored_state, Result, RunDbError};
use super::handle::RunDb;
use super::shards::ShardRow;
use crate::handoff::{AttemptManifest, ExpectedBatch, HandoffError, OutputSettings, Verdict};
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
    /// Batches with a manifest or a shard that could not be read now (NFS's ESTALE, EIO): the
    /// next ingest reads them again, open work or not.
    pub read_again: Vec<i64>,
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
/// kill-anywhere resumption): `ingest` (inside the transaction accepting an attempt),
/// `accepted` (just after it commits) or `resolve_duplicates` (inside the transaction that
/// settles a planned release: its duplicates, the copies it supersedes or withdraws), `pack`
/// (an update's packed batch files written, run.db not yet swapped to them),
/// `upload_checkpoint` (upserted points made durable, run.db not yet told) or `publish_file`
/// (a published data file finished, the folder not).
pub const TEST_KILL_ENV: &str = "EMBEDFLEET_TEST_KILL_AT";

/// SIGKILLs this process when [`TEST_KILL_ENV`] names `point`.
pub fn test_kill_point(point: &str) {
    if std::env::var(TEST_KILL_ENV).is_ok_and(|v| v == point) {
        // SAFETY: sends a signal to this very process.
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
}

impl RunDb {
    /// Ingests the new result manifests under `results/` (see the module docs). Only the
    /// folders of batches with open work are read: a job open or that changed state in the
    /// last ten minutes, files of an attempt not yet cleaned, or a file the last ingest could
    /// not read (run.db says which, by index; `results/` is not listed). So a poll reads as
    /// many folders as there is open work, not one per batch of the run (2,075 in the
    /// study's). Every [`FULL_SWEEP_ENV`] seconds
    /// (default 15 minutes) `results/` is listed and every folder read, for what no open work
    /// explains: a job the owner lost track of that wrote to a settled batch since, an
    /// `embed-job` run by hand, and temporary files of killed writers in `shards/`.
    pub fn ingest_results(&mut self) -> Result<IngestReport> {
        let layout = self.layout();
        let now = crate::owner::unix_now();
        let last = self.setting::<f64>(LAST_FULL_SWEEP_KEY)?;
        let full = last.is_none_or(|last| now - last >= full_sweep_interval_s() || now < last);
        let folders: Vec<(i64, bool)> = if full {
            crate::fsops::count(1);
            let Ok(entries) = std::fs::read_dir(layout.results_dir()) else {
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
            batches.into_iter().map(|b| (b, false)).collect()
        } else {
            // Between sweeps, only what open work can have written: no listing of results/
            // (a folder per batch ever sent) and no batch-long query.
            self.batches_with_open_work()?
        };
        let report = self.ingest_folders(&folders)?;
        if full {
            self.remove_orphan_temporaries(&layout)?;
            self.set_setting(LAST_FULL_SWEEP_KEY, &now)?;
        }
        Ok(report)
    }

    /// Batches with nothing left for an ingest to do: done, cleaned with no job open since, and
    /// every attempt but the accepted one cleaned.
    fn settled_batches(&self) -> Result<std::collections::HashSet<i64>> {
        let sql = format!(
            "SELECT id FROM batches WHERE state = ?1 AND results_settled = 1
               AND id NOT IN (SELECT batch_id FROM jobs WHERE state IN {})
               AND id NOT IN (SELECT batch_id FROM attempts WHERE cleaned = 0 AND state != ?2)",
            JobStatus::open_sql()
        );
        let mut stmt = self
            .conn
            .prepare_cached(&sql)
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map(
            params![BatchState::Done.as_str(), AttemptState::Accepted.as_str()],
            |r| r.get(0),
        );
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    fn batches_in_state(&self, state: BatchState) -> Result<std::collections::HashSet<i64>> {
        let mut stmt = self
            .conn
            .prepare_cached(&format!(
                "SELECT id FROM batches WHERE state = ?1 AND id NOT IN (SELECT batch_id FROM jobs WHERE state IN {})",
                JobStatus::open_sql()
            ))
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([state.as_str()], |r| r.get(0));
        rows.and_then(|r| r.collect())
            .map_err(sqlite_err(&self.dir))
    }

    /// Ingests the new result manifests of `batches` only (the submit loop, when their job
    /// ends: the other batches wait for the next round's [`RunDb::ingest_results`]).
    pub fn ingest_batches(&mut self, batches: &[i64]) -> Result<IngestReport> {
        let folders: Vec<(i64, bool)> = batches.iter().map(|&b| (b, false)).collect();
        self.ingest_folders(&folders)
    }

    /// Ingests the result folders of `batches`, each with whether it is quiet when empty: a
    /// batch not done with no attempt's files to clean has nothing for an ingest when its
    /// folder holds no manifest (a job still queued, most of a busy poll's open work), so it
    /// costs that one listing and no query.
    fn ingest_folders(&mut self, batches: &[(i64, bool)]) -> Result<IngestReport> {
        let mut report = IngestReport::default();
        let layout = self.layout();
        // A kill between an accept and the rewrite of quarantine.jsonl left it stale.
        self.write_quarantine_if_stale()?;
        let settings = match OutputSettings::read(&layout) {
            Ok(settings) => settings,
            // Unread settings would mean no settings check: ingest nothing until they read,
            // and then read every folder (the next ingest is a full sweep).
            Err(e) => {
                tracing::warn!("not ingesting results this time: {e}");
                self.conn
                    .execute("DELETE FROM settings WHERE key = ?1", [LAST_FULL_SWEEP_KEY])
                    .map_err(sqlite_err(&self.dir))?;
                return Ok(report);
            }
        };
        let plan_id = self.plan_id()?;
        for &(batch, quiet_when_empty) in batches {
            let tokens = manifest_tokens(&layout, batch);
            if quiet_when_empty && tokens.is_empty() {
                continue;
            }
            let found = (batch, tokens);
            self.ingest_batch(&layout, found, &plan_id, settings.as_ref(), &mut report)?;
        }
        self.keep_read_again(batches, &report.read_again)?;
        self.write_quarantine_if_stale()?;
        Ok(report)
    }

    fn ingest_batch(
        &mut self,
        layout: &RunLayout,
        (batch, tokens): (i64, Vec<String>),
        plan_id: &str,
        settings: Option<&OutputSettings>,
        report: &mut IngestReport,
    ) -> Result<()> {
        let mut known = self.attempts_of(batch)?;
        // A rejected attempt whose manifest was rewritten since is verified again.
        for token in &tokens {
            if let Some(recorded) = known.get(token).and_then(|a| a.stamp.as_deref()) {
                if manifest_stamp(layout, batch, token).as_deref() != Some(recorded) {
                    self.forget_rejection(layout, batch, token)?;
                    known.remove(token);
                }
            }
        }
        let new: Vec<&String> = tokens.iter().filter(|t| !known.contains_key(*t)).collect();
        let uncleaned = known
            .values()
            .any(|a| a.state != AttemptState::Accepted && !a.cleaned);
        if new.is_empty() && !uncleaned && self.results_settled(batch)? {
            return Ok(());
        }
        let Some(row) = self.batch(BatchId(batch))? else {
            return Ok(()); // a results directory of a batch this run does not have
        };
        let manifests = self.read_new_manifests(layout, batch, &new, report)?;
        let done = self.take_manifests(
            layout,
            batch,
            row.state == BatchState::Done,
            manifests,
            (plan_id, settings),
            report,
        )?;
        if done && !self.has_open_job(batch)? {
            report.files_removed += self.clean_attempts(layout, batch)?;
        }
        Ok(())
    }

    /// The manifests of `batch`'s attempts this run has not recorded yet, read whole; one
    /// that reads but is wrong is rejected now, one that cannot be read now is left for the
    /// next poll.
    fn read_new_manifests(
        &mut self,
        layout: &RunLayout,
        batch: i64,
        new: &[&String],
        report: &mut IngestReport,
    ) -> Result<Vec<AttemptManifest>> {
        let mut manifests: Vec<AttemptManifest> = Vec::new();
        for &token in new {
            let token = token.clone();
            crate::fsops::count(1);
            let why = match AttemptManifest::read(layout, batch, &token) {
                Ok(m) if m.batch == batch && m.attempt == token => {
                    manifests.push(m);
                    continue;
                }
                Ok(_) => "its batch or attempt does not match its file name".to_string(),
                // Not read: not a verdict (NFS's ESTALE while a job renames it over, EIO);
                // the next poll reads it again. What will not go away by itself — a file that
                // is not a regular one, one too large to be ours, one this user may not read —
                // is a verdict, below: retried at every poll it would be warned about for ever.
                Err(HandoffError::Io { cause: source, .. })
                    if !crate::untrusted::is_lasting(&source) =>
                {
                    tracing::warn!(
                        "batch {batch}: the manifest of attempt {token} cannot be read now ({source}); it is read again at the next poll"
                    );
                    report.read_again.push(batch);
                    continue;
                }
                // Written atomically, so a manifest read whole that does not parse is not a
                // half-written one: reject it, saying why.
                Err(e) => e.to_string(),
            };
            if self.reject(layout, batch, &token, None, None, &why)? {
                report
                    .not_accepted
                    .push((batch, token, AttemptState::Rejected, why));
            }
        }
        Ok(manifests)
    }

    /// Takes `batch`'s manifests in the order their attempts finished: the first complete one
    /// that verifies is accepted, the later ones discarded, failed and wrong ones recorded as
    /// such. `done` says whether the batch was done before; the result, whether it is now.
    fn take_manifests(
        &mut self,
        layout: &RunLayout,
        batch: i64,
        mut done: bool,
        mut manifests: Vec<AttemptManifest>,
        (plan_id, settings): (&str, Option<&OutputSettings>),
        report: &mut IngestReport,
    ) -> Result<bool> {
        // The first to finish wins.
        manifests.sort_by(|a, b| {
            let end = |m: &AttemptManifest| m.finished_unix_s.unwrap_or(f64::INFINITY);
            end(a)
                .total_cmp(&end(b))
                .then_with(|| a.attempt.cmp(&b.attempt))
        });
        let mut expected: Option<ExpectedBatch> = None;
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
            let expected = match &expected {
                Some(e) => e,
                None => {
                    let ids = self.papers_to_embed(BatchId(batch))?;
                    let shard_papers = settings.unwrap_or(&m.settings).shard_papers;
                    expected.insert(ExpectedBatch::new(
                        plan_id,
                        ids.iter().map(String::as_str),
                        shard_papers,
                    ))
                }
            };
            crate::fsops::count(m.shards.len() as u64);
            match m.verify(layout, expected, settings) {
                Ok(()) => {}
                Err(Verdict::Unreadable(why)) => {
                    tracing::warn!(
                        "batch {batch}: attempt {} is verified again at the next poll: {why}",
                        m.attempt
                    );
                    report.read_again.push(batch);
                    continue;
                }
                Err(Verdict::Wrong(why)) => {
                    if self.reject(layout, batch, &m.attempt, job, host, &why)? {
                        report.not_accepted.push((
                            batch,
                            m.attempt.clone(),
                            AttemptState::Rejected,
                            why,
                        ));
                    }
                    continue;
                }
            }
            if self.accept(m)? {
                test_kill_point("accepted");
                report.accepted.push((batch, m.attempt.clone()));
            }
            done = true;
        }
        Ok(done)
    }

    /// Whether `batch` is done and its folder was cleaned with no job open (see V10).
    fn results_settled(&self, batch: i64) -> Result<bool> {
        self.conn
            .prepare_cached("SELECT results_settled FROM batches WHERE id = ?1")
            .and_then(|mut stmt| stmt.query_row([batch], |r| r.get(0)))
            .or_else(|e| match e {
                rusqlite::Error::QueryReturnedNoRows => Ok(true),
                e => Err(e),
            })
            .map_err(sqlite_err(&self.dir))
    }

    /// Records attempt `token` as rejected, with its manifest's stamp (so a rewrite of it is
    /// verified again), and leaves the owner's word beside the manifest for the jobs, which
    /// cannot read run.db: a job never stands down for an attempt the owner rejected. The word
    /// goes first; when it cannot be written now (the shared filesystem again), nothing is
    /// recorded and the attempt is judged again at the next poll: false.
    fn reject(
        &self,
        layout: &RunLayout,
        batch: i64,
        token: &str,
        job: Option<&str>,
        host: Option<&str>,
        why: &str,
    ) -> Result<bool> {
        let marker = layout.attempt_rejection(batch, token);
        if let Err(e) = atomic::write(&marker, why.as_bytes()) {
            tracing::warn!(
                "batch {batch}: attempt {token} is judged again at the next poll: {} cannot be written now ({e})",
                marker.display()
            );
            return Ok(false);
        }
        let stamp = manifest_stamp(layout, batch, token).unwrap_or_default();
        // With its stamp in one transaction: a rejection without one would never be revisited.
        self.ingest_transaction(|| {
            self.record_attempt(batch, token, AttemptState::Rejected, job, host, why)?;
            self.conn
                .execute(
                    "UPDATE attempts SET manifest_stamp = ?3 WHERE batch_id = ?1 AND token = ?2",
                    params![batch, token, stamp],
                )
                .map(|_| true)
                .map_err(sqlite_err(&self.dir))
        })
    }

    /// Forgets the rejection of attempt `token`, whose manifest changed since.
    fn forget_rejection(&self, layout: &RunLayout, batch: i64, token: &str) -> Result<()> {
        self.conn
            .execute(
                "DELETE FROM attempts WHERE batch_id = ?1 AND token = ?2 AND state = ?3",
                params![batch, token, AttemptState::Rejected.as_str()],
            )
            .map_err(sqlite_err(&self.dir))?;
        remove_if_there(&layout.attempt_rejection(batch, token)).map(drop)
    }

    /// Rewrites quarantine.jsonl when an accepted attempt changed the quarantine since it was
    /// last written (the accept marks it stale in its own transaction, so a kill between the
    /// commit and the rewrite is mended by the next ingest).
    fn write_quarantine_if_stale(&self) -> Result<()> {
        if self.setting::<bool>(QUARANTINE_STALE_KEY)? != Some(true) {
            return Ok(());
        }
        self.write_quarantine_jsonl()
            .map_err(|source| RunDbError::Io {
                action: "write",
                path: self.layout().quarantine_file(),
                cause: source,
            })?;
        self.set_setting(QUARANTINE_STALE_KEY, &false)
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
            self.set_setting(QUARANTINE_STALE_KEY, &true)?;
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
            m.job.as_deref(),
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

    /// The recorded attempts of `batch`, by token.
    fn attempts_of(&self, batch: i64) -> Result<BTreeMap<String, KnownAttempt>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT token, state, cleaned, manifest_stamp FROM attempts WHERE batch_id = ?1",
            )
            .map_err(sqlite_err(&self.dir))?;
        let rows = stmt.query_map([batch], |r| {
            Ok((
                r.get::<_, String>(0)?,
                KnownAttempt {
                    state: stored_state(r.get::<_, String>(1)?, AttemptState::parse)?,
                    cleaned: r.get(2)?,
                    stamp: r.get(3)?,
                },
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
            .prepare_cached(&sql)
            .and_then(|mut stmt| stmt.query_row([batch], |r| r.get(0)))
            .map_err(sqlite_err(&self.dir))?;
        Ok(n > 0)
    }
}

/// An attempt as run.db recorded it.
struct KnownAttempt {
    state: AttemptState,
    /// Its files are gone.
    cleaned: bool,
    /// A rejected attempt's manifest when it was rejected (see [`manifest_stamp`]).
    stamp: Option<String>,
}

/// The settings key that says quarantine.jsonl is behind run.db's quarantine.
const QUARANTINE_STALE_KEY: &str = "quarantine_stale";

/// The settings key with when an ingest last read every batch's results folder (unix seconds).
const LAST_FULL_SWEEP_KEY: &str = "last_full_ingest_unix_s";

/// Seconds between full sweeps of `results/` (see [`RunDb::ingest_results`]); 0 reads every
/// folder at every ingest, as embedfleet did before it kept to the open work.
pub const FULL_SWEEP_ENV: &str = "EMBEDFLEET_FULL_SWEEP_S";

fn full_sweep_interval_s() -> f64 {
    std::env::var(FULL_SWEEP_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(900.0)
}

/// The size and modification time of an attempt's manifest: a rewritten manifest has another.
fn manifest_stamp(layout: &RunLayout, batch: i64, token: &str) -> Option<String> {
    use std::os::unix::fs::MetadataExt;
    crate::fsops::count(1);
    let meta = std::fs::metadata(layout.attempt_manifest(batch, token)).ok()?;
    Some(format!(
        "{}:{}.{:09}",
        meta.len(),
        meta.mtime(),
        meta.mtime_nsec()
    ))
}

#[cfg(test)]
mod tests;
