//! `embedfleet run`: the whole pipeline on this machine with one run.db handle — the plan, the
//! submit loop with a preset of `submit`'s flags (through the same [`crate::submit::prepare`]
//! and preflight), the upload into the embedded engine (`<run-dir>/qdrant`, collection
//! `papers`), one query embedded with the run's model and searched, and the report page.
//!
//! The binary hears each stage's end through [`RunSteps`] (it prints as the run goes) and
//! prints the summary from [`RunOutcome`].

use std::path::{Path, PathBuf};

use embedfleet_core::rundb::{RunDb, RunStatus};
use embedfleet_core::RunLayout;
use embedfleet_orchestrator::plan::{self, PlanOptions, PlanReport};
use embedfleet_orchestrator::submit::{SubmitOptions, SubmitReport, Submitted};
use embedfleet_vectordb::query::{self, QueryHit};
use embedfleet_vectordb::{UploadOptions, UploadReport};

use crate::error::{io, Result};
use crate::settings::SubmitFlags;

/// The collection `run` uploads into.
pub const RUN_COLLECTION: &str = "papers";

/// The papers `run`'s query shows.
pub const RUN_QUERY_HITS: usize = 5;

/// What `run` is asked to do.
pub struct RunRequest {
    pub plan: PlanOptions,
    /// `run`'s preset of the submit flags; `model_dir: None` is a tiny random model written
    /// into the run directory (once).
    pub submit: SubmitFlags,
    /// The query that ends the run.
    pub query: String,
    /// The binary the jobs run.
    pub exe: PathBuf,
    /// Progress bars on the terminal.
    pub progress: bool,
}

/// Each stage's end, as the run goes.
pub trait RunSteps {
    /// The plan is made (or was made before).
    fn planned(&mut self, report: &PlanReport);
    /// Something the set-up did that the user should hear of.
    fn note(&mut self, line: &str);
    /// The shards are uploaded; `hits` are the query's top papers (none when the run had no
    /// shards to upload).
    fn uploaded(&mut self, upload: &UploadReport, hits: &[QueryHit]);
}

/// What `run` did. It keeps the run's one run.db handle for [`RunOutcome::write_report_page`].
pub struct RunOutcome {
    pub plan: PlanReport,
    pub options: SubmitOptions,
    pub submit: SubmitReport,
    pub status: RunStatus,
    db: RunDb,
}

/// Plans (if not planned), embeds every batch as local jobs through the submit loop, uploads
/// into the embedded Qdrant and runs one query: run.db is opened once, by the plan.
pub fn run(request: &RunRequest, steps: &mut dyn RunSteps) -> Result<RunOutcome> {
    let run_dir = &request.plan.run_dir;
    let (plan, mut db) = plan::plan_keeping_db(&request.plan)?;
    steps.planned(&plan);
    // As `RunDb::open` would have: a run embedded before sees its finished batches.
    db.ingest_and_log()?;
    // A run a cluster `submit` started keeps its scheduler config: `run` would send its
    // batches to this machine instead.
    embedfleet_orchestrator::stored_config::check_local(&db)?;
    let model_dir = match &request.submit.model_dir {
        Some(dir) => dir.clone(),
        None => tiny_model(run_dir, steps)?,
    };
    let flags = SubmitFlags {
        // Absolute: jobs start in the run directory.
        model_dir: Some(std::path::absolute(&model_dir).map_err(io("resolve", &model_dir))?),
        ..request.submit.clone()
    };
    let prepared = crate::submit::prepare(&db, &flags, request.exe.clone(), request.progress)?;
    for note in &prepared.notes {
        steps.note(note);
    }
    let options = prepared.options;
    let (submitted, db) = embedfleet_orchestrator::submit::submit(db, &options, None, false)?;
    let Submitted::Ran(submit) = submitted else {
        unreachable!("run's submit is not a dry run")
    };
    let submit = *submit;
    let (upload, hits) = upload_and_query(&db, &model_dir, &flags, request)?;
    steps.uploaded(&upload, &hits);
    let status = db.status()?;
    Ok(RunOutcome {
        plan,
        options,
        submit,
        status,
        db,
    })
}

impl RunOutcome {
    /// Appends `line` to the run's history (`publish`'s card lists it).
    pub fn record_command(&self, line: &str) -> Result<()> {
        crate::records::record_command(&self.db, line)
    }

    /// Writes the run's report page (`<run-dir>/report.html`), now that it holds the upload
    /// and the query too; its path.
    pub fn write_report_page(&self) -> std::result::Result<PathBuf, String> {
        let run_dir = &self.options.run_dir;
        let path = RunLayout::new(run_dir).report_page();
        let html = embedfleet_orchestrator::report::html_page(&self.db, run_dir)
            .map_err(|e| e.to_string())?;
        embedfleet_core::atomic::write(&path, html.as_bytes()).map_err(|e| e.to_string())?;
        Ok(path)
    }
}

/// A tiny random model of the default family in the run directory, written once.
fn tiny_model(run_dir: &Path, steps: &mut dyn RunSteps) -> Result<PathBuf> {
    let dir = RunLayout::new(run_dir).tiny_model_dir();
    if !dir.join("model.safetensors").is_file() {
        embedfleet_models::write_tiny_model(&dir, 0)?;
        steps.note(&format!(
            "no --model-dir: using a tiny random {} written to {}",
            embedfleet_models::default_family().name(),
            dir.display()
        ));
    }
    Ok(dir)
}

/// The run's shards into its embedded engine, then the top papers for the request's query,
/// embedded with the model in `model_dir`. Points that failed are in the report; `embedfleet
/// status` shows them as missing.
fn upload_and_query(
    db: &RunDb,
    model_dir: &Path,
    flags: &SubmitFlags,
    request: &RunRequest,
) -> Result<(UploadReport, Vec<QueryHit>)> {
    let run_dir = &request.plan.run_dir;
    // The run's own embedded engine: the default target.
    let sink = crate::target::TargetFlags::default().open(run_dir)?;
    let mut options = UploadOptions::new(run_dir, RUN_COLLECTION);
    options.progress = request.progress;
    let upload = embedfleet_vectordb::upload_on(sink.as_ref(), db, &options)?;
    crate::activity::record_upload(db, sink.as_ref(), &options, &upload);
    if upload.ensured.is_none() {
        return Ok((upload, Vec::new()));
    }
    let instruction = crate::settings::query::instruction(model_dir, None)?;
    let vector = embedfleet_embed::embed_query(model_dir, flags.dim, &instruction, &request.query)?;
    let hits = query::search_with_text(
        sink.as_ref(),
        db,
        RUN_COLLECTION,
        &vector,
        RUN_QUERY_HITS,
        12,
    )?;
    Ok((upload, hits))
}
