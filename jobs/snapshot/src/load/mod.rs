//! `upload --mode snapshot`: a run's built shards into a custom-sharded collection of a Qdrant
//! cluster, one shard key per group of consecutive batches ([`ShardKeys`]), each recovered from
//! its snapshot; then counts and a sample of exact searches checked against the parquet shards.
//!
//! Why groups: a search visits every shard key's graph, so a key per batch (about 2,075 for the
//! study's corpus) makes a collection nobody can query, and each key's creation is a consensus
//! operation (about 0.4 s). A few large shards search like an upserted collection's.
//!
//! Steps, each recorded in run.db (`snapshot_loads`, a row per group under its first batch) so
//! a killed load resumes without recovering a finished shard again:
//!
//! 1. refuse early what cannot work: a server not in cluster mode, of another minor version
//!    than the built shards' segment format, or a collection with other settings;
//! 2. pin the run's keys (groups of `batches_per_group` batches, named after the run) unless
//!    pinned already; find each group's built shard (named by its accepted parquet shards'
//!    checksums), building here those that no job built;
//! 3. create the collection (custom sharding, payload indexes first); claim each group's key
//!    for this run in the collection's metadata (another run's key is refused unless
//!    `replace_keys`), and create it, the groups placed on the cluster's peers in turn;
//! 4. recover the snapshots, `in_flight` at once, each on the peer holding its shard, with its
//!    checksum;
//! 5. wait until the collection is green; check every key's count against its manifest (and
//!    the total, when the collection holds only this run's keys) and sample exact searches
//!    against the parquet rows;
//! 6. record the parquet shards it loaded (those it read at step 2, not the run's shards at
//!    the end) as uploaded into the collection, so `upload --mode upsert` afterwards sends only
//!    what is new, a batch accepted during the load included (into its group's key).
//!
//! Tombstoned papers (`embedfleet delete`), and rows a later corpus release withheld (withdrawn,
//! or superseded by a newer row in another group), are left out of the shards built here and
//! of the sample searches. A shard built before such a delete or release is still used: it is
//! recovered (or kept, when loaded already), then the rows it should not hold are deleted by id
//! in its key, and its count checked less them — a release that changes 5 % of the papers does
//! not rebuild every group. A group with more batches accepted since its shard was built (a
//! release's new batches fill the last group, then make new ones) is built and recovered
//! again (its sources differ): the key's shard is replaced by one holding them all.

mod groups;
mod keys;
mod options;
mod recover;
mod verify;

use std::collections::{HashMap, HashSet};

use embedfleet_core::rundb::{RunDb, ShardRow, SnapshotLoadRow, SnapshotStep};
use embedfleet_core::RunLayout;
use embedfleet_vectordb::integrity::{self, Tombstones};
use embedfleet_vectordb::{progress_key, shards, CollectionSpec, Ensured, QdrantServer, Sink};

pub use options::{LoadOptions, LoadReport};
pub use recover::SNAPSHOT_TEST_DELAY_ENV;

use groups::{built_groups, group_sources, sources_by_batch, Group};
use keys::{place_keys, run_keys};
use recover::{delete_extra_rows, recover_groups, Place};
use verify::{verify_load, Loaded};

use super::manifest::SourceShard;
use super::rest::RestClient;
use super::{ShardSettings, SnapshotError};

/// Loads the run's built shards into `options.spec.name` on `server` (see the module docs).
/// `rest` is the REST address of the server `server` talks to; `db` the run's run.db, open.
pub fn load_snapshots(
    db: &RunDb,
    server: &QdrantServer,
    rest: &RestClient,
    options: &LoadOptions,
) -> Result<LoadReport, SnapshotError> {
    let layout = RunLayout::new(&options.run_dir);
    let name = options.spec.name.clone();
    let key = progress_key(server, &name);
    // The shard rows this load works from: a batch accepted while it runs (hours, for a big
    // run) is not among them, and is left for the next load or upload.
    let loaded_shards = db.all_shards()?;
    let by_batch = sources_by_batch(&loaded_shards);
    let mut report = LoadReport {
        batches: by_batch.len(),
        ..LoadReport::default()
    };
    let Some((_, first)) = by_batch.first() else {
        return Ok(report);
    };

    // 1. What cannot work is refused before anything is built or created.
    let peers = rest.peers()?;
    let version = server.server_version()?;
    let spec = load_spec(&layout, &first[0], options)?;
    refuse_other_collection(server, &name, &spec)?;

    // 2. The run's keys, then each group's built shard.
    let keys = run_keys(db, &layout, &key, options, peers.len())?;
    report.batches_per_group = keys.batches_per_group;
    report.run_id = keys.run_id.clone();
    let tombstones = Tombstones::read(db)?;
    let by_group = group_sources(&keys, &tombstones, &by_batch);
    let build_missing = options.build_missing;
    let (groups, built_here) =
        built_groups(&layout, &keys, &by_group, &spec, &version, build_missing)?;
    report.built_here = built_here;
    report.groups = groups.len();

    // 3. The collection, and each group's key: claimed for this run, then made.
    let (created, mut recorded) = open_collection(server, db, &key, &spec)?;
    report.created = created;
    let at = Place {
        db,
        progress: &key,
        rest,
        peers: &peers,
        name: &name,
        layout: &layout,
    };
    let placed = place_keys(server, &at, &spec, &keys, &groups, options.replace_keys)?;

    // 4. Recoveries, `in_flight` at once; this thread records each in run.db.
    let in_flight = options.in_flight.max(1);
    let recovered = recover_groups(
        &at,
        &groups,
        &placed,
        &mut recorded,
        in_flight,
        options.progress,
    )?;
    report.already = recovered.already;
    report.recover_s = recovered.seconds;
    report.recovered = recovered.recovered;
    report.deleted_after = delete_extra_rows(server, &name, &groups)?;
    // A built shard carries its batches' shard rows: a later release's new source or year for a
    // paper it kept is set after (every load: a group built again brings the older values back).
    let loaded: std::collections::HashSet<i64> = by_batch.iter().map(|(b, _)| *b).collect();
    let restamps = embedfleet_vectordb::restamp::payload_restamps(db, |b| loaded.contains(&b))?;
    embedfleet_vectordb::restamp::apply(server, &name, &restamps, |b| Some(keys.key_of(b)))?;

    // 5. Green, then counts and searches.
    let loaded = Loaded {
        groups: &groups,
        placed: &placed,
        recorded: &recorded,
        tombstones: &tombstones,
    };
    verify_load(server, &at, &loaded, options, &mut report)?;

    // 6. Recorded: verified, and the shards as uploaded (`upload` in upsert mode sends the rest).
    record_verified(db, &key, &groups, &recorded)?;
    record_loaded_shards(db, &key, &loaded_shards)?;
    // The withheld and deleted rows were deleted in their keys above: with every shard loaded,
    // the collection holds the newest release.
    db.record_upload_release(&key)?;
    Ok(report)
}

/// The collection the load makes or fills: `options.spec` with the shards' vector size (of
/// `first`, a parquet shard of the run), custom sharding, and no bulk-load mode (the built
/// shards come indexed).
fn load_spec(
    layout: &RunLayout,
    first: &SourceShard,
    options: &LoadOptions,
) -> Result<CollectionSpec, SnapshotError> {
    let mut spec = CollectionSpec {
        vector_size: shards::shard_dim(&layout.resolve(&first.file))?,
        bulk_load: false,
        ..options.spec.clone()
    };
    spec.qdrant.custom_sharding = true;
    Ok(spec)
}

/// Refuses an existing collection `name` that the load cannot fill: one with hash sharding (a
/// built shard replaces a whole shard), or with other settings than `spec`'s.
fn refuse_other_collection(
    server: &QdrantServer,
    name: &str,
    spec: &CollectionSpec,
) -> Result<(), SnapshotError> {
    let Some(existing) = server.server_collection(name)? else {
        return Ok(());
    };
    if !existing.custom_sharding {
        return Err(SnapshotError::NeedsCluster {
            message: format!(
                "collection `{name}` exists with hash sharding, and a built shard replaces a whole shard; load into a new collection (--collection)"
            ),
        });
    }
    let wanted = ShardSettings::of(spec);
    let differences = wanted.differences_from(&with_indexes_to_come(&wanted, &existing.settings));
    if !differences.is_empty() {
        return Err(SnapshotError::SettingsDiffer {
            what: format!("collection `{name}`"),
            differences,
        });
    }
    Ok(())
}

/// Creates or checks the collection, records its identity marker for the upload progress
/// under `progress` (so `upload` afterwards tells it from one made again), and reads the
/// load's rows of it in run.db (none when it was made now: it holds nothing an earlier load
/// recorded). Returns whether it was created, and the rows by a group's first batch.
fn open_collection(
    server: &QdrantServer,
    db: &RunDb,
    progress: &str,
    spec: &CollectionSpec,
) -> Result<(bool, HashMap<i64, SnapshotLoadRow>), SnapshotError> {
    let created = server.ensure_collection(spec)? == Ensured::Created;
    let marker = server.collection_marker(&spec.name)?;
    integrity::follow_marker(db, progress, &spec.name, marker.as_deref())?;
    integrity::record_marker::<SnapshotError>(server, db, progress, &spec.name, marker)?;
    if created {
        db.forget_snapshot_loads(progress)?;
    }
    let recorded = db
        .snapshot_loads(progress)?
        .into_iter()
        .map(|r| (r.batch_id, r))
        .collect();
    Ok((created, recorded))
}

/// Records every group as verified, with its points.
fn record_verified(
    db: &RunDb,
    progress: &str,
    groups: &[Group],
    recorded: &HashMap<i64, SnapshotLoadRow>,
) -> Result<(), SnapshotError> {
    for g in groups {
        let row = SnapshotLoadRow {
            step: SnapshotStep::Verified,
            snapshot_sha256: Some(g.manifest.snapshot_sha256.clone()),
            points: Some(g.points),
            ..recorded[&g.batches.0].clone()
        };
        db.record_snapshot_load(progress, &row)?;
    }
    Ok(())
}

/// The settings a collection will have once the load has made its payload indexes: a load
/// killed between creating the collection and its indexes left it without some of them, and
/// the next load's `ensure_collection` makes them (creating an index is idempotent). Only
/// missing indexes are forgiven; an index the load would not make is still a difference.
fn with_indexes_to_come(wanted: &ShardSettings, made: &ShardSettings) -> ShardSettings {
    let mut made = made.clone();
    if made
        .payload_indexes
        .iter()
        .all(|index| wanted.payload_indexes.contains(index))
    {
        made.payload_indexes = wanted.payload_indexes.clone();
    }
    made
}

/// Records as uploaded under `key` exactly the parquet shards in `loaded` (the rows this load
/// built its shards from and verified), so `upload` afterwards sends only the rest: a batch
/// accepted during the load, or a batch whose accepted shards changed since, stays pending.
fn record_loaded_shards(db: &RunDb, key: &str, loaded: &[ShardRow]) -> Result<(), SnapshotError> {
    let loaded: HashSet<(i64, &str, u64)> = loaded
        .iter()
        .map(|s| (s.batch_id.0, s.path.as_str(), s.rows))
        .collect();
    for s in db.upload_shards(key)? {
        if loaded.contains(&(s.batch_id, s.path.as_str(), s.rows)) {
            db.record_upload(s.shard_id, key, s.rows, 0)?;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {

    #[test]
    fn a_collection_killed_before_its_payload_indexes_is_not_a_difference() {
        let spec = CollectionSpec::new("papers", 64);
        let wanted = ShardSettings::of(&spec);
        assert!(!wanted.payload_indexes.is_empty());
        // Made by a load killed before its indexes: none, or some of them.
        let mut made = wanted.clone();
        made.payload_indexes.clear();
        assert!(wanted
            .differences_from(&with_indexes_to_come(&wanted, &made))
            .is_empty());
        made.payload_indexes = wanted.payload_indexes[..1].to_vec();
        assert!(wanted
            .differences_from(&with_indexes_to_come(&wanted, &made))
            .is_empty());
        // An index this load would not make, or another setting, still differs.
        made.payload_indexes.push(("lang".into(), "keyword".into()));
        assert!(!wanted
            .differences_from(&with_indexes_to_come(&wanted, &made))
            .is_empty());
        let mut other = wanted.clone();
        other.payload_indexes.clear();
        other.hnsw_m = 32;
        assert_eq!(
            wanted
                .differences_from(&with_indexes_to_come(&wanted, &other))
                .len(),
            1
        );
    }

    use super::*;
    use embedfleet_core::BatchId;

    fn shard(batch: i64, attempt: &str) -> ShardRow {
        ShardRow {
            batch_id: BatchId(batch),
            part: 0,
            path: format!("shards/b{batch}-0.{attempt}.parquet"),
            rows: 10,
            sha256: format!("sha-{batch}-{attempt}"),
        }
    }

    #[test]
    fn a_load_records_only_the_shards_it_loaded_and_a_batch_accepted_meanwhile_stays_pending() {
        let dir = tempfile::tempdir().unwrap();
        let db = RunDb::create(dir.path()).unwrap();
        db.conn()
            .execute_batch(
                "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 'c', 1, 1, 'e');
                 INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (1, 1, 0, 'b1', 10, 1);
                 INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (2, 1, 1, 'b2', 10, 1);
                 INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars) VALUES (3, 1, 2, 'b3', 10, 1);",
            )
            .unwrap();
        db.record_shard(&shard(1, "a")).unwrap();
        db.record_shard(&shard(2, "a")).unwrap();
        // What the load read when it started...
        let loaded = db.all_shards().unwrap();
        // ...then, while it recovered: batch 3 accepted, batch 2 accepted again (a new attempt).
        db.record_shard(&shard(3, "a")).unwrap();
        db.record_shard(&shard(2, "b")).unwrap();
        let key = "papers@server:http://q:6334";
        record_loaded_shards(&db, key, &loaded).unwrap();
        let acked: Vec<(i64, u64)> = db
            .upload_shards(key)
            .unwrap()
            .iter()
            .map(|s| (s.batch_id, s.rows_acked))
            .collect();
        assert_eq!(acked, [(1, 10), (2, 0), (3, 0)]);
    }
}
