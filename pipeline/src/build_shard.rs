//! `build-shard` without a request: which batches' shards to build (asked groups and batches,
//! each widened to its group under the run's keys), from which parquet shards (the ones run.db
//! accepted on the login node, else an attempt's own or a batch's first complete one), and
//! with which rows left out (the run's tombstones and withheld rows, known only to run.db).

use std::path::PathBuf;

use embedfleet_core::rundb::RunDb;
use embedfleet_core::{BatchId, RunLayout};
use embedfleet_snapshot::{
    self as snapshot, describe_batches, BuildOutcome, PinnedSettings, ShardKeys, ShardSettings,
    SourceShard,
};
use embedfleet_vectordb::integrity::Tombstones;
use embedfleet_vectordb::CollectionSpec;

use crate::error::{io, GroupStep, PipelineError, Result};

/// What to build, as the command line says it.
#[derive(Debug, Clone)]
pub struct BuildShards {
    pub run_dir: PathBuf,
    /// Build from the shards run.db accepted (the login node; leaves deleted papers out).
    pub accepted: bool,
    /// Groups of the run's shard keys to build.
    pub groups: Vec<i64>,
    /// Batches whose groups to build.
    pub batches: Vec<i64>,
    /// Groups to pin when the run has no keys yet (with `groups`).
    pub group_count: Option<i64>,
    /// The attempt whose shards to build from (an embed job's own build).
    pub attempt: Option<String>,
    /// The collection settings the shards are built with (pinned by the first build).
    pub spec: CollectionSpec,
}

impl BuildShards {
    /// Builds each asked group's shard under `<run-dir>/snapshots`, handing each outcome to
    /// `built` as it is done.
    pub fn run(&self, built: &mut dyn FnMut(&BuildOutcome)) -> Result<()> {
        let layout = RunLayout::new(&self.run_dir);
        ShardSettings::of(&self.spec).pin(&layout)?;
        let db = match self.accepted {
            true => Some(RunDb::open(&self.run_dir)?),
            false => None,
        };
        let keys = match &db {
            // The login node pins the run's keys (as the first load would) when asked for
            // groups.
            Some(db) if !self.groups.is_empty() => {
                crate::shard_keys::for_group_builds(db, self.group_count, GroupStep::BuildShard)?
            }
            _ => ShardKeys::for_writes(&layout)
                .map_err(io("read the run's shard keys", &layout.shard_keys_file()))?,
        };
        // The run's tombstones and withheld rows are in run.db: only a build from the accepted
        // shards (on the login node) can leave them out; a job's build keeps them, and the
        // load deletes them by id after recovering it.
        let tombstones = match &db {
            Some(db) => Tombstones::read(db)?,
            None => Default::default(),
        };
        for range in self.ranges(&keys) {
            let sources = self.sources(db.as_ref(), &layout, range)?;
            let (deleted, replaced) =
                snapshot::group_rows(&tombstones, |b| keys.group_of(b), range);
            built(&snapshot::build_shard_without(
                &layout, range, &sources, &deleted, &replaced, &self.spec,
            )?);
        }
        Ok(())
    }

    /// The batch ranges to build: each asked group's, and each asked batch's group's, once.
    fn ranges(&self, keys: &ShardKeys) -> Vec<(i64, i64)> {
        let mut ranges: Vec<(i64, i64)> = self
            .groups
            .iter()
            .map(|&g| keys.batches_of(g))
            .chain(
                self.batches
                    .iter()
                    .map(|&b| keys.batches_of(keys.group_of(b))),
            )
            .collect();
        ranges.sort_unstable();
        ranges.dedup();
        ranges
    }

    /// The parquet shards `(first, last)` is built from.
    fn sources(
        &self,
        db: Option<&RunDb>,
        layout: &RunLayout,
        (first, last): (i64, i64),
    ) -> Result<Vec<SourceShard>> {
        let sources = match (db, &self.attempt) {
            (Some(db), _) => {
                let mut sources = Vec::new();
                for batch in first..=last {
                    let shards = db.shards_of(BatchId(batch))?;
                    sources.extend(shards.iter().map(SourceShard::from));
                }
                if sources.is_empty() {
                    return Err(PipelineError::NothingAccepted {
                        batches: describe_batches((first, last)),
                    });
                }
                sources
            }
            _ if first != last => {
                return Err(PipelineError::GroupNeedsAccepted {
                    per_group: last - first + 1,
                    batches: describe_batches((first, last)),
                })
            }
            (None, Some(attempt)) => snapshot::sources_of_attempt(layout, first, attempt)?,
            (None, None) => snapshot::sources_of_batch(layout, first)?,
        };
        Ok(sources)
    }
}
