//! Building one group's Qdrant shard offline (a group of consecutive batches, or one batch): its
//! parquet shards into a qdrant-edge shard with
//! the target collection's settings, optimised (HNSW and payload indexes built here, on this
//! machine's cores), packed as a server shard snapshot ([`super::pack`]), with its manifest.
//!
//! Atomic and resumable like every output of a run: the edge shard is built in a scratch
//! directory of this process (`snapshots/.build-<batch>-<digest>-<host>-<pid>`), the snapshot is
//! renamed into place whole, the manifest is written last. A killed build leaves only scratch,
//! which the next build of this host removes; a finished one is found by its manifest and not
//! built again. Two builds of one batch at once (two attempts' nodes) each write whole files
//! under the same names: the last rename wins and both are the same shard.

use std::path::Path;
use std::time::Instant;

use embedfleet_core::handoff::AttemptManifest;
use embedfleet_core::RunLayout;

use super::manifest::{built_digest, BuildTimings, BuiltShardManifest, SourceShard};
use super::{io_err, pack, ShardSettings, SnapshotError, BUILT_SHARD_FORMAT};
use embedfleet_core::rundb::Tombstone;
use embedfleet_vectordb::integrity::Tombstones;
use embedfleet_vectordb::{shards, CollectionSpec, PointsBatch, QdrantEdge, Sink, UpsertRequest};

/// The collection name inside a build's scratch engine.
const SCRATCH_COLLECTION: &str = "shard";
/// Rows per insert while building (the engine's insert is in-process: big batches are cheap).
const INSERT_BATCH: usize = 1024;
/// qdrant-edge's version, recorded in each manifest.
pub const EDGE_VERSION: &str = "0.7.2";
/// The Qdrant version qdrant-edge [`EDGE_VERSION`] is cut from (its `QDRANT_VERSION_STRING`):
/// the segment format of what it builds, so the server's minor version must be this one's.
/// A test checks `EDGE_VERSION` against Cargo.lock, so an upgrade of the crate updates both.
pub const EDGE_QDRANT_VERSION: &str = "1.18.2-dev";

/// What a build did.
#[derive(Debug, Clone, PartialEq)]
pub struct BuildOutcome {
    pub manifest: BuiltShardManifest,
    /// False when a finished build of the same sources and settings was found and kept.
    pub built: bool,
}

/// The shards of `batch` that attempt `attempt` made (its result manifest must be complete).
pub fn sources_of_attempt(
    layout: &RunLayout,
    batch: i64,
    attempt: &str,
) -> Result<Vec<SourceShard>, SnapshotError> {
    let manifest =
        AttemptManifest::read(layout, batch, attempt).map_err(|e| SnapshotError::Sources {
            batch,
            message: e.to_string(),
        })?;
    if !manifest.complete {
        return Err(SnapshotError::Sources {
            batch,
            message: format!("attempt {attempt} has not finished the batch"),
        });
    }
    Ok(sources_of(&manifest))
}

/// The shards of `batch` from its result manifests, without run.db (on a node): the complete
/// attempt that finished first, which is the one the run's owner accepts unless it could not
/// verify it. A snapshot built from another attempt is found stale by `upload --mode snapshot`
/// (its sources are not the accepted shards) and built again there.
pub fn sources_of_batch(layout: &RunLayout, batch: i64) -> Result<Vec<SourceShard>, SnapshotError> {
    let first = AttemptManifest::read_all(layout, batch)
        .into_iter()
        .filter_map(|(_, m)| m.ok())
        .filter(|m| m.complete)
        .min_by(|a, b| {
            let t = |m: &AttemptManifest| m.finished_unix_s.unwrap_or(f64::MAX);
            t(a).total_cmp(&t(b))
        });
    match first {
        Some(m) => Ok(sources_of(&m)),
        None => Err(SnapshotError::Sources {
            batch,
            message:
                "no attempt has finished it yet (results/ has no complete manifest); embed it first"
                    .into(),
        }),
    }
}

fn sources_of(manifest: &AttemptManifest) -> Vec<SourceShard> {
    let mut shards = manifest.shards.clone();
    shards.sort_by_key(|s| s.part);
    shards
        .into_iter()
        .map(|s| SourceShard {
            file: s.file,
            rows: s.rows,
            sha256: s.sha256,
        })
        .collect()
}

/// The finished build of the batches `batches` (first, last) from `sources` less the
/// tombstoned papers `deleted` (sorted), if there is one with its snapshot in place.
pub fn find_built(
    layout: &RunLayout,
    batches: (i64, i64),
    sources: &[SourceShard],
    deleted: &[String],
) -> Result<Option<BuiltShardManifest>, SnapshotError> {
    let digest = built_digest(sources, deleted);
    Ok(
        BuiltShardManifest::read(layout, batches.0, &digest)?.filter(|m| {
            m.batches() == batches
                && m.sources == sources
                && m.deleted == deleted
                && m.snapshot_present(layout)
        }),
    )
}

/// A finished build of `batches` from `sources` that leaves out no more than `deleted`
/// (sorted): the exact one ([`find_built`]), else the one of these sources leaving out the most.
/// The load recovers it and deletes the rest by id in the group's key: a delete or a corpus
/// release that withholds a few rows of a finished group does not rebuild the group.
pub fn find_usable(
    layout: &RunLayout,
    batches: (i64, i64),
    sources: &[SourceShard],
    deleted: &[String],
) -> Result<Option<BuiltShardManifest>, SnapshotError> {
    if let Some(exact) = find_built(layout, batches, sources, deleted)? {
        return Ok(Some(exact));
    }
    let prefix = format!("b{:06}-", batches.0);
    let Ok(entries) = std::fs::read_dir(layout.snapshot_dir()) else {
        return Ok(None);
    };
    let wanted: std::collections::HashSet<&str> = deleted.iter().map(String::as_str).collect();
    let mut best: Option<BuiltShardManifest> = None;
    for entry in entries.flatten() {
        let name = entry.file_name();
        let Some(digest) = name
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|n| n.strip_suffix(".json"))
        else {
            continue;
        };
        // A manifest that does not read (another format, half-written by hand) is not a candidate.
        let Ok(Some(m)) = BuiltShardManifest::read(layout, batches.0, digest) else {
            continue;
        };
        let usable = m.batches() == batches
            && m.sources == sources
            && m.deleted.iter().all(|d| wanted.contains(d.as_str()))
            && m.snapshot_present(layout);
        if usable
            && best
                .as_ref()
                .is_none_or(|b| m.deleted.len() > b.deleted.len())
        {
            best = Some(m);
        }
    }
    Ok(best)
}

/// What the built shard of the batches `batches` leaves out, and which of its papers it holds
/// twice with the newer row to keep, given the run's tombstones and withheld rows and the
/// group each batch belongs to: a paper's row that a newer row of another group serves is left
/// out (deleted); one whose newer row is in this group is replaced by it (the newer batch's
/// rows are inserted later).
pub fn group_rows(
    tombstones: &Tombstones,
    group_of: impl Fn(i64) -> i64,
    (first, last): (i64, i64),
) -> (Vec<String>, Vec<String>) {
    let mut deleted = Vec::new();
    let mut replaced = Vec::new();
    for batch in first..=last {
        let group = group_of(batch);
        deleted.extend(tombstones.dead_in_place(batch, |b| group_of(b) == group));
        replaced.extend(tombstones.replaced_in_place(batch, |b| group_of(b) == group));
    }
    for list in [&mut deleted, &mut replaced] {
        list.sort();
        list.dedup();
    }
    (deleted, replaced)
}

/// Builds the shard of the batches `batches` (first, last: one batch, or a group) from
/// `sources` (theirs, in batch order) with `spec`'s settings (its `vector_size` is taken from
/// the shards), unless a finished build with the same sources and settings is there. A finished
/// build with other settings is refused: the run's shards are built one way. A job that was
/// given no tombstones builds this way; see [`build_shard_without`].
pub fn build_shard(
    layout: &RunLayout,
    batches: (i64, i64),
    sources: &[SourceShard],
    spec: &CollectionSpec,
) -> Result<BuildOutcome, SnapshotError> {
    build_shard_without(layout, batches, sources, &[], &[], spec)
}

/// [`build_shard`] leaving out the papers `deleted` (tombstoned, or withheld by a later corpus
/// release: [`group_rows`]): a built shard never holds them, and its name (the digest) says
/// which were left out. `replaced`: papers whose older row a newer row of these batches
/// replaces (one point, the newer row's, which is inserted later); any other id that repeats
/// is refused.
pub fn build_shard_without(
    layout: &RunLayout,
    batches: (i64, i64),
    sources: &[SourceShard],
    deleted: &[String],
    replaced: &[String],
    spec: &CollectionSpec,
) -> Result<BuildOutcome, SnapshotError> {
    let batch = batches.0;
    let mut deleted = deleted.to_vec();
    deleted.sort();
    deleted.dedup();
    let deleted = deleted.as_slice();
    if sources.is_empty() {
        return Err(SnapshotError::Sources {
            batch,
            message: "the batch has no shards".into(),
        });
    }
    let dim = shards::shard_dim(&layout.resolve(&sources[0].file)).map_err(|e| {
        // A shard that no longer reads may have changed since it was recorded: say so.
        match verify_source(layout, batch, &sources[0]) {
            Err(changed) => changed,
            Ok(()) => e.into(),
        }
    })?;
    let spec = CollectionSpec {
        name: SCRATCH_COLLECTION.into(),
        vector_size: dim,
        ..spec.clone()
    };
    let settings = ShardSettings::of(&spec);
    if let Some(found) = find_built(layout, batches, sources, deleted)? {
        let diff = settings.differences_from(&found.settings);
        if diff.is_empty() {
            return Ok(BuildOutcome {
                manifest: found,
                built: false,
            });
        }
        return Err(SnapshotError::SettingsDiffer {
            what: format!("the built shard of {}", describe_batches(batches)),
            differences: diff,
        });
    }
    for s in sources {
        verify_source(layout, batch, s)?;
    }

    let dir = layout.snapshot_dir();
    std::fs::create_dir_all(&dir).map_err(io_err("create", &dir))?;
    remove_dead_scratch(&dir);
    let digest = built_digest(sources, deleted);
    let scratch = dir.join(format!(
        ".build-{batch:06}-{digest}-{}-{}",
        embedfleet_core::handoff::host_name(),
        std::process::id()
    ));
    if scratch.exists() {
        std::fs::remove_dir_all(&scratch).map_err(io_err("remove", &scratch))?;
    }
    let result = build_in(
        layout, batches, sources, deleted, replaced, &digest, &spec, &scratch,
    );
    // Scratch goes whatever happened: a failed build leaves nothing half-made behind.
    let _ = std::fs::remove_dir_all(&scratch);
    let manifest = result?;
    Ok(BuildOutcome {
        manifest,
        built: true,
    })
}

/// The build itself, in `scratch`: insert, optimise, pack, then the manifest.
#[allow(clippy::too_many_arguments)]
fn build_in(
    layout: &RunLayout,
    (batch, last_batch): (i64, i64),
    sources: &[SourceShard],
    deleted: &[String],
    replaced: &[String],
    digest: &str,
    spec: &CollectionSpec,
    scratch: &Path,
) -> Result<BuiltShardManifest, SnapshotError> {
    let tombstones = Tombstones::from(
        deleted
            .iter()
            .map(|paper| Tombstone {
                batch_id: batch,
                paper_id: paper.clone(),
            })
            .collect::<Vec<_>>(),
    );
    let started = Instant::now();
    let cpu_start = cpu_seconds();
    let inserted = insert_and_index(
        layout,
        batch,
        sources,
        &tombstones,
        replaced,
        spec,
        scratch,
        started,
    )?;

    let pack_start = Instant::now();
    let snapshot = RunLayout::snapshot_file_name(batch, digest);
    let snapshot_path = layout.resolve(&snapshot);
    let tmp = embedfleet_core::atomic::tmp_path(&snapshot_path);
    // A pack that fails (a full disk) leaves no half snapshot behind.
    let guard = embedfleet_core::atomic::TmpGuard::new(&snapshot_path);
    let packed = pack::pack(
        &scratch
            .join("engine")
            .join("collections")
            .join(SCRATCH_COLLECTION),
        &tmp,
    )?;
    embedfleet_core::atomic::commit(&snapshot_path).map_err(io_err("rename", &snapshot_path))?;
    guard.committed();
    let pack_s = pack_start.elapsed().as_secs_f64();

    let manifest = BuiltShardManifest {
        format: BUILT_SHARD_FORMAT,
        batch,
        last_batch: (last_batch != batch).then_some(last_batch),
        sources_digest: digest.to_owned(),
        sources: sources.to_vec(),
        deleted: deleted.to_vec(),
        points: inserted.points,
        first_id: inserted.first_id,
        last_id: inserted.last_id,
        settings: ShardSettings::of(spec),
        engine_version: EDGE_QDRANT_VERSION.into(),
        segment_format: packed.segment_format,
        edge_version: EDGE_VERSION.into(),
        snapshot,
        snapshot_sha256: packed.sha256,
        snapshot_bytes: packed.bytes,
        segments: packed.segments,
        max_version: packed.max_version,
        host: embedfleet_core::handoff::host_name(),
        timings: BuildTimings {
            insert_s: inserted.insert_s,
            optimize_s: inserted.optimize_s,
            pack_s,
            total_s: started.elapsed().as_secs_f64(),
            cpu_s: cpu_seconds() - cpu_start,
        },
        built_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0.0, |d| d.as_secs_f64()),
    };
    manifest.write(layout)?;
    Ok(manifest)
}

/// What inserting a group's rows into the scratch engine made.
struct Inserted {
    points: u64,
    first_id: Option<String>,
    last_id: Option<String>,
    /// Seconds from the build's start to the end of the inserts (durable).
    insert_s: f64,
    /// Seconds building the index.
    optimize_s: f64,
}

/// The sources' rows the group serves into a fresh engine in `scratch`, then its index built
/// with the final settings. The engine flushes and closes before this returns, so its
/// files can be packed.
#[allow(clippy::too_many_arguments)]
fn insert_and_index(
    layout: &RunLayout,
    batch: i64,
    sources: &[SourceShard],
    tombstones: &Tombstones,
    replaced: &[String],
    spec: &CollectionSpec,
    scratch: &Path,
    started: Instant,
) -> Result<Inserted, SnapshotError> {
    let engine = QdrantEdge::open(scratch.join("engine"))?;
    // Bulk mode: no graph while inserting; `finish` builds it once, with the final settings.
    let bulk = CollectionSpec {
        bulk_load: true,
        ..spec.clone()
    };
    engine.ensure_collection(&bulk)?;
    let mut points = 0u64;
    let (mut first_id, mut last_id) = (None, None);
    // Papers whose older row a newer one replaces: the second insert is the same point.
    let replaced: std::collections::HashSet<&str> = replaced.iter().map(String::as_str).collect();
    let mut replaced_seen = std::collections::HashSet::new();
    for s in sources {
        let path = layout.resolve(&s.file);
        for record_batch in shards::read_from(&path, 0, INSERT_BATCH)? {
            let record_batch = record_batch.map_err(|e| shards::ShardReadError {
                path: path.clone(),
                message: e.to_string(),
            })?;
            // `deleted` is by paper, whatever the batch.
            for live in tombstones.live_slices(batch, &record_batch) {
                let batch_points = PointsBatch::from_record_batch(&live)?;
                if batch_points.is_empty() {
                    continue;
                }
                if first_id.is_none() {
                    first_id = Some(batch_points.point(0).id().to_string());
                }
                last_id = Some(batch_points.point(batch_points.len() - 1).id().to_string());
                engine.upsert(UpsertRequest::new(SCRATCH_COLLECTION, &batch_points))?;
                points += batch_points.len() as u64;
                if !replaced.is_empty() {
                    for p in batch_points.iter() {
                        if replaced.contains(p.paper_id)
                            && !replaced_seen.insert(p.paper_id.to_owned())
                        {
                            points -= 1;
                        }
                    }
                }
            }
        }
    }
    engine.checkpoint(SCRATCH_COLLECTION)?;
    let insert_s = started.elapsed().as_secs_f64();
    let finish = engine.finish(spec)?;
    if finish.points != points {
        return Err(SnapshotError::Layout {
            path: scratch.to_owned(),
            message: format!(
                "the built shard holds {} points but its shards have {points} rows: paper ids repeat inside the batch",
                finish.points
            ),
        });
    }
    Ok(Inserted {
        points,
        first_id,
        last_id,
        insert_s,
        optimize_s: finish.indexing.as_secs_f64(),
    })
}

/// `batch 7` or `batches 5-8`.
pub fn describe_batches((first, last): (i64, i64)) -> String {
    if first == last {
        format!("batch {first}")
    } else {
        format!("batches {first}-{last}")
    }
}

/// The shard's file still has the checksum and rows it was recorded with.
fn verify_source(layout: &RunLayout, batch: i64, s: &SourceShard) -> Result<(), SnapshotError> {
    embedfleet_core::shardfile::verify_recorded(
        &layout.resolve(&s.file),
        &s.file,
        s.rows,
        &s.sha256,
    )
    .map_err(|message| SnapshotError::Sources { batch, message })
}

/// Another host's build scratch with nothing written for this long is a dead build's: a
/// batch's build writes every few seconds, and takes minutes at most.
const FOREIGN_SCRATCH_IDLE: std::time::Duration = std::time::Duration::from_secs(6 * 3600);

/// Removes scratch directories of killed builds: on this host those whose process is gone; on
/// another host (only it can tell whether its process still runs) those in which nothing was
/// written for [`FOREIGN_SCRATCH_IDLE`] — a node that died mid-build never comes back for them.
fn remove_dead_scratch(dir: &Path) {
    let host = embedfleet_core::handoff::host_name();
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(".build-") else {
            continue;
        };
        // .build-<batch>-<digest>-<host>-<pid>; hosts may hold `-`, the pid is last.
        let Some((head, pid)) = rest.rsplit_once('-') else {
            continue;
        };
        let Ok(pid) = pid.parse::<i32>() else {
            continue;
        };
        let dead = if head.ends_with(&format!("-{host}")) {
            pid != std::process::id() as i32 && !process_alive(pid)
        } else {
            idle_for(&entry.path()).is_some_and(|idle| idle >= FOREIGN_SCRATCH_IDLE)
        };
        if dead {
            let _ = std::fs::remove_dir_all(entry.path());
        }
    }
}

/// How long since anything under `dir` (itself included) was last written; `None` when that
/// cannot be read (then the directory is left alone).
fn idle_for(dir: &Path) -> Option<std::time::Duration> {
    fn newest(path: &Path) -> Option<std::time::SystemTime> {
        let meta = std::fs::symlink_metadata(path).ok()?;
        let mut latest = meta.modified().ok()?;
        if meta.is_dir() {
            for entry in std::fs::read_dir(path).ok()?.flatten() {
                latest = latest.max(newest(&entry.path())?);
            }
        }
        Some(latest)
    }
    std::time::SystemTime::now()
        .duration_since(newest(dir)?)
        .ok()
}

fn process_alive(pid: i32) -> bool {
    // SAFETY: kill with signal 0 only checks that the process exists.
    let rc = unsafe { libc::kill(pid, 0) };
    rc == 0 || std::io::Error::last_os_error().raw_os_error() == Some(libc::EPERM)
}

/// User + system CPU seconds of this process so far (all its threads).
pub fn cpu_seconds() -> f64 {
    // SAFETY: getrusage fills the struct it is given.
    let mut usage: libc::rusage = unsafe { std::mem::zeroed() };
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut usage) } != 0 {
        return 0.0;
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    secs(usage.ru_utime) + secs(usage.ru_stime)
}
