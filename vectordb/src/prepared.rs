//! What is left to upload: a run's shards with their progress into one collection of one
//! database ([`progress_key`]), checked to share one vector size.

use std::path::PathBuf;

use embedfleet_core::rundb::{RunDb, UploadShard};
use embedfleet_core::shardfile::VectorDtype;

use crate::error::UploadRunError;
use crate::shards;
use crate::sink::Sink;

/// The shards of a run, with the vector size of those still to send.
#[derive(Debug, Clone)]
pub struct Prepared {
    /// Every shard, with its progress into the collection.
    pub shards: Vec<UploadShard>,
    /// Vector size of the shards (`None` when the run has no shard yet).
    pub dim: Option<usize>,
    /// Element type of the shards' vectors (that of the first shard read).
    pub dtype: VectorDtype,
}

impl Prepared {
    /// Rows acknowledged before this upload.
    pub fn acked(&self) -> u64 {
        self.shards.iter().map(|s| s.rows_acked.min(s.rows)).sum()
    }

    /// Rows still to send.
    pub fn pending(&self) -> u64 {
        self.shards
            .iter()
            .map(|s| s.rows.saturating_sub(s.rows_acked))
            .sum()
    }
}

/// Where run.db keeps the upload progress into `collection` of `sink`: the collection *and* the
/// target (`papers@edge:/runs/r1/qdrant`, `papers@server:http://q:6334`), so progress into one
/// Qdrant never counts for another.
pub fn progress_key(sink: &dyn Sink, collection: &str) -> String {
    format!("{collection}@{}", sink.target())
}

/// Reads the run's shards, with their progress under `key` ([`progress_key`]), and checks they
/// share one vector size.
pub fn prepare(db: &RunDb, key: &str) -> Result<Prepared, UploadRunError> {
    let shards = db.upload_shards(key)?;
    let mut dim: Option<(usize, PathBuf)> = None;
    let mut dtype = VectorDtype::F32;
    for shard in &shards {
        let path = db.dir().join(&shard.path);
        // Shards already sent were checked when they were sent; reading every footer of a big run
        // again costs a file open each.
        if shard.is_done() && dim.is_some() {
            continue;
        }
        let (found, found_dtype) = shards::shard_shape(&path)?;
        match &dim {
            None => {
                dim = Some((found, path));
                dtype = found_dtype;
            }
            Some((expected, first)) if *expected != found => {
                return Err(UploadRunError::MixedDims {
                    path,
                    found,
                    first: first.clone(),
                    expected: *expected,
                })
            }
            Some(_) => {}
        }
    }
    Ok(Prepared {
        shards,
        dim: dim.map(|(d, _)| d),
        dtype,
    })
}
