//! `upload --postgres` into a real PostgreSQL with pgvector, after `run`: every paper one row
//! with its shard's vector, an update leaving exactly release 2, a load killed mid-COPY
//! resumed exact, a dropped table filled again, the vector types chosen by width, and
//! `delete`, `query` and `eval` on the table.
//!
//! The server is `EMBEDFLEET_PG_URL` (password from `PGPASSFILE`); without it each test says it
//! is skipped, and fails where `EMBEDFLEET_REQUIRE_PG=1` (CI, which starts one with
//! `.ci/pgvector/start-local-pg.sh`). Each test uses tables of its own and drops them.

use crate::util::{shard_rows, TestDir};
use embedfleet_core::rundb::RunDb;
use embedfleet_vectordb::{PgConfig, PgVector, Sink};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::time::{Duration, Instant};

/// The server's URL, or `None` (the test says it is skipped).
pub fn pg_url(test: &str) -> Option<String> {
    match std::env::var("EMBEDFLEET_PG_URL") {
        Ok(url) if !url.is_empty() => Some(url),
        _ => {
            if std::env::var("EMBEDFLEET_REQUIRE_PG").as_deref() == Ok("1") {
                panic!("{test}: EMBEDFLEET_PG_URL is not set but EMBEDFLEET_REQUIRE_PG=1; run .ci/pgvector/start-local-pg.sh");
            }
            eprintln!("skipping {test}: no PostgreSQL (set EMBEDFLEET_PG_URL; .ci/pgvector/start-local-pg.sh starts one)");
            None
        }
    }
}

/// Tables of one test, dropped when it ends (passed or not).
struct Tables {
    url: String,
    names: Vec<String>,
}

impl Tables {
    fn new(url: &str, test: &str, names: &[&str]) -> Self {
        let names = names
            .iter()
            .map(|n| format!("e2e_{test}_{n}_{}", std::process::id()))
            .collect();
        let tables = Self {
            url: url.to_owned(),
            names,
        };
        tables.drop_all();
        tables
    }

    fn name(&self, i: usize) -> &str {
        &self.names[i]
    }

    fn client(&self) -> postgres::Client {
        embedfleet_vectordb::pg::client(&PgConfig::new(&self.url)).expect("connect")
    }

    fn drop_all(&self) {
        let mut c = self.client();
        for n in &self.names {
            c.batch_execute(&format!("DROP TABLE IF EXISTS \"{n}\""))
                .unwrap();
        }
    }

    /// paper_id -> vector of every row of table `i` (f16 widened).
    fn rows(&self, i: usize) -> BTreeMap<String, Vec<f32>> {
        let mut c = self.client();
        let halfvec = self.column_type(i).starts_with("halfvec");
        let sql = format!("SELECT paper_id, embedding FROM \"{}\"", self.name(i));
        let mut out = BTreeMap::new();
        for row in c.query(&sql, &[]).unwrap() {
            let id: String = row.get(0);
            let v: Vec<f32> = if halfvec {
                let h: pgvector::HalfVector = row.get(1);
                h.to_vec().into_iter().map(f32::from).collect()
            } else {
                let v: pgvector::Vector = row.get(1);
                v.to_vec()
            };
            assert!(out.insert(id.clone(), v).is_none(), "{id} twice");
        }
        out
    }

    fn column_type(&self, i: usize) -> String {
        let mut c = self.client();
        c.query_one(
            "SELECT format_type(atttypid, atttypmod) FROM pg_attribute \
             WHERE attrelid = to_regclass($1) AND attname = 'embedding'",
            &[&format!("\"{}\"", self.name(i))],
        )
        .unwrap()
        .get(0)
    }

    fn exists(&self, i: usize) -> bool {
        let mut c = self.client();
        let found: Option<String> = c
            .query_one(
                "SELECT to_regclass($1)::text",
                &[&format!("\"{}\"", self.name(i))],
            )
            .unwrap()
            .get(0);
        found.is_some()
    }
}

impl Drop for Tables {
    fn drop(&mut self) {
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.drop_all()));
    }
}

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn upload_args<'a>(url: &'a str, table: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "upload",
        "--run-dir",
        "run",
        "--postgres",
        url,
        "--collection",
        table,
    ];
    args.extend_from_slice(extra);
    args
}

/// Every row of the table is a paper of the run, once, with its shard's vector exactly.
fn assert_rows_are_the_shards(tables: &Tables, i: usize, run: &std::path::Path) {
    let expected = shard_rows(run);
    let rows = tables.rows(i);
    assert_eq!(
        rows.keys().collect::<BTreeSet<_>>(),
        expected.keys().collect::<BTreeSet<_>>()
    );
    for (id, v) in &rows {
        assert_eq!(v, &expected[id].0, "{id}'s vector");
    }
}

#[test]
fn pgvector_upload_after_run_holds_every_paper_once_and_a_dropped_table_is_refilled() {
    let Some(url) = pg_url("pgvector_upload_after_run") else {
        return;
    };
    let tables = Tables::new(&url, "run", &["papers"]);
    let t = TestDir::new();
    t.small_run("run", 60, 40, &[]);
    let run = t.join("run");
    let name = tables.name(0);
    let out = t.run(&upload_args(&url, name, &[]), 0);
    let err = stderr(&out);
    assert!(err.contains("60 points sent"), "{err}");
    assert!(
        err.contains("60 indexed"),
        "the HNSW index was built: {err}"
    );
    assert_eq!(tables.column_type(0), "vector(128)");
    assert_rows_are_the_shards(&tables, 0, &run);
    // Progress is keyed by the table and its marker; the release it holds is recorded.
    let sink = PgVector::connect(PgConfig::new(&url)).unwrap();
    let key = embedfleet_vectordb::progress_key(&sink, name);
    let db = RunDb::open(&run).unwrap();
    assert_eq!(db.upload_totals(&key).unwrap(), (60, 0));
    assert!(db.upload_marker(&key).unwrap().is_some());
    assert_eq!(
        sink.collection_marker(name).unwrap(),
        db.upload_marker(&key).unwrap()
    );
    assert_eq!(db.upload_release(&key).unwrap(), Some(1));
    // Again: nothing to send.
    let err = stderr(&t.run(&upload_args(&url, name, &[]), 0));
    assert!(err.contains(" 0 points sent"), "{err}");
    // Dropped: every row sent again.
    tables.drop_all();
    let err = stderr(&t.run(&upload_args(&url, name, &[]), 0));
    assert!(err.contains("dropped or replaced"), "{err}");
    assert!(err.contains("60 points sent"), "{err}");
    assert_rows_are_the_shards(&tables, 0, &run);
    // Dropped and made again empty (no marker): another table too.
    tables.drop_all();
    let spec = embedfleet_vectordb::CollectionSpec::new(name, 128);
    sink.ensure_collection(&spec).unwrap();
    let err = stderr(&t.run(&upload_args(&url, name, &[]), 0));
    assert!(err.contains("dropped or replaced"), "{err}");
    assert!(err.contains("60 points sent"), "{err}");
    assert_rows_are_the_shards(&tables, 0, &run);
}

#[test]
fn pgvector_upload_killed_mid_copy_resumes_exact() {
    let Some(url) = pg_url("pgvector_upload_killed_mid_copy") else {
        return;
    };
    let tables = Tables::new(&url, "kill", &["papers"]);
    let t = TestDir::new();
    t.small_run("run", 60, 40, &[]);
    let run = t.join("run");
    let name = tables.name(0);
    let extra = [
        "--batch-size",
        "6",
        "--in-flight",
        "1",
        "--checkpoint-every",
        "1",
    ];
    let args = upload_args(&url, name, &extra);
    let sink = PgVector::connect(PgConfig::new(&url)).unwrap();
    let key = embedfleet_vectordb::progress_key(&sink, name);
    let mut child = t
        .cmd(&args)
        .env(embedfleet_vectordb::PG_TEST_COPY_DELAY_ENV, "150")
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let db = RunDb::open(&run).unwrap();
    let started = Instant::now();
    while db.upload_totals(&key).unwrap().0 < 12 {
        assert!(child.try_wait().unwrap().is_none(), "ended too soon");
        assert!(started.elapsed() < Duration::from_secs(120), "no progress");
        std::thread::sleep(Duration::from_millis(20));
    }
    // The next batch's COPY is under way and pauses half-way: killed there.
    std::thread::sleep(Duration::from_millis(60));
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let (at_kill, _) = db.upload_totals(&key).unwrap();
    assert!(at_kill > 0 && at_kill < 60, "mid-way: {at_kill}");
    let held = tables.rows(0).len() as u64;
    assert!(held >= at_kill && held < 60, "{held} rows after the kill");
    let err = stderr(&t.run(&args, 0));
    assert!(
        err.contains(&format!("{at_kill} already acknowledged")),
        "{err}"
    );
    assert_eq!(db.upload_totals(&key).unwrap(), (60, 0));
    assert_rows_are_the_shards(&tables, 0, &run);
}

#[test]
fn pgvector_an_update_leaves_the_table_exactly_release_2() {
    use crate::update::{live_vectors, make_releases, Shape};
    let Some(url) = pg_url("pgvector_an_update") else {
        return;
    };
    let tables = Tables::new(&url, "update", &["papers"]);
    let name = tables.name(0);
    let t = TestDir::new();
    let shape = Shape {
        release_1: 300,
        withdrawn: 15,
        changed: 9,
        new: 60,
    };
    let (withdrawn, changed, new) = make_releases(&t, &shape);
    t.run_corpus("run", "r1.jsonl", 100, &[]);
    let run = t.join("run");
    t.run(&upload_args(&url, name, &[]), 0);
    let release_1 = live_vectors(&run, &[]);
    assert_eq!(tables.rows(0), release_1, "release 1, exactly");

    t.run(&["plan", "--update", "r2.jsonl", "--run-dir", "run"], 0);
    t.run_corpus("run", "r2.jsonl", 100, &[]);
    t.run(&upload_args(&url, name, &[]), 0);
    let release_2 = live_vectors(&run, &withdrawn);
    let rows = tables.rows(0);
    assert_eq!(
        rows.len(),
        shape.release_1 - shape.withdrawn + shape.new,
        "one row per live paper"
    );
    assert_eq!(rows, release_2, "release 2, exactly");
    for id in &withdrawn {
        assert!(!rows.contains_key(id), "{id} withdrawn");
    }
    for id in &changed {
        assert_ne!(rows[id], release_1[id], "{id}'s new text, new vector");
    }
    assert!(new.iter().all(|id| rows.contains_key(id)));
    let sink = PgVector::connect(PgConfig::new(&url)).unwrap();
    let key = embedfleet_vectordb::progress_key(&sink, name);
    assert_eq!(
        RunDb::open(&run).unwrap().upload_release(&key).unwrap(),
        Some(2)
    );
}

#[test]
fn pgvector_2560_d_goes_to_halfvec_saying_so_and_4096_d_is_refused_with_the_ways_out() {
    let Some(url) = pg_url("pgvector_wide_vectors") else {
        return;
    };
    let tables = Tables::new(&url, "wide", &["w2560", "w4096"]);
    let t = TestDir::new();
    t.plan_with_model(12, 6);
    t.run(
        &[
            "plan",
            "--corpus",
            "c.jsonl.gz",
            "--run-dir",
            "run2",
            "--papers-per-job",
            "6",
        ],
        0,
    );
    for (run, width) in [("run", "2560"), ("run2", "4096")] {
        let model = format!("m{width}");
        t.run(
            &["make-tiny-model", "--out", &model, "--hidden-size", width],
            0,
        );
        let args = [
            "submit",
            "--run-dir",
            run,
            "--model-dir",
            &model,
            "--queue",
            "local=2",
            "--poll-interval",
            "0.3",
        ];
        t.run(&args, 0);
    }
    // 2,560-d f32 (Qwen3-Embedding-4B's width): halfvec, and the upload says so.
    let err = stderr(&t.run(&upload_args(&url, tables.name(0), &[]), 0));
    assert!(err.contains("stores them as `halfvec`"), "{err}");
    assert_eq!(tables.column_type(0), "halfvec(2560)");
    let expected = shard_rows(&t.join("run"));
    let rows = tables.rows(0);
    assert_eq!(rows.len(), 12);
    for (id, v) in &rows {
        let rounded: Vec<f32> = expected[id]
            .0
            .iter()
            .map(|x| half::f16::from_f32(*x).to_f32())
            .collect();
        assert_eq!(v, &rounded, "{id}: the shard's vector within f16 rounding");
    }
    // 4,096-d (8B): refused before anything is made, naming the ways out.
    let mut args = upload_args(&url, tables.name(1), &[]);
    args[2] = "run2";
    let err = stderr(&t.run(&args, 4));
    assert!(err.contains("--dim"), "{err}");
    assert!(err.contains("binary_quantize"), "{err}");
    assert!(!tables.exists(1), "no table made");
}

#[test]
fn pgvector_query_eval_and_delete_work_on_the_table() {
    let Some(url) = pg_url("pgvector_query_eval_delete") else {
        return;
    };
    let tables = Tables::new(&url, "qed", &["papers"]);
    let name = tables.name(0);
    let t = TestDir::new();
    t.small_run("run", 60, 40, &[]);
    t.run(&upload_args(&url, name, &[]), 0);
    let target = ["--postgres", url.as_str(), "--collection", name];
    // query: the terms' top hits, each query complete.
    let mut args = vec![
        "query",
        "--run-dir",
        "run",
        "--top-k",
        "5",
        "--output",
        "q.parquet",
    ];
    args.extend(target);
    args.push("protein folding");
    let err = stderr(&t.run(&args, 0));
    assert!(err.contains("short results: none"), "{err}");
    // eval: recall against the exact search; the table has an HNSW index.
    let mut args = vec!["eval", "--run-dir", "run", "--sample", "20", "--json"];
    args.extend(target);
    let out = t.run(&args, 0);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(report["index"]["indexed_vectors"], 60);
    assert_eq!(report["index"]["exact_only"], false);
    let exact = &report["rows"][0];
    assert_eq!(exact["search"], "exact");
    assert_eq!(exact["recall"], 1.0);
    // eval side by side: the run's embedded collection (too small to be indexed: exact) and
    // the table, each at the least effort reaching the floor, unfiltered and filtered, with
    // pgvector's defaults beside them.
    let args = [
        "eval",
        "--run-dir",
        "run",
        "--sample",
        "20",
        "--json",
        "--compare-postgres",
        &url,
        "--compare-table",
        name,
    ];
    let out = t.run(&args, 0);
    let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = report["rows"].as_array().unwrap();
    assert_eq!(report["floor"], 0.95);
    assert!(rows.len() >= 6 && rows.len().is_multiple_of(3), "{report}");
    let filters: BTreeSet<&str> = rows.iter().map(|r| r["filter"].as_str().unwrap()).collect();
    assert!(
        filters.contains("none") && filters.len() >= 2,
        "{filters:?}"
    );
    for row in rows {
        match row["database"].as_str().unwrap() {
            "qdrant (embedded)" => {
                assert_eq!(row["index"], "none (exact search)");
                assert_eq!(row["recall"], 1.0);
            }
            "pgvector" => {
                assert!(row["index"].as_str().unwrap().starts_with("hnsw"), "{row}");
                assert!(row["tuning"].as_str().unwrap().starts_with("ef="), "{row}");
                assert_eq!(row["short_share"], 0.0, "iterative scans: {row}");
            }
            other => {
                assert!(other.starts_with("pgvector, defaults"), "{other}");
                assert_eq!(row["tuning"], "defaults");
            }
        }
    }
    assert!(t.join("run/eval/compare.md").is_file());
    t.run(&["report", "--run-dir", "run", "--html", "report.html"], 0);
    let page = std::fs::read_to_string(t.join("report.html")).unwrap();
    assert!(page.contains("id=\"compare\""), "the report shows it");
    // delete: exactly those rows, and tombstoned for later uploads.
    let ids: Vec<String> = tables.rows(0).keys().take(3).cloned().collect();
    let mut args = vec!["delete", "--run-dir", "run"];
    args.extend(target);
    args.extend(ids.iter().map(String::as_str));
    t.run(&args, 0);
    let rows = tables.rows(0);
    assert_eq!(rows.len(), 57);
    assert!(ids.iter().all(|id| !rows.contains_key(id)));
    let err = stderr(&t.run(&upload_args(&url, name, &[]), 0));
    assert!(err.contains(" 0 points sent"), "{err}");
    assert_eq!(tables.rows(0).len(), 57, "a deleted paper stays deleted");
}
