//! `plan.json` made from run.db: the manifest of a completely planned run, written for the
//! jobs (which never open run.db), and whether the one on disk is out of date.

use super::error::Result;
use super::handle::RunDb;
use crate::handoff::{write_json, PlanManifest, PlannedBatch};
use crate::state::BatchState;
use crate::BatchId;
use std::collections::BTreeMap;

impl RunDb {
    /// The manifest of a completely planned run; `None` while the plan is not complete.
    pub fn plan_manifest(&self) -> Result<Option<PlanManifest>> {
        let Some(settings) = self.plan_settings()? else {
            return Ok(None);
        };
        if !self.is_planned()? {
            return Ok(None);
        }
        let mut batches = BTreeMap::new();
        for state in BatchState::ALL {
            for id in self.batch_ids(*state)? {
                let Some(row) = self.batch(BatchId(id))? else {
                    continue;
                };
                let excluded_rows = self.excluded_rows(BatchId(id))?;
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
        Ok(Some(PlanManifest {
            plan_id: self.plan_id()?,
            settings,
            batches,
        }))
    }

    /// Writes the run's `plan.json` when its plan is complete; true if it did.
    pub fn write_plan_manifest(
        &self,
    ) -> std::result::Result<bool, Box<dyn std::error::Error + Send + Sync>> {
        match self.plan_manifest()? {
            Some(manifest) => {
                write_json(&self.layout().plan_file(), &manifest)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// Whether `plan.json` is missing or names another plan than run.db's (written by an
    /// embedfleet older than plan ids): then the jobs need it written again.
    pub fn plan_manifest_is_stale(&self) -> bool {
        match PlanManifest::read(&self.layout()) {
            Ok(Some(manifest)) => self.plan_id().map_or(true, |id| manifest.plan_id != id),
            _ => true,
        }
    }

    /// Rewrites `quarantine.jsonl` of the run directory from run.db (the source of truth),
    /// atomically: every step that adds to the quarantine calls this.
    pub fn write_quarantine_jsonl(&self) -> std::io::Result<()> {
        let mut out = Vec::new();
        let entries = self.quarantine_entries().map_err(std::io::Error::other)?;
        for entry in entries {
            serde_json::to_writer(&mut out, &entry).map_err(std::io::Error::other)?;
            out.push(b'\n');
        }
        crate::atomic::write(&self.layout().quarantine_file(), &out)
    }
}
