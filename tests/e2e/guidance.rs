//! What the binary tells a new user as it goes (issue 50, items 13, 14 and 16): the submit
//! loop's progress in a log without a terminal, the end of `run` (where the results are, what
//! comes next), `status` of a finished run, and how to load a dataset published again.

use crate::util::{python, TestDir};
use std::io::{BufRead, BufReader};
use std::process::Stdio;
use std::time::{Duration, Instant};

#[test]
fn issue50_progress_comes_at_least_every_ten_seconds_without_a_terminal() {
    let t = TestDir::new();
    t.plan_with_model(8, 8);
    // A job that says nothing for 30 s (its setup sleeps), as a model load or a long first
    // shard does: the log must still show the loop alive.
    std::fs::write(
        t.join("run.toml"),
        "[scheduler.script]\nsetup = [\"sleep 30\"]\n",
    )
    .unwrap();
    let mut submit = t
        .cmd(&[
            "submit",
            "--run-dir",
            "run",
            "--config",
            "run.toml",
            "--model-dir",
            "model",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    let mut lines = Vec::new();
    for line in BufReader::new(submit.stderr.take().unwrap()).lines() {
        lines.push((started.elapsed(), line.unwrap()));
    }
    assert!(submit.wait().unwrap().success(), "{lines:?}");
    let progress: Vec<&(Duration, String)> = lines
        .iter()
        .filter(|(_, l)| l.contains("papers embedded"))
        .collect();
    assert!(progress.len() >= 3, "{lines:?}");
    let longest = progress.windows(2).map(|w| w[1].0 - w[0].0).max().unwrap();
    // Ten seconds, plus a poll and a loaded machine's slack.
    assert!(
        longest <= Duration::from_secs(13),
        "{longest:?} without a progress line: {lines:?}"
    );
    // Before a job has finished there is no rate to tell an end from.
    assert!(progress[0].1.contains("eta —"), "{lines:?}");
}

#[test]
fn issue50_run_ends_with_where_the_results_are_and_what_comes_next() {
    let t = TestDir::new();
    let (stdout, stderr) = t.small_run("demo", 30, 15, &[]);
    let tail: Vec<&str> = stdout.lines().rev().take(9).collect();
    let tail: Vec<&str> = tail.into_iter().rev().collect();
    let expected = [
        "results",
        "  collection  `papers` in the embedded Qdrant, demo/qdrant",
        "  shards      demo/shards (2 parquet shards, 30 papers)",
        "  report      demo/report.html",
        "next",
        "  embedfleet query --run-dir demo \"protein folding\"  # the top papers of a term",
        "  embedfleet query --run-dir demo --terms terms.txt --output hits.parquet  # a term a line",
        "  embedfleet eval --run-dir demo",
        "  embedfleet publish --run-dir demo --out dataset",
    ];
    assert_eq!(tail, expected, "{stdout}");
    // The page is there, written after the upload: it shows the collection.
    let page = std::fs::read_to_string(t.join("demo/report.html")).unwrap();
    assert!(page.contains("<h2>Upload</h2>"), "{page}");
    // The loop's internals are for -v only.
    for internal in ["owner: ", "submitted "] {
        assert!(!stderr.contains(internal), "{internal}: {stderr}");
    }
    let (_, stderr) = t.run_corpus("demo", "demo-corpus.jsonl.gz", 15, &["-v"]);
    assert!(stderr.contains("owner: "), "{stderr}");
}

#[test]
fn issue50_status_of_a_finished_run_says_it_is_complete_headline_first() {
    let t = TestDir::new();
    t.small_run("run", 30, 15, &[]);
    let out = t.run(&["status", "--run-dir", "run"], 0);
    let text = String::from_utf8_lossy(&out.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("run        run: complete"),
        "the headline first:\n{text}"
    );
    let at = |prefix: &str| lines.iter().position(|l| l.starts_with(prefix));
    let loop_line = at("loop ").unwrap_or_else(|| panic!("no loop line:\n{text}"));
    assert!(lines[loop_line].ends_with("the run is complete"), "{text}");
    assert!(!text.contains("starts it again"), "{text}");
    if let Some(routing) = at("routing ") {
        assert!(routing > loop_line, "routing after the headline:\n{text}");
    }
}

#[test]
fn issue50_a_dataset_published_again_loads_as_the_card_and_publish_say() {
    let t = TestDir::new();
    t.small_run("run", 30, 15, &[]);
    let out = t.run(&["publish", "--run-dir", "run", "--out", "ds"], 0);
    let said = String::from_utf8_lossy(&out.stderr);
    let call = "load_dataset(\"parquet\", data_dir=\"ds/data\", split=\"train\")";
    assert!(said.contains(call), "{said}");
    assert!(said.contains("published into this folder again"), "{said}");
    assert!(
        said.contains("download_mode=\"force_redownload\""),
        "{said}"
    );
    let card = std::fs::read_to_string(t.join("ds/README.md")).unwrap();
    for needle in [
        "**A new version in the same folder.**",
        "download_mode=\"force_redownload\", verification_mode=\"no_checks\"",
        "publish each version into a folder of its own",
    ] {
        assert!(card.contains(needle), "{needle}:\n{card}");
    }
    // What publish says, done: the folder loaded (into a cache of this test's own), published
    // again with another column, loaded again the same way: the new version.
    let load = || {
        let code = format!(
            "import os; os.environ['HF_HOME'] = '{}'\nimport datasets\n\
             d = datasets.{call}\nprint(sorted(d.column_names))",
            t.join("hf").display()
        );
        let out = std::process::Command::new("python3")
            .args(["-c", &code])
            .current_dir(t.path())
            .env("HF_DATASETS_OFFLINE", "1")
            .env("HF_HUB_OFFLINE", "1")
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    if python("import datasets", "datasets", "EMBEDFLEET_REQUIRE_DATASETS").is_none() {
        return;
    }
    assert!(!load().contains("'text'"), "the first version has no text");
    t.run(
        &["publish", "--run-dir", "run", "--out", "ds", "--with-text"],
        0,
    );
    assert!(load().contains("'text'"), "the new version has its text");
}
