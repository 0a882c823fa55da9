//! A corpus that grows (`plan --update`): release 1 run to the end, then release 2 (papers
//! withdrawn, changed, new) planned into the same run, embedded and uploaded: only what the
//! release changed is embedded, and the collection ends up holding exactly release 2, the
//! changed papers with the vectors a fresh run of release 2 gives them. The `server_*` test
//! loads both releases in snapshot mode into a Qdrant server (the server suite of
//! `tests/e2e/snapshot.rs`).

use crate::util::{read_shard, TestDir};
use embedfleet_core::rundb::TEST_KILL_ENV;
use embedfleet_core::RunLayout;
use embedfleet_snapshot::ShardKeys;
use embedfleet_vectordb::{point_id, CountRequest, QdrantEdge, QueryRequest, SearchOptions, Sink};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::ExitStatusExt;
use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

const RELEASE_1: usize = 1000;
const WITHDRAWN: usize = 50;
const CHANGED: usize = 30;
const NEW: usize = 250;

/// A paper's line: a short text of words drawn from a seeded generator, so that papers differ
/// (and the test embeds 1,500 papers in seconds with the tiny model).
fn paper_line(id: &str, seed: u64) -> String {
    const WORDS: [&str; 16] = [
        "protein", "folding", "graph", "neural", "lattice", "quantum", "enzyme", "galaxy", "soil",
        "climate", "theorem", "sensor", "cell", "market", "language", "fluid",
    ];
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    let text: Vec<&str> = (0..40)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            WORDS[(x % 16) as usize]
        })
        .collect();
    format!(
        "{{\"id\":\"{id}\",\"text\":\"{}\",\"source\":\"s2orc\"}}\n",
        text.join(" ")
    )
}

/// The shape of a test's two releases.
pub(crate) struct Shape {
    pub release_1: usize,
    pub withdrawn: usize,
    pub changed: usize,
    pub new: usize,
}

/// The issue's shape: 1,000 papers, then 50 withdrawn, 30 changed and 250 new.
const ISSUE: Shape = Shape {
    release_1: RELEASE_1,
    withdrawn: WITHDRAWN,
    changed: CHANGED,
    new: NEW,
};

/// Release 1: `shape.release_1` papers. Release 2 made from release 1's lines: every 10th
/// paper of the first half withdrawn, every 10th from the 5th on given a revised text (the
/// second half untouched), and `shape.new` papers appended. Returns (withdrawn, changed, new)
/// ids.
pub(crate) fn make_releases(t: &TestDir, shape: &Shape) -> (Vec<String>, Vec<String>, Vec<String>) {
    let r1: String = (0..shape.release_1)
        .map(|i| paper_line(&format!("W{i:05}"), i as u64))
        .collect();
    std::fs::write(t.join("r1.jsonl"), &r1).unwrap();
    let (mut withdrawn, mut changed, mut new) = (Vec::new(), Vec::new(), Vec::new());
    let mut out = String::new();
    for (i, line) in r1.lines().enumerate() {
        let mut paper: serde_json::Value = serde_json::from_str(line).unwrap();
        let id = paper["id"].as_str().unwrap().to_owned();
        if i % 10 == 0 && withdrawn.len() < shape.withdrawn {
            withdrawn.push(id);
            continue;
        }
        if i % 10 == 5 && changed.len() < shape.changed {
            let text = paper["text"].as_str().unwrap().to_owned();
            paper["text"] = format!("{text} revised").into();
            changed.push(id);
        }
        out += &serde_json::to_string(&paper).unwrap();
        out.push('\n');
    }
    assert!(withdrawn.len() == shape.withdrawn && changed.len() == shape.changed);
    for i in 0..shape.new {
        let id = format!("N{i:05}");
        out += &paper_line(&id, 1_000_000 + i as u64);
        new.push(id);
    }
    std::fs::write(t.join("r2.jsonl"), out).unwrap();
    (withdrawn, changed, new)
}

/// Every (id, vector) of a run's shards, per batch.
fn vectors_by_batch(run: &Path) -> BTreeMap<i64, BTreeMap<String, Vec<f32>>> {
    let db = embedfleet_core::rundb::RunDb::open(run).unwrap();
    let mut out: BTreeMap<i64, BTreeMap<String, Vec<f32>>> = BTreeMap::new();
    for shard in db.all_shards().unwrap() {
        for r in read_shard(&run.join(&shard.path)) {
            out.entry(shard.batch_id.0)
                .or_default()
                .insert(r.id, r.vector);
        }
    }
    out
}

fn scalar(run: &Path, sql: &str) -> i64 {
    let db = embedfleet_core::rundb::RunDb::open(run).unwrap();
    let value = db.conn().query_row(sql, [], |r| r.get(0)).unwrap();
    value
}

fn cosine(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    dot / (norm(a) * norm(b))
}

#[test]
fn an_update_embeds_only_what_the_release_changed_and_the_collection_follows_it() {
    let t = TestDir::new();
    let (withdrawn, changed, new) = make_releases(&t, &ISSUE);
    t.run_corpus("run", "r1.jsonl", 250, &[]);
    let run = t.join("run");
    let release_1 = vectors_by_batch(&run);
    let ids_1: BTreeSet<String> = release_1.values().flat_map(|b| b.keys().cloned()).collect();
    assert_eq!(ids_1.len(), RELEASE_1, "release 1 embedded in full");
    // Version 1 of the dataset, in files of about 100 rows.
    let dim = release_1
        .values()
        .next()
        .unwrap()
        .values()
        .next()
        .unwrap()
        .len();
    let mb = format!("{}", 100.0 * (dim * 4 + 64) as f64 / 1e6);
    let publish = |run: &str, out: &str| {
        t.run(
            &[
                "publish",
                "--run-dir",
                run,
                "--out",
                out,
                "--target-shard-mb",
                &mb,
            ],
            0,
        );
    };
    publish("run", "v1");

    // The update is given no plan settings: it goes by the run's.
    let out = t.run(&["plan", "--update", "r2.jsonl", "--run-dir", "run"], 0);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains(
            "release 2: 250 added, 30 changed, 50 withdrawn, 920 unchanged: 280 papers to embed"
        ),
        "{said}"
    );
    // `run` of release 2's corpus: planned already, it embeds the new batches and uploads.
    t.run_corpus("run", "r2.jsonl", 250, &[]);

    let embedded_in_update = scalar(
        &run,
        "SELECT sum(r.papers) FROM batch_runs r JOIN batches b ON b.id = r.batch_id
         JOIN corpus_files f ON f.id = b.file_id WHERE f.release = 2 AND r.state = 'done'",
    );
    assert_eq!(
        embedded_in_update,
        (CHANGED + NEW) as i64,
        "only the changed and new papers"
    );
    let release_2_runs = scalar(
        &run,
        "SELECT count(*) FROM batch_runs r JOIN batches b ON b.id = r.batch_id
         JOIN corpus_files f ON f.id = b.file_id WHERE f.release = 1 AND r.started_at > (SELECT started_at FROM releases WHERE id = 2)",
    );
    assert_eq!(release_2_runs, 0, "no batch of release 1 embedded again");

    // `status` and `report` show the releases and what each cost.
    let status = t.status("run");
    let releases = status["releases"].as_array().unwrap();
    assert_eq!(releases.len(), 2);
    let r2 = &releases[1];
    assert_eq!(
        (
            r2["added"].as_u64(),
            r2["changed"].as_u64(),
            r2["withdrawn"].as_u64(),
            r2["unchanged"].as_u64()
        ),
        (Some(250), Some(30), Some(50), Some(920))
    );
    assert_eq!(r2["papers_embedded"].as_u64(), Some(280));
    assert_eq!(
        releases[0]["papers_embedded"].as_u64(),
        Some(RELEASE_1 as u64)
    );
    assert!(r2["embed_node_hours"].as_f64().unwrap() > 0.0);
    let human =
        String::from_utf8_lossy(&t.run(&["status", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(human.contains("release 2   250 added, 30 changed, 50 withdrawn, 920 unchanged; 2/2 batches embedded, 280 papers"), "{human}");
    let report =
        String::from_utf8_lossy(&t.run(&["report", "--run-dir", "run"], 0).stdout).into_owned();
    assert!(
        report.contains("release 1   1000 papers; 4/4 batches embedded"),
        "{report}"
    );
    // The live papers of release 2, and the rows it withheld apart, everywhere.
    let live = (RELEASE_1 - WITHDRAWN + NEW) as u64;
    assert_eq!(status["papers_live"].as_u64(), Some(live));
    assert_eq!(
        status["rows_withheld"],
        serde_json::json!({"superseded": CHANGED, "withdrawn": WITHDRAWN})
    );
    assert!(
        human.contains(&format!(
            "papers     {live} live in release 2, of 1280 rows planned (80 withheld: 30 superseded, 50 withdrawn)"
        )),
        "{human}"
    );
    assert!(
        report.contains(&format!(
            "live: {live} papers; 80 rows withheld (30 superseded, 50 withdrawn)"
        )),
        "{report}"
    );
    let report_json: serde_json::Value =
        serde_json::from_slice(&t.run(&["report", "--run-dir", "run", "--json"], 0).stdout)
            .unwrap();
    assert_eq!(report_json["papers_live"].as_u64(), Some(live));
    assert_eq!(report_json["rows_withheld"]["withdrawn"].as_u64(), Some(50));

    // A fresh run of release 2, for the vectors its papers should have.
    t.run_corpus("fresh", "r2.jsonl", 250, &[]);
    publish("run", "v2");
    publish("fresh", "fresh-ds");
    check_version_2(&t, &withdrawn, &changed);
    let fresh: BTreeMap<String, Vec<f32>> = vectors_by_batch(&t.join("fresh"))
        .into_values()
        .flatten()
        .collect();
    let expected: BTreeSet<String> = ids_1
        .iter()
        .filter(|id| !withdrawn.contains(id))
        .cloned()
        .chain(new.iter().cloned())
        .collect();
    assert_eq!(fresh.keys().cloned().collect::<BTreeSet<_>>(), expected);

    let edge = QdrantEdge::open(run.join("qdrant")).unwrap();
    let ids = |list: &[String]| list.iter().map(|p| point_id(p)).collect::<Vec<_>>();
    let all: Vec<String> = expected.iter().cloned().collect();
    assert_eq!(
        edge.count(CountRequest::new("papers")).unwrap(),
        expected.len() as u64
    );
    assert_eq!(
        edge.count(CountRequest::new("papers").ids(&ids(&all)))
            .unwrap(),
        1200
    );
    assert_eq!(
        edge.count(CountRequest::new("papers").ids(&ids(&withdrawn)))
            .unwrap(),
        0
    );
    // A changed paper's point is its new text's vector: an exact search with the fresh run's
    // vector finds it first, at a score of 1.
    let exact = SearchOptions {
        exact: true,
        ..SearchOptions::new(10)
    };
    let old: BTreeMap<&String, &Vec<f32>> = release_1.values().flatten().collect();
    for id in &changed {
        let hits = edge
            .query(QueryRequest::one("papers", &fresh[id], exact.clone()))
            .unwrap()
            .remove(0);
        assert_eq!(hits[0].paper_id.as_deref(), Some(id.as_str()));
        assert!(hits[0].score > 0.9999, "{id}: {}", hits[0].score);
        assert!(
            cosine(&fresh[id], old[id]) < 0.9999,
            "{id}'s text changed its vector"
        );
    }
    // A withdrawn paper is never returned, even for its own vector.
    for id in &withdrawn {
        let hits = edge
            .query(QueryRequest::one("papers", old[id], exact.clone()))
            .unwrap()
            .remove(0);
        assert!(
            hits.iter()
                .all(|h| h.paper_id.as_deref() != Some(id.as_str())),
            "{id}"
        );
    }
    // Unchanged papers keep release 1's vectors, which a fresh run gives as well.
    for id in expected
        .iter()
        .filter(|id| !changed.contains(id) && !new.contains(id))
        .take(50)
    {
        assert!(cosine(&fresh[id], old[id]) > 0.9999, "{id}");
    }
}

/// The data files of a published folder: name -> rows (id, vector).
fn data_files(dir: &Path) -> BTreeMap<String, Vec<(String, Vec<f32>)>> {
    std::fs::read_dir(dir.join("data"))
        .unwrap()
        .map(|e| {
            let path = e.unwrap().path();
            let rows = read_shard(&path)
                .into_iter()
                .map(|r| (r.id, r.vector))
                .collect();
            (
                path.file_name().unwrap().to_string_lossy().into_owned(),
                rows,
            )
        })
        .collect()
}

/// Version 2 holds what a fresh run of release 2 publishes, by ids and vectors; every file of
/// version 1 with none of the withdrawn or changed papers is byte-identical in version 2; the
/// manifest and card carry the changelog, and SHA256SUMS covers the new files.
fn check_version_2(t: &TestDir, withdrawn: &[String], changed: &[String]) {
    let (v1, v2, fresh) = (t.join("v1"), t.join("v2"), t.join("fresh-ds"));
    let rows = |files: &BTreeMap<String, Vec<(String, Vec<f32>)>>| -> BTreeMap<String, Vec<f32>> {
        let mut out = BTreeMap::new();
        for (id, v) in files.values().flatten() {
            assert!(out.insert(id.clone(), v.clone()).is_none(), "{id} twice");
        }
        out
    };
    let (files_1, files_2) = (data_files(&v1), data_files(&v2));
    let (got, want) = (rows(&files_2), rows(&data_files(&fresh)));
    assert_eq!(
        got.keys().collect::<Vec<_>>(),
        want.keys().collect::<Vec<_>>()
    );
    for (id, v) in &got {
        assert!(
            cosine(v, &want[id]) > 0.9999,
            "{id}: not the vector of its release-2 text"
        );
    }
    let touched: BTreeSet<&String> = withdrawn.iter().chain(changed).collect();
    let mut same = 0;
    for (name, rows_1) in &files_1 {
        let untouched = rows_1.iter().all(|(id, _)| !touched.contains(id));
        let bytes = |dir: &Path| std::fs::read(dir.join("data").join(name)).ok();
        if untouched {
            assert_eq!(
                bytes(&v1),
                bytes(&v2),
                "{name} holds no changed paper: byte-identical"
            );
            same += 1;
        } else {
            assert_ne!(bytes(&v1), bytes(&v2), "{name} lost or replaced papers");
        }
    }
    assert!(same >= 4, "{same} files of version 1 untouched");
    assert!(
        files_2.keys().any(|n| n.starts_with("train-r0002-")),
        "{:?}",
        files_2.keys()
    );
    let manifest: serde_json::Value =
        serde_json::from_slice(&std::fs::read(v2.join("manifest.json")).unwrap()).unwrap();
    assert_eq!(manifest["version"], 2);
    let r2 = &manifest["releases"][1];
    assert_eq!(
        (&r2["added"], &r2["changed"], &r2["withdrawn"]),
        (
            &serde_json::json!(250),
            &serde_json::json!(30),
            &serde_json::json!(50)
        )
    );
    assert!(r2["command"].as_str().unwrap().contains("--update"), "{r2}");
    let card = std::fs::read_to_string(v2.join("README.md")).unwrap();
    assert!(
        card.contains("## Releases") && card.contains("| 2 | 250 | 30 | 50 | 920 |"),
        "{card}"
    );
    let sums = std::fs::read_to_string(v2.join("SHA256SUMS")).unwrap();
    for name in files_2.keys() {
        let line = sums
            .lines()
            .find(|l| l.ends_with(&format!("data/{name}")))
            .unwrap();
        let digest = embedfleet_core::shardfile::sha256_of(&v2.join("data").join(name)).unwrap();
        assert!(line.starts_with(&digest), "{line}");
    }
}

/// Each live paper of a run with the vector of its newest copy (a later batch replaces an
/// earlier one's), less `withdrawn`.
pub(crate) fn live_vectors(run: &Path, withdrawn: &[String]) -> BTreeMap<String, Vec<f32>> {
    let mut out = BTreeMap::new();
    for batch in vectors_by_batch(run).into_values() {
        out.extend(batch);
    }
    out.retain(|id, _| !withdrawn.contains(id));
    out
}

/// Spawns `embedfleet ARGS` and SIGKILLs it `after` (when it has not ended by then); true when
/// it was killed.
fn kill_after(t: &TestDir, args: &[&str], env: &[(&str, &str)], after: Duration) -> bool {
    let mut child = t
        .cmd(args)
        .envs(env.iter().copied())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + after;
    while Instant::now() < deadline {
        if child.try_wait().unwrap().is_some() {
            return false;
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap();
    child.wait().unwrap();
    true
}

#[test]
fn an_update_killed_at_seeded_moments_in_each_stage_ends_exact() {
    let t = TestDir::new();
    let shape = Shape {
        release_1: 300,
        withdrawn: 15,
        changed: 9,
        new: 75,
    };
    let (withdrawn, changed, new) = make_releases(&t, &shape);
    t.run_corpus("run", "r1.jsonl", 100, &[]);
    let run = t.join("run");
    let publish = [
        "publish",
        "--run-dir",
        "run",
        "--out",
        "ds",
        "--target-shard-mb",
        "0.01",
    ];
    t.run(&publish, 0);

    // Plan: killed inside the transaction that settles the release, then again.
    let update = ["plan", "--update", "r2.jsonl", "--run-dir", "run"];
    let killed = t
        .cmd(&update)
        .env(TEST_KILL_ENV, "resolve_duplicates")
        .output()
        .unwrap();
    assert_eq!(killed.status.signal(), Some(libc::SIGKILL));
    let out = t.run(&update, 0);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("75 added, 9 changed, 15 withdrawn, 276 unchanged"),
        "{said}"
    );

    // Embed and upload (`run`), then publish: each killed at named points that are reached
    // whatever the machine's speed (a result being taken in, just taken in, upserted points
    // durable before run.db knows, a data file finished before the folder), then at seeded
    // moments, and run again to the end.
    let mut rng = 0x5eed_2024_u64;
    let mut next_delay = |base_ms: u64, spread_ms: u64| {
        rng = rng
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        Duration::from_millis(base_ms + (rng >> 33) % spread_ms)
    };
    let run_args = [
        "run",
        "--corpus",
        "r2.jsonl",
        "--run-dir",
        "run",
        "--papers-per-job",
        "100",
        "--local-jobs",
        "2",
        "--shard-papers",
        "15",
    ];
    let killed_at = |args: &[&str], point: &str| {
        let out = t.cmd(args).env(TEST_KILL_ENV, point).output().unwrap();
        assert_eq!(
            out.status.signal(),
            Some(libc::SIGKILL),
            "{args:?} was not killed at {point}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    for point in ["ingest", "accepted", "upload_checkpoint"] {
        killed_at(&run_args, point);
    }
    kill_after(&t, &run_args, &[], next_delay(50, 400));
    t.run(&run_args, 0);
    killed_at(&publish, "publish_file");
    for _ in 0..2 {
        kill_after(&t, &publish, &[], next_delay(20, 300));
    }
    t.run(&publish, 0);

    // Exactly release 2, embedded once: the collection, and the published folder.
    let embedded_in_update = scalar(
        &run,
        "SELECT count(*) FROM papers p JOIN batches b ON b.id = p.batch_id
         JOIN corpus_files f ON f.id = b.file_id WHERE f.release = 2 AND p.duplicate_of IS NULL",
    );
    assert_eq!(embedded_in_update, (shape.changed + shape.new) as i64);
    let live = live_vectors(&run, &withdrawn);
    assert_eq!(live.len(), shape.release_1 - shape.withdrawn + shape.new);
    let edge = QdrantEdge::open(run.join("qdrant")).unwrap();
    assert_eq!(
        edge.count(CountRequest::new("papers")).unwrap(),
        live.len() as u64
    );
    let ids: Vec<_> = withdrawn.iter().map(|p| point_id(p)).collect();
    assert_eq!(
        edge.count(CountRequest::new("papers").ids(&ids)).unwrap(),
        0
    );
    let exact = SearchOptions {
        exact: true,
        ..SearchOptions::new(1)
    };
    for id in changed.iter().chain(&new) {
        let hits = edge
            .query(QueryRequest::one("papers", &live[id], exact.clone()))
            .unwrap()
            .remove(0);
        assert_eq!(hits[0].paper_id.as_deref(), Some(id.as_str()));
        assert!(hits[0].score > 0.9999, "{id}: {}", hits[0].score);
    }
    let mut published = BTreeMap::new();
    for rows in data_files(&t.join("ds")).into_values() {
        for (id, v) in rows {
            assert!(published.insert(id.clone(), v).is_none(), "{id} twice");
        }
    }
    assert_eq!(
        published, live,
        "the folder holds each live paper's newest vector"
    );
}

/// The built shards' manifests of the group starting at batch `first`.
fn builds_of_group(run: &Path, first: i64) -> usize {
    let prefix = format!("b{first:06}-");
    std::fs::read_dir(run.join("snapshots"))
        .unwrap()
        .filter_map(|e| e.unwrap().file_name().into_string().ok())
        .filter(|n| n.starts_with(&prefix) && n.ends_with(".json"))
        .count()
}

#[test]
fn server_an_update_loaded_in_snapshot_mode_keeps_old_groups_and_deletes_what_the_release_withheld()
{
    let Some((url, rest, sink, name)) = crate::snapshot_server::server("update") else {
        return;
    };
    let t = TestDir::new();
    let (withdrawn, changed, new) = make_releases(&t, &ISSUE);
    t.run_corpus("run", "r1.jsonl", 250, &[]);
    let run = t.join("run");
    let load = |groups: &[&str]| -> String {
        let mut args = vec![
            "upload",
            "--run-dir",
            "run",
            "--qdrant",
            &url,
            "--qdrant-rest",
            &rest,
            "--collection",
            &name,
            "--mode",
            "snapshot",
        ];
        args.extend_from_slice(groups);
        String::from_utf8_lossy(&t.run(&args, 0).stderr).into_owned()
    };
    // Release 1: batches 1-4 in two groups of two.
    let err = load(&["--group-count", "2"]);
    assert!(err.contains("4 batches in 2 groups of 2"), "{err}");
    assert_eq!(
        sink.count(CountRequest::new(&name)).unwrap(),
        RELEASE_1 as u64
    );
    assert_eq!((builds_of_group(&run, 1), builds_of_group(&run, 3)), (1, 1));

    // Release 2: the withdrawn and changed papers are rows of batches 1 and 2 (group 1); the
    // changed and new ones are embedded into batches 5 and 6 (group 3).
    t.run(&["plan", "--update", "r2.jsonl", "--run-dir", "run"], 0);
    t.run_corpus("run", "r2.jsonl", 250, &[]);
    let err = load(&[]);
    assert!(
        err.contains("6 batches in 3 groups of 2")
            && err.contains("1 recovered now")
            && err.contains("2 loaded before")
            && err.contains("1 built here")
            && err.contains(&format!("less {} rows deleted by id", WITHDRAWN + CHANGED)),
        "{err}"
    );
    // Groups 1 and 2 were not built again: their release-1 shards serve, less the rows the
    // release withheld.
    assert_eq!((builds_of_group(&run, 1), builds_of_group(&run, 3)), (1, 1));
    let keys = ShardKeys::pinned(&RunLayout::new(&run)).unwrap().unwrap();
    assert_eq!(
        sink.count(CountRequest::new(&name).shard_key(Some(&keys.key_of_group(1))))
            .unwrap(),
        (500 - WITHDRAWN - CHANGED) as u64
    );
    assert_eq!(
        sink.count(CountRequest::new(&name).shard_key(Some(&keys.key_of_group(2))))
            .unwrap(),
        500
    );
    assert_eq!(
        sink.count(CountRequest::new(&name).shard_key(Some(&keys.key_of_group(3))))
            .unwrap(),
        (CHANGED + NEW) as u64
    );

    // Exactly release 2: every live paper once, with its newest vector; no withdrawn one.
    let live = live_vectors(&run, &withdrawn);
    assert_eq!(live.len(), RELEASE_1 - WITHDRAWN + NEW);
    assert_eq!(
        sink.count(CountRequest::new(&name)).unwrap(),
        live.len() as u64
    );
    let ids = |list: &[String]| list.iter().map(|p| point_id(p)).collect::<Vec<_>>();
    assert_eq!(
        sink.count(CountRequest::new(&name).ids(&ids(&withdrawn)))
            .unwrap(),
        0
    );
    let all: Vec<String> = live.keys().cloned().collect();
    assert_eq!(
        sink.count(CountRequest::new(&name).ids(&ids(&all)))
            .unwrap(),
        live.len() as u64
    );
    let exact = SearchOptions {
        exact: true,
        ..SearchOptions::new(1)
    };
    for id in changed.iter().chain(new.iter().take(20)) {
        let hits = sink
            .query(QueryRequest::one(&name, &live[id], exact.clone()))
            .unwrap()
            .remove(0);
        assert_eq!(hits[0].paper_id.as_deref(), Some(id.as_str()));
        assert!(hits[0].score > 0.9999, "{id}: {}", hits[0].score);
    }

    // A delete afterwards (a paper of group 2): the next load builds and recovers nothing.
    let gone = live
        .keys()
        .find(|id| !changed.contains(id) && !new.contains(id) && id.as_str() >= "W00500")
        .unwrap()
        .clone();
    t.run(
        &[
            "delete",
            "--run-dir",
            "run",
            "--qdrant",
            &url,
            "--collection",
            &name,
            &gone,
        ],
        0,
    );
    let err = load(&[]);
    assert!(
        err.contains("0 recovered now") && !err.contains("built here"),
        "{err}"
    );
    assert_eq!(
        sink.count(CountRequest::new(&name)).unwrap(),
        live.len() as u64 - 1
    );
    assert_eq!(
        sink.count(CountRequest::new(&name).ids(&ids(&[gone])))
            .unwrap(),
        0
    );
    sink.delete_collection(&name).unwrap();
}
