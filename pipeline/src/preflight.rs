//! What `submit` checks before it sends the first job: a setup that would make every job fail
//! the same way (a CPU build asked for GPUs, a missing job binary, a broken model directory, a
//! missing batch file, other output settings than the run's — another model, `--shard-papers`,
//! `--dim`, ...) is refused with exit code 4 and nothing reaches a queue.

use embedfleet_core::handoff::{OutputSettings, PinError};
use embedfleet_core::rundb::RunDb;
use embedfleet_core::state::BatchState;
use embedfleet_models::{DeviceSpec, ModelShape, CUDA_BUILD};
use std::path::Path;

// The refusal lives with the pipeline's other errors (`PipelineError::Refused` wraps it).
pub use crate::error::Refused;

/// What the jobs of a submit will run.
pub struct JobSetup<'a> {
    /// `[scheduler.script] embedfleet`, or `None` for this very binary.
    pub binary: Option<&'a str>,
    pub devices: &'a str,
    pub model_dir: &'a Path,
    /// The settings the jobs would embed with.
    pub output: OutputSettings,
    /// Fix them for the run (`output-settings.json`) if none are yet; false for a dry run,
    /// which only compares.
    pub pin: bool,
}

/// Checks `setup` against this build, the model and the run; fixes the run's output settings
/// the first time (`output-settings.json`) unless `setup.pin` is false, and replaces them
/// while no job's results were taken in with them. Returns what the user should hear of.
pub fn check_submit(db: &RunDb, setup: &JobSetup) -> Result<Vec<String>, Refused> {
    let mut problems = Vec::new();
    let mut notes = Vec::new();
    match embedfleet_embed::parse_devices(setup.devices) {
        Err(e) => problems.push(format!("--devices: {e}")),
        Ok(devices) => {
            let gpus = devices.iter().any(|d| matches!(d, DeviceSpec::Cuda(_)));
            check_binary(setup.binary, gpus, setup.devices, &mut problems);
        }
    }
    let model = embedfleet_models::verify_model_dir(setup.model_dir);
    match &model {
        Err(e) => problems.push(format!(
            "the model directory {} is not usable: {e} (docs/cluster.md, \"The model, offline\")",
            setup.model_dir.display()
        )),
        Ok(summary) => check_against_model(&summary.shape, setup, &mut problems),
    }
    if let (Ok(_), Some(dim)) = (&model, setup.output.dim) {
        match embedfleet_models::output_dims(setup.model_dir) {
            Ok(dims) => {
                if let Some(why) = dims.refuse(dim) {
                    problems.push(format!(
                        "--dim {dim}: the model in {} {why}",
                        setup.model_dir.display()
                    ));
                }
            }
            Err(e) => problems.push(format!("the model directory is not usable: {e}")),
        }
    }
    check_batch_files(db, &mut problems);
    if model.is_ok() {
        // A refused submit pins nothing (the run stays open to settings that work); its
        // settings are still compared with the run's, so every difference is said at once.
        let pin = setup.pin && problems.is_empty();
        check_output(db, setup, pin, &mut problems, &mut notes);
    }
    if problems.is_empty() {
        Ok(notes)
    } else {
        Err(Refused { problems })
    }
}

/// The output settings the model of `setup` cannot give, each with the values it can.
fn check_against_model(shape: &ModelShape, setup: &JobSetup, problems: &mut Vec<String>) {
    let dir = setup.model_dir.display();
    let context = shape.max_position_embeddings;
    if let Some(max) = setup.output.max_tokens.filter(|&m| m == 0 || m > context) {
        problems.push(format!(
            "--max-tokens {max}: the model in {dir} takes at most {context} tokens (its \
             config.json's max_position_embeddings, or its sentence_bert_config.json's \
             max_seq_length); give at most that, or leave it out"
        ));
    }
    // A chunk holds the special tokens around it and at least one of the paper's.
    let framing = embedfleet_models::load_tokenizer(setup.model_dir, Some(Default::default()))
        .map(|t| t.framing().overhead())
        .unwrap_or(0);
    if let Some(max) = setup.output.max_tokens.filter(|&m| m > 0 && m <= framing) {
        problems.push(format!(
            "--max-tokens {max}: every chunk of a paper carries the model's {framing} special \
             tokens ([CLS] and [SEP], or the like) and at least one of its own; give more than \
             {framing}"
        ));
    }
}

pub fn check_binary(binary: Option<&str>, gpus: bool, devices: &str, problems: &mut Vec<String>) {
    match binary {
        None if gpus && !CUDA_BUILD => problems.push(format!(
            "this embedfleet is a CPU build and every job would run it with --devices {devices}: \
             point `[scheduler.script] embedfleet` in the run config at a CUDA build, or use --devices cpu"
        )),
        None => {}
        Some(path) if path.contains('/') => {
            let ok = std::fs::metadata(path)
                .map(|m| m.is_file() && std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
                .unwrap_or(false);
            if !ok {
                problems.push(format!(
                    "`[scheduler.script] embedfleet = \"{path}\"` is not an executable file here; the jobs would not start"
                ));
            } else if gpus && build_of(path).as_deref() == Some("cpu build") {
                problems.push(format!(
                    "`[scheduler.script] embedfleet = \"{path}\"` is a CPU build (its --version \
                     says so) and every job would run it with --devices {devices}: point it at a \
                     CUDA build (docs/cuda.md), or give --devices cpu for CPU nodes"
                ));
            }
        }
        // A bare name is looked up on the compute node's PATH, which may differ from ours.
        Some(_) => {}
    }
}

/// What `path --version` says of its build (`cpu build`, `cuda build`), asked with a deadline;
/// `None` when it does not answer so here (another architecture, libraries only the compute
/// nodes have, an older embedfleet): then nothing is held against it.
fn build_of(path: &str) -> Option<String> {
    use std::io::Read;
    let mut child = std::process::Command::new(path)
        .arg("--version")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .ok()?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    loop {
        match child.try_wait() {
            Ok(Some(_)) => break,
            Ok(None) if std::time::Instant::now() < deadline => {
                std::thread::sleep(std::time::Duration::from_millis(20))
            }
            _ => {
                let _ = child.kill();
                let _ = child.wait();
                return None;
            }
        }
    }
    let mut out = String::new();
    child.stdout.take()?.read_to_string(&mut out).ok()?;
    let inside = out.split_once('(')?.1.split_once(')')?.0;
    inside.ends_with("build").then(|| inside.to_string())
}

/// The jobs' output settings against the ones the run's parquet shards were made with. Settings
/// pinned by a submit whose jobs left nothing taken in (they failed, or never ran) made no
/// vector yet: they are replaced, not held against the new ones.
fn check_output(
    db: &RunDb,
    setup: &JobSetup,
    pin: bool,
    problems: &mut Vec<String>,
    notes: &mut Vec<String>,
) {
    let output = &setup.output;
    let outcome = if pin {
        output.pin(&db.layout())
    } else {
        compare_output(db, output)
    };
    match outcome {
        Ok(()) => {}
        Err(PinError::Differs { differences, .. }) if made_no_vector(db) => {
            let what = embedfleet_core::pin::join(&differences);
            if !pin {
                notes.push(format!(
                    "note: a real submit would replace the run's output settings ({what}): no job's results were taken in with them"
                ));
            } else if let Err(e) = output.replace(&db.layout()) {
                problems.push(format!("could not replace the run's output settings: {e}"));
            } else {
                notes.push(format!(
                    "replaced the run's output settings ({what}): no job's results were taken in with them"
                ));
            }
        }
        Err(PinError::Differs { differences, .. }) => problems.push(format!(
            "the run's parquet shards were made with other settings ({}): vectors made two ways \
             would mix; use the run's, or plan into a new run directory",
            embedfleet_core::pin::join(&differences)
        )),
        Err(e) => problems.push(format!("could not fix the run's output settings: {e}")),
    }
}

/// True when no result of the run was taken in, nor waits in `results/` to be: its output
/// settings have made no vector.
fn made_no_vector(db: &RunDb) -> bool {
    matches!(db.has_shards(), Ok(false))
        && matches!(manifests_not_taken_in(db), Ok(m) if m.is_empty())
}

fn check_batch_files(db: &RunDb, problems: &mut Vec<String>) {
    let mut missing = Vec::new();
    for state in [BatchState::Planned, BatchState::Running, BatchState::Failed] {
        for id in db.batch_ids(state).unwrap_or_default() {
            let Ok(Some(batch)) = db.batch(embedfleet_core::BatchId(id)) else {
                continue;
            };
            if !db.dir().join(&batch.path).is_file() {
                missing.push(batch.path);
            }
        }
    }
    if let Some(first) = missing.first() {
        problems.push(format!(
            "{} batch file(s) are missing from the run directory ({first}, ...): the jobs could not read them; \
             was the run directory moved without batches/?",
            missing.len()
        ));
    }
}

/// What [`OutputSettings::pin`] would say, writing nothing: no settings fixed yet is no problem
/// (the first job fixes these).
fn compare_output(db: &RunDb, output: &OutputSettings) -> Result<(), PinError> {
    let layout = db.layout();
    match OutputSettings::read(&layout)? {
        None => Ok(()),
        Some(run) => {
            let differences = embedfleet_core::pin::Pinned::differences(&run, output);
            if differences.is_empty() {
                Ok(())
            } else {
                Err(PinError::Differs {
                    path: layout.output_settings_file().display().to_string(),
                    differences,
                })
            }
        }
    }
}

/// Batches not done in run.db that have result manifests in `results/` (what a dry run, which
/// reads nothing in, says a real submit would take in first).
pub fn manifests_not_taken_in(db: &RunDb) -> crate::error::Result<Vec<i64>> {
    let mut ids = Vec::new();
    for state in [BatchState::Planned, BatchState::Running, BatchState::Failed] {
        ids.extend(db.batch_ids(state)?);
    }
    ids.sort_unstable();
    Ok(ids
        .into_iter()
        .filter(|&id| has_manifest(&db.layout().batch_results_dir(id)))
        .collect())
}

fn has_manifest(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "json"))
    })
}
