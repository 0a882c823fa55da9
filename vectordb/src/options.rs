//! What to upload and how ([`UploadOptions`]), and the defaults `upload` uses when neither a
//! flag nor `tune` says otherwise.

use std::path::PathBuf;

use crate::spec::CollectionSpec;

/// What to upload and how.
#[derive(Debug, Clone)]
pub struct UploadOptions {
    /// The run directory (run.db and the shards).
    pub run_dir: PathBuf,
    /// The collection to create or check; `vector_size` is replaced by the shards' vector size.
    pub spec: CollectionSpec,
    /// Points per upsert.
    pub batch_size: usize,
    /// Upserts outstanding at once (sender threads).
    pub in_flight: usize,
    /// Checkpoint and record progress after this many batches (and at least every 2 s).
    pub checkpoint_every: usize,
    /// Stop after this many failed batches in a row.
    pub max_consecutive_failures: usize,
    /// Only shards with `shard_id % count == index` (a worker process's share).
    pub share: Option<(u64, u64)>,
    /// Show a progress bar on stderr.
    pub progress: bool,
}

/// Points per upsert batch when neither `--batch-size` nor `tune` says otherwise.
pub const DEFAULT_UPSERT_BATCH: usize = 256;
/// Upsert batches in flight per worker when neither `--in-flight` nor `tune` says otherwise.
pub const DEFAULT_IN_FLIGHT: usize = 4;
/// Upsert batches between checkpoints (durable, then recorded in run.db).
pub const DEFAULT_CHECKPOINT_EVERY: usize = 32;

impl UploadOptions {
    /// Upsert batches of [`DEFAULT_UPSERT_BATCH`], [`DEFAULT_IN_FLIGHT`] in flight, a
    /// checkpoint every [`DEFAULT_CHECKPOINT_EVERY`], a bulk-load collection.
    pub fn new(run_dir: impl Into<PathBuf>, collection: impl Into<String>) -> Self {
        Self {
            run_dir: run_dir.into(),
            spec: CollectionSpec {
                bulk_load: true,
                ..CollectionSpec::new(collection, 0)
            },
            batch_size: DEFAULT_UPSERT_BATCH,
            in_flight: DEFAULT_IN_FLIGHT,
            checkpoint_every: DEFAULT_CHECKPOINT_EVERY,
            max_consecutive_failures: 16,
            share: None,
            progress: false,
        }
    }
}
