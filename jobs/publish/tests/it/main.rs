//! publish at the library level: files split by the target size, and a killed publish that
//! resumes to exactly the folder an uninterrupted one makes.

use embedfleet_core::rundb::{RunDb, ShardRow};
use embedfleet_core::shardfile::{ShardMeta, ShardRow as Row, ShardWriter, VectorDtype};
use embedfleet_core::{BatchId, Paper};
use embedfleet_publish::{publish, staging_dir, PublishError, PublishOptions};
use std::path::Path;

/// A complete run of three parquet shards of 1,000 rows of 16-d vectors.
fn run_dir(dir: &Path) {
    let db = RunDb::create(dir).unwrap();
    db.conn()
        .execute_batch(
            "INSERT INTO corpus_files (id, path, size, mtime_ns, edges) VALUES (1, 's', 1, 1, 'e');
             INSERT INTO batches (id, file_id, seq, path, n_rows, n_chars, state)
                 VALUES (1, 1, 0, 's', 3000, 1, 'done');",
        )
        .unwrap();
    std::fs::create_dir_all(dir.join("shards")).unwrap();
    let meta = ShardMeta {
        model: "tiny".into(),
        model_revision: "abc".into(),
        compute_dtype: "f32".into(),
        pooling: "last_token".into(),
        normalized: true,
        dim: 16,
        embedfleet_version: "test".into(),
        timings: None,
    };
    for part in 0..3u32 {
        let rel = format!("shards/b000001-{part:04}.parquet");
        let mut w = ShardWriter::create(&dir.join(&rel), VectorDtype::F32, &meta).unwrap();
        for i in 0..1000 {
            let n = part * 1000 + i;
            let paper = Paper {
                id: format!("p{n}"),
                ..Paper::default()
            };
            let vector: Vec<f32> = (0..16).map(|d| ((n + d) % 7) as f32).collect();
            let row = Row {
                paper: &paper,
                vector: &vector,
                n_chars: 1,
                n_tokens: 1,
                n_chunks: 1,
            };
            w.push(&row).unwrap();
        }
        let info = w.finish().unwrap();
        let shard = ShardRow {
            batch_id: BatchId(1),
            part,
            path: rel,
            rows: info.rows,
            sha256: info.sha256,
        };
        db.record_shard(&shard).unwrap();
    }
}

#[test]
fn files_follow_the_target_size_and_a_killed_publish_resumes_to_the_same_folder() {
    let dir = tempfile::tempdir().unwrap();
    let run = dir.path().join("run");
    run_dir(&run);
    let options = |out: &str| PublishOptions {
        // 16-d f32 rows are ~128 bytes as counted: 500 rows a file.
        target_shard_bytes: 64_000,
        ..PublishOptions::new(&run, dir.path().join(out))
    };
    let whole = publish(&options("whole")).unwrap();
    assert_eq!((whole.rows, whole.files, whole.reused), (3000, 6, 0));
    assert!(!whole.partial);
    let names: Vec<String> = std::fs::read_dir(dir.path().join("whole/data"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(
        names.contains(&"train-00005-of-00006.parquet".to_string()),
        "{names:?}"
    );

    let mut killed = options("resumed");
    killed.stop_after_files = Some(2);
    assert!(matches!(publish(&killed), Err(PublishError::Stopped)));
    let out = dir.path().join("resumed");
    assert!(!out.exists(), "nothing that looks complete after a kill");
    assert!(staging_dir(&out).join("data").is_dir());
    let resumed = publish(&options("resumed")).unwrap();
    assert_eq!((resumed.rows, resumed.reused), (3000, 2));
    assert!(!staging_dir(&out).exists());
    let sums =
        |name: &str| std::fs::read_to_string(dir.path().join(name).join("SHA256SUMS")).unwrap();
    assert_eq!(
        sums("whole"),
        sums("resumed"),
        "the same folder, byte for byte"
    );

    // Publishing again over a published folder replaces it; over a foreign folder is refused.
    publish(&options("whole")).unwrap();
    std::fs::create_dir_all(dir.path().join("foreign")).unwrap();
    assert!(matches!(
        publish(&options("foreign")),
        Err(PublishError::OutExists(_))
    ));
}
