//! The run's shard keys as the pipeline's steps ask for them. How many batches a key holds is
//! decided here for the pipeline's steps; each says what it wants when the run has
//! pinned none yet (the snapshot load decides its own: `embedfleet_snapshot`).

use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_snapshot::ShardKeys;

use crate::error::{io, PipelineError, Result};

/// The keys of a run whose embed jobs build their batches' shards (`submit --build-shard`): a
/// key per batch, unless the run pinned others.
pub fn for_batch_builds(layout: &RunLayout) -> Result<ShardKeys> {
    ShardKeys::pin(layout, 1).map_err(io("read or pin", &keys_file(layout)))
}

/// The run's keys for a step that builds groups of batches (`submit --group-builds`,
/// `build-shard --accepted --group N`): the pinned ones, else `group_count` groups over the
/// run's batches, pinned now; with neither, the user is told how to give one (`how`).
pub fn for_group_builds(
    db: &RunDb,
    layout: &RunLayout,
    group_count: Option<i64>,
    how: &str,
) -> Result<ShardKeys> {
    if let Some(keys) = ShardKeys::pinned(layout).map_err(io("read", &keys_file(layout)))? {
        return Ok(keys);
    }
    let Some(groups) = group_count else {
        return Err(PipelineError::Needs(how.to_string()));
    };
    let per_group = ShardKeys::batches_per_group_for(db.last_batch_id()?, groups);
    ShardKeys::pin(layout, per_group).map_err(io("pin", &keys_file(layout)))
}

fn keys_file(layout: &RunLayout) -> std::path::PathBuf {
    layout.snapshot_dir().join("keys.json")
}
