//! The run's shard keys as the pipeline's steps ask for them. How many batches a key holds is
//! decided by [`ShardKeys::resolve`] alone (the snapshot load asks it too); each step only says
//! which grouping it wants when the run has pinned none.

use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_snapshot::{GroupCount, ShardKeys};

use crate::error::{io, GroupStep, PipelineError, Result};

/// The keys of a run whose embed jobs build their batches' shards (`submit --build-shard`): a
/// key per batch, unless the run pinned others.
pub fn for_batch_builds(db: &RunDb) -> Result<ShardKeys> {
    Ok(resolve(db, Some(GroupCount::PerBatch))?
        .expect("a grouping was asked for, so keys are pinned. This is a bug."))
}

/// The run's keys for a step that builds groups of batches (`submit --group-builds`,
/// `build-shard --accepted --group N`): the pinned ones, else `group_count` groups over the
/// run's batches, pinned now; with neither, the user is told how `step` is given one.
pub fn for_group_builds(
    db: &RunDb,
    group_count: Option<i64>,
    step: GroupStep,
) -> Result<ShardKeys> {
    resolve(db, group_count.map(GroupCount::Given))?.ok_or(PipelineError::NoShardKeys { step })
}

fn resolve(db: &RunDb, wanted: Option<GroupCount>) -> Result<Option<ShardKeys>> {
    let layout: RunLayout = db.layout();
    let path = layout.shard_keys_file();
    let resolved = ShardKeys::resolve(&layout, db.last_batch_id()?, wanted)
        .map_err(io("read or pin", &path))?;
    Ok(resolved.map(|r| r.keys))
}
