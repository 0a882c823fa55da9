//! `report` after a run: the table, its JSON form and the plots.

use crate::util::TestDir;

/// Checks `report` on a finished run of `batches` batches and `papers` papers. Called by the
/// `run` test on the run it made, so the report costs no second run.
pub fn assert_report(t: &TestDir, run_dir: &str, batches: usize, papers: u64) {
    let out = t.run(&["report", "--run-dir", run_dir], 0);
    let text = String::from_utf8(out.stdout).unwrap();
    // The per-batch lines are the table's first block: a header, then one line per batch.
    let ids: Vec<&str> = text
        .lines()
        .skip(1)
        .take_while(|l| !l.trim().is_empty())
        .map(|l| l.split_whitespace().next().unwrap())
        .collect();
    let expected: Vec<String> = (1..=batches).map(|b| b.to_string()).collect();
    assert_eq!(ids, expected, "{text}");
    for row in [
        "model load s",
        "I/O s",
        "inference s",
        "inference share",
        "fallbacks",
    ] {
        assert!(text.contains(row), "no `{row}` in\n{text}");
    }
    assert!(text.contains(&format!("over {batches} batches")), "{text}");

    let out = t.run(
        &["report", "--run-dir", run_dir, "--json", "--plots", "plots"],
        0,
    );
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(json["format_version"], 1);
    assert_eq!(json["batches"].as_array().unwrap().len(), batches);
    // Every planned paper is embedded: nothing to go.
    assert_eq!(json["papers_to_go"], 0, "{json}");
    assert_eq!(json["node_hours_to_go"], 0.0, "{json}");
    let summary = &json["summary"];
    assert_eq!(summary["batches"], batches);
    assert_eq!(summary["papers"], papers);
    assert!(summary["tokens"].as_u64().unwrap() > papers, "{summary}");
    let share = summary["inference_share"].as_f64().unwrap();
    assert!(share > 0.0 && share <= 1.0, "{summary}");
    if cfg!(target_os = "linux") {
        // The embed job's peak RSS (VmHWM) on CPU.
        assert!(
            summary["peak_memory_bytes"].as_u64().unwrap() > 0,
            "{summary}"
        );
    }
    for name in ["batch_timings.png", "throughput.png"] {
        let bytes = std::fs::read(t.join("plots").join(name)).unwrap();
        assert!(bytes.len() > 1000, "{name}: {} bytes", bytes.len());
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n", "{name} is a PNG");
    }
}

#[test]
fn report_of_a_run_with_nothing_embedded_says_so() {
    let t = TestDir::new();
    t.sample("c.jsonl.gz", 10, 1);
    t.run(&["plan", "--corpus", "c.jsonl.gz", "--run-dir", "run"], 0);
    let out = t.run(&["report", "--run-dir", "run"], 1);
    let stderr = String::from_utf8(out.stderr).unwrap();
    assert!(
        stderr.contains("no batch of run has finished yet"),
        "{stderr}"
    );
    assert!(out.stdout.is_empty());
}
