//! What wraps every command: the run directory checked before, run.db opened once at the
//! command's first need ([`RunDbSlot`]), the command line recorded after; and how a command
//! ends ([`Ended`]).

use super::failure::CommandError;
use embedfleet_core::exit;
use embedfleet_core::rundb::RunDb;
use std::path::{Path, PathBuf};

/// How a command ended: its exit code, and whether it changed the run's outputs at all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ended {
    pub code: i32,
    /// The command found its work done and made nothing: it is not added to the run's
    /// history (the dataset card's "How it was made" lists what made the data, not what was
    /// typed again).
    pub wrote_nothing: bool,
}

impl From<i32> for Ended {
    fn from(code: i32) -> Self {
        Self {
            code,
            wrote_nothing: false,
        }
    }
}

impl Ended {
    /// `code`, having changed nothing of the run's outputs.
    pub fn nothing_written(code: i32) -> Self {
        Self {
            code,
            wrote_nothing: true,
        }
    }
}

/// The run directories a command names, as the binary reads them off its flags.
#[derive(Debug, Default)]
pub struct RunDirs {
    /// The `--run-dir` given, checked to be a directory before anything opens files in it.
    pub named: Option<PathBuf>,
    /// The run directory of a command that opens run.db, and so must run on the run's owner
    /// host. Not `status` (it reads the owner's snapshot elsewhere), `take-over`, nor what
    /// runs on compute nodes (`embed-job`, `build-shard`, `doctor`), which never open run.db.
    pub owned: Option<PathBuf>,
    /// The run directory of a command worth remembering in the run's history: those that make
    /// or change the run's outputs (not `status`, not an upload's worker processes; `run`
    /// records its line with the run.db handle it holds).
    pub recorded: Option<PathBuf>,
}

/// The run's run.db as one command holds it: opened once, at the command's first need (each
/// open checks the owner and takes in new results), and used again to record the command line.
#[derive(Default)]
pub struct RunDbSlot {
    db: Option<RunDb>,
}

impl RunDbSlot {
    /// The run.db of `dir`, opened now if this command has not opened it yet.
    pub(crate) fn open(&mut self, dir: &Path) -> anyhow::Result<&mut RunDb> {
        if self.db.is_none() {
            self.db = Some(RunDb::open(dir)?);
        }
        Ok(self.db.as_mut().expect("opened above"))
    }

    /// The handle itself, for a stage that takes it and hands it back ([`RunDbSlot::keep`]).
    pub(crate) fn take(&mut self, dir: &Path) -> anyhow::Result<RunDb> {
        match self.db.take() {
            Some(db) => Ok(db),
            None => Ok(RunDb::open(dir)?),
        }
    }

    /// Keeps a handle a stage made or handed back, for the rest of the command.
    pub(crate) fn keep(&mut self, db: RunDb) {
        self.db = Some(db);
    }
}

/// Runs one command: refuses a `--run-dir` that is not a directory (exit 2, as clap says of a
/// bad flag) and, on a host that does not own the run, refuses with where the owner is
/// (exit 4) before anything opens run.db; then `command`, with the slot its run.db is opened
/// in once; then records the command line in the run's history, through that same handle,
/// unless it wrote nothing.
pub fn invoke(
    dirs: &RunDirs,
    command: impl FnOnce(&mut RunDbSlot) -> anyhow::Result<Ended>,
) -> Result<i32, CommandError> {
    if let Some(why) = dirs.named.as_deref().and_then(not_a_run_dir) {
        eprintln!("error: {why}");
        return Ok(exit::USAGE);
    }
    if let Some(dir) = &dirs.owned {
        embedfleet_core::owner::check_read_only(dir)?;
    }
    let mut slot = RunDbSlot::default();
    let ended = command(&mut slot)?;
    if let Some(dir) = dirs.recorded.as_deref().filter(|_| !ended.wrote_nothing) {
        let recorded = slot
            .open(dir)
            .and_then(|db| Ok(crate::records::record_command(db, &command_line())?));
        if let Err(e) = recorded {
            tracing::warn!("could not record the command line in run.db: {e}");
        }
    }
    Ok(ended.code)
}

/// Why `dir` cannot be a `--run-dir`: it names something other than a directory (a file, say:
/// the corpus given by mistake). Said as such, before anything opens files inside it.
fn not_a_run_dir(dir: &std::path::Path) -> Option<String> {
    let meta = std::fs::metadata(dir).ok()?;
    (!meta.is_dir()).then(|| {
        format!(
            "--run-dir {} is a file, not a run directory: give the directory `embedfleet plan` made (a new path makes a new run)",
            dir.display()
        )
    })
}

/// This process's command line as the run's history keeps it: the program as users type it,
/// not the path this binary happens to have here.
pub(crate) fn command_line() -> String {
    std::iter::once("embedfleet".to_string())
        .chain(std::env::args().skip(1))
        .map(|a| {
            embedfleet_orchestrator::scheduler::shell_quote(&embedfleet_core::secret::redact(&a))
        })
        .collect::<Vec<_>>()
        .join(" ")
}
