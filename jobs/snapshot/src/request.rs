//! A group's build handed to a job of its own (`submit --group-builds QUEUE`): the run's owner
//! decides what the group's shard is built from — its batches' accepted shards, in batch order,
//! and the papers it leaves out (tombstoned, or withheld by a later corpus release) — and writes that down in `snapshots/requests/group-<n>.json`; the
//! job (`build-shard --request FILE`, on a CPU node) builds exactly that and never opens run.db,
//! which only the owner's process writes and which a shared filesystem does not lock well.
//!
//! The shard it builds is the one `upload --mode snapshot` would build for the group (same
//! sources, same tombstones, same pinned settings: the same digest), so the load finds it built.

use std::path::PathBuf;

use embedfleet_core::rundb::RunDb;
use embedfleet_core::{BatchId, RunLayout};
use serde::{Deserialize, Serialize};

use super::build::{build_shard_without, find_usable, group_rows, BuildOutcome};
use super::manifest::{BuiltShardManifest, SourceShard};
use super::{read_json, write_json, PinnedSettings, ShardSettings, SnapshotError};
use embedfleet_vectordb::integrity::Tombstones;
use embedfleet_vectordb::shard_keys::ShardKeys;
use embedfleet_vectordb::{shards, CollectionSpec};

/// The request format this embedfleet writes and reads.
const REQUEST_FORMAT: u32 = 1;

/// What a group's build job is to build.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GroupBuildRequest {
    pub format: u32,
    pub group: i64,
    /// The group's batches, first and last (the last may lie past the run's last batch: the
    /// key's range, as the load names it).
    pub batches: (i64, i64),
    /// The accepted parquet shards of the group's batches, in batch and part order.
    pub sources: Vec<SourceShard>,
    /// The group's papers left out: tombstoned, or withheld with their newer row in another
    /// group. Sorted.
    pub deleted: Vec<String>,
    /// Papers with an older and a newer row both in the group's batches: the build keeps one
    /// point of each, the newer row's (a point id is the paper's). Sorted.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub replaced: Vec<String>,
    /// Rows of `sources` (the points, before tombstones).
    pub points: u64,
    /// The vectors' size, from the first shard.
    pub dim: usize,
}

impl GroupBuildRequest {
    /// The request for `group` of `keys` from run.db's accepted shards and tombstones; `None`
    /// while the group has no accepted shard.
    pub fn of_group(
        db: &RunDb,
        layout: &RunLayout,
        keys: &ShardKeys,
        tombstones: &Tombstones,
        group: i64,
    ) -> Result<Option<Self>, SnapshotError> {
        let (first, last) = keys.batches_of(group);
        let mut sources = Vec::new();
        for batch in first..=last.min(db.last_batch_id()?) {
            sources.extend(db.shards_of(BatchId(batch))?.iter().map(SourceShard::from));
        }
        let Some(head) = sources.first() else {
            return Ok(None);
        };
        let dim = shards::shard_dim(&layout.resolve(&head.file))?;
        let (deleted, replaced) = group_rows(tombstones, |b| keys.group_of(b), (first, last));
        Ok(Some(Self {
            format: REQUEST_FORMAT,
            group,
            batches: (first, last),
            points: sources.iter().map(|s| s.rows).sum(),
            sources,
            deleted,
            replaced,
            dim,
        }))
    }

    /// Where the owner writes the request of `group`.
    pub fn path(layout: &RunLayout, group: i64) -> PathBuf {
        layout
            .group_request_dir()
            .join(format!("group-{group:06}.json"))
    }

    /// Writes it atomically (the owner, before submitting the job).
    pub fn write(&self, layout: &RunLayout) -> Result<PathBuf, SnapshotError> {
        let path = Self::path(layout, self.group);
        if let Some(dir) = path.parent() {
            std::fs::create_dir_all(dir).map_err(super::io_err("create", dir))?;
        }
        write_json(&path, self)?;
        Ok(path)
    }

    pub fn read(path: &std::path::Path) -> Result<Self, SnapshotError> {
        let request: Self =
            read_json(path, "a group build request")?.ok_or_else(|| SnapshotError::Layout {
                path: path.to_owned(),
                message: "no such request: the run's owner writes it before submitting the job"
                    .into(),
            })?;
        if request.format != REQUEST_FORMAT {
            return Err(SnapshotError::Layout {
                path: path.to_owned(),
                message: format!(
                    "request format {} (this embedfleet reads {REQUEST_FORMAT}): the job runs another embedfleet than the owner",
                    request.format
                ),
            });
        }
        Ok(request)
    }

    /// Its finished build, if there is one: of its sources, leaving out no more than it asks
    /// (the load deletes the rest by id: see [`find_usable`]).
    pub fn built(&self, layout: &RunLayout) -> Result<Option<BuiltShardManifest>, SnapshotError> {
        find_usable(layout, self.batches, &self.sources, &self.deleted)
    }

    /// Builds it with the run's pinned build settings (the defaults before any were pinned),
    /// unless it is built already.
    pub fn build(&self, layout: &RunLayout) -> Result<BuildOutcome, SnapshotError> {
        let base = CollectionSpec::new("shard", 0);
        let spec = match ShardSettings::pinned(layout)? {
            Some(settings) => settings.apply(&base),
            None => base,
        };
        build_shard_without(
            layout,
            self.batches,
            &self.sources,
            &self.deleted,
            &self.replaced,
            &spec,
        )
    }

    /// Memory to ask the scheduler for, in MiB: the engine's working set while it builds —
    /// the vectors (f32) held for the insert and again by the graph build's storage, the HNSW
    /// links and payloads — plus a fixed base for the process; see BENCHMARKS.md ("Snapshot
    /// loads in groups") for the peak RSS this is fitted to.
    pub fn memory_mib(&self) -> u64 {
        const BASE_MIB: u64 = 1024;
        let per_point = self.dim as u64 * 4 * 3 + 1024;
        BASE_MIB + (self.points * per_point).div_ceil(1 << 20)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn request(points: u64, dim: usize) -> GroupBuildRequest {
        GroupBuildRequest {
            format: REQUEST_FORMAT,
            group: 3,
            batches: (9, 12),
            sources: vec![SourceShard {
                file: "shards/b000009-0000.parquet".into(),
                rows: points,
                sha256: "ab".into(),
            }],
            deleted: vec!["W1".into()],
            replaced: Vec::new(),
            points,
            dim,
        }
    }

    #[test]
    fn a_request_round_trips_through_its_file_and_a_foreign_format_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let layout = RunLayout::new(dir.path());
        let r = request(4000, 8);
        let path = r.write(&layout).unwrap();
        assert!(path.ends_with("snapshots/requests/group-000003.json"));
        assert_eq!(GroupBuildRequest::read(&path).unwrap(), r);
        let text = std::fs::read_to_string(&path)
            .unwrap()
            .replace("\"format\": 1", "\"format\": 9");
        std::fs::write(&path, text).unwrap();
        let err = GroupBuildRequest::read(&path).unwrap_err().to_string();
        assert!(err.contains("format 9"), "{err}");
        let missing = GroupBuildRequest::read(&dir.path().join("none.json")).unwrap_err();
        assert!(missing.to_string().contains("owner writes it"), "{missing}");
    }

    #[test]
    fn memory_grows_with_the_points_and_their_size() {
        let small = request(4_000, 2560).memory_mib();
        let large = request(400_000, 2560).memory_mib();
        assert!(
            small > 1024 && large > 50 * (small - 1024),
            "{small} {large}"
        );
        assert!(request(400_000, 1024).memory_mib() < large);
    }
}
