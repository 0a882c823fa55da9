//! `delete` keeps papers deleted: tombstones in run.db (read back with Python's sqlite3), and
//! no `upload` afterwards — again, after a batch's shards are accepted again, into a collection
//! made again — brings them back; searches never return them, and `publish` leaves them out
//! (read back with pyarrow). A run's corpus cannot grow after planning, so "new batches" are a
//! batch accepted again and a whole collection sent again.

use crate::util::{python, shard_rows, TestDir};
use embedfleet_vectordb::{point_id, CountRequest, QdrantEdge, QueryRequest, SearchOptions, Sink};
use std::path::Path;

fn stderr(out: &std::process::Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn edge(run: &Path) -> QdrantEdge {
    QdrantEdge::open(run.join("qdrant")).unwrap()
}

/// Points in the run's `papers`, and how many of `papers` it holds.
fn holds(run: &Path, papers: &[String]) -> (u64, u64) {
    let sink = edge(run);
    let ids: Vec<_> = papers.iter().map(|p| point_id(p)).collect();
    (
        sink.count(CountRequest::new("papers")).unwrap(),
        sink.count(CountRequest::new("papers").ids(&ids)).unwrap(),
    )
}

/// Runs one SQL statement on run.db with Python's sqlite3 (a reader and writer that is not
/// embedfleet's; rusqlite where there is no python3) and returns its rows, one per line.
fn sqlite(run: &Path, sql: &str) -> String {
    let code = format!(
        "import sqlite3\nc = sqlite3.connect({:?})\nrows = list(c.execute({sql:?}))\nc.commit()\nprint('\\n'.join('|'.join(map(str, r)) for r in rows))",
        run.join("run.db").display().to_string()
    );
    if let Some(out) = python(&code, "sqlite3", "EMBEDFLEET_REQUIRE_PYARROW") {
        return out;
    }
    let conn = rusqlite::Connection::open(run.join("run.db")).unwrap();
    let mut stmt = conn.prepare(sql).unwrap();
    let rows = stmt
        .query_map([], |r| {
            let v: rusqlite::types::Value = r.get(0)?;
            Ok(match v {
                rusqlite::types::Value::Integer(i) => i.to_string(),
                rusqlite::types::Value::Text(t) => t,
                other => format!("{other:?}"),
            })
        })
        .unwrap()
        .map(Result::unwrap)
        .collect::<Vec<_>>();
    rows.join("\n")
}

#[test]
fn deleted_papers_stay_deleted_through_upload_again_a_batch_resent_and_a_collection_remade() {
    let t = TestDir::new();
    t.small_run("run", 300, 100, &[]);
    let run = t.join("run");
    let rows = shard_rows(&run);
    let good = rows.len() as u64;
    assert!(good > 250, "{good} papers embedded");
    // One paper of each of the three batches.
    let mut by_batch: Vec<String> = sqlite(
        &run,
        "SELECT min(p.id) FROM papers p JOIN shards s ON s.batch_id = p.batch_id \
         WHERE p.duplicate_of IS NULL GROUP BY p.batch_id ORDER BY p.batch_id",
    )
    .lines()
    .map(str::to_owned)
    .collect();
    by_batch.retain(|id| rows.contains_key(id));
    assert_eq!(by_batch.len(), 3, "{by_batch:?}");
    let deleted = by_batch;
    assert_eq!(holds(&run, &deleted), (good, 3));

    let mut args = vec!["delete", "--run-dir", "run"];
    args.extend(deleted.iter().map(String::as_str));
    let err = stderr(&t.run(&args, 0));
    assert!(err.contains("deleted 3 points"), "{err}");
    assert!(err.contains("3 papers newly tombstoned"), "{err}");
    assert_eq!(holds(&run, &deleted), (good - 3, 0));
    let mut tombstones: Vec<String> = sqlite(&run, "SELECT paper_id FROM tombstones")
        .lines()
        .map(str::to_owned)
        .collect();
    tombstones.sort();
    let mut want = deleted.clone();
    want.sort();
    assert_eq!(tombstones, want, "run.db's tombstones, read by sqlite3");

    // Upload again: the collection agrees with run.db, nothing is sent, nothing comes back.
    let err = stderr(&t.run(&["upload", "--run-dir", "run"], 0));
    assert!(err.contains(" 0 points sent"), "{err}");
    assert_eq!(holds(&run, &deleted), (good - 3, 0));

    // The second paper's batch accepted again (its upload progress gone): that batch alone is
    // sent again, less its deleted paper.
    sqlite(
        &run,
        &format!(
            "DELETE FROM uploads WHERE shard_id IN (SELECT id FROM shards WHERE batch_id = \
             (SELECT batch_id FROM tombstones WHERE paper_id = '{}'))",
            deleted[1]
        ),
    );
    let batch_rows: u64 = sqlite(
        &run,
        &format!(
            "SELECT sum(rows) FROM shards WHERE batch_id = \
             (SELECT batch_id FROM tombstones WHERE paper_id = '{}')",
            deleted[1]
        ),
    )
    .parse()
    .unwrap();
    let err = stderr(&t.run(&["upload", "--run-dir", "run"], 0));
    assert!(
        err.contains(&format!(" {} points sent", batch_rows - 1)),
        "that batch alone, less its deleted paper ({batch_rows} rows): {err}"
    );
    assert_eq!(holds(&run, &deleted), (good - 3, 0));

    // The collection dropped and made again empty: every good paper is sent, the deleted not.
    let sink = edge(&run);
    assert!(sink.delete_collection("papers").unwrap());
    drop(sink);
    let err = stderr(&t.run(&["upload", "--run-dir", "run"], 0));
    assert!(err.contains(&format!(" {} points sent", good - 3)), "{err}");
    assert_eq!(holds(&run, &deleted), (good - 3, 0));

    // Counted by qdrant-edge's own Python binding too, where it is installed
    // (`pip install qdrant-edge-py==0.7.2`, the engine version embedfleet links).
    let code = format!(
        "import qdrant_edge as q\ns = q.EdgeShard.load({:?})\nprint(s.count(q.CountRequest(exact=True)))\ns.close()",
        run.join("qdrant/collections/papers").display().to_string()
    );
    if let Some(out) = python(&code, "qdrant_edge", "EMBEDFLEET_REQUIRE_QDRANT_EDGE") {
        assert_eq!(out, (good - 3).to_string());
    }

    // Published without them: read back with pyarrow, counted in the manifest.
    t.run(&["publish", "--run-dir", "run", "--out", "ds"], 0);
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.join("ds/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["counts"]["papers_deleted"], 3, "{manifest}");
    assert_eq!(manifest["rows"], good - 3, "{manifest}");
    let code = format!(
        "import pyarrow.parquet as pq\nids = set(pq.read_table({:?}, columns=['id']).column('id').to_pylist())\nprint(len(ids), sum(p in ids for p in {:?}))",
        t.join("ds/data").display().to_string(),
        deleted
    );
    if let Some(out) = python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW") {
        assert_eq!(
            out,
            format!("{} 0", good - 3),
            "published ids, deleted among them"
        );
    }

    // A search with a deleted paper's own vector never finds it.
    let sink = edge(&run);
    for paper in &deleted {
        let options = SearchOptions {
            exact: true,
            ..SearchOptions::new(10)
        };
        let hits = sink
            .query(QueryRequest::one("papers", &rows[paper].0, options.clone()))
            .unwrap()
            .remove(0);
        assert_eq!(hits.len(), 10);
        assert!(
            hits.iter().all(|h| h.id != point_id(paper)),
            "{paper} found: {hits:?}"
        );
    }
}
