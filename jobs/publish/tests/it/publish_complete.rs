//! A complete run publishes: every row once and in order, files of the target size, a folder
//! `sha256sum -c` verifies, a card the Hub reads and a manifest that agrees with run.db.

use crate::publish_common::publish;
use crate::publish_common::*;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_publish::{staging_dir, PublishError, PublishOptions};
use std::path::Path;

const PARTS: &[&[u64]] = &[&[700, 300], &[500]];

fn options(run: &Path, out: &Path) -> PublishOptions {
    PublishOptions {
        // 400 rows a file: 1,500 rows make 4 files (400, 400, 400, 300).
        target_shard_bytes: 400 * ROW_BYTES,
        instruction: Some("Given a topic, retrieve relevant papers".into()),
        // The card writes the format the binary got from the run's model family.
        query_format: Some(embedfleet_publish::QueryFormat {
            family: "Tiny".into(),
            example: "Task: <query instruction>\nSearch:<query>".into(),
        }),
        commands: vec!["embedfleet run --corpus c.jsonl.gz --run-dir run".into()],
        report_table: Some("| batch | total_s |\n| 1 | 12.5 |".into()),
        eval_summary: Some("| ef | recall@10 |\n|---|---|\n| 64 | 0.987 |".into()),
        ..PublishOptions::new(run, out)
    }
}

#[test]
fn a_complete_run_publishes_every_row_in_files_of_the_target_size() {
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = (dir.path().join("run"), dir.path().join("ds"));
    let spec = Spec {
        parts: PARTS,
        dtype: VectorDtype::F32,
    };
    make_run(&run, &spec);
    let queries = dir.path().join("hits.parquet");
    write_query_results(&queries, 9);
    let mut opts = options(&run, &out);
    opts.query_results = vec![queries.clone()];

    let report = publish(&opts).unwrap();
    assert_eq!((report.rows, report.files, report.reused), (1500, 4, 0));
    assert!(!report.partial);
    assert!(!staging_dir(&out).exists(), "the staging folder is renamed");
    let names: Vec<String> = data_files(&out)
        .iter()
        .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
        .collect();
    assert_eq!(
        names,
        (0..4)
            .map(|i| format!("train-{i:05}-of-00004.parquet"))
            .collect::<Vec<_>>()
    );
    let per_file: Vec<u64> = data_files(&out)
        .iter()
        .map(|f| read_batches(f).iter().map(|b| b.num_rows() as u64).sum())
        .collect();
    assert_eq!(per_file, [400, 400, 400, 300]);

    let expected: Vec<String> = PARTS
        .iter()
        .enumerate()
        .flat_map(|(b, parts)| (0..parts.iter().sum::<u64>()).map(move |i| format!("b{b}p{i}")))
        .collect();
    let got: Vec<String> = rows(&out).into_iter().map(|r| r.0).collect();
    assert_eq!(got, expected, "the shards' rows, in batch and part order");
    assert_eq!(
        std::fs::read(out.join("queries/hits.parquet")).unwrap(),
        std::fs::read(&queries).unwrap(),
        "query results are copied as they are"
    );

    sha256sum_check(&out);
    sums_cover_every_file(&out);
    metadata_is_kept(&out);
    card_header_is_the_hubs(&card(&out), true);
    card_says_what_a_user_needs(&card(&out));
    manifest_agrees_with_run_db(&out, &run, report.bytes);
}

fn sums_cover_every_file(out: &Path) {
    let sums = std::fs::read_to_string(out.join("SHA256SUMS")).unwrap();
    let listed: Vec<&str> = sums
        .lines()
        .map(|l| {
            let (hex, path) = l.split_once("  ").unwrap();
            assert_eq!(hex.len(), 64, "{l}");
            path
        })
        .collect();
    let mut expected = vec!["README.md", "data/train-00000-of-00004.parquet"];
    expected.extend([
        "data/train-00001-of-00004.parquet",
        "data/train-00002-of-00004.parquet",
        "data/train-00003-of-00004.parquet",
        "manifest.json",
        "queries/hits.parquet",
    ]);
    assert_eq!(listed, expected, "every file but SHA256SUMS, sorted");
}

fn metadata_is_kept(out: &Path) {
    for file in data_files(out) {
        let (kv, schema) = kv_meta(&file);
        assert_eq!(kv["embedfleet.model"], "Qwen/Qwen3-Embedding-tiny");
        assert_eq!(kv["embedfleet.model_revision"], "rev-abc123");
        assert_eq!(kv["embedfleet.dim"], "16");
        assert_eq!(kv["embedfleet.normalized"], "true");
        assert!(
            !kv.contains_key("embedfleet.timings") && !schema.contains_key("embedfleet.timings"),
            "one shard's timings say nothing of the file"
        );
        assert_eq!(kv["embedfleet.model"], schema["embedfleet.model"]);
    }
}

/// The YAML header, line by line as the Hub reads it.
pub fn card_header_is_the_hubs(card: &str, with_queries: bool) {
    let mut lines = card.lines();
    assert_eq!(lines.next(), Some("---"), "{card}");
    let header: Vec<&str> = lines.by_ref().take_while(|l| *l != "---").collect();
    for line in &header {
        let top = !line.starts_with(' ') && !line.starts_with('-');
        assert!(
            !top || line.ends_with(':') || line.contains(": "),
            "a YAML mapping line: {line}"
        );
    }
    let text = header.join("\n") + "\n";
    for needle in [
        "license: odc-by\n",
        "task_categories:\n- feature-extraction\n",
        "tags:\n- embeddings\n",
        "size_categories:\n- 1K<n<10K\n",
        "configs:\n- config_name: default\n  data_files:\n  - split: train\n    path: data/*.parquet\n",
    ] {
        assert!(text.contains(needle), "the header has {needle:?}:\n{text}");
    }
    let queries =
        "- config_name: queries\n  data_files:\n  - split: train\n    path: queries/*.parquet\n";
    assert_eq!(text.contains(queries), with_queries, "{text}");
    assert!(lines.next().is_some(), "the card goes on after the header");
}

fn card_says_what_a_user_needs(card: &str) {
    for needle in [
        "`Qwen/Qwen3-Embedding-tiny`",
        "`rev-abc123`",
        "| pooling | last_token |",
        "| L2-normalised | true |",
        "| dimension | 16 |",
        "| stored as | float32 |",
        "| computed in | bf16 |",
        "Given a topic, retrieve relevant papers",
        "a query is embedded as `Task: <query instruction>\\nSearch:<query>` (Tiny's format)",
        "| embedfleet version | 9.9.9-test |",
        "| papers planned | 1500 |",
        "| papers embedded (rows) | 1500 |",
        "| papers quarantined | 3 |",
        "| quarantined: empty_text | 2 |",
        "| quarantined: invalid_json | 1 |",
        "| batches done | 2 |",
        "| papers missing | 0 |",
        "embedfleet run --corpus c.jsonl.gz --run-dir run",
        "```text\n| batch | total_s |\n| 1 | 12.5 |\n```",
        "| 64 | 0.987 |",
        "The `queries` config: 9 rows",
    ] {
        assert!(card.contains(needle), "the card has {needle:?}:\n{card}");
    }
    assert!(
        !card.contains("| `text` |"),
        "no text column without --with-text"
    );
}

fn manifest_agrees_with_run_db(out: &Path, run: &Path, bytes: u64) {
    let m = manifest(out);
    let status = RunDb::open(run).unwrap().status().unwrap();
    assert_eq!(m["format_version"], 1);
    assert_eq!(m["rows"], status.rows_in_shards);
    let counts = &m["counts"];
    assert_eq!(counts["papers_planned"], status.papers_planned);
    assert_eq!(counts["papers_embedded"], status.rows_in_shards);
    assert_eq!(counts["papers_quarantined"], status.papers_quarantined);
    assert_eq!(
        counts["quarantined_by_reason"],
        serde_json::to_value(&status.quarantined_by_reason).unwrap()
    );
    assert_eq!(counts["batches"], status.batches);
    assert_eq!(m["partial"], false);
    assert_eq!(m["missing_batches"], serde_json::json!([]));
    assert_eq!(m["vectors"]["dim"], 16);
    assert_eq!(m["vectors"]["dtype"], "float32");
    assert_eq!(m["model"]["model"], "Qwen/Qwen3-Embedding-tiny");
    let files = m["files"].as_array().unwrap();
    assert_eq!(files.len(), 5, "4 data files and the query results");
    let mut total = 0;
    for f in files {
        let path = out.join(f["path"].as_str().unwrap());
        let len = std::fs::metadata(&path).unwrap().len();
        assert_eq!(f["bytes"], len);
        let sha = embedfleet_core::shardfile::sha256_of(&path).unwrap();
        assert_eq!(f["sha256"], sha.as_str());
        total += len;
    }
    assert_eq!(files[0]["rows"], 400);
    assert_eq!(files[4]["rows"], 9);
    assert!(bytes > total, "the report counts the whole folder");
}

#[test]
fn float16_vectors_stay_float16() {
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = (dir.path().join("run"), dir.path().join("ds"));
    let spec = Spec {
        parts: &[&[50, 50]],
        dtype: VectorDtype::F16,
    };
    make_run(&run, &spec);
    let report = publish(&PublishOptions::new(&run, &out)).unwrap();
    assert_eq!(
        (report.rows, report.files),
        (100, 1),
        "500 MB hold them all"
    );
    let batch = &read_batches(&data_files(&out)[0])[0];
    let field = batch.schema().field_with_name("embedding").unwrap().clone();
    assert!(
        format!("{:?}", field.data_type()).contains("Float16"),
        "{field:?}"
    );
    assert_eq!(manifest(&out)["vectors"]["dtype"], "float16");
    assert!(card(&out).contains("| stored as | float16 |"));
    card_header_is_the_hubs_small(&card(&out));
    sha256sum_check(&out);
}

fn card_header_is_the_hubs_small(card: &str) {
    assert!(card.contains("size_categories:\n- n<1K\n"), "{card}");
    assert!(!card.contains("config_name: queries"), "{card}");
}

#[test]
fn publishing_again_replaces_our_folder_and_refuses_any_other() {
    let dir = tempfile::tempdir().unwrap();
    let (run, out) = (dir.path().join("run"), dir.path().join("ds"));
    make_run(
        &run,
        &Spec {
            parts: &[&[40]],
            dtype: VectorDtype::F32,
        },
    );
    let opts = PublishOptions::new(&run, &out);
    publish(&opts).unwrap();
    let first = std::fs::read(out.join("SHA256SUMS")).unwrap();
    publish(&opts).unwrap();
    assert_eq!(std::fs::read(out.join("SHA256SUMS")).unwrap(), first);
    sha256sum_check(&out);

    let foreign = dir.path().join("photos");
    std::fs::create_dir_all(&foreign).unwrap();
    std::fs::write(foreign.join("cat.jpg"), b"meow").unwrap();
    let e = publish(&PublishOptions::new(&run, &foreign)).unwrap_err();
    assert!(matches!(e, PublishError::OutExists(_)), "{e}");
    assert!(e.is_refusal());
    assert!(foreign.join("cat.jpg").exists(), "nothing of it is touched");

    let other_run = dir.path().join("other-run");
    make_run(
        &other_run,
        &Spec {
            parts: &[&[41]],
            dtype: VectorDtype::F32,
        },
    );
    let e = publish(&PublishOptions::new(&other_run, &out)).unwrap_err();
    assert!(matches!(e, PublishError::OutOfAnotherRun(_)), "{e}");
    assert!(e.to_string().contains("another run"), "{e}");
    assert_eq!(std::fs::read(out.join("SHA256SUMS")).unwrap(), first);
}
