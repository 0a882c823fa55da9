//! `plan.json`: what an embed job needs of the plan, written by the owner when a plan is
//! complete (and by `submit` for a run planned before this file existed): made from run.db by
//! `RunDb::plan_manifest` (`core/src/rundb/plan_file.rs`).

use super::{read_json, HandoffError};
use crate::settings::PlanSettings;
use crate::RunLayout;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// One batch as a job sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PlannedBatch {
    /// The batch file, relative to the run directory.
    pub path: String,
    pub n_rows: u64,
    /// Rows of the batch file not to embed (later duplicates of an id), sorted.
    pub excluded_rows: Vec<u64>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PlanManifest {
    /// The plan's id (run.db's `plan_id`): every result manifest names it.
    #[serde(default)]
    pub plan_id: String,
    pub settings: PlanSettings,
    pub batches: BTreeMap<i64, PlannedBatch>,
}

impl PlanManifest {
    /// The run's manifest; `Ok(None)` when there is none (not planned yet, or planned by an
    /// embedfleet older than this file: `plan` again writes it).
    pub fn read(layout: &RunLayout) -> Result<Option<Self>, HandoffError> {
        let path = layout.plan_file();
        if !path.is_file() {
            return Ok(None);
        }
        read_json(&path).map(Some)
    }
}
