//! The report's files read by readers that are not ours: the HTML page in headless Chromium
//! (bars, failures, console, planted scripts shown as text), the trace in pandas, the owner's
//! `metrics.prom` by `promtool`.

use crate::browser;
use crate::util::{python, TestDir};
use embedfleet_core::rundb::{NewJob, RunDb};
use embedfleet_core::state::JobStatus;

/// What a hostile paper id and log line try: mark the page. Shown as text, the attribute never
/// appears.
const PLANTED_ID: &str = "<script>document.body.setAttribute('data-pwned','id')</script>";
const PLANTED_LOG: &str =
    "Error: bad input <script>document.body.setAttribute('data-pwned','log')</script>";

/// A run of 20 papers in 4 batches (local jobs) with a paper whose id is a script and no text
/// (quarantined by id at plan), then a failed attempt added whose log plants a script.
fn run_with_planted_scripts(t: &TestDir) -> (i64, i64) {
    let mut corpus = String::new();
    for i in 0..20 {
        corpus.push_str(&format!(
            "{{\"id\": \"p{i}\", \"text\": \"paper {i} about embeddings and queues\"}}\n"
        ));
    }
    corpus.push_str(&serde_json::json!({"id": PLANTED_ID, "text": " "}).to_string());
    corpus.push('\n');
    std::fs::write(t.join("c.jsonl"), corpus).unwrap();
    t.run_corpus("run", "c.jsonl", 5, &[]);
    let mut db = RunDb::open(&t.join("run")).unwrap();
    db.insert_job(&NewJob {
        batches: &[1],
        attempt: 9,
        backend: "local",
        queue: "local",
        name: "planted",
        script: "jobs/planted.sh",
        log: "logs/planted.log",
        marker: "jobs/planted.done",
    })
    .unwrap();
    db.set_job_submitted("planted", "4242").unwrap();
    db.set_job_state("planted", JobStatus::Running, None)
        .unwrap();
    db.set_job_state("planted", JobStatus::Failed, Some("failed (exit code 7)"))
        .unwrap();
    std::fs::write(
        t.join("run/logs/planted.log"),
        format!("starting\n{PLANTED_LOG}\nmore\n"),
    )
    .unwrap();
    let count = |sql: &str| -> i64 { db.conn().query_row(sql, [], |r| r.get(0)).unwrap() };
    (
        count("SELECT count(*) FROM jobs"),
        count("SELECT count(*) FROM jobs WHERE state IN ('failed', 'node_fail', 'out_of_memory', 'timeout', 'lost')"),
    )
}

fn attr(dom: &str, name: &str) -> Option<String> {
    let at = dom.find(&format!("{name}=\""))? + name.len() + 2;
    Some(dom[at..at + dom[at..].find('"')?].to_string())
}

#[test]
fn the_html_report_in_chromium_shows_every_attempt_and_runs_no_planted_script() {
    let t = TestDir::new();
    let (attempts, failed) = run_with_planted_scripts(&t);
    assert!(attempts >= 5 && failed == 1, "{attempts} {failed}");
    t.run(
        &[
            "report",
            "--run-dir",
            "run",
            "--html",
            "r.html",
            "--trace",
            "trace.tsv",
        ],
        0,
    );
    let page = std::fs::read_to_string(t.join("r.html")).unwrap();
    // No element that loads anything (the unit test `the_page_holds_everything_from_outside_as_text`
    // checks the rest of what could fetch).
    assert!(
        !page.contains("src=") && !page.contains("<link"),
        "the page fetches nothing"
    );
    // The owner (the run's submit loop) wrote its own page and metrics beside run.db.
    assert!(t.join("run/report.html").is_file());
    browser::promtool_check(&t.join("run/metrics.prom"));

    let rows = python(
        &format!(
            "import pandas as pd; t = pd.read_csv({:?}, sep='\\t', na_values='-'); \
             print(len(t), int((t.status == 'FAILED').sum()), int(t.exit.dropna().astype(int).max()))",
            t.join("trace.tsv")
        ),
        "pandas",
        "EMBEDFLEET_REQUIRE_PANDAS",
    );
    if let Some(rows) = rows {
        assert_eq!(rows, format!("{attempts} 1 7"));
    }

    let shot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("report-screenshot.png");
    let Some(r) = browser::render(&t.join("r.html"), Some(&shot)) else {
        return;
    };
    assert_eq!(
        attr(&r.dom, "data-rendered").as_deref(),
        Some("1"),
        "the script ran to its end"
    );
    assert_eq!(attr(&r.dom, "data-js-errors"), None, "{}", r.dom);
    let uncaught: Vec<&String> = r
        .console
        .iter()
        .filter(|l| l.contains("Uncaught") || l.contains("Error"))
        .collect();
    assert!(uncaught.is_empty(), "console: {uncaught:?}");
    assert_eq!(r.dom.matches("<g class=\"bar\"").count() as i64, attempts);
    assert_eq!(attr(&r.dom, "data-bars"), Some(attempts.to_string()));
    assert_eq!(
        r.dom.matches("<tr class=\"failure\">").count() as i64,
        failed
    );
    let escaped_log = PLANTED_LOG.replace('<', "&lt;").replace('>', "&gt;");
    assert!(
        r.dom
            .contains(&format!("<td class=\"first-error\">{escaped_log}</td>")),
        "the failure's first error line as text"
    );
    let escaped_id = PLANTED_ID.replace('<', "&lt;").replace('>', "&gt;");
    assert!(r
        .dom
        .contains(&format!("<td class=\"paper\">{escaped_id}</td>")));
    assert!(!r.dom.contains("data-pwned=\""), "a planted script ran");
    let png = std::fs::read(&shot).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    eprintln!(
        "rendered in {:.2} s ({} ms of script); screenshot {}",
        r.wall_s,
        attr(&r.dom, "data-render-ms").unwrap_or_default(),
        shot.display()
    );
}
