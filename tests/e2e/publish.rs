//! `publish` after `run`, `query` and `eval`, read back the way users read it: `sha256sum -c`,
//! pyarrow, and Hugging Face `datasets`; a partial run is refused unless `--allow-partial`.

use crate::util::{python, TestDir};
use std::path::Path;
use std::process::Command;

fn run_query_eval(t: &TestDir) {
    t.run_sample(60, 30);
    std::fs::write(t.join("terms.txt"), "protein folding\nsoil microbiome\n").unwrap();
    let query = [
        "query",
        "--run-dir",
        "run",
        "--terms",
        "terms.txt",
        "--output",
        "hits.parquet",
    ];
    t.run(&query, 0);
    t.run(
        &["eval", "--run-dir", "run", "--sample", "10", "--ef", "16"],
        0,
    );
}

#[test]
fn a_published_folder_verifies_and_loads_with_pyarrow_and_datasets() {
    let t = TestDir::new();
    run_query_eval(&t);
    let rows = t.status("run")["rows_in_shards"].as_u64().unwrap();
    assert!(rows > 50, "{rows}");
    t.run(&["publish", "--run-dir", "run", "--out", "ds"], 0);
    let ds = t.join("ds");
    let sums = Command::new("sha256sum")
        .args(["-c", "--quiet", "SHA256SUMS"])
        .current_dir(&ds)
        .output()
        .unwrap();
    assert!(
        sums.status.success(),
        "{}",
        String::from_utf8_lossy(&sums.stdout)
    );
    let card = std::fs::read_to_string(ds.join("README.md")).unwrap();
    assert!(card.starts_with("---\n"), "{card}");
    for needle in [
        "license: odc-by",
        "configs:",
        "data/",
        "queries",
        "recall@10",
    ] {
        assert!(card.contains(needle), "the card has {needle}:\n{card}");
    }
    assert!(card.contains(&rows.to_string()), "the card counts the rows");
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(ds.join("manifest.json")).unwrap()).unwrap();
    assert!(
        manifest.to_string().contains(&rows.to_string()),
        "{manifest}"
    );
    assert!(!t.join("ds.partial").exists(), "the staging folder is gone");
    let data = ds.join("data");
    let code = format!(
        "import pyarrow.parquet as pq; t = pq.read_table('{}'); print(t.num_rows, t.schema.field('embedding').type)",
        data.display()
    );
    if let Some(out) = python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW") {
        assert!(out.starts_with(&format!("{rows} ")), "{out}");
        assert!(out.contains("fixed_size_list"), "{out}");
    }
    let code = format!(
        "import datasets; d = datasets.load_dataset('parquet', data_dir='{}', split='train'); print(len(d), len(d[0]['embedding']))",
        data.display()
    );
    if let Some(out) = python(&code, "datasets", "EMBEDFLEET_REQUIRE_DATASETS") {
        assert!(out.starts_with(&format!("{rows} ")), "{out}");
    }
    queries_are_published(&ds);
}

fn queries_are_published(ds: &Path) {
    let files: Vec<_> = std::fs::read_dir(ds.join("queries")).unwrap().collect();
    assert_eq!(files.len(), 1, "the query results are in the folder");
}

#[test]
fn a_partial_run_is_refused_unless_allowed_and_then_says_what_is_missing() {
    let t = TestDir::new();
    t.run_sample(60, 30);
    let db = rusqlite::Connection::open(t.join("run/run.db")).unwrap();
    db.execute("UPDATE batches SET state = 'failed' WHERE id = 2", [])
        .unwrap();
    drop(db);
    let refused = t.run(&["publish", "--run-dir", "run", "--out", "ds"], 4);
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("--allow-partial"), "{stderr}");
    assert!(!t.join("ds").exists());
    let args = [
        "publish",
        "--run-dir",
        "run",
        "--out",
        "ds",
        "--allow-partial",
    ];
    t.run(&args, 3);
    let card = std::fs::read_to_string(t.join("ds/README.md")).unwrap();
    assert!(card.to_lowercase().contains("missing"), "{card}");
    assert!(card.contains('2'), "the card names batch 2:\n{card}");
}
