//! `embedfleet plan`: one streaming pass over the corpus that cuts it into per-node jobs and
//! writes each job's papers as its own batch file.
//!
//! Files are planned in parallel, one worker thread per file, so a job never spans two corpus
//! files: the price is one part-filled job per file, the gain is that files plan independently
//! and a killed plan redoes only the files it had not finished. Batch files are durable before
//! run.db records them; run.db records a file as planned only after all its batches. Duplicate
//! ids are resolved once every file is planned, in corpus order (file order, then line), by
//! marking later occurrences as excluded rows in run.db — so memory stays bounded by one batch
//! per worker whatever the corpus size.
//!
//! A corpus comes in releases (`plan --update`): the first plan is release 1, each update the
//! next. An update streams the whole new release but plans only the papers whose id is new or
//! whose text changed; what it carries unchanged is only noted, and run.db settles the release
//! once all its files are planned (see `embedfleet_core::rundb`'s `releases`), after packing its
//! part-filled batches across files (`pack`).

mod known;
mod pack;
mod worker;

pub use pack::Packed;

use embedfleet_core::corpus::{self, CorpusError, ReadOptions};
use embedfleet_core::fingerprint::Fingerprint;
use embedfleet_core::pin::Pinned;
use embedfleet_core::rundb::{CorpusFileRow, Release, ReleaseCounts, RunDb, RunDbError};
use embedfleet_core::settings::PlanSettings;
use embedfleet_core::state::PlanState;
use embedfleet_core::RunLayout;
use embedfleet_core::{atomic, quarantine::QuarantineEntry};
use std::path::{Path, PathBuf};
use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, Clone)]
pub struct PlanOptions {
    pub corpus: Vec<PathBuf>,
    pub run_dir: PathBuf,
    pub settings: PlanSettings,
    /// `settings` were asked for. When not (a restart without the original options), a run
    /// directory planned before keeps its own, and nothing is refused.
    pub settings_given: bool,
    /// Worker threads (files planned at once).
    pub threads: usize,
    pub progress: bool,
    /// Plan `corpus` as the next release of an already planned run (`plan --update`).
    pub update: Option<UpdateOptions>,
}

/// How an update plans its release.
#[derive(Debug, Clone, Default)]
pub struct UpdateOptions {
    /// The release only adds papers: one the run holds but the release lacks is kept.
    pub only_adds: bool,
    /// The command line, recorded with the release.
    pub command: String,
}

#[derive(Debug, thiserror::Error)]
pub enum PlanError {
    #[error(transparent)]
    Corpus(#[from] CorpusError),
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    #[error("failed to fingerprint {path}: {cause}")]
    Fingerprint {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error(
        "the corpus changed since {run_dir} was planned:\n{}\nto embed only what a new release of the corpus changed, `embedfleet plan --update NEW_CORPUS --run-dir {}`; or plan the new corpus into a new run directory, or restore the files",
        .changes.iter().map(|c| format!("  {c}")).collect::<Vec<_>>().join("\n"),
        run_dir.display()
    )]
    CorpusChanged {
        run_dir: PathBuf,
        changes: Vec<String>,
    },
    #[error("{run_dir} has no finished plan to update: plan it first (`embedfleet plan --corpus ... --run-dir {}`)", run_dir.display())]
    NothingToUpdate { run_dir: PathBuf },
    #[error(
        "release {release} of {run_dir} is still being planned, from other files:\n{}\nfinish it first: `embedfleet plan --update` with the same files",
        .changes.iter().map(|c| format!("  {c}")).collect::<Vec<_>>().join("\n")
    )]
    ReleaseInProgress {
        run_dir: PathBuf,
        release: i64,
        changes: Vec<String>,
    },
    #[error("failed to read batch file {path} to compare its papers with the new release: {message}; a run whose batch files are gone cannot be updated (plan the new release into a new run directory)")]
    BatchFile { path: PathBuf, message: String },
    #[error(
        "{run_dir} was planned with other settings:\n{}\nuse the same settings, or plan into a new run directory",
        .changes.iter().map(|c| format!("  {c}")).collect::<Vec<_>>().join("\n")
    )]
    SettingsChanged {
        run_dir: PathBuf,
        changes: Vec<String>,
    },
    #[error(
        "{} holds the results of an earlier run ({}) but no run.db: that run's run.db was lost, \
         and nothing it made can be tied to a new plan. Plan into a new run directory, or move \
         results/ and shards/ out of this one first",
        run_dir.display(), found.join(", ")
    )]
    ResultsWithoutRunDb {
        run_dir: PathBuf,
        found: Vec<String>,
    },
    #[error(
        "some input could not be used:\n{}\n{}",
        .problems.iter().map(|p| format!("  {p}")).collect::<Vec<_>>().join("\n"),
        if *.discarded {
            "nothing was planned: fix the files or the flags and plan again (the run directory takes them)"
        } else {
            "the release is not planned: fix the files or the flags and plan again"
        }
    )]
    Unusable {
        problems: Vec<String>,
        /// The first plan was forgotten: the run directory plans anew.
        discarded: bool,
    },
    #[error("failed to write in {path}: {cause}")]
    Io {
        path: PathBuf,
        cause: std::io::Error,
    },
    #[error("{0}")]
    Worker(String),
}

impl PlanError {
    /// Whether the run directory refused the plan (as opposed to a failure while planning).
    pub fn is_refusal(&self) -> bool {
        matches!(
            self,
            PlanError::CorpusChanged { .. }
                | PlanError::NothingToUpdate { .. }
                | PlanError::ReleaseInProgress { .. }
                | PlanError::SettingsChanged { .. }
                | PlanError::ResultsWithoutRunDb { .. }
        )
    }
}

/// What a plan came to.
#[derive(Debug, Clone, Default)]
pub struct PlanReport {
    /// The run directory was already completely planned: nothing was done.
    pub already_planned: bool,
    pub files: usize,
    pub files_planned_now: usize,
    pub papers: u64,
    pub batches: u64,
    pub quarantined: u64,
    pub duplicates: u64,
    /// Corpus files that broke off, with where.
    pub corrupt: Vec<(String, String)>,
    /// Corpus files from which no record could be used (every record quarantined: empty
    /// text, duplicates, malformed lines), each with its first record's reason: the plan went
    /// on without them.
    pub unused: Vec<(String, String)>,
    pub elapsed: Duration,
    /// The release planned (1 for a first plan), and what it changed.
    pub release: i64,
    pub counts: Option<ReleaseCounts>,
    /// The batches of that release (all of them for release 1).
    pub release_batches: u64,
    /// An update's part-filled batches packed across files.
    pub packed: Packed,
}

pub fn plan(options: &PlanOptions) -> Result<PlanReport, PlanError> {
    plan_keeping_db(options).map(|(report, _)| report)
}

/// [`plan`], handing back the run.db it made or opened: `run` goes on with the same handle.
pub fn plan_keeping_db(options: &PlanOptions) -> Result<(PlanReport, RunDb), PlanError> {
    let started = Instant::now();
    let files = fingerprinted_corpus(&options.corpus)?;
    refuse_results_without_run_db(&options.run_dir)?;
    // An update needs a planned run: refused before run.db and the owner's files are made, so
    // the refusal leaves nothing behind.
    if options.update.is_some() && !RunLayout::new(&options.run_dir).db().exists() {
        return Err(PlanError::NothingToUpdate {
            run_dir: options.run_dir.clone(),
        });
    }
    let mut db = RunDb::create(&options.run_dir)?;
    let options = &PlanOptions {
        settings: check_settings(&db, options)?,
        ..options.clone()
    };
    let release = match &options.update {
        None => first_release(&mut db, options, &files)?,
        Some(update) => next_release(&mut db, options, update, &files)?,
    };
    let mut report = PlanReport {
        files: files.len(),
        release: release.id,
        ..PlanReport::default()
    };
    // A release is planned once settled and the plan marked complete; a plan killed between
    // the two settles it again (to the same result) and completes it.
    if release.planned_at.is_some() && db.is_planned()? {
        report.already_planned = true;
        report.counts = release.counts;
        // A run planned by an older embedfleet has no plan.json yet.
        write_plan_manifest(&db)?;
        fill_totals(&db, &mut report)?;
        report.elapsed = started.elapsed();
        return Ok((report, db));
    }
    db.set_plan_state(PlanState::InProgress)?;
    let pending = files_to_plan(&mut db, &options.run_dir, release.id)?;
    report.files_planned_now = pending.len();
    // An update compares each paper with the run's live copy of it; a first plan has none.
    let known = if release.id > 1 && !pending.is_empty() {
        Some(known::KnownPapers::of(
            &mut db,
            release.id,
            &options.run_dir,
        )?)
    } else {
        None
    };
    let bytes_read = Arc::new(AtomicU64::new(0));
    let read_options = ReadOptions {
        keep_fields: options.settings.keep_fields.clone(),
        sources: options.settings.sources.clone(),
        bytes_read: Some(bytes_read.clone()),
    };
    let kept_missing = worker::run(
        &mut db,
        &pending,
        &read_options,
        options,
        known.as_ref(),
        bytes_read,
    )?;
    // Only when this plan read every file of the release: a file planned by an earlier, killed
    // plan may have had the field.
    let kept_missing = if pending.len() == files.len() {
        kept_missing.fields()
    } else {
        Vec::new()
    };
    refuse_unusable_input(&mut db, options, release.id, &kept_missing)?;
    // An update's papers are few and spread over every file: its part-filled batches are packed
    // into full ones across files (a first plan keeps one per file).
    if release.id > 1 {
        report.packed =
            pack::pack_release(&mut db, &options.run_dir, release.id, &options.settings)?;
    }
    report.counts = Some(db.resolve_release(release.id)?);
    report.duplicates = db.duplicates()?;
    write_quarantine(&db, &options.run_dir)?;
    db.set_plan_state(PlanState::Complete)?;
    write_plan_manifest(&db)?;
    fill_totals(&db, &mut report)?;
    report.elapsed = started.elapsed();
    Ok((report, db))
}

/// The release's files no plan finished, each started over: the batches a killed plan recorded
/// of it are forgotten and their files removed (as are a killed write's leftovers).
fn files_to_plan(
    db: &mut RunDb,
    run_dir: &Path,
    release: i64,
) -> Result<Vec<worker::FileTask>, PlanError> {
    let batch_dir = RunLayout::new(run_dir).batch_dir();
    std::fs::create_dir_all(&batch_dir).map_err(|source| PlanError::Io {
        path: batch_dir.clone(),
        cause: source,
    })?;
    atomic::remove_leftovers(&batch_dir).map_err(|source| PlanError::Io {
        path: batch_dir.clone(),
        cause: source,
    })?;
    let pending: Vec<worker::FileTask> = db
        .corpus_files()?
        .into_iter()
        .filter(|f| f.release == release && !f.planned)
        .map(|f| worker::FileTask {
            id: f.id,
            path: PathBuf::from(&f.path),
            size: f.fingerprint.size,
        })
        .collect();
    for task in &pending {
        // A killed plan may have recorded some batches of this file: start it over.
        for path in db.reset_file(task.id)? {
            remove_if_exists(&run_dir.join(path))?;
        }
        worker::remove_file_batches(&batch_dir, task.id).map_err(|source| PlanError::Io {
            path: batch_dir.clone(),
            cause: source,
        })?;
    }
    Ok(pending)
}

/// The release a plain `plan` is about: the first one, begun here on a new run directory; on
/// a planned one, the newest, whose files the corpus must be.
fn first_release(
    db: &mut RunDb,
    options: &PlanOptions,
    files: &[(String, Fingerprint)],
) -> Result<Release, PlanError> {
    let latest = match db.latest_release()? {
        Some(latest) => latest,
        None => {
            let id = db.begin_release(false, &command_line())?;
            db.add_corpus_files(id, files)?;
            return latest_release(db);
        }
    };
    let known: Vec<CorpusFileRow> = db
        .corpus_files()?
        .into_iter()
        .filter(|f| f.release == latest.id)
        .collect();
    let refreshed = check_corpus(&options.run_dir, &known, files)?;
    db.refresh_fingerprints(&refreshed)?;
    Ok(latest)
}

/// The release `plan --update` is about: the one being planned from these files, the newest
/// when these are its files (planned: nothing to do), or a new one.
fn next_release(
    db: &mut RunDb,
    options: &PlanOptions,
    update: &UpdateOptions,
    files: &[(String, Fingerprint)],
) -> Result<Release, PlanError> {
    let Some(latest) = db.latest_release()? else {
        return Err(PlanError::NothingToUpdate {
            run_dir: options.run_dir.clone(),
        });
    };
    let of_latest: Vec<CorpusFileRow> = db
        .corpus_files()?
        .into_iter()
        .filter(|f| f.release == latest.id)
        .collect();
    let same_files = check_corpus(&options.run_dir, &of_latest, files);
    match (latest.planned_at.is_some(), same_files) {
        (_, Ok(refreshed)) => {
            db.refresh_fingerprints(&refreshed)?;
            Ok(latest)
        }
        // The first plan never finished: there is no release to update yet.
        (false, Err(PlanError::CorpusChanged { .. })) if latest.id == 1 => {
            Err(PlanError::NothingToUpdate {
                run_dir: options.run_dir.clone(),
            })
        }
        (false, Err(PlanError::CorpusChanged { changes, .. })) => {
            Err(PlanError::ReleaseInProgress {
                run_dir: options.run_dir.clone(),
                release: latest.id,
                changes,
            })
        }
        (false, Err(e)) => Err(e),
        (true, Err(_)) => {
            let id = db.begin_release(update.only_adds, &update.command)?;
            db.add_corpus_files(id, files)?;
            latest_release(db)
        }
    }
}

fn latest_release(db: &RunDb) -> Result<Release, PlanError> {
    Ok(db
        .latest_release()?
        .expect("a release was recorded just now. This is a bug."))
}

/// The command line of this process, recorded with the release it starts.
fn command_line() -> String {
    let line = std::env::args().collect::<Vec<_>>().join(" ");
    embedfleet_core::secret::redact(&line)
}

/// A directory with an earlier run's shards or result manifests but no run.db: planning into it
/// would make a new run whose batch numbers meet the old results'.
fn refuse_results_without_run_db(run_dir: &Path) -> Result<(), PlanError> {
    let layout = RunLayout::new(run_dir);
    if layout.db().exists() {
        return Ok(());
    }
    let holds_something =
        |dir: PathBuf| std::fs::read_dir(dir).is_ok_and(|mut entries| entries.next().is_some());
    let found: Vec<String> = [
        (RunLayout::RESULTS_DIR, layout.results_dir()),
        (RunLayout::SHARD_DIR, layout.shard_dir()),
    ]
    .into_iter()
    .filter(|(_, dir)| holds_something(dir.clone()))
    .map(|(name, _)| format!("{name}/"))
    .collect();
    if found.is_empty() {
        Ok(())
    } else {
        Err(PlanError::ResultsWithoutRunDb {
            run_dir: run_dir.to_path_buf(),
            found,
        })
    }
}

/// `plan.json`: what the embed jobs read instead of run.db.
fn write_plan_manifest(db: &RunDb) -> Result<(), PlanError> {
    db.write_plan_manifest()
        .map(drop)
        .map_err(|e| PlanError::Io {
            path: db.layout().plan_file(),
            cause: std::io::Error::other(e),
        })
}

fn fingerprinted_corpus(inputs: &[PathBuf]) -> Result<Vec<(String, Fingerprint)>, PlanError> {
    let mut files = corpus::discover(inputs)?;
    for f in &mut files {
        // Absolute paths, so a plan resumed from another working directory finds the same files.
        if let Ok(abs) = std::fs::canonicalize(&*f) {
            *f = abs;
        }
    }
    files.dedup();
    files
        .into_iter()
        .map(|path| {
            let fp = Fingerprint::of(&path).map_err(|source| PlanError::Fingerprint {
                path: path.clone(),
                cause: source,
            })?;
            Ok((path.display().to_string(), fp))
        })
        .collect()
}

/// The settings the plan goes by: those given, pinned by the run's first plan; a plan that
/// gave none (`settings_given` false) goes by the run's.
fn check_settings(db: &RunDb, options: &PlanOptions) -> Result<PlanSettings, PlanError> {
    match db.plan_settings()? {
        None => {
            db.set_plan_settings(&options.settings)?;
            Ok(options.settings.clone())
        }
        Some(stored) if !options.settings_given => Ok(stored),
        Some(stored) => {
            let changes: Vec<String> = stored
                .differences(&options.settings)
                .iter()
                .map(ToString::to_string)
                .collect();
            if changes.is_empty() {
                Ok(stored)
            } else {
                Err(PlanError::SettingsChanged {
                    run_dir: options.run_dir.clone(),
                    changes,
                })
            }
        }
    }
}

/// Stops a plan whose input could not be used: a file from which no record could be (most often
/// its fields are named otherwise: `paper_id` for `id`), or a `--keep-field` no record has. A
/// first plan is forgotten, so that the fixed files or settings plan into the same directory.
fn refuse_unusable_input(
    db: &mut RunDb,
    options: &PlanOptions,
    release: i64,
    kept_missing: &[String],
) -> Result<(), PlanError> {
    let mut problems: Vec<String> = db
        .unusable_files(release)?
        .into_iter()
        .map(|(path, reason, detail)| {
            format!("{path}: no record could be used: {detail} ({reason})")
        })
        .collect();
    problems.extend(kept_missing.iter().map(|field| {
        format!("--keep-field {field}: no record has a field `{field}` (a misspelt name?)")
    }));
    if problems.is_empty() {
        return Ok(());
    }
    let discarded = match db.discard_first_plan()? {
        Some(batches) => {
            for path in batches {
                remove_if_exists(&options.run_dir.join(path))?;
            }
            true
        }
        None => {
            // A later release: its unusable files are read again by the next plan (their new
            // fingerprint taken), the rest of it stays planned.
            for (path, _, _) in db.unusable_files(release)? {
                let id = db.corpus_files()?.into_iter().find(|f| f.path == path);
                if let Some(file) = id {
                    db.reset_file(file.id)?;
                }
            }
            false
        }
    };
    write_quarantine(db, &options.run_dir)?;
    Err(PlanError::Unusable {
        problems,
        discarded,
    })
}

/// The given files against those of the release: the same paths, unchanged, or refused. A file
/// with nothing planned from it (reset after no record of it could be used) may have changed:
/// it is read anew, and its new fingerprint is returned for run.db.
fn check_corpus(
    run_dir: &Path,
    known: &[CorpusFileRow],
    files: &[(String, Fingerprint)],
) -> Result<Vec<(i64, Fingerprint)>, PlanError> {
    let mut changes = Vec::new();
    let mut refreshed = Vec::new();
    for row in known {
        match files.iter().find(|(p, _)| *p == row.path) {
            // Not among the files read now: deleted, or only left out of the command line.
            None => changes.push(format!("{}: not given", row.path)),
            Some((_, fp)) => match fp.difference(&row.fingerprint) {
                Some(_) if !row.planned => refreshed.push((row.id, fp.clone())),
                Some(why) => changes.push(format!("{}: {why}", row.path)),
                None => {}
            },
        }
    }
    for (path, _) in files {
        if !known.iter().any(|row| row.path == *path) {
            changes.push(format!("{path}: added"));
        }
    }
    if changes.is_empty() {
        Ok(refreshed)
    } else {
        Err(PlanError::CorpusChanged {
            run_dir: run_dir.into(),
            changes,
        })
    }
}

fn remove_if_exists(path: &Path) -> Result<(), PlanError> {
    match std::fs::remove_file(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(PlanError::Io {
            path: path.into(),
            cause: e,
        }),
        _ => Ok(()),
    }
}

fn write_quarantine(db: &RunDb, run_dir: &Path) -> Result<(), PlanError> {
    db.write_quarantine_jsonl().map_err(|source| PlanError::Io {
        path: RunLayout::new(run_dir).quarantine_file(),
        cause: source,
    })
}

fn fill_totals(db: &RunDb, report: &mut PlanReport) -> Result<(), PlanError> {
    let status = db.status()?;
    report.papers = status.papers_planned;
    report.batches = status.batches;
    report.quarantined = status.papers_quarantined;
    report.corrupt = status.corrupt_files.into_iter().collect();
    report.unused = db
        .files_without_papers()?
        .into_iter()
        .map(|(path, reason, detail)| (path, format!("{detail} ({reason})")))
        .collect();
    report.release_batches = status
        .releases
        .iter()
        .find(|r| r.release == report.release)
        .map_or(report.batches, |r| r.batches);
    Ok(())
}

/// Reads `quarantine.jsonl` back (for tests and `status`).
pub fn read_quarantine(run_dir: &Path) -> std::io::Result<Vec<QuarantineEntry>> {
    let text = std::fs::read_to_string(RunLayout::new(run_dir).quarantine_file())?;
    text.lines()
        .map(|l| {
            serde_json::from_str(l)
                .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))
        })
        .collect()
}

#[cfg(test)]
mod tests;
