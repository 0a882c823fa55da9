//! `plan.json`: what an embed job needs of the plan, written by the owner when a plan is
//! complete (and by `submit` for a run planned before this file existed).

use super::{read_json, write_json, HandoffError};
use crate::rundb::{Result as DbResult, RunDb};
use crate::settings::PlanSettings;
use crate::state::BatchState;
use crate::{BatchId, RunLayout};
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
    /// The manifest of a completely planned run, from its run.db; `None` while the plan is not
    /// complete.
    pub fn from_db(db: &RunDb) -> DbResult<Option<Self>> {
        let Some(settings) = db.plan_settings()? else {
            return Ok(None);
        };
        if !db.is_planned()? {
            return Ok(None);
        }
        let mut batches = BTreeMap::new();
        for state in BatchState::ALL {
            for id in db.batch_ids(*state)? {
                let Some(row) = db.batch(BatchId(id))? else {
                    continue;
                };
                let excluded_rows = db.excluded_rows(BatchId(id))?;
                batches.insert(
                    id,
                    PlannedBatch {
                        path: row.path,
                        n_rows: row.n_rows,
                        excluded_rows,
                    },
                );
            }
        }
        Ok(Some(Self {
            plan_id: db.plan_id()?,
            settings,
            batches,
        }))
    }

    /// Writes the manifest of `db`'s run when its plan is complete; true if it did.
    pub fn write_for(db: &RunDb) -> Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        match Self::from_db(db)? {
            Some(manifest) => {
                write_json(&db.layout().plan_file(), &manifest)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Whether `plan.json` is missing or names another plan than run.db's (written by an
    /// embedfleet older than plan ids): then the jobs need it written again.
    pub fn is_stale(db: &RunDb) -> bool {
        match Self::read(&db.layout()) {
            Ok(Some(manifest)) => db.plan_id().map_or(true, |id| manifest.plan_id != id),
            _ => true,
        }
    }

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
