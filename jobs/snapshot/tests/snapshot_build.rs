//! `build_shard` over parquet shards written the embed job's way: the snapshot it packs is a
//! real Qdrant shard (unpacked and opened by the engine: every point, its payload, its HNSW
//! graph), rebuilding is skipped, a killed build's scratch goes, a changed source or other
//! settings are refused. The server's side of it is `tests/e2e/snapshot.rs`'s server suite.

use std::fs::File;
use std::path::{Path, PathBuf};

// The vectordb crate's shard writers (the embed job's way); only some of its helpers are used here.
#[path = "../../../vectordb/tests/it/upload_common.rs"]
#[allow(dead_code)]
mod upload_common;

use embedfleet_core::rundb::RunDb;
use embedfleet_core::RunLayout;
use embedfleet_snapshot::{
    build_shard, build_shard_without, find_built, find_usable, group_rows, SnapshotError,
    SourceShard,
};
use embedfleet_vectordb::{
    point_id, CollectionSpec, CountRequest, PayloadFilter, QdrantEdge, QueryRequest, SearchOptions,
    Sink,
};
use upload_common::{paper_id, rows_in_years, source_of, vector_of, write_shard};

const DIM: usize = 32;

/// Writes shards of rows `first..first + n` into `run/shards/`, as the embed job does.
fn write_shards(run: &Path, parts: &[(usize, usize)]) -> Vec<SourceShard> {
    std::fs::create_dir_all(run.join("shards")).unwrap();
    parts
        .iter()
        .enumerate()
        .map(|(part, &(first, n))| {
            let file = format!("shards/b000001-{part:04}.a1.parquet");
            let info = write_shard(&run.join(&file), first..first + n, DIM);
            SourceShard {
                file,
                rows: info.rows,
                sha256: info.sha256,
            }
        })
        .collect()
}

/// A spec whose tiny test shards still get an HNSW graph (the threshold is in KB of vectors).
fn indexed_spec() -> CollectionSpec {
    let mut spec = CollectionSpec::new("papers", 0);
    spec.qdrant.indexing_threshold_kb = 1;
    spec
}

/// Unpacks a shard snapshot the way the server does (streamable segments: `files/` moved up)
/// into an embedded engine's directory, as collection `name`.
fn unpack_as_edge(snapshot: &Path, root: &Path, name: &str) -> PathBuf {
    let shard = root.join("collections").join(name);
    std::fs::create_dir_all(&shard).unwrap();
    tar::Archive::new(File::open(snapshot).unwrap())
        .unpack(&shard)
        .unwrap();
    for entry in std::fs::read_dir(shard.join("segments")).unwrap() {
        let segment = entry.unwrap().path();
        let files = segment.join("files");
        for f in std::fs::read_dir(&files).unwrap() {
            let f = f.unwrap();
            std::fs::rename(f.path(), segment.join(f.file_name())).unwrap();
        }
        std::fs::remove_dir(&files).unwrap();
    }
    // The server keeps the collection's config apart; the engine infers it from the segments
    // (and saves it, so the embedded sink opens the directory).
    drop(qdrant_edge::EdgeShard::load(&shard, None).unwrap());
    shard
}

#[test]
fn a_built_shard_is_a_loadable_qdrant_shard_with_every_point_and_its_index() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let layout = RunLayout::new(&run);
    let sources = write_shards(&run, &[(0, 300), (300, 200)]);

    let outcome = build_shard(&layout, (1, 1), &sources, &indexed_spec()).unwrap();
    assert!(outcome.built);
    let m = &outcome.manifest;
    assert_eq!(m.points, 500);
    assert_eq!(m.sources, sources);
    assert_eq!(m.settings.vector_size, DIM);
    assert_eq!(m.first_id, Some(point_id(&paper_id(0)).to_string()));
    assert_eq!(m.last_id, Some(point_id(&paper_id(499)).to_string()));
    assert_eq!(m.engine_version, embedfleet_snapshot::EDGE_QDRANT_VERSION);
    assert!(!m.segment_format.is_empty());
    let snapshot = layout.resolve(&m.snapshot);
    assert_eq!(
        embedfleet_core::shardfile::sha256_of(&snapshot).unwrap(),
        m.snapshot_sha256
    );
    assert!(m.timings.optimize_s > 0.0 && m.timings.cpu_s > 0.0);
    // Nothing of the build is left beside the snapshot and its manifest.
    let mut left: Vec<String> = std::fs::read_dir(layout.snapshot_dir())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    left.sort();
    assert_eq!(left.len(), 2, "{left:?}");

    // The same sources and settings again: found, not built.
    let again = build_shard(&layout, (1, 1), &sources, &indexed_spec()).unwrap();
    assert!(!again.built);
    // The manifest found is the one written (its floats go through JSON: compare the rest).
    let (a, b) = (&again.manifest, &outcome.manifest);
    assert_eq!(
        (
            &a.sources,
            &a.snapshot,
            &a.snapshot_sha256,
            a.points,
            &a.settings
        ),
        (
            &b.sources,
            &b.snapshot,
            &b.snapshot_sha256,
            b.points,
            &b.settings
        )
    );

    // The snapshot, unpacked, is a shard the engine opens: every point, its payload, its graph.
    let root = tmp.path().join("unpacked");
    unpack_as_edge(&snapshot, &root, "papers");
    let engine = QdrantEdge::open(&root).unwrap();
    assert_eq!(engine.count(CountRequest::new("papers")).unwrap(), 500);
    let info = engine.collection_info("papers").unwrap().unwrap();
    assert_eq!(info.vector_size, DIM);
    assert_eq!(
        info.indexed_vectors, 500,
        "the HNSW graph was built offline"
    );
    assert_eq!(
        engine
            .count(CountRequest::new("papers").filter(Some(&PayloadFilter::years(2019, 2020))))
            .unwrap(),
        rows_in_years(0, 500, 2019, 2020)
    );
    assert_eq!(
        engine
            .count(CountRequest::new("papers").filter(Some(&PayloadFilter::source("arxiv"))))
            .unwrap(),
        (0..500).filter(|&i| source_of(i) == "arxiv").count() as u64
    );
    for i in [0, 299, 300, 499] {
        let v = vector_of(i, DIM, 7);
        for exact in [true, false] {
            let options = SearchOptions {
                exact,
                ..SearchOptions::new(1)
            };
            let hits = engine
                .query(QueryRequest::one("papers", &v, options.clone()))
                .unwrap()
                .remove(0);
            assert_eq!(hits[0].id, point_id(&paper_id(i)), "row {i}, exact {exact}");
            assert_eq!(hits[0].paper_id.as_deref(), Some(paper_id(i).as_str()));
        }
    }
}

#[test]
fn a_killed_builds_scratch_goes_and_changed_sources_or_other_settings_are_refused() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let layout = RunLayout::new(&run);
    let sources = write_shards(&run, &[(0, 40)]);

    // What a build killed on this host leaves: its scratch directory (its process is gone).
    let host = embedfleet_core::handoff::host_name();
    let dead = layout
        .snapshot_dir()
        .join(format!(".build-000001-0011223344556677-{host}-999999999"));
    std::fs::create_dir_all(dead.join("engine")).unwrap();
    // Another host's scratch: only that host can tell whether its build still runs, so it is
    // left alone while it is written to, and removed once nothing was for a day (a node that
    // died mid-build).
    let other = layout
        .snapshot_dir()
        .join(".build-000001-0011223344556677-elsewhere-1");
    std::fs::create_dir_all(&other).unwrap();
    let abandoned = layout
        .snapshot_dir()
        .join(".build-000001-8899aabbccddeeff-deadnode-7");
    std::fs::create_dir_all(abandoned.join("engine")).unwrap();
    let day_ago = std::time::SystemTime::now() - std::time::Duration::from_secs(24 * 3600);
    for path in [abandoned.join("engine"), abandoned.clone()] {
        std::fs::File::open(&path)
            .unwrap()
            .set_modified(day_ago)
            .unwrap();
    }

    let spec = CollectionSpec::new("papers", 0);
    build_shard(&layout, (1, 1), &sources, &spec).unwrap();
    assert!(!dead.exists(), "the dead build's scratch is removed");
    assert!(other.exists(), "another host's live scratch is left alone");
    assert!(
        !abandoned.exists(),
        "another host's scratch idle for a day is removed"
    );

    // Other settings than the built shard's: refused, naming the difference.
    let mut other_m = spec.clone();
    other_m.qdrant.hnsw = embedfleet_vectordb::HnswParams {
        m: 32,
        ef_construct: 100,
    };
    let err = build_shard(&layout, (1, 1), &sources, &other_m).unwrap_err();
    assert!(
        matches!(&err, SnapshotError::SettingsDiffer { differences, .. } if differences.iter().map(ToString::to_string).collect::<Vec<_>>() == ["hnsw m: the run's 16, here 32"]),
        "{err}"
    );

    // A source changed since it was recorded: refused before anything is built.
    let changed = write_shards(&tmp.path().join("run2"), &[(0, 40)]);
    let layout2 = RunLayout::new(tmp.path().join("run2"));
    let path = layout2.resolve(&changed[0].file);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes.push(0);
    std::fs::write(&path, bytes).unwrap();
    let err = build_shard(&layout2, (1, 1), &changed, &spec).unwrap_err();
    assert!(
        err.to_string().contains("changed after it was written"),
        "{err}"
    );
    assert!(!layout2.snapshot_dir().join("b000001").exists());
}

/// A synthetic run of `batches` batches of `per_batch` points, `dim`-d.
fn synthetic_run(dir: &Path, batches: usize, per_batch: usize, dim: usize) -> PathBuf {
    let run = dir.join("run");
    embedfleet_core::synthetic::SyntheticRun {
        batch_points: per_batch,
        ..embedfleet_core::synthetic::SyntheticRun::new(batches * per_batch, dim, 500)
    }
    .write(&run)
    .unwrap();
    run
}

#[test]
fn server_recovered_built_shards_arrive_indexed_and_green_with_nothing_rebuilt() {
    use embedfleet_snapshot::{load_snapshots, LoadOptions, RestClient};
    use embedfleet_vectordb::{QdrantServer, ServerConfig};
    let Some(url) = upload_common::qdrant_url(
        "server_recovered_built_shards_arrive_indexed_and_green_with_nothing_rebuilt",
    ) else {
        return;
    };
    let rest_url =
        std::env::var("QDRANT_REST_URL").unwrap_or_else(|_| RestClient::url_from_grpc(&url));
    let server = QdrantServer::connect(ServerConfig::new(url.clone())).unwrap();
    let rest =
        RestClient::new(&rest_url, None, false, std::time::Duration::from_secs(600)).unwrap();
    let name = format!("embedfleet-it-indexed-{}", std::process::id());
    let _ = server.delete_collection(&name);

    let tmp = tempfile::tempdir().unwrap();
    let run = synthetic_run(tmp.path(), 3, 2000, 128);
    let mut options = LoadOptions::new(&run, &name);
    // 2,000 × 128-d is 1 MB a batch: a 100 KB threshold gives every built shard its graph.
    options.spec.qdrant.indexing_threshold_kb = 100;
    // A group per batch: three keys.
    options.group_count = Some(3);
    let report = load_snapshots(
        &RunDb::open(&options.run_dir).unwrap(),
        &server,
        &rest,
        &options,
    )
    .unwrap();
    assert_eq!(
        (
            report.batches,
            report.groups,
            report.recovered,
            report.built_here
        ),
        (3, 3, 3, 3)
    );
    assert_eq!(report.points, 6000);
    assert!(report.searches_checked >= 49, "{report:?}");

    let info = server.collection_info(&name).unwrap().unwrap();
    assert!(info.green, "{info:?}");
    assert_eq!(info.points, 6000);
    assert_eq!(
        info.indexed_vectors, 6000,
        "the graphs arrived built: {info:?}"
    );
    // Still green, and still every vector indexed, a while later: no optimizer picked them up.
    std::thread::sleep(std::time::Duration::from_secs(3));
    let later = server.collection_info(&name).unwrap().unwrap();
    assert!(later.green && later.indexed_vectors == 6000, "{later:?}");
    for group in 1..=3 {
        let key = format!("{}-g{group}", report.run_id);
        assert_eq!(
            server
                .count(CountRequest::new(&name).shard_key(Some(&key)))
                .unwrap(),
            2000
        );
    }
    // The approximate (HNSW) search finds a point by its own vector.
    let db = embedfleet_core::rundb::RunDb::open(&run).unwrap();
    let shard = &db.all_shards().unwrap()[7];
    let batch = embedfleet_vectordb::shards::read_from(&run.join(&shard.path), 0, 5)
        .unwrap()
        .next()
        .unwrap()
        .unwrap();
    let points = embedfleet_vectordb::PointsBatch::from_record_batch(&batch).unwrap();
    for p in points.iter() {
        let hits = server
            .query(QueryRequest::one(&name, p.vector, SearchOptions::new(1)))
            .unwrap()
            .remove(0);
        assert_eq!(hits[0].id, point_id(p.paper_id));
    }
    // A second load finds everything done.
    let again = load_snapshots(
        &RunDb::open(&options.run_dir).unwrap(),
        &server,
        &rest,
        &options,
    )
    .unwrap();
    assert_eq!(
        (again.recovered, again.already, again.built_here),
        (0, 3, 0)
    );
    server.delete_collection(&name).unwrap();
}

#[test]
fn a_shard_built_without_deleted_papers_holds_none_of_them_and_has_another_name() {
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let layout = RunLayout::new(&run);
    let sources = write_shards(&run, &[(0, 60), (60, 40)]);
    let spec = indexed_spec();
    // A node's build (it never opens run.db): every row.
    let whole = build_shard(&layout, (1, 1), &sources, &spec).unwrap();
    assert_eq!(whole.manifest.points, 100);
    // The login node's, after `delete` of papers 0, 59 and 77 (given in any order).
    let deleted = vec![paper_id(77), paper_id(0), paper_id(59)];
    let without = build_shard_without(&layout, (1, 1), &sources, &deleted, &[], &spec).unwrap();
    assert!(without.built, "the node's build is not taken for it");
    let m = &without.manifest;
    assert_eq!(m.points, 97);
    let mut sorted = deleted.clone();
    sorted.sort();
    assert_eq!(m.deleted, sorted);
    assert_ne!(m.snapshot, whole.manifest.snapshot, "another name");
    assert_eq!(m.first_id, Some(point_id(&paper_id(1)).to_string()));
    // Each build is found for its own deletions only.
    let found = find_built(&layout, (1, 1), &sources, &sorted)
        .unwrap()
        .unwrap();
    assert_eq!(found.snapshot, m.snapshot);
    let found = find_built(&layout, (1, 1), &sources, &[]).unwrap().unwrap();
    assert_eq!(found.snapshot, whole.manifest.snapshot);
    // The snapshot is a shard without them.
    let root = tmp.path().join("edge");
    unpack_as_edge(&layout.resolve(&m.snapshot), &root, "papers");
    let sink = QdrantEdge::open(&root).unwrap();
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 97);
    let dead: Vec<_> = deleted.iter().map(|p| point_id(p)).collect();
    assert_eq!(
        sink.count(CountRequest::new("papers").ids(&dead)).unwrap(),
        0
    );
}

/// Writes batch `batch`'s shard of rows `rows`, with vectors of `seed` (another seed: the
/// paper's text changed in a later release).
fn write_batch_shard(
    run: &Path,
    batch: i64,
    rows: std::ops::Range<usize>,
    seed: u64,
) -> SourceShard {
    use embedfleet_core::shardfile::{ShardRow, ShardWriter, VectorDtype};
    std::fs::create_dir_all(run.join("shards")).unwrap();
    let file = format!("shards/b{batch:06}-0000.a1.parquet");
    let mut w = ShardWriter::create(
        &run.join(&file),
        VectorDtype::F32,
        &upload_common::shard_meta(DIM),
    )
    .unwrap();
    for i in rows {
        let paper = embedfleet_core::paper::Paper {
            id: paper_id(i),
            source: Some(source_of(i).into()),
            ..Default::default()
        };
        let vector = vector_of(i, DIM, seed);
        w.push(&ShardRow {
            paper: &paper,
            vector: &vector,
            n_chars: 100,
            n_tokens: 20,
            n_chunks: 1,
        })
        .unwrap();
    }
    let info = w.finish().unwrap();
    SourceShard {
        file,
        rows: info.rows,
        sha256: info.sha256,
    }
}

#[test]
fn a_group_holding_a_papers_old_and_new_rows_keeps_one_point_with_the_new_vector() {
    use embedfleet_core::rundb::WithheldRow;
    use embedfleet_vectordb::integrity::Tombstones;
    let tmp = tempfile::tempdir().unwrap();
    let run = tmp.path().join("run");
    let layout = RunLayout::new(&run);
    // Release 1 is batch 1 (papers 0..60). Release 2 changed papers 50..60 and added 60..80:
    // batch 2. Release 3 changed paper 70 again (batch 3, another group) and withdrew paper 3.
    let sources = vec![
        write_batch_shard(&run, 1, 0..60, 7),
        write_batch_shard(&run, 2, 50..80, 9),
    ];
    let mut withheld: Vec<WithheldRow> = (50..60)
        .map(|i| WithheldRow {
            batch_id: 1,
            paper_id: paper_id(i),
            gone: false,
            live_batch: Some(2),
        })
        .collect();
    withheld.push(WithheldRow {
        batch_id: 2,
        paper_id: paper_id(70),
        gone: false,
        live_batch: Some(3),
    });
    withheld.push(WithheldRow {
        batch_id: 1,
        paper_id: paper_id(3),
        gone: true,
        live_batch: None,
    });
    let tombstones = Tombstones::from(Vec::new()).withholding(withheld);
    // Batches 1 and 2 are group 1; batch 3 is group 2.
    let group_of = |b: i64| if b <= 2 { 1 } else { 2 };
    let (deleted, replaced) = group_rows(&tombstones, group_of, (1, 2));
    assert_eq!(deleted, vec![paper_id(3), paper_id(70)]);
    assert_eq!(replaced, (50..60).map(paper_id).collect::<Vec<_>>());

    let spec = indexed_spec();
    let built = build_shard_without(&layout, (1, 2), &sources, &deleted, &replaced, &spec).unwrap();
    // 60 + 30 rows, 10 of them a paper's second row, 2 left out.
    assert_eq!(built.manifest.points, 78);
    let root = tmp.path().join("edge");
    unpack_as_edge(&layout.resolve(&built.manifest.snapshot), &root, "papers");
    let sink = QdrantEdge::open(&root).unwrap();
    assert_eq!(sink.count(CountRequest::new("papers")).unwrap(), 78);
    let gone: Vec<_> = [3, 70].iter().map(|&i| point_id(&paper_id(i))).collect();
    assert_eq!(
        sink.count(CountRequest::new("papers").ids(&gone)).unwrap(),
        0
    );
    for i in [50, 55, 59] {
        // The point holds release 2's vector, not release 1's.
        let new = sink
            .query(QueryRequest::one(
                "papers",
                &vector_of(i, DIM, 9),
                SearchOptions::new(1),
            ))
            .unwrap()
            .remove(0);
        assert_eq!(new[0].id, point_id(&paper_id(i)));
        assert!(new[0].score > 0.999, "{:?}", new[0]);
        let old = sink
            .query(QueryRequest::one(
                "papers",
                &vector_of(i, DIM, 7),
                SearchOptions::new(1),
            ))
            .unwrap()
            .remove(0);
        assert!(
            old[0].id != point_id(&paper_id(i)) || old[0].score < 0.99,
            "paper {i} kept its old vector: {:?}",
            old[0]
        );
    }

    // A later delete of paper 10: the build is still usable, its load deletes paper 10 by id;
    // a build leaving out more than is wanted is not.
    let mut more = deleted.clone();
    more.push(paper_id(10));
    more.sort();
    let usable = find_usable(&layout, (1, 2), &sources, &more)
        .unwrap()
        .expect("the build without paper 10's delete is usable");
    assert_eq!(usable.snapshot, built.manifest.snapshot);
    assert!(find_built(&layout, (1, 2), &sources, &more)
        .unwrap()
        .is_none());
    assert!(find_usable(&layout, (1, 2), &sources, &[paper_id(3)])
        .unwrap()
        .is_none());
    // Other sources (a batch's shard re-embedded) make it unusable.
    assert!(find_usable(&layout, (1, 2), &sources[..1], &more)
        .unwrap()
        .is_none());
}
