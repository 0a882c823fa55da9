/*!
The run keeps its scheduler configuration.

The first `submit` of a run stores its effective run config (the `--config` file with the
`--backend` override applied, or the defaults) in run.db, setting [`RUN_CONFIG_SETTING`]. Every
later command that reaches the scheduler — `submit` restarted after a reboot, `submit --trial`,
`submit --build-shard`, `query --submit` — uses the stored one when it is given none, so a
restart typed as `submit --run-dir D --model-dir M` keeps polling its Slurm jobs through Slurm
instead of calling them lost and starting embed jobs on the login node. A config that differs
from the stored one is refused with the difference shown key by key, unless the user asks to
replace it (`--replace-config`).

Why run.db and not a file beside it: the config is read only by the run's owner (the commands
that talk to the scheduler), run.db is the owner's one source of truth, and a setting there is
written in one transaction with nothing to half-write; a file would be one more thing a user may
edit behind the run's back. `submit --dry-run` prints it. Note: `[scheduler.script] env`
values, which may be secrets, are stored as given (as they are in every job script); run.db is
as private as those scripts should be.

Queue caps are not part of it: they stay live-editable in run.db (`queues set`).
*/

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use embedfleet_core::pin::{self, Difference, Field};
use embedfleet_core::rundb::{RunDb, RunDbError};
use embedfleet_core::RunLayout;
use serde_json::Value;

use crate::config::RunConfig;
use crate::scheduler::Backend;

/// The run.db setting that holds the run's [`RunConfig`] (JSON).
pub const RUN_CONFIG_SETTING: &str = "run_config";

/// What the command line gave: a `--config` file's contents, a `--backend`, `--replace-config`.
#[derive(Debug, Clone, Default)]
pub struct GivenConfig {
    pub file: Option<RunConfig>,
    pub backend: Option<Backend>,
    pub replace: bool,
}

impl GivenConfig {
    fn is_empty(&self) -> bool {
        self.file.is_none() && self.backend.is_none()
    }
}

/// The run config a command uses, and where it came from.
#[derive(Debug, Clone, PartialEq)]
pub struct ChosenConfig {
    pub config: RunConfig,
    pub origin: Origin,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// The run's stored config (the command line gave none, or the same one).
    Stored,
    /// The run has none yet (its first submit): this one is to be stored.
    First,
    /// `--replace-config`: this one is to replace the stored one; the differences.
    Replacing(Vec<Difference>),
}

impl ChosenConfig {
    /// True when [`store`] should record it (first submit, or an explicit replace).
    pub fn to_store(&self) -> bool {
        !matches!(self.origin, Origin::Stored)
    }

    /// A line for the user about which config is used.
    pub fn describe(&self) -> String {
        let backend = self.config.scheduler.backend;
        match &self.origin {
            Origin::Stored => format!(
                "using the run's stored run config (backend {backend}); `--config FILE --replace-config` changes it"
            ),
            Origin::First => format!(
                "this run's first submit: its run config (backend {backend}) is stored in run.db with its first job, and later commands use it"
            ),
            Origin::Replacing(d) => format!(
                "replacing the run's stored run config (backend {backend}): {}",
                pin::join(d)
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum StoredConfigError {
    #[error(transparent)]
    RunDb(#[from] RunDbError),
    #[error(
        "this run keeps the run config of its first submit, and the one given differs:\n  {}\n\
         leave out --config and --backend to use the stored one, or add --replace-config to \
         store the given one instead",
        differences.iter().map(ToString::to_string).collect::<Vec<_>>().join("\n  ")
    )]
    Differs { differences: Vec<Difference> },
    #[error(
        "{count} job(s) of this run are still open on {open} (e.g. {example}), and this command \
         would use {given}: it could not poll them, would call them lost and run their batches \
         again beside them. Use the {open} config (`--config FILE` with `backend = \"{open}\"`), \
         or wait for or cancel those jobs first"
    )]
    OpenJobsElsewhere {
        count: usize,
        open: String,
        given: Backend,
        example: String,
    },
    #[error(
        "{why}, and the run config stored in it (its notify command, its job scripts' setup and \
         env) runs as you: someone else could have changed it, so it is not used. Look at it \
         (`sqlite3 {db} \"SELECT value FROM settings WHERE key = 'run_config'\"`), then make \
         run.db yours alone (`chmod go-w {db}*`), or give the config again with `--config FILE \
         --replace-config`. See {doc}",
        db = run_db.display(),
        doc = embedfleet_core::access::DOC
    )]
    Untrusted { why: String, run_db: PathBuf },
    #[error("--replace-config needs the config to store: give --config FILE and/or --backend")]
    ReplaceWithoutConfig,
    #[error(
        "this run's first submit asked for the {0} backend and stopped before any job went out,          so no run config is stored: given none, this submit would run every batch as a local job          on this machine. Give the config again (`--config FILE`, or `--backend {0}`); or          `--backend local` to embed here after all"
    )]
    ClusterAskedNotStored(Backend),
    #[error(
        "this run keeps a {0} run config (stored by its first submit), and `run` embeds on this \
         machine only: go on with `embedfleet submit --run-dir DIR --model-dir DIR`"
    )]
    NotLocal(Backend),
}

impl StoredConfigError {
    /// Refusals (exit code 4) as opposed to failures.
    pub fn is_refusal(&self) -> bool {
        !matches!(self, StoredConfigError::RunDb(_))
    }
}

/// The run's stored config, if its first submit has stored one.
pub fn stored(db: &RunDb) -> Result<Option<RunConfig>, RunDbError> {
    db.setting(RUN_CONFIG_SETTING)
}

/// Records `config` as the run's.
pub fn store(db: &RunDb, config: &RunConfig) -> Result<(), RunDbError> {
    db.set_setting(RUN_CONFIG_SETTING, config)
}

/// The run.db setting that records the backend a submit asked for before any job (and so any
/// stored config): a later submit given no config is refused rather than run locally.
pub const ASKED_BACKEND_SETTING: &str = "submit.asked_backend";

/// Records that a submit asked for `backend` (a cluster's): kept even when that submit stores
/// nothing else (it failed before its first job), so that a bare restart is not taken for a
/// run on this machine.
pub fn record_asked_backend(db: &RunDb, backend: Backend) -> Result<(), RunDbError> {
    if backend == Backend::Local {
        return Ok(());
    }
    db.set_setting(ASKED_BACKEND_SETTING, &backend)
}

/// The config a command uses: the stored one unless the command line gives one; a given one
/// that differs from the stored one only with `replace`; never one whose backend differs from
/// that of the run's open jobs (a run submitted before configs were stored has those only).
pub fn choose(db: &RunDb, given: &GivenConfig) -> Result<ChosenConfig, StoredConfigError> {
    if given.replace && given.is_empty() {
        return Err(StoredConfigError::ReplaceWithoutConfig);
    }
    let stored = stored(db)?;
    if stored.is_some() && given.file.is_none() {
        refuse_untrusted(db)?;
    }
    let mut config = match (&given.file, &stored) {
        (Some(file), _) => file.clone(),
        (None, Some(stored)) => stored.clone(),
        (None, None) => {
            // Nothing stored and nothing given: the default (local) backend, unless a submit of
            // this run asked for a cluster's and failed before its config was stored.
            if given.backend.is_none() {
                if let Some(asked) = db.setting::<Backend>(ASKED_BACKEND_SETTING)? {
                    return Err(StoredConfigError::ClusterAskedNotStored(asked));
                }
            }
            RunConfig::default()
        }
    };
    if let Some(backend) = given.backend {
        config.scheduler.backend = backend;
    }
    let origin = match &stored {
        None => Origin::First,
        Some(_) if given.is_empty() => Origin::Stored,
        Some(stored) => {
            let differences = differences(stored, &config);
            if differences.is_empty() {
                Origin::Stored
            } else if given.replace || !any_job_submitted(db)? {
                // No job has gone through the stored one yet (a first submit that failed on a
                // wrong sbatch path, say): nothing depends on it, the fixed one replaces it.
                Origin::Replacing(differences)
            } else {
                return Err(StoredConfigError::Differs { differences });
            }
        }
    };
    check_open_jobs(db, config.scheduler.backend)?;
    Ok(ChosenConfig { config, origin })
}

/// Refuses a run.db someone else could have written: its stored commands would run as this
/// user (see `embedfleet_core::access::db_writable_by_others`).
fn refuse_untrusted(db: &RunDb) -> Result<(), StoredConfigError> {
    match embedfleet_core::access::db_writable_by_others(db.dir()) {
        Some(why) => Err(StoredConfigError::Untrusted {
            why,
            run_db: RunLayout::new(db.dir()).db(),
        }),
        None => Ok(()),
    }
}

/// For `run` (the pipeline on this machine): refuses a run whose stored config, or whose open
/// jobs, are another backend's.
pub fn check_local(db: &RunDb) -> Result<(), StoredConfigError> {
    match stored(db)? {
        Some(c) if c.scheduler.backend != Backend::Local => {
            Err(StoredConfigError::NotLocal(c.scheduler.backend))
        }
        _ => check_open_jobs(db, Backend::Local),
    }
}

/// Renders a job script with `config` for a made-up job: a template that cannot work is
/// refused before it is stored (the loop would fail on it at its first job anyway).
pub fn check_renders(config: &RunConfig) -> Result<(), crate::submit::SubmitError> {
    let script = &config.scheduler.script;
    let job = crate::scheduler::ScriptJob {
        job_name: "check".into(),
        queue: "check".into(),
        run_dir: "/run".into(),
        batches: vec![1; script.nodes.max(1) as usize],
        output: "/run/logs/check.log".into(),
        error: None,
        marker: Some("/run/jobs/check.exit".into()),
        embed_args: Vec::new(),
    };
    crate::scheduler::render_job_script(config.scheduler.backend, script, &job)?;
    Ok(())
}

/// What the backend of `given`, else of the run's stored config, finds wrong before the first
/// job (see [`Scheduler::preflight`](crate::scheduler::Scheduler::preflight)), a line per
/// queue: for `doctor`. Nothing without a config, or when run.db cannot be read here.
pub fn preflight(run_dir: &Path, given: Option<&RunConfig>) -> Vec<String> {
    let stored = match given {
        Some(_) => None,
        None => RunDb::open_read_only(run_dir)
            .ok()
            .and_then(|db| stored(&db).ok().flatten()),
    };
    let Some(config) = given.or(stored.as_ref()) else {
        return Vec::new();
    };
    config
        .scheduler
        .preflight(run_dir)
        .into_iter()
        .map(|p| format!("queue {}: {}", p.queue, p.reason))
        .collect()
}

/// True once a scheduler has taken a job of the run (whatever became of it).
fn any_job_submitted(db: &RunDb) -> Result<bool, RunDbError> {
    db.conn()
        .query_row(
            "SELECT EXISTS (SELECT 1 FROM jobs WHERE scheduler_id IS NOT NULL)",
            [],
            |r| r.get(0),
        )
        .map_err(|e| db.err(e))
}

/// Refuses a backend other than the one the run's open jobs were submitted through.
fn check_open_jobs(db: &RunDb, backend: Backend) -> Result<(), StoredConfigError> {
    let elsewhere: Vec<_> = db
        .open_jobs()?
        .into_iter()
        .filter(|j| j.backend != backend.name())
        .collect();
    match elsewhere.first() {
        None => Ok(()),
        Some(first) => Err(StoredConfigError::OpenJobsElsewhere {
            count: elsewhere.len(),
            open: first.backend.clone(),
            given: backend,
            example: first.name.clone(),
        }),
    }
}

/// The keys whose values differ, one line each, in key order: `scheduler.backend: the run's
/// "slurm", here "local"`. Values of `scheduler.script.env` are not shown (they may be
/// secrets).
pub fn differences(stored: &RunConfig, given: &RunConfig) -> Vec<Difference> {
    let (a, b) = (flatten(stored), flatten(given));
    let keys: std::collections::BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    // Every key on both sides (unset where one lacks it), so the differences keep key order.
    let fields = |side: &BTreeMap<String, Value>| -> Vec<Field> {
        keys.iter()
            .map(|k| {
                let (compared, shown) = match side.get(*k) {
                    None | Some(Value::Null) => (pin::UNSET.to_string(), pin::UNSET.to_string()),
                    Some(v) if k.starts_with("scheduler.script.env.") => {
                        (v.to_string(), "***".to_string())
                    }
                    Some(v) => (v.to_string(), v.to_string()),
                };
                Field::shown_as(k.as_str(), compared, shown)
            })
            .collect()
    };
    pin::compare(&fields(&a), &fields(&b))
}

/// Dotted key → leaf value (arrays are leaves).
fn flatten(config: &RunConfig) -> BTreeMap<String, Value> {
    fn walk(prefix: &str, value: Value, out: &mut BTreeMap<String, Value>) {
        match value {
            Value::Object(map) => {
                for (k, v) in map {
                    let key = if prefix.is_empty() {
                        k
                    } else {
                        format!("{prefix}.{k}")
                    };
                    walk(&key, v, out);
                }
            }
            leaf => {
                out.insert(prefix.to_string(), leaf);
            }
        }
    }
    let mut out = BTreeMap::new();
    let value = serde_json::to_value(config).expect("a run config serialises. This is a bug.");
    walk("", value, &mut out);
    out
}

/// The config as the TOML a `--config` file would hold (for `submit --dry-run`), `env` values
/// masked.
pub fn to_toml(config: &RunConfig) -> String {
    let mut masked = config.clone();
    for value in masked.scheduler.script.env.values_mut() {
        *value = "***".into();
    }
    // A webhook's URL or token is usually in the command itself.
    if let Some(command) = masked.notify.command.as_mut() {
        *command = "*** (not shown: it may carry a token)".into();
    }
    // Another backend's table left at its defaults says nothing of this run: left out (it
    // reads back the same, defaults filled in).
    let shown = toml::Value::try_from(&masked).and_then(|mut value| {
        let defaults = toml::Value::try_from(RunConfig::default())?;
        let chosen = masked.scheduler.backend.name();
        if let (Some(toml::Value::Table(ours)), Some(toml::Value::Table(default))) =
            (value.get_mut("scheduler"), defaults.get("scheduler"))
        {
            for name in Backend::NAMES.iter().filter(|n| **n != chosen) {
                if ours.get(*name) == default.get(*name) {
                    ours.remove(*name);
                }
            }
        }
        Ok(value)
    });
    shown
        .map_err(|e| e.to_string())
        .and_then(|value| toml::to_string(&value).map_err(|e| e.to_string()))
        .unwrap_or_else(|e| format!("# (cannot show it as TOML: {e})\n"))
}

#[cfg(test)]
mod tests;
