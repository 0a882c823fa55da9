//! An update spread thinly over many corpus files (`plan --update`): its papers are packed into
//! full batches across the files, not one part-filled job per file, and each keeps where it
//! came from. A plan killed after writing the packed batch files, before run.db takes them,
//! resumes to the same plan.

use crate::util::TestDir;
use embedfleet_core::rundb::{RunDb, TEST_KILL_ENV};
use std::collections::BTreeMap;
use std::os::unix::process::ExitStatusExt;

const FILES: usize = 5;
const PER_FILE: usize = 40;
const NEW_PER_FILE: usize = 25;

fn line(id: &str, i: usize) -> String {
    format!(
        "{{\"id\":\"{id}\",\"text\":\"paper {id}: a study of {} lattices in {} soils\"}}\n",
        i * 7 % 13,
        i * 11 % 17
    )
}

/// Release 1: `FILES` files of `PER_FILE` papers; release 2: the same files, each with
/// `NEW_PER_FILE` new papers appended (125 in all, as the update).
fn make_releases(t: &TestDir) {
    for release in ["r1", "r2"] {
        std::fs::create_dir_all(t.join(release)).unwrap();
    }
    for f in 0..FILES {
        let old: String = (0..PER_FILE)
            .map(|i| line(&format!("F{f}-{i:03}"), i))
            .collect();
        let new: String = (0..NEW_PER_FILE)
            .map(|i| line(&format!("F{f}-new{i:03}"), 100 + i))
            .collect();
        std::fs::write(t.join(&format!("r1/part-{f}.jsonl")), &old).unwrap();
        std::fs::write(t.join(&format!("r2/part-{f}.jsonl")), old + &new).unwrap();
    }
}

/// (batch path, ids in row order, each row's corpus file path and line) of release 2.
type Batches = Vec<(String, Vec<(String, String, i64)>)>;

fn release_2_batches(t: &TestDir, run: &str) -> Batches {
    let db = RunDb::open(&t.join(run)).unwrap();
    let mut stmt = db
        .conn()
        .prepare(
            "SELECT b.path, p.id, f.path, p.line FROM papers p JOIN batches b ON b.id = p.batch_id
             JOIN corpus_files f ON f.id = coalesce(p.file_id, b.file_id)
             WHERE f.release = 2 ORDER BY b.file_id, b.seq, p.row",
        )
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
                r.get::<_, i64>(3)?,
            ))
        })
        .unwrap()
        .map(Result::unwrap);
    let mut out: BTreeMap<String, Vec<(String, String, i64)>> = BTreeMap::new();
    for (batch, id, file, line) in rows {
        let file = std::path::Path::new(&file)
            .file_name()
            .unwrap()
            .to_string_lossy()
            .into_owned();
        out.entry(batch).or_default().push((id, file, line));
    }
    out.into_iter().collect()
}

#[test]
fn an_update_spread_over_files_is_packed_into_full_batches_and_a_kill_mid_pack_resumes() {
    let t = TestDir::new();
    make_releases(&t);
    let plan = |run: &str| {
        vec![
            "plan".to_string(),
            "--corpus".into(),
            "r1".into(),
            "--run-dir".into(),
            run.into(),
            "--papers-per-job".into(),
            "50".into(),
        ]
    };
    let update = ["plan", "--update", "r2", "--run-dir"];
    for run in ["whole", "killed"] {
        let args = plan(run);
        t.run(&args.iter().map(String::as_str).collect::<Vec<_>>(), 0);
    }
    // Release 1 keeps one batch per file (40 papers each, under 50 a job).
    assert_eq!(t.status("whole")["batches"], FILES);

    let out = t.run(&[&update[..], &["whole"]].concat(), 0);
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(
        said.contains("release 2: 125 added, 0 changed, 0 withdrawn, 200 unchanged: 125 papers to embed in 3 new batches"),
        "{said}"
    );
    let whole = release_2_batches(&t, "whole");
    let sizes: Vec<usize> = whole.iter().map(|(_, rows)| rows.len()).collect();
    assert_eq!(
        sizes,
        [50, 50, 25],
        "full batches across the 5 files, not 5 of 25"
    );
    // In corpus order, each row with its own file and line.
    let rows: Vec<&(String, String, i64)> = whole.iter().flat_map(|(_, r)| r).collect();
    for (k, (id, file, line)) in rows.iter().enumerate() {
        let (f, i) = (k / NEW_PER_FILE, k % NEW_PER_FILE);
        assert_eq!(id, &format!("F{f}-new{i:03}"));
        assert_eq!(file, &format!("part-{f}.jsonl"));
        assert_eq!(
            *line,
            (PER_FILE + i + 1) as i64,
            "{id}: JSON lines count from 1"
        );
    }
    assert!(whole
        .iter()
        .all(|(path, _)| path.starts_with("batches/r0002-")));

    // Killed with the packed files written, before run.db took them: the next plan packs
    // again to the same batches, and no per-file batch of the release is left.
    let killed = t
        .cmd(&[&update[..], &["killed"]].concat())
        .env(TEST_KILL_ENV, "pack")
        .output()
        .unwrap();
    assert_eq!(killed.status.signal(), Some(libc::SIGKILL));
    assert_eq!(
        release_2_batches(&t, "killed").len(),
        FILES,
        "not packed yet"
    );
    t.run(&[&update[..], &["killed"]].concat(), 0);
    assert_eq!(release_2_batches(&t, "killed"), whole);
    let mut files: Vec<String> = std::fs::read_dir(t.join("killed/batches"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    let mut expected: Vec<String> = (1..=FILES)
        .map(|f| format!("f{f:06}-00000.parquet"))
        .chain((0..3).map(|k| format!("r0002-{k:05}.parquet")))
        .collect();
    expected.sort();
    assert_eq!(files, expected);

    // Embedded and uploaded: three jobs, and the collection holds both releases' papers.
    t.run(
        &[
            "run",
            "--corpus",
            "r2",
            "--run-dir",
            "whole",
            "--local-jobs",
            "2",
            "--shard-papers",
            "15",
        ],
        0,
    );
    let status = t.status("whole");
    assert_eq!(status["releases"][1]["batches_done"], 3);
    assert_eq!(status["releases"][1]["papers_embedded"], 125);
    assert_eq!(status["papers_live"], FILES * (PER_FILE + NEW_PER_FILE));
}
