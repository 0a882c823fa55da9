//! sample-corpus -> plan -> status, re-planning, refusal, and a plan killed mid-way.

use crate::util::TestDir;
use std::time::Duration;

#[test]
fn sample_corpus_plan_status() {
    let t = TestDir::new();
    t.sample("corpus.jsonl.gz", 1000, 1);
    let out = t.run(
        &[
            "plan",
            "--corpus",
            "corpus.jsonl.gz",
            "--run-dir",
            "run",
            "--papers-per-job",
            "300",
        ],
        0,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("planned 1000 papers into 4 batches"),
        "{stderr}"
    );
    assert!(
        stderr.contains("disk: the batch files take") && stderr.contains("2,560-d f32"),
        "plan says the disk the run needs: {stderr}"
    );
    let status = t.status("run");
    assert_eq!(status["format_version"], 2);
    assert_eq!(status["plan_complete"], true);
    assert_eq!(status["papers_planned"], 1000);
    assert_eq!(status["papers_quarantined"], 0);
    assert_eq!(status["batches"], 4);
    assert_eq!(status["batches_by_state"]["planned"], 4);
    assert!(status["chars_planned"].as_u64().unwrap() > 1_000_000);

    let human = t.run(&["status", "--run-dir", "run"], 0);
    let human = String::from_utf8_lossy(&human.stdout);
    assert!(
        human.contains("1000 planned") && human.contains("batches    4"),
        "{human}"
    );

    let again = t.run(
        &[
            "plan",
            "--corpus",
            "corpus.jsonl.gz",
            "--run-dir",
            "run",
            "--papers-per-job",
            "300",
        ],
        0,
    );
    assert!(String::from_utf8_lossy(&again.stderr)
        .contains("already planned: 1000 papers in 4 batches"));
}

#[test]
fn a_changed_corpus_is_refused_with_exit_code_4() {
    let t = TestDir::new();
    t.sample("corpus.jsonl.gz", 50, 1);
    t.run(
        &["plan", "--corpus", "corpus.jsonl.gz", "--run-dir", "run"],
        0,
    );
    t.run(
        &[
            "sample-corpus",
            "--papers",
            "51",
            "--mean-chars",
            "1500",
            "--out",
            "corpus.jsonl.gz",
        ],
        0,
    );
    let out = t.run(
        &["plan", "--corpus", "corpus.jsonl.gz", "--run-dir", "run"],
        4,
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("corpus changed") && stderr.contains("corpus.jsonl.gz: size"),
        "{stderr}"
    );
}

/// A second release given without `--update` names the first release's files as not given
/// (they may only be left out of the command line), and `--update` into a directory never
/// planned is refused leaving nothing behind.
#[test]
fn release_refusals_say_not_given_and_leave_nothing_behind() {
    let t = TestDir::new();
    std::fs::create_dir_all(t.join("r1")).unwrap();
    std::fs::create_dir_all(t.join("r2")).unwrap();
    t.sample("r1/a.jsonl.gz", 20, 1);
    t.sample_seeded("r2/b.jsonl.gz", 20, 1, 7);
    t.run(&["plan", "--corpus", "r1", "--run-dir", "run"], 0);
    let out = t.run(&["plan", "--corpus", "r2", "--run-dir", "run"], 4);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("a.jsonl.gz: not given") && stderr.contains("b.jsonl.gz: added"),
        "{stderr}"
    );
    assert!(!stderr.contains("removed"), "{stderr}");

    let out = t.run(&["plan", "--update", "r2", "--run-dir", "never"], 4);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("no finished plan to update"), "{stderr}");
    let left: Vec<_> = match std::fs::read_dir(t.join("never")) {
        Ok(entries) => entries.map(|e| e.unwrap().file_name()).collect(),
        Err(_) => Vec::new(),
    };
    assert!(left.is_empty(), "a refusal leaves nothing: {left:?}");
}

#[test]
fn a_corrupt_file_is_reported_and_the_rest_planned_with_exit_code_3() {
    let t = TestDir::new();
    t.sample("c", 400, 2);
    let cut = t.join("c/part-0001.jsonl.gz");
    let bytes = std::fs::read(&cut).unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = t.run(&["plan", "--corpus", "c", "--run-dir", "run"], 3);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(
        stderr.contains("part-0001.jsonl.gz is corrupt") && stderr.contains("line"),
        "{stderr}"
    );
    let status = t.status("run");
    let planned = status["papers_planned"].as_u64().unwrap();
    assert!(planned > 200 && planned < 400, "{planned}");
    assert_eq!(status["quarantined_by_reason"]["corrupt_file"], 1);
    let quarantine = std::fs::read_to_string(t.join("run/quarantine.jsonl")).unwrap();
    assert!(quarantine.contains("corrupt_file") && quarantine.contains("part-0001.jsonl.gz"));
}

/// Every batch of a run, as (file, seq, ids) read from the batch files.
fn batch_ids(t: &TestDir, run: &str) -> Vec<Vec<String>> {
    let out = t.run(&["status", "--run-dir", run, "--json"], 0);
    let _: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut names: Vec<_> = std::fs::read_dir(t.join(&format!("{run}/batches")))
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| {
            assert!(
                !p.to_string_lossy().ends_with(".tmp"),
                "leftover {}",
                p.display()
            );
            let mut ids = Vec::new();
            embedfleet_core::batchfile::read(p, |row| ids.push(row.paper.id)).unwrap();
            ids
        })
        .collect()
}

#[test]
fn plan_killed_at_any_moment_finishes_on_the_next_run() {
    let t = TestDir::new();
    t.sample("c", 6000, 4);
    let args = [
        "plan",
        "--corpus",
        "c",
        "--papers-per-job",
        "500",
        "--threads",
        "2",
        "--run-dir",
    ];
    let clean = [&args[..], &["clean"]].concat();
    t.run(&clean, 0);
    let expected = batch_ids(&t, "clean");
    assert_eq!(expected.iter().map(Vec::len).sum::<usize>(), 6000);
    for (i, delay_ms) in [5u64, 60, 250, 600].into_iter().enumerate() {
        let run = format!("killed{i}");
        let killed = [&args[..], &[run.as_str()]].concat();
        let mut child = t.cmd(&killed).spawn().unwrap();
        std::thread::sleep(Duration::from_millis(delay_ms));
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        t.run(&killed, 0);
        assert_eq!(batch_ids(&t, &run), expected, "killed after {delay_ms} ms");
        assert_eq!(t.status(&run)["papers_planned"], 6000);
    }
}

#[test]
fn plan_reads_parquet_of_every_codec_pyarrow_writes() {
    let t = TestDir::new();
    let dir = t.join("corpus");
    std::fs::create_dir_all(&dir).unwrap();
    // pyarrow's default (snappy) and every other codec the parquet format allows.
    let code = format!(
        "import pyarrow as pa, pyarrow.parquet as pq
for codec in ['snappy', 'gzip', 'lz4', 'brotli', 'zstd', 'none']:
    t = pa.table({{'id': [f'{{codec}}-{{i}}' for i in range(7)], 'text': [f'paper {{i}} about {{codec}}' for i in range(7)]}})
    kw = {{}} if codec == 'snappy' else {{'compression': codec}}
    pq.write_table(t, '{}/' + codec + '.parquet', **kw)
print('ok')",
        dir.display()
    );
    if crate::util::python(&code, "pyarrow", "EMBEDFLEET_REQUIRE_PYARROW").is_none() {
        return;
    }
    t.run(&["plan", "--corpus", "corpus", "--run-dir", "run"], 0);
    let status = t.status("run");
    assert_eq!(status["papers_planned"], 42, "{status}");
    assert_eq!(status["papers_quarantined"], 0, "{status}");
}
