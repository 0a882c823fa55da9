//! A killed publish, run again, keeps the data files it finished and ends with the very folder
//! an uninterrupted publish makes; a file it cannot trust is written again.

use crate::publish_common::publish;
use crate::publish_common::*;
use embedfleet_core::rundb::RunDb;
use embedfleet_core::shardfile::VectorDtype;
use embedfleet_publish::{staging_dir, PublishError, PublishOptions};
use std::path::Path;

/// Two batches of 2 × 200 rows: 200 rows a file make 4 files, one per shard.
fn run(dir: &Path) -> std::path::PathBuf {
    let run = dir.join("run");
    make_run(
        &run,
        &Spec {
            parts: &[&[200, 200], &[200, 200]],
            dtype: VectorDtype::F32,
        },
    );
    run
}

fn options(run: &Path, out: &Path) -> PublishOptions {
    PublishOptions {
        target_shard_bytes: 200 * ROW_BYTES,
        ..PublishOptions::new(run, out)
    }
}

#[test]
fn a_killed_publish_resumes_reusing_finished_files_to_the_same_folder() {
    let dir = tempfile::tempdir().unwrap();
    let run = run(dir.path());
    let whole = dir.path().join("whole");
    assert_eq!(publish(&options(&run, &whole)).unwrap().files, 4);

    let out = dir.path().join("resumed");
    let killed = PublishOptions {
        stop_after_files: Some(3),
        ..options(&run, &out)
    };
    assert!(matches!(publish(&killed), Err(PublishError::Stopped)));
    let staging = staging_dir(&out);
    assert!(!out.exists(), "nothing under the final name after a kill");
    assert!(!staging.join("SHA256SUMS").exists() && !staging.join("manifest.json").exists());
    assert_eq!(std::fs::read_dir(staging.join("data")).unwrap().count(), 3);
    // A killed writer's temporary, a file of another split, and a file cut short.
    std::fs::write(
        staging.join("data/train-00003-of-00004.parquet.tmp"),
        b"half",
    )
    .unwrap();
    std::fs::write(staging.join("data/train-00000-of-00009.parquet"), b"old").unwrap();
    let cut = staging.join("data/train-00001-of-00004.parquet");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();

    let report = publish(&options(&run, &out)).unwrap();
    assert_eq!((report.rows, report.files, report.reused), (800, 4, 2));
    assert!(!staging.exists());
    sha256sum_check(&out);
    let sums = |d: &Path| std::fs::read_to_string(d.join("SHA256SUMS")).unwrap();
    assert_eq!(sums(&whole), sums(&out), "the same folder, byte for byte");
    assert_eq!(
        std::fs::read(whole.join("manifest.json")).unwrap(),
        std::fs::read(out.join("manifest.json")).unwrap()
    );
}

#[test]
fn a_finished_file_made_of_a_shard_that_changed_since_is_written_again() {
    let dir = tempfile::tempdir().unwrap();
    let run = run(dir.path());
    let out = dir.path().join("ds");
    let killed = PublishOptions {
        stop_after_files: Some(2),
        ..options(&run, &out)
    };
    assert!(matches!(publish(&killed), Err(PublishError::Stopped)));

    // The first batch's first part is embedded again (other vectors, same rows).
    let db = RunDb::open(&run).unwrap();
    write_shard(&db, 0, 0, 0..200, VectorDtype::F32, 5);
    drop(db);
    let report = publish(&options(&run, &out)).unwrap();
    assert_eq!(
        report.reused, 1,
        "only the file of the unchanged shard is kept"
    );
    let first = &rows(&out)[0];
    assert_eq!(first.0, "b0p0");
    assert_eq!(first.1, vector(0, 0, 5)[0], "the new vectors are published");
    sha256sum_check(&out);
}
