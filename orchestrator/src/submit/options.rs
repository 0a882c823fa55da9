//! What the submit loop is given: the run, its run config, the queues, the policy, this
//! session's options and the embed jobs' command line.

use std::collections::BTreeMap;
use std::path::PathBuf;

use super::policy::{LoopPolicy, SessionOptions};
use crate::config::RunConfig;

/// What `embedfleet submit` was asked to do.
#[derive(Debug, Clone)]
pub struct SubmitOptions {
    pub run_dir: PathBuf,
    /// The run config: the scheduler (backend, command settings, job script template) and
    /// the notify hook.
    pub config: RunConfig,
    /// Queue caps to set before starting (replacing the stored ones); `None` keeps run.db's.
    pub queues: Option<BTreeMap<String, u32>>,
    /// Attempts, polling, lost jobs, the breaker, routing.
    pub policy: LoopPolicy,
    /// Watching, a trial, stalled jobs, the metrics endpoint: this session's own.
    pub session: SessionOptions,
    /// Arguments after `embed-job --run-dir DIR --batch N` in every job script.
    pub embed_args: Vec<String>,
    /// The embedfleet binary jobs run, when the run config does not name one.
    pub exe: PathBuf,
    /// Draw a progress bar (stderr is a terminal).
    pub progress: bool,
    /// Bytes one paper's row takes in the shards (its vector at the run's width and dtype, and
    /// the rest of the row): the room a job needs, which the loop waits for on a full disk
    /// (`submit::disk`). 0: free space not watched.
    pub bytes_per_paper: u64,
    /// run.db settings this submit keeps for the run's later ones (its run config, devices,
    /// loop options), stored when its first job is submitted, or at the loop's orderly end
    /// when it had none to send: a submit that fails before any job keeps nothing.
    pub keep_on_first_job: Vec<(String, serde_json::Value)>,
}
