//! eval on the embedded engine: exact search gives recall 1.0; a deliberately weak HNSW
//! (small graph, tiny ef) over a few thousand points gives less; a filter passing ~1 % of the
//! points is evaluated against the same filter's exact answers.

use embedfleet_core::rundb::RunDb;
use embedfleet_core::synthetic::SyntheticRun;
use embedfleet_query::{eval, sample_queries, EvalOptions};
use embedfleet_vectordb::{upload, HnswParams, QdrantEdge, Sink, UploadOptions};
use std::path::Path;

/// A run directory of `points` random unit vectors of `dim`; one paper in 100 has the year
/// 2001, the others 2010..2019.
fn synthetic_run(dir: &Path, points: usize, dim: usize) {
    let mut run = SyntheticRun::new(points, dim, 1000);
    run.payload = |i| {
        let year = if i % 100 == 7 {
            2001
        } else {
            2010 + (i % 10) as i64
        };
        (year, "s2orc")
    };
    run.write(dir).unwrap();
}

#[test]
fn recall_is_one_for_exact_search_less_for_a_weak_graph_and_filtered_on_its_own() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    // 2,560-d (the 4B model's size): 41 MB of vectors, above the engine's full-scan threshold
    // (10 MB), so searches go through the graph.
    synthetic_run(&run, 4000, 2560);
    let sink = QdrantEdge::open(run.join("qdrant")).unwrap();
    let mut options = UploadOptions::new(&run, "papers");
    // A small, cheap graph built for every segment: approximate enough to miss neighbours.
    options.spec.qdrant.hnsw = HnswParams {
        m: 4,
        ef_construct: 8,
    };
    options.spec.qdrant.indexing_threshold_kb = 1;
    upload(&sink, &options).unwrap();
    let info = sink.collection_info("papers").unwrap().unwrap();
    assert_eq!(info.points, 4000);
    assert!(info.indexed_vectors > 0, "the graph was built: {info:?}");

    let db = RunDb::open(&run).unwrap();
    let queries = sample_queries(&db, 60, 3).unwrap();
    assert_eq!(queries.len(), 60);
    let eval_options = EvalOptions {
        collection: "papers".into(),
        k: 10,
        efs: vec![10, 200],
        filters: vec!["year=2001".into()],
        batch_size: 1,
        in_flight: 1,
    };
    let report = eval(&sink, &db, &queries, &eval_options).unwrap();
    let row = |filter: &str, search: &str| {
        report
            .rows
            .iter()
            .find(|r| r.filter == filter && r.search == search)
            .unwrap_or_else(|| panic!("no row {filter}/{search}: {report:?}"))
            .clone()
    };
    eprintln!("{}", embedfleet_query::render(&report));
    assert_eq!(row("none", "exact").recall, 1.0);
    assert_eq!(row("none", "exact").short_share, 0.0);
    let weak = row("none", "ef=10").recall;
    assert!(
        weak < 1.0,
        "a weak graph at ef=10 misses neighbours: {weak}"
    );
    assert!(row("none", "ef=200").recall >= weak);
    let selectivity = report.filter_selectivity.unwrap();
    assert!((0.009..=0.011).contains(&selectivity), "{selectivity}");
    let filtered = row("year=2001", "exact");
    assert_eq!(
        filtered.recall, 1.0,
        "the exact search applies the same filter"
    );
    assert!(report
        .rows
        .iter()
        .any(|r| r.filter == "year=2001" && r.search == "ef=10"));
    // The exact answers are cached for the next eval of the same queries.
    let cached = std::fs::read_dir(run.join("eval"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("exact-")
        })
        .count();
    assert_eq!(cached, 2, "one for each filter");
    assert!(run.join("eval/latest.json").is_file());
    let again = eval(&sink, &db, &queries, &eval_options).unwrap();
    assert_eq!(again.rows.len(), report.rows.len());
    let png = run.join("recall.png");
    embedfleet_query::write_recall_plot(&report, &png).unwrap();
    assert_eq!(&std::fs::read(&png).unwrap()[..4], b"\x89PNG");
}
