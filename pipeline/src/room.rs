//! The room a run needs on its run directory's filesystem, against what is free there
//! (`embedfleet_core::space`): checked before any job (`plan`, `submit`), watched by the submit
//! loop, shown by `status` and the report page.

use std::path::Path;

use embedfleet_core::handoff::OutputSettings;
use embedfleet_core::rundb::RunStatus;
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_core::space::{self, Room};

/// Bytes one paper's row takes in the shards of a run with these output settings: its vector at
/// the run's width (`--dim`, else the model's full one) and dtype, and the rest of the row.
/// `None` where the model's width cannot be read (a directory that is not there from here).
pub fn bytes_per_paper(settings: &OutputSettings) -> Option<u64> {
    let dim = match settings.dim {
        Some(dim) => dim,
        None => embedfleet_models::output_dims(Path::new(&settings.model_dir))
            .ok()?
            .full(),
    };
    let value = match settings.vector_dtype {
        VectorDtype::F32 => 4,
        VectorDtype::F16 => 2,
    };
    Some(space::shard_bytes(1, dim as u64, value))
}

/// The run's room: free space at `run_dir`, the shards of the papers not embedded yet at
/// `bytes_per_paper`, and one job's (the largest batch's) at least.
pub fn room_of(
    run_dir: &Path,
    status: &RunStatus,
    largest_batch: u64,
    bytes_per_paper: u64,
) -> std::io::Result<Room> {
    let remaining = status.papers_planned.saturating_sub(status.rows_in_shards);
    Ok(Room {
        dir: std::path::absolute(run_dir).unwrap_or_else(|_| run_dir.to_path_buf()),
        space: space::space_of(run_dir)?,
        needed: remaining.saturating_mul(bytes_per_paper),
        per_job: largest_batch.saturating_mul(bytes_per_paper),
    })
}
