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

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use embedfleet_core::rundb::{RunDb, ShardRow, SnapshotLoadRow, SnapshotStep};
use embedfleet_core::RunLayout;
use embedfleet_upload::shard_keys::ShardKeys;
use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use super::build::{build_shard_without, describe_batches, find_usable, group_rows};
use super::manifest::{BuiltShardManifest, SourceShard};
use super::rest::{Peer, RestClient};
use super::{check_engine_version, ShardSettings, SnapshotError};
use embedfleet_upload::integrity::{self, Tombstones};
use embedfleet_upload::{
    point_id, progress_key, shards, CollectionSpec, Ensured, PointsBatch, QdrantServer,
    SearchOptions, Sink,
};

/// Test hook: milliseconds each recovery waits before it starts, so that a test can kill a
/// load mid-way. Not for production use.
pub const SNAPSHOT_TEST_DELAY_ENV: &str = "EMBEDFLEET_SNAPSHOT_TEST_DELAY_MS";

/// Groups per peer when the user names no group count: each peer searches its groups' shards
/// in parallel, and more groups than that only add graphs to visit.
pub const DEFAULT_GROUPS_PER_PEER: i64 = 2;

/// What to load and how.
#[derive(Debug, Clone)]
pub struct LoadOptions {
    pub run_dir: PathBuf,
    /// The collection's name and settings (`vector_size` comes from the shards; sharding is
    /// custom whatever it says).
    pub spec: CollectionSpec,
    /// Snapshot recoveries at once (across the cluster's peers).
    pub in_flight: usize,
    /// Build here the groups no job built (else they are refused, listed).
    pub build_missing: bool,
    /// Exact searches checked after the load (spread over the groups).
    pub sample_searches: usize,
    /// How long to wait for the collection to become green.
    pub green_timeout: Duration,
    pub progress: bool,
    /// Groups (shard keys) to split the run's batches into when the run has no keys pinned
    /// yet; `None`: [`DEFAULT_GROUPS_PER_PEER`] per peer of the cluster.
    pub groups: Option<i64>,
    /// Take over shard keys the collection records as another run's (their points replaced).
    pub replace_keys: bool,
}

impl LoadOptions {
    pub fn new(run_dir: impl Into<PathBuf>, collection: impl Into<String>) -> Self {
        Self {
            run_dir: run_dir.into(),
            spec: CollectionSpec::new(collection, 0),
            in_flight: 4,
            build_missing: true,
            sample_searches: 50,
            green_timeout: Duration::from_secs(24 * 3600),
            progress: false,
            groups: None,
            replace_keys: false,
        }
    }
}

/// What a load did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LoadReport {
    /// Batches of the run with accepted shards.
    pub batches: usize,
    /// Groups loaded (each one shard key).
    pub groups: usize,
    /// The run's keys: batches per group, and the run's identity naming them.
    pub batches_per_group: i64,
    pub run_id: String,
    /// Shards recovered by this load.
    pub recovered: usize,
    /// Groups a previous load had finished (resumed over).
    pub already: usize,
    /// Groups built here because no job had.
    pub built_here: usize,
    /// The collection was created by this load.
    pub created: bool,
    /// Points in this run's keys at the end (= the run's rows, less deleted papers).
    pub points: u64,
    /// Points in the whole collection (other runs' keys included).
    pub collection_points: u64,
    /// Seconds recovering, then until green.
    pub recover_s: f64,
    pub green_s: f64,
    /// Exact searches that found their own point first.
    pub searches_checked: usize,
    /// Points deleted by id after the recoveries: rows built shards hold that their groups no
    /// longer serve (deleted or withheld since the shard was built).
    pub deleted_after: u64,
}

/// One group to load.
struct Group {
    /// Its number (groups are numbered from 1).
    group: i64,
    /// First and last batch of the group (its nominal range).
    batches: (i64, i64),
    key: String,
    manifest: BuiltShardManifest,
    /// Papers its built shard holds that the group no longer serves: deleted by id in its key
    /// after the recovery.
    extra: Vec<String>,
    /// Points its key holds at the end: the built shard's, less `extra`.
    points: u64,
}

/// The accepted shards of each group of the run, and the papers its shard leaves out (deleted)
/// or holds once for two rows (replaced), by group number.
struct GroupSources {
    batches: (i64, i64),
    sources: Vec<SourceShard>,
    deleted: Vec<String>,
    replaced: Vec<String>,
}

/// The run's shard keys: pinned ones; a run loaded before groups (its load rows name `b<N>`
/// keys and it pinned none) keeps its legacy key per batch; else new ones, pinned now.
fn run_keys(
    db: &RunDb,
    layout: &RunLayout,
    progress: &str,
    options: &LoadOptions,
    peers: usize,
) -> Result<ShardKeys, SnapshotError> {
    let io = |e: std::io::Error| SnapshotError::Io {
        action: "read or pin",
        path: layout.snapshot_dir().join("keys.json"),
        source: e,
    };
    let total = db.last_batch_id()?;
    let asked = options
        .groups
        .unwrap_or(DEFAULT_GROUPS_PER_PEER * peers.max(1) as i64);
    let wanted = ShardKeys::batches_per_group_for(total, asked);
    if let Some(keys) = ShardKeys::pinned(layout).map_err(io)? {
        if options.groups.is_some() && keys.batches_per_group != wanted {
            eprintln!(
                "note: this run's keys are pinned at {} batches per group (snapshots/keys.json), so --groups {asked} is not applied: a run's shards are grouped one way",
                keys.batches_per_group
            );
        }
        return Ok(keys);
    }
    let legacy_rows = db.snapshot_loads(progress)?;
    if !legacy_rows.is_empty()
        && legacy_rows
            .iter()
            .all(|r| ShardKeys::is_legacy_key(&r.shard_key))
    {
        eprintln!(
            "note: this run was loaded into this collection with a shard key per batch by an older embedfleet; it keeps them"
        );
        return Ok(ShardKeys::legacy());
    }
    ShardKeys::pin(layout, wanted).map_err(io)
}

/// Loads the run's built shards into `options.spec.name` on `server` (see the module docs).
/// `rest` is the REST address of the server `server` talks to.
pub fn load_snapshots(
    server: &QdrantServer,
    rest: &RestClient,
    options: &LoadOptions,
) -> Result<LoadReport, SnapshotError> {
    let db = RunDb::open(&options.run_dir)?;
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
    let dim = shards::shard_dim(&layout.resolve(&first[0].file))?;
    let spec = CollectionSpec {
        vector_size: dim,
        custom_sharding: true,
        bulk_load: false,
        ..options.spec.clone()
    };
    let wanted = ShardSettings::of(&spec);
    if let Some(existing) = server.server_collection(&name)? {
        if !existing.custom_sharding {
            return Err(SnapshotError::NeedsCluster {
                message: format!(
                    "collection `{name}` exists with hash sharding, and a built shard replaces a whole shard; load into a new collection (--collection)"
                ),
            });
        }
        let differences = wanted.differences(&with_indexes_to_come(&wanted, &existing.settings));
        if !differences.is_empty() {
            return Err(SnapshotError::SettingsDiffer {
                what: format!("collection `{name}`"),
                differences,
            });
        }
    }

    // 2. The run's keys, then each group's built shard, of its accepted parquet shards less
    // the papers it no longer serves (a shard built before a delete or a release leaves out
    // fewer: it is used, and the rest deleted by id after its recovery).
    let keys = run_keys(&db, &layout, &key, options, peers.len())?;
    report.batches_per_group = keys.batches_per_group;
    report.run_id = keys.run_id.clone();
    let tombstones = Tombstones::read(&db)?;
    let mut by_group: BTreeMap<i64, GroupSources> = BTreeMap::new();
    for (batch, sources) in &by_batch {
        let group = keys.group_of(*batch);
        let entry = by_group.entry(group).or_insert_with(|| {
            let batches = keys.batches_of(group);
            let (deleted, replaced) = group_rows(&tombstones, |b| keys.group_of(b), batches);
            GroupSources {
                batches,
                sources: Vec::new(),
                deleted,
                replaced,
            }
        });
        entry.sources.extend(sources.iter().cloned());
    }
    let found = by_group
        .values()
        .map(|g| find_usable(&layout, g.batches, &g.sources, &g.deleted))
        .collect::<Result<Vec<_>, _>>()?;
    let missing: Vec<i64> = by_group
        .keys()
        .zip(&found)
        .filter(|(_, f)| f.is_none())
        .map(|(g, _)| *g)
        .collect();
    if !missing.is_empty() && !options.build_missing {
        return Err(SnapshotError::Sources {
            batch: keys.batches_of(missing[0]).0,
            message: format!(
                "{} groups have no built shard of their accepted parquet shards less their deleted papers ({}); run `embedfleet build-shard --accepted --group N` for them, or load without --no-build",
                missing.len(),
                list("group", &missing)
            ),
        });
    }
    if !missing.is_empty() {
        eprintln!(
            "building {} shards here that no job built ({}, {} batches per group)",
            missing.len(),
            list("group", &missing),
            keys.batches_per_group
        );
    }
    let mut groups = Vec::with_capacity(by_group.len());
    for ((group, g), found) in by_group.iter().zip(found) {
        let manifest = match found {
            Some(manifest) => manifest,
            None => {
                let outcome = build_shard_without(
                    &layout,
                    g.batches,
                    &g.sources,
                    &g.deleted,
                    &g.replaced,
                    &spec,
                )?;
                if outcome.built {
                    report.built_here += 1;
                    eprintln!(
                        "  group {group} ({}): {} points built in {:.1} s ({:.1} CPU s)",
                        describe_batches(g.batches),
                        outcome.manifest.points,
                        outcome.manifest.timings.total_s,
                        outcome.manifest.timings.cpu_s
                    );
                }
                outcome.manifest
            }
        };
        check_engine_version(&manifest.engine_version, &version)?;
        let differences = wanted.differences(&manifest.settings);
        if !differences.is_empty() {
            return Err(SnapshotError::SettingsDiffer {
                what: format!("the built shard of group {group} ({})", manifest.snapshot),
                differences,
            });
        }
        let (extra, points) = rows_to_delete(&layout, &manifest, &g.deleted)?;
        groups.push(Group {
            group: *group,
            batches: g.batches,
            key: keys.key_of_group(*group),
            manifest,
            extra,
            points,
        });
    }
    report.groups = groups.len();

    // 3. The collection, and each group's key: claimed for this run, then made.
    let ensured = server.ensure_collection(&spec)?;
    report.created = ensured == Ensured::Created;
    // The upload progress recorded at the end is about this collection: `upload` afterwards
    // tells it from one made again by its identity marker.
    let marker = server.collection_marker(&name)?;
    integrity::record_marker::<SnapshotError>(server, &db, &key, &name, marker)?;
    if report.created {
        // A collection made now holds nothing that an earlier load recorded.
        db.forget_snapshot_loads(&key)?;
    }
    let mut recorded: HashMap<i64, SnapshotLoadRow> = db
        .snapshot_loads(&key)?
        .into_iter()
        .map(|r| (r.batch_id, r))
        .collect();
    let existing_keys = server.keyed_shards(&name)?;
    for g in &groups {
        let owner = keys.owner_of_group(g.group, &options.run_dir);
        server.claim_shard_key(&name, &g.key, &owner, options.replace_keys)?;
    }
    for g in &groups {
        if !existing_keys.iter().any(|s| s.key == g.key) {
            // Groups go round the peers: group n's first replica on peer n mod P, the others
            // on the peers after it (the server takes a key's replicas from its placement).
            let replicas = spec.replication_factor.unwrap_or(1).max(1) as usize;
            let placement: Vec<u64> = (0..replicas.min(peers.len()))
                .map(|i| {
                    let at = (g.group - 1 + i as i64).rem_euclid(peers.len() as i64);
                    peers[at as usize].id
                })
                .collect();
            server.create_shard_key(&name, &g.key, &placement, spec.replication_factor)?;
        }
    }
    let placed = server.keyed_shards(&name)?;
    let shard_of = |key: &str| placed.iter().find(|s| s.key == key);

    // 4. Recoveries, `in_flight` at once; this thread records each in run.db.
    let mut todo = Vec::new();
    for g in &groups {
        let Some(shard) = shard_of(&g.key) else {
            return Err(SnapshotError::Check {
                what: format!("shard key {}", g.key),
                message: "the server lists no shard for it".into(),
            });
        };
        let row_id = g.batches.0;
        let done = recorded.get(&row_id).is_some_and(|r| {
            r.step >= SnapshotStep::Recovered
                && r.shard_key == g.key
                && r.shard_id == Some(shard.shard_id)
                && r.snapshot_sha256.as_deref() == Some(g.manifest.snapshot_sha256.as_str())
        });
        if done {
            report.already += 1;
            continue;
        }
        let row = SnapshotLoadRow {
            batch_id: row_id,
            shard_key: g.key.clone(),
            shard_id: Some(shard.shard_id),
            snapshot_sha256: None,
            points: None,
            step: SnapshotStep::Key,
        };
        db.record_snapshot_load(&key, &row)?;
        recorded.insert(row_id, row);
        // One replica gets the snapshot: the server marks the key's other replicas dead, and
        // they copy the recovered one (a shard transfer); step 5 waits for them.
        let url = peer_url(&peers, shard.peers.first().copied(), rest);
        todo.push((g, shard.shard_id, url));
    }
    let started = Instant::now();
    let bar = progress_bar(options.progress, todo.len() as u64);
    let results = recover_all(
        rest,
        &name,
        &layout,
        &todo,
        options.in_flight.max(1),
        |g, r| {
            if r.is_ok() {
                let row = SnapshotLoadRow {
                    snapshot_sha256: Some(g.manifest.snapshot_sha256.clone()),
                    points: Some(g.manifest.points),
                    step: SnapshotStep::Recovered,
                    ..recorded[&g.batches.0].clone()
                };
                db.record_snapshot_load(&key, &row)?;
                bar.inc(1);
            }
            Ok(())
        },
    )?;
    bar.finish_and_clear();
    report.recover_s = started.elapsed().as_secs_f64();
    report.recovered = results;
    // Rows the built shards hold that their groups no longer serve, deleted by id in their
    // key (a delete is idempotent: a load killed here deletes them again).
    for g in groups.iter().filter(|g| !g.extra.is_empty()) {
        let ids: Vec<_> = g.extra.iter().map(|id| point_id(id)).collect();
        for chunk in ids.chunks(DELETE_CHUNK) {
            server.delete(&name, chunk, Some(&g.key))?;
        }
        report.deleted_after += g.manifest.points - g.points;
    }

    // 5. Green, then counts and searches.
    let green_start = Instant::now();
    wait_green(server, &name, options.green_timeout)?;
    report.green_s = green_start.elapsed().as_secs_f64();
    wait_replicas(
        server,
        rest,
        &peers,
        &name,
        &groups,
        &placed,
        options.green_timeout,
    )?;
    let mut total = 0;
    for g in &groups {
        let n = server.count_in_key(&name, &g.key)?;
        if n != g.points {
            // Whatever changed the shard (a replaced collection, a write past embedfleet), the
            // next load recovers this group again instead of trusting the record.
            let row = SnapshotLoadRow {
                snapshot_sha256: None,
                points: None,
                step: SnapshotStep::Key,
                ..recorded[&g.batches.0].clone()
            };
            db.record_snapshot_load(&key, &row)?;
            return Err(SnapshotError::Check {
                what: format!("shard key {} ({})", g.key, describe_batches(g.batches)),
                message: format!(
                    "it holds {n} points, its built shard {} less {} it no longer serves; run the load again (it recovers the group again)",
                    g.manifest.points,
                    g.manifest.points - g.points
                ),
            });
        }
        total += n;
    }
    let holds = server.count(&name, None)?;
    let only_ours = server
        .keyed_shards(&name)?
        .iter()
        .all(|s| groups.iter().any(|g| g.key == s.key));
    if only_ours && holds != total {
        return Err(SnapshotError::Check {
            what: format!("collection `{name}`"),
            message: format!("it holds {holds} points, its shard keys {total}"),
        });
    }
    report.points = total;
    report.collection_points = holds;
    report.searches_checked = check_searches(
        server,
        &name,
        &layout,
        &groups,
        &tombstones,
        options.sample_searches,
    )?;

    // 6. Recorded: verified, and the shards as uploaded (`upload` in upsert mode sends the rest).
    for g in &groups {
        let row = SnapshotLoadRow {
            step: SnapshotStep::Verified,
            snapshot_sha256: Some(g.manifest.snapshot_sha256.clone()),
            points: Some(g.points),
            ..recorded[&g.batches.0].clone()
        };
        db.record_snapshot_load(&key, &row)?;
    }
    record_loaded_shards(&db, &key, &loaded_shards)?;
    Ok(report)
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

/// Ids deleted in one request.
const DELETE_CHUNK: usize = 1024;

/// The papers `manifest`'s shard holds that its group no longer serves (in `deleted`, not left
/// out by the build), and the points its key holds once they are deleted. Reads the sources' id
/// column only when there are any.
fn rows_to_delete(
    layout: &RunLayout,
    manifest: &BuiltShardManifest,
    deleted: &[String],
) -> Result<(Vec<String>, u64), SnapshotError> {
    let left_out: std::collections::HashSet<&str> =
        manifest.deleted.iter().map(String::as_str).collect();
    let extra: std::collections::HashSet<&str> = deleted
        .iter()
        .map(String::as_str)
        .filter(|id| !left_out.contains(id))
        .collect();
    if extra.is_empty() {
        return Ok((Vec::new(), manifest.points));
    }
    let mut held = std::collections::BTreeSet::new();
    for source in &manifest.sources {
        for id in shards::paper_ids(&layout.resolve(&source.file), source.rows)? {
            if extra.contains(id.as_str()) {
                held.insert(id);
            }
        }
    }
    let points = manifest.points.saturating_sub(held.len() as u64);
    Ok((held.into_iter().collect(), points))
}

/// Records as uploaded under `key` exactly the parquet shards in `loaded` (the rows this load
/// built its shards from and verified), so `upload` afterwards sends only the rest: a batch
/// accepted during the load, or a batch whose accepted shards changed since, stays pending.
fn record_loaded_shards(db: &RunDb, key: &str, loaded: &[ShardRow]) -> Result<(), SnapshotError> {
    let loaded: std::collections::HashSet<(i64, &str, u64)> = loaded
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

/// The accepted parquet shards of each batch, in batch and part order.
fn sources_by_batch(shards: &[ShardRow]) -> Vec<(i64, Vec<SourceShard>)> {
    let mut out: Vec<(i64, Vec<SourceShard>)> = Vec::new();
    for s in shards {
        let source = SourceShard::from(s);
        match out.last_mut() {
            Some((b, list)) if *b == s.batch_id.0 => list.push(source),
            _ => out.push((s.batch_id.0, vec![source])),
        }
    }
    out
}

fn peer_url(peers: &[Peer], peer: Option<u64>, rest: &RestClient) -> String {
    peer.and_then(|id| peers.iter().find(|p| p.id == id))
        .map_or_else(|| rest.url().to_owned(), |p| p.rest_url.clone())
}

/// Recovers each of `todo` on its peer, `in_flight` at once; `on_done` runs on this thread for
/// each result (run.db stays with this thread). Returns how many were recovered, or the first
/// error once every recovery in flight has ended.
fn recover_all(
    rest: &RestClient,
    collection: &str,
    layout: &RunLayout,
    todo: &[(&Group, u32, String)],
    in_flight: usize,
    mut on_done: impl FnMut(&Group, &Result<(), SnapshotError>) -> Result<(), SnapshotError>,
) -> Result<usize, SnapshotError> {
    let (job_tx, job_rx) = crossbeam_channel::unbounded::<usize>();
    for i in 0..todo.len() {
        let _ = job_tx.send(i);
    }
    drop(job_tx);
    let (done_tx, done_rx) = crossbeam_channel::unbounded();
    let delay = std::env::var(SNAPSHOT_TEST_DELAY_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .map(Duration::from_millis);
    std::thread::scope(|scope| {
        for _ in 0..in_flight.min(todo.len()) {
            let (job_rx, done_tx) = (job_rx.clone(), done_tx.clone());
            scope.spawn(move || {
                for i in job_rx {
                    if let Some(delay) = delay {
                        std::thread::sleep(delay);
                    }
                    let (b, shard_id, url) = &todo[i];
                    let path = layout.resolve(&b.manifest.snapshot);
                    let result = rest.for_peer(url).and_then(|peer| {
                        peer.recover_shard(
                            collection,
                            *shard_id,
                            &path,
                            &b.manifest.snapshot_sha256,
                        )
                    });
                    let failed = result.is_err();
                    if done_tx.send((i, result)).is_err() || failed {
                        return;
                    }
                }
            });
        }
        drop(done_tx);
        let mut recovered = 0;
        let mut first_error = None;
        for (i, result) in done_rx {
            let (b, _, _) = &todo[i];
            on_done(b, &result)?;
            match result {
                Ok(()) => recovered += 1,
                Err(e) => {
                    first_error.get_or_insert(SnapshotError::Check {
                        what: format!(
                            "recovering {} (shard key {})",
                            describe_batches(b.batches),
                            b.key
                        ),
                        message: e.to_string(),
                    });
                }
            }
        }
        match first_error {
            Some(e) => Err(e),
            None => Ok(recovered),
        }
    })
}

/// Waits until every replica of every replicated key holds its built shard's points and
/// serves reads. A recovery marks the key's other replicas dead and they copy the recovered
/// one, but the mark is proposed, not awaited: right after the recovery a stale replica may
/// still answer, and a peer whose replica is still copying forwards reads to the recovered one
/// (which alone would then hold the group: a peer lost then loses it). So the end is both:
/// every replica active with no transfer under way, and an exact count through every
/// replica's peer equal to the manifest's.
fn wait_replicas(
    server: &QdrantServer,
    rest: &RestClient,
    peers: &[Peer],
    name: &str,
    groups: &[Group],
    placed: &[embedfleet_upload::KeyedShard],
    timeout: Duration,
) -> Result<(), SnapshotError> {
    let start = Instant::now();
    for g in groups {
        let Some(shard) = placed.iter().find(|s| s.key == g.key) else {
            continue;
        };
        if shard.peers.len() < 2 {
            continue;
        }
        for &peer in &shard.peers {
            let client = rest.for_peer(&peer_url(peers, Some(peer), rest))?;
            loop {
                let n = client.count_in_key(name, &g.key)?;
                if n == g.points {
                    break;
                }
                if start.elapsed() > timeout {
                    return Err(SnapshotError::Check {
                        what: format!("shard key {} on peer {peer}", g.key),
                        message: format!(
                            "its replica holds {n} points, not {}, after {} s",
                            g.points,
                            start.elapsed().as_secs()
                        ),
                    });
                }
                std::thread::sleep(Duration::from_millis(250));
            }
        }
    }
    // Counts first: a stale replica still marked active counts short until its mark lands;
    // then every replica active, so that no group lives on one peer alone.
    let replicated = |key: &str| placed.iter().any(|s| s.key == key && s.peers.len() > 1);
    loop {
        let now = server.keyed_shards(name)?;
        let unsettled: Vec<&str> = now
            .iter()
            .filter(|s| !s.settled && groups.iter().any(|g| g.key == s.key) && replicated(&s.key))
            .map(|s| s.key.as_str())
            .collect();
        if unsettled.is_empty() {
            break;
        }
        if start.elapsed() > timeout {
            return Err(SnapshotError::Check {
                what: format!("shard keys {}", unsettled.join(", ")),
                message: format!(
                    "their replicas are not all active after {} s",
                    start.elapsed().as_secs()
                ),
            });
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    Ok(())
}

fn wait_green(server: &QdrantServer, name: &str, timeout: Duration) -> Result<(), SnapshotError> {
    let start = Instant::now();
    // Optimizers may start a moment after the last recovery: look twice before believing green.
    let mut green_seen = 0;
    loop {
        let info = server
            .collection_info(name)?
            .ok_or_else(|| SnapshotError::Check {
                what: format!("collection `{name}`"),
                message: "it is gone".into(),
            })?;
        if info.red {
            return Err(SnapshotError::Check {
                what: format!("collection `{name}`"),
                message: "it is red: an optimization failed; the server's log says why".into(),
            });
        }
        green_seen = if info.green { green_seen + 1 } else { 0 };
        if green_seen >= 2 {
            return Ok(());
        }
        if start.elapsed() > timeout {
            return Err(SnapshotError::Check {
                what: format!("collection `{name}`"),
                message: format!("it is not green after {} s", start.elapsed().as_secs()),
            });
        }
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// Exact searches for rows of the parquet shards (spread over the batches): each must find its
/// own point first. Returns how many were checked.
fn check_searches(
    server: &QdrantServer,
    name: &str,
    layout: &RunLayout,
    groups: &[Group],
    tombstones: &Tombstones,
    samples: usize,
) -> Result<usize, SnapshotError> {
    if samples == 0 {
        return Ok(0);
    }
    let per_batch = samples.div_ceil(groups.len()).max(1);
    let mut checked = 0;
    for b in groups {
        let source = &b.manifest.sources[0];
        let path = layout.resolve(&source.file);
        let Some(record_batch) = shards::read_from(&path, 0, per_batch)?.next() else {
            continue;
        };
        let record_batch = record_batch.map_err(|e| shards::ShardReadError {
            path: path.clone(),
            message: e.to_string(),
        })?;
        let points = PointsBatch::from_record_batch(&record_batch)?;
        // A deleted paper is not in the shard: it is not searched for.
        let live = points
            .iter()
            .filter(|p| tombstones.serves(b.batches.0, p.paper_id));
        for p in live.take(samples - checked) {
            let options = SearchOptions {
                exact: true,
                ..SearchOptions::new(1)
            };
            let hits = server.search_with(name, p.vector, &options)?;
            let want = point_id(p.paper_id);
            // Another point with the same vector (a duplicate text) may tie: its score is 1 too.
            let ok = hits
                .first()
                .is_some_and(|h| h.id == want || (h.score - 1.0).abs() < 1e-4);
            if !ok {
                return Err(SnapshotError::Check {
                    what: format!(
                        "an exact search for paper {} ({})",
                        p.paper_id,
                        describe_batches(b.batches)
                    ),
                    message: format!(
                        "it found {:?} first, not the paper itself",
                        hits.first().map(|h| (h.id, h.score))
                    ),
                });
            }
            checked += 1;
        }
        if checked >= samples {
            break;
        }
    }
    Ok(checked)
}

fn progress_bar(show: bool, total: u64) -> ProgressBar {
    if !show {
        return ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::hidden());
    }
    let bar = ProgressBar::new(total);
    bar.set_style(
        ProgressStyle::with_template(
            "recovering shards {bar:30} {pos}/{len} {elapsed} (eta {eta})",
        )
        .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    bar
}

fn list(what: &str, batches: &[i64]) -> String {
    let mut s: Vec<String> = batches.iter().take(8).map(|b| b.to_string()).collect();
    if batches.len() > 8 {
        s.push(format!("… {} more", batches.len() - 8));
    }
    format!("{what} {}", s.join(", "))
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
            .differences(&with_indexes_to_come(&wanted, &made))
            .is_empty());
        made.payload_indexes = wanted.payload_indexes[..1].to_vec();
        assert!(wanted
            .differences(&with_indexes_to_come(&wanted, &made))
            .is_empty());
        // An index this load would not make, or another setting, still differs.
        made.payload_indexes.push(("lang".into(), "keyword".into()));
        assert!(!wanted
            .differences(&with_indexes_to_come(&wanted, &made))
            .is_empty());
        let mut other = wanted.clone();
        other.payload_indexes.clear();
        other.hnsw_m = 32;
        assert_eq!(
            wanted
                .differences(&with_indexes_to_come(&wanted, &other))
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
