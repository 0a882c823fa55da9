//! A corpus release that changes papers' metadata but not their text (peS2o stamps every paper
//! of a release with its `version` and `added`; a correction may change `created` or `source`):
//! nothing is embedded again, but the collection's payload (`year`, `source`) and the published
//! dataset follow the release, as a fresh run of it would have them. A second target uploaded
//! after the releases gets the same values, and a third release that moves a year back, or
//! stamps only, leaves every point as the corpus says.

use crate::util::TestDir;
use arrow_array::{Array, StringArray};
use embedfleet_vectordb::{
    parse_year, point_id, CountRequest, QdrantEdge, QueryRequest, SearchOptions, Sink,
};
use serde_json::json;
use std::collections::BTreeMap;
use std::path::Path;

const PAPERS: usize = 60;

/// The metadata a test release gives one paper: (source, created, added, version).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Meta {
    source: Option<String>,
    created: Option<String>,
    added: Option<String>,
    version: Option<String>,
}

/// A release: id -> (text, metadata), written as JSON lines in id order.
type Release = BTreeMap<String, (String, Meta)>;

fn write_release(t: &TestDir, name: &str, release: &Release) {
    let mut out = String::new();
    for (id, (text, m)) in release {
        let mut paper = json!({"id": id, "text": text});
        for (key, value) in [
            ("source", &m.source),
            ("created", &m.created),
            ("added", &m.added),
            ("version", &m.version),
        ] {
            if let Some(v) = value {
                paper[key] = json!(v);
            }
        }
        out += &paper.to_string();
        out.push('\n');
    }
    std::fs::write(t.join(name), out).unwrap();
}

fn text(i: usize) -> String {
    const WORDS: [&str; 8] = [
        "protein", "lattice", "quantum", "galaxy", "soil", "theorem", "sensor", "fluid",
    ];
    (0..30)
        .map(|k| WORDS[(i * 7 + k * k + k * i) % 8])
        .collect::<Vec<_>>()
        .join(" ")
        + &format!(" paper {i}")
}

fn meta(source: &str, created: Option<&str>, added: &str, version: &str) -> Meta {
    Meta {
        source: Some(source.into()),
        created: created.map(Into::into),
        added: Some(added.into()),
        version: Some(version.into()),
    }
}

/// Every row of a published folder's data files: id -> metadata.
fn published(dir: &Path) -> BTreeMap<String, Meta> {
    let mut out = BTreeMap::new();
    for entry in std::fs::read_dir(dir.join("data")).unwrap() {
        let path = entry.unwrap().path();
        let file = std::fs::File::open(&path).unwrap();
        let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(file)
            .unwrap()
            .build()
            .unwrap();
        for batch in reader {
            let batch = batch.unwrap();
            let column = |name: &str| {
                batch
                    .column_by_name(name)
                    .unwrap()
                    .as_any()
                    .downcast_ref::<StringArray>()
                    .unwrap()
                    .clone()
            };
            let [ids, source, created, added, version] =
                ["id", "source", "created", "added", "version"].map(column);
            let at = |a: &StringArray, i: usize| (!a.is_null(i)).then(|| a.value(i).to_owned());
            for i in 0..batch.num_rows() {
                let previous = out.insert(
                    ids.value(i).to_owned(),
                    Meta {
                        source: at(&source, i),
                        created: at(&created, i),
                        added: at(&added, i),
                        version: at(&version, i),
                    },
                );
                assert!(previous.is_none(), "{} published twice", ids.value(i));
            }
        }
    }
    out
}

/// Checks every point of the edge collection at `dir` against `release`.
fn check_collection(dir: &Path, release: &Release) {
    let edge = QdrantEdge::open(dir).unwrap();
    check_points(&edge, "papers", release, &dir.display().to_string());
}

/// Checks every point of `collection` against `release`: the set of ids, and each point's
/// `year` and `source` payload.
fn check_points(sink: &dyn Sink, collection: &str, release: &Release, what: &str) {
    assert_eq!(
        sink.count(CountRequest::new(collection)).unwrap(),
        release.len() as u64,
        "{what}"
    );
    // Every point, with its payload: an exact search with k above the count.
    let dim = sink
        .collection_info(collection)
        .unwrap()
        .unwrap()
        .vector_size;
    let probe = vec![1.0f32; dim];
    let every = SearchOptions {
        exact: true,
        ..SearchOptions::new(10 * release.len())
    };
    let hits = sink
        .query(QueryRequest::one(collection, &probe, every))
        .unwrap()
        .remove(0);
    assert_eq!(hits.len(), release.len());
    for hit in hits {
        let id = hit.paper_id.clone().unwrap();
        let (_, m) = &release[&id];
        assert_eq!(hit.id, point_id(&id));
        assert_eq!(
            (hit.year, hit.source.as_deref()),
            (
                m.created.as_deref().and_then(parse_year),
                m.source.as_deref()
            ),
            "{id} in {what}"
        );
    }
}

fn papers_embedded_in(run: &Path, release: i64) -> i64 {
    let db = embedfleet_core::rundb::RunDb::open(run).unwrap();
    let value = db
        .conn()
        .query_row(
            "SELECT coalesce(sum(r.papers), 0) FROM batch_runs r JOIN batches b ON b.id = r.batch_id
             JOIN corpus_files f ON f.id = b.file_id WHERE f.release = ?1 AND r.state = 'done'",
            [release],
            |r| r.get(0),
        )
        .unwrap();
    value
}

/// Release 1: `PAPERS` papers, all `s2orc`, created 2019, stamped v2.
fn release_1() -> Release {
    (0..PAPERS)
        .map(|i| {
            (
                format!("M{i:03}"),
                (
                    text(i),
                    meta("s2orc", Some("2019-05-02"), "2023-01-03", "v2"),
                ),
            )
        })
        .collect()
}

/// Release 2 stamps every paper v3; 10 get another year, 5 another source, one loses its
/// `created`, one gets another date of the same year; one is withdrawn, one changes its text,
/// two are new.
fn release_2(r1: &Release) -> Release {
    let mut r2 = r1.clone();
    for (i, (_, m)) in r2.values_mut().enumerate() {
        m.version = Some("v3".into());
        m.added = Some("2024-02-01".into());
        match i {
            0..10 => m.created = Some("2021-03-04T00:00:00Z".into()),
            10..15 => m.source = Some("s2ag".into()),
            15 => m.created = None,
            16 => m.created = Some("2019-12-31".into()), // another date, the same year
            _ => {}
        }
    }
    r2.remove("M020");
    r2.get_mut("M021").unwrap().0 += " revised";
    for i in 0..2 {
        r2.insert(
            format!("N{i:03}"),
            (
                text(100 + i),
                meta("s2ag", Some("2024-01-01"), "2024-02-01", "v3"),
            ),
        );
    }
    r2
}

#[test]
fn metadata_a_release_changes_without_the_text_follows_it_into_the_collection_and_the_dataset() {
    let t = TestDir::new();
    let r1 = release_1();
    write_release(&t, "r1.jsonl", &r1);
    t.run_corpus("run", "r1.jsonl", 25, &[]);
    let run = t.join("run");
    check_collection(&run.join("qdrant"), &r1);

    let r2 = release_2(&r1);
    write_release(&t, "r2.jsonl", &r2);
    let out = t.run(&["plan", "--update", "r2.jsonl", "--run-dir", "run"], 0);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("release 2: 2 added, 1 changed, 1 withdrawn, 58 unchanged (58 with new metadata): 3 papers to embed"),
        "{said}"
    );
    t.run_corpus("run", "r2.jsonl", 25, &[]);
    assert_eq!(
        papers_embedded_in(&run, 2),
        3,
        "only the changed and new papers"
    );
    check_collection(&run.join("qdrant"), &r2);

    // The counts, in status and its JSON.
    let status = t.status("run");
    assert_eq!(status["releases"][1]["restamped"].as_u64(), Some(58));
    let human =
        String::from_utf8_lossy(&t.run(&["status", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(
        human.contains(
            "release 2   2 added, 1 changed, 1 withdrawn, 58 unchanged (58 with new metadata)"
        ),
        "{human}"
    );

    // The published dataset carries release 2's metadata for every paper, as the corpus has it.
    t.run(&["publish", "--run-dir", "run", "--out", "v2"], 0);
    let expected = |r: &Release| -> BTreeMap<String, Meta> {
        r.iter()
            .map(|(id, (_, m))| (id.clone(), m.clone()))
            .collect()
    };
    assert_eq!(published(&t.join("v2")), expected(&r2));
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(t.join("v2/manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["releases"][1]["restamped"], 58);

    // Planning release 2 again changes nothing.
    let again = t.run(&["plan", "--update", "r2.jsonl", "--run-dir", "run"], 0);
    assert!(
        String::from_utf8_lossy(&again.stderr).contains("release 2 already planned"),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );

    // Release 3: paper 0's year back to 2019, every paper stamped v4. Paper 1 keeps release 2's
    // 2021, which its point must keep although release 3 changed no payload of it.
    let mut r3 = r2.clone();
    for m in r3.values_mut().map(|(_, m)| m) {
        m.version = Some("v4".into());
    }
    r3.get_mut("M000").unwrap().1.created = Some("2019-05-02".into());
    write_release(&t, "r3.jsonl", &r3);
    let out = t.run(&["plan", "--update", "r3.jsonl", "--run-dir", "run"], 0);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("release 3: 0 added, 0 changed, 0 withdrawn, 61 unchanged (61 with new metadata): 0 papers to embed"),
        "{said}"
    );
    t.run_corpus("run", "r3.jsonl", 25, &[]);
    assert_eq!(papers_embedded_in(&run, 3), 0);
    check_collection(&run.join("qdrant"), &r3);
    t.run(&["publish", "--run-dir", "run", "--out", "v3"], 0);
    assert_eq!(published(&t.join("v3")), expected(&r3));

    // A second target, uploaded for the first time after the releases: every point from its
    // shard, then the releases' values.
    t.run(
        &[
            "upload",
            "--run-dir",
            "run",
            "--edge",
            t.join("second").to_str().unwrap(),
        ],
        0,
    );
    check_collection(&t.join("second"), &r3);
}

#[test]
fn server_metadata_a_release_changes_follows_into_an_upserted_and_a_snapshot_loaded_collection() {
    let Some((url, rest, upserted, name)) = crate::snapshot_server::server("restamp-upsert") else {
        return;
    };
    let Some((_, _, loaded, snap)) = crate::snapshot_server::server("restamp-snapshot") else {
        return;
    };
    let t = TestDir::new();
    let r1 = release_1();
    write_release(&t, "r1.jsonl", &r1);
    t.run_corpus("run", "r1.jsonl", 25, &[]);
    let upload = |collection: &str, snapshot: bool| {
        let mut args = vec![
            "upload",
            "--run-dir",
            "run",
            "--qdrant",
            &url,
            "--collection",
            collection,
        ];
        if snapshot {
            args.extend_from_slice(&["--qdrant-rest", &rest, "--mode", "snapshot"]);
            args.extend_from_slice(&["--group-count", "2"]);
        }
        t.run(&args, 0);
    };
    upload(&name, false);
    upload(&snap, true);
    check_points(&upserted, &name, &r1, "the upserted collection");
    check_points(&loaded, &snap, &r1, "the loaded collection");

    let r2 = release_2(&r1);
    write_release(&t, "r2.jsonl", &r2);
    t.run(&["plan", "--update", "r2.jsonl", "--run-dir", "run"], 0);
    t.run_corpus("run", "r2.jsonl", 25, &[]);
    upload(&name, false);
    // The last group (batches of release 1 and 2) is built again from its shards: its kept
    // papers' older values come back with it, and are set again after the load.
    upload(&snap, true);
    check_points(&upserted, &name, &r2, "the upserted collection");
    check_points(&loaded, &snap, &r2, "the loaded collection");
    for collection in [&name, &snap] {
        upserted.delete_collection(collection).unwrap();
    }
}
