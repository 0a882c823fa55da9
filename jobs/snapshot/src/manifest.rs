//! The manifest beside a built shard: what it was built from, with which settings and engine,
//! and the snapshot's checksum. Written last (atomically), so a snapshot with no manifest is
//! unfinished and one with a manifest is whole.

use std::path::Path;

use embedfleet_core::RunLayout;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use super::{read_json, write_json, ShardSettings, SnapshotError};

/// The manifest format this embedfleet writes and reads.
pub const BUILT_SHARD_FORMAT: u32 = 1;

/// A parquet shard a built shard was made from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SourceShard {
    /// Relative to the run directory.
    pub file: String,
    pub rows: u64,
    pub sha256: String,
}

impl From<&embedfleet_core::rundb::ShardRow> for SourceShard {
    /// A shard as run.db records it (an accepted attempt's).
    fn from(s: &embedfleet_core::rundb::ShardRow) -> Self {
        Self {
            file: s.path.clone(),
            rows: s.rows,
            sha256: s.sha256.clone(),
        }
    }
}

/// The digest naming a built shard: of its sources' checksums, in order. The same shards give
/// the same name, whoever builds them; other shards (another attempt's) another name.
pub fn sources_digest(sources: &[SourceShard]) -> String {
    built_digest(sources, &[])
}

/// The digest naming a shard built from `sources` less the tombstoned papers `deleted` (sorted):
/// [`sources_digest`] when none is, so builds made before any delete keep their names; another
/// name when some are, so a build that still holds a deleted paper is never taken for it.
pub fn built_digest(sources: &[SourceShard], deleted: &[String]) -> String {
    let mut h = Sha256::new();
    for s in sources {
        h.update(s.sha256.as_bytes());
        h.update(b"\n");
    }
    if !deleted.is_empty() {
        h.update(b"deleted\n");
        for paper in deleted {
            h.update(paper.as_bytes());
            h.update(b"\n");
        }
    }
    h.finalize()
        .iter()
        .take(8)
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// Seconds and CPU seconds of a build's steps.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct BuildTimings {
    /// Reading the parquet shards and inserting the points.
    pub insert_s: f64,
    /// Building the HNSW graph and payload indexes (the engine's optimize).
    pub optimize_s: f64,
    /// Packing and hashing the snapshot.
    pub pack_s: f64,
    /// Wall time of the whole build.
    pub total_s: f64,
    /// CPU seconds (user + system) of the whole build.
    pub cpu_s: f64,
}

/// One built shard: of one batch, or of a group of consecutive batches.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BuiltShardManifest {
    pub format: u32,
    /// The (first) batch; the files are named after it.
    pub batch: i64,
    /// The last batch of a group; absent for a shard of one batch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_batch: Option<i64>,
    /// [`built_digest`] of `sources` and `deleted`; in the file names.
    pub sources_digest: String,
    pub sources: Vec<SourceShard>,
    /// Tombstoned papers (`embedfleet delete`) of the sources left out of the shard, sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub deleted: Vec<String>,
    /// Points in the shard (= rows of the sources: ids are unique per run).
    pub points: u64,
    /// First and last point id (UUIDs, in the sources' row order).
    pub first_id: Option<String>,
    pub last_id: Option<String>,
    pub settings: ShardSettings,
    /// The Qdrant version whose segment format the shard is in (the edge crate's).
    pub engine_version: String,
    /// The segments' own storage version (their `version.info`).
    pub segment_format: String,
    /// The qdrant-edge crate that built it.
    pub edge_version: String,
    /// The snapshot file, relative to the run directory.
    pub snapshot: String,
    pub snapshot_sha256: String,
    pub snapshot_bytes: u64,
    pub segments: usize,
    /// The highest operation number in the segments; the snapshot's WAL starts above it.
    pub max_version: u64,
    pub host: String,
    pub timings: BuildTimings,
    pub built_unix_s: f64,
}

impl BuiltShardManifest {
    /// The first and last batch the shard holds.
    pub fn batches(&self) -> (i64, i64) {
        (self.batch, self.last_batch.unwrap_or(self.batch))
    }

    /// The manifest of the shard whose first batch is `batch`, built from sources with digest
    /// `digest`, `None` when
    /// there is none (not built, or its build was killed before the end).
    pub fn read(
        layout: &RunLayout,
        batch: i64,
        digest: &str,
    ) -> Result<Option<Self>, SnapshotError> {
        let path = layout.resolve(RunLayout::snapshot_manifest_name(batch, digest));
        read_manifest(&path)
    }

    /// Writes the manifest atomically (last step of a build).
    pub fn write(&self, layout: &RunLayout) -> Result<(), SnapshotError> {
        let path = layout.resolve(RunLayout::snapshot_manifest_name(
            self.batch,
            &self.sources_digest,
        ));
        write_json(&path, self)
    }

    /// The snapshot file is there with the recorded size (its checksum is the server's check).
    pub fn snapshot_present(&self, layout: &RunLayout) -> bool {
        std::fs::metadata(layout.resolve(&self.snapshot))
            .is_ok_and(|m| m.len() == self.snapshot_bytes)
    }
}

fn read_manifest(path: &Path) -> Result<Option<BuiltShardManifest>, SnapshotError> {
    let Some(manifest) = read_json::<BuiltShardManifest>(path, "a built-shard manifest")? else {
        return Ok(None);
    };
    if manifest.format != BUILT_SHARD_FORMAT {
        return Err(SnapshotError::Layout {
            path: path.to_owned(),
            message: format!(
                "manifest format {} (this embedfleet reads {BUILT_SHARD_FORMAT}); rebuild it with `embedfleet build-shard`",
                manifest.format
            ),
        });
    }
    Ok(Some(manifest))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn source(sha: &str) -> SourceShard {
        SourceShard {
            file: format!("shards/{sha}.parquet"),
            rows: 3,
            sha256: sha.into(),
        }
    }

    #[test]
    fn the_digest_depends_on_the_sources_checksums_and_their_order_only() {
        let a = sources_digest(&[source("aa"), source("bb")]);
        assert_eq!(a.len(), 16);
        let mut moved = source("aa");
        moved.file = "elsewhere.parquet".into();
        assert_eq!(a, sources_digest(&[moved, source("bb")]));
        assert_ne!(a, sources_digest(&[source("bb"), source("aa")]));
        assert_ne!(a, sources_digest(&[source("aa"), source("bc")]));
    }
}
