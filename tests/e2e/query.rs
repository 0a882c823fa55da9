//! `query` on the collection `run` made: every term gets k ranked papers of the run, best
//! first; a killed query run continues without writing any query twice.

use crate::util::{read_shard, TestDir};
use arrow_array::{Array, Float32Array, Int32Array, Int64Array, StringArray};
use embedfleet_core::rundb::RunDb;
use std::collections::{BTreeMap, HashSet};
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const TERMS: [&str; 6] = [
    "protein folding",
    "graph neural networks",
    "CRISPR gene editing",
    "dark matter halos",
    "soil microbiome",
    "transformer language models",
];

/// (term, query_id, rank, paper_id, score) of one result row.
pub(crate) type ResultRow = (String, i64, i32, String, f32);

/// `run` on 60 papers into `run`, and a terms file of `n` terms.
pub(crate) fn run_with_terms(t: &TestDir, n: usize) {
    t.run_sample(60, 30);
    let terms: Vec<String> = (0..n)
        .map(|i| format!("{} {i}", TERMS[i % TERMS.len()]))
        .collect();
    std::fs::write(t.join("terms.txt"), terms.join("\n") + "\n").unwrap();
}

/// (term, query_id, rank, paper_id, score) of every row of a results file.
pub(crate) fn read_results(path: &Path) -> Vec<ResultRow> {
    let file = std::fs::File::open(path).unwrap();
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap();
    let mut out = Vec::new();
    for batch in reader {
        let batch = batch.unwrap();
        let col = |n: &str| batch.column_by_name(n).unwrap().clone();
        let (term, qid, rank, paper, score) = (
            col("term"),
            col("query_id"),
            col("rank"),
            col("paper_id"),
            col("score"),
        );
        let term = term.as_any().downcast_ref::<StringArray>().unwrap();
        let qid = qid.as_any().downcast_ref::<Int64Array>().unwrap();
        let rank = rank.as_any().downcast_ref::<Int32Array>().unwrap();
        let paper = paper.as_any().downcast_ref::<StringArray>().unwrap();
        let score = score.as_any().downcast_ref::<Float32Array>().unwrap();
        for i in 0..batch.num_rows() {
            assert!(paper.is_valid(i));
            out.push((
                term.value(i).to_string(),
                qid.value(i),
                rank.value(i),
                paper.value(i).to_string(),
                score.value(i),
            ));
        }
    }
    out
}

fn run_paper_ids(run: &Path) -> HashSet<String> {
    let db = RunDb::open(run).unwrap();
    db.all_shards()
        .unwrap()
        .iter()
        .flat_map(|s| read_shard(&run.join(&s.path)))
        .map(|r| r.id)
        .collect()
}

/// Every term has ranks 1..=k of papers of the run, scores not increasing.
fn check_results(rows: &[ResultRow], terms: usize, k: i32, ids: &HashSet<String>) {
    let mut by_query: BTreeMap<i64, Vec<&ResultRow>> = BTreeMap::new();
    for r in rows {
        by_query.entry(r.1).or_default().push(r);
    }
    assert_eq!(by_query.len(), terms, "every term is a query");
    for (qid, list) in by_query {
        let ranks: Vec<i32> = list.iter().map(|r| r.2).collect();
        assert_eq!(
            ranks,
            (1..=k).collect::<Vec<_>>(),
            "query {qid}: ranks once each, in order"
        );
        assert!(
            list.windows(2).all(|w| w[0].4 >= w[1].4),
            "query {qid}: best first"
        );
        assert!(
            list.iter().all(|r| ids.contains(&r.3)),
            "query {qid}: papers of the run"
        );
        assert!(
            list.iter().all(|r| r.0 == list[0].0),
            "one term per query id"
        );
    }
}

#[test]
fn query_writes_k_ranked_papers_of_the_run_for_every_term() {
    let t = TestDir::new();
    run_with_terms(&t, 6);
    // tune --queries saves a batch size and requests in flight, and query uses them.
    let tuned = t.run(&["tune", "--queries", "--run-dir", "run"], 0);
    assert!(String::from_utf8_lossy(&tuned.stdout).contains("| in_flight |"));
    let db = RunDb::open(&t.join("run")).unwrap();
    let saved: embedfleet_query::tune::TunedQueries = db
        .setting(embedfleet_query::tune::TUNED_QUERIES_SETTING)
        .unwrap()
        .expect("tune --queries saved its choice");
    drop(db);
    let args = [
        "query",
        "--run-dir",
        "run",
        "--terms",
        "terms.txt",
        "--top-k",
        "5",
        "--output",
        "hits.parquet",
    ];
    let out = t.run(&args, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("queries/s") && stderr.contains("p99"),
        "{stderr}"
    );
    let chosen = format!(
        "batches of {}, {} in flight",
        saved.batch_size, saved.in_flight
    );
    assert!(
        stderr.contains(&chosen),
        "query uses the tuned settings: {stderr}"
    );
    let rows = read_results(&t.join("hits.parquet"));
    assert_eq!(rows.len(), 6 * 5);
    check_results(&rows, 6, 5, &run_paper_ids(&t.join("run")));
    assert_eq!(rows[0].0, "protein folding 0");
    // Run again: nothing to do, the file is unchanged.
    let again = t.run(&args, 0);
    assert!(String::from_utf8_lossy(&again.stderr).contains("nothing to do"));
    assert_eq!(read_results(&t.join("hits.parquet")).len(), 30);
    // A filter no paper passes leaves every query empty-handed, not an error.
    let filtered = [
        "query",
        "--run-dir",
        "run",
        "--terms",
        "terms.txt",
        "--filter",
        "year<1900",
        "--output",
        "none.parquet",
    ];
    t.run(&filtered, 0);
    assert!(read_results(&t.join("none.parquet")).is_empty());
}

#[test]
fn a_killed_query_run_resumes_without_duplicate_rows() {
    let t = TestDir::new();
    run_with_terms(&t, 24);
    let args = [
        "query",
        "--run-dir",
        "run",
        "--terms",
        "terms.txt",
        "--top-k",
        "3",
        "--output",
        "hits.parquet",
        "--part-queries",
        "4",
    ];
    let mut child = t
        .cmd(&args)
        .env(embedfleet_query::workload::TEST_DELAY_ENV, "400")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let second_part = t.join("hits.parquet.parts/part-000001.parquet");
    let deadline = Instant::now() + Duration::from_secs(120);
    while !second_part.exists() {
        assert!(
            Instant::now() < deadline,
            "the query run never wrote two parts"
        );
        assert!(
            child.try_wait().unwrap().is_none(),
            "the query run ended early"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    assert!(!t.join("hits.parquet").exists(), "killed before the end");
    let out = t.run(&args, 0);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("done before"), "{stderr}");
    let rows = read_results(&t.join("hits.parquet"));
    assert_eq!(rows.len(), 24 * 3, "every query once");
    let keys: HashSet<(i64, i32)> = rows.iter().map(|r| (r.1, r.2)).collect();
    assert_eq!(keys.len(), rows.len(), "no (query, rank) twice");
    check_results(&rows, 24, 3, &run_paper_ids(&t.join("run")));
    assert!(
        !t.join("hits.parquet.parts").exists(),
        "the parts are joined and removed"
    );
    // Other terms into the same unfinished output are refused, not mixed in.
    std::fs::create_dir_all(t.join("other.parquet.parts")).unwrap();
    std::fs::write(t.join("other.parquet.parts/key.json"), "{}").unwrap();
    let other = [
        "query",
        "--run-dir",
        "run",
        "--terms",
        "terms.txt",
        "--output",
        "other.parquet",
    ];
    let refused = t.run(&other, 4);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("unfinished query run of another request") && stderr.contains("--replace"),
        "{stderr}"
    );
}
